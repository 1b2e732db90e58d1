//! The control thread's logic that runs without ptrace or a GPU: the hold bookkeeping on a virtual
//! clock (watchdog, fences, rate limit, status bits), and requests routed through a real
//! [`Thread`] whose "KFD" is /dev/null (every DBG_TRAP fails with ENOTTY) and whose targets are
//! pids no process can have.

use std::{
    collections::BTreeMap,
    fs::File,
    os::fd::{FromRawFd, OwnedFd},
    sync::{mpsc, Arc},
    time::Duration,
};

use gpreempt_common::kfd::{KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK};
use nix::sys::{
    signal::{SigSet, Signal},
    signalfd::{SfdFlags, SignalFd},
};
use tokio::sync::{mpsc as tmpsc, oneshot};

use super::{
    holds::{self, Book, Fences, RateWindow},
    ops::{op_error, queue_op_error, seize_error},
    thread::{Target, Thread},
    Limits, Req, TargetError,
};
use crate::observe::procinfo::ProcId;
use crate::outcome::{Notice, OpReport, QueueOutcome, QueueResult};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const GPU_A: u32 = 0xa1;
const GPU_B: u32 = 0xb2;
/// Above the kernel's largest pid_max (2^22): no process has it, so any ptrace of it is ESRCH.
const FAKE: u32 = 0x7fff_fff0;
/// The start time [`FAKE`] was seized with.
const FAKE_START: u64 = 4242;
const FAKE_ID: ProcId = ProcId {
    pid: FAKE,
    start_time: FAKE_START,
};

fn report(pid: u32, at: u64, done: &[u32]) -> OpReport {
    OpReport {
        pid,
        ret: Some(done.len() as i32),
        queues: done
            .iter()
            .map(|&q| QueueResult {
                queue_id: q,
                gpu_id: None,
                outcome: QueueOutcome::Done,
            })
            .collect(),
        issued_ns: at,
        returned_ns: at,
        effect: crate::outcome::Effect::Paused,
    }
}

fn book(queues: &[(u32, u32)], held_since: &[(u32, u64)]) -> Book {
    Book {
        queues: queues.iter().copied().collect(),
        suspended: held_since.iter().copied().collect(),
        ..Book::default()
    }
}

// --- watchdog on a virtual clock ---------------------------------------------------------------

#[test]
fn watchdog_resumes_a_hold_once_at_its_deadline() {
    let max = 5 * S;
    let mut b = book(&[(1, GPU_A), (2, GPU_A)], &[]);
    b.record_suspended(&report(7, S, &[1, 2]));
    let due = |b: &Book, now| holds::overdue([(7, b)].into_iter(), max, now);
    assert!(due(&b, S).is_empty());
    assert!(due(&b, 6 * S - 1).is_empty());
    assert_eq!(due(&b, 6 * S), vec![(7, vec![1, 2])]);
    // What the watchdog's resume got is no longer held: it is not due again.
    b.record_resumed(&report(7, 6 * S, &[1, 2]));
    assert!(due(&b, 6 * S + 1).is_empty());
    assert!(due(&b, 100 * S).is_empty());
}

#[test]
fn suspending_again_does_not_renew_a_hold_but_a_new_hold_starts_over() {
    let max = 5 * S;
    let mut b = book(&[(1, GPU_A)], &[]);
    b.record_suspended(&report(7, S, &[1]));
    // A second suspend of a held queue keeps its first time: the watchdog is not put off.
    b.record_suspended(&report(7, 3 * S, &[1]));
    assert_eq!(b.suspended[&1], S);
    assert_eq!(
        holds::overdue([(7, &b)].into_iter(), max, 6 * S),
        vec![(7, vec![1])]
    );
    // Resumed, then held again: a fresh deadline.
    b.record_resumed(&report(7, 4 * S, &[1]));
    b.record_suspended(&report(7, 7 * S, &[1]));
    assert!(holds::overdue([(7, &b)].into_iter(), max, 12 * S - 1).is_empty());
    assert_eq!(
        holds::overdue([(7, &b)].into_iter(), max, 12 * S),
        vec![(7, vec![1])]
    );
}

