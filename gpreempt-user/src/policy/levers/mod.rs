//! The lever tuner: per GPU, which lever (`none`, `dynamic`, `timeslice`, `pause`, ...) makes
//! offline work yield, chosen by measuring what the online services' users feel under each
//! (strategy `adaptive` on GPUs whose backend offers a choice: the candidates are the policy's
//! that it offers).
//!
//! Why measure: on an H100 one static lever was wrong for some pair every time. The static
//! 200 us timeslice left an eager LLM decode service 1.4x slower, made two offline jobs switch
//! every 200 us (offline 0.42x) and took 20% of offline throughput where there was nothing to
//! remove; pausing per request cost offline 0.3-0.7x.
//!
//! Evidence (fed by the engine; no clock, no I/O here):
//! - [`LeverTuner::on_request`]: one request of an online service on the GPU completed, how long
//!   it took (first launch to last wait return: `observe::requests`) and the service's goal;
//! - [`LeverTuner::on_burst`]: one online burst on the GPU completed (online work pending from
//!   its start until drained): the stand-in where no service's requests are measured;
//! - [`LeverTuner::on_offline_progress`]: offline progress since the last call (entries the
//!   GPU consumed from the offline compute queues): the offline figure, as a rate;
//! - [`LeverTuner::on_mix_change`]: a process joined, left or was reclassed on the GPU.
//!
//! Calibration cycles the candidate levers in interleaved epochs, [`ROUNDS`] rounds in a
//! rotated order so that drift weighs on every lever alike, plus one *quiet window* per round
//! where a lever can hold offline work throughout: the services alone, measured rather than
//! assumed. An epoch lasts at least [`EPOCH_NS`], the first [`SETTLE_NS`] after a switch
//! discarded, and until every service seen has [`MIN_REQUESTS`] requests in it (at most
//! [`MAX_EPOCH_NS`]): at 1 request/s a calibration of four levers concludes in about 70 s.
//! Requests are pooled per lever and service over its last [`HISTORY_EPOCHS`] epochs since the
//! mix last changed, so each confirmation sharpens what the calibration read (a few dozen at
//! low rates: the tail compared is then their second largest, [`measure::tail`]). An epoch
//! without any request ends the measurement with no conclusion.
//!
//! The decision ([`measure::decide`]): each service's target is its `slo_p99`, or its budget
//! (`online_p99_budget`) times its p99 alone; a lever's figure is its worst service's ratio of
//! p99 to target. The lever within every target with the most offline progress wins (`none`
//! when it is within: nothing to remove); if none is, the best worst-service ratio. The
//! incumbent gets a little slack ([`INCUMBENT_SLACK`], [`RATE_MARGIN`]) so that noise does not
//! flap it.
//!
//! Then the choice is kept; every [`RECHECK_NS`] a short confirmation ([`CONFIRM_ROUNDS`]
//! rounds of the choice, `none` and the runner-up) checks it; one that disagrees starts a full
//! calibration, whose conclusion alone may change the lever. Quiet windows after the first
//! calibration are made only while they stay within [`QUIET_SHARE`] of the time since the tuner
//! started; the alone figures they bought are kept across measurements. A mix change starts
//! over (once the new mix shows requests again).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Budget, Lever, LeverSet};

pub mod measure;

pub use measure::{decide, Summary, BURSTS};
use measure::{fmt_ms, svc_name, Alone, Stat};

