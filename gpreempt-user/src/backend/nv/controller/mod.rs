//! The NVIDIA side of the controller: pauses and resumes a process's TSGs through its own RM
//! client (a duplicate of its fd), with the guardian holding the way back.
//!
//! The first pause of a (process, client, subdevice) registers every channel of that client with
//! the guardian (one hold per target, kept until the target exits or the controller stops), so a
//! controller that dies in any way leaves nothing paused. Results come back as the KFD path's
//! [`OpReport`], so the policy, the audit and the model treat both vendors alike. In the controller
//! it lives on the NVIDIA backend's worker thread (`backend/nv/worker.rs`): its calls may block.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{
    backend::guardian::{Beater, GuardianHandle, HoldEntry, TsgTimeslice},
    backend::nv::acts::{set_disabled_mode, set_timeslice, Channels},
    clock::monotonic_ns,
    observe::model::State,
    observe::nv::rm::{dup_fd, get_timeslice},
    observe::procinfo::ProcId,
    outcome::{OpReport, QueueOutcome, QueueResult, TimesliceChange},
};

/// What pausing needs from the system; the real one is [`Rm`], tests use a fake.
pub trait NvOps {
    /// A duplicate of fd `fd` of the process `id` names, never of one that got its pid later.
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd>;
    /// `schedule_only`: a disable leaves running work to finish (bOnlyDisableScheduling).
    fn set(
        &mut self,
        fd: BorrowedFd,
        ch: &Channels,
        disable: bool,
        schedule_only: bool,
    ) -> Result<Duration>;
    fn get_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32) -> Result<u64>;
    fn set_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32, us: u64) -> Result<()>;
}

/// The driver itself.
pub struct Rm;

impl NvOps for Rm {
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd> {
        dup_fd(id, fd)
    }
    fn set(
        &mut self,
        fd: BorrowedFd,
        ch: &Channels,
        disable: bool,
        schedule_only: bool,
    ) -> Result<Duration> {
        set_disabled_mode(fd, ch, disable, schedule_only)
    }
    fn get_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32) -> Result<u64> {
        get_timeslice(fd, h_client, h_tsg)
    }
    fn set_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32, us: u64) -> Result<()> {
        set_timeslice(fd, h_client, h_tsg, us).map(|_| ())
    }
}

/// Where a TSG lives: the RM client, its subdevice and the target's fd that holds the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ClientKey {
    h_client: u32,
    h_subdevice: u32,
    fd: i32,
}

struct ClientState {
    dup: OwnedFd,
    /// TSG handle -> its channels (the TSG handle itself when none were seen).
    tsgs: BTreeMap<u32, Vec<u32>>,
    /// TSG handle -> its GPU, for reports made without the model (the watchdog, shutdown).
    gpus: BTreeMap<u32, u32>,
    /// Paused TSGs, each with when its pause returned (for the watchdog).
    paused: BTreeMap<u32, u64>,
    /// Channels the guardian holds a way back for.
    guarded: BTreeSet<u32>,
    /// Its GR (graphics/compute) TSGs: the ones whose timeslice is the lever.
    gr: BTreeSet<u32>,
    /// TSGs whose timeslice we changed: (original, what we set). The guardian journals the
    /// original before the first change.
    timeslices: BTreeMap<u32, (u64, u64)>,
}

/// Paused and pausable TSGs per process.
pub struct NvControl<O: NvOps = Rm> {
    ops: O,
    exe: PathBuf,
    journal: PathBuf,
    /// Spawned at the first pause; None in tests.
    guardian: Option<GuardianHandle>,
    use_guardian: bool,
    /// The guardian resumes everything held if we stay silent this long (a hung controller).
    lease: Option<Duration>,
    /// The running guardian's heartbeat, for the thread that beats (the controller's loop,
    /// while this one may be waiting on the driver).
    beater: Arc<Mutex<Option<Beater>>>,
    targets: HashMap<u32, BTreeMap<ClientKey, ClientState>>,
    /// Each target's start time: what is kept under a pid belongs to that process only.
    starts: HashMap<u32, u64>,
    /// Pauses only take channels off the runlist (`[nvidia] pause = "schedule"`).
    schedule_only: bool,
}

