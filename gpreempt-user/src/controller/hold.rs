//! The one acting path of a controller: [`Holder`] owns the run directory's lock, the backends
//! (and the channel their threads answer on), the control socket when it serves one, and the
//! queues it holds suspended, which it publishes in the status file. `suspend` / `resume`
//! without a controller, `top` acting on a key and `kfd-cycles` act through it alone; `run`
//! keeps its own loop (the policy's acts, acts that finish on a backend's worker thread) but
//! owns its backends and restores everything through it.
//!
//! Whatever way a holder ends, nothing stays suspended: [`Holder::shutdown`] resumes everything
//! the backends hold; a holder dropped without it, or a process that dies, is left to each
//! backend's own way back (its Drop, the kernel, its guardian).

use std::{
    collections::BTreeMap,
    ops::{Deref, DerefMut},
    path::Path,
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc;

use crate::{
    backend::{ActError, Arrival, Backends},
    clock::monotonic_ns,
    controller::{
        daemon::{self, Access, Incoming, Lock, Request, Status},
        requests::{self, Answer},
    },
    observe::model::State,
    outcome::{Notice, OpReport, QueueOutcome},
    policy::Class,
};

/// What [`Holder::next`] received.
#[derive(Debug)]
pub enum Next {
    /// From a backend's thread; a notice has been applied to the held set already.
    Arrival(Arrival),
    /// A request on the control socket, to answer ([`Holder::answer`]) and reply to.
    Request(Incoming),
}

pub struct Holder {
    lock: Lock,
    backends: Backends,
    requests: Option<mpsc::Receiver<Incoming>>,
    /// Queues held suspended: (pid, queue) -> GPU.
    held: BTreeMap<(u32, u32), Option<u32>>,
    /// What the status file says this controller is (`suspend`, `top`, ...).
    mode: &'static str,
}

impl Holder {
    pub fn new(lock: Lock, backends: Backends, mode: &'static str) -> Self {
        Self {
            lock,
            backends,
            requests: None,
            held: BTreeMap::new(),
            mode,
        }
    }

    /// The backend that can act on a process by its pid alone (the one that can seize any
    /// process, through `device`): for a controller without a model of the host.
    pub async fn by_pid(
        lock: Lock,
        device: &Path,
        max_suspend: Duration,
        mode: &'static str,
    ) -> Result<Self> {
        let backends = Backends::by_pid(device, lock.dir(), max_suspend).await?;
        Ok(Self::new(lock, backends, mode))
    }

    /// The run directory, under its lock.
    pub fn dir(&self) -> &Path {
        self.lock.dir()
    }

    /// Opens the control socket: its requests come from [`Self::next`] from now on.
    pub fn serve(&mut self, access: Access) -> Result<()> {
        self.requests = Some(daemon::serve(self.lock.dir(), access)?);
        Ok(())
    }

    /// `pid` got `class`: the backend that acts on it gets ready (attached ahead, recorded).
    pub async fn classed(&mut self, state: &State, pid: u32, class: Class) -> Result<(), ActError> {
        self.backends
            .for_pid(state, pid)?
            .classed(state, pid, class)
            .await
    }

    /// Suspends `queues` of `pid` (None: all of them) and holds what was done. For backends
    /// that act at once: an act handed to a worker is an error here
    /// ([`crate::backend::Acted::now`]).
    pub async fn suspend(
        &mut self,
        state: &State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> Result<OpReport, ActError> {
        let b = self.backends.for_pid(state, pid)?;
        let r = b.suspend(state, pid, queues, grace).await.now();
        self.acted(&r, true);
        r
    }

    /// Resumes `queues` of `pid` (None: every queue held) and lets go of what was done.
    pub async fn resume(
        &mut self,
        state: &State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> Result<OpReport, ActError> {
        let b = self.backends.for_pid(state, pid)?;
        let r = b.resume(state, pid, queues).await.now();
        self.acted(&r, false);
        r
    }

    /// A socket request, answered through the one path every controller answers by
    /// ([`requests::answer`]); what it did is held and published.
    pub async fn answer(&mut self, state: &State, req: Request) -> Answer {
        let status = self.status();
        let ans = requests::answer(&mut self.backends, state, req, || status)
            .await
            .now();
        if let Some((r, suspend)) = &ans.acted {
            self.record(r, *suspend);
            self.publish_quietly();
        }
        ans
    }

    /// The backends' upkeep (the KFD lease's heartbeat; call it at least every 100 ms while
    /// anything may be held). What they did on their own is applied here and returned to say.
    pub fn upkeep(&mut self, state: &State) -> Vec<Notice> {
        let now = monotonic_ns();
        let mut notices = Vec::new();
        for b in &mut self.backends.list {
            notices.extend(b.upkeep(state, now));
        }
        for n in &notices {
            self.noticed(n);
        }
        notices
    }

    /// The next arrival or socket request (cancel-safe, for a `select!`). Waits for good once
    /// neither can come: the caller's other branches (signals, timers) end the wait.
    pub async fn next(&mut self) -> Next {
        let requests = &mut self.requests;
        let request = async move {
            match requests {
                Some(r) => r.recv().await,
                None => None,
            }
        };
        let next = tokio::select! {
            Some(a) = self.backends.arrivals.recv() => Next::Arrival(a),
            Some(i) = request => Next::Request(i),
            else => std::future::pending().await,
        };
        if let Next::Arrival(Arrival::Notice(n)) = &next {
            self.noticed(n);
        }
        next
    }

    /// Applies what a backend did on its own to the held set (and publishes a change): acts of
    /// its control thread (watchdog, new queues of a process held whole, a fence) and a target
    /// that is gone with its queues.
    pub fn noticed(&mut self, n: &Notice) {
        match n {
            Notice::Acted {
                report, suspend, ..
            } => self.record(report, *suspend),
            Notice::TargetGone { pid, .. } => {
                let before = self.held.len();
                self.held.retain(|(p, _), _| p != pid);
                if self.held.len() == before {
                    return;
                }
            }
            _ => return,
        }
        self.publish_quietly();
    }

    /// (pid, queue, GPU) of every queue held suspended.
    pub fn held(&self) -> Vec<(u32, u32, Option<u32>)> {
        self.held.iter().map(|(&(p, q), &g)| (p, q, g)).collect()
    }

    pub fn status(&self) -> Status {
        Status {
            controller_pid: std::process::id(),
            mode: self.mode.into(),
            held: self.held(),
            ..Default::default()
        }
    }

    /// Writes the status file (`top` and `queues` read it).
    pub fn publish(&self) -> Result<()> {
        daemon::write_status(self.lock.dir(), &self.status())
    }

    fn publish_quietly(&self) {
        if let Err(e) = self.publish() {
            log::warn!("{e:#}");
        }
    }

    /// Resumes everything every backend holds and lets go; the reports of what was resumed.
    /// The held set is empty afterwards.
    pub async fn shutdown(&mut self) -> Vec<OpReport> {
        let reports = self.backends.shutdown().await;
        self.held.clear();
        reports
    }

    fn acted(&mut self, r: &Result<OpReport, ActError>, suspend: bool) {
        if let Ok(report) = r {
            self.record(report, suspend);
            self.publish_quietly();
        }
    }

    /// The queues `report` changed enter (a suspend) or leave (a resume) the held set. A
    /// timeslice or freeze lever pauses no queue: nothing is held for it.
    fn record(&mut self, report: &OpReport, suspend: bool) {
        if !report.effect.is_paused() {
            return;
        }
        for q in report
            .queues
            .iter()
            .filter(|q| q.outcome == QueueOutcome::Done)
        {
            let key = (report.pid, q.queue_id);
            if suspend {
                self.held.insert(key, q.gpu_id);
            } else {
                self.held.remove(&key);
            }
        }
    }
}

/// The backends, for `run`'s loop, which calls them itself (the policy's acts, acts finishing
/// on a worker thread, levers, upkeep) and holds what its engine says.
impl Deref for Holder {
    type Target = Backends;
    fn deref(&self) -> &Backends {
        &self.backends
    }
}

impl DerefMut for Holder {
    fn deref_mut(&mut self) -> &mut Backends {
        &mut self.backends
    }
}

#[cfg(test)]
mod tests;
