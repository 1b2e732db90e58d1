//! Guardian tests: the journal, holds and releases against a fake system, the lease on a
//! virtual clock, and the controller's handle against scripted guardians.

use super::protocol::Request;
use super::*;
use crate::observe::nv::rm as control;
use crate::observe::procinfo::ProcId;
use nix::errno::Errno;
use std::{cell::RefCell, os::unix::fs::PermissionsExt as _, rc::Rc};
use std::{
    fs::{File, OpenOptions},
    path::Path,
    time::Instant,
};

pub(super) fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gpreempt-nv-guardian-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every target's start time in these tests (a fake process has it unless `reused` says not).
pub(super) const START: u64 = 555;

pub(super) fn entry(pid: u32, h_client: u32, channels: &[u32]) -> HoldEntry {
    HoldEntry {
        pid,
        start_time: START,
        fd: 5,
        h_client,
        h_subdevice: 0x5c00_0003,
        channels: channels.to_vec(),
        timeslices: Vec::new(),
    }
}

/// `entry`, with TSGs' original timeslices (TSG, us).
fn entry_ts(pid: u32, h_client: u32, channels: &[u32], ts: &[(u32, u64)]) -> HoldEntry {
    HoldEntry {
        timeslices: ts
            .iter()
            .map(|&(h_tsg, original_us)| TsgTimeslice { h_tsg, original_us })
            .collect(),
        ..entry(pid, h_client, channels)
    }
}

/// A timeslice set: (pid, client, TSG, us).
type Sliced = (u32, u32, u32, u64);

/// Records every enable and every timeslice set; dups of pids in `bad` fail as "no ptrace
/// rights", of `gone` as exited; timeslice sets of TSGs in `tsg_status` fail with that status.
#[derive(Clone, Default)]
struct Fake {
    enabled: Rc<RefCell<Vec<HoldEntry>>>,
    /// Every successful timeslice set: (pid, client, TSG, us).
    sliced: Rc<RefCell<Vec<Sliced>>>,
    /// (TSG, NV_STATUS) its sets fail with.
    tsg_status: Rc<RefCell<Vec<(u32, u32)>>>,
    bad: Vec<u32>,
    exited: Rc<RefCell<Vec<u32>>>,
    /// Pids another process has now (any start time but [`START`] is refused as reused; these
    /// have another one).
    reused: Vec<u32>,
}

impl Targets for Fake {
    type Dup = u32;
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<u32> {
        let pid = id.pid;
        if self.reused.contains(&pid) || id.start_time != START {
            return Err(control::PidReused { pid }.into());
        }
        if self.bad.contains(&pid) {
            return Err(control::DupError {
                errno: Errno::EPERM,
                pid,
                fd: Some(fd),
            }
            .into());
        }
        Ok(pid)
    }
    fn enable(&mut self, _: &u32, e: &HoldEntry) -> Result<()> {
        self.enabled.borrow_mut().push(e.clone());
        Ok(())
    }
    fn set_timeslice(&mut self, pid: &u32, h_client: u32, h_tsg: u32, us: u64) -> Result<()> {
        if let Some(&(_, status)) = self.tsg_status.borrow().iter().find(|t| t.0 == h_tsg) {
            return Err(control::NvStatusError {
                cmd: gpreempt_common::nv::CTRL_TSG_SET_TIMESLICE,
                status,
            }
            .into());
        }
        self.sliced.borrow_mut().push((*pid, h_client, h_tsg, us));
        Ok(())
    }
    fn exited(&mut self, pid: &u32) -> bool {
        self.exited.borrow().contains(pid)
    }
}

fn hold_line(e: &HoldEntry) -> String {
    serde_json::to_string(&Request::Hold(e.clone())).unwrap()
}