impl NvControl<Rm> {
    /// `dir`: the run directory (the guardian's journal lives there).
    pub fn new(dir: &Path) -> Result<Self> {
        Ok(Self {
            ops: Rm,
            exe: std::env::current_exe().context("locating our own binary")?,
            journal: dir.join("nv-journal"),
            guardian: None,
            use_guardian: true,
            lease: None,
            beater: Arc::default(),
            targets: HashMap::new(),
            starts: HashMap::new(),
            schedule_only: false,
        })
    }
}

impl<O: NvOps> NvControl<O> {
    /// Without a guardian (unit tests only: nothing would undo a pause if this process died).
    #[cfg(test)]
    pub(crate) fn unguarded(ops: O) -> Self {
        Self {
            ops,
            exe: PathBuf::new(),
            journal: PathBuf::new(),
            guardian: None,
            use_guardian: false,
            lease: None,
            beater: Arc::default(),
            targets: HashMap::new(),
            starts: HashMap::new(),
            schedule_only: false,
        }
    }

    /// `[nvidia] pause`: whether a pause leaves work already running to finish.
    pub fn set_schedule_only(&mut self, on: bool) {
        self.schedule_only = on;
    }

    /// Learns `pid`'s clients from the model (dups their fds, registers them with the guardian)
    /// ahead of a first pause, so that the pause itself is only the RM call.
    pub fn prepare(&mut self, state: &State, pid: u32) -> Result<()> {
        self.learn(state, pid)
    }

    /// Learns `pid`'s clients from the model (dups their fds, registers them with the guardian).
    fn learn(&mut self, state: &State, pid: u32) -> Result<()> {
        let Some(p) = state.procs.get(&pid) else {
            anyhow::bail!("pid {pid} is not known");
        };
        let Some(start_time) = p.info.as_ref().map(|i| i.start_time) else {
            anyhow::bail!("pid {pid}: its /proc facts are not read yet");
        };
        let id = ProcId { pid, start_time };
        if self.starts.get(&pid).is_some_and(|&s| s != start_time) {
            // What is kept under the pid is a previous owner's (its dups, the guardian's
            // holds): that process is gone, and none of it may be used on this one.
            log::info!("{id}: the pid had another owner before; forgetting that one");
            self.forget(pid);
        }
        let mut found: BTreeMap<ClientKey, BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
        let mut gr: BTreeMap<ClientKey, BTreeSet<u32>> = BTreeMap::new();
        let mut gpus: BTreeMap<ClientKey, BTreeMap<u32, u32>> = BTreeMap::new();
        for q in p.live_queues() {
            let Some(t) = &q.nv else { continue };
            let Some(h_subdevice) = t.h_subdevice else {
                continue;
            };
            let key = ClientKey {
                h_client: t.h_client,
                h_subdevice,
                fd: t.fd,
            };
            let ch = if t.channels.is_empty() {
                vec![q.queue_id]
            } else {
                t.channels.clone()
            };
            found.entry(key).or_default().insert(q.queue_id, ch);
            gpus.entry(key).or_default().insert(q.queue_id, q.gpu_id);
            if t.engine_type == gpreempt_common::nv::ENGINE_TYPE_GRAPHICS {
                gr.entry(key).or_default().insert(q.queue_id);
            }
        }
        for (key, tsgs) in found {
            let channels: BTreeSet<u32> = tsgs.values().flatten().copied().collect();
            let known = self.targets.entry(pid).or_default();
            // Channels created since the last hold: the guardian must be able to resume them
            // too before any of them is paused.
            let new: Vec<u32> = match known.get(&key) {
                Some(c) => channels.difference(&c.guarded).copied().collect(),
                None => channels.iter().copied().collect(),
            };
            if let std::collections::btree_map::Entry::Vacant(v) = known.entry(key) {
                v.insert(ClientState {
                    dup: self.ops.dup(id, key.fd)?,
                    tsgs: BTreeMap::new(),
                    gpus: BTreeMap::new(),
                    paused: BTreeMap::new(),
                    guarded: BTreeSet::new(),
                    gr: BTreeSet::new(),
                    timeslices: BTreeMap::new(),
                });
            }
            if !new.is_empty() && self.use_guardian {
                let g = match self.guardian.as_mut() {
                    Some(g) => g,
                    None => {
                        let g =
                            GuardianHandle::spawn_with_lease(&self.exe, &self.journal, self.lease)?;
                        *lock(&self.beater) = Some(g.beater());
                        self.guardian.insert(g)
                    }
                };
                g.hold(&HoldEntry {
                    pid,
                    start_time,
                    fd: key.fd,
                    h_client: key.h_client,
                    h_subdevice: key.h_subdevice,
                    channels: new.clone(),
                    timeslices: Vec::new(),
                })?;
            }
            if let Some(c) = self.targets.get_mut(&pid).and_then(|k| k.get_mut(&key)) {
                c.guarded.extend(new);
                c.tsgs = tsgs; // TSGs come and go; what is paused stays recorded
                c.gpus.extend(gpus.remove(&key).unwrap_or_default());
                c.gr = gr.remove(&key).unwrap_or_default();
            }
        }
        self.starts.insert(pid, start_time);
        Ok(())
    }

