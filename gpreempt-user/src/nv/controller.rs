//! The NVIDIA side of the controller: pauses and resumes a process's TSGs through its own RM
//! client (a duplicate of its fd), with the guardian holding the way back.
//!
//! The first pause of a (process, client, subdevice) registers every channel of that client with
//! the guardian (one hold per target, kept until the target exits or the controller stops), so a
//! controller that dies in any way leaves nothing paused. Results come back as the KFD path's
//! [`OpReport`], so the policy, the audit and the model treat both vendors alike.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{
    clock::monotonic_ns,
    model::State,
    nv::{
        guardian::{GuardianHandle, HoldEntry, TsgTimeslice},
        rm::{dup_fd, get_timeslice, set_disabled_mode, set_timeslice, Channels},
    },
    outcome::{OpReport, QueueOutcome, QueueResult, TimesliceChange},
};

/// What pausing needs from the system; the real one is [`Rm`], tests use a fake.
pub trait NvOps {
    fn dup(&mut self, pid: u32, fd: i32) -> Result<OwnedFd>;
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
    fn dup(&mut self, pid: u32, fd: i32) -> Result<OwnedFd> {
        dup_fd(pid, fd)
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
    last_beat_ns: u64,
    targets: HashMap<u32, BTreeMap<ClientKey, ClientState>>,
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
            last_beat_ns: 0,
            targets: HashMap::new(),
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
            last_beat_ns: 0,
            targets: HashMap::new(),
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
        let mut found: BTreeMap<ClientKey, BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
        let mut gr: BTreeMap<ClientKey, BTreeSet<u32>> = BTreeMap::new();
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
                    dup: self.ops.dup(pid, key.fd)?,
                    tsgs: BTreeMap::new(),
                    paused: BTreeMap::new(),
                    guarded: BTreeSet::new(),
                    gr: BTreeSet::new(),
                    timeslices: BTreeMap::new(),
                });
            }
            if !new.is_empty() && self.use_guardian {
                let g = match self.guardian.as_mut() {
                    Some(g) => g,
                    None => self.guardian.insert(GuardianHandle::spawn_with_lease(
                        &self.exe,
                        &self.journal,
                        self.lease,
                    )?),
                };
                g.hold(&HoldEntry {
                    pid,
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
                c.gr = gr.remove(&key).unwrap_or_default();
            }
        }
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
                gpu_id: gpu(q),
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
                ops.set_timeslice(c.dup.as_fd(), key.h_client, t, us)?;
                c.timeslices.insert(t, (original, us));
                out.push(TimesliceChange {
                    pid,
                    tsg: t,
                    from_us: from,
                    to_us: us,
                    original_us: original,
                });
            }
        }
        Ok(out)
    }

    /// Puts back the original timeslices of `pid`'s TSGs (class change, reload, exit).
    pub fn restore_timeslices(&mut self, pid: u32) -> Result<Vec<TimesliceChange>> {
        let Some(clients) = self.targets.get_mut(&pid) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut first_err = None;
        for (key, c) in clients.iter_mut() {
            for (t, (original, now)) in std::mem::take(&mut c.timeslices) {
                if now == original {
                    continue;
                }
                match self
                    .ops
                    .set_timeslice(c.dup.as_fd(), key.h_client, t, original)
                {
                    Ok(()) => out.push(TimesliceChange {
                        pid,
                        tsg: t,
                        from_us: now,
                        to_us: original,
                        original_us: original,
                    }),
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

    /// Forgets targets that exited (our duplicates would keep their RM clients alive).
    pub fn prune(&mut self, state: &State) {
        let gone: Vec<u32> = self
            .targets
            .keys()
            .copied()
            .filter(|pid| state.procs.get(pid).is_none_or(|p| p.exited_ns.is_some()))
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
                            c.tsg, c.from_us, c.to_us
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

    /// Tells the guardian we are alive (at most every quarter lease; call it often).
    pub fn beat(&mut self, now_ns: u64) {
        let (Some(lease), Some(g)) = (self.lease, self.guardian.as_mut()) else {
            return;
        };
        let every = (lease / 4).min(Duration::from_millis(250)).as_nanos() as u64;
        if now_ns.saturating_sub(self.last_beat_ns) < every {
            return;
        }
        self.last_beat_ns = now_ns;
        if let Err(e) = g.beat() {
            log::warn!("guardian heartbeat: {e:#}");
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::Update;
    use gpreempt_common::nv::class;

    /// An RM that records FIFO_DISABLE_CHANNELS calls (channels, disable).
    #[derive(Default)]
    pub(crate) struct Fake {
        pub(crate) calls: Vec<(Vec<u32>, bool)>,
        pub(crate) fail: bool,
        /// TSG -> timeslice (us) as the driver holds it (2048 when never set).
        pub(crate) timeslices: BTreeMap<u32, u64>,
        /// SET_TIMESLICE calls (tsg, us).
        pub(crate) ts_calls: Vec<(u32, u64)>,
        pub(crate) ts_fail: bool,
        /// The schedule-only flag of each FIFO_DISABLE_CHANNELS call.
        pub(crate) schedule_only: Vec<bool>,
    }

    impl NvOps for &mut Fake {
        fn dup(&mut self, _pid: u32, _fd: i32) -> Result<OwnedFd> {
            Ok(std::fs::File::open("/dev/null")?.into())
        }
        fn set(
            &mut self,
            _fd: BorrowedFd,
            ch: &Channels,
            disable: bool,
            schedule_only: bool,
        ) -> Result<Duration> {
            self.schedule_only.push(schedule_only);
            if self.fail {
                anyhow::bail!("NV_ERR_NOT_SUPPORTED");
            }
            self.calls.push((ch.channels.clone(), disable));
            Ok(Duration::from_micros(900))
        }
        fn get_timeslice(&mut self, _fd: BorrowedFd, _c: u32, h_tsg: u32) -> Result<u64> {
            Ok(*self.timeslices.get(&h_tsg).unwrap_or(&2048))
        }
        fn set_timeslice(&mut self, _fd: BorrowedFd, _c: u32, h_tsg: u32, us: u64) -> Result<()> {
            if self.ts_fail {
                anyhow::bail!("SET_TIMESLICE failed: NV_ERR_NOT_SUPPORTED (0x56)");
            }
            self.ts_calls.push((h_tsg, us));
            self.timeslices.insert(h_tsg, us);
            Ok(())
        }
    }

    #[test]
    fn the_timeslice_lever_changes_gr_tsgs_once_and_restores_the_originals() {
        let mut s = host();
        let mut fake = Fake::default();
        fake.timeslices.insert(0x20, 1024);
        let mut c = NvControl::unguarded(&mut fake);
        let ch = c.set_timeslices(&s, 7, 200).unwrap();
        // Only the compute (GR) TSG; the copy TSG 0x30 keeps its own.
        assert_eq!(
            ch,
            vec![TimesliceChange {
                pid: 7,
                tsg: 0x20,
                from_us: 1024,
                to_us: 200,
                original_us: 1024
            }]
        );
        assert_eq!(c.timeslices(), vec![(7, 0x20, 1024, 200)]);
        assert_eq!(c.read_timeslice(7, 0x20).unwrap(), 200);
        // Again: nothing to do. A GR TSG created later gets it too, from its own original.
        assert!(c.set_timeslices(&s, 7, 200).unwrap().is_empty());
        alloc(&mut s, 0x10, 0x40, class::KEPLER_CHANNEL_GROUP_A, 1);
        let ch = c.set_timeslices(&s, 7, 200).unwrap();
        assert_eq!((ch.len(), ch[0].tsg, ch[0].from_us), (1, 0x40, 2048));
        // A new value (policy reload) keeps the first original.
        let ch = c.set_timeslices(&s, 7, 100).unwrap();
        assert!(ch.iter().all(|c| c.to_us == 100), "{ch:?}");
        assert_eq!(ch[0].original_us, 1024);
        // Class change / exit of the controller: the originals come back.
        let back = c.restore_timeslices(7).unwrap();
        assert_eq!(back.len(), 2, "{back:?}");
        assert!(c.timeslices().is_empty());
        drop(c);
        assert_eq!(fake.timeslices[&0x20], 1024);
        assert_eq!(fake.timeslices[&0x40], 2048);
        assert!(
            !fake.ts_calls.iter().any(|&(t, _)| t == 0x30),
            "{:?}",
            fake.ts_calls
        );
    }

    #[test]
    fn shutdown_restores_changed_timeslices() {
        let s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        c.set_timeslices(&s, 7, 200).unwrap();
        c.act(&s, 7, &[0x20], true).unwrap();
        c.shutdown();
        assert_eq!(fake.timeslices[&0x20], 2048, "original back");
        assert_eq!(
            fake.calls.last(),
            Some(&(vec![0x21, 0x22], false)),
            "resumed"
        );
    }

    /// A put-back that fails at exit leaves the target held, so the guardian (told to stop)
    /// undoes it instead of being told to let it go.
    #[test]
    fn a_failed_restore_at_shutdown_keeps_the_hold_for_the_guardian() {
        let s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        c.set_timeslices(&s, 7, 200).unwrap();
        c.ops.ts_fail = true;
        c.shutdown();
        assert_eq!(c.timeslices(), vec![(7, 0x20, 2048, 200)], "still held");
        c.ops.ts_fail = false;
        c.shutdown();
        assert!(c.timeslices().is_empty());
        assert!(c.paused().is_empty());
    }

    #[test]
    fn a_refused_set_timeslice_is_an_error_and_changes_nothing() {
        let s = host();
        let mut fake = Fake {
            ts_fail: true,
            ..Default::default()
        };
        let mut c = NvControl::unguarded(&mut fake);
        let e = c.set_timeslices(&s, 7, 200).unwrap_err();
        assert!(format!("{e:#}").contains("NV_ERR_NOT_SUPPORTED"), "{e:#}");
        assert!(c.timeslices().is_empty());
    }

    fn alloc(s: &mut State, parent: u32, new: u32, h_class: u32, engine: u32) {
        alloc_for(s, 7, parent, new, h_class, engine)
    }

    fn alloc_for(s: &mut State, pid: u32, parent: u32, new: u32, h_class: u32, engine: u32) {
        s.apply(crate::model::tests::nvidia::rm_alloc(
            1, pid, 0xc1, parent, new, h_class, engine,
        ));
    }

    /// pid 7: client 0xc1, subdevice 0x11, compute TSG 0x20 (channels 0x21, 0x22), copy TSG 0x30.
    pub(crate) fn host() -> State {
        let mut s = State::new();
        alloc(&mut s, 0, 0xc1, class::NV01_ROOT_CLIENT, 0);
        alloc(&mut s, 0xc1, 0x10, class::NV01_DEVICE_0, 0);
        alloc(&mut s, 0x10, 0x11, class::NV20_SUBDEVICE_0, 0);
        alloc(&mut s, 0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1);
        alloc(&mut s, 0x20, 0x21, class::HOPPER_CHANNEL_GPFIFO_A, 0);
        alloc(&mut s, 0x20, 0x22, class::HOPPER_CHANNEL_GPFIFO_A, 0);
        alloc(&mut s, 0x10, 0x30, class::KEPLER_CHANNEL_GROUP_A, 0xb);
        s
    }

    /// Two NVIDIA processes: pid 7 runs online.py, pid 8 offline.py (a compute TSG 0x20 each).
    fn online_and_offline() -> State {
        let mut s = State::new();
        for pid in [7, 8] {
            alloc_for(&mut s, pid, 0, 0xc1, class::NV01_ROOT_CLIENT, 0);
            alloc_for(&mut s, pid, 0xc1, 0x10, class::NV01_DEVICE_0, 0);
            alloc_for(&mut s, pid, 0x10, 0x11, class::NV20_SUBDEVICE_0, 0);
            alloc_for(&mut s, pid, 0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1);
            alloc_for(&mut s, pid, 0x20, 0x21, class::HOPPER_CHANNEL_GPFIFO_A, 0);
            let script = if pid == 7 { "online.py" } else { "offline.py" };
            s.apply(Update::ProcInfo {
                pid,
                info: crate::observe::procinfo::ProcInfo {
                    comm: "python3".into(),
                    cmdline: format!("python3 scripts/gpu/{script} 45"),
                    start_time: 100 + u64::from(pid),
                    ..Default::default()
                },
            });
        }
        s
    }

    /// The pause lever: the policy sees NVIDIA processes like KFD ones, an online launch hint
    /// suspends the offline process's compute TSG.
    #[test]
    fn a_launch_hint_of_an_online_nvidia_process_suspends_the_offline_one() {
        use crate::policy::{Action, Engine, Policy};
        let mut s = online_and_offline();
        let policy = Policy::parse(
            include_str!("../../../scripts/gpu/policy.toml"),
            "policy.toml",
        )
        .unwrap();
        let mut e = Engine::new(policy);
        let classes = e.classify(&s);
        assert_eq!(classes.len(), 2, "{classes:?}");
        let now = 5_000_000_000;
        s.procs.get_mut(&7).unwrap().last_launch_ns = Some(now - 200_000);
        let ds = e.decide(&s, now);
        assert_eq!(ds.len(), 1, "{ds:#?}");
        assert_eq!(
            (ds[0].action, ds[0].pid, ds[0].queues.clone()),
            (Action::Suspend, 8, vec![0x20])
        );
    }

    /// The timeslice lever (the default) never pauses; `both` pauses only once online work has
    /// stayed busy for `pause_after`.
    #[test]
    fn the_lever_decides_whether_nvidia_offline_work_is_paused() {
        use crate::policy::{Action, Engine, Policy};
        let rules = "[[rule]]\nclass = \"online\"\ncmdline = 'online'\n\
                     [[rule]]\nclass = \"offline\"\ncmdline = 'offline'\n";
        let ms = 1_000_000;
        for (nvidia, pause_at) in [
            ("", None),
            ("[nvidia]\nlever = \"timeslice\"\n", None),
            (
                "[nvidia]\nlever = \"both\"\npause_after = \"5ms\"\n",
                Some(5 * ms),
            ),
            ("[nvidia]\nlever = \"pause\"\n", Some(0)),
        ] {
            let text = format!("[policy]\nmin_interval = \"1ms\"\n{nvidia}{rules}");
            let mut e = Engine::new(Policy::parse(&text, "p.toml").unwrap());
            let mut s = online_and_offline();
            e.classify(&s);
            let start = 5_000 * ms;
            let mut first = None;
            for step in 0..10u64 {
                let now = start + step * ms;
                // Online launches every tick: one long episode.
                s.procs.get_mut(&7).unwrap().last_launch_ns = Some(now - 100_000);
                let ds = e.decide(&s, now);
                if let Some(d) = ds.iter().find(|d| d.action == Action::Suspend) {
                    assert_eq!(d.pid, 8);
                    first.get_or_insert(now - start);
                    e.confirm(d, &d.queues);
                }
            }
            assert_eq!(first, pause_at, "{nvidia:?}");
        }
    }

    #[test]
    fn pauses_the_listed_tsgs_channels_and_resumes_them() {
        let s = host();
        assert_eq!(s.procs[&7].vendor(), Some(crate::model::Vendor::Nvidia));
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        let r = c.act(&s, 7, &[0x20], true).unwrap();
        assert_eq!(r.done(), vec![0x20]);
        assert_eq!(c.paused(), vec![(7, 0x20)]);
        let r = c.act(&s, 7, &[0x20, 0x99], false).unwrap();
        assert_eq!(r.done(), vec![0x20]);
        assert_eq!(r.queues[1].outcome, QueueOutcome::Invalid, "unknown TSG");
        assert!(c.paused().is_empty());
        drop(c);
        assert_eq!(
            fake.calls,
            vec![(vec![0x21, 0x22], true), (vec![0x21, 0x22], false)]
        );
        assert_eq!(fake.schedule_only, vec![false, false]);
    }

    #[test]
    fn a_schedule_only_policy_reaches_the_rm_call() {
        let s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        c.set_schedule_only(true);
        c.act(&s, 7, &[0x20], true).unwrap();
        c.act(&s, 7, &[0x20], false).unwrap();
        drop(c);
        assert_eq!(fake.schedule_only, vec![true, true]);
    }

    #[test]
    fn overdue_lists_tsgs_paused_for_max_or_longer() {
        let s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        assert!(c.overdue(u64::MAX, 0).is_empty(), "nothing paused");
        let r = c.act(&s, 7, &[0x20], true).unwrap();
        let since = r.returned_ns;
        assert!(c.overdue(since, 1_000_000).is_empty());
        assert_eq!(
            c.overdue(since + 2_000_000, 1_000_000),
            vec![(7, vec![0x20])]
        );
        c.act(&s, 7, &[0x20], false).unwrap();
        assert!(c.overdue(u64::MAX, 0).is_empty(), "resumed");
    }

    /// A channel created after the first hold is handed to the guardian before it is paused.
    #[test]
    fn channels_created_later_are_guarded_before_they_are_paused() {
        let mut s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        c.act(&s, 7, &[0x20], true).unwrap();
        c.act(&s, 7, &[0x20], false).unwrap();
        alloc(&mut s, 0x20, 0x23, class::HOPPER_CHANNEL_GPFIFO_A, 0);
        c.act(&s, 7, &[0x20], true).unwrap();
        let guarded: Vec<u32> = c.targets[&7]
            .values()
            .flat_map(|k| k.guarded.iter().copied())
            .collect();
        // The whole client: the compute TSG's channels and the copy TSG (no channel seen: its handle).
        assert_eq!(guarded, vec![0x21, 0x22, 0x23, 0x30]);
        drop(c);
        assert_eq!(fake.calls.last().unwrap(), &(vec![0x21, 0x22, 0x23], true));
    }

    #[test]
    fn shutdown_resumes_what_is_paused_and_errors_are_reported() {
        let s = host();
        let mut fake = Fake::default();
        let mut c = NvControl::unguarded(&mut fake);
        c.act(&s, 7, &[0x20, 0x30], true).unwrap();
        let reports = c.shutdown();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].done(), vec![0x20, 0x30]);
        drop(c);
        assert!(!fake.calls.last().unwrap().1, "the last call resumes");

        let mut failing = Fake {
            fail: true,
            ..Fake::default()
        };
        let mut c = NvControl::unguarded(&mut failing);
        let e = c.act(&s, 7, &[0x20], true).unwrap_err();
        assert!(e.to_string().contains("NOT_SUPPORTED"), "{e}");
        assert!(c.paused().is_empty());
    }
}
