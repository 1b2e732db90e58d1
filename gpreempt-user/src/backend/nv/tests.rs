//! The NVIDIA backend against a fake RM on its worker thread: the lever, the watchdog, back-off,
//! and what a slow or wedged driver call does (and does not do) to the controller's loop.
//! Loop time is virtual (the `now` passed to upkeep, against the worker's own clock readings);
//! a call "in the driver" is the fake's gate, held and released by the test.

use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{worker::BACKOFF_MIN_NS, NvBackend, LEVER_RECHECK_NS};
use crate::{
    backend::nv::controller::{
        tests::{host, Shared},
        NvControl,
    },
    backend::{ActError, Acted, Arrival, Backend, Ticket},
    outcome::{Notice, QueueOutcome},
    policy::{Class, Policy},
};

const WAIT: Duration = Duration::from_secs(10);
const MS: u64 = 1_000_000;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// A backend on a shared fake, its guardian lease `max(max_suspend, 0.5 s)` as in `run`
/// (no guardian process: the beats are counted).
fn backend(
    fake: &Shared,
    max_suspend: Duration,
) -> (NvBackend<Shared>, UnboundedReceiver<Arrival>) {
    let (tx, rx) = unbounded_channel();
    let lease = max_suspend.max(Duration::from_millis(500));
    let nv = NvControl::unguarded(fake.clone()).with_lease(lease);
    (NvBackend::with(nv, max_suspend, tx).unwrap(), rx)
}

