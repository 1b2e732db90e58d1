//! What the guardian holds: the [`Guardian`] state (holds, releases, reaping exited targets,
//! shutdown), acting through [`Targets`](super::targets::Targets).

use anyhow::{Context as _, Result};

use super::{
    frozen::Frozen,
    journal::{recover_entry, recover_with, Journal},
    protocol::{one_line, HoldEntry, Request, TsgTimeslice},
    say::say,
    targets::{undo, Targets},
};

/// The guardian's state: what it holds, each with its own duplicate of the target's fd.
pub struct Guardian<T: Targets> {
    targets: T,
    journal: Journal,
    held: Vec<(HoldEntry, T::Dup)>,
    /// Entries a previous guardian left that could not be resumed: kept in the journal.
    stale: Vec<HoldEntry>,
    /// Killed when the lease runs out (the KFD path's fail-safe).
    stopper: Option<super::Stopper>,
    /// Cgroups the controller froze (the KFD path's fallback).
    frozen: Frozen,
}

impl<T: Targets> Guardian<T> {
    /// Takes over `journal` (its owner must hold its lock): leftovers are resumed first.
    pub fn new(mut targets: T, journal: Journal) -> Result<Self> {
        let stale = recover_with(&journal, &mut targets)
            .into_iter()
            .filter(|(_, r)| r.is_err())
            .map(|(e, _)| e)
            .collect::<Vec<_>>();
        journal.rewrite(&stale)?;
        let frozen = Frozen::open(journal.frozen_path());
        Ok(Self {
            targets,
            journal,
            held: Vec::new(),
            stale,
            stopper: None,
            frozen,
        })
    }

    /// What is held now.
    pub fn held(&self) -> impl Iterator<Item = &HoldEntry> {
        self.held.iter().map(|(e, _)| e)
    }

    /// The cgroups held frozen now.
    pub fn frozen(&self) -> &[super::FrozenEntry] {
        self.frozen.held()
    }

    fn entries(&self) -> Vec<HoldEntry> {
        self.stale
            .iter()
            .cloned()
            .chain(self.held().cloned())
            .collect()
    }

    /// One request line; the reply line (without its newline).
    pub fn handle(&mut self, line: &str) -> String {
        let r = serde_json::from_str::<Request>(line)
            .context("unreadable request")
            .and_then(|req| match req {
                Request::Hold(e) => self.hold(e),
                Request::Release { pid, h_client } => self.release(pid, h_client),
                Request::Freeze(e) => self.frozen.hold(e),
                Request::Thaw { cgroup } => self.frozen.release(&cgroup),
            });
        match r {
            Ok(()) => "ok".into(),
            Err(e) => format!("err {}", one_line(&e)),
        }
    }