#[test]
fn only_done_queues_are_held_or_released() {
    let mut b = book(&[(1, GPU_A), (2, GPU_A), (3, GPU_A)], &[]);
    let mut r = report(7, S, &[1, 2, 3]);
    r.queues[1].outcome = QueueOutcome::Invalid;
    r.queues[2].outcome = QueueOutcome::Error;
    b.record_suspended(&r);
    assert_eq!(b.suspended.keys().copied().collect::<Vec<_>>(), vec![1]);
    let mut r = report(7, 2 * S, &[1]);
    r.queues[0].outcome = QueueOutcome::Invalid;
    b.record_resumed(&r);
    assert!(
        b.suspended.contains_key(&1),
        "an INVALID resume keeps the hold"
    );
}

#[test]
fn watchdog_deadlines_of_several_targets() {
    let max = 5 * S;
    let t10 = book(&[(1, GPU_A)], &[(1, 0)]);
    let t20 = book(&[(4, GPU_B), (5, GPU_B)], &[(4, 2 * S), (5, 3 * S)]);
    let t30 = book(&[(9, GPU_A)], &[]);
    let all = || [(10, &t10), (20, &t20), (30, &t30)].into_iter();
    assert_eq!(holds::overdue(all(), max, 5 * S), vec![(10, vec![1])]);
    assert_eq!(
        holds::overdue(all(), max, 7 * S),
        vec![(10, vec![1]), (20, vec![4])]
    );
    assert_eq!(
        holds::overdue(all(), max, 8 * S),
        vec![(10, vec![1]), (20, vec![4, 5])]
    );
}

#[test]
fn the_thread_sleeps_until_the_next_deadline() {
    let max = 300 * S;
    let idle = book(&[(1, GPU_A)], &[]);
    assert_eq!(holds::next_wake_ms([&idle].into_iter(), max, 0), 100);
    let held = book(&[(1, GPU_A)], &[(1, 0)]);
    // While anything is held: at most 10 ms (the destroy check), less when a deadline is near.
    assert_eq!(holds::next_wake_ms([&idle, &held].into_iter(), max, 0), 10);
    assert_eq!(
        holds::next_wake_ms([&idle, &held].into_iter(), max, max - 3 * MS),
        4
    );
    assert_eq!(
        holds::next_wake_ms([&held].into_iter(), max, max + 7 * S),
        1
    );
}

// --- fences ------------------------------------------------------------------------------------

#[test]
fn an_error_bit_fences_its_gpu_and_names_the_held_queues_there() {
    let mut r = report(10, S, &[1, 3, 8]);
    r.queues[0].gpu_id = Some(GPU_A);
    r.queues[0].outcome = QueueOutcome::Error;
    r.queues[1].gpu_id = Some(GPU_B);
    r.queues[1].outcome = QueueOutcome::Invalid;
    // An ERROR on a queue of unknown GPU fences nothing.
    r.queues[2].outcome = QueueOutcome::Error;
    assert_eq!(
        holds::error_gpus(&r).into_iter().collect::<Vec<_>>(),
        vec![GPU_A]
    );

    let t10 = book(&[(1, GPU_A), (2, GPU_A), (3, GPU_B)], &[(2, S), (3, S)]);
    let t20 = book(&[(4, GPU_A)], &[]);
    let t30 = book(&[(5, GPU_A), (6, GPU_B)], &[(5, S), (6, S)]);
    let all = [(10, &t10), (20, &t20), (30, &t30)];
    assert_eq!(
        holds::held_on(all.into_iter(), GPU_A),
        vec![(10, vec![2]), (30, vec![5])]
    );
    assert_eq!(
        holds::held_on(all.into_iter(), GPU_B),
        vec![(10, vec![3]), (30, vec![6])]
    );
}

#[test]
fn a_fenced_gpu_is_left_alone_with_its_first_reason() {
    let mut f = Fences::default();
    assert!(f.fence(GPU_A, "first"));
    assert!(!f.fence(GPU_A, "second"), "fenced once: one notice");
    assert_eq!(f.reason(GPU_A), Some("first"));
    assert_eq!(f.reason(GPU_B), None);
    let gpu_of = |q| match q {
        1 | 2 => Some(GPU_A),
        3 => Some(GPU_B),
        _ => None,
    };
    assert_eq!(f.split(&[1, 3, 2, 9], gpu_of), (vec![3, 9], vec![1, 2]));
}

// --- rate limit --------------------------------------------------------------------------------