const MS: u64 = 1_000_000;
/// The shortest epoch.
pub const EPOCH_NS: u64 = 1_000 * MS;
/// Discarded after each switch: work queued under the old lever, queues still paused.
pub const SETTLE_NS: u64 = 200 * MS;
/// Requests each service needs in an epoch before it ends.
pub const MIN_REQUESTS: usize = 4;
/// An epoch ends here with what it has; one with no request at all ends the measurement with
/// no conclusion.
pub const MAX_EPOCH_NS: u64 = 10 * EPOCH_NS;
/// Rounds of a calibration (every candidate once per round, and a quiet window).
pub const ROUNDS: usize = 3;
/// Rounds of a confirmation (the choice, `none`, the runner-up).
pub const CONFIRM_ROUNDS: usize = 2;
/// How often a settled choice is confirmed.
pub const RECHECK_NS: u64 = 60_000 * MS;
/// After the first calibration, quiet windows are made only while their total stays within
/// this share of the time since the tuner started.
pub const QUIET_SHARE: f64 = 0.02;
/// The incumbent meets a target up to this factor over it (noise around the boundary does not
/// flip it)...
pub const INCUMBENT_SLACK: f64 = 1.03;
/// ...and keeps its place unless another lever within every target makes this much more
/// offline progress.
pub const RATE_MARGIN: f64 = 1.05;
/// Epochs per lever a decision pools (the newest; a calibration's three and those of the
/// confirmations since).
pub const HISTORY_EPOCHS: usize = 9;
/// Requests (or bursts) within [`WATCH_WINDOW_NS`] that start a measurement.
const START_SAMPLES: usize = 3;
/// Waiting for evidence, the counts restart after this long without enough of it.
const WATCH_WINDOW_NS: u64 = 10 * EPOCH_NS;

/// A change of the lever applied on a GPU (calibration steps included), for the engine to
/// apply and audit.
#[derive(Clone, Debug, PartialEq)]
pub struct LeverChange {
    pub from: Lever,
    pub to: Lever,
    pub reason: String,
}

/// One epoch: under a lever, or a quiet window (`lever` None).
#[derive(Clone, Debug)]
struct Epoch {
    lever: Option<Lever>,
    start_ns: u64,
    /// Durations of each service's requests that started after the settling time.
    samples: BTreeMap<u32, Vec<u64>>,
    /// Offline progress over `measured_ns` (intervals wholly after the settling time).
    units: u64,
    measured_ns: u64,
}

impl Epoch {
    fn new(lever: Option<Lever>, start_ns: u64) -> Self {
        Self {
            lever,
            start_ns,
            samples: BTreeMap::new(),
            units: 0,
            measured_ns: 0,
        }
    }

    fn measuring_from(&self) -> u64 {
        self.start_ns.saturating_add(SETTLE_NS)
    }

    fn count(&self, svc: u32) -> usize {
        self.samples.get(&svc).map_or(0, Vec::len)
    }

    fn stat(&self) -> Stat {
        Stat {
            lever: self.lever,
            samples: self.samples.clone(),
            // Progress over less than a quarter epoch says little: unknown.
            rate: (self.measured_ns >= EPOCH_NS / 4)
                .then(|| self.units as f64 * 1e9 / self.measured_ns as f64),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Calibrate,
    Confirm,
}

#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for evidence under `chosen`: requests (and offline progress, once any was ever
    /// reported) within a window.
    Watch {
        since_ns: u64,
        samples: usize,
        units: u64,
    },
    /// Epochs under the levers of `plan` (None: a quiet window), in order.
    Measure {
        kind: Kind,
        plan: Vec<Option<Lever>>,
        idx: usize,
        epoch: Epoch,
        stats: Vec<Stat>,
        /// Services that gave requests in this measurement: each epoch waits for them.
        seen: BTreeSet<u32>,
    },
    /// The choice holds until `next_check_ns`.
    Settled { next_check_ns: u64 },
}

/// One service's target as the last decision set it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetView {
    /// The service's pid ([`BURSTS`]: the GPU's bursts).
    pub svc: u32,
    pub target_ns: u64,
    /// `slo` (absolute), `alone` (budget x p99 alone) or `best lever` (no alone figure).
    pub basis: String,
}

/// What the status file shows per GPU with a lever tuner (adaptive strategy).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeverView {
    pub gpu_id: u32,
    /// Applied now (an epoch's lever while measuring).
    pub lever: String,
    pub chosen: String,
    /// `watching` (waiting for online requests), `calibrating`, `confirming` or `settled`.
    pub phase: String,
    /// While measuring: the epoch (1-based) and how many the measurement has.
    pub epoch: Option<(usize, usize)>,
    /// A quiet window is on: offline is held throughout to measure the services alone.
    pub quiet: bool,
    /// The last decision's figures per lever.
    pub summaries: Vec<Summary>,
    pub targets: Vec<TargetView>,
}