    /// Pauses (`disable`) or resumes the TSGs `tsgs` of `pid` (queue ids in the model).
    pub fn act(
        &mut self,
        state: &State,
        pid: u32,
        tsgs: &[u32],
        disable: bool,
    ) -> Result<OpReport> {
        if disable {
            self.learn(state, pid)?;
        }
        let issued_ns = monotonic_ns();
        let mut queues = Vec::new();
        let gpu = |q: u32| state.queue(pid, q).map(|q| q.gpu_id);
        let Some(clients) = self.targets.get_mut(&pid) else {
            anyhow::bail!("pid {pid}: nothing paused");
        };
        let mut first_err = None;
        for (key, c) in clients.iter_mut() {
            let mine: Vec<u32> = tsgs
                .iter()
                .copied()
                .filter(|t| c.tsgs.contains_key(t))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ch = Channels {
                h_client: key.h_client,
                h_subdevice: key.h_subdevice,
                channels: mine
                    .iter()
                    .flat_map(|t| c.tsgs[t].iter().copied())
                    .collect(),
            };
            let outcome = match self
                .ops
                .set(c.dup.as_fd(), &ch, disable, self.schedule_only)
            {
                Ok(_) => {
                    let now = monotonic_ns();
                    for t in &mine {
                        if disable {
                            c.paused.entry(*t).or_insert(now);
                        } else {
                            c.paused.remove(t);
                        }
                    }
                    QueueOutcome::Done
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    QueueOutcome::Error
                }
            };
            queues.extend(mine.iter().map(|&q| QueueResult {
                queue_id: q,
                gpu_id: c.gpus.get(&q).copied().or_else(|| gpu(q)),
                outcome,
            }));
        }
        for &t in tsgs {
            if !queues.iter().any(|q| q.queue_id == t) {
                queues.push(QueueResult {
                    queue_id: t,
                    gpu_id: gpu(t),
                    outcome: QueueOutcome::Invalid,
                });
            }
        }
        if let (Some(e), true) = (
            first_err,
            queues.iter().all(|q| q.outcome != QueueOutcome::Done),
        ) {
            return Err(e);
        }
        Ok(OpReport {
            pid,
            ret: None,
            queues,
            issued_ns,
            returned_ns: monotonic_ns(),
            effect: crate::outcome::Effect::Paused,
        })
    }