#[test]
fn at_most_200_suspends_per_target_per_second() {
    let limit = Limits::default().max_suspends_per_s;
    assert_eq!(limit, 200);
    let mut w = RateWindow::default();
    let t0 = 10 * S;
    for i in 0..200 {
        assert!(w.admit(t0 + i * MS, limit), "call {i}");
    }
    assert!(!w.admit(t0 + 500 * MS, limit));
    assert!(!w.admit(t0 + S - 1, limit));
    // A second after the window began, a new one begins with this call.
    assert!(w.admit(t0 + S, limit));
    for _ in 1..200 {
        assert!(w.admit(t0 + S + 500 * MS, limit));
    }
    assert!(!w.admit(t0 + S + 500 * MS, limit));
    assert!(!w.admit(t0 + 2 * S - 1, limit));
    assert!(w.admit(t0 + 2 * S, limit));
}

#[test]
fn the_rate_window_starts_at_the_first_call_after_a_pause() {
    let mut w = RateWindow::default();
    assert!(w.admit(5 * S + 300 * MS, 1));
    assert!(!w.admit(6 * S + 200 * MS, 1), "still the window of 5.3 s");
    assert!(w.admit(6 * S + 300 * MS, 1));
    // Each target has a window of its own.
    let mut other = RateWindow::default();
    assert!(other.admit(6 * S + 301 * MS, 1));
}

// --- status bits -------------------------------------------------------------------------------

#[test]
fn status_bits_decode_into_per_queue_outcomes() {
    let gpu_of = |q| (q < 8).then_some(GPU_A);
    let got = holds::decode_statuses(
        &[
            5,
            6 | KFD_DBG_QUEUE_INVALID_MASK,
            7 | KFD_DBG_QUEUE_ERROR_MASK,
            8 | KFD_DBG_QUEUE_ERROR_MASK | KFD_DBG_QUEUE_INVALID_MASK,
        ],
        gpu_of,
    );
    let want = [
        (5, Some(GPU_A), QueueOutcome::Done),
        (6, Some(GPU_A), QueueOutcome::Invalid),
        (7, Some(GPU_A), QueueOutcome::Error),
        (8, None, QueueOutcome::Error),
    ]
    .map(|(queue_id, gpu_id, outcome)| QueueResult {
        queue_id,
        gpu_id,
        outcome,
    });
    assert_eq!(got, want);
}

#[test]
fn a_snapshot_names_new_queues_and_forgets_holds_of_gone_ones() {
    let mut b = book(&[(1, GPU_A), (2, GPU_A)], &[(1, S), (2, S)]);
    let fresh = b.set_queues(BTreeMap::from([(2, GPU_A), (3, GPU_B)]));
    assert_eq!(fresh, vec![3]);
    assert_eq!(b.suspended.keys().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(b.gpu_of(3), Some(GPU_B));
    assert_eq!(b.gpu_of(1), None);
}

// --- errors ------------------------------------------------------------------------------------

#[test]
fn kernel_errors_map_to_target_errors() {
    use nix::errno::Errno;
    assert_eq!(
        seize_error(Errno::ESRCH, || None, String::new),
        TargetError::Gone
    );
    assert_eq!(
        seize_error(Errno::EPERM, || Some((42, "rocgdb".into())), String::new),
        TargetError::Traced {
            tracer: 42,
            comm: "rocgdb".into()
        }
    );
    assert!(matches!(
        seize_error(Errno::EPERM, || None, || "the cause".into()),
        TargetError::NotPermitted(s) if s == "PTRACE_SEIZE: EPERM: Operation not permitted: the cause"
    ));
    // The tracer is looked up only when it can explain the refusal.
    assert!(matches!(
        seize_error(Errno::EIO, || panic!("not asked"), || panic!("not asked")),
        TargetError::Other(s) if s.starts_with("PTRACE_SEIZE")
    ));
    let io = |e: Errno| std::io::Error::from_raw_os_error(e as i32);
    assert_eq!(op_error("enable", &io(Errno::ESRCH)), TargetError::Gone);
    assert_eq!(
        op_error("enable", &io(Errno::EALREADY)),
        TargetError::AlreadyDebugged
    );
    assert!(matches!(
        op_error("suspend_queues", &io(Errno::EACCES)),
        TargetError::NotPermitted(s) if s.starts_with("DBG_TRAP suspend_queues")
    ));
    // EPERM on a target whose runtime never enabled the debug API names that cause; otherwise
    // (runtime enabled, or changed since) the generic text.
    assert!(matches!(
        queue_op_error(7, "suspend_queues", &io(Errno::EPERM), Some(false)),
        TargetError::NoDebugApi(s) if s.contains("pid 7's GPU runtime never enabled the KFD debug API")
            && s.contains("ROCm 5.7")
    ));
    for rt in [Some(true), None] {
        assert_eq!(
            queue_op_error(7, "suspend_queues", &io(Errno::EPERM), rt),
            op_error("suspend_queues", &io(Errno::EPERM))
        );
    }
    assert_eq!(
        queue_op_error(7, "suspend_queues", &io(Errno::ESRCH), Some(false)),
        TargetError::Gone
    );
    for e in [Errno::EBUSY, Errno::ENODEV, Errno::EINVAL] {
        assert!(matches!(
            op_error("enable", &io(e)),
            TargetError::Unsupported(_)
        ));
    }
    assert!(matches!(
        op_error("enable", &io(Errno::ENOMEM)),
        TargetError::Other(_)
    ));
}

// --- requests through a real control thread ----------------------------------------------------

struct Rig {
    t: Thread,
    tx: mpsc::Sender<Req>,
    notices: tmpsc::UnboundedReceiver<crate::backend::Arrival>,
}

fn rig(limits: Limits) -> Rig {
    let kfd = File::open("/dev/null").expect("/dev/null");
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let sigfd =
        SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).expect("sfd");
    // SAFETY: eventfd returns a new fd or -1.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(efd >= 0, "eventfd");
    // SAFETY: efd is a fresh fd we own.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
    let (tx, rx) = mpsc::channel();
    let (ntx, notices) = tmpsc::unbounded_channel();
    Rig {
        t: Thread::new(
            kfd,
            sigfd,
            wake,
            rx,
            ntx,
            limits,
            Arc::new(super::types::Pulse::new(0)),
        ),
        tx,
        notices,
    }
}