impl From<LeverView> for crate::observe::status::LeverView {
    fn from(v: LeverView) -> Self {
        Self {
            gpu_id: v.gpu_id,
            lever: v.lever,
            chosen: v.chosen,
            phase: v.phase,
            epoch: v.epoch,
            quiet: v.quiet,
            summaries: v
                .summaries
                .iter()
                .map(|s| {
                    let w = s.worst_service();
                    crate::observe::status::LeverSummary {
                        lever: s.lever.label().into(),
                        worst: s.worst,
                        p99_ns: w.map_or(0, |f| f.p99_ns),
                        requests: s.services.iter().map(|f| f.requests).sum(),
                        rate: s.rate,
                        epochs: s.epochs,
                    }
                })
                .collect(),
        }
    }
}

/// One GPU's lever tuner.
#[derive(Clone, Debug)]
pub struct LeverTuner {
    candidates: Vec<Lever>,
    /// The goal of a service with none of its own (and of the GPU's bursts).
    budget: Budget,
    /// Each service's goal, as its last request came with.
    budgets: BTreeMap<u32, Budget>,
    /// The lever that holds offline work for a quiet window (None: none offered, so the
    /// reference of a ratio is the best lever's p99).
    quiet_lever: Option<Lever>,
    /// The lever chosen (or the starting one): applied outside measurements.
    chosen: Lever,
    /// The lever applied now (an epoch's during a measurement).
    applied: Lever,
    /// The runner-up of the last decision (confirmed against).
    runner_up: Option<Lever>,
    phase: Phase,
    /// Offline progress was reported at least once: from then on it is required evidence.
    progress_seen: bool,
    last_progress_ns: Option<u64>,
    notes: Vec<String>,
    /// The last decision's summaries and targets (for `top` / the status).
    last: Vec<Summary>,
    targets: Vec<TargetView>,
    alone: Alone,
    born_ns: u64,
    /// Time spent in quiet windows, and whether a calibration has concluded (from then on
    /// quiet windows keep within [`QUIET_SHARE`]).
    quiet_ns: u64,
    calibrated: bool,
    /// The chosen lever met every target when the last calibration chose it.
    met: bool,
    /// The epochs measured since the mix last changed, at most [`HISTORY_EPOCHS`] per lever:
    /// what each decision pools.
    history: Vec<Stat>,
}

impl LeverTuner {
    /// A tuner that starts from `start` (the policy's `lever` when it is a candidate, else the
    /// first candidate), measures `candidates` against `budget` (each service's own goal, where
    /// it has one, comes with its requests) and holds offline for quiet windows with `quiet`.
    pub fn new(
        candidates: LeverSet,
        budget: Budget,
        start: Lever,
        quiet: Option<Lever>,
        now_ns: u64,
    ) -> Self {
        let mut c: Vec<Lever> = candidates.iter().collect();
        if c.is_empty() {
            c.push(start);
        }
        let start = if c.contains(&start) { start } else { c[0] };
        Self {
            candidates: c,
            budget,
            budgets: BTreeMap::new(),
            quiet_lever: quiet,
            chosen: start,
            applied: start,
            runner_up: None,
            phase: Phase::Watch {
                since_ns: now_ns,
                samples: 0,
                units: 0,
            },
            progress_seen: false,
            last_progress_ns: None,
            notes: Vec::new(),
            last: Vec::new(),
            targets: Vec::new(),
            alone: Alone::default(),
            born_ns: now_ns,
            quiet_ns: 0,
            calibrated: false,
            met: false,
            history: Vec::new(),
        }
    }

    /// The lever to apply on the GPU now.
    pub fn lever(&self) -> Lever {
        self.applied
    }

    /// A quiet window is on: offline work on the GPU is held throughout (by [`Self::lever`]).
    pub fn quiet(&self) -> bool {
        matches!(&self.phase, Phase::Measure { epoch, .. } if epoch.lever.is_none())
    }

