//! The lever tuner on synthetic hosts: an online service with a request every `period`, whose
//! burst length and the offline progress rate depend on the lever applied (plus seeded noise).

use super::*;
use crate::policy::{Budget, Lever, LeverSet};

const S: u64 = 1_000_000_000;
const STEP: u64 = 10 * MS;

/// What a lever does on a synthetic pair: (online burst ms, offline units/s).
type Host = dyn Fn(Lever) -> (f64, f64);

/// A seeded generator (xorshift): noise that is the same on every run.
struct Rng(u64);
impl Rng {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

struct Sim {
    t: LeverTuner,
    now: u64,
    rng: Rng,
    /// Relative noise on each burst and each progress report.
    noise: f64,
    /// A request every this long; None: the online service is silent.
    period_ns: Option<u64>,
    changes: Vec<LeverChange>,
    /// (time, chosen) whenever the chosen lever changed.
    chosen: Vec<(u64, Lever)>,
    /// Feed offline progress (the sampler is there).
    progress: bool,
}

impl Sim {
    fn new(start: Lever) -> Self {
        Self {
            t: LeverTuner::new(LeverSet::DEFAULT, Budget::Ratio(1.1), start, 0),
            now: 0,
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            noise: 0.05,
            period_ns: Some(50 * MS),
            changes: Vec::new(),
            chosen: vec![(0, start)],
            progress: true,
        }
    }

    /// Runs the host for `secs` of virtual time in 10 ms steps.
    fn run(&mut self, host: &Host, secs: u64) {
        let end = self.now + secs * S;
        while self.now < end {
            self.now += STEP;
            let lever = self.t.lever();
            let (burst_ms, rate) = host(lever);
            if let Some(p) = self.period_ns {
                if self.now % p < STEP {
                    let d = burst_ms * (1.0 + self.noise * self.rng.next());
                    self.t.on_burst(self.now, (d * 1e6) as u64);
                }
            }
            if self.progress {
                let units = rate * (STEP as f64 / 1e9) * (1.0 + self.noise * self.rng.next());
                self.t.on_offline_progress(self.now, units.max(0.0) as u64);
            }
            if let Some(c) = self.t.tick(self.now) {
                assert_eq!(c.from, lever, "a change starts from the applied lever");
                self.changes.push(c);
            }
            if self.chosen.last().map(|c| c.1) != Some(self.t.chosen()) {
                self.chosen.push((self.now, self.t.chosen()));
            }
        }
    }
}

/// The pair where nothing disturbs the online service: any lever only costs offline.
fn null_pair(l: Lever) -> (f64, f64) {
    let offline = match l {
        Lever::None => 1000.0,
        Lever::Dynamic => 960.0,
        Lever::Timeslice => 800.0,
        _ => 650.0,
    };
    (4.0, offline)
}

#[test]
fn no_bursts_no_conclusion_no_action() {
    // A silent online service: never calibrates, never changes the lever.
    let mut s = Sim::new(Lever::Timeslice);
    s.period_ns = None;
    s.run(&null_pair, 120);
    assert!(s.changes.is_empty(), "{:?}", s.changes);
    assert!(!s.t.measuring());
    assert_eq!(s.t.lever(), Lever::Timeslice);

    // Bursts that stop mid-calibration: the measurement is dropped with the reason, and the
    // lever goes back to where it was.
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&null_pair, 2);
    assert!(s.t.measuring(), "enough bursts: calibrating");
    s.period_ns = None;
    s.run(&null_pair, 30);
    assert!(!s.t.measuring());
    assert_eq!(s.t.lever(), Lever::Timeslice);
    assert_eq!(s.t.chosen(), Lever::Timeslice);
    let notes = s.t.take_notes();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("no conclusion: 0 online burst(s)")
                && n.ends_with("keeping timeslice")),
        "{notes:?}"
    );
    assert_eq!(s.changes.last().map(|c| c.to), Some(Lever::Timeslice));
}

#[test]
fn a_null_pair_gets_none() {
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&null_pair, 30);
    assert_eq!(s.t.chosen(), Lever::None);
    assert_eq!(s.t.lever(), Lever::None);
    let c = s.changes.last().unwrap();
    assert!(c.reason.contains("nothing to remove"), "{}", c.reason);
    // Every candidate was measured ROUNDS times.
    let sums = s.t.summaries();
    assert_eq!(sums.len(), 4);
    assert!(sums.iter().all(|x| x.epochs == ROUNDS), "{sums:?}");
}

#[test]
fn two_offline_jobs_get_the_dynamic_timeslice() {
    // Two offline jobs: without a lever online is 1.5x slower; the static timeslice makes
    // them switch every 200 us (offline 0.42x), pausing costs 0.65x, dynamic 0.95x.
    let host = |l: Lever| match l {
        Lever::None => (6.0, 1000.0),
        Lever::Dynamic => (4.2, 950.0),
        Lever::Timeslice => (4.2, 420.0),
        _ => (4.0, 650.0),
    };
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&host, 30);
    assert_eq!(s.t.chosen(), Lever::Dynamic, "{:?}", s.t.summaries());
    // The last epoch may have been dynamic's (no change then): the conclusion is a note.
    let notes = s.t.take_notes();
    assert!(
        notes.iter().any(|n| n.starts_with("chose dynamic")
            && n.contains("dynamic is within it with the most offline progress")),
        "{notes:?}"
    );
}

#[test]
fn a_launch_bound_service_keeps_none() {
    // No lever changes the online p90 (the service waits on its own launches): the cheapest
    // is kept, never worse than no control.
    let host = |l: Lever| (5.0, null_pair(l).1);
    let mut s = Sim::new(Lever::None);
    s.noise = 0.15;
    s.run(&host, 30);
    assert_eq!(s.t.chosen(), Lever::None);
    // Only calibration steps, ending back at none.
    assert_eq!(s.t.lever(), Lever::None);
    assert!(s
        .changes
        .iter()
        .all(|c| c.reason.starts_with("calibrating") || c.reason.starts_with("chose none")));
}

