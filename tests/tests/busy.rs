//! Start on a busy host: `run` started where GPU work it never journaled already runs, as a
//! fleet starts it (a node whose GPU pods came up first, an upgrade, a lost journal), and an
//! observer whose own driver calls never crowd out the records it needs (root, kernel tests).

use std::{os::fd::AsRawFd as _, path::Path, time::Duration};

use gpreempt_common::{nv, record::RecordHeader};
use gpreempt_user::observe::probe::{ProbeOptions, Probes};
use serde_json::Value;
use tests::{assert_nothing_left, bin, require_root, serial, sim, Poke, TempDir};

/// The controller's own RM escapes (its driver scans of running processes, levers, self-test
/// checks) are dropped in the kernel and counted; another process's on the same file still
/// arrive. Tens of thousands of its own calls once filled the ring and hid the records its
/// self-test waited for.
#[test]
fn the_observers_own_rm_escapes_never_reach_its_ring() {
    let _one = serial();
    require_root();
    let dir = TempDir::new("own-rm");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let stand_in = dir.path("nvidiactl");
    std::fs::write(&stand_in, b"").unwrap();
    let mut probes = Probes::attach(&ProbeOptions {
        kfd_device: dev,
        nvidia_devices: vec![stand_in.clone()],
        ..Default::default()
    })
    .expect("attaching the observer");
    let mut ring = probes.take_events().expect("ring buffer");
    // Ours: as many RM_CONTROL escapes as a driver scan makes, more than the ring holds.
    const OWN: u64 = 50_000;
    let f = std::fs::File::open(&stand_in).unwrap();
    let mut params = [0u8; nv::control::SIZE as usize];
    for _ in 0..OWN {
        // SAFETY: `params` is a live buffer of the size the command encodes; the stand-in (a
        // regular file) answers ENOTTY without touching it.
        unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                nv::iowr(nv::nr::RM_CONTROL, nv::control::SIZE) as libc::c_ulong,
                params.as_mut_ptr(),
            )
        };
    }
    // Another process's, on the same file.
    let mut poke = Poke::spawn_as_nvidiactl(&stand_in, &["nv"]);
    let other = poke.pid();
    poke.go();
    poke.finish();
    std::thread::sleep(Duration::from_millis(200));
    let (mut ours, mut theirs) = (0u64, 0u64);
    while let Some(item) = ring.next() {
        assert!(item.len() >= std::mem::size_of::<RecordHeader>());
        // SAFETY: every record starts with a RecordHeader; read unaligned from the ring's bytes.
        let h: RecordHeader = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        if h.pid == std::process::id() {
            ours += 1;
        } else if h.pid == other {
            theirs += 1;
        }
    }
    let k = probes.stats().expect("stats");
    assert_eq!(ours, 0, "our own escapes reached the ring");
    assert!(theirs >= 5, "the other process's 5 escapes: {theirs}");
    assert!(
        k.own_skipped >= OWN,
        "counted in the kernel: {}",
        k.own_skipped
    );
    assert_eq!(k.lost(), 0, "nothing lost: {k:?}");
    println!(
        "own RM escapes skipped in the kernel: {}; the other process's records: {theirs}",
        k.own_skipped
    );
}

/// `scripts/busy-start-sim.sh` in `sim` with `env`; its summary.
fn busy_start(t: &TempDir, env: &[(&str, String)], limit: Duration) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/busy-start-sim.sh");
    let mut vars = format!("OUT={} POKE={} ", t.0.display(), bin("kfd-poke").display());
    for (k, v) in env {
        vars.push_str(&format!("{k}='{v}' "));
    }
    sim(&format!("{vars} sh {}", script.display()), limit);
    let s = std::fs::read_to_string(t.path("summary.json")).expect("summary.json");
    serde_json::from_str(&s).expect("summary")
}

fn run_logs(t: &TempDir) -> String {
    ["run1.err", "run2.err"]
        .iter()
        .map(|f| std::fs::read_to_string(t.path(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// 50 processes with 20 queues each (one online service, 49 offline jobs) run before any
/// controller: `run` classes and suspends every offline one, and again after `kill -9` and an
/// immediate restart; SIGTERM leaves nothing suspended. The times are printed (emulated, a
/// debug build on this machine), not judged: `cargo xtask bench --busy-start` measures them.
#[test]
fn run_takes_control_of_a_busy_host_it_never_journaled() {
    let _one = serial();
    let t = TempDir::new("busy-start");
    let s = busy_start(
        &t,
        &[
            ("N", "50".into()),
            ("Q", "20".into()),
            ("PACE", "1".into()),
            ("LIMIT", "90".into()),
        ],
        Duration::from_secs(420),
    );
    println!("emulated, debug build: {s}");
    let logs = run_logs(&t);
    assert_eq!(s["queues_before"], 1000, "{s}");
    assert_eq!(s["offline"], 49, "{s}");
    assert!(
        s["first_start_all_acted_ms"].is_number(),
        "the first start did not act on every offline process: {s}\n{logs}"
    );
    assert!(
        s["restart_all_acted_ms"].is_number(),
        "the restart did not act on every offline process: {s}\n{logs}"
    );
    assert_eq!(s["run_rc"], 0, "{logs}");
    assert_eq!(s["suspended_after_stop"], 0, "{s}");
    assert!(!logs.contains("silent for"), "the lease fired: {logs}");
    assert_nothing_left();
}

/// A ring buffer of one page and a process flooding the driver while `run` starts: records are
/// lost, said so, and the start goes on to control every offline process.
#[test]
fn a_ring_overflow_during_start_up_does_not_fail_the_start() {
    let _one = serial();
    let t = TempDir::new("busy-overflow");
    let s = busy_start(
        &t,
        &[
            ("N", "8".into()),
            ("Q", "4".into()),
            ("PACE", "1".into()),
            ("FLOOD", "300000".into()),
            ("RUN_ARGS", "--ring-kib 4".into()),
        ],
        Duration::from_secs(240),
    );
    println!("emulated: {s}");
    let logs = run_logs(&t);
    assert!(
        logs.contains("event records lost in the kernel"),
        "no loss was forced: {logs}"
    );
    assert!(
        s["first_start_all_acted_ms"].is_number() && s["restart_all_acted_ms"].is_number(),
        "{s}\n{logs}"
    );
    assert_eq!(s["run_rc"], 0, "{logs}");
    assert_eq!(s["suspended_after_stop"], 0, "{s}");
    assert_nothing_left();
}
