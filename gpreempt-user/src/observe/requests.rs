//! An online service's request latency, measured from outside: one process's launch records and
//! its blocking waits (entry and return, per thread) cut into busy periods.
//!
//! A request is a busy period: it starts at the first launch after idleness and ends at the last
//! wait return before idleness. A period is idle once no wait is in flight and nothing has been
//! seen for `idle_ns`; a launch record comes at least once per launch gap while the process keeps
//! launching (the kernel suppresses the rest), so `idle_ns` must exceed that gap.
//!
//! Pure: no I/O and no clock reads; callers pass CLOCK_MONOTONIC timestamps in ns.

use std::collections::{HashMap, VecDeque};

/// The default idle gap that ends a request: longer than the kernel's 1 ms launch gap and than an
/// eager framework's host-side gaps between a request's kernels (measured on an H200: 2 ms split
/// decode requests; docs/observability.md).
pub const IDLE_NS: u64 = 5_000_000;
/// Stats cover requests that ended this long before `now`.
pub const WINDOW_NS: u64 = 60_000_000_000;
/// A wait in flight longer than this is forgotten: a thread parked in a sync for good (or whose
/// return record was lost) must not hold a period open forever.
pub const STALE_WAIT_NS: u64 = 10_000_000_000;
/// At most this many samples are kept (and this many closed durations await `take_closed`).
pub const MAX_SAMPLES: usize = 4096;

/// One record of the process's GPU activity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// A launch record (the first kernel launch of a burst).
    Launch,
    /// Thread `tid` entered a blocking wait (stream/device/event synchronize).
    WaitEnter(u32),
    /// Thread `tid` returned from its blocking wait.
    WaitReturn(u32),
    /// Records were dropped in the kernel: what is open can no longer be trusted.
    Lost,
}

/// Request latency over the last [`WINDOW_NS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestStats {
    /// Timed requests that ended within the window.
    pub count: u64,
    /// Timed requests ever closed.
    pub total: u64,
    /// Periods ever closed with no wait return inside (no measurable end).
    pub untimed: u64,
    /// Nearest-rank percentiles and maximum of the window's durations (0 when `count` is 0).
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// The open busy period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Period {
    start: u64,
    /// Latest activity of any kind: the idle clock runs from here.
    last: u64,
    /// Latest wait return: the request's end, if it has one.
    end: Option<u64>,
}

/// One process's busy-period segmenter and its recent request durations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requests {
    idle_ns: u64,
    open: Option<Period>,
    /// Threads blocked in a wait, with when they entered it.
    in_flight: HashMap<u32, u64>,
    /// (end_ns, dur_ns) of recent timed requests, in close order.
    samples: VecDeque<(u64, u64)>,
    /// Durations closed since the last `take_closed`.
    closed: VecDeque<u64>,
    total: u64,
    untimed: u64,
}

impl Requests {
    /// A segmenter that ends a request after `idle_ns` of idleness ([`IDLE_NS`] by default).
    pub fn new(idle_ns: u64) -> Self {
        Requests {
            idle_ns,
            open: None,
            in_flight: HashMap::new(),
            samples: VecDeque::new(),
            closed: VecDeque::new(),
            total: 0,
            untimed: 0,
        }
    }

    /// Feeds one activity at `ts`. Records arrive nearly in time order; a timestamp slightly
    /// behind earlier ones never moves a period's start, last activity or end backwards.
    pub fn on(&mut self, ts: u64, a: Activity) {
        // Close first, so a launch after idleness starts a new request even without a tick.
        self.tick(ts);
        match a {
            Activity::Launch => match self.open.as_mut() {
                Some(p) => p.last = p.last.max(ts),
                None => {
                    self.open = Some(Period {
                        start: ts,
                        last: ts,
                        end: None,
                    })
                }
            },
            Activity::WaitEnter(tid) => {
                // A sync on an idle stream is no request, but its thread still blocks: track it.
                self.in_flight.insert(tid, ts);
                if let Some(p) = self.open.as_mut() {
                    p.last = p.last.max(ts);
                }
            }
            Activity::WaitReturn(tid) => {
                self.in_flight.remove(&tid);
                if let Some(p) = self.open.as_mut() {
                    p.last = p.last.max(ts);
                    // Never before the start: a return record a little out of order.
                    let end = ts.max(p.start);
                    p.end = Some(p.end.map_or(end, |e| e.max(end)));
                }
            }
            Activity::Lost => {
                // The period may be missing its start or its end: a guess would skew the stats.
                self.open = None;
                self.in_flight.clear();
            }
        }
    }