#[test]
fn only_pause_meets_the_budget() {
    let host = |l: Lever| match l {
        Lever::None => (7.0, 1000.0),
        Lever::Dynamic => (6.0, 950.0),
        Lever::Timeslice => (5.5, 900.0),
        _ => (4.0, 600.0),
    };
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&host, 30);
    assert_eq!(s.t.chosen(), Lever::Pause, "{:?}", s.t.summaries());
}

#[test]
fn without_progress_reports_the_cheapest_lever_within_budget_wins() {
    // Until the channel sampler feeds progress, levers within the target are ranked by cost.
    let host = |l: Lever| match l {
        Lever::None => (6.0, 0.0),
        Lever::Dynamic => (4.2, 0.0),
        Lever::Timeslice => (4.1, 0.0),
        _ => (4.0, 0.0),
    };
    let mut s = Sim::new(Lever::Timeslice);
    s.progress = false;
    s.run(&host, 30);
    assert_eq!(s.t.chosen(), Lever::Dynamic, "{:?}", s.t.summaries());
}

#[test]
fn noisy_samples_do_not_flap() {
    // none sits on the boundary (1.1x) with 30% noise per burst: after the first decision the
    // re-checks every minute must not flip the choice back and forth.
    let host = |l: Lever| match l {
        Lever::None => (4.4, 1000.0),
        Lever::Dynamic => (4.1, 980.0),
        Lever::Timeslice => (4.0, 800.0),
        _ => (4.0, 650.0),
    };
    let mut s = Sim::new(Lever::Timeslice);
    s.noise = 0.3;
    s.run(&host, 600);
    // The start, the first decision, at most one revision.
    assert!(s.chosen.len() <= 3, "{:?}", s.chosen);
    let decisions = s
        .changes
        .iter()
        .filter(|c| c.reason.starts_with("chose"))
        .count();
    assert!(decisions <= 2, "{:?}", s.changes);
    // Confirmations ran (about one a minute).
    assert!(s.changes.iter().any(|c| c.reason.starts_with("confirming")));
}

#[test]
fn a_mix_change_recalibrates() {
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&null_pair, 30);
    assert_eq!(s.t.chosen(), Lever::None);
    // A second offline job joins: now only pause keeps the online service within budget.
    let busy = |l: Lever| match l {
        Lever::None => (8.0, 1000.0),
        Lever::Dynamic => (6.0, 950.0),
        Lever::Timeslice => (5.5, 900.0),
        _ => (4.0, 600.0),
    };
    let at = s.now;
    s.t.on_mix_change(at);
    s.run(&busy, 1);
    assert!(s.t.measuring(), "calibrating again within a second");
    s.run(&busy, 30);
    assert_eq!(s.t.chosen(), Lever::Pause);
    assert!(s.chosen.iter().any(|&(t, l)| t > at && l == Lever::Pause));
}

#[test]
fn a_confirmation_that_disagrees_recalibrates_before_changing() {
    let mut s = Sim::new(Lever::Timeslice);
    s.run(&null_pair, 30);
    assert_eq!(s.t.chosen(), Lever::None);
    // The pair changes without a mix change (the online load grew): the next confirmation
    // sees none over budget, a full calibration then decides.
    let busy = |l: Lever| match l {
        Lever::None => (8.0, 1000.0),
        Lever::Dynamic => (4.2, 950.0),
        _ => (4.0, 600.0),
    };
    s.run(&busy, 90);
    assert_eq!(s.t.chosen(), Lever::Dynamic);
    let notes = s.t.take_notes();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("the confirmation favours")),
        "{notes:?}"
    );
}

#[test]
fn decide_follows_the_rule() {
    let sum = |lever, p90_ms: f64, rate| Summary {
        lever,
        p50_ns: (p90_ms * 0.8e6) as u64,
        p90_ns: (p90_ms * 1e6) as u64,
        rate: Some(rate),
        epochs: 3,
    };
    // An absolute budget nobody meets: the closest, ties (2%) by offline progress.
    let sums = [
        sum(Lever::None, 9.0, 1000.0),
        sum(Lever::Dynamic, 5.05, 900.0),
        sum(Lever::Pause, 5.0, 500.0),
    ];
    let d = decide(&sums, Budget::Absolute(4_000_000), Lever::None);
    assert_eq!(d.lever, Lever::Dynamic);
    assert!(d.reason.contains("no lever meets it"), "{}", d.reason);
    // The incumbent keeps its place against a lever less than 5% better for offline...
    let sums = [
        sum(Lever::None, 9.0, 1000.0),
        sum(Lever::Dynamic, 4.1, 900.0),
        sum(Lever::Timeslice, 4.0, 930.0),
    ];
    assert_eq!(
        decide(&sums, Budget::Ratio(1.1), Lever::Dynamic).lever,
        Lever::Dynamic
    );
    assert_eq!(
        decide(&sums, Budget::Ratio(1.1), Lever::Pause).lever,
        Lever::Timeslice
    );
    // ...and within 3% over the target.
    let sums = [sum(Lever::None, 4.5, 1000.0), sum(Lever::Pause, 4.0, 600.0)];
    assert_eq!(
        decide(&sums, Budget::Ratio(1.1), Lever::None).lever,
        Lever::None
    );
    assert_eq!(
        decide(&sums, Budget::Ratio(1.1), Lever::Pause).lever,
        Lever::Pause
    );
    assert_eq!(
        decide(&[], Budget::Ratio(1.1), Lever::Pause).lever,
        Lever::Pause
    );
}