impl Rig {
    /// A target already under control (no seize: its pid is [`FAKE`]).
    fn add(&mut self, b: Book) {
        self.t.targets.insert(
            FAKE,
            Target {
                pid: FAKE,
                start_time: FAKE_START,
                events: File::open("/dev/null").expect("/dev/null"),
                book: b,
                runtime_enabled: Some(true),
            },
        );
    }

    fn ask<T>(&mut self, make: impl FnOnce(oneshot::Sender<T>) -> Req) -> T {
        let (tx, mut rx) = oneshot::channel();
        self.t.request(make(tx));
        rx.try_recv().expect("a reply at once")
    }

    fn suspend(&mut self, id: ProcId, queues: Option<Vec<u32>>) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Suspend {
            id,
            queues,
            grace: None,
            reply,
        })
    }

    fn notices(&mut self) -> Vec<Notice> {
        std::iter::from_fn(|| self.notices.try_recv().ok())
            .map(|a| match a {
                crate::backend::Arrival::Notice(n) => n,
                other => panic!("the control thread sends only notices: {other:?}"),
            })
            .collect()
    }
}

#[test]
fn requests_for_ourselves_are_refused_before_any_ptrace() {
    let mut r = rig(Limits::default());
    let me = ProcId::now(std::path::Path::new("/proc"), std::process::id()).expect("own stat");
    let refused =
        |e: &TargetError| matches!(e, TargetError::NotPermitted(s) if s.contains("itself"));
    assert!(refused(&r.suspend(me, None).unwrap_err()));
    assert!(refused(&r.suspend(me, Some(vec![1])).unwrap_err()));
    assert!(refused(
        &r.ask(|reply| Req::Resume {
            id: me,
            queues: None,
            reply
        })
        .unwrap_err()
    ));
    assert!(refused(&r.ask(|x| Req::Attach(me, x)).unwrap_err()));
    assert!(refused(&r.ask(|x| Req::Snapshot(me, x)).unwrap_err()));
    assert!(r.t.targets.is_empty());
    // Detaching what is not controlled is a no-op, not an error.
    assert_eq!(r.ask(|x| Req::Detach(FAKE_ID, x)), Ok(()));
    assert!(r.notices().is_empty());
}

#[test]
fn suspends_on_a_fenced_gpu_are_refused_per_queue_and_others_reach_the_kernel() {
    let mut r = rig(Limits::default());
    r.add(book(&[(1, GPU_A), (2, GPU_B)], &[]));
    assert!(r.t.fenced.fence(GPU_A, "a suspend returned ERROR"));
    let rep = r.suspend(FAKE_ID, Some(vec![1])).expect("no call needed");
    assert_eq!(rep.ret, None, "the kernel was not asked");
    assert_eq!(
        rep.queues,
        vec![QueueResult {
            queue_id: 1,
            gpu_id: Some(GPU_A),
            outcome: QueueOutcome::Fenced
        }]
    );
    assert_eq!(r.t.fenced.reason(GPU_A), Some("a suspend returned ERROR"));
    // Queue 2's GPU is not fenced: the call goes to the "kernel" (/dev/null), which refuses.
    assert!(matches!(
        r.suspend(FAKE_ID, Some(vec![2])),
        Err(TargetError::Other(s)) if s.starts_with("DBG_TRAP suspend_queues")
    ));
    assert!(r.t.targets[&FAKE].book.suspended.is_empty());
}

