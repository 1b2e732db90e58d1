//! The one lifecycle of launch hints, shared by the watcher (`top`, `run`) and `trace`: a
//! process's launch entry points are found off the event loop (parsing a large process's
//! libraries takes long enough to stall it), the uprobes attached when the answer comes if the
//! process still wants them and is alive, and detached when it leaves.

use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context as _, Result};

use crate::observe::{
    launch::LaunchTarget,
    probe::Probes,
    target_file::{permission_problem, WarnGate},
};

/// A pid, its launch entry points (or why none were found), and how long the search took.
pub type Resolution = (u32, Result<Vec<LaunchTarget>>, Duration);

/// What became of a resolution.
#[derive(Debug)]
pub enum Outcome {
    /// Uprobes attached on this many entry points.
    Attached(usize),
    /// The process maps no launch entry point (no HIP/HSA/libcuda library, or not yet).
    NoneMapped,
    /// Resolving or attaching failed; `denied`: for want of a permission (the controller's
    /// capabilities or sandbox), which the journal must show.
    Failed { why: String, denied: bool },
    /// Nobody wants it any more (unwatched, or the process is gone).
    Dropped,
}

impl Outcome {
    /// One line for the log, or `None` when there is nothing to say.
    pub fn describe(&self, pid: u32, took: Duration) -> Option<String> {
        let ms = took.as_millis();
        match self {
            Self::Attached(n) => Some(format!(
                "pid {pid}: launch hints from {n} entry point(s) (found in {ms} ms)"
            )),
            Self::NoneMapped => Some(format!(
                "pid {pid}: no launch entry point mapped (searched in {ms} ms)"
            )),
            Self::Failed { why, .. } => Some(format!("pid {pid}: no launch hints: {why}")),
            Self::Dropped => None,
        }
    }

    /// How loud [`Self::describe`]'s line is: a failure for want of a permission is a warning
    /// (at most one a minute through `gate`), the rest information.
    pub(crate) fn level(&self, gate: &WarnGate, now: std::time::Instant) -> log::Level {
        match self {
            Self::Failed { denied, .. } if gate.warn(*denied, now) => log::Level::Warn,
            _ => log::Level::Info,
        }
    }

    fn failed(e: &anyhow::Error) -> Self {
        Self::Failed {
            why: format!("{e:#}"),
            denied: permission_problem(e),
        }
    }
}

/// The resolver thread (started at the first request; its ELF cache lives there), the pids
/// waiting for it, and the pids already tried (not asked again until unwatched).
#[derive(Default)]
pub struct LaunchHints {
    ask: Option<std::sync::mpsc::Sender<u32>>,
    answers: Option<tokio::sync::mpsc::UnboundedReceiver<Resolution>>,
    wanted: BTreeSet<u32>,
    tried: BTreeSet<u32>,
}

impl LaunchHints {
    /// Asks for hints on `pid`; nothing if it has them, is waiting for them or was tried.
    pub fn watch(&mut self, probes: &Probes, pid: u32) -> Result<()> {
        if pid == std::process::id()
            || self.tried.contains(&pid)
            || self.wanted.contains(&pid)
            || probes.watched_launches().any(|p| p == pid)
        {
            return Ok(());
        }
        if self.ask.is_none() {
            let (ask, questions) = std::sync::mpsc::channel::<u32>();
            let (tell, answers) = tokio::sync::mpsc::unbounded_channel::<Resolution>();
            std::thread::Builder::new()
                .name("gpreempt-launch".into())
                .spawn(move || {
                    let mut resolver = crate::observe::launch::LaunchResolver::new();
                    for pid in questions {
                        let t0 = std::time::Instant::now();
                        let r = resolver.resolve(pid);
                        if tell.send((pid, r, t0.elapsed())).is_err() {
                            break;
                        }
                    }
                })
                .context("starting the launch resolver thread")?;
            self.ask = Some(ask);
            self.answers = Some(answers);
        }
        let sent = self.ask.as_ref().is_some_and(|a| a.send(pid).is_ok());
        anyhow::ensure!(sent, "the launch resolver thread is gone");
        self.wanted.insert(pid);
        self.tried.insert(pid);
        Ok(())
    }

    /// The next resolution; pending for ever while nothing was asked (for `select!`).
    /// Cancel-safe (a channel receive).
    pub async fn next(&mut self) -> Option<Resolution> {
        match self.answers.as_mut() {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Attaches what a resolution found if the process still wants hints and is `alive`.
    pub fn resolved(
        &mut self,
        probes: &mut Probes,
        pid: u32,
        r: Result<Vec<LaunchTarget>>,
        alive: bool,
    ) -> Outcome {
        if !self.wanted.remove(&pid) {
            return Outcome::Dropped;
        }
        match r {
            Ok(t) if t.is_empty() => Outcome::NoneMapped,
            Ok(_) if !alive => Outcome::Dropped,
            Ok(t) => match probes.watch_launches(pid, &t) {
                Ok(n) => Outcome::Attached(n),
                Err(e) => Outcome::failed(&e),
            },
            Err(e) => Outcome::failed(&e),
        }
    }

    /// Stops the hints of `pid` (and forgets it was tried); whether uprobes were detached.
    pub fn unwatch(&mut self, probes: &mut Probes, pid: u32) -> bool {
        self.wanted.remove(&pid);
        self.tried.remove(&pid);
        if probes.watched_launches().any(|p| p == pid) {
            probes.unwatch_launches(pid);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure for want of a permission is a warning, once a minute; other failures and
    /// successes are information.
    #[test]
    fn permission_failures_are_warnings() {
        let denied = Outcome::failed(
            &anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EPERM))
                .context("attaching uprobes"),
        );
        let gone = Outcome::failed(&anyhow::anyhow!("pid 3 exited"));
        let gate = WarnGate::new();
        let t0 = std::time::Instant::now();
        assert_eq!(gone.level(&gate, t0), log::Level::Info);
        assert_eq!(Outcome::Attached(4).level(&gate, t0), log::Level::Info);
        assert_eq!(denied.level(&gate, t0), log::Level::Warn);
        assert_eq!(denied.level(&gate, t0), log::Level::Info, "once a minute");
        assert_eq!(
            denied.describe(3, Duration::from_millis(2)).as_deref(),
            Some("pid 3: no launch hints: attaching uprobes: Operation not permitted (os error 1)")
        );
    }
}
