//! The emulated workloads' sync entry point, on a fake queue over plain memory.
use super::*;

/// An AqlQueue over plain memory (no device): the test plays the GPU by moving its read index.
fn fake_queue() -> AqlQueue {
    AqlQueue {
        fd: File::open("/dev/null").unwrap(),
        gpu_id: 0,
        queue_id: 0,
        doorbell_offset: 0,
        queue: Mapping::new(4096).unwrap(),
        ring: Mapping::new(4096).unwrap(),
        slots: 1,
        handles: Vec::new(),
        _eop: Mapping::new(4096).unwrap(),
        _ctx: Mapping::new(4096).unwrap(),
    }
}

fn stream(q: &AqlQueue) -> *mut c_void {
    q as *const AqlQueue as *mut c_void
}

#[test]
fn synchronize_waits_for_what_was_submitted() {
    let q = fake_queue();
    q.field(amd_queue::WRITE_DISPATCH_ID)
        .store(3, Ordering::Release);
    let read = q.field(amd_queue::READ_DISPATCH_ID);
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let rc = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            read.store(2, Ordering::Release);
            std::thread::sleep(Duration::from_millis(20));
            read.store(3, Ordering::Release);
        });
        // SAFETY: `q` is a live AqlQueue for the call.
        with_stop(&stop, || unsafe { hipStreamSynchronize(stream(&q)) })
    });
    assert_eq!(rc, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(40),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(q.read_index(), 3);
}

#[test]
fn synchronize_gives_up_when_the_workload_stops() {
    let q = fake_queue();
    q.field(amd_queue::WRITE_DISPATCH_ID)
        .store(1, Ordering::Release);
    let stop = AtomicBool::new(false);
    let rc = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::Relaxed);
        });
        // SAFETY: `q` is a live AqlQueue for the call.
        with_stop(&stop, || unsafe { hipStreamSynchronize(stream(&q)) })
    });
    assert_eq!(rc, HIP_ERROR_STOPPED);
    assert_eq!(q.read_index(), 0, "gave up with the work still pending");
}

#[test]
fn synchronize_of_an_idle_or_null_stream() {
    let q = fake_queue();
    // Nothing submitted: returns at once, with or without a workload's flag.
    // SAFETY: `q` is a live AqlQueue; null is rejected before any dereference.
    unsafe {
        assert_eq!(hipStreamSynchronize(stream(&q)), 0);
        assert_eq!(hipStreamSynchronize(std::ptr::null_mut()), 1);
    }
    assert!(synchronize(&q));
}

#[test]
fn with_stop_nests_and_restores() {
    let current = || STOP.with(Cell::get);
    let (a, b) = (AtomicBool::new(false), AtomicBool::new(false));
    assert!(current().is_null());
    with_stop(&a, || {
        assert_eq!(current(), &a as *const AtomicBool);
        with_stop(&b, || assert_eq!(current(), &b as *const AtomicBool));
        assert_eq!(current(), &a as *const AtomicBool);
    });
    assert!(current().is_null());
    // Restored on unwinding too: a panicking workload leaves no dangling flag behind.
    let r = std::panic::catch_unwind(|| with_stop(&a, || panic!("workload")));
    assert!(r.is_err());
    assert!(current().is_null());
    // Per thread: another thread's flag is not this one's.
    with_stop(&a, || {
        std::thread::scope(|s| {
            s.spawn(|| assert!(STOP.with(Cell::get).is_null()));
        })
    });
}