#[test]
fn the_rate_limit_refuses_a_target_past_its_budget() {
    let mut r = rig(Limits {
        max_suspends_per_s: 3,
        ..Limits::default()
    });
    r.add(book(&[(1, GPU_A)], &[]));
    r.t.fenced.fence(GPU_A, "test");
    for _ in 0..3 {
        assert!(r.suspend(FAKE_ID, Some(vec![1])).is_ok());
    }
    assert_eq!(
        r.suspend(FAKE_ID, Some(vec![1])),
        Err(TargetError::RateLimited)
    );
}

#[test]
fn fencing_resumes_the_gpus_held_queues_and_notices_once() {
    let mut r = rig(Limits::default());
    r.add(book(&[(1, GPU_A), (2, GPU_B)], &[(1, S), (2, S)]));
    r.t.fence(GPU_A, "why".into());
    let n = r.notices();
    assert_eq!(n.len(), 2, "{n:?}");
    // The "kernel" refuses the resume of queue 1: reported, then the fence itself.
    assert!(
        matches!(&n[0], Notice::Problem { pid: FAKE, text } if text.starts_with("resuming after the fence"))
    );
    assert_eq!(
        n[1],
        Notice::Fenced {
            gpu_id: GPU_A,
            why: "why".into()
        }
    );
    r.t.fence(GPU_A, "again".into());
    assert!(r.notices().is_empty());
    // GPU B, with nothing held on it, is fenced without a resume.
    r.t.targets
        .get_mut(&FAKE)
        .expect("target")
        .book
        .suspended
        .remove(&2);
    r.t.fence(GPU_B, "b".into());
    assert_eq!(
        r.notices(),
        vec![Notice::Fenced {
            gpu_id: GPU_B,
            why: "b".into()
        }]
    );
}

#[test]
fn the_watchdog_acts_once_per_hold_on_a_virtual_clock() {
    let mut r = rig(Limits {
        max_suspend: Duration::from_secs(5),
        ..Limits::default()
    });
    let mut b = book(&[(1, GPU_A), (2, GPU_A)], &[(1, S), (2, 3 * S)]);
    b.hold_all = Some(None);
    r.add(b);
    r.t.watchdog_at(6 * S - 1);
    assert!(r.notices().is_empty());
    r.t.watchdog_at(6 * S);
    let n = r.notices();
    // The "kernel" refuses the resume: the hold is dropped anyway (never retried forever).
    assert!(
        matches!(n.as_slice(), [Notice::Problem { pid: FAKE, text }] if text.starts_with("watchdog resume failed")),
        "{n:?}"
    );
    let bk = &r.t.targets[&FAKE].book;
    assert_eq!(bk.suspended.keys().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        bk.hold_all, None,
        "a watchdog resume ends a hold of the whole process"
    );
    r.t.watchdog_at(7 * S);
    assert!(r.notices().is_empty(), "queue 1 is not acted on twice");
    r.t.watchdog_at(8 * S);
    assert_eq!(r.notices().len(), 1);
    assert!(r.t.targets[&FAKE].book.suspended.is_empty());
    r.t.watchdog_at(100 * S);
    assert!(r.notices().is_empty());
}

#[test]
fn the_loop_serves_requests_and_ends_on_shutdown() {
    let mut r = rig(Limits::default());
    let (dtx, mut drx) = oneshot::channel();
    let (stx, mut srx) = oneshot::channel();
    r.tx.send(Req::Detach(FAKE_ID, dtx)).expect("send");
    r.tx.send(Req::Shutdown(stx)).expect("send");
    r.t.run();
    assert_eq!(drx.try_recv(), Ok(Ok(())));
    assert_eq!(srx.try_recv(), Ok(Vec::new()));
}