    fn hold(&mut self, mut e: HoldEntry) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        e.channels.retain(|c| seen.insert(*c));
        let mut seen = std::collections::BTreeSet::new();
        e.timeslices.retain(|t| seen.insert(t.h_tsg));
        let dup = self.targets.dup(e.id(), e.fd)?;
        let at = self.held.iter().position(|(h, _)| h.key() == e.key());
        let (old, old_ts) = at.map_or((&[][..], &[][..]), |i| {
            (&self.held[i].0.channels[..], &self.held[i].0.timeslices[..])
        });
        let new: Vec<u32> = e
            .channels
            .iter()
            .copied()
            .filter(|c| !old.contains(c))
            .collect();
        // The first original recorded for a TSG wins: a later one may already be lowered.
        let new_ts: Vec<TsgTimeslice> = e
            .timeslices
            .iter()
            .copied()
            .filter(|t| !old_ts.iter().any(|o| o.h_tsg == t.h_tsg))
            .collect();
        let merged = HoldEntry {
            channels: old.iter().copied().chain(new.iter().copied()).collect(),
            timeslices: old_ts.iter().chain(&new_ts).copied().collect(),
            ..e.clone()
        };
        if !new.is_empty() {
            // They are running (the controller pauses after our `ok`): resuming them is a no-op
            // that proves our duplicate reaches them.
            let probe = HoldEntry {
                channels: new,
                timeslices: Vec::new(),
                ..e
            };
            self.targets
                .enable(&dup, &probe)
                .context("the guardian could not resume these channels itself")?;
        }
        for t in &new_ts {
            // Their current timeslices (the controller changes them after our `ok`): setting
            // them is a no-op that proves our duplicate reaches these TSGs.
            self.targets
                .set_timeslice(&dup, merged.h_client, t.h_tsg, t.original_us)
                .with_context(|| {
                    format!(
                        "the guardian could not set the timeslice of TSG {:#x} itself",
                        t.h_tsg
                    )
                })?;
        }
        self.journal.append(&merged)?;
        match at {
            Some(i) => self.held[i] = (merged, dup),
            None => self.held.push((merged, dup)),
        }
        Ok(())
    }

    fn release(&mut self, pid: u32, h_client: u32) -> Result<()> {
        let before = self.held.len();
        self.held
            .retain(|(h, _)| !(h.pid == pid && h.h_client == h_client));
        if self.held.len() != before {
            self.journal.rewrite(&self.entries())?;
        }
        Ok(())
    }

    /// Drops what exited targets held: our duplicate would keep their RM client alive.
    pub fn reap(&mut self) {
        let before = self.held.len();
        let targets = &mut self.targets;
        self.held.retain(|(h, d)| {
            let gone = targets.exited(d);
            if gone {
                say(&format!("pid {} exited; dropped {}", h.pid, h.describe()));
            }
            !gone
        });
        if self.held.len() != before {
            if let Err(e) = self.journal.rewrite(&self.entries()) {
                say(&format!("{e:#}"));
            }
        }
    }

    /// The controller is alive but silent (its lease ran out): resume everything held, as
    /// [`Self::shutdown`] does, but keep holding it, journaled: it may recover and carry on.
    /// True when everything held was resumed.
    /// SIGKILL `s` whenever the lease runs out ([`Self::expired`]).
    pub fn kill_on_expiry(&mut self, s: super::Stopper) {
        self.stopper = Some(s);
    }

    /// The lease ran out: resume what is held, then kill the controller if asked to. True when
    /// everything known was undone.
    /// The `/proc/PID/stat` state letter of the controller to kill on expiry; None without one
    /// or when unreadable.
    pub fn controller_state(&self) -> Option<char> {
        self.stopper.as_ref().and_then(super::Stopper::state)
    }

    pub fn expired(&mut self, why: &str) -> bool {
        let all = self.resume_held(why);
        if let Some(s) = &self.stopper {
            match s.kill() {
                Ok(()) => say(&format!(
                    "{why}: killed the controller (pid {}, SIGKILL) so that the kernel resumes \
                     every queue it suspended",
                    s.pid()
                )),
                Err(e) => say(&format!("{why}: could not kill pid {}: {e}", s.pid())),
            }
        }
        all
    }

    pub fn resume_held(&mut self, why: &str) -> bool {
        let mut all = self.frozen.thaw_all(why, true);
        for (e, dup) in &self.held {
            if self.targets.exited(dup) {
                continue; // the next reap drops it
            }
            match undo(&mut self.targets, dup, e) {
                Ok(()) => say(&format!("{why}: {}", e.undone())),
                Err(err) => {
                    say(&format!("{why}: could not undo {}: {err:#}", e.describe()));
                    all = false;
                }
            }
        }
        all
    }

    /// The controller is gone: resume everything held (and the stale leftovers), empty the
    /// journal of what succeeded. True when nothing is left paused that we know of.
    pub fn shutdown(&mut self) -> bool {
        let thawed = self.frozen.thaw_all("controller gone", false);
        let mut failed = Vec::new();
        for (e, dup) in std::mem::take(&mut self.held) {
            if self.targets.exited(&dup) {
                say(&format!("pid {} exited; nothing to resume", e.pid));
                continue;
            }
            match undo(&mut self.targets, &dup, &e) {
                Ok(()) => say(&format!("controller gone: {}", e.undone())),
                Err(err) => {
                    say(&format!("could not undo {}: {err:#}", e.describe()));
                    failed.push(e);
                }
            }
        }
        for e in std::mem::take(&mut self.stale) {
            match recover_entry(&mut self.targets, &e) {
                Ok(_) => say(&format!("{} (or it is gone)", e.undone())),
                Err(err) => {
                    say(&format!("still could not undo {}: {err:#}", e.describe()));
                    failed.push(e);
                }
            }
        }
        if let Err(e) = self.journal.rewrite(&failed) {
            say(&format!("{e:#}"));
            return false;
        }
        failed.is_empty() && thawed
    }
}