    /// Forgets stale waits and closes the open period if it has been idle at `now`.
    pub fn tick(&mut self, now: u64) {
        self.in_flight
            .retain(|_, entered| now.saturating_sub(*entered) < STALE_WAIT_NS);
        if let Some(p) = self.open {
            if self.in_flight.is_empty() && now.saturating_sub(p.last) >= self.idle_ns {
                self.open = None;
                self.close(p);
            }
        }
        while self
            .samples
            .front()
            .is_some_and(|&(end, _)| now.saturating_sub(end) >= WINDOW_NS)
        {
            self.samples.pop_front();
        }
    }

    fn close(&mut self, p: Period) {
        let Some(end) = p.end else {
            self.untimed += 1;
            return;
        };
        let dur = end.saturating_sub(p.start);
        self.total += 1;
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((end, dur));
        if self.closed.len() >= MAX_SAMPLES {
            self.closed.pop_front();
        }
        self.closed.push_back(dur);
    }

    /// Stats of the timed requests that ended within [`WINDOW_NS`] before `now`. Percentiles
    /// are nearest-rank: the p-th is the ceil(p/100 * n)-th smallest duration (1-based).
    pub fn stats(&self, now: u64) -> RequestStats {
        let mut durs: Vec<u64> = self
            .samples
            .iter()
            .filter(|&&(end, _)| now.saturating_sub(end) < WINDOW_NS)
            .map(|&(_, dur)| dur)
            .collect();
        durs.sort_unstable();
        RequestStats {
            count: durs.len() as u64,
            total: self.total,
            untimed: self.untimed,
            p50_ns: nearest_rank(&durs, 50),
            p99_ns: nearest_rank(&durs, 99),
            max_ns: durs.last().copied().unwrap_or(0),
        }
    }

    /// (end_ns, duration_ns) of the kept requests that ended after `end_ns`, oldest first: a
    /// reader that remembers the last end it saw reads each request once, leaving them for
    /// others (unlike [`Self::take_closed`]).
    pub fn ended_after(&self, end_ns: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let from = self.samples.partition_point(|&(e, _)| e <= end_ns);
        self.samples.range(from..).copied()
    }

    /// Durations (ns) of the requests closed since the last call, oldest first.
    pub fn take_closed(&mut self) -> Vec<u64> {
        self.closed.drain(..).collect()
    }
}