    /// The lever chosen (what applies outside measurements).
    pub fn chosen(&self) -> Lever {
        self.chosen
    }

    /// Whether it has concluded and keeps its choice (between confirmations).
    pub fn settled(&self) -> bool {
        matches!(self.phase, Phase::Settled { .. })
    }

    /// Whether epochs are being measured now.
    pub fn measuring(&self) -> bool {
        matches!(self.phase, Phase::Measure { .. })
    }

    /// Whether it has a measured choice to keep (a calibration concluded), even while a
    /// confirmation or a recalibration is under way: what a reload away sets aside.
    pub fn concluded(&self) -> bool {
        self.calibrated
    }

    /// Taken back after a reload away and back: its choice applies again, and whatever was
    /// being measured when it was set aside is dropped; the next confirmation falls
    /// [`RECHECK_NS`] from `now_ns`, not at once, so that switching policies back and forth does
    /// not measure each time (found on an H200: each return recalibrated).
    pub fn taken_back(&mut self, now_ns: u64) {
        if !self.calibrated {
            return;
        }
        // (A quiet window it was set aside in ended then: the time parked was not quiet.)
        let next_check_ns = match self.phase {
            Phase::Settled {
                next_check_ns: u64::MAX,
            } => u64::MAX,
            _ => now_ns.saturating_add(RECHECK_NS),
        };
        self.phase = Phase::Settled { next_check_ns };
        self.applied = self.chosen;
    }

    /// Time spent in quiet windows so far.
    pub fn quiet_ns(&self) -> u64 {
        self.quiet_ns
    }

    pub fn view(&self, gpu_id: u32) -> LeverView {
        let (phase, epoch) = match &self.phase {
            Phase::Watch { .. } => ("watching", None),
            Phase::Measure {
                kind, idx, plan, ..
            } => (
                match kind {
                    Kind::Calibrate => "calibrating",
                    Kind::Confirm => "confirming",
                },
                Some((idx + 1, plan.len())),
            ),
            Phase::Settled { .. } => ("settled", None),
        };
        LeverView {
            gpu_id,
            lever: self.applied.label().into(),
            chosen: self.chosen.label().into(),
            phase: phase.into(),
            epoch,
            quiet: self.quiet(),
            summaries: self.last.clone(),
            targets: self.targets.clone(),
        }
    }

    /// The per-lever figures of the last decision.
    pub fn summaries(&self) -> &[Summary] {
        &self.last
    }

    /// What it concluded (or could not) since the last call, for the log and the audit.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// A request of online service `svc` (its pid) on this GPU ended at `now_ns` after
    /// `duration_ns`; `goal` is the service's (its rule's `slo_p99`, else the policy's budget).
    pub fn on_request(&mut self, now_ns: u64, svc: u32, duration_ns: u64, goal: Budget) {
        self.budgets.insert(svc, goal);
        match &mut self.phase {
            Phase::Watch { samples, .. } => *samples += 1,
            Phase::Measure { epoch, seen, .. } => {
                // Only requests wholly under this epoch's lever, after the settling time.
                if now_ns.saturating_sub(duration_ns) >= epoch.measuring_from() {
                    epoch.samples.entry(svc).or_default().push(duration_ns);
                    seen.insert(svc);
                }
            }
            Phase::Settled { .. } => {}
        }
    }

    /// One online burst on the GPU completed at `now_ns` after `duration_ns` (online work
    /// pending from its start until drained): counted where no service's requests are.
    pub fn on_burst(&mut self, now_ns: u64, duration_ns: u64) {
        let goal = self.budget;
        self.on_request(now_ns, BURSTS, duration_ns, goal);
    }

