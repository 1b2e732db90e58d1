//! The seam with fake vendors: routing by the process's queues.
use super::*;
use crate::backend::nv::controller::tests::host;
use crate::{outcome::Notice, policy::Class};
use std::future::Future;

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
    fn offers(&self) -> crate::lever::Offers {
        crate::lever::Offers::UNKNOWN
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
    ) -> BoxFut<'a, Acted> {
        self.1.borrow_mut().push((self.0, pid, true));
        Box::pin(async move {
            Acted::Now(Ok(OpReport {
                pid,
                ret: None,
                queues: vec![],
                issued_ns: 0,
                returned_ns: 0,
                effect: crate::outcome::Effect::Paused,
            }))
        })
    }
    fn resume<'a>(&'a mut self, s: &'a State, pid: u32, q: Option<Vec<u32>>) -> BoxFut<'a, Acted> {
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
    let mut b = Backends::of(vec![
        Box::new(Probe(Vendor::Amd, log.clone())),
        Box::new(Probe(Vendor::Nvidia, log.clone())),
    ]);
    let s = host(); // pid 7 owns NVIDIA TSGs
    block_on(async {
        let a = b.for_pid(&s, 7).unwrap().suspend(&s, 7, None, None).await;
        assert!(matches!(a, Acted::Now(Ok(_))), "{a:?}");
        // Unknown to the model: KFD can seize any process.
        let a = b.for_pid(&s, 99).unwrap().resume(&s, 99, None).await;
        assert!(matches!(a, Acted::Now(Ok(_))), "{a:?}");
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
