//! NvControl against a fake RM: pause sets, timeslices, holds, shutdown.
use super::*;
use crate::observe::model::Update;
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
    /// GET_TIMESLICE calls (tsg).
    pub(crate) ts_gets: Vec<u32>,
    /// While set, FIFO_DISABLE_CHANNELS calls through [`Shared`] wait (a call the driver holds).
    pub(crate) gate: bool,
    /// Calls waiting at the gate now.
    pub(crate) blocked: usize,
    /// The schedule-only flag of each FIFO_DISABLE_CHANNELS call.
    pub(crate) schedule_only: Vec<bool>,
    /// Every fd duplicated: (process, fd).
    pub(crate) dups: Vec<(ProcId, i32)>,
}

/// A [`Fake`] that a worker thread owns while the test looks on, and whose pause/resume calls
/// can be held at a gate until the test releases them.
#[derive(Clone, Default)]
pub(crate) struct Shared(pub(crate) std::sync::Arc<(Mutex<Fake>, std::sync::Condvar)>);

impl Shared {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Fake) -> R) -> R {
        f(&mut lock(&self.0 .0))
    }

    /// From now on FIFO_DISABLE_CHANNELS calls block until [`Self::release`].
    pub(crate) fn hold(&self) {
        self.with(|f| f.gate = true);
    }

    pub(crate) fn release(&self) {
        self.with(|f| f.gate = false);
        self.0 .1.notify_all();
    }

    /// Waits until a call is blocked at the gate (false after 10 s without one).
    pub(crate) fn wait_blocked(&self) -> bool {
        let (m, cv) = &*self.0;
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let mut g = lock(m);
        while g.blocked == 0 {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl NvOps for Shared {
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd> {
        NvOps::dup(&mut &mut *lock(&self.0 .0), id, fd)
    }
    fn set(
        &mut self,
        fd: BorrowedFd,
        ch: &Channels,
        disable: bool,
        schedule_only: bool,
    ) -> Result<Duration> {
        let (m, cv) = &*self.0;
        let mut g = lock(m);
        if g.gate {
            g.blocked += 1;
            cv.notify_all();
            while g.gate {
                g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            g.blocked -= 1;
        }
        NvOps::set(&mut &mut *g, fd, ch, disable, schedule_only)
    }
    fn get_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32) -> Result<u64> {
        NvOps::get_timeslice(&mut &mut *lock(&self.0 .0), fd, h_client, h_tsg)
    }
    fn set_timeslice(&mut self, fd: BorrowedFd, h_client: u32, h_tsg: u32, us: u64) -> Result<()> {
        NvOps::set_timeslice(&mut &mut *lock(&self.0 .0), fd, h_client, h_tsg, us)
    }
}

impl NvOps for &mut Fake {
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd> {
        self.dups.push((id, fd));
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
        self.ts_gets.push(h_tsg);
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
    let mut ch = c.set_timeslices(&s, 7, 200).unwrap();
    // The call is timed for the audit.
    assert!(ch
        .iter()
        .all(|c| c.issued_ns > 0 && c.returned_ns >= c.issued_ns));
    for c in &mut ch {
        (c.issued_ns, c.returned_ns) = (0, 0);
    }
    // Only the compute (GR) TSG; the copy TSG 0x30 keeps its own.
    assert_eq!(
        ch,
        vec![TimesliceChange {
            pid: 7,
            queue_id: 0x20,
            from_us: 1024,
            to_us: 200,
            original_us: 1024,
            issued_ns: 0,
            returned_ns: 0,
        }]
    );
    assert_eq!(c.timeslices(), vec![(7, 0x20, 1024, 200)]);
    assert_eq!(c.read_timeslice(7, 0x20).unwrap(), 200);
    // Again: nothing to do. A GR TSG created later gets it too, from its own original.
    assert!(c.set_timeslices(&s, 7, 200).unwrap().is_empty());
    alloc(&mut s, 0x10, 0x40, class::KEPLER_CHANNEL_GROUP_A, 1);
    let ch = c.set_timeslices(&s, 7, 200).unwrap();
    assert_eq!((ch.len(), ch[0].queue_id, ch[0].from_us), (1, 0x40, 2048));
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

/// The `dynamic` lever's episode end: the original goes back but stays known, so the next
/// episode is one SET per TSG (no GET, no new guardian hold); a restore after that still finds
/// nothing left to undo, and shutdown restores a TSG shortened at the time.
#[test]
fn relaxing_puts_the_original_back_and_keeps_it_for_the_next_episode() {
    let s = host();
    let mut fake = Fake::default();
    fake.timeslices.insert(0x20, 1024);
    let mut c = NvControl::unguarded(&mut fake);
    for _episode in 0..3 {
        let ch = c.set_timeslices(&s, 7, 200).unwrap();
        assert_eq!((ch.len(), ch[0].from_us, ch[0].to_us), (1, 1024, 200));
        assert_eq!(c.timeslices(), vec![(7, 0x20, 1024, 200)]);
        let back = c.relax_timeslices(7).unwrap();
        assert_eq!(
            (
                back.len(),
                back[0].from_us,
                back[0].to_us,
                back[0].original_us
            ),
            (1, 200, 1024, 1024)
        );
        assert!(
            c.timeslices().is_empty(),
            "nothing changed between episodes"
        );
        assert!(c.relax_timeslices(7).unwrap().is_empty(), "idempotent");
    }
    assert!(c.restore_timeslices(7).unwrap().is_empty());
    c.set_timeslices(&s, 7, 200).unwrap();
    assert_eq!(c.shutdown().len(), 0, "nothing paused");
    drop(c);
    // Once for the three episodes; again after the restore (which forgets it).
    assert_eq!(
        fake.ts_gets,
        vec![0x20, 0x20],
        "the original was read once per hold"
    );
    assert_eq!(
        fake.ts_calls,
        vec![
            (0x20, 200),
            (0x20, 1024),
            (0x20, 200),
            (0x20, 1024),
            (0x20, 200),
            (0x20, 1024),
            (0x20, 200),
            (0x20, 1024)
        ]
    );
    assert_eq!(fake.timeslices[&0x20], 1024);
}

/// The guardian learns each original once, at the `dynamic` lever's first episode, in the same
/// hold line as the static lever's (the one it restores from on a controller death or a lapsed
/// lease: nv/guardian/tests.rs); later episodes make no round trip.
#[test]
fn the_dynamic_lever_hands_the_guardian_each_original_once() {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join(format!("gpreempt-dyn-guardian-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let log = d.join("lines");
    let exe = d.join("fake-guardian");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\necho ready\nwhile read l; do echo \"$l\" >> {}; echo ok; done\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = host();
    let mut fake = Fake::default();
    fake.timeslices.insert(0x20, 1024);
    let mut c = NvControl::unguarded(&mut fake);
    (c.exe, c.journal, c.use_guardian) = (exe, d.join("journal"), true);
    for _episode in 0..3 {
        assert_eq!(c.set_timeslices(&s, 7, 200).unwrap().len(), 1);
        assert_eq!(c.relax_timeslices(7).unwrap().len(), 1);
    }
    c.shutdown();
    drop(c);
    let lines = std::fs::read_to_string(&log).unwrap();
    // The channels' hold (made when the process is learnt), then the timeslices' once.
    let holds: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("\"hold\"") && l.contains("timeslices"))
        .collect();
    assert_eq!(holds.len(), 1, "{lines}");
    assert!(
        holds[0].contains(r#""timeslices":[{"h_tsg":32,"original_us":1024}]"#),
        "{}",
        holds[0]
    );
    std::fs::remove_dir_all(&d).unwrap();
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
    s.apply(crate::observe::model::tests::nvidia::rm_alloc(
        1, pid, 0xc1, parent, new, h_class, engine,
    ));
}

/// pid 7: client 0xc1, subdevice 0x11, compute TSG 0x20 (channels 0x21, 0x22), copy TSG 0x30.
pub(crate) fn host() -> State {
    host_started(HOST_START)
}

/// The start time of pid 7 in [`host`].
pub(crate) const HOST_START: u64 = 107;

/// [`host`], with pid 7 started at `start_time` (the same pid, another process when it differs).
pub(crate) fn host_started(start_time: u64) -> State {
    let mut s = State::new();
    alloc(&mut s, 0, 0xc1, class::NV01_ROOT_CLIENT, 0);
    alloc(&mut s, 0xc1, 0x10, class::NV01_DEVICE_0, 0);
    alloc(&mut s, 0x10, 0x11, class::NV20_SUBDEVICE_0, 0);
    alloc(&mut s, 0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1);
    alloc(&mut s, 0x20, 0x21, class::HOPPER_CHANNEL_GPFIFO_A, 0);
    alloc(&mut s, 0x20, 0x22, class::HOPPER_CHANNEL_GPFIFO_A, 0);
    alloc(&mut s, 0x10, 0x30, class::KEPLER_CHANNEL_GROUP_A, 0xb);
    s.apply(Update::ProcInfo {
        pid: 7,
        info: crate::observe::procinfo::ProcInfo {
            comm: "python3".into(),
            start_time,
            ..Default::default()
        },
    });
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
        include_str!("../../../../../scripts/gpu/policy.toml"),
        "policy.toml",
    )
    .unwrap();
    let mut e = Engine::new(policy).with_offers(crate::backend::catalog());
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

/// The timeslice lever (the default) and `none` never pause; `both` pauses only once online
/// work has stayed busy for `pause_after`; `dynamic` decides at once.
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
        // `none`: nothing is done; `dynamic`: decided like a pause, at the episode's start
        // (the backend turns it into the short timeslice).
        ("[nvidia]\nlever = \"none\"\n", None),
        ("[nvidia]\nlever = \"dynamic\"\n", Some(0)),
    ] {
        let text = format!("[policy]\nmin_interval = \"1ms\"\n{nvidia}{rules}");
        let mut e = Engine::new(Policy::parse(&text, "p.toml").unwrap())
            .with_offers(crate::backend::catalog());
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

/// Adds an offline NVIDIA process `pid` running offline.py (a compute TSG 0x20).
fn add_offline(s: &mut State, pid: u32) {
    alloc_for(s, pid, 0, 0xc1, class::NV01_ROOT_CLIENT, 0);
    alloc_for(s, pid, 0xc1, 0x10, class::NV01_DEVICE_0, 0);
    alloc_for(s, pid, 0x10, 0x11, class::NV20_SUBDEVICE_0, 0);
    alloc_for(s, pid, 0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1);
    alloc_for(s, pid, 0x20, 0x21, class::HOPPER_CHANNEL_GPFIFO_A, 0);
    s.apply(Update::ProcInfo {
        pid,
        info: crate::observe::procinfo::ProcInfo {
            comm: "python3".into(),
            cmdline: "python3 scripts/gpu/offline.py 45".into(),
            start_time: 100 + u64::from(pid),
            ..Default::default()
        },
    });
}

const ADAPTIVE_NV: &str = "[policy]\nstrategy = \"adaptive\"\nmin_interval = \"1ms\"\n\
                           resume_after = \"3ms\"\nwindow = \"10ms\"\n\
                           [[rule]]\nclass = \"online\"\ncmdline = 'online'\n\
                           [[rule]]\nclass = \"offline\"\ncmdline = 'offline'\n";

/// Strategy `adaptive` on an NVIDIA GPU: the engine runs the lever tuner from the evidence
/// entry points (`lever_burst`, `lever_offline_progress`), reports each lever change, decides
/// under the chosen lever, and a reload away from it releases what the old lever holds.
#[test]
fn the_adaptive_strategy_tunes_the_nvidia_lever_from_the_evidence() {
    use crate::policy::{Action, Engine, Lever, Policy};
    let ms = 1_000_000u64;
    let mut s = online_and_offline();
    let gpu = s.procs[&8].queues[&0x20].gpu_id;
    let mut e = Engine::new(Policy::parse(ADAPTIVE_NV, "p.toml").unwrap())
        .with_offers(crate::backend::catalog());
    e.classify(&s);
    // A pair where only pausing keeps the online bursts within 1.1x of alone.
    let burst_ms = |l: Lever| [8.0, 6.0, 5.5, 4.0][(l as usize).min(3)];
    let mut changes = Vec::new();
    let mut notes = Vec::new();
    let start = 1_000 * ms;
    let mut now = start;
    let (mut next_burst, mut next_progress) = (start + 50 * ms, start + 10 * ms);
    while now < start + 30_000 * ms {
        now += ms;
        let lever = e
            .gpu_levers()
            .get(&gpu)
            .copied()
            .unwrap_or(Lever::Timeslice);
        // A request every 50 ms, a progress report every 10 ms (not `is_multiple_of`: the
        // MSRV is 1.85).
        if now >= next_burst {
            next_burst += 50 * ms;
            e.lever_burst(gpu, now, (burst_ms(lever) * 1e6) as u64);
        }
        if now >= next_progress {
            next_progress += 10 * ms;
            e.lever_offline_progress(gpu, now, 10);
        }
        e.decide(&s, now);
        changes.extend(e.take_lever_changes());
        notes.extend(e.take_notes());
    }
    assert_eq!(e.gpu_levers().get(&gpu), Some(&Lever::Pause), "{notes:?}");
    assert!(changes.iter().all(|(g, _)| *g == gpu));
    assert!(
        changes[0].1.reason.starts_with("calibrating: epoch 1"),
        "{changes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|(g, n)| *g == gpu && n.starts_with("lever: chose pause")),
        "{notes:?}"
    );
    // The status file's view of it.
    let v = e.lever_views();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (
            v[0].gpu_id,
            v[0].lever.as_str(),
            v[0].chosen.as_str(),
            v[0].phase.as_str()
        ),
        (gpu, "pause", "pause", "settled")
    );
    assert_eq!(v[0].summaries.len(), 4);
    let json = serde_json::to_string(&v[0]).unwrap();
    assert!(
        json.contains(r#"{"lever":"none","services":[{"svc":"#),
        "{json}"
    );
    // Under the chosen lever an online launch pauses the offline process.
    s.procs.get_mut(&7).unwrap().last_launch_ns = Some(now);
    now += ms;
    let ds = e.decide(&s, now);
    let d = ds
        .iter()
        .find(|d| d.action == Action::Suspend)
        .expect("a suspend");
    assert_eq!((d.pid, d.queues.clone()), (8, vec![0x20]));
    assert!(
        d.reason.starts_with("adaptive: lever pause;"),
        "{}",
        d.reason
    );
    e.confirm(d, &d.queues);
    // A reload to a policy whose lever is `none`: said as a lever change, and what pause holds
    // is released at once.
    let text = ADAPTIVE_NV.replace("strategy = \"adaptive\"", "strategy = \"priority\"");
    let mut p = Policy::parse(&text, "p.toml").unwrap();
    p.levers.lever = Lever::None;
    e.set_policy(p);
    let ch = e.take_lever_changes();
    assert!(
        matches!(&ch[..], [(g, c)] if *g == gpu && c.from == Lever::Pause && c.to == Lever::None),
        "{ch:?}"
    );
    assert!(e.gpu_levers().is_empty());
    now += ms;
    let ds = e.decide(&s, now);
    let r = ds
        .iter()
        .find(|d| d.action == Action::Resume)
        .expect("a resume");
    assert_eq!((r.pid, r.reason.as_str()), (8, "lever now none"));
    // Back to the same adaptive policy: what was measured applies again, without measuring.
    e.set_policy(Policy::parse(ADAPTIVE_NV, "p.toml").unwrap());
    now += ms;
    e.decide(&s, now);
    assert_eq!(e.gpu_levers().get(&gpu), Some(&Lever::Pause));
    let ch = e.take_lever_changes();
    assert!(
        ch.iter().any(|(g, c)| *g == gpu
            && c.to == Lever::Pause
            && c.reason.contains("measured before")),
        "{ch:?}"
    );
    assert_eq!(e.lever_views()[0].phase, "settled");
    // A reload with another budget measures afresh.
    let text = ADAPTIVE_NV.replace(
        "window = \"10ms\"\n",
        "window = \"10ms\"\n[adaptive]\nonline_p99_budget = 1.5\n",
    );
    let p = Policy::parse(&text, "p.toml").unwrap();
    assert_ne!(
        p.strategy,
        Policy::parse(ADAPTIVE_NV, "p.toml").unwrap().strategy
    );
    e.set_policy(p);
    now += ms;
    e.decide(&s, now);
    assert_ne!(e.lever_views()[0].phase, "settled");
}

/// With the channel sampler's figures in the model (nv/activity.rs: GP_GET/GP_PUT per TSG as
/// read/write ids, backlog), the engine feeds the lever tuner itself: online bursts from the
/// online TSG's backlog, offline progress from the offline TSG's read id. Here the static
/// timeslice costs offline most and only dynamic/pause keep online within budget: dynamic.
#[test]
fn the_lever_tuner_reads_its_evidence_from_the_channel_samples() {
    use crate::observe::model::{Activity, SampleStatus};
    use crate::policy::{Engine, Lever, Policy};
    let ms = 1_000_000u64;
    let mut s = online_and_offline();
    let gpu = s.procs[&8].queues[&0x20].gpu_id;
    let mut e = Engine::new(Policy::parse(ADAPTIVE_NV, "p.toml").unwrap())
        .with_offers(crate::backend::catalog());
    e.classify(&s);
    // (online burst ms, offline GPFIFO entries per ms) under each lever.
    let pair = |l: Lever| match l {
        Lever::None => (7, 10),
        Lever::Dynamic => (4, 9),
        Lever::Timeslice => (4, 4),
        _ => (4, 6),
    };
    let start = 1_000 * ms;
    let (mut now, mut read, mut request_end) = (start, 0u64, 0u64);
    let mut notes = Vec::new();
    while now < start + 30_000 * ms {
        now += ms;
        let lever = e
            .gpu_levers()
            .get(&gpu)
            .copied()
            .unwrap_or(Lever::Timeslice);
        let (burst, rate) = pair(lever);
        if (now - start) % (50 * ms) == ms {
            request_end = now + burst * ms;
        }
        read += rate;
        let sample = |backlog: u64, read: u64| Activity {
            status: SampleStatus::Valid,
            read_dispatch_id: Some(read),
            write_dispatch_id: Some(read + backlog),
            backlog: Some(backlog),
            busy: Some(backlog > 0),
            sample_ns: now,
            ..Default::default()
        };
        let online = u64::from(now < request_end);
        s.procs
            .get_mut(&7)
            .unwrap()
            .queues
            .get_mut(&0x20)
            .unwrap()
            .activity = sample(online, 0);
        s.procs
            .get_mut(&8)
            .unwrap()
            .queues
            .get_mut(&0x20)
            .unwrap()
            .activity = sample(1, read);
        e.decide(&s, now);
        e.take_lever_changes();
        notes.extend(e.take_notes());
    }
    assert_eq!(
        e.gpu_levers().get(&gpu),
        Some(&Lever::Dynamic),
        "{notes:#?}"
    );
    let v = e.lever_views();
    let rate = |l: &str| {
        v[0].summaries
            .iter()
            .find(|x| x.lever.label() == l)
            .and_then(|x| x.rate)
            .unwrap()
    };
    // Entries per second, as the model's read id moved (the lever applied at each ms).
    assert!((rate("none") - 10_000.0).abs() < 500.0, "{v:?}");
    assert!((rate("timeslice") - 4_000.0).abs() < 500.0, "{v:?}");
    let p99 = |l: &str| {
        v[0].summaries
            .iter()
            .find(|x| x.lever.label() == l)
            .and_then(|x| x.worst_service())
            .unwrap()
            .p99_ns
    };
    // Bursts from the backlog: first to last sample with work.
    assert!((6 * ms..=7 * ms).contains(&p99("none")), "{v:?}");
    assert!((3 * ms..=4 * ms).contains(&p99("dynamic")), "{v:?}");
}

/// Without the sampler the engine estimates bursts from launch hints: a periodic online
/// service starts the calibration; a process joining the GPU is a mix change.
#[test]
fn launch_hints_feed_the_lever_tuner_and_a_joining_process_is_a_mix_change() {
    use crate::policy::{Engine, Policy};
    let ms = 1_000_000u64;
    let mut s = online_and_offline();
    let mut e = Engine::new(Policy::parse(ADAPTIVE_NV, "p.toml").unwrap())
        .with_offers(crate::backend::catalog());
    e.classify(&s);
    let start = 1_000 * ms;
    let mut changes = Vec::new();
    let mut notes = Vec::new();
    let mut now = start;
    while now < start + 2_000 * ms {
        now += ms;
        // A request every 50 ms, launching for 4 ms.
        if (now - start) % (50 * ms) < 4 * ms {
            s.procs.get_mut(&7).unwrap().last_launch_ns = Some(now);
        }
        e.decide(&s, now);
        changes.extend(e.take_lever_changes());
        notes.extend(e.take_notes());
    }
    assert!(
        changes
            .iter()
            .any(|(_, c)| c.reason.starts_with("calibrating")),
        "{changes:?} {notes:?}"
    );
    add_offline(&mut s, 9);
    e.classify(&s);
    now += ms;
    e.decide(&s, now);
    let notes = e.take_notes();
    assert!(
        notes
            .iter()
            .any(|(_, n)| n.starts_with("lever: mix changed")),
        "{notes:?}"
    );
}

#[test]
fn pauses_the_listed_tsgs_channels_and_resumes_them() {
    let s = host();
    assert_eq!(
        s.procs[&7].vendor(),
        Some(crate::observe::model::Vendor::Nvidia)
    );
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

/// A pid is not an identity: fds are only duplicated of the process the model names (pid and
/// start time), and what was kept for a previous owner of the pid (its duplicates, the guardian's
/// holds, its paused TSGs) is dropped before anything is learnt of the new one.
#[test]
fn a_new_owner_of_a_pid_is_learnt_afresh_never_through_the_old_ones_state() {
    let mut f = Fake::default();
    let mut c = NvControl::unguarded(&mut f);
    let old = host();
    c.act(&old, 7, &[0x20], true).expect("pause");
    assert_eq!(c.paused(), vec![(7, 0x20)]);
    // A model whose /proc facts are not read yet names no process: nothing is duplicated.
    let mut unread = State::new();
    alloc(&mut unread, 0, 0xc1, class::NV01_ROOT_CLIENT, 0);
    alloc(&mut unread, 0xc1, 0x10, class::NV01_DEVICE_0, 0);
    alloc(&mut unread, 0x10, 0x11, class::NV20_SUBDEVICE_0, 0);
    alloc(&mut unread, 0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1);
    c.forget(8);
    let e = c.act(&unread, 8, &[0x20], true);
    assert!(e.is_err(), "{e:?}");
    // Pid 7 now names another process (started later): the old one's state goes first.
    let new = host_started(HOST_START + 1);
    c.act(&new, 7, &[0x20], true)
        .expect("pause of the new owner");
    assert_eq!(c.paused(), vec![(7, 0x20)]);
    // prune with the old model: the kept state is the new owner's, not the old one's.
    c.prune(&old);
    assert!(
        c.paused().is_empty(),
        "kept under a start time the model does not have"
    );
    drop(c);
    let ids: Vec<u64> = f.dups.iter().map(|(id, _)| id.start_time).collect();
    assert_eq!(ids, vec![HOST_START, HOST_START + 1]);
    assert!(f.dups.iter().all(|(id, _)| id.pid == 7));
}

/// The lever tuner steers by the online service's requests (launch to last wait return, from
/// the model), one a second: it starts, holds offline for its quiet windows with no online
/// work in sight, and concludes within 90 s on the lever that keeps the service's p99 within
/// its rule's `slo_p99` with the most offline progress.
#[test]
fn requests_at_one_a_second_steer_the_lever_within_the_services_slo() {
    use crate::policy::{Action, Engine, Lever, Policy};
    use gpreempt_common::kprobe::launch;
    let ms = 1_000_000u64;
    let text = ADAPTIVE_NV.replace(
        "cmdline = 'online'\n",
        "cmdline = 'online'\nslo_p99 = \"65ms\"\n",
    );
    let mut s = online_and_offline();
    let gpu = s.procs[&8].queues[&0x20].gpu_id;
    let mut e =
        Engine::new(Policy::parse(&text, "p.toml").unwrap()).with_offers(crate::backend::catalog());
    e.classify(&s);
    // A 55 ms request alone; none and dynamic miss 65 ms, timeslice meets it with more
    // offline progress than pause.
    let request_ms = |l: Lever| match l {
        Lever::None => 90,
        Lever::Dynamic => 70,
        Lever::Timeslice => 60,
        _ => 55,
    };
    let rate = |l: Lever| match l {
        Lever::None => 10,
        Lever::Dynamic => 9,
        Lever::Timeslice => 8,
        _ => 5,
    };
    let start = 1_000 * ms;
    let mut now = start;
    let mut notes = Vec::new();
    let mut concluded = None;
    while now < start + 120_000 * ms && concluded.is_none() {
        now += ms;
        let lever = e
            .gpu_levers()
            .get(&gpu)
            .copied()
            .unwrap_or(Lever::Timeslice);
        if (now - start).is_multiple_of(1_000 * ms) {
            let len = request_ms(lever) * ms;
            s.procs
                .get_mut(&7)
                .unwrap()
                .feed_requests(launch::CU_LAUNCH_KERNEL, &[(now - len, len)]);
        }
        s.tick_requests(now);
        if (now - start).is_multiple_of(10 * ms) {
            e.lever_offline_progress(gpu, now, rate(lever));
        }
        let ds = e.decide(&s, now);
        for d in &ds {
            e.confirm(d, &d.queues);
        }
        e.take_lever_changes();
        notes.extend(e.take_notes());
        if notes
            .iter()
            .any(|(_, n): &(u32, String)| n.starts_with("lever: chose"))
        {
            concluded = Some(now - start);
        }
    }
    let at = concluded.unwrap_or_else(|| panic!("no conclusion in 120 s: {notes:#?}"));
    assert!(at <= 90_000 * ms, "concluded after {} s", at / 1_000 / ms);
    assert_eq!(
        e.gpu_levers().get(&gpu),
        Some(&Lever::Timeslice),
        "{notes:#?}"
    );
    let v = e.lever_views();
    assert_eq!(v[0].targets[0].svc, 7);
    assert_eq!(v[0].targets[0].basis, "slo");
    assert_eq!(v[0].targets[0].target_ns, 65 * ms);

    // With a ratio goal instead, a quiet window holds offline with no online work in sight.
    let mut s = online_and_offline();
    let mut e = Engine::new(Policy::parse(ADAPTIVE_NV, "p.toml").unwrap())
        .with_offers(crate::backend::catalog());
    e.classify(&s);
    let mut now = start;
    let mut quiet_suspend = None;
    while now < start + 120_000 * ms && quiet_suspend.is_none() {
        now += ms;
        if (now - start).is_multiple_of(1_000 * ms) {
            s.procs
                .get_mut(&7)
                .unwrap()
                .feed_requests(launch::CU_LAUNCH_KERNEL, &[(now - 55 * ms, 55 * ms)]);
        }
        s.tick_requests(now);
        let ds = e.decide(&s, now);
        for d in &ds {
            e.confirm(d, &d.queues);
        }
        quiet_suspend = ds
            .iter()
            .find(|d| d.action == Action::Suspend && d.reason.contains("quiet window"))
            .cloned();
    }
    let d = quiet_suspend.expect("a quiet window within 120 s");
    assert_eq!(d.pid, 8);
    assert!(e.lever_views()[0].quiet);
    // Held while the window lasts, though the service is idle between its requests.
    for _ in 0..300 {
        now += ms;
        s.tick_requests(now);
        let ds = e.decide(&s, now);
        assert!(
            !ds.iter().any(|d| d.action == Action::Resume) || !e.lever_views()[0].quiet,
            "{ds:?}"
        );
        if !e.lever_views()[0].quiet {
            break;
        }
    }
}