/// The next arrival (the test fails after [`WAIT`] without one).
fn next(rx: &mut UnboundedReceiver<Arrival>) -> Arrival {
    let end = std::time::Instant::now() + WAIT;
    loop {
        if let Ok(a) = rx.try_recv() {
            return a;
        }
        assert!(std::time::Instant::now() < end, "nothing arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Returns once the worker has done everything asked before (what it sent is in `rx` then)
/// and is idle.
fn sync(b: &NvBackend<Shared>) {
    b.worker.call(WAIT, |_| ()).unwrap();
    let end = std::time::Instant::now() + WAIT;
    while b.worker.busy().is_some() {
        assert!(std::time::Instant::now() < end, "the worker stays busy");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Everything that already arrived.
fn drain(rx: &mut UnboundedReceiver<Arrival>) -> Vec<Arrival> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn later(a: Acted) -> Ticket {
    match a {
        Acted::Later(t) => t,
        Acted::Now(r) => panic!("acted at once: {r:?}"),
    }
}

fn done(a: Arrival, ticket: Ticket) -> Result<crate::outcome::OpReport, ActError> {
    match a {
        Arrival::Done { ticket: t, result } if t == ticket => result,
        other => panic!("expected the result of {ticket:?}, got {other:?}"),
    }
}

fn notices(v: Vec<Arrival>) -> Vec<Notice> {
    v.into_iter()
        .map(|a| match a {
            Arrival::Notice(n) => n,
            other => panic!("not a notice: {other:?}"),
        })
        .collect()
}

/// The longest silence a guardian would see between `beats` (virtual ns) from `from` to `to`.
fn longest_silence(from: u64, beats: &[u64], to: u64) -> u64 {
    let mut last = from;
    let mut worst = 0;
    for &t in beats.iter().chain(std::iter::once(&to)) {
        worst = worst.max(t.saturating_sub(last));
        last = t;
    }
    worst
}

/// Offline: the short timeslice at classification, notices for the audit; back to the
/// original on a class change; a refusing driver makes the policy pause instead.
#[test]
fn the_nvidia_backend_applies_and_restores_the_timeslice_lever() {
    let s = host();
    let fake = Shared::default();
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&Policy::default());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    sync(&b);
    let n = notices(drain(&mut rx));
    assert!(
        matches!(&n[..], [Notice::Timeslice { change, .. }]
            if change.queue_id == 0x20 && change.to_us == 200 && change.from_us == 2048),
        "{n:?}"
    );
    assert_eq!(b.timeslices(), vec![(7, 0x20, 2048, 200)]);
    block_on(b.classed(&s, 7, Class::Online)).unwrap();
    sync(&b);
    let n = notices(drain(&mut rx));
    assert!(
        matches!(&n[..], [Notice::Timeslice { change, .. }] if change.to_us == 2048),
        "{n:?}"
    );
    assert!(b.timeslices().is_empty());
    assert_eq!(fake.with(|f| f.timeslices[&0x20]), 2048);
    block_on(Box::new(b).shutdown());

    // The pause lever changes no timeslice.
    let fake = Shared::default();
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    let mut p = Policy::default();
    p.levers.lever = crate::policy::Lever::Pause;
    b.set_policy(&p);
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    assert!(b.upkeep(&s, LEVER_RECHECK_NS).is_empty());
    sync(&b);
    assert!(drain(&mut rx).is_empty());
    block_on(Box::new(b).shutdown());
    assert!(fake.with(|f| f.ts_calls.is_empty()));

    // A refusing driver: the lever fails once, with the reason, and is not retried.
    let fake = Shared::default();
    fake.with(|f| f.ts_fail = true);
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&Policy::default());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    b.upkeep(&s, LEVER_RECHECK_NS * 2);
    sync(&b);
    let n = notices(drain(&mut rx));
    assert!(
        matches!(&n[..], [Notice::LeverFailed { pid: 7, text }] if text.contains("NV_ERR_NOT_SUPPORTED")),
        "{n:?}"
    );
    b.upkeep(&s, LEVER_RECHECK_NS * 4);
    sync(&b);
    assert!(drain(&mut rx).is_empty(), "not retried at every check");
    block_on(Box::new(b).shutdown());
}

#[test]
fn nvidia_watchdog_resumes_what_stays_paused_past_max_suspend() {
    let s = host();
    let fake = Shared::default();
    let max = 60 * 1_000 * MS;
    let (mut b, mut rx) = backend(&fake, Duration::from_nanos(max));
    let t = later(block_on(b.suspend(&s, 7, None, None)));
    let r = done(next(&mut rx), t).unwrap();
    // None: every live TSG of the process (compute 0x20 and copy 0x30, which has no channel
    // seen: the TSG handle stands for it).
    assert_eq!(r.done(), vec![0x20, 0x30]);
    let at = |now: u64| b.worker.call(WAIT, move |w| w.watchdog_at(now)).unwrap();
    at(r.returned_ns + max - MS);
    assert!(drain(&mut rx).is_empty(), "not yet");
    at(r.returned_ns + max);
    match notices(drain(&mut rx)).as_slice() {
        [Notice::Acted {
            report,
            suspend: false,
            why,
        }] => {
            assert_eq!(report.done(), vec![0x20, 0x30]);
            assert_eq!(
                report.queues[0].gpu_id, r.queues[0].gpu_id,
                "the GPU, from the pause"
            );
            assert!(why.contains("watchdog"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    at(u64::MAX);
    assert!(drain(&mut rx).is_empty(), "resumed once");
    // Resume of "everything" after that is a no-op report.
    let t = later(block_on(b.resume(&s, 7, None)));
    let r = done(next(&mut rx), t).unwrap();
    assert!(r.queues.iter().all(|q| q.outcome != QueueOutcome::Done));
    assert_eq!(fake.with(|f| f.calls.len()), 2);
    assert!(!fake.with(|f| f.calls[1].1), "the second call resumes");
    block_on(Box::new(b).shutdown());
}

/// A driver that refuses a pause is not asked again until the back-off delay has passed.
#[test]
fn a_failed_nvidia_pause_backs_off() {
    let s = host();
    let fake = Shared::default();
    fake.with(|f| f.fail = true);
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    let mut pause = |b: &mut NvBackend<Shared>| {
        let t = later(block_on(b.suspend(&s, 7, None, None)));
        done(next(&mut rx), t).unwrap_err()
    };
    let e = pause(&mut b);
    assert!(
        matches!(&e, ActError::Driver(t) if t.contains("NV_ERR_NOT_SUPPORTED")),
        "{e}"
    );
    let e = pause(&mut b);
    assert!(matches!(e, ActError::BackingOff { .. }), "{e}");
    assert!(
        e.to_string().contains("backing off after a failed pause"),
        "{e}"
    );
    let backoff = |b: &NvBackend<Shared>| b.worker.call(WAIT, |w| w.backoff.clone()).unwrap();
    let (until, next_delay) = backoff(&b)[&7];
    assert_eq!(next_delay, 2 * BACKOFF_MIN_NS, "the delay doubles");
    // Once the delay has passed, it tries again (and fails again: a longer delay).
    b.worker
        .call(WAIT, move |w| w.backoff.insert(7, (0, next_delay)))
        .unwrap();
    let e = pause(&mut b);
    assert!(e.to_string().contains("NV_ERR_NOT_SUPPORTED"), "{e}");
    assert!(backoff(&b)[&7].0 > until);
    assert_eq!(backoff(&b)[&7].1, 4 * BACKOFF_MIN_NS);
    b.forget(7);
    assert!(backoff(&b).is_empty());
    block_on(Box::new(b).shutdown());
}

/// The H100 case: an RM call that takes seconds. The loop's side returns at once from
/// everything it asks, keeps beating every quarter lease (at most 250 ms), so the guardian's
/// lease never runs out, and the result is applied when it comes.
#[test]
fn a_blocked_rm_call_does_not_stop_the_loop_or_its_heartbeat() {
    let s = host();
    let fake = Shared::default();
    let max = Duration::from_secs(5);
    // No policy: the worker's own watchdog stays unarmed (its passes are work in flight at
    // real times, against the loop's virtual ones).
    let (mut b, mut rx) = backend(&fake, max);
    fake.hold();
    let t = later(block_on(b.suspend(&s, 7, None, None)));
    assert!(fake.wait_blocked());
    let (since, pid) = b.worker.busy().expect("a call in flight");
    assert_eq!(pid, 7);
    // Three seconds of the loop while the call blocks, one tick every 10 ms.
    let mut beats = Vec::new();
    let end = since + 3_000 * MS;
    for now in (since..=end).step_by(10 * MS as usize) {
        let before = b.beats;
        assert!(b.upkeep(&s, now).is_empty(), "nothing to report at {now}");
        if b.beats > before {
            beats.push(now);
        }
    }
    assert!(beats.len() >= 12, "{beats:?}");
    let lease = max.as_nanos() as u64;
    assert!(longest_silence(since, &beats, end) <= 250 * MS, "{beats:?}");
    assert!(
        longest_silence(since, &beats, end) < lease,
        "the lease would fire"
    );
    // Other work meanwhile: more acts are taken (queued behind the call), other processes
    // classed, the status read; nothing waits on the driver.
    let t2 = later(block_on(b.resume(&s, 7, None)));
    block_on(b.classed(&s, 8, Class::Online)).unwrap();
    assert!(b.timeslices().is_empty());
    assert!(drain(&mut rx).is_empty(), "the call is still in flight");
    fake.release();
    assert_eq!(done(next(&mut rx), t).unwrap().done(), vec![0x20, 0x30]);
    assert_eq!(done(next(&mut rx), t2).unwrap().done(), vec![0x20, 0x30]);
    block_on(Box::new(b).shutdown());
}

/// A call that stays in the driver past `max_suspend` is wedged: the beats stop (said once),
/// so the guardian's lease runs out and it resumes what it holds. They start again once the
/// call returns.
#[test]
fn a_wedged_rm_call_stops_the_heartbeat_so_the_guardian_acts() {
    let s = host();
    let fake = Shared::default();
    let max = Duration::from_secs(1);
    let lease = 1_000 * MS; // max(max_suspend, 0.5 s)
    let (mut b, mut rx) = backend(&fake, max); // no policy: as above
    fake.hold();
    let t = later(block_on(b.suspend(&s, 7, None, None)));
    assert!(fake.wait_blocked());
    let (since, _) = b.worker.busy().expect("a call in flight");
    let mut beats = Vec::new();
    let mut said = Vec::new();
    let end = since + 3_000 * MS;
    for now in (since..=end).step_by(10 * MS as usize) {
        let before = b.beats;
        said.extend(b.upkeep(&s, now));
        if b.beats > before {
            beats.push(now);
        }
    }
    assert!(!beats.is_empty(), "slow at first: beats");
    assert!(
        beats.iter().all(|&t| t < since + lease),
        "no beat once the call is max_suspend old: {beats:?}"
    );
    assert!(
        longest_silence(since, &beats, end) >= lease,
        "the lease runs out"
    );
    match said.as_slice() {
        [Notice::Problem { pid: 7, text }] => {
            assert!(text.contains("heartbeats stop"), "{text}")
        }
        other => panic!("said once: {other:?}"),
    }
    fake.release();
    assert!(done(next(&mut rx), t).is_ok());
    sync(&b);
    let before = b.beats;
    b.upkeep(&s, end + 10 * MS);
    assert_eq!(b.beats, before + 1, "beating again once the call returned");
    block_on(Box::new(b).shutdown());
}

/// Acts on one process are served in the order asked: a resume asked while its pause is still
/// in the driver runs after it, and resumes what that pause paused.
#[test]
fn pause_then_resume_of_one_process_stay_in_order() {
    let s = host();
    let fake = Shared::default();
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    fake.hold();
    let pause = later(block_on(b.suspend(&s, 7, Some(vec![0x20]), None)));
    assert!(fake.wait_blocked());
    let resume = later(block_on(b.resume(&s, 7, None)));
    let again = later(block_on(b.suspend(&s, 7, Some(vec![0x20]), None)));
    fake.release();
    assert_eq!(done(next(&mut rx), pause).unwrap().done(), vec![0x20]);
    assert_eq!(done(next(&mut rx), resume).unwrap().done(), vec![0x20]);
    assert_eq!(done(next(&mut rx), again).unwrap().done(), vec![0x20]);
    let ch = vec![0x21, 0x22];
    assert_eq!(
        fake.with(|f| f.calls.clone()),
        vec![(ch.clone(), true), (ch.clone(), false), (ch, true)]
    );
    block_on(Box::new(b).shutdown());
}

/// Shutdown while a pause is in the driver: it waits for that call, then puts the timeslice
/// back and resumes; an act still queued behind the call is answered, not done.
#[test]
fn shutdown_with_a_call_in_flight_still_restores_and_resumes() {
    let s = host();
    let fake = Shared::default();
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&Policy::default());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    sync(&b);
    assert_eq!(fake.with(|f| f.timeslices[&0x20]), 200);
    fake.hold();
    let pause = later(block_on(b.suspend(&s, 7, None, None)));
    assert!(fake.wait_blocked());
    let queued = later(block_on(b.suspend(&s, 7, None, None)));
    let releaser = {
        let fake = fake.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fake.release();
        })
    };
    let reports = block_on(Box::new(b).shutdown());
    releaser.join().unwrap();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].done(), vec![0x20, 0x30]);
    let arrived = drain(&mut rx);
    let results: Vec<_> = arrived
        .into_iter()
        .filter_map(|a| match a {
            Arrival::Done { ticket, result } => Some((ticket, result.map(|r| r.done()))),
            _ => None,
        })
        .collect();
    assert_eq!(results[0], (pause, Ok(vec![0x20, 0x30])));
    assert!(
        matches!(&results[1], (t, Err(e)) if *t == queued && e.to_string().contains("stopping")),
        "{results:?}"
    );
    let ch = vec![0x21, 0x22, 0x30];
    assert_eq!(
        fake.with(|f| f.calls.clone()),
        vec![(ch.clone(), true), (ch, false)],
        "the pause, then the undo's resume"
    );
    assert_eq!(fake.with(|f| f.timeslices[&0x20]), 2048, "original back");
}

/// A call that never returns does not hold the controller's exit: past its bound shutdown
/// gives up (the guardian undoes what it holds), and the thread still undoes everything if the
/// call returns after all.
#[test]
fn shutdown_gives_up_on_a_wedged_call_after_its_bound() {
    let s = host();
    let fake = Shared::default();
    let (mut b, _rx) = backend(&fake, Duration::from_secs(60));
    b.shutdown_wait = Duration::from_millis(100);
    fake.hold();
    let _ = later(block_on(b.suspend(&s, 7, None, None)));
    assert!(fake.wait_blocked());
    assert!(block_on(Box::new(b).shutdown()).is_empty());
    fake.release();
    let end = std::time::Instant::now() + WAIT;
    while fake.with(|f| f.calls.len()) < 2 {
        assert!(std::time::Instant::now() < end, "no undo");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!fake.with(|f| f.calls[1].1), "resumed");
}

fn dynamic_policy() -> Policy {
    let mut p = Policy::default();
    p.levers.lever = crate::policy::Lever::Dynamic;
    p
}

/// One engine decision through the backend, answered by the worker.
fn policy_act(
    b: &mut NvBackend<Shared>,
    rx: &mut UnboundedReceiver<Arrival>,
    s: &crate::observe::model::State,
    suspend: bool,
) -> (crate::outcome::OpReport, Vec<Notice>) {
    let t = if suspend {
        later(block_on(b.policy_suspend(s, 7, Some(vec![0x20]), None)))
    } else {
        later(block_on(b.resume(s, 7, Some(vec![0x20]))))
    };
    sync(b);
    let mut got = drain(rx);
    let i = got
        .iter()
        .position(|a| matches!(a, Arrival::Done { .. }))
        .expect("the act's result");
    let r = done(got.remove(i), t).unwrap();
    (r, notices(got))
}

fn ts_notice(n: &[Notice]) -> (u64, u64, u64) {
    match n {
        [Notice::Timeslice { change, .. }] => {
            assert!(
                change.issued_ns > 0 && change.returned_ns >= change.issued_ns,
                "timed: {change:?}"
            );
            (change.from_us, change.to_us, change.original_us)
        }
        other => panic!("one timeslice change: {other:?}"),
    }
}

/// `dynamic`: nothing at classification; each engine suspend is the short timeslice (no pause,
/// no FIFO call), each resume the original; the original is read once; an operator's suspend
/// still pauses.
#[test]
fn the_dynamic_lever_shortens_the_timeslice_per_episode_only() {
    let s = host();
    let fake = Shared::default();
    fake.with(|f| {
        f.timeslices.insert(0x20, 1024);
    });
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&dynamic_policy());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    assert!(b.upkeep(&s, LEVER_RECHECK_NS).is_empty());
    sync(&b);
    assert!(drain(&mut rx).is_empty(), "nothing between episodes");
    assert!(fake.with(|f| f.ts_calls.is_empty()));
    for _episode in 0..3 {
        let (r, n) = policy_act(&mut b, &mut rx, &s, true);
        assert_eq!((r.done(), r.effect.timeslice_us()), (vec![0x20], Some(200)));
        assert!(r.returned_ns >= r.issued_ns);
        assert_eq!(ts_notice(&n), (1024, 200, 1024));
        assert_eq!(b.timeslices(), vec![(7, 0x20, 1024, 200)]);
        let (r, n) = policy_act(&mut b, &mut rx, &s, false);
        assert_eq!((r.done(), r.effect.timeslice_us()), (vec![0x20], Some(0)));
        assert_eq!(ts_notice(&n), (200, 1024, 1024));
        assert!(b.timeslices().is_empty());
        assert_eq!(fake.with(|f| f.timeslices[&0x20]), 1024);
    }
    assert!(fake.with(|f| f.calls.is_empty()), "never paused");
    assert_eq!(fake.with(|f| f.ts_gets.clone()), vec![0x20], "read once");
    // An operator's suspend is a pause whatever the lever.
    let t = later(block_on(b.suspend(&s, 7, Some(vec![0x20]), None)));
    let r = done(next(&mut rx), t).unwrap();
    assert_eq!((r.done(), r.effect.timeslice_us()), (vec![0x20], None));
    assert_eq!(fake.with(|f| f.calls.len()), 1);
    block_on(Box::new(b).shutdown());
}

/// Every way out of an episode puts the original back: shutdown, a class change, a reload to
/// another lever (but a static timeslice keeps the short value), the tuner's lever change;
/// an exited process is simply forgotten (its TSGs went with it).
#[test]
fn the_dynamic_lever_is_undone_on_every_exit_path() {
    let s = host();
    let original = |fake: &Shared| fake.with(|f| f.timeslices[&0x20]);
    let episode = || {
        let fake = Shared::default();
        let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
        b.set_policy(&dynamic_policy());
        block_on(b.classed(&s, 7, Class::Offline)).unwrap();
        let (r, _) = policy_act(&mut b, &mut rx, &s, true);
        assert_eq!(r.effect.timeslice_us(), Some(200));
        assert_eq!(original(&fake), 200);
        (fake, b, rx)
    };

    // Shutdown mid-episode.
    let (fake, b, _rx) = episode();
    block_on(Box::new(b).shutdown());
    assert_eq!(original(&fake), 2048, "shutdown");

    // Class change mid-episode; the engine's resume after it finds nothing to undo.
    let (fake, mut b, mut rx) = episode();
    block_on(b.classed(&s, 7, Class::Online)).unwrap();
    sync(&b);
    assert_eq!(ts_notice(&notices(drain(&mut rx))), (200, 2048, 2048));
    assert_eq!(original(&fake), 2048, "class change");
    let (r, n) = policy_act(&mut b, &mut rx, &s, false);
    assert!(n.is_empty(), "{n:?}");
    assert_eq!(r.done(), vec![0x20]);
    block_on(Box::new(b).shutdown());
    assert_eq!(original(&fake), 2048);

    // Reload to `pause` or `none` mid-episode: back; to `timeslice`: it stays short, now for
    // good, and the engine's resume leaves it so.
    for (lever, after) in [
        (crate::policy::Lever::Pause, 2048),
        (crate::policy::Lever::None, 2048),
        (crate::policy::Lever::Timeslice, 200),
    ] {
        let (fake, mut b, mut rx) = episode();
        let mut p = Policy::default();
        p.levers.lever = lever;
        b.set_policy(&p);
        sync(&b);
        drain(&mut rx);
        assert_eq!(original(&fake), after, "reload to {lever}");
        let (_, n) = policy_act(&mut b, &mut rx, &s, false);
        assert!(n.is_empty(), "{lever}: {n:?}");
        assert_eq!(original(&fake), after, "{lever}: the resume");
        block_on(Box::new(b).shutdown());
        assert_eq!(original(&fake), 2048, "{lever}: exit");
    }

    // The tuner moves the GPU to `none` mid-episode: back.
    let (fake, mut b, mut rx) = episode();
    let gpu = s.procs[&7].queues[&0x20].gpu_id;
    b.set_gpu_levers(&[(gpu, crate::policy::Lever::None)].into());
    sync(&b);
    let n = notices(drain(&mut rx));
    assert_eq!(ts_notice(&n), (200, 2048, 2048));
    assert!(
        matches!(&n[0], Notice::Timeslice { why, .. } if why.contains("lever tuner: dynamic -> none")),
        "{n:?}"
    );
    // Under `none` an engine suspend (were one made) is no timeslice either: a pause.
    block_on(Box::new(b).shutdown());

    // Process exit: forgotten, nothing left to restore at shutdown.
    let (fake2, mut b, _rx) = episode();
    b.forget(7);
    sync(&b);
    assert!(b.timeslices().is_empty());
    let before = fake2.with(|f| f.ts_calls.len());
    block_on(Box::new(b).shutdown());
    assert_eq!(
        fake2.with(|f| f.ts_calls.len()),
        before,
        "no call for a gone process"
    );
    assert_eq!(original(&fake), 2048);
}

/// A driver that refuses SET_TIMESLICE: the engine's suspend becomes a pause at once (the
/// engine is told, as under the static lever), and later ones are pauses without a retry.
#[test]
fn a_refused_dynamic_timeslice_pauses_instead() {
    let s = host();
    let fake = Shared::default();
    fake.with(|f| f.ts_fail = true);
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&dynamic_policy());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    let (r, n) = policy_act(&mut b, &mut rx, &s, true);
    assert_eq!(
        (r.done(), r.effect.timeslice_us()),
        (vec![0x20], None),
        "paused"
    );
    assert!(
        matches!(&n[..], [Notice::LeverFailed { pid: 7, text }] if text.contains("NV_ERR_NOT_SUPPORTED")),
        "{n:?}"
    );
    let (r, n) = policy_act(&mut b, &mut rx, &s, false);
    assert_eq!(
        (r.done(), r.effect.timeslice_us()),
        (vec![0x20], None),
        "resumed"
    );
    assert!(n.is_empty());
    let (r, n) = policy_act(&mut b, &mut rx, &s, true);
    assert_eq!(r.effect.timeslice_us(), None);
    assert!(n.is_empty(), "not retried: {n:?}");
    assert_eq!(
        fake.with(|f| f.calls.iter().map(|c| c.1).collect::<Vec<_>>()),
        vec![true, false, true]
    );
    block_on(Box::new(b).shutdown());
}