#[test]
fn request_wire_format() {
    let e = entry(7, 0xc1d0_0002, &[1, 2]);
    assert_eq!(
        hold_line(&e),
        r#"{"op":"hold","pid":7,"start_time":555,"fd":5,"h_client":3251634178,"h_subdevice":1543503875,"channels":[1,2]}"#
    );
    let r = serde_json::to_string(&Request::Release {
        pid: 7,
        h_client: 9,
    })
    .unwrap();
    assert_eq!(r, r#"{"op":"release","pid":7,"h_client":9}"#);
    let e = entry_ts(7, 0xc1d0_0002, &[], &[(0x10, 2000)]);
    let line = hold_line(&e);
    assert_eq!(
        line,
        r#"{"op":"hold","pid":7,"start_time":555,"fd":5,"h_client":3251634178,"h_subdevice":1543503875,"channels":[],"timeslices":[{"h_tsg":16,"original_us":2000}]}"#
    );
    assert!(matches!(serde_json::from_str(&line).unwrap(), Request::Hold(h) if h == e));
    // A request from before timeslices: none.
    let old = r#"{"op":"hold","pid":7,"fd":5,"h_client":1,"h_subdevice":2,"channels":[3]}"#;
    let Request::Hold(h) = serde_json::from_str(old).unwrap() else {
        panic!("not a hold");
    };
    assert_eq!(h.channels, vec![3]);
    assert!(h.timeslices.is_empty());
}

#[test]
fn journal_round_trip() {
    let d = tmpdir("journal");
    let j = Journal::new(&d.join("nv-journal"));
    assert!(j.read().unwrap().is_empty());
    let a = entry(1, 10, &[1, 2]);
    let b = entry(2, 20, &[3]);
    j.append(&a).unwrap();
    j.append(&b).unwrap();
    assert_eq!(j.read().unwrap(), vec![a.clone(), b.clone()]);
    // A later line for the same key replaces the earlier one, in place.
    let a2 = entry(1, 10, &[1, 2, 4]);
    j.append(&a2).unwrap();
    assert_eq!(j.read().unwrap(), vec![a2.clone(), b.clone()]);
    // A torn last line is skipped.
    OpenOptions::new()
        .append(true)
        .open(j.path())
        .unwrap()
        .write_all(b"{\"pid\":3,\"fd")
        .unwrap();
    assert_eq!(j.read().unwrap(), vec![a2.clone(), b.clone()]);
    j.rewrite(std::slice::from_ref(&b)).unwrap();
    assert_eq!(j.read().unwrap(), vec![b]);
    j.rewrite(&[]).unwrap();
    assert!(j.read().unwrap().is_empty());
    assert!(!d.join("nv-journal.tmp").exists());
    // One owner at a time.
    let l = j.lock().unwrap();
    assert!(j.lock().unwrap_err().to_string().contains("live guardian"));
    assert!(recover(j.path()).is_empty());
    // A starting guardian waits for a predecessor that is still undoing, within its bound.
    let t0 = std::time::Instant::now();
    let e = j.lock_within(Duration::from_millis(150)).unwrap_err();
    assert!(e.to_string().contains("live guardian"), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(150));
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(l);
    });
    let t0 = std::time::Instant::now();
    let _l = j.lock_within(Duration::from_secs(5)).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "it waited for the release"
    );
    releaser.join().unwrap();
    drop(_l);
    j.lock().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn hold_hold_release_then_eof_resumes_exactly_the_rest() {
    let d = tmpdir("serve");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let a = entry(100, 0xa, &[1, 2, 2]);
    let b = entry(200, 0xb, &[3]);
    let input = format!(
        "{}\n\n{}\n{}\n{{\"op\":\"release\",\"pid\":100,\"h_client\":10}}\nnonsense\n",
        hold_line(&a),
        hold_line(&b),
        hold_line(&entry(200, 0xb, &[3, 4])),
    );
    // Journal contents as seen by each reply: check state mid-way via a second guardian run.
    let mut out = Vec::new();
    assert!(serve(input.as_bytes(), &mut out, &mut g, None));
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..4], &["ok", "ok", "ok", "ok"]);
    assert!(lines[4].starts_with("err unreadable request"), "{out}");
    assert_eq!(lines.len(), 5);
    let enabled = fake.enabled.borrow().clone();
    let b34 = entry(200, 0xb, &[3, 4]);
    assert_eq!(
        enabled,
        vec![
            entry(100, 0xa, &[1, 2]), // hold probe (deduplicated)
            b.clone(),                // hold probe
            entry(200, 0xb, &[4]),    // second hold: only the new channel is probed
            b34,                      // EOF: exactly the remaining entry
        ]
    );
    assert!(j.read().unwrap().is_empty());
    assert_eq!(std::fs::read_to_string(j.path()).unwrap(), "");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn journal_follows_holds_and_releases() {
    let d = tmpdir("follow");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let a = entry(100, 0xa, &[1]);
    let b = entry(200, 0xb, &[3]);
    assert_eq!(g.handle(&hold_line(&a)), "ok");
    assert_eq!(g.handle(&hold_line(&b)), "ok");
    assert_eq!(j.read().unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(
        g.handle(r#"{"op":"release","pid":100,"h_client":10}"#),
        "ok"
    );
    assert_eq!(j.read().unwrap(), vec![b.clone()]);
    // Releasing what is not held is fine.
    assert_eq!(g.handle(r#"{"op":"release","pid":9,"h_client":9}"#), "ok");
    // A target that exits is dropped (and not resumed at the end).
    fake.exited.borrow_mut().push(200);
    g.reap();
    assert!(j.read().unwrap().is_empty());
    assert_eq!(g.held().count(), 0);
    fake.enabled.borrow_mut().clear();
    assert!(g.shutdown());
    assert!(fake.enabled.borrow().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_hold_whose_dup_fails_is_refused_and_not_journaled() {
    let d = tmpdir("dupfail");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake {
        bad: vec![300],
        ..Default::default()
    };
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let input = format!("{}\n", hold_line(&entry(300, 0xc, &[1])));
    let mut out = Vec::new();
    assert!(serve(input.as_bytes(), &mut out, &mut g, None));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "err no ptrace rights over pid 300 (run as root; yama ptrace_scope)\n"
    );
    assert!(j.read().unwrap().is_empty());
    assert!(fake.enabled.borrow().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_unterminated_last_request_is_ignored() {
    let d = tmpdir("torn");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let input = hold_line(&entry(100, 0xa, &[1]));
    let mut out = Vec::new();
    assert!(serve(input.as_bytes(), &mut out, &mut g, None));
    assert!(out.is_empty());
    assert!(fake.enabled.borrow().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_new_guardian_resumes_leftovers_and_keeps_failures() {
    let d = tmpdir("leftover");
    let j = Journal::new(&d.join("nv-journal"));
    let ok = entry(100, 0xa, &[1]);
    let bad = entry(300, 0xc, &[2]);
    j.append(&ok).unwrap();
    j.append(&bad).unwrap();
    let fake = Fake {
        bad: vec![300],
        ..Default::default()
    };
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    assert_eq!(*fake.enabled.borrow(), vec![ok.clone()]);
    assert_eq!(j.read().unwrap(), vec![bad.clone()]);
    // The stale entry stays journaled across our own rewrites, and is retried at the end.
    let c = entry(400, 0xd, &[5]);
    assert_eq!(g.handle(&hold_line(&c)), "ok");
    assert_eq!(
        g.handle(r#"{"op":"release","pid":400,"h_client":13}"#),
        "ok"
    );
    assert_eq!(j.read().unwrap(), vec![bad.clone()]);
    assert!(!g.shutdown());
    assert_eq!(j.read().unwrap(), vec![bad]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn recover_skips_gone_processes() {
    let d = tmpdir("recover");
    let j = Journal::new(&d.join("nv-journal"));
    // Beyond pid_max: gone.
    let e = entry(0x7fff_fff0, 0xa, &[1]);
    j.append(&e).unwrap();
    let r = recover(j.path());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, e);
    assert!(r[0].1.is_ok());
    assert!(j.read().unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

pub(super) fn script(d: &Path, body: &str) -> PathBuf {
    let p = d.join("fake-guardian");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn handle_round_trips_and_times_out() {
    let d = tmpdir("handle");
    let exe = script(
        &d,
        r#"echo ready
while read l; do case "$l" in *hold*) echo ok;; *) echo "err nope";; esac; done"#,
    );
    let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
    h.hold(&entry(1, 2, &[3])).unwrap();
    let e = h.release(1, 2).unwrap_err();
    assert!(format!("{e:#}").ends_with(": nope"), "{e:#}");
    h.hold(&entry(1, 2, &[3])).unwrap();
    h.shutdown(Duration::from_secs(5)).unwrap();

    let exe = script(&d, "echo ready; cat >/dev/null");
    let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
    h.timeout = Duration::from_millis(100);
    let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
    assert!(format!("{e:#}").contains("did not answer"), "{e:#}");
    let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
    assert!(format!("{e:#}").contains("unusable"), "{e:#}");
    h.shutdown(Duration::from_secs(5)).unwrap();

    let exe = script(&d, "echo 'err journal locked'; exit 1");
    let e = GuardianHandle::spawn(&exe, &d.join("j")).err().unwrap();
    assert_eq!(e.to_string(), "the guardian did not start: journal locked");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Lines at virtual times (ms from the start), then EOF. Each read records the virtual time,
/// the wait asked for, how many enables so far, and the journal.
struct Script {
    start: Instant,
    now: Instant,
    lines: std::collections::VecDeque<(u64, String)>,
    fake: Fake,
    journal: Journal,
    reads: Rc<RefCell<Vec<Seen>>>,
}

#[derive(Debug)]
struct Seen {
    at: u64,
    wait: u64,
    enabled: usize,
    sliced: usize,
    journal: Vec<HoldEntry>,
}

impl Source for Script {
    fn next(&mut self, wait: Duration) -> Event {
        self.reads.borrow_mut().push(Seen {
            at: (self.now - self.start).as_millis() as u64,
            wait: wait.as_millis() as u64,
            enabled: self.fake.enabled.borrow().len(),
            sliced: self.fake.sliced.borrow().len(),
            journal: self.journal.read().unwrap(),
        });
        let Some(&(at, _)) = self.lines.front() else {
            return Event::End;
        };
        let at = self.start + Duration::from_millis(at);
        if at <= self.now + wait {
            self.now = self.now.max(at);
            Event::Line(self.lines.pop_front().unwrap().1)
        } else {
            self.now += wait;
            Event::Idle
        }
    }

    fn now(&self) -> Instant {
        self.now
    }
}

struct Run {
    fake: Fake,
    journal: Journal,
    reads: Vec<Seen>,
    dir: PathBuf,
}

impl Run {
    /// (virtual ms, how many enables) for each event that enabled something.
    fn enables(&self) -> Vec<(u64, usize)> {
        self.reads
            .windows(2)
            .filter(|w| w[1].enabled > w[0].enabled)
            .map(|w| (w[1].at, w[1].enabled - w[0].enabled))
            .collect()
    }

    /// (virtual ms, how many timeslice sets) for each event that set some.
    fn slices(&self) -> Vec<(u64, usize)> {
        self.reads
            .windows(2)
            .filter(|w| w[1].sliced > w[0].sliced)
            .map(|w| (w[1].at, w[1].sliced - w[0].sliced))
            .collect()
    }
}

fn run_script(name: &str, lease_ms: Option<u64>, lines: &[(u64, String)]) -> Run {
    let dir = tmpdir(name);
    let journal = Journal::new(&dir.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), journal.clone()).unwrap();
    let start = Instant::now();
    let reads = Rc::new(RefCell::new(Vec::new()));
    let script = Script {
        start,
        now: start,
        lines: lines.iter().cloned().collect(),
        fake: fake.clone(),
        journal: journal.clone(),
        reads: reads.clone(),
    };
    let mut out = Vec::new();
    assert!(serve(
        script,
        &mut out,
        &mut g,
        lease_ms.map(Duration::from_millis)
    ));
    assert!(String::from_utf8(out).unwrap().lines().all(|l| l == "ok"));
    let reads = reads.take();
    Run {
        fake,
        journal,
        reads,
        dir,
    }
}

#[test]
fn lease_expiry_resumes_held_once_and_keeps_them() {
    let a = entry(100, 0xa, &[1, 2]);
    let r = run_script(
        "lease-once",
        Some(1500),
        &[(0, hold_line(&a)), (5000, String::new())],
    );
    // The hold's probe at 0; the lease runs out at exactly 1500, once; the heartbeat at 5000
    // re-arms it; EOF right after.
    assert_eq!(r.enables(), vec![(0, 1), (1500, 1)]);
    let waits: Vec<(u64, u64)> = r.reads.iter().map(|x| (x.at, x.wait)).collect();
    assert_eq!(
        waits,
        vec![
            (0, 1000),
            (0, 1000),
            (1000, 500), // up to the due time
            (1500, 1000),
            (2500, 1000),
            (3500, 1000),
            (4500, 1000),
            (5000, 1000),
        ]
    );
    // Still held and journaled after the expiry: EOF resumes it again and empties the journal.
    assert!(r.reads[1..].iter().all(|x| x.journal == vec![a.clone()]));
    assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a.clone(), a]);
    assert!(r.journal.read().unwrap().is_empty());
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn a_heartbeat_before_expiry_prevents_it() {
    let a = entry(100, 0xa, &[1]);
    let r = run_script(
        "lease-beat",
        Some(1000),
        &[
            (0, hold_line(&a)),
            (999, String::new()),
            (1998, String::new()),
            (2997, String::new()),
        ],
    );
    assert_eq!(r.enables(), vec![(0, 1)]);
    assert!(r.reads[1..].iter().all(|x| x.journal == vec![a.clone()]));
    assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a]); // probe, EOF
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn a_line_after_expiry_rearms_the_lease() {
    let a = entry(100, 0xa, &[1]);
    let b = entry(200, 0xb, &[2]);
    let r = run_script(
        "lease-rearm",
        Some(300),
        &[
            (0, hold_line(&a)),
            (1000, String::new()), // a heartbeat re-arms it
            (2000, hold_line(&b)), // and so does a request
            (3000, String::new()),
        ],
    );
    assert_eq!(
        r.enables(),
        vec![(0, 1), (300, 1), (1300, 1), (2000, 1), (2300, 2)]
    );
    // Short leases are polled for on time, not at the next tick.
    assert!(r.reads.iter().any(|x| x.at == 2000 && x.wait == 300));
    assert_eq!(r.reads.last().unwrap().journal, vec![a.clone(), b.clone()]);
    assert_eq!(
        *r.fake.enabled.borrow(),
        vec![
            a.clone(),
            a.clone(),
            a.clone(),
            b.clone(),
            a.clone(),
            b.clone(),
            a,
            b
        ]
    );
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn without_a_lease_silence_resumes_nothing() {
    let a = entry(100, 0xa, &[1]);
    let r = run_script(
        "lease-none",
        None,
        &[(0, hold_line(&a)), (60_000, String::new())],
    );
    assert_eq!(r.enables(), vec![(0, 1)]);
    // Idle ticks (reaps) every second all the same.
    assert!(r.reads.iter().all(|x| x.wait == 1000));
    assert_eq!(r.reads.len(), 62);
    assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a]); // probe, EOF
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn a_silence_with_nothing_held_resumes_nothing() {
    let a = entry(100, 0xa, &[1]);
    let release = r#"{"op":"release","pid":100,"h_client":10}"#.to_string();
    let r = run_script(
        "lease-empty",
        Some(200),
        &[(0, hold_line(&a)), (100, release), (5000, String::new())],
    );
    assert_eq!(r.enables(), vec![(0, 1)]);
    assert_eq!(*r.fake.enabled.borrow(), vec![a]);
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn input_tells_lines_from_silence() {
    let (rd, wr) = nix::unistd::pipe().unwrap();
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    // Not blocked here, so never readable: only its fd is needed.
    let sigterm = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).unwrap();
    let mut input = Input::new(sigterm, rd);
    let mut wr = File::from(wr);
    wr.write_all(b"a\n\nb").unwrap();
    // Already sent: a line even with no time left to wait.
    assert_eq!(input.next(Duration::ZERO), Event::Line("a".into()));
    assert_eq!(input.next(Duration::ZERO), Event::Line(String::new()));
    let t = Instant::now();
    assert_eq!(input.next(Duration::from_millis(20)), Event::Idle);
    assert!(t.elapsed() >= Duration::from_millis(20));
    wr.write_all(b"\nc").unwrap();
    assert_eq!(input.next(Duration::ZERO), Event::Line("b".into()));
    drop(wr);
    // EOF mid-line: the end.
    assert_eq!(input.next(Duration::from_secs(5)), Event::End);
}

#[test]
fn handle_passes_the_lease_and_beats() {
    let d = tmpdir("handle-lease");
    let exe = script(
        &d,
        r#"echo "$@" > "$(dirname "$0")/args"; echo ready
while read l; do case "$l" in "") echo beat >> "$(dirname "$0")/beats";; *hold*) echo ok;; *) echo "err nope";; esac; done"#,
    );
    let lease = Some(Duration::from_micros(1_500_500));
    let mut h = GuardianHandle::spawn_with_lease(&exe, &d.join("j"), lease).unwrap();
    assert_eq!(h.lease(), Some(Duration::from_millis(1501)));
    h.beat().unwrap();
    h.beat().unwrap();
    // The beats had no replies to get in the way.
    h.hold(&entry(1, 2, &[3])).unwrap();
    h.shutdown(Duration::from_secs(5)).unwrap();
    let args = std::fs::read_to_string(d.join("args")).unwrap();
    assert_eq!(
        args.trim(),
        format!(
            "nv-guardian --journal {} --lease-ms 1501",
            d.join("j").display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(d.join("beats")).unwrap(),
        "beat\nbeat\n"
    );

    for lease in [None, Some(Duration::ZERO)] {
        let h = GuardianHandle::spawn_with_lease(&exe, &d.join("j"), lease).unwrap();
        assert_eq!(h.lease(), None);
        h.shutdown(Duration::from_secs(5)).unwrap();
        let args = std::fs::read_to_string(d.join("args")).unwrap();
        assert!(!args.contains("--lease-ms"), "{args}");
    }

    // A guardian that is gone: the beat fails, and so does everything after it.
    let exe = script(&d, "echo ready");
    let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
    h.child.wait().unwrap();
    assert!(h.beat().is_err());
    let e = h.beat().unwrap_err();
    assert!(format!("{e:#}").contains("unusable"), "{e:#}");
    let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
    assert!(format!("{e:#}").contains("unusable"), "{e:#}");

    // One that stopped reading: beats fail once its pipe is full, without blocking.
    let exe = script(&d, "echo ready; exec sleep 30");
    let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
    let e = (0..1 << 20).find_map(|_| h.beat().err()).unwrap();
    assert!(format!("{e:#}").contains("pipe is full"), "{e:#}");
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_hold_with_timeslices_sets_the_originals_once_and_eof_restores_them() {
    let d = tmpdir("ts-eof");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    // A TSG named twice in one request: its first original wins.
    let a = entry_ts(100, 0xa, &[1], &[(0x10, 2000), (0x11, 1000), (0x10, 5)]);
    let held = entry_ts(100, 0xa, &[1], &[(0x10, 2000), (0x11, 1000)]);
    assert_eq!(g.handle(&hold_line(&a)), "ok");
    assert_eq!(
        *fake.sliced.borrow(),
        vec![(100, 0xa, 0x10, 2000), (100, 0xa, 0x11, 1000)]
    );
    // The channel probe carries no timeslices.
    assert_eq!(*fake.enabled.borrow(), vec![entry(100, 0xa, &[1])]);
    assert_eq!(j.read().unwrap(), vec![held.clone()]);
    assert_eq!(g.held().cloned().collect::<Vec<_>>(), vec![held.clone()]);
    // EOF: the channels are resumed and both originals put back, once each.
    let mut out = Vec::new();
    assert!(serve(&b""[..], &mut out, &mut g, None));
    assert!(out.is_empty());
    assert_eq!(
        *fake.sliced.borrow(),
        vec![
            (100, 0xa, 0x10, 2000),
            (100, 0xa, 0x11, 1000),
            (100, 0xa, 0x10, 2000),
            (100, 0xa, 0x11, 1000),
        ]
    );
    assert_eq!(*fake.enabled.borrow(), vec![entry(100, 0xa, &[1]), held]);
    assert!(j.read().unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_repeated_hold_merges_timeslices_and_keeps_the_first_original() {
    let d = tmpdir("ts-merge");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    // Timeslices only: nothing to resume.
    assert_eq!(
        g.handle(&hold_line(&entry_ts(100, 0xa, &[], &[(0x10, 2000)]))),
        "ok"
    );
    // The controller lowered 0x10 meanwhile: a later hold's "original" for it is 500.
    assert_eq!(
        g.handle(&hold_line(&entry_ts(
            100,
            0xa,
            &[7],
            &[(0x10, 500), (0x11, 1000)]
        ))),
        "ok"
    );
    // Only the new TSG was set: 0x10 was never set to the lowered value.
    assert_eq!(
        *fake.sliced.borrow(),
        vec![(100, 0xa, 0x10, 2000), (100, 0xa, 0x11, 1000)]
    );
    assert_eq!(*fake.enabled.borrow(), vec![entry(100, 0xa, &[7])]);
    let merged = entry_ts(100, 0xa, &[7], &[(0x10, 2000), (0x11, 1000)]);
    assert_eq!(j.read().unwrap(), vec![merged.clone()]);
    // Another client of the same pid is an entry of its own.
    let other = entry_ts(100, 0xb, &[], &[(0x20, 3000)]);
    assert_eq!(g.handle(&hold_line(&other)), "ok");
    assert_eq!(j.read().unwrap(), vec![merged.clone(), other.clone()]);
    fake.sliced.borrow_mut().clear();
    fake.enabled.borrow_mut().clear();
    assert!(g.shutdown());
    assert_eq!(
        *fake.sliced.borrow(),
        vec![
            (100, 0xa, 0x10, 2000),
            (100, 0xa, 0x11, 1000),
            (100, 0xb, 0x20, 3000)
        ]
    );
    // An entry without channels resumes nothing.
    assert_eq!(*fake.enabled.borrow(), vec![merged]);
    assert!(j.read().unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_hold_whose_timeslice_cannot_be_set_is_refused_and_not_journaled() {
    let d = tmpdir("ts-holdfail");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    fake.tsg_status.borrow_mut().push((0x11, 0x1f));
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let reply = g.handle(&hold_line(&entry_ts(
        100,
        0xa,
        &[],
        &[(0x10, 2000), (0x11, 1000)],
    )));
    assert!(
        reply.starts_with("err the guardian could not set the timeslice of TSG 0x11 itself"),
        "{reply}"
    );
    assert!(j.read().unwrap().is_empty());
    assert_eq!(g.held().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn release_drops_timeslices_without_restoring_them() {
    let d = tmpdir("ts-release");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let a = entry_ts(100, 0xa, &[1], &[(0x10, 2000)]);
    let b = entry_ts(200, 0xb, &[], &[(0x20, 3000)]);
    assert_eq!(g.handle(&hold_line(&a)), "ok");
    assert_eq!(g.handle(&hold_line(&b)), "ok");
    assert_eq!(
        g.handle(r#"{"op":"release","pid":100,"h_client":10}"#),
        "ok"
    );
    // The controller restored a's itself: nothing set on release.
    assert_eq!(
        *fake.sliced.borrow(),
        vec![(100, 0xa, 0x10, 2000), (200, 0xb, 0x20, 3000)]
    );
    assert_eq!(j.read().unwrap(), vec![b.clone()]);
    assert_eq!(
        g.handle(r#"{"op":"release","pid":200,"h_client":11}"#),
        "ok"
    );
    assert!(j.read().unwrap().is_empty());
    fake.sliced.borrow_mut().clear();
    fake.enabled.borrow_mut().clear();
    assert!(g.shutdown());
    assert!(fake.sliced.borrow().is_empty());
    assert!(fake.enabled.borrow().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lease_expiry_restores_timeslices_and_keeps_them() {
    let a = entry_ts(100, 0xa, &[1], &[(0x10, 2000), (0x11, 1000)]);
    let r = run_script(
        "ts-lease",
        Some(1500),
        &[(0, hold_line(&a)), (5000, String::new())],
    );
    // Set once at the hold, restored at the expiry (1500), again at EOF (5000).
    assert_eq!(r.slices(), vec![(0, 2), (1500, 2)]);
    assert_eq!(r.enables(), vec![(0, 1), (1500, 1)]);
    assert!(r.reads[1..].iter().all(|x| x.journal == vec![a.clone()]));
    let once = [(100, 0xa, 0x10, 2000), (100, 0xa, 0x11, 1000)];
    assert_eq!(*r.fake.sliced.borrow(), once.repeat(3));
    assert_eq!(*r.fake.enabled.borrow().last().unwrap(), a);
    assert!(r.journal.read().unwrap().is_empty());
    std::fs::remove_dir_all(&r.dir).unwrap();
}

#[test]
fn sigterm_restores_timeslices_and_resumes() {
    let d = tmpdir("ts-sigterm");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let a = entry_ts(100, 0xa, &[1], &[(0x10, 2000)]);
    assert_eq!(g.handle(&hold_line(&a)), "ok");
    // SIGTERM, blocked in this test's thread only, pending for it alone: signalfd reads it.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.thread_block().unwrap();
    let sigterm = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).unwrap();
    // raise() signals the calling thread.
    nix::sys::signal::raise(Signal::SIGTERM).unwrap();
    // The controller's pipe stays open: only the signal ends the loop.
    let (rd, _wr) = nix::unistd::pipe().unwrap();
    let mut out = Vec::new();
    assert!(serve(Input::new(sigterm, rd), &mut out, &mut g, None));
    assert!(out.is_empty());
    assert_eq!(
        *fake.sliced.borrow(),
        vec![(100, 0xa, 0x10, 2000), (100, 0xa, 0x10, 2000)]
    );
    assert_eq!(*fake.enabled.borrow(), vec![entry(100, 0xa, &[1]), a]);
    assert!(j.read().unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_new_guardian_restores_leftover_timeslices() {
    let d = tmpdir("ts-leftover");
    let j = Journal::new(&d.join("nv-journal"));
    // A line from before timeslices and start times still reads, as none and 0.
    std::fs::write(
        j.path(),
        "{\"pid\":100,\"fd\":5,\"h_client\":10,\"h_subdevice\":1543503875,\"channels\":[1]}\n",
    )
    .unwrap();
    let old = HoldEntry {
        start_time: 0,
        ..entry(100, 0xa, &[1])
    };
    assert_eq!(j.read().unwrap(), vec![old.clone()]);
    let a = entry_ts(200, 0xb, &[2], &[(0x20, 3000)]);
    let b = entry_ts(300, 0xc, &[], &[(0x30, 4000)]);
    j.append(&a).unwrap();
    j.append(&b).unwrap();
    let fake = Fake::default();
    let g = Guardian::new(fake.clone(), j.clone()).unwrap();
    // Without a start time the old line names no process for sure: nothing is restored into
    // whoever has pid 100 now.
    assert_eq!(*fake.enabled.borrow(), vec![a]);
    assert_eq!(
        *fake.sliced.borrow(),
        vec![(200, 0xb, 0x20, 3000), (300, 0xc, 0x30, 4000)]
    );
    assert!(j.read().unwrap().is_empty());
    assert_eq!(g.held().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn restoring_is_best_effort_per_tsg() {
    let d = tmpdir("ts-partial");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let a = entry_ts(100, 0xa, &[1], &[(0x10, 2000), (0x11, 1000), (0x12, 500)]);
    assert_eq!(g.handle(&hold_line(&a)), "ok");
    fake.sliced.borrow_mut().clear();
    // 0x10 refused; 0x11 freed by the target (nothing to restore: no failure); 0x12 restored.
    fake.tsg_status.borrow_mut().extend([
        (0x10, 0x1f),
        (0x11, gpreempt_common::nv::status::OBJECT_NOT_FOUND),
    ]);
    assert!(!g.shutdown());
    assert_eq!(*fake.sliced.borrow(), vec![(100, 0xa, 0x12, 500)]);
    assert_eq!(fake.enabled.borrow().last().unwrap(), &a);
    // What failed stays journaled, for a next guardian.
    assert_eq!(j.read().unwrap(), vec![a.clone()]);
    // A client that is gone has nothing left to undo: a next guardian drops the entry.
    fake.tsg_status.borrow_mut()[0].1 = gpreempt_common::nv::status::INVALID_CLIENT;
    let r = journal::recover_with(&j, &mut fake.clone());
    assert_eq!(r.len(), 1);
    assert!(r[0].1.is_ok());
    assert!(j.read().unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

/// The KFD lease (`--kill-on-expiry`): `lines` at virtual ms with a 2 s lease against a real
/// child standing in for the controller; whether it was SIGKILLed.
fn killed_by(name: &str, lines: &[(u64, String)]) -> bool {
    killed_by_a(name, lines, true)
}

/// Whether the guardian kills its controller (a `sleep`, SIGSTOPped when `stopped`) for
/// `lines` at those ms.
fn killed_by_a(name: &str, lines: &[(u64, String)], stopped: bool) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = tmpdir(name);
    let journal = Journal::new(&dir.join("kfd-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), journal.clone()).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    g.kill_on_expiry(Stopper::new(child.id()).unwrap());
    if stopped {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
        let stat = format!("/proc/{}/stat", child.id());
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") T ")) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let start = Instant::now();
    let script = Script {
        start,
        now: start,
        lines: lines.iter().cloned().collect(),
        fake,
        journal,
        reads: Rc::new(RefCell::new(Vec::new())),
    };
    assert!(serve(
        script,
        &mut Vec::new(),
        &mut g,
        Some(Duration::from_secs(2))
    ));
    std::thread::sleep(Duration::from_millis(50));
    let killed = match child.try_wait().unwrap() {
        Some(st) => st.signal() == Some(libc::SIGKILL),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            false
        }
    };
    std::fs::remove_dir_all(&dir).unwrap();
    killed
}

#[test]
fn the_kfd_lease_kills_a_silent_controller_and_only_then() {
    let beats = |until: u64| -> Vec<(u64, String)> {
        (0..=until)
            .step_by(500)
            .map(|t| (t, String::new()))
            .collect()
    };
    // Beating every 500 ms for 10 s, then EOF: never killed.
    assert!(!killed_by("kill-none", &beats(10_000)));
    // Silent from the start (loading its programs): the first line is due 20 s + the lease later.
    assert!(!killed_by("kill-startup", &[(9_000, String::new())]));
    // Stopped during start-up: killed all the same (at 22 s).
    assert!(killed_by("kill-stopped-early", &[(30_000, String::new())]));
    // Beats until 3 s, then silent until 9 s: killed (at 5 s).
    let mut lines = beats(3_000);
    lines.push((9_000, String::new()));
    assert!(killed_by("kill-silent", &lines));
    // The same silence from a controller that is running (not stopped) is slowness: a loaded
    // host can starve a heartbeat for seconds. It gets up to 10 s...
    assert!(!killed_by_a("kill-slow", &lines, false));
    // ...and no more.
    let mut lines = beats(3_000);
    lines.push((20_000, String::new()));
    assert!(killed_by_a("kill-wedged", &lines, false));
}

/// A controller killed with -9 whose threads are still leaving a slow driver call reads as a
/// zombie past its lease: the guardian puts back what it held at once (not after the 10 s a
/// running controller gets) and says the controller is exiting, not that it was silent.
#[test]
fn an_exiting_controller_past_its_lease_gets_its_holds_put_back() {
    use super::serve::{overdue, Overdue};
    let s = Duration::from_secs(3);
    assert_eq!(overdue(s, Some('Z')), Overdue::Exiting('Z'));
    assert_eq!(overdue(s, Some('X')), Overdue::Exiting('X'));
    assert_eq!(overdue(s, Some('R')), Overdue::Slow);
    assert_eq!(overdue(s, Some('D')), Overdue::Slow);
    assert_eq!(
        overdue(Duration::from_secs(11), Some('R')),
        Overdue::Expired
    );
    assert_eq!(overdue(s, Some('T')), Overdue::Expired);
    assert_eq!(overdue(s, None), Overdue::Expired);
    let dir = tmpdir("lease-zombie");
    let journal = Journal::new(&dir.join("nv-journal"));
    let fake = Fake::default();
    let mut g = Guardian::new(fake.clone(), journal.clone()).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let stat = format!("/proc/{}/stat", child.id());
    while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
        std::thread::sleep(Duration::from_millis(5));
    }
    g.kill_on_expiry(Stopper::new(child.id()).unwrap());
    let a = entry(100, 0xa, &[1]);
    let start = Instant::now();
    let mut lines: Vec<(u64, String)> = vec![(0, hold_line(&a))];
    lines.extend((500..=3_000).step_by(500).map(|t| (t, String::new())));
    lines.push((6_000, String::new()));
    let reads = Rc::new(RefCell::new(Vec::new()));
    let script = Script {
        start,
        now: start,
        lines: lines.into_iter().collect(),
        fake: fake.clone(),
        journal: journal.clone(),
        reads: reads.clone(),
    };
    assert!(serve(
        script,
        &mut Vec::new(),
        &mut g,
        Some(Duration::from_secs(2))
    ));
    let r = Run {
        fake,
        journal,
        reads: reads.take(),
        dir,
    };
    // The probe at 0, then at the lease's end (3 s + 2 s): no grace for a dying controller.
    assert_eq!(r.enables(), vec![(0, 1), (5000, 1)]);
    assert!(child.wait().unwrap().success());
    std::fs::remove_dir_all(&r.dir).unwrap();
}

/// A pid is not an identity: the guardian takes its duplicate only of the process a hold names
/// by pid and start time. A hold for a previous owner of the pid is refused (nothing paused may
/// follow), and a journal entry whose pid has another owner now is dropped as gone, never
/// resumed or restored through the new owner's fds.
#[test]
fn holds_and_leftovers_of_a_reused_pid_never_reach_its_new_owner() {
    let d = tmpdir("reused");
    let j = Journal::new(&d.join("nv-journal"));
    let fake = Fake {
        reused: vec![300],
        ..Fake::default()
    };
    let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
    let stale = entry(300, 0xc, &[3]);
    let r = g.handle(&hold_line(&stale));
    assert!(
        r.starts_with("err ") && r.contains("pid 300 was reused"),
        "{r}"
    );
    assert_eq!(g.held().count(), 0);
    assert!(j.read().unwrap().is_empty());
    drop(g);
    let left = entry_ts(300, 0xc, &[3], &[(0x30, 4000)]);
    j.append(&left).unwrap();
    let r = journal::recover_with(&j, &mut fake.clone());
    assert_eq!(r.len(), 1);
    assert!(r[0].1.is_ok(), "a reused pid is gone: {:?}", r[0].1);
    assert!(fake.enabled.borrow().is_empty());
    assert!(fake.sliced.borrow().is_empty());
    assert!(j.read().unwrap().is_empty(), "dropped, not kept for later");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A fake cgroup directory with a freeze file reading `state`.
fn fake_cgroup(d: &Path, name: &str, state: &str) -> PathBuf {
    let cg = d.join(name);
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.freeze"), state).unwrap();
    cg
}

fn freeze_state(cg: &Path) -> String {
    std::fs::read_to_string(cg.join("cgroup.freeze")).unwrap()
}

/// The freeze fallback: a cgroup is journaled before the controller freezes it, a thaw request
/// drops it, and EOF (the controller gone, any way) thaws what is still frozen and empties the
/// journal. A directory without a freeze file is refused.
#[test]
fn frozen_cgroups_are_journaled_and_thawed_when_the_controller_goes() {
    let d = tmpdir("frozen");
    let j = Journal::new(&d.join("kfd-journal"));
    let (a, b) = (fake_cgroup(&d, "a", "1"), fake_cgroup(&d, "b", "1"));
    let mut g = Guardian::new(Fake::default(), j.clone()).unwrap();
    let line = |op: &str, cg: &Path, pid: u32| {
        format!(
            "{{\"op\":\"{op}\",\"cgroup\":{},\"pid\":{pid}}}\n",
            serde_json::to_string(cg).unwrap()
        )
    };
    let input = format!(
        "{}{}{}{}",
        line("freeze", &a, 10),
        line("freeze", &b, 20),
        line("thaw", &a, 10),
        line("freeze", &d.join("nothing"), 30),
    );
    // Mid-way, as a crash would leave it: the journal names both frozen cgroups.
    assert_eq!(g.handle(line("freeze", &a, 10).trim()), "ok");
    assert_eq!(g.handle(line("freeze", &b, 20).trim()), "ok");
    let journal = std::fs::read_to_string(j.frozen_path()).unwrap();
    assert!(
        journal.contains("\"pid\":10") && journal.contains("\"pid\":20"),
        "{journal}"
    );
    let mode = std::fs::metadata(j.frozen_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let mut out = Vec::new();
    assert!(serve(input.as_bytes(), &mut out, &mut g, None));
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], &["ok", "ok", "ok"], "{out}");
    assert!(lines[3].contains("not a cgroup v2 directory"), "{out}");
    // `a` was thawed by the controller (the guardian leaves it alone); `b` by the guardian.
    assert_eq!(freeze_state(&a), "1");
    assert_eq!(freeze_state(&b), "0");
    assert_eq!(std::fs::read_to_string(j.frozen_path()).unwrap(), "");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A guardian that died with cgroups frozen: the next one thaws them at start. A lease that runs
/// out thaws too, but keeps answering for them (the controller may carry on).
#[test]
fn a_dead_guardians_frozen_cgroups_are_thawed_and_a_lapsed_lease_thaws_without_forgetting() {
    let d = tmpdir("frozen-left");
    let j = Journal::new(&d.join("kfd-journal"));
    let a = fake_cgroup(&d, "a", "1");
    std::fs::write(
        j.frozen_path(),
        format!(
            "{{\"cgroup\":{},\"pid\":10}}\ntorn",
            serde_json::to_string(&a).unwrap()
        ),
    )
    .unwrap();
    let mut g = Guardian::new(Fake::default(), j.clone()).unwrap();
    assert_eq!(freeze_state(&a), "0", "thawed at start");
    assert_eq!(std::fs::read_to_string(j.frozen_path()).unwrap(), "");
    std::fs::write(a.join("cgroup.freeze"), "1").unwrap();
    let req = format!(
        "{{\"op\":\"freeze\",\"cgroup\":{},\"pid\":10}}",
        serde_json::to_string(&a).unwrap()
    );
    assert_eq!(g.handle(&req), "ok");
    assert!(g.expired("lease ran out"));
    assert_eq!(freeze_state(&a), "0");
    assert_eq!(g.frozen().len(), 1, "still answered for");
    assert!(std::fs::read_to_string(j.frozen_path())
        .unwrap()
        .contains("\"pid\":10"));
    std::fs::remove_dir_all(&d).unwrap();
}

mod beater;
