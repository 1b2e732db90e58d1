//! Adoption against a fake host: the journal kept from events, its file, the proof through the
//! driver, and the replay into the model.
use std::collections::HashMap;
use std::os::fd::OwnedFd;

use super::*;
use crate::observe::events::Event;
use crate::observe::model::tests::nvidia::{rm_alloc, rm_channel, rm_event};
use crate::observe::model::{State, Update};

const PID: u32 = 4242;
const CLIENT: u32 = 0xc1d0_0042;
const DEV: u32 = 0x5c00_0001;
const SUB: u32 = 0x5c00_0002;
const TSG: u32 = 0x5c00_0015;
const CH: u32 = 0x5c00_0016;
const MEM: u32 = 0x5c00_0030;

fn ev(u: Update) -> NvEvent {
    match u {
        Update::Event(Event::Nv(n)) => n,
        _ => unreachable!("builders make NV events"),
    }
}

/// A PyTorch-like process: client, device, subdevice, a GR TSG with one channel, and a memory
/// object the journal does not keep.
fn workload() -> Vec<NvEvent> {
    vec![
        ev(rm_alloc(
            1,
            PID,
            CLIENT,
            CLIENT,
            CLIENT,
            class::NV01_ROOT_CLIENT,
            0,
        )),
        ev(rm_alloc(
            2,
            PID,
            CLIENT,
            CLIENT,
            DEV,
            class::NV01_DEVICE_0,
            0,
        )),
        ev(rm_alloc(
            3,
            PID,
            CLIENT,
            DEV,
            SUB,
            class::NV20_SUBDEVICE_0,
            0,
        )),
        ev(rm_alloc(4, PID, CLIENT, DEV, MEM, 0x3e, 0)),
        ev(rm_alloc(
            5,
            PID,
            CLIENT,
            DEV,
            TSG,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        )),
        ev(rm_channel(
            6,
            PID,
            CLIENT,
            TSG,
            CH,
            (0x7f00_0000_0000, 1024, MEM, 0x2000),
        )),
    ]
}

fn logged() -> ObjectLog {
    let mut log = ObjectLog::default();
    for e in workload() {
        log.note(&e);
    }
    log
}

#[test]
fn the_log_keeps_the_objects_adoption_needs_and_forgets_what_is_freed() {
    let mut log = logged();
    assert_eq!(log.len(), 5, "the memory object is not journaled");
    // Freeing the TSG frees its channel with it.
    log.note(&ev(rm_event(
        7,
        PID,
        NvCall::Free {
            h_root: CLIENT,
            h_object_parent: DEV,
            h_object_old: TSG,
            status: 0,
        },
    )));
    assert_eq!(log.len(), 3);
    // Freeing the client frees everything of it.
    log.note(&ev(rm_event(
        8,
        PID,
        NvCall::Free {
            h_root: CLIENT,
            h_object_parent: CLIENT,
            h_object_old: CLIENT,
            status: 0,
        },
    )));
    assert_eq!(log.len(), 0);
    let mut log = logged();
    log.exited(PID);
    assert!(log.is_empty());
}

#[test]
fn a_failed_allocation_is_not_journaled() {
    let mut log = ObjectLog::default();
    let mut e = ev(rm_alloc(
        1,
        PID,
        CLIENT,
        DEV,
        TSG,
        class::KEPLER_CHANNEL_GROUP_A,
        1,
    ));
    if let NvCall::Alloc { status, .. } = &mut e.call {
        *status = nv::status::INVALID_OBJECT_HANDLE;
    }
    log.note(&e);
    assert!(log.is_empty());
}