/// The lever tuner's per-GPU choice reaches the worker in order with the acts, over the
/// policy's lever: static -> dynamic puts the original back (the episodes shorten it again),
/// dynamic -> static keeps it short from the next re-check, an empty map returns to the
/// policy's lever, `none` puts it back.
#[test]
fn the_tuners_lever_per_gpu_reaches_the_worker() {
    use crate::policy::Lever;
    let s = host();
    let gpu = s.procs[&7].queues[&0x20].gpu_id;
    let fake = Shared::default();
    let current = |fake: &Shared| fake.with(|f| f.timeslices[&0x20]);
    let (mut b, mut rx) = backend(&fake, Duration::from_secs(60));
    b.set_policy(&Policy::default()); // lever = "timeslice"
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    sync(&b);
    drain(&mut rx);
    assert_eq!(current(&fake), 200, "the policy's static lever");
    let levers = |l: Option<Lever>| l.map(|l| (gpu, l)).into_iter().collect();

    b.set_gpu_levers(&levers(Some(Lever::Dynamic)));
    sync(&b);
    let n = notices(drain(&mut rx));
    assert_eq!(ts_notice(&n), (200, 2048, 2048));
    assert!(
        matches!(&n[0], Notice::Timeslice { why, .. } if why == "lever tuner: timeslice -> dynamic"),
        "{n:?}"
    );
    assert!(b.upkeep(&s, LEVER_RECHECK_NS).is_empty());
    sync(&b);
    assert!(
        drain(&mut rx).is_empty(),
        "no static re-check under dynamic"
    );
    let (r, _) = policy_act(&mut b, &mut rx, &s, true);
    assert_eq!(r.effect.timeslice_us(), Some(200));
    assert_eq!(current(&fake), 200);

    // Mid-episode to the static lever: stays short, now for good.
    b.set_gpu_levers(&levers(Some(Lever::Timeslice)));
    sync(&b);
    assert!(drain(&mut rx).is_empty());
    let (_, n) = policy_act(&mut b, &mut rx, &s, false);
    assert!(
        n.is_empty(),
        "the episode's end keeps the static value: {n:?}"
    );
    assert_eq!(current(&fake), 200);

    // Back to the policy's lever (timeslice too): nothing changes. Then `none`: back.
    b.set_gpu_levers(&levers(None));
    b.upkeep(&s, 3 * LEVER_RECHECK_NS);
    sync(&b);
    assert!(drain(&mut rx).is_empty());
    b.set_gpu_levers(&levers(Some(Lever::None)));
    sync(&b);
    assert_eq!(ts_notice(&notices(drain(&mut rx))), (200, 2048, 2048));
    assert_eq!(current(&fake), 2048);
    // Under `none` nothing is re-applied.
    b.upkeep(&s, 5 * LEVER_RECHECK_NS);
    sync(&b);
    assert!(drain(&mut rx).is_empty());
    // (The episode's resume under the static lever was an enable of running channels.)
    assert!(fake.with(|f| f.calls.iter().all(|c| !c.1)), "never paused");
    block_on(Box::new(b).shutdown());
    assert_eq!(current(&fake), 2048);
}
