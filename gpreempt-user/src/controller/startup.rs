//! Before the loop: every backend's self-test, repeated with a backoff while the host is too
//! busy for it to conclude ([`HostBusy`]), so `run` started into a busy host waits instead of
//! exiting (and, under systemd's `Restart=`, looping).

use std::time::Duration;

use anyhow::Result;

use crate::{
    backend::{Backends, HostBusy},
    clock::monotonic_ns,
    controller::{
        notify::{Message, Notifier},
        run_loop::Signals,
    },
    observe::watch::Watcher,
    outcome::Notice,
};

/// Each backend proves it can suspend and resume here before anything relies on it; on a
/// failure every backend is shut down (nothing is left changed). A backend that could not tell
/// because the host was busy ([`HostBusy`]) is tried again after a backoff (1 s, doubling to
/// [`BUSY_BACKOFF_MAX`]) for as long as it stays busy, the events drained and the leases kept
/// meanwhile; SIGINT or SIGTERM end the wait.
pub async fn self_test(
    backends: &mut Backends,
    w: &mut Watcher,
    sig: &mut Signals,
    notify: &mut Notifier,
) -> Result<()> {
    let mut failed = None;
    for i in 0..backends.list.len() {
        let mut backoff = Duration::from_secs(1);
        loop {
            let b = &mut backends.list[i];
            match b.self_test(w).await {
                Ok(Some(line)) => eprintln!("{line}"),
                Ok(None) => {}
                Err(e) if e.downcast_ref::<HostBusy>().is_some() => {
                    log::warn!(
                        "{} self-test inconclusive, trying again in {} s: {e:#}",
                        b.vendor(),
                        backoff.as_secs()
                    );
                    // Under systemd the start may take this long and more: the wait must not
                    // run into TimeoutStartSec= while the host is busy.
                    notify.send(&Message::ExtendTimeout {
                        by: backoff + EXTEND_MARGIN,
                    });
                    if let Err(e) = busy_wait(backends, w, sig, backoff).await {
                        failed = Some(e);
                        break;
                    }
                    backoff = (backoff * 2).min(BUSY_BACKOFF_MAX);
                    continue;
                }
                Err(e) => failed = Some(crate::backend::refuse(b.vendor(), e)),
            }
            break;
        }
        if failed.is_some() {
            break;
        }
    }
    match failed {
        Some(e) => {
            backends.shutdown().await;
            Err(e)
        }
        None => Ok(()),
    }
}

/// Beyond a wait, what systemd grants the self-test that follows it.
const EXTEND_MARGIN: Duration = Duration::from_secs(60);