#[test]
fn ids_with_status_bits_never_reach_the_kernel() {
    assert!(holds::no_status_bits(&[0, 1, 1023]).is_ok());
    for bad in [KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK | 3] {
        let e = holds::no_status_bits(&[0, bad]).unwrap_err().to_string();
        assert!(e.contains("carries status bits"), "{e}");
    }
}

#[test]
fn a_refused_seize_names_the_cause_this_host_shows() {
    use super::ops::seize_eperm_cause;
    let root = std::env::temp_dir().join(format!("gpreempt-eperm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let put = |p: &str, t: &str| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, t).unwrap();
    };
    let root_caps = "CapEff:\t000001ffffffffff\n";
    put("proc/self/status", root_caps);
    put("proc/7/status", "Name:\tkworker\nPPid:\t2\n");
    assert!(seize_eperm_cause(&root, 7).contains("is a kernel thread"));
    put("proc/9/status", "Name:\tapp\nPPid:\t1\n");
    // No Yama on this host: Yama is not blamed.
    let c = seize_eperm_cause(&root, 9);
    assert!(
        c.contains("no Yama restriction") && !c.contains("ptrace_scope is"),
        "{c}"
    );
    put("proc/sys/kernel/yama/ptrace_scope", "3\n");
    assert!(seize_eperm_cause(&root, 9).contains("ptrace_scope is 3"));
    put("proc/sys/kernel/yama/ptrace_scope", "1\n");
    put("proc/self/status", "CapEff:\t0000000000000000\n");
    assert!(seize_eperm_cause(&root, 9).contains("lacks CAP_SYS_PTRACE"));
    std::fs::remove_dir_all(&root).unwrap();
}

/// A pid is not an identity: a request that names a target's pid with another start time is
/// about a process that is gone, and nothing of it reaches the kernel or the target's holds.
#[test]
fn a_request_for_a_previous_owner_of_a_targets_pid_is_refused() {
    let mut r = rig(Limits::default());
    r.add(book(&[(1, GPU_A)], &[(1, S)]));
    let old = ProcId {
        start_time: FAKE_START - 7,
        ..FAKE_ID
    };
    assert_eq!(
        r.suspend(old, Some(vec![1])),
        Err(TargetError::Reused { pid: FAKE })
    );
    assert_eq!(r.suspend(old, None), Err(TargetError::Reused { pid: FAKE }));
    assert_eq!(
        r.ask(|reply| Req::Resume {
            id: old,
            queues: None,
            reply
        }),
        Err(TargetError::Reused { pid: FAKE })
    );
    assert_eq!(
        r.ask(|x| Req::Snapshot(old, x)),
        Err(TargetError::Reused { pid: FAKE })
    );
    // Detach of the previous owner does not let go of the current one.
    assert_eq!(r.ask(|x| Req::Detach(old, x)), Ok(()));
    let t = &r.t.targets[&FAKE];
    assert_eq!(t.book.hold_all, None);
    assert_eq!(
        t.book.suspended.keys().copied().collect::<Vec<_>>(),
        vec![1]
    );
    assert!(r.notices().is_empty());
    // The target itself is still served (here the /dev/null "kernel" refuses).
    assert!(matches!(
        r.suspend(FAKE_ID, Some(vec![1])),
        Err(TargetError::Other(s)) if s.starts_with("DBG_TRAP suspend_queues")
    ));
}

/// A live process whose start time is not the one asked for is never seized: its pid was
/// reused, and the new owner is left alone (no tracer, nothing recorded).
#[test]
fn a_process_that_took_a_reused_pid_is_never_seized() {
    let mut r = rig(Limits::default());
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep");
    let now = ProcId::now(std::path::Path::new("/proc"), child.id()).expect("child stat");
    let before = ProcId {
        start_time: now.start_time.saturating_sub(1),
        ..now
    };
    for e in [
        r.suspend(before, None),
        r.suspend(before, Some(vec![0])),
        r.ask(|reply| Req::Resume {
            id: before,
            queues: None,
            reply,
        }),
    ] {
        assert_eq!(e, Err(TargetError::Reused { pid: now.pid }));
    }
    assert_eq!(
        r.ask(|x| Req::Attach(before, x)),
        Err(TargetError::Reused { pid: now.pid })
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", now.pid)).expect("status");
    assert!(status.contains("TracerPid:\t0\n"), "{status}");
    assert!(r.t.targets.is_empty());
    let _ = child.kill();
    let _ = child.wait();
    // Once it is gone (reaped), the pid is nobody's: gone, not reused.
    assert_eq!(r.suspend(now, None), Err(TargetError::Gone));
}
