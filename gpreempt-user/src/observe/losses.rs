//! Event records the kernel could not deliver, and what the map does about it.
//!
//! A record lost in the kernel (ring buffer or in-flight map full) is a queue created or
//! destroyed that the map did not hear of. While records are being lost the watcher leans on
//! sampling: it reconciles with sysfs at [`LOSSY_RECONCILE`] until no record has been lost for
//! [`QUIET_NS`], and says so (log, `top`, status.json). Processes whose records the per-process
//! rate limit drops are named once each.

use std::{collections::HashMap, time::Duration};

/// The reconcile period while records are being lost.
pub const LOSSY_RECONCILE: Duration = Duration::from_millis(100);
/// Loss-free time after which events are trusted again.
pub const QUIET_NS: u64 = 10_000_000_000;
/// At most one loss warning this often while losses go on.
const WARN_EVERY_NS: u64 = 10_000_000_000;

/// A change of mode for the watcher to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// Records started being lost: sample faster.
    Degraded,
    /// No loss for [`QUIET_NS`]: back to the normal period.
    Recovered,
}

#[derive(Debug, Default)]
pub struct Losses {
    /// The kernel's loss counter when last looked at.
    seen: u64,
    /// Lost since the current lossy period began, and when it began.
    lossy: Option<(u64, u64)>,
    last_loss_ns: u64,
    last_warn_ns: u64,
    /// Rate-limited processes already named, with the count then.
    limited: HashMap<u32, u32>,
}

impl Losses {
    /// Takes the kernel's total of lost records at `now_ns`: a warning to log (with counts), and
    /// the change of mode.
    pub fn update(&mut self, total: u64, now_ns: u64) -> (Option<String>, Change) {
        let new = total.saturating_sub(self.seen);
        self.seen = self.seen.max(total);
        if new > 0 {
            self.last_loss_ns = now_ns;
            let (change, lost) = match self.lossy.as_mut() {
                Some((lost, _)) => {
                    *lost += new;
                    (Change::None, *lost)
                }
                None => {
                    self.lossy = Some((new, now_ns));
                    (Change::Degraded, new)
                }
            };
            let due = change == Change::Degraded
                || now_ns.saturating_sub(self.last_warn_ns) >= WARN_EVERY_NS;
            if !due {
                return (None, change);
            }
            self.last_warn_ns = now_ns;
            let text = format!(
                "{lost} event records lost in the kernel ({total} since start; ring buffer or \
                 in-flight map full): queues are reconciled from sysfs every {} ms until losses stop",
                LOSSY_RECONCILE.as_millis()
            );
            return (Some(text), change);
        }
        match self.lossy {
            Some((lost, _)) if now_ns.saturating_sub(self.last_loss_ns) >= QUIET_NS => {
                self.lossy = None;
                let text = format!(
                    "no event record lost for {} s (after {lost}): events are trusted again",
                    QUIET_NS / 1_000_000_000
                );
                (Some(text), Change::Recovered)
            }
            _ => (None, Change::None),
        }
    }

    /// The line for `top` and status.json while records are being lost.
    pub fn degraded(&self) -> Option<String> {
        self.lossy.map(|(lost, _)| {
            format!(
                "{lost} records lost: sampling sysfs every {} ms",
                LOSSY_RECONCILE.as_millis()
            )
        })
    }

    /// A process's count of rate-limited records: Some(text) the first time it is seen; `who`
    /// (a /proc read) is asked only then.
    pub fn limited(
        &mut self,
        pid: u32,
        dropped: u32,
        who: impl FnOnce() -> String,
    ) -> Option<String> {
        if self.limited.insert(pid, dropped).is_some() {
            return None;
        }
        let who = who();
        Some(format!(
            "pid {pid} ({who}) floods its GPU file: {dropped} ioctl records dropped by the \
             per-process rate limit so far; its queues are kept from sysfs"
        ))
    }

    /// Forgets an exited process (a later one may reuse its pid).
    pub fn forget(&mut self, pid: u32) {
        self.limited.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn losses_degrade_at_once_and_recover_after_a_quiet_period() {
        let mut l = Losses::default();
        assert_eq!(l.update(0, S), (None, Change::None));
        let (w, c) = l.update(500, 2 * S);
        assert_eq!(c, Change::Degraded);
        assert!(w.unwrap().starts_with("500 event records lost"));
        assert!(l.degraded().unwrap().contains("500 records lost"));
        // More losses soon after: counted, not repeated.
        assert_eq!(l.update(800, 3 * S), (None, Change::None));
        assert!(l.degraded().unwrap().contains("800 records lost"));
        // Still losing ten seconds later: one reminder with the running count.
        let (w, c) = l.update(900, 12 * S);
        assert_eq!(c, Change::None);
        assert!(w.unwrap().starts_with("900 event records lost"));
        // Quiet, but not long enough.
        assert_eq!(l.update(900, 20 * S), (None, Change::None));
        let (w, c) = l.update(900, 22 * S);
        assert_eq!(c, Change::Recovered);
        assert!(w.unwrap().contains("trusted again"));
        assert_eq!(l.degraded(), None);
        // A later loss opens a new period.
        assert_eq!(l.update(901, 30 * S).1, Change::Degraded);
    }

    #[test]
    fn a_flooding_process_is_named_once() {
        let mut l = Losses::default();
        let w = l
            .limited(42, 1000, || "uid 65534, comm poke".into())
            .unwrap();
        assert!(
            w.contains("pid 42 (uid 65534, comm poke)") && w.contains("1000"),
            "{w}"
        );
        assert_eq!(l.limited(42, 5000, || unreachable!("asked once")), None);
        l.forget(42);
        assert!(l.limited(42, 1, || "x".into()).is_some());
    }
}