    /// Offline progress on the GPU since the last call (`units`: entries consumed from the
    /// offline compute queues). The first call only starts the count.
    pub fn on_offline_progress(&mut self, now_ns: u64, units: u64) {
        self.progress_seen = true;
        let last = self.last_progress_ns.replace(now_ns);
        match &mut self.phase {
            Phase::Watch { units: u, .. } => *u = u.saturating_add(units),
            Phase::Measure { epoch, .. } => {
                if let Some(last) = last.filter(|&l| l >= epoch.measuring_from() && l < now_ns) {
                    epoch.units = epoch.units.saturating_add(units);
                    epoch.measured_ns += now_ns - last;
                }
            }
            Phase::Settled { .. } => {}
        }
    }

    /// A process joined, left or was reclassed on the GPU: what was measured no longer holds.
    /// A measurement in progress is dropped (back to the chosen lever); a new one starts once
    /// the new mix shows evidence. The services' alone figures are kept.
    pub fn on_mix_change(&mut self, now_ns: u64) {
        self.notes
            .push("mix changed: measuring again once online requests show".into());
        self.count_quiet(now_ns);
        self.history.clear();
        self.phase = Phase::Watch {
            since_ns: now_ns,
            samples: 0,
            units: 0,
        };
        // Applied at the next tick (a change to report).
    }

    /// Advances the phase; returns the lever change to apply, if any.
    pub fn tick(&mut self, now_ns: u64) -> Option<LeverChange> {
        match &mut self.phase {
            Phase::Watch {
                since_ns,
                samples,
                units,
            } => {
                let ready = *samples >= START_SAMPLES && (*units > 0 || !self.progress_seen);
                if ready {
                    return self.start(Kind::Calibrate, now_ns);
                }
                if now_ns.saturating_sub(*since_ns) >= WATCH_WINDOW_NS {
                    (*since_ns, *samples, *units) = (now_ns, 0, 0);
                }
                // Back to the chosen lever after a dropped measurement.
                self.switch(self.chosen, "measurement dropped: back to the chosen lever")
            }
            Phase::Settled { next_check_ns } => {
                if now_ns >= *next_check_ns {
                    return self.start(Kind::Confirm, now_ns);
                }
                None
            }
            Phase::Measure { .. } => self.step(now_ns),
        }
    }

    /// Whether a measurement starting at `now_ns` gets quiet windows: only where a lever can
    /// hold offline, a goal is a ratio (an absolute one needs no reference), and, after the
    /// first calibration, while quiet time stays within [`QUIET_SHARE`].
    fn quiet_allowed(&self, now_ns: u64) -> bool {
        let ratio = std::iter::once(&self.budget)
            .chain(self.budgets.values())
            .any(|b| matches!(b, Budget::Ratio(_)));
        let within = !self.calibrated
            || (self.quiet_ns as f64) < QUIET_SHARE * now_ns.saturating_sub(self.born_ns) as f64;
        self.quiet_lever.is_some() && ratio && within
    }

    /// Starts a calibration (every candidate) or a confirmation (the choice, `none`, the
    /// runner-up), each round with a quiet window where allowed.
    fn start(&mut self, kind: Kind, now_ns: u64) -> Option<LeverChange> {
        let (set, rounds) = match kind {
            Kind::Calibrate => (self.candidates.clone(), ROUNDS),
            Kind::Confirm => {
                let mut s = vec![self.chosen];
                for l in [Some(Lever::None), self.runner_up].into_iter().flatten() {
                    if self.candidates.contains(&l) && !s.contains(&l) {
                        s.push(l);
                    }
                }
                (s, CONFIRM_ROUNDS)
            }
        };
        if set.len() < 2 {
            // One candidate: nothing to choose.
            self.phase = Phase::Settled {
                next_check_ns: u64::MAX,
            };
            return self.switch(self.chosen, "the only candidate");
        }
        let mut set: Vec<Option<Lever>> = set.into_iter().map(Some).collect();
        if self.quiet_allowed(now_ns) {
            set.push(None);
        }
        // Rotated per round: each lever follows a different one each time.
        let plan: Vec<Option<Lever>> = (0..rounds)
            .flat_map(|r| {
                let n = set.len();
                let set = &set;
                (0..n).map(move |i| set[(i + r) % n])
            })
            .collect();
        self.notes.push(format!(
            "{}: {} epochs of {}-{} ms ({})",
            match kind {
                Kind::Calibrate => "calibrating",
                Kind::Confirm => "confirming",
            },
            plan.len(),
            EPOCH_NS / MS,
            MAX_EPOCH_NS / MS,
            set.iter().map(|l| label(*l)).collect::<Vec<_>>().join(", ")
        ));
        let first = plan[0];
        self.phase = Phase::Measure {
            kind,
            plan,
            idx: 0,
            epoch: Epoch::new(first, now_ns),
            stats: Vec::new(),
            seen: BTreeSet::new(),
        };
        let to = self.epoch_lever(first);
        self.switch(to, &epoch_reason(kind, 1, first))
    }

