//! What the guardian holds: the system seam ([`Targets`]), resuming an entry's channels and
//! restoring its timeslices ([`undo`]), and the [`Guardian`] state (holds, releases, reaping
//! exited targets, shutdown).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context as _, Result};
use gpreempt_common::nv;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{
    journal::{recover_entry, recover_with, Journal},
    one_line, say, HoldEntry, Request, TsgTimeslice,
};
use crate::nv::rm::{self as control, Channels};

/// What the guardian needs from the system, injectable for tests.
pub trait Targets {
    /// The guardian's own hold on a target's fd.
    type Dup;
    /// Duplicates the target's fd ([`control::dup_fd`]).
    fn dup(&mut self, pid: u32, fd: i32) -> Result<Self::Dup>;
    /// Resumes `e`'s channels through `dup`.
    fn enable(&mut self, dup: &Self::Dup, e: &HoldEntry) -> Result<()>;
    /// Sets the timeslice of TSG `h_tsg` (of client `h_client`) to `us` through `dup`
    /// ([`control::set_timeslice`]).
    fn set_timeslice(&mut self, dup: &Self::Dup, h_client: u32, h_tsg: u32, us: u64) -> Result<()>;
    /// Whether the target behind `dup` has exited.
    fn exited(&mut self, dup: &Self::Dup) -> bool;
}

/// The real system: pidfds and RM controls.
pub struct Rm;

/// A target's pidfd (to see it exit; it never names another process) and our duplicate of its
/// nvidiactl fd.
pub struct TargetFd {
    pub pidfd: OwnedFd,
    pub fd: OwnedFd,
}

impl Targets for Rm {
    type Dup = TargetFd;

    fn dup(&mut self, pid: u32, fd: i32) -> Result<TargetFd> {
        let pidfd = control::pidfd_open(pid)?;
        let fd = control::getfd(pidfd.as_fd(), pid, fd)?;
        Ok(TargetFd { pidfd, fd })
    }

    fn enable(&mut self, dup: &TargetFd, e: &HoldEntry) -> Result<()> {
        enable_entry(dup.fd.as_fd(), e)
    }

    fn set_timeslice(&mut self, dup: &TargetFd, h_client: u32, h_tsg: u32, us: u64) -> Result<()> {
        control::set_timeslice(dup.fd.as_fd(), h_client, h_tsg, us).map(drop)
    }

    fn exited(&mut self, dup: &TargetFd) -> bool {
        let mut fds = [PollFd::new(dup.pidfd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }
}

/// Resumes `e`'s channels. One handle the target has freed since makes the whole call fail, so
/// on failure the channels are retried one by one; a freed one (INVALID_CHANNEL) is not a
/// failure.
pub fn enable_entry(fd: BorrowedFd, e: &HoldEntry) -> Result<()> {
    let all = e.to_channels();
    let first = match control::set_disabled(fd, &all, false) {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let whole_client = matches!(
        control::nv_status(&first),
        None | Some(nv::status::INVALID_CLIENT | nv::status::NOT_SUPPORTED)
    );
    if all.channels.len() <= 1 || whole_client {
        return Err(first);
    }
    let failed: Vec<u32> = all
        .channels
        .iter()
        .copied()
        .filter(|&c| {
            let one = Channels {
                channels: vec![c],
                ..all.clone()
            };
            match control::set_disabled(fd, &one, false) {
                Ok(_) => false,
                Err(e) => control::nv_status(&e) != Some(nv::status::INVALID_CHANNEL),
            }
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(first.context(format!("channel(s) {failed:#x?} not resumed")))
    }
}

fn status_is(e: &anyhow::Error, statuses: &[u32]) -> bool {
    control::nv_status(e).is_some_and(|s| statuses.contains(&s))
}

/// Undoes what the controller may have done to `e`'s target, through `dup`: resumes its
/// channels (none: nothing to resume) and puts back each TSG's original timeslice, one TSG at a
/// time (a failure does not stop the others; a TSG the target freed is not one). A client that
/// is gone (INVALID_CLIENT) is returned as such at once: nothing of it is left to undo.
pub fn undo<T: Targets>(t: &mut T, dup: &T::Dup, e: &HoldEntry) -> Result<()> {
    let mut first = None;
    if !e.channels.is_empty() {
        match t.enable(dup, e) {
            Ok(()) => {}
            Err(err) if status_is(&err, &[nv::status::INVALID_CLIENT]) => return Err(err),
            Err(err) => first = Some(err),
        }
    }
    let mut failed = Vec::new();
    for ts in &e.timeslices {
        match t.set_timeslice(dup, e.h_client, ts.h_tsg, ts.original_us) {
            Ok(()) => {}
            Err(err) if status_is(&err, &[nv::status::INVALID_CLIENT]) => return Err(err),
            Err(err)
                if status_is(
                    &err,
                    &[
                        nv::status::INVALID_OBJECT_HANDLE,
                        nv::status::OBJECT_NOT_FOUND,
                    ],
                ) => {}
            Err(err) => {
                failed.push(ts.h_tsg);
                first.get_or_insert(err);
            }
        }
    }
    match first {
        None => Ok(()),
        Some(err) if failed.is_empty() => Err(err),
        Some(err) => Err(err.context(format!("timeslice(s) of TSG(s) {failed:#x?} not restored"))),
    }
}

/// The guardian's state: what it holds, each with its own duplicate of the target's fd.
pub struct Guardian<T: Targets> {
    targets: T,
    journal: Journal,
    held: Vec<(HoldEntry, T::Dup)>,
    /// Entries a previous guardian left that could not be resumed: kept in the journal.
    stale: Vec<HoldEntry>,
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
        Ok(Self {
            targets,
            journal,
            held: Vec::new(),
            stale,
        })
    }

    /// What is held now.
    pub fn held(&self) -> impl Iterator<Item = &HoldEntry> {
        self.held.iter().map(|(e, _)| e)
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
        let dup = self.targets.dup(e.pid, e.fd)?;
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
    pub fn resume_held(&mut self, why: &str) -> bool {
        let mut all = true;
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
        failed.is_empty()
    }
}
