use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    rc::Rc,
};

use tokio::sync::mpsc::unbounded_channel;

use super::*;
use crate::{
    backend::{Acted, Backend, BoxFut},
    observe::model::Vendor,
    outcome::{Effect, QueueResult},
};

const GPU: u32 = 0x1002;

/// What the fake driver holds suspended: pid -> queues.
type Driver = Rc<RefCell<BTreeMap<u32, BTreeSet<u32>>>>;

/// An in-memory backend that acts at once: every queue asked for is done.
struct Fake(Driver);

fn report(pid: u32, queues: impl IntoIterator<Item = u32>) -> OpReport {
    OpReport {
        pid,
        ret: Some(0),
        queues: queues
            .into_iter()
            .map(|queue_id| QueueResult {
                queue_id,
                gpu_id: Some(GPU),
                outcome: QueueOutcome::Done,
            })
            .collect(),
        issued_ns: 1,
        returned_ns: 2,
        effect: Effect::Paused,
    }
}

impl Backend for Fake {
    fn vendor(&self) -> Vendor {
        Vendor::Amd
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
        queues: Option<Vec<u32>>,
        _: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        let qs = queues.unwrap_or_default();
        self.0.borrow_mut().entry(pid).or_default().extend(&qs);
        Box::pin(async move { Acted::Now(Ok(report(pid, qs))) })
    }
    fn resume<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted> {
        let mut d = self.0.borrow_mut();
        let held = d.entry(pid).or_default();
        let qs: Vec<u32> = match queues {
            Some(q) => q.into_iter().filter(|q| held.remove(q)).collect(),
            None => std::mem::take(held).into_iter().collect(),
        };
        Box::pin(async move { Acted::Now(Ok(report(pid, qs))) })
    }
    fn forget(&mut self, _: u32) {}
    fn upkeep(&mut self, _: &State, _: u64) -> Vec<Notice> {
        Vec::new()
    }
    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        let all = std::mem::take(&mut *self.0.borrow_mut());
        let reports = all
            .into_iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(pid, q)| report(pid, q))
            .collect();
        Box::pin(async move { reports })
    }
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_held_set_follows_acts_and_notices_and_shutdown_resumes_the_rest() {
    let dir = Dir(std::env::temp_dir().join(format!("gp-hold-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let driver = Driver::default();
    let (tx, arrivals) = unbounded_channel();
    let backends = Backends {
        list: vec![Box::new(Fake(driver.clone()))],
        arrivals,
    };
    let mut h = Holder::new(Lock::acquire(&dir.0).unwrap(), backends, "suspend");
    let state = State::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        h.classed(&state, 10, Class::Offline).await.unwrap();
        // A suspend's queues enter the held set, and the status says so.
        h.suspend(&state, 10, Some(vec![1, 2]), None).await.unwrap();
        h.suspend(&state, 11, Some(vec![0]), None).await.unwrap();
        let want = vec![(10, 1, Some(GPU)), (10, 2, Some(GPU)), (11, 0, Some(GPU))];
        assert_eq!(h.held(), want);
        let published = daemon::read_status(&dir.0).unwrap();
        assert_eq!(published.held, want);
        assert_eq!(published.mode, "suspend");
        // The control thread resumed queue 1 on its own (the watchdog, say): it is let go.
        driver.borrow_mut().entry(10).or_default().remove(&1);
        tx.send(Arrival::Notice(Notice::Acted {
            report: report(10, [1]),
            suspend: false,
            why: "watchdog".into(),
        }))
        .unwrap();
        assert!(matches!(
            h.next().await,
            Next::Arrival(Arrival::Notice(Notice::Acted { .. }))
        ));
        let want = vec![(10, 2, Some(GPU)), (11, 0, Some(GPU))];
        assert_eq!(h.held(), want);
        assert_eq!(daemon::read_status(&dir.0).unwrap().held, want);
        // A status request answers exactly what is held.
        let ans = h.answer(&state, Request::Status).await;
        assert!(ans.acted.is_none());
        assert_eq!(ans.response.status.unwrap().held, want);
        // A resume through a request lets go of its queues.
        let ans = h
            .answer(
                &state,
                Request::Resume {
                    pid: 11,
                    queues: None,
                },
            )
            .await;
        assert_eq!(
            ans.acted.map(|(r, s)| (r.done(), s)),
            Some((vec![0], false))
        );
        assert_eq!(h.held(), vec![(10, 2, Some(GPU))]);
        // Shutdown resumes what is still held, and says so.
        let reports = h.shutdown().await;
        assert_eq!(reports, vec![report(10, [2])]);
        assert!(h.held().is_empty());
        assert!(h.status().held.is_empty());
        assert!(driver.borrow().is_empty(), "nothing left suspended");
    });
}

#[test]
fn a_target_gone_takes_its_queues_out_of_the_held_set() {
    let dir = Dir(std::env::temp_dir().join(format!("gp-hold-gone-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let lock = Lock::acquire(&dir.0).unwrap();
    let mut h = Holder::new(lock, Backends::of(Vec::new()), "top");
    h.noticed(&Notice::Acted {
        report: report(7, [0, 3]),
        suspend: true,
        why: "new queues of a process held whole".into(),
    });
    h.noticed(&Notice::Acted {
        report: report(8, [1]),
        suspend: true,
        why: "new queues".into(),
    });
    h.noticed(&Notice::TargetGone {
        pid: 7,
        start_time: 1,
    });
    assert_eq!(h.held(), vec![(8, 1, Some(GPU))]);
    assert_eq!(daemon::read_status(&dir.0).unwrap().held, h.held());
}