    /// What an epoch applies: its lever, or for a quiet window the lever that holds offline.
    fn epoch_lever(&self, l: Option<Lever>) -> Lever {
        l.or(self.quiet_lever).unwrap_or(self.chosen)
    }

    /// Adds a quiet epoch's time (at its end) to the quiet total.
    fn count_quiet(&mut self, now_ns: u64) {
        if let Phase::Measure { epoch, .. } = &self.phase {
            if epoch.lever.is_none() {
                self.quiet_ns += now_ns.saturating_sub(epoch.start_ns);
            }
        }
    }

    /// A measurement's tick: the epoch ends, is extended, or the measurement is dropped.
    fn step(&mut self, now_ns: u64) -> Option<LeverChange> {
        let (kind, lever, age, empty, short, any) = {
            let Phase::Measure {
                kind, epoch, seen, ..
            } = &self.phase
            else {
                return None;
            };
            let age = now_ns.saturating_sub(epoch.start_ns);
            // Requests, where a service has them, make the GPU's bursts moot.
            let real = seen.iter().any(|&s| s != BURSTS);
            let wanted: Vec<u32> = seen
                .iter()
                .copied()
                .filter(|&s| !real || s != BURSTS)
                .collect();
            let short = wanted.iter().any(|&s| epoch.count(s) < MIN_REQUESTS);
            let any = wanted.iter().any(|&s| epoch.count(s) > 0);
            (*kind, epoch.lever, age, seen.is_empty(), short, any)
        };
        if age < EPOCH_NS || ((short || empty) && age < MAX_EPOCH_NS) {
            return None;
        }
        if empty || !any {
            // No request is no evidence.
            let why = format!(
                "no conclusion: no online request in {} ms under {}: keeping {}",
                age / MS,
                label(lever),
                self.chosen
            );
            self.notes.push(why.clone());
            self.count_quiet(now_ns);
            self.phase = match kind {
                // A confirmation that cannot measure keeps the choice until the next one.
                Kind::Confirm => Phase::Settled {
                    next_check_ns: now_ns.saturating_add(RECHECK_NS),
                },
                Kind::Calibrate => Phase::Watch {
                    since_ns: now_ns,
                    samples: 0,
                    units: 0,
                },
            };
            return self.switch(self.chosen, &why);
        }
        self.count_quiet(now_ns);
        let Phase::Measure {
            plan,
            idx,
            epoch,
            stats,
            ..
        } = &mut self.phase
        else {
            return None;
        };
        stats.push(epoch.stat());
        *idx += 1;
        if let Some(&next) = plan.get(*idx) {
            let n = *idx + 1;
            *epoch = Epoch::new(next, now_ns);
            let to = self.epoch_lever(next);
            return self.switch(to, &epoch_reason(kind, n, next));
        }
        let stats = std::mem::take(stats);
        self.conclude(kind, &stats, now_ns)
    }