/// The `pct`-th nearest-rank percentile of `sorted` (0 when empty).
pub(crate) fn nearest_rank(sorted: &[u64], pct: u64) -> u64 {
    let n = sorted.len() as u64;
    let rank = (pct * n).div_ceil(100).clamp(1, n.max(1));
    sorted.get((rank - 1) as usize).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    /// The idle gap these streams are written for (the logic is the same at any gap).
    const IDLE: u64 = 2_000_000;
    use Activity::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    /// A request of `dur` from `t`: a launch and a sync on thread 1 that returns at `t + dur`.
    fn request(r: &mut Requests, t: u64, dur: u64) {
        r.on(t, Launch);
        r.on(t, WaitEnter(1));
        r.on(t + dur, WaitReturn(1));
    }

    #[test]
    fn sync_per_token_is_one_request() {
        // Decoding: each token launches, then syncs ~2 ms later; gaps stay under idle.
        let mut r = Requests::new(IDLE);
        let t0 = 1_000 * MS;
        let mut t = t0;
        let mut last_return = 0;
        for _ in 0..20 {
            r.on(t, Launch);
            r.on(t + 10 * US, WaitEnter(7));
            last_return = t + 2 * MS;
            r.on(last_return, WaitReturn(7));
            r.tick(last_return + MS / 2);
            t = last_return + MS;
        }
        assert!(r.take_closed().is_empty(), "closed mid-stream");
        r.tick(last_return + IDLE);
        assert_eq!(r.take_closed(), vec![last_return - t0]);
        let s = r.stats(last_return + IDLE);
        assert_eq!((s.count, s.total, s.untimed), (1, 1, 0));
    }

    #[test]
    fn overlapping_waits_end_at_the_later_return() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(100 * US, WaitEnter(1));
        r.on(200 * US, WaitEnter(2));
        r.on(3 * MS, WaitReturn(1));
        // Thread 2 still waits: idle time since thread 1's return does not end the request.
        r.tick(6 * MS);
        assert!(r.take_closed().is_empty());
        r.on(8 * MS, WaitReturn(2));
        r.tick(9 * MS);
        assert!(r.take_closed().is_empty());
        r.tick(10 * MS);
        assert_eq!(r.take_closed(), vec![8 * MS]);
    }

    #[test]
    fn launches_from_several_threads_are_one_request() {
        // Two streams fed by two threads, each syncing its own stream.
        let mut r = Requests::new(IDLE);
        let t0 = 5 * MS;
        r.on(t0, Launch);
        r.on(t0 + MS, Launch);
        r.on(t0 + MS + 10 * US, WaitEnter(11));
        r.on(t0 + 1_500 * US, Launch);
        r.on(t0 + 2 * MS, WaitEnter(12));
        r.on(t0 + 3 * MS, WaitReturn(11));
        r.on(t0 + 3_500 * US, Launch);
        r.on(t0 + 4 * MS, WaitEnter(11));
        r.on(t0 + 4_500 * US, WaitReturn(12));
        r.on(t0 + 5 * MS, WaitReturn(11));
        r.tick(t0 + 7 * MS);
        assert_eq!(r.take_closed(), vec![5 * MS]);
    }

    #[test]
    fn a_long_single_wait_is_one_request() {
        let mut r = Requests::new(IDLE);
        let t0 = 100 * MS;
        r.on(t0, Launch);
        r.on(t0 + 50 * US, WaitEnter(3));
        for i in 1..=54 {
            r.tick(t0 + i * MS);
        }
        assert!(
            r.take_closed().is_empty(),
            "closed while the wait was in flight"
        );
        r.on(t0 + 55 * MS, WaitReturn(3));
        for i in 56..=60 {
            r.tick(t0 + i * MS);
        }
        assert_eq!(r.take_closed(), vec![55 * MS]);
    }

    #[test]
    fn idleness_separates_requests_without_a_tick() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(10 * US, WaitEnter(1));
        r.on(3 * MS, WaitReturn(1));
        // The next launch comes after idleness: `on` closes the first request itself.
        r.on(3 * MS + IDLE, Launch);
        assert_eq!(r.take_closed(), vec![3 * MS]);
        r.on(6 * MS, WaitEnter(1));
        r.on(9 * MS, WaitReturn(1));
        r.tick(20 * MS);
        assert_eq!(r.take_closed(), vec![9 * MS - (3 * MS + IDLE)]);
        assert_eq!(r.stats(20 * MS).total, 2);
    }

    #[test]
    fn a_gap_just_under_idle_does_not_split() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(MS, WaitEnter(1));
        r.on(2 * MS, WaitReturn(1));
        r.on(2 * MS + IDLE - 1, Launch);
        r.on(5 * MS, WaitEnter(1));
        r.on(6 * MS, WaitReturn(1));
        r.tick(6 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![6 * MS]);
    }

    #[test]
    fn lost_discards_the_open_period() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(10 * US, WaitEnter(1));
        r.on(MS, Lost);
        // The wait's return (after the loss) neither ends nor reopens anything.
        r.on(2 * MS, WaitReturn(1));
        r.tick(10 * MS);
        assert!(r.take_closed().is_empty());
        let s = r.stats(10 * MS);
        assert_eq!((s.count, s.total, s.untimed), (0, 0, 0));
        // Counting resumes with the next launch.
        r.on(20 * MS, Launch);
        r.on(20 * MS + 10 * US, WaitEnter(1));
        r.on(23 * MS, WaitReturn(1));
        r.tick(30 * MS);
        assert_eq!(r.take_closed(), vec![3 * MS]);
    }

    #[test]
    fn lost_forgets_waits_in_flight() {
        let mut r = Requests::new(IDLE);
        // A wait entered before the loss whose return was lost must not block later requests.
        r.on(0, WaitEnter(9));
        r.on(MS, Lost);
        r.on(10 * MS, Launch);
        r.on(11 * MS, WaitEnter(1));
        r.on(12 * MS, WaitReturn(1));
        r.tick(12 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![2 * MS]);
    }

    #[test]
    fn a_stale_wait_is_forgotten() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(10 * US, WaitEnter(1));
        r.on(20 * US, WaitEnter(2));
        r.on(MS, WaitReturn(1));
        // Thread 2 never returns: the period stays open until its wait goes stale.
        r.tick(20 * US + STALE_WAIT_NS - 1);
        assert!(r.take_closed().is_empty());
        r.tick(20 * US + STALE_WAIT_NS);
        assert_eq!(r.take_closed(), vec![MS]);
        // And it blocks nothing later.
        let t = 20 * STALE_WAIT_NS;
        request(&mut r, t, 4 * MS);
        r.tick(t + 4 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![4 * MS]);
    }

    #[test]
    fn a_wait_on_an_idle_stream_is_no_request() {
        let mut r = Requests::new(IDLE);
        r.on(0, WaitEnter(1));
        r.on(50 * US, WaitReturn(1));
        r.tick(10 * MS);
        assert!(r.take_closed().is_empty());
        let s = r.stats(10 * MS);
        assert_eq!((s.total, s.untimed), (0, 0));
    }

    #[test]
    fn stats_forget_requests_out_of_the_window() {
        let mut r = Requests::new(IDLE);
        request(&mut r, 0, 5 * MS); // ends at 5 ms
        request(&mut r, 1_000 * MS, 7 * MS); // ends at 1007 ms
        r.tick(1_007 * MS + IDLE);
        let s = r.stats(5 * MS + WINDOW_NS - 1);
        assert_eq!((s.count, s.max_ns), (2, 7 * MS));
        let s = r.stats(5 * MS + WINDOW_NS);
        assert_eq!((s.count, s.total), (1, 2));
        assert_eq!((s.p50_ns, s.p99_ns, s.max_ns), (7 * MS, 7 * MS, 7 * MS));
        let s = r.stats(1_007 * MS + WINDOW_NS);
        assert_eq!(
            s,
            RequestStats {
                total: 2,
                ..Default::default()
            }
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut r = Requests::new(IDLE);
        let mut t = 0;
        // Durations 1..=100 ms, fed in a scrambled order.
        for i in 0..100u64 {
            let dur = (i * 37 % 100 + 1) * MS;
            request(&mut r, t, dur);
            t += dur + IDLE;
        }
        r.tick(t);
        let s = r.stats(t);
        assert_eq!(s.count, 100);
        assert_eq!((s.p50_ns, s.p99_ns, s.max_ns), (50 * MS, 99 * MS, 100 * MS));
        assert_eq!(r.take_closed().len(), 100);
        assert!(r.take_closed().is_empty(), "take_closed drains");
    }

    #[test]
    fn nearest_rank_on_small_sets() {
        assert_eq!(nearest_rank(&[], 50), 0);
        assert_eq!(nearest_rank(&[4], 50), 4);
        assert_eq!(nearest_rank(&[4], 99), 4);
        assert_eq!(nearest_rank(&[1, 2], 50), 1);
        assert_eq!(nearest_rank(&[1, 2], 99), 2);
        assert_eq!(nearest_rank(&[1, 2, 3], 50), 2);
    }

    #[test]
    fn a_launch_only_burst_is_untimed() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(MS, Launch);
        r.on(MS + 500 * US, Launch);
        r.tick(MS + 500 * US + IDLE);
        assert!(r.take_closed().is_empty());
        let s = r.stats(10 * MS);
        assert_eq!((s.count, s.total, s.untimed), (0, 0, 1));
    }

    #[test]
    fn a_return_after_idleness_without_its_entry_ends_nothing() {
        // The entry was not seen, so nothing held the period open: it went idle at 2 ms.
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(5 * MS, WaitReturn(1));
        r.tick(20 * MS);
        assert!(r.take_closed().is_empty());
        let s = r.stats(20 * MS);
        assert_eq!((s.total, s.untimed), (0, 1));
    }

    #[test]
    fn the_end_is_the_last_return_not_a_later_launch() {
        let mut r = Requests::new(IDLE);
        r.on(0, Launch);
        r.on(10 * US, WaitEnter(1));
        r.on(3 * MS, WaitReturn(1));
        r.on(4 * MS, Launch);
        r.tick(4 * MS + IDLE - 1);
        assert!(
            r.take_closed().is_empty(),
            "the trailing launch keeps it open"
        );
        r.tick(4 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![3 * MS]);
    }

    #[test]
    fn out_of_order_timestamps_do_not_underflow() {
        let mut r = Requests::new(IDLE);
        request(&mut r, 10 * MS, 2 * MS);
        // Records a little behind: neither the idle clock nor the end go back.
        r.on(11 * MS, Launch);
        r.on(11 * MS, WaitReturn(2));
        r.tick(11 * MS);
        r.tick(12 * MS + IDLE - 1);
        assert!(r.take_closed().is_empty());
        r.tick(12 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![2 * MS]);
        // A return stamped before its period's start counts as zero length, not a wrap.
        r.on(100 * MS, Launch);
        r.on(100 * MS, WaitEnter(3));
        r.on(99 * MS, WaitReturn(3));
        r.tick(100 * MS + IDLE);
        assert_eq!(r.take_closed(), vec![0]);
        // Stats and ticks at times before the samples' ends.
        let s = r.stats(0);
        assert_eq!((s.count, s.max_ns), (2, 2 * MS));
        r.tick(0);
        assert_eq!(r.stats(0).count, 2);
    }

    #[test]
    fn samples_are_bounded() {
        let mut r = Requests::new(IDLE);
        let n = MAX_SAMPLES as u64 + 10;
        let mut t = 0;
        for i in 0..n {
            // The 10 oldest are the longest: dropping them lowers the max.
            let dur = if i < 10 { 9 * MS } else { MS };
            request(&mut r, t, dur);
            t += dur + IDLE;
        }
        r.tick(t);
        let s = r.stats(t);
        assert_eq!((s.count, s.total, s.max_ns), (MAX_SAMPLES as u64, n, MS));
        assert_eq!(r.take_closed().len(), MAX_SAMPLES);
    }
}
