//! NVIDIA: pauses through the targets' own RM clients, with the guardian and a watchdog. The
//! driver and the guardian are called from a worker thread of the backend's own ([`worker`]);
//! this side, on the controller's loop, only hands work over and beats the guardian's lease.
//!
//! Liveness: the loop beats the lease while the worker's call in flight is younger than
//! `max_suspend`. A slow call (a target tearing down its context can hold RM for a second) is
//! then no reason for the guardian to act; a wedged one is: once the call is that old the
//! worker cannot keep the `max_suspend` promise (its watchdog waits behind the call), so the
//! beats stop and the guardian, a lease later, resumes everything it holds.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc::UnboundedSender;

use super::{ActError, Acted, Arrival, Backend, BoxFut, Ticket};
use crate::{
    backend::guardian::{Beater, GuardianHandle},
    backend::nv::controller::{lock, NvControl, NvOps, Rm},
    backend::nv::startup::SelfTestControl,
    clock::monotonic_ns,
    lever::{Lever, Offer, Offers, Undo},
    observe::model::{State, Vendor},
    observe::watch::Watcher,
    outcome::{Notice, OpReport, TimesliceChange},
    policy::{Class, LeverPolicy, Policy},
};

pub mod acts;
pub mod controller;
pub mod selftest;
pub mod startup;
pub(crate) mod worker;

use worker::{Cmd, Worker};

/// How often offline processes are checked for GR TSGs created since their class was set.
pub(super) const LEVER_RECHECK_NS: u64 = 100_000_000;

/// How long the start-up self-test waits for one worker call.
const SELF_TEST_CALL: Duration = Duration::from_secs(30);

/// NVIDIA's side of the seam, on the controller's loop.
pub struct NvBackend<O: NvOps + Send + 'static = Rm> {
    worker: Worker<O>,
    max_suspend_ns: u64,
    /// The guardian's heartbeat (None while no guardian runs) and how often it is owed.
    beater: Arc<Mutex<Option<Beater>>>,
    beat_every_ns: Option<u64>,
    last_beat_ns: u64,
    /// Heartbeats that were due and sent (counted with or without a guardian: tests read it).
    pub(crate) beats: u64,
    /// The start of the in-flight call last reported as wedged (each is reported once).
    wedged_since: u64,
    /// How long shutdown waits for the worker: the call in flight, then the undo.
    shutdown_wait: Duration,
    policy: LeverPolicy,
    /// Processes classed offline: their snapshots go to the worker for the lever re-check.
    offline: BTreeSet<u32>,
    /// Processes the worker was told about (each is forgotten there when it exits).
    known: BTreeSet<u32>,
    /// When the lever was last re-applied (not at every tick).
    lever_checked_ns: u64,
    /// The adaptive tuner's lever per GPU (over `policy.lever` there).
    gpu_levers: BTreeMap<u32, Lever>,
    /// The run directory, where a passed self-test is remembered (None: tests).
    dir: Option<std::path::PathBuf>,
}

impl NvBackend {
    /// The backend for this host; `out` is where the worker's results go.
    pub fn start(dir: &Path, max_suspend: Duration, out: UnboundedSender<Arrival>) -> Result<Self> {
        // A hung controller is covered once the lease runs out; a live one resumes at
        // max_suspend itself.
        let lease = max_suspend.max(Duration::from_millis(500));
        let mut b = Self::with(NvControl::new(dir)?.with_lease(lease), max_suspend, out)?;
        b.dir = Some(dir.to_path_buf());
        Ok(b)
    }
}

/// The TSGs asked for, or every live one of `pid`.
fn all_if_none(state: &State, pid: u32, queues: Option<Vec<u32>>) -> Vec<u32> {
    queues.unwrap_or_else(|| {
        state
            .procs
            .get(&pid)
            .map(|p| p.live_queues().map(|q| q.queue_id).collect())
            .unwrap_or_default()
    })
}

/// A one-process slice of the model: what the worker needs of `pid`, owned.
fn slice(state: &State, pid: u32) -> State {
    let mut s = State::new();
    if let Some(p) = state.procs.get(&pid) {
        s.procs.insert(pid, p.clone());
    }
    s
}

