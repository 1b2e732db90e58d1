//! The seam with fake vendors: routing, the NVIDIA backend's watchdog, back-off and levers.
/// Offline: the short timeslice at classification, notices for the audit; back to the
/// original on a class change; a refusing driver makes the policy pause instead.
#[test]
fn the_nvidia_backend_applies_and_restores_the_timeslice_lever() {
    let s = host();
    let mut fake = Fake::default();
    {
        let mut b = NvBackend::with(NvControl::unguarded(&mut fake), Duration::from_secs(1));
        b.set_policy(&Policy::default());
        block_on(b.classed(&s, 7, Class::Offline)).unwrap();
        let n = b.upkeep(&s, 1);
        assert!(
            matches!(&n[..], [Notice::Timeslice { change, .. }]
                if change.tsg == 0x20 && change.to_us == 200 && change.from_us == 2048),
            "{n:?}"
        );
        assert_eq!(b.timeslices(), vec![(7, 0x20, 2048, 200)]);
        block_on(b.classed(&s, 7, Class::Online)).unwrap();
        let n = b.upkeep(&s, 2);
        assert!(
            matches!(&n[..], [Notice::Timeslice { change, .. }] if change.to_us == 2048),
            "{n:?}"
        );
        assert!(b.timeslices().is_empty());
    }
    assert_eq!(fake.timeslices[&0x20], 2048);
    // The pause lever changes no timeslice.
    let mut fake = Fake::default();
    let mut b = NvBackend::with(NvControl::unguarded(&mut fake), Duration::from_secs(1));
    let mut p = Policy::default();
    p.nvidia.lever = crate::policy::NvLever::Pause;
    b.set_policy(&p);
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    assert!(b.upkeep(&s, 1).is_empty());
    drop(b);
    assert!(fake.ts_calls.is_empty());
    // A refusing driver: the lever fails once, with the reason.
    let mut fake = Fake {
        ts_fail: true,
        ..Default::default()
    };
    let mut b = NvBackend::with(NvControl::unguarded(&mut fake), Duration::from_secs(1));
    b.set_policy(&Policy::default());
    block_on(b.classed(&s, 7, Class::Offline)).unwrap();
    let n = b.upkeep(&s, LEVER_RECHECK_NS * 2);
    assert!(
        matches!(&n[..], [Notice::LeverFailed { pid: 7, text }] if text.contains("NV_ERR_NOT_SUPPORTED")),
        "{n:?}"
    );
    assert!(
        b.upkeep(&s, LEVER_RECHECK_NS * 4).is_empty(),
        "not retried at every check"
    );
}

use super::*;
use crate::nv::controller::tests::{host, Fake};

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Records which vendor was asked to act.
struct Probe(
    Vendor,
    std::rc::Rc<std::cell::RefCell<Vec<(Vendor, u32, bool)>>>,
);

impl Backend for Probe {
    fn vendor(&self) -> Vendor {
        self.0
    }
    fn classed<'a>(
        &'a mut self,
        _: &'a State,
        _: u32,
        _: Class,
    ) -> BoxFut<'a, Result<(), ActError>> {
        Box::pin(async { Ok(()) })
    }
    fn suspend<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        _: Option<Vec<u32>>,
        _: Option<u32>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        self.1.borrow_mut().push((self.0, pid, true));
        Box::pin(async move {
            Ok(OpReport {
                pid,
                ret: None,
                queues: vec![],
                issued_ns: 0,
                returned_ns: 0,
            })
        })
    }
    fn resume<'a>(
        &'a mut self,
        s: &'a State,
        pid: u32,
        q: Option<Vec<u32>>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        self.1.borrow_mut().push((self.0, pid, false));
        self.suspend(s, pid, q, None)
    }
    fn forget(&mut self, _: u32) {}
    fn upkeep(&mut self, _: &State, _: u64) -> Vec<Notice> {
        Vec::new()
    }
    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        Box::pin(async { Vec::new() })
    }
}