#[test]
fn the_per_process_cap_holds() {
    let mut log = ObjectLog::default();
    for i in 0..(MAX_PER_PROC as u32 + 10) {
        log.note(&ev(rm_alloc(
            1,
            PID,
            CLIENT,
            DEV,
            0x6000_0000 + i,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        )));
    }
    assert_eq!(log.len(), MAX_PER_PROC);
    assert_eq!(log.dropped, 10);
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("gp-adopt-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_journal_round_trips_with_start_times_and_a_private_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tmpdir("roundtrip");
    let mut log = logged();
    log.save(&d, |_| Some(777)).unwrap();
    let mode = std::fs::metadata(d.join(FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let j = load(&d).unwrap();
    assert_eq!(j[&PID].start_time, 777);
    assert_eq!(j[&PID].recs.len(), 5);
    // A process that is gone is forgotten.
    let mut log = logged();
    log.save(&d, |_| None).unwrap();
    assert!(load(&d).unwrap().is_empty());
    assert!(log.is_empty());
    // No journal: nothing to adopt, no error; a damaged one: an error that names it.
    std::fs::remove_file(d.join(FILE)).unwrap();
    assert!(load(&d).unwrap().is_empty());
    std::fs::write(d.join(FILE), b"{not json").unwrap();
    let e = format!("{:#}", load(&d).unwrap_err());
    assert!(e.contains(FILE), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The driver as the fake answers it: (client, handle) -> (class, parent), per fd.
struct FakeHost {
    start: HashMap<u32, u64>,
    objects: HashMap<(i32, u32, u32), (u32, u32)>,
    dups: Vec<(u32, i32)>,
    no_fd: bool,
}

impl FakeHost {
    fn live() -> Self {
        let mut objects = HashMap::new();
        for (h, c, p) in [
            (CLIENT, class::NV01_ROOT_CLIENT, 0),
            (DEV, class::NV01_DEVICE_0, CLIENT),
            (SUB, class::NV20_SUBDEVICE_0, DEV),
            (TSG, class::KEPLER_CHANNEL_GROUP_A, DEV),
            (CH, class::HOPPER_CHANNEL_GPFIFO_A, TSG),
        ] {
            objects.insert((8, CLIENT, h), (c, p));
        }
        Self {
            start: HashMap::from([(PID, 777)]),
            objects,
            dups: Vec::new(),
            no_fd: false,
        }
    }
}

impl Host for FakeHost {
    fn start_time(&self, pid: u32) -> Option<u64> {
        self.start.get(&pid).copied()
    }
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd> {
        let pid = id.pid;
        self.dups.push((pid, fd));
        anyhow::ensure!(
            !self.no_fd,
            "pid {pid} fd {fd} is no longer an NVIDIA device file"
        );
        // Any fd stands in: the fake answers by the fd number the journal names.
        Ok(std::fs::File::open("/dev/null")?.into())
    }
    fn handle_info(
        &mut self,
        _fd: BorrowedFd,
        h_client: u32,
        h_object: u32,
        index: u32,
    ) -> Result<u64> {
        let (c, p) = self
            .objects
            .get(&(8, h_client, h_object))
            .copied()
            .ok_or_else(|| anyhow::anyhow!("NV_ERR_OBJECT_NOT_FOUND"))?;
        Ok(u64::from(if index == hi::INDEX_CLASSID { c } else { p }))
    }
    fn device_instance(&mut self, _fd: BorrowedFd, h_client: u32, h_subdevice: u32) -> Result<u32> {
        anyhow::ensure!(
            self.objects.get(&(8, h_client, h_subdevice)).map(|o| o.0)
                == Some(class::NV20_SUBDEVICE_0),
            "not a subdevice"
        );
        Ok(2)
    }
}

const CH_CE: u32 = 0x5c00_0018;
const TSG_CE: u32 = 0x5c00_0017;

/// The live process plus a copy TSG, engine objects under the channels, and a memory object.
fn scanned_host() -> FakeHost {
    let mut h = FakeHost::live();
    for (o, c, p) in [
        (0x5c00_0020, class::HOPPER_COMPUTE_A, CH),
        (TSG_CE, class::KEPLER_CHANNEL_GROUP_A, DEV),
        (CH_CE, class::HOPPER_CHANNEL_GPFIFO_A, TSG_CE),
        (0x5c00_0021, class::HOPPER_DMA_COPY_A, CH_CE),
        (MEM, 0x3e, DEV),
    ] {
        h.objects.insert((8, CLIENT, o), (c, p));
    }
    h
}

fn scan() -> Scan {
    Scan {
        client_top: 0x100,
        bases: DEFAULT_BASES.to_vec(),
        max_calls: MAX_CALLS,
    }
}

#[test]
fn discovery_finds_a_running_process_objects_through_the_driver() {
    let mut host = scanned_host();
    let f = discover(
        ProcId {
            pid: PID,
            start_time: 777,
        },
        &[8],
        &mut host,
        &scan(),
    );
    assert_eq!(f.why_not, None);
    assert_eq!(f.tsgs(), 2);
    let order: Vec<u32> = f.recs.iter().map(|r| r.new).collect();
    assert_eq!(
        order,
        vec![CLIENT, DEV, SUB, TSG, TSG_CE, CH, CH_CE],
        "parents first"
    );
    // Replayed: the TSG with a compute object is a compute queue on device 2, the other a copy
    // queue; channels are known, rings are not (no activity claimed).
    let mut s = State::new();
    for r in &f.recs {
        s.apply(Update::Event(Event::Nv(event(PID, r, 5))));
    }
    let p = &s.procs[&PID];
    let gr = &p.queues[&TSG];
    assert_eq!(gr.kind, crate::observe::model::QueueKind::NvCompute);
    assert_eq!(gr.gpu_id, 2);
    let t = gr.nv.as_ref().unwrap();
    assert_eq!((t.h_client, t.h_subdevice, t.fd), (CLIENT, Some(SUB), 8));
    assert_eq!(t.channels, vec![CH]);
    assert!(t.rings.is_empty());
    assert_eq!(
        p.queues[&TSG_CE].kind,
        crate::observe::model::QueueKind::NvCopy
    );
    // The client scan went newest first through every index below the top; the compute TSG
    // was among the first handles, so the object scan stopped QUICK_GAP misses after the last
    // hit in each range.
    assert!(f.calls >= 0x100 + 2 * u64::from(QUICK_GAP));
    assert!(
        f.calls < 0x100 + 2 * u64::from(QUICK_GAP) + 100,
        "{}",
        f.calls
    );
}

#[test]
fn a_compute_tsg_past_a_long_hole_is_found_by_the_second_pass() {
    // A process that made and freed many objects before its context: its TSG and channel lie
    // 0x800 handles past the rest, beyond the quick pass's gap.
    let mut host = FakeHost::live();
    let (tsg, ch) = (0x5c00_0900, 0x5c00_0901);
    for k in [(8, CLIENT, TSG), (8, CLIENT, CH)] {
        host.objects.remove(&k);
    }
    for (o, c, p) in [
        (tsg, class::KEPLER_CHANNEL_GROUP_A, DEV),
        (ch, class::HOPPER_CHANNEL_GPFIFO_A, tsg),
        (0x5c00_0902, class::HOPPER_COMPUTE_A, ch),
    ] {
        host.objects.insert((8, CLIENT, o), (c, p));
    }
    let id = ProcId {
        pid: PID,
        start_time: 777,
    };
    let f = discover(id, &[8], &mut host, &scan());
    assert_eq!(f.tsgs(), 1, "{:?}", f.recs);
    // The same file holding a second client with no object: read with the short gap only.
    let empty = discover(
        id,
        &[8],
        &mut FakeHost {
            objects: HashMap::from([((8, CLIENT, CLIENT), (class::NV01_ROOT_CLIENT, 0))]),
            ..FakeHost::live()
        },
        &scan(),
    );
    assert_eq!(empty.tsgs(), 0);
    assert!(
        empty.calls < 0x100 + 2 * u64::from(QUICK_GAP) + 10,
        "{}",
        empty.calls
    );
    assert!(f.recs.iter().any(|r| r.new == ch));
    assert!(
        f.calls >= 0x100 + 2 * u64::from(QUICK_GAP) + 2 * u64::from(GAP),
        "{}",
        f.calls
    );
}

#[test]
fn discovery_keeps_to_its_budget_and_says_so() {
    let mut host = scanned_host();
    let mut sc = scan();
    sc.max_calls = 50;
    let f = discover(
        ProcId {
            pid: PID,
            start_time: 777,
        },
        &[8],
        &mut host,
        &sc,
    );
    assert!(f.calls <= 52, "{}", f.calls);
    assert!(f.why_not.unwrap().contains("budget"));
}

#[test]
fn discovery_of_a_file_that_is_not_the_driver_finds_nothing() {
    let mut host = scanned_host();
    host.no_fd = true;
    let f = discover(
        ProcId {
            pid: PID,
            start_time: 777,
        },
        &[8],
        &mut host,
        &scan(),
    );
    assert!(f.recs.is_empty());
    assert!(f.why_not.unwrap().contains("no longer an NVIDIA device"));
}

fn journal(start_time: u64) -> BTreeMap<u32, ProcRecs> {
    let d = tmpdir(&format!("j{start_time}"));
    let mut log = logged();
    log.save(&d, |_| Some(start_time)).unwrap();
    let j = load(&d).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    j
}

#[test]
fn a_proven_journal_replays_into_the_same_model_the_events_made() {
    let mut host = FakeHost::live();
    let a = adopt(journal(777), &mut host, 99);
    assert!(a.refused.is_empty(), "{:?}", a.refused);
    assert_eq!(a.tsgs(), 1);
    assert_eq!(host.dups, vec![(PID, 8)], "one duplicate per fd");
    let mut adopted = State::new();
    for e in a.events {
        adopted.apply(Update::Event(Event::Nv(e)));
    }
    let mut direct = State::new();
    for e in workload() {
        direct.apply(Update::Event(Event::Nv(e)));
    }
    let q = |s: &State| s.procs[&PID].queues[&TSG].nv.clone().unwrap();
    let (a, d) = (q(&adopted), q(&direct));
    assert_eq!(a.channels, vec![CH]);
    assert_eq!(
        a, d,
        "the replayed TSG is the TSG the events made: client, subdevice, ring"
    );
}

#[test]
fn a_reused_pid_is_not_adopted() {
    let mut host = FakeHost::live();
    let a = adopt(journal(776), &mut host, 99);
    assert!(a.events.is_empty());
    assert!(
        host.dups.is_empty(),
        "nothing of the new process is touched"
    );
    assert_eq!(a.refused.len(), 1);
    assert!(a.refused[0].1.contains("reused"), "{:?}", a.refused);
}

#[test]
fn an_exited_process_is_dropped_quietly() {
    let mut host = FakeHost::live();
    host.start.clear();
    let a = adopt(journal(777), &mut host, 99);
    assert!(a.events.is_empty() && a.refused.is_empty());
}

#[test]
fn a_handle_that_changed_class_is_not_adopted_nor_its_children() {
    let mut host = FakeHost::live();
    // The TSG's handle now names some other object (freed while no one watched, reused).
    host.objects.insert((8, CLIENT, TSG), (0x3e, DEV));
    let a = adopt(journal(777), &mut host, 99);
    assert_eq!(a.tsgs(), 0);
    assert!(
        !a.kept[&PID].iter().any(|r| r.new == CH),
        "a channel under a TSG not proven is not adopted"
    );
    assert_eq!(a.refused.len(), 1);
    assert!(a.refused[0].1.contains("no longer"), "{:?}", a.refused);
}

#[test]
fn an_fd_that_is_no_longer_the_driver_is_refused_with_why() {
    let mut host = FakeHost::live();
    host.no_fd = true;
    let a = adopt(journal(777), &mut host, 99);
    assert!(a.events.is_empty());
    assert!(
        a.refused[0].1.contains("no longer an NVIDIA device"),
        "{:?}",
        a.refused
    );
}

#[test]
fn unexplained_names_processes_holding_nvidiactl_that_nothing_explains() {
    let root = tmpdir("proc");
    for (pid, target) in [
        (10u32, "/dev/nvidiactl"),
        (11, "/dev/null"),
        (12, "/dev/nvidiactl"),
    ] {
        let fd = root.join(pid.to_string()).join("fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::os::unix::fs::symlink(target, fd.join("3")).unwrap();
    }
    // 13 runs this very binary (the controller's guardian, its self-test): not a workload.
    let fd = root.join("13").join("fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::os::unix::fs::symlink("/dev/nvidiactl", fd.join("4")).unwrap();
    std::os::unix::fs::symlink(
        std::fs::read_link("/proc/self/exe").unwrap(),
        root.join("13").join("exe"),
    )
    .unwrap();
    let known = BTreeSet::from([12]);
    let u = unexplained(&root, &known, 1);
    assert_eq!(u.iter().map(|x| x.0).collect::<Vec<_>>(), vec![10]);
    assert!(u[0].1.contains("before the observer attached"));
    let _ = std::fs::remove_dir_all(&root);
}