    /// Gives `pid`'s GR TSGs the timeslice `us`, those it creates later too (call it again).
    /// Before a TSG's first change its original value is read and handed to the guardian, which
    /// puts it back if this process dies. Returns what changed; TSGs already at `us` are left.
    pub fn set_timeslices(
        &mut self,
        state: &State,
        pid: u32,
        us: u64,
    ) -> Result<Vec<TimesliceChange>> {
        self.learn(state, pid)?;
        let Self {
            ops,
            guardian,
            use_guardian,
            targets,
            ..
        } = self;
        let start_time = self.starts.get(&pid).copied().unwrap_or_default();
        let Some(clients) = targets.get_mut(&pid) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (key, c) in clients.iter_mut() {
            let todo: Vec<u32> =
                c.gr.iter()
                    .copied()
                    .filter(|t| c.timeslices.get(t).is_none_or(|&(_, now)| now != us))
                    .collect();
            if todo.is_empty() {
                continue;
            }
            // Originals first, journaled by the guardian, before anything changes.
            let mut fresh = Vec::new();
            for &t in &todo {
                if !c.timeslices.contains_key(&t) {
                    let original = ops.get_timeslice(c.dup.as_fd(), key.h_client, t)?;
                    fresh.push(TsgTimeslice {
                        h_tsg: t,
                        original_us: original,
                    });
                }
            }
            if !fresh.is_empty() && *use_guardian {
                let Some(g) = guardian.as_mut() else {
                    anyhow::bail!("pid {pid}: no guardian to hold the original timeslices");
                };
                g.hold(&HoldEntry {
                    pid,
                    start_time,
                    fd: key.fd,
                    h_client: key.h_client,
                    h_subdevice: key.h_subdevice,
                    channels: Vec::new(),
                    timeslices: fresh.clone(),
                })?;
            }
            for f in fresh {
                c.timeslices.insert(f.h_tsg, (f.original_us, f.original_us));
            }
            for t in todo {
                let (original, from) = c.timeslices[&t];
                let issued_ns = monotonic_ns();
                ops.set_timeslice(c.dup.as_fd(), key.h_client, t, us)?;
                c.timeslices.insert(t, (original, us));
                out.push(TimesliceChange {
                    pid,
                    queue_id: t,
                    from_us: from,
                    to_us: us,
                    original_us: original,
                    issued_ns,
                    returned_ns: monotonic_ns(),
                });
            }
        }
        Ok(out)
    }

    /// Puts back the original timeslices of `pid`'s TSGs (class change, reload, exit).
    pub fn restore_timeslices(&mut self, pid: u32) -> Result<Vec<TimesliceChange>> {
        self.put_back(pid, false)
    }

    /// Puts back the original timeslices of `pid`'s TSGs but keeps the originals known (the
    /// `dynamic` lever at the end of an online episode): the next episode's SET then needs no
    /// GET and no guardian round trip, one RM call per TSG. The guardian keeps its journal of
    /// the originals, which it would only set again to the value they already have.
    pub fn relax_timeslices(&mut self, pid: u32) -> Result<Vec<TimesliceChange>> {
        self.put_back(pid, true)
    }