#[test]
fn a_process_is_acted_on_by_the_backend_of_its_queues() {
    let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut b = Backends {
        list: vec![
            Box::new(Probe(Vendor::Amd, log.clone())),
            Box::new(Probe(Vendor::Nvidia, log.clone())),
        ],
        notices: None,
    };
    let s = host(); // pid 7 owns NVIDIA TSGs
    block_on(async {
        b.for_pid(&s, 7)
            .unwrap()
            .suspend(&s, 7, None, None)
            .await
            .unwrap();
        // Unknown to the model: KFD can seize any process.
        b.for_pid(&s, 99)
            .unwrap()
            .resume(&s, 99, None)
            .await
            .unwrap();
    });
    assert_eq!(
        *log.borrow(),
        vec![
            (Vendor::Nvidia, 7, true),
            (Vendor::Amd, 99, false),
            (Vendor::Amd, 99, true)
        ]
    );
    // An NVIDIA-only host has no AMD backend: a process without queues is refused plainly.
    b.list.remove(0);
    let e = b.for_pid(&s, 99).err().unwrap();
    assert_eq!(e, ActError::NoDriver(Vendor::Amd));
    assert!(
        e.to_string()
            .contains("no AMD (KFD) GPU driver on this host"),
        "{e}"
    );
    b.list.clear();
    assert_eq!(b.for_pid(&s, 7).err().unwrap(), ActError::DryRun);
}

#[test]
fn nvidia_watchdog_resumes_what_stays_paused_past_max_suspend() {
    let s = host();
    let mut fake = Fake::default();
    let mut b = NvBackend::with(
        NvControl::unguarded(&mut fake),
        Duration::from_nanos(5_000_000),
    );
    let r = block_on(b.suspend(&s, 7, None, None)).unwrap();
    // None: every live TSG of the process (compute 0x20 and copy 0x30, which has no
    // channel seen: the TSG handle stands for it).
    assert_eq!(r.done(), vec![0x20, 0x30]);
    assert!(
        b.upkeep(&s, r.returned_ns + 1_000_000).is_empty(),
        "not yet"
    );
    let n = b.upkeep(&s, r.returned_ns + 6_000_000);
    match n.as_slice() {
        [Notice::Acted {
            report,
            suspend: false,
            why,
        }] => {
            assert_eq!(report.done(), vec![0x20, 0x30]);
            assert!(why.contains("watchdog"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(b.upkeep(&s, u64::MAX).is_empty(), "resumed once");
    // Resume of "everything" after that is a no-op report.
    let r = block_on(b.resume(&s, 7, None)).unwrap();
    assert!(r
        .queues
        .iter()
        .all(|q| q.outcome != crate::outcome::QueueOutcome::Done));
    drop(b);
    assert_eq!(fake.calls.len(), 2, "{:?}", fake.calls);
    assert!(!fake.calls[1].1, "the second call resumes");
}

/// A driver that refuses a pause is not asked again until the back-off delay has passed.
#[test]
fn a_failed_nvidia_pause_backs_off() {
    let s = host();
    let mut fake = Fake {
        fail: true,
        ..Fake::default()
    };
    let mut b = NvBackend::with(
        NvControl::unguarded(&mut fake),
        Duration::from_nanos(5_000_000),
    );
    let e = block_on(b.suspend(&s, 7, None, None)).unwrap_err();
    assert!(
        matches!(&e, ActError::Driver(t) if t.contains("NV_ERR_NOT_SUPPORTED")),
        "{e}"
    );
    let e = block_on(b.suspend(&s, 7, None, None)).unwrap_err();
    assert!(matches!(e, ActError::BackingOff { .. }), "{e}");
    assert!(
        e.to_string().contains("backing off after a failed pause"),
        "{e}"
    );
    let (until, next) = b.backoff[&7];
    assert_eq!(next, 2 * BACKOFF_MIN_NS, "the delay doubles");
    // Once the delay has passed, it tries again (and fails again: a longer delay).
    b.backoff.insert(7, (0, next));
    let e = block_on(b.suspend(&s, 7, None, None)).unwrap_err();
    assert!(e.to_string().contains("NV_ERR_NOT_SUPPORTED"), "{e}");
    assert!(b.backoff[&7].0 > until);
    assert_eq!(b.backoff[&7].1, 4 * BACKOFF_MIN_NS);
    b.forget(7);
    assert!(b.backoff.is_empty());
}