impl<O: NvOps + Send + 'static> NvBackend<O> {
    pub(crate) fn with(
        nv: NvControl<O>,
        max_suspend: Duration,
        out: UnboundedSender<Arrival>,
    ) -> Result<Self> {
        let beat_every_ns = nv
            .lease()
            .map(|l| (l / 4).min(Duration::from_millis(250)).as_nanos() as u64);
        let beater = nv.beater();
        Ok(Self {
            worker: Worker::start(nv, max_suspend, out)?,
            max_suspend_ns: u64::try_from(max_suspend.as_nanos()).unwrap_or(u64::MAX),
            beater,
            beat_every_ns,
            last_beat_ns: 0,
            beats: 0,
            wedged_since: 0,
            shutdown_wait: max_suspend + GuardianHandle::TIMEOUT,
            policy: LeverPolicy::default(),
            offline: BTreeSet::new(),
            known: BTreeSet::new(),
            lever_checked_ns: 0,
            gpu_levers: BTreeMap::new(),
            dir: None,
        })
    }

    /// Beats the guardian's lease when one is due, unless the worker's call in flight is
    /// `max_suspend` old (module comment); a wedged call is reported once.
    fn heartbeat(&mut self, now: u64) -> Option<Notice> {
        let every = self.beat_every_ns?;
        if let Some((since, pid)) = self.worker.busy() {
            let age = now.saturating_sub(since);
            if age >= self.max_suspend_ns {
                if self.wedged_since == since {
                    return None;
                }
                self.wedged_since = since;
                return Some(Notice::Problem {
                    pid,
                    text: format!(
                        "an NVIDIA driver call has been in flight for {} ms (max_suspend {} ms): \
                         heartbeats stop so that the guardian resumes what it holds",
                        age / 1_000_000,
                        self.max_suspend_ns / 1_000_000
                    ),
                });
            }
        }
        if now.saturating_sub(self.last_beat_ns) < every {
            return None;
        }
        self.last_beat_ns = now;
        self.beats += 1;
        let beater = lock(&self.beater).clone();
        if let Some(b) = beater {
            if let Err(e) = b.beat() {
                log::warn!("{e:#}");
            }
        }
        None
    }

    fn act(
        &mut self,
        state: &State,
        pid: u32,
        tsgs: Option<Vec<u32>>,
        suspend: bool,
        by_policy: bool,
    ) -> Acted {
        let ticket = Ticket::next();
        self.known.insert(pid);
        let cmd = Cmd::Act {
            ticket,
            pid,
            proc: slice(state, pid),
            tsgs,
            suspend,
            by_policy,
        };
        if self.worker.submit(cmd) {
            Acted::Later(ticket)
        } else {
            Acted::Now(Err(ActError::Driver(
                "the NVIDIA worker thread has ended".into(),
            )))
        }
    }
}

/// NVIDIA: every lever, through the target's own RM client (nvidia-rm.md).
pub const OFFERS: Offers = Offers {
    list: &[
        Offer {
            lever: Lever::None,
            cost: "nothing",
            undo: Undo::Nothing,
        },
        Offer {
            lever: Lever::Dynamic,
            cost: "two SET_TIMESLICE calls per TSG and online episode",
            undo: Undo::RestoreByGuardian,
        },
        Offer {
            lever: Lever::Timeslice,
            cost: "one SET_TIMESLICE call per TSG, at classification",
            undo: Undo::RestoreByGuardian,
        },
        Offer {
            lever: Lever::Pause,
            cost: "one FIFO_DISABLE_CHANNELS call per act, from a worker thread",
            undo: Undo::ResumeByGuardian,
        },
        Offer {
            lever: Lever::Both,
            cost: "the timeslice's call, and a pause per episode that outlasts pause_after",
            undo: Undo::ResumeByGuardian,
        },
    ],
    default: Lever::Timeslice,
};