    fn conclude(&mut self, kind: Kind, stats: &[Stat], now_ns: u64) -> Option<LeverChange> {
        for s in stats.iter().filter(|s| s.lever.is_none()) {
            for (&svc, d) in &s.samples {
                self.alone.add(svc, d);
            }
        }
        // Each lever's requests pool over its recent epochs since the mix last changed, not
        // this measurement's alone: a confirmation sharpens the tail the calibration read from
        // a dozen requests at low rates.
        for s in stats.iter().filter(|s| s.lever.is_some()) {
            let mine = self.history.iter().filter(|h| h.lever == s.lever).count();
            if mine >= HISTORY_EPOCHS {
                if let Some(i) = self.history.iter().position(|h| h.lever == s.lever) {
                    self.history.remove(i);
                }
            }
            self.history.push(s.clone());
        }
        let (sums, targets) =
            measure::summarize(&self.history, &self.budgets, self.budget, &self.alone);
        let d = decide(&sums, self.chosen, INCUMBENT_SLACK, RATE_MARGIN);
        let refs = targets
            .iter()
            .map(|(&s, &(ns, basis))| format!("{} {} ({basis})", svc_name(s), fmt_ms(ns)))
            .collect::<Vec<_>>()
            .join(", ");
        let reason = format!("{}; targets {refs}", d.reason);
        self.targets = targets
            .into_iter()
            .map(|(svc, (target_ns, basis))| TargetView {
                svc,
                target_ns,
                basis: basis.into(),
            })
            .collect();
        self.last = sums;
        let settle = Phase::Settled {
            next_check_ns: now_ns.saturating_add(RECHECK_NS),
        };
        // The choice met every target when chosen; a confirmation where it no longer does
        // (the pair changed) measures everything again, whatever it would pick of the few.
        let slipped = self.met
            && self
                .last
                .iter()
                .find(|s| s.lever == self.chosen)
                .is_some_and(|s| s.worst > INCUMBENT_SLACK);
        match kind {
            Kind::Confirm if slipped => {
                self.notes.push(format!(
                    "the confirmation finds {} over its targets: {} meanwhile, calibrating \
                     again ({reason})",
                    self.chosen, d.lever
                ));
                // What the pooled evidence favours now is the lever to fall back to while the
                // calibration runs (or if it is dropped): not the choice just refuted.
                self.chosen = d.lever;
                self.runner_up = d.runner_up;
                self.met = sums_met(&self.last, d.lever);
                self.start(Kind::Calibrate, now_ns)
            }
            Kind::Confirm if d.lever == self.chosen => {
                self.notes
                    .push(format!("confirmed {}: {reason}", self.chosen));
                if d.runner_up.is_some() {
                    self.runner_up = d.runner_up;
                }
                self.phase = settle;
                self.switch(self.chosen, "confirmed")
            }
            Kind::Confirm => {
                // One short measurement does not flip the lever: a full one decides.
                self.notes.push(format!(
                    "the confirmation favours {} over {}: calibrating again ({reason})",
                    d.lever, self.chosen
                ));
                self.start(Kind::Calibrate, now_ns)
            }
            Kind::Calibrate => {
                let reason = format!("chose {}: {reason}", d.lever);
                self.notes.push(reason.clone());
                self.chosen = d.lever;
                self.runner_up = d.runner_up;
                self.met = sums_met(&self.last, d.lever);
                self.calibrated = true;
                self.phase = settle;
                self.switch(d.lever, &reason)
            }
        }
    }

    fn switch(&mut self, to: Lever, reason: &str) -> Option<LeverChange> {
        if to == self.applied {
            return None;
        }
        let from = std::mem::replace(&mut self.applied, to);
        Some(LeverChange {
            from,
            to,
            reason: reason.to_string(),
        })
    }
}

fn sums_met(sums: &[Summary], l: Lever) -> bool {
    sums.iter()
        .any(|s| s.lever == l && s.worst <= INCUMBENT_SLACK)
}

fn label(l: Option<Lever>) -> &'static str {
    l.map_or("quiet", Lever::label)
}

fn epoch_reason(kind: Kind, n: usize, l: Option<Lever>) -> String {
    let what = match kind {
        Kind::Calibrate => "calibrating",
        Kind::Confirm => "confirming",
    };
    match l {
        Some(_) => format!("{what}: epoch {n}"),
        None => format!("{what}: epoch {n}, quiet (offline held to measure the services alone)"),
    }
}

#[cfg(test)]
mod tests;