/// The longest wait between self-tests on a busy host.
pub const BUSY_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Waits `d` between self-tests: events drained, every backend's upkeep (its lease) kept; Err on
/// SIGINT or SIGTERM.
async fn busy_wait(
    backends: &mut Backends,
    w: &mut Watcher,
    sig: &mut Signals,
    d: Duration,
) -> Result<()> {
    let until = tokio::time::Instant::now() + d;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => return Ok(()),
            _ = sig.int.recv() => anyhow::bail!("interrupted while waiting to repeat the self-test"),
            _ = sig.term.recv() => anyhow::bail!("terminated while waiting to repeat the self-test"),
            r = w.pump() => r?,
            _ = tick.tick() => {
                let now = monotonic_ns();
                for b in &mut backends.list {
                    for n in b.upkeep(&w.state, now) {
                        if let Notice::Problem { text, .. } = n {
                            log::warn!("{text}");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        backend::{ActError, Acted, Backend, BoxFut},
        observe::model::{State, Vendor},
        outcome::OpReport,
        policy::Class,
    };

    /// A backend whose self-test is inconclusive `busy` times, then passes (or fails: `fail`).
    struct Flaky {
        busy: u32,
        fail: bool,
        tries: std::rc::Rc<std::cell::Cell<u32>>,
    }

    impl Backend for Flaky {
        fn vendor(&self) -> Vendor {
            Vendor::Nvidia
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
            _: u32,
            _: Option<Vec<u32>>,
            _: Option<u32>,
        ) -> BoxFut<'a, Acted> {
            Box::pin(async { Acted::Now(Err(ActError::DryRun)) })
        }
        fn resume<'a>(
            &'a mut self,
            _: &'a State,
            _: u32,
            _: Option<Vec<u32>>,
        ) -> BoxFut<'a, Acted> {
            Box::pin(async { Acted::Now(Err(ActError::DryRun)) })
        }
        fn forget(&mut self, _: u32) {}
        fn upkeep(&mut self, _: &State, _: u64) -> Vec<Notice> {
            Vec::new()
        }
        fn self_test<'a>(&'a mut self, _: &'a mut Watcher) -> BoxFut<'a, Result<Option<String>>> {
            Box::pin(async move {
                self.tries.set(self.tries.get() + 1);
                if self.tries.get() <= self.busy {
                    return Err(HostBusy("records lost".into()).into());
                }
                if self.fail {
                    anyhow::bail!("the driver refused");
                }
                Ok(Some("passed".into()))
            })
        }
        fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
            Box::pin(async { Vec::new() })
        }
    }

    fn try_with(busy: u32, fail: bool) -> (Result<()>, u32, Duration) {
        let (r, tries, waited, _) = try_notified(busy, fail);
        (r, tries, waited)
    }

    /// Also: what systemd was told, one datagram a line.
    fn try_notified(busy: u32, fail: bool) -> (Result<()>, u32, Duration, Vec<String>) {
        let sock = std::env::temp_dir().join(format!(
            "gpreempt-startup-notify-{}-{busy}-{fail}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&sock);
        let rx = std::os::unix::net::UnixDatagram::bind(&sock).expect("bind");
        rx.set_nonblocking(true).expect("nonblocking");
        let mut notify = Notifier::to(sock.to_str().expect("utf-8"), None).expect("notifier");
        let tries = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut b = Backends::of(vec![Box::new(Flaky {
            busy,
            fail,
            tries: tries.clone(),
        })]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let (r, waited) = rt.block_on(async {
            let mut w = Watcher::for_tests();
            let mut sig = Signals::new().expect("signals");
            let t0 = tokio::time::Instant::now();
            let r = self_test(&mut b, &mut w, &mut sig, &mut notify).await;
            (r, t0.elapsed())
        });
        let mut said = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = rx.recv(&mut buf) {
            said.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        let _ = std::fs::remove_file(&sock);
        (r, tries.get(), waited, said)
    }

    /// Each wait on a busy host asks systemd for more start-up time than it lasts, so a unit
    /// started into a busy host is not failed by TimeoutStartSec= meanwhile.
    #[test]
    fn a_busy_host_extends_the_start_timeout_per_wait() {
        let (r, _, _, said) = try_notified(2, false);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(
            said,
            [
                "EXTEND_TIMEOUT_USEC=61000000\n",
                "EXTEND_TIMEOUT_USEC=62000000\n"
            ]
        );
    }

    #[test]
    fn a_busy_host_is_tried_again_with_a_growing_backoff_until_the_test_concludes() {
        let (r, tries, waited) = try_with(3, false);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(tries, 4);
        // 1 + 2 + 4 s of backoff (virtual time).
        assert!(
            waited >= Duration::from_secs(7) && waited < Duration::from_secs(8),
            "{waited:?}"
        );
    }

    #[test]
    fn a_real_failure_after_a_busy_try_still_refuses_with_the_reason() {
        let (r, tries, _) = try_with(1, true);
        let e = format!("{:#}", r.expect_err("refused"));
        assert!(e.contains("refusing to control anything"), "{e}");
        assert!(e.contains("the driver refused"), "{e}");
        assert_eq!(tries, 2);
    }

    #[test]
    fn the_backoff_stops_growing_at_its_ceiling() {
        let (r, tries, waited) = try_with(8, false);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(tries, 9);
        // 1 + 2 + 4 + 8 + 16 + 30 + 30 + 30 s.
        assert!(
            waited >= Duration::from_secs(121) && waited < Duration::from_secs(122),
            "{waited:?}"
        );
    }
}