impl<O: NvOps + Send + 'static> Backend for NvBackend<O> {
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }

    fn offers(&self) -> Offers {
        OFFERS
    }

    /// Handed to the worker; a process that cannot be prepared comes back as
    /// [`Arrival::Refused`].
    fn classed<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        class: Class,
    ) -> BoxFut<'a, Result<(), ActError>> {
        let offline = class == Class::Offline;
        let told = if offline {
            self.offline.insert(pid);
            self.known.insert(pid);
            true
        } else {
            self.offline.remove(&pid)
        };
        let sent = !told
            || self.worker.submit(Cmd::Classed {
                pid,
                proc: slice(state, pid),
                offline,
            });
        Box::pin(async move {
            if sent {
                Ok(())
            } else {
                Err(ActError::Driver(
                    "the NVIDIA worker thread has ended".into(),
                ))
            }
        })
    }

    fn suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        _grace: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        let tsgs = all_if_none(state, pid, queues);
        let r = self.act(state, pid, Some(tsgs), true, false);
        Box::pin(async move { r })
    }

    /// The engine's suspend: under the `dynamic` lever the short timeslice for the episode.
    fn policy_suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        _grace: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        let tsgs = all_if_none(state, pid, queues);
        let r = self.act(state, pid, Some(tsgs), true, true);
        Box::pin(async move { r })
    }

    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted> {
        let r = self.act(state, pid, queues, false, false);
        Box::pin(async move { r })
    }

    fn forget(&mut self, pid: u32) {
        self.offline.remove(&pid);
        if self.known.remove(&pid) {
            self.worker.submit(Cmd::Forget(pid));
        }
    }

    fn set_policy(&mut self, policy: &Policy) {
        self.policy = policy.levers;
        self.worker.submit(Cmd::Policy(policy.levers));
        // A new value (or lever) reaches every offline process at the next upkeep.
        self.lever_checked_ns = 0;
    }

    fn set_gpu_levers(&mut self, levers: &BTreeMap<u32, Lever>) {
        if *levers == self.gpu_levers {
            return;
        }
        self.gpu_levers = levers.clone();
        self.worker.submit(Cmd::GpuLevers(levers.clone()));
        // A static lever chosen for a GPU reaches its offline processes at the next upkeep.
        self.lever_checked_ns = 0;
    }

    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        self.worker.timeslices()
    }

    fn upkeep(&mut self, state: &State, now_ns: u64) -> Vec<Notice> {
        let out: Vec<Notice> = self.heartbeat(now_ns).into_iter().collect();
        // Exited targets: our fd duplicates would keep their RM clients alive.
        let gone: Vec<u32> = self
            .known
            .iter()
            .copied()
            .filter(|pid| state.procs.get(pid).is_none_or(|p| p.exited_ns.is_some()))
            .collect();
        for pid in gone {
            self.forget(pid);
        }
        // Only when the worker is idle: re-checks never pile up behind a slow call.
        let static_lever =
            self.policy.lever.timeslice() || self.gpu_levers.values().any(|l| l.timeslice());
        if static_lever
            && !self.offline.is_empty()
            && now_ns.saturating_sub(self.lever_checked_ns) >= LEVER_RECHECK_NS
            && self.worker.idle()
        {
            self.lever_checked_ns = now_ns;
            let procs = self
                .offline
                .iter()
                .map(|&pid| (pid, slice(state, pid)))
                .collect();
            self.worker.submit(Cmd::Lever(procs));
        }
        out
    }

    fn self_test<'a>(&'a mut self, w: &'a mut Watcher) -> BoxFut<'a, Result<Option<String>>> {
        Box::pin(async move {
            let mut via = Via(&self.worker);
            crate::backend::nv::startup::self_test(&mut via, w, self.dir.as_deref())
                .await
                .map(Some)
        })
    }

    /// Waits for the call in flight and the undo (at most `shutdown_wait`), beating the lease
    /// meanwhile by the same rule as the loop. Past the bound the guardian's pipe is closed, as
    /// a controller's death would: it resumes and restores everything it holds.
    fn shutdown(mut self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        Box::pin(async move {
            let Some(mut rx) = self.worker.stop() else {
                return Vec::new();
            };
            let start = std::time::Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_millis(50), &mut rx).await {
                    Ok(Ok(out)) => {
                        self.worker.join();
                        return out;
                    }
                    // It ended without answering (a panic): the guardian has its pipe's EOF.
                    Ok(Err(_)) => return Vec::new(),
                    Err(_) => {}
                }
                if let Some(Notice::Problem { text, .. }) = self.heartbeat(monotonic_ns()) {
                    log::warn!("{text}");
                }
                if start.elapsed() >= self.shutdown_wait {
                    let closed = lock(&self.beater).as_ref().is_some_and(|b| b.close());
                    log::warn!(
                        "the NVIDIA worker did not finish within {:?} (a driver call is stuck): {}",
                        self.shutdown_wait,
                        if closed {
                            "the guardian was told to undo everything it holds"
                        } else {
                            "the guardian undoes everything it holds when this process exits"
                        }
                    );
                    return Vec::new();
                }
            }
        })
    }
}

/// The self-test through the worker: the very thread the controller's acts go through.
struct Via<'a, O: NvOps + Send + 'static>(&'a Worker<O>);

impl<O: NvOps + Send + 'static> SelfTestControl for Via<'_, O> {
    fn act(&mut self, state: &State, pid: u32, tsgs: &[u32], disable: bool) -> Result<OpReport> {
        let (proc, tsgs) = (slice(state, pid), tsgs.to_vec());
        self.0.call(SELF_TEST_CALL, move |w| {
            w.nv.act(&proc, pid, &tsgs, disable)
        })?
    }

    fn set_timeslices(&mut self, state: &State, pid: u32, us: u64) -> Result<Vec<TimesliceChange>> {
        let proc = slice(state, pid);
        self.0
            .call(SELF_TEST_CALL, move |w| w.nv.set_timeslices(&proc, pid, us))?
    }

    fn read_timeslice(&mut self, pid: u32, tsg: u32) -> Result<u64> {
        self.0
            .call(SELF_TEST_CALL, move |w| w.nv.read_timeslice(pid, tsg))?
    }

    fn restore_timeslices(&mut self, pid: u32) -> Result<Vec<TimesliceChange>> {
        self.0
            .call(SELF_TEST_CALL, move |w| w.nv.restore_timeslices(pid))?
    }

    fn forget(&mut self, pid: u32) {
        if let Err(e) = self.0.call(SELF_TEST_CALL, move |w| w.forget(pid)) {
            log::warn!("self-test: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests;