    fn put_back(&mut self, pid: u32, keep: bool) -> Result<Vec<TimesliceChange>> {
        let Some(clients) = self.targets.get_mut(&pid) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut first_err = None;
        for (key, c) in clients.iter_mut() {
            let entries = if keep {
                c.timeslices.clone()
            } else {
                std::mem::take(&mut c.timeslices)
            };
            for (t, (original, now)) in entries {
                if now == original {
                    continue;
                }
                let issued_ns = monotonic_ns();
                match self
                    .ops
                    .set_timeslice(c.dup.as_fd(), key.h_client, t, original)
                {
                    Ok(()) => {
                        if keep {
                            c.timeslices.insert(t, (original, original));
                        }
                        out.push(TimesliceChange {
                            pid,
                            queue_id: t,
                            from_us: now,
                            to_us: original,
                            original_us: original,
                            issued_ns,
                            returned_ns: monotonic_ns(),
                        })
                    }
                    Err(e) => {
                        // Kept: a later restore (or the guardian) tries again.
                        c.timeslices.insert(t, (original, now));
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The timeslice of one of `pid`'s TSGs as the driver reads it now.
    pub fn read_timeslice(&mut self, pid: u32, tsg: u32) -> Result<u64> {
        let Some((key, c)) = self
            .targets
            .get(&pid)
            .and_then(|cs| cs.iter().find(|(_, c)| c.tsgs.contains_key(&tsg)))
        else {
            anyhow::bail!("pid {pid}: TSG {tsg:#x} is not known");
        };
        self.ops.get_timeslice(c.dup.as_fd(), key.h_client, tsg)
    }

    /// Every TSG timeslice changed now: (pid, tsg, original, current).
    pub fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        let mut v: Vec<(u32, u32, u64, u64)> = self
            .targets
            .iter()
            .flat_map(|(&pid, cs)| {
                cs.values().flat_map(move |c| {
                    c.timeslices
                        .iter()
                        .filter(|(_, (o, n))| o != n)
                        .map(move |(&t, &(o, n))| (pid, t, o, n))
                })
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// The target exited: drop its fd duplicates and the guardian's hold.
    pub fn forget(&mut self, pid: u32) {
        self.starts.remove(&pid);
        if let Some(clients) = self.targets.remove(&pid) {
            if let Some(g) = self.guardian.as_mut() {
                for key in clients.keys() {
                    if let Err(e) = g.release(pid, key.h_client) {
                        log::warn!("guardian release of pid {pid}: {e:#}");
                    }
                }
            }
        }
    }

    /// Forgets targets that exited, or whose pid the model has seen pass to another process
    /// (our duplicates would keep their RM clients alive).
    pub fn prune(&mut self, state: &State) {
        let gone: Vec<u32> = self
            .targets
            .keys()
            .copied()
            .filter(|pid| {
                state.procs.get(pid).is_none_or(|p| {
                    p.exited_ns.is_some()
                        || p.info.as_ref().map(|i| i.start_time) != self.starts.get(pid).copied()
                })
            })
            .collect();
        for pid in gone {
            self.forget(pid);
        }
    }

    /// Resumes everything paused, puts every timeslice back, releases the holds and stops the
    /// guardian. A target whose undo failed keeps its hold: the guardian, told to stop, undoes
    /// what it still holds.
    pub fn shutdown(&mut self) -> Vec<OpReport> {
        let mut out = Vec::new();
        let pids: Vec<u32> = self.targets.keys().copied().collect();
        for pid in pids {
            match self.restore_timeslices(pid) {
                // Said whatever the verbosity: the operator's proof that nothing stays changed.
                Ok(changes) => {
                    for c in changes {
                        eprintln!(
                            "pid {pid}: TSG {:#x} timeslice {} -> {} us (controller exit)",
                            c.queue_id, c.from_us, c.to_us
                        );
                    }
                }
                Err(e) => {
                    log::warn!(
                        "pid {pid}: restoring timeslices at exit: {e:#} (the guardian retries)"
                    )
                }
            }
            let paused: Vec<u32> = self.targets[&pid]
                .values()
                .flat_map(|c| c.paused.keys().copied())
                .collect();
            if !paused.is_empty() {
                match self.act(&State::new(), pid, &paused, false) {
                    Ok(r) => out.push(r),
                    Err(e) => {
                        log::warn!("pid {pid}: resuming at exit: {e:#} (the guardian retries)")
                    }
                }
            }
            let undone = self.targets[&pid]
                .values()
                .all(|c| c.paused.is_empty() && c.timeslices.values().all(|(o, n)| o == n));
            if undone {
                self.forget(pid);
            }
        }
        if let Some(g) = self.guardian.take() {
            *lock(&self.beater) = None;
            if let Err(e) = g.shutdown(Duration::from_secs(5)) {
                log::warn!("stopping the NVIDIA guardian: {e:#}");
            }
        }
        out
    }

    /// With a guardian lease: it resumes everything it holds when no heartbeat came for `lease`.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The guardian's lease, if one was asked for.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// Where the running guardian's heartbeat is (None while no guardian runs): another thread
    /// beats through it, so the lease measures that thread's liveness, not this one's.
    pub fn beater(&self) -> Arc<Mutex<Option<Beater>>> {
        self.beater.clone()
    }

    /// When the oldest pause still in place returned (the watchdog's next deadline follows).
    pub fn oldest_pause(&self) -> Option<u64> {
        self.targets
            .values()
            .flat_map(|cs| cs.values())
            .flat_map(|c| c.paused.values().copied())
            .min()
    }

    /// TSGs paused for `max_ns` or longer at `now_ns`, per process (the watchdog resumes them).
    pub fn overdue(&self, now_ns: u64, max_ns: u64) -> Vec<(u32, Vec<u32>)> {
        let mut out: Vec<(u32, Vec<u32>)> = self
            .targets
            .iter()
            .filter_map(|(&pid, cs)| {
                let tsgs: Vec<u32> = cs
                    .values()
                    .flat_map(|c| c.paused.iter())
                    .filter(|&(_, &since)| now_ns.saturating_sub(since) >= max_ns)
                    .map(|(&t, _)| t)
                    .collect();
                (!tsgs.is_empty()).then_some((pid, tsgs))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// (pid, TSG) pairs paused now.
    pub fn paused(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .targets
            .iter()
            .flat_map(|(&pid, cs)| {
                cs.values()
                    .flat_map(move |c| c.paused.keys().map(move |&t| (pid, t)))
            })
            .collect();
        v.sort_unstable();
        v
    }
}

/// A slot's lock (a panic while holding it left nothing half-done in an `Option`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
pub(crate) mod tests;
