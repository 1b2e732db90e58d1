//! The lever tuner: per GPU, which lever (`none`, `dynamic`, `timeslice`, `pause`, ...) makes
//! offline work yield, chosen by measuring the live pair under each (strategy `adaptive` on
//! GPUs whose backend offers a choice: the candidates are the policy's that it offers).
//!
//! Why measure: on an H100 one static lever was wrong for some pair every time. The static
//! 200 us timeslice left an eager LLM decode service 1.4x slower, made two offline jobs switch
//! every 200 us (offline 0.42x) and took 20% of offline throughput where there was nothing to
//! remove; pausing per request cost offline 0.3-0.7x.
//!
//! Evidence (fed by the controller; no clock, no I/O here):
//! - [`LeverTuner::on_burst`]: one online burst on the GPU completed (online work pending from
//!   its start until drained), and how long it took: the online service's figure;
//! - [`LeverTuner::on_offline_progress`]: offline progress since the last call (entries the
//!   GPU consumed from the offline compute queues): the offline figure, as a rate;
//! - [`LeverTuner::on_mix_change`]: a process joined, left or was reclassed on the GPU.
//!
//! Calibration cycles the candidate levers in interleaved epochs ([`EPOCH_NS`] each, the
//! first [`SETTLE_NS`] after a switch discarded, at least [`MIN_BURSTS`] bursts, else
//! extended up to [`MAX_EPOCH_NS`]), [`ROUNDS`] rounds in a rotated order so that drift weighs
//! on every lever alike. Each epoch gives a burst p50/p90 and an offline rate; each lever's
//! figure is the median of its epochs' (one odd epoch does not decide). An epoch without
//! enough bursts ends the calibration with no conclusion: an online service that hardly runs
//! cannot show what a lever buys, and the lever stays what it was.
//!
//! The decision: the reference is the lowest burst p90 of any lever (pause, which holds
//! offline during bursts, approximates the service alone); the target is `budget x` that (or
//! the absolute `online_latency`). If `none` meets it there is nothing to remove: `none`.
//! Otherwise the lever meeting it with the most offline progress; if none meets it, the one
//! closest to the reference (ties by offline progress). The incumbent gets a little slack
//! ([`INCUMBENT_SLACK`], [`RATE_MARGIN`]) so that noise does not flap it.
//!
//! Then the choice is kept; every [`RECHECK_NS`] a short confirmation ([`CONFIRM_ROUNDS`]
//! rounds of the choice, `none` and the runner-up) checks it; a confirmation that disagrees
//! starts a full calibration, whose conclusion alone may change the lever. A mix change
//! starts over (once the new mix shows bursts again).

use serde::{Deserialize, Serialize};

use super::{Budget, Lever, LeverSet};

const MS: u64 = 1_000_000;
/// One calibration epoch: long enough for a request service at 20/s to show 16 bursts.
pub const EPOCH_NS: u64 = 1_000 * MS;
/// Discarded after each switch: work queued under the old lever, queues still paused.
pub const SETTLE_NS: u64 = 200 * MS;
/// Bursts an epoch needs before its p90 means anything; fewer: it is extended.
pub const MIN_BURSTS: usize = 8;
/// An epoch still short of [`MIN_BURSTS`] this long after its start ends the measurement
/// with no conclusion.
pub const MAX_EPOCH_NS: u64 = 4 * EPOCH_NS;
/// Rounds of a calibration (every candidate once per round).
pub const ROUNDS: usize = 3;
/// Rounds of a confirmation (the choice, `none`, the runner-up).
pub const CONFIRM_ROUNDS: usize = 2;
/// How often a settled choice is confirmed.
pub const RECHECK_NS: u64 = 60_000 * MS;
/// The incumbent meets the target up to this factor over it (noise around the boundary does
/// not flip it)...
pub const INCUMBENT_SLACK: f64 = 1.03;
/// ...and keeps its place unless another lever within the target makes this much more
/// offline progress.
pub const RATE_MARGIN: f64 = 1.05;
/// Levers whose burst p90s are this close are tied (offline progress decides).
const TIE: f64 = 1.02;
/// Waiting for evidence, the counts restart after this long without enough of it.
const WATCH_WINDOW_NS: u64 = 2 * EPOCH_NS;

/// A change of the lever applied on a GPU (calibration steps included), for the engine to
/// apply and audit.
#[derive(Clone, Debug, PartialEq)]
pub struct LeverChange {
    pub from: Lever,
    pub to: Lever,
    pub reason: String,
}

/// One epoch under one lever.
#[derive(Clone, Debug)]
struct Epoch {
    lever: Lever,
    start_ns: u64,
    /// Durations of the bursts that started after the settling time.
    bursts: Vec<u64>,
    /// Offline progress over `measured_ns` (intervals wholly after the settling time).
    units: u64,
    measured_ns: u64,
}

impl Epoch {
    fn new(lever: Lever, start_ns: u64) -> Self {
        Self {
            lever,
            start_ns,
            bursts: Vec::new(),
            units: 0,
            measured_ns: 0,
        }
    }

    fn measuring_from(&self) -> u64 {
        self.start_ns.saturating_add(SETTLE_NS)
    }

    fn stat(&self) -> Stat {
        Stat {
            lever: self.lever,
            p50: pct(&self.bursts, 50),
            p90: pct(&self.bursts, 90),
            // Progress over less than a quarter epoch says little: unknown.
            rate: (self.measured_ns >= EPOCH_NS / 4)
                .then(|| self.units as f64 * 1e9 / self.measured_ns as f64),
        }
    }
}

/// One epoch's figures.
#[derive(Clone, Copy, Debug)]
struct Stat {
    lever: Lever,
    p50: Option<u64>,
    p90: Option<u64>,
    /// Offline units per second; None: no progress reported.
    rate: Option<f64>,
}

/// A lever's figures over a measurement: the medians of its epochs'.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub lever: Lever,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub rate: Option<f64>,
    pub epochs: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Calibrate,
    Confirm,
}

#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for evidence under `chosen`: bursts (and offline progress, once any was ever
    /// reported) within a window.
    Watch {
        since_ns: u64,
        bursts: usize,
        units: u64,
    },
    /// Epochs under the levers of `plan`, in order.
    Measure {
        kind: Kind,
        plan: Vec<Lever>,
        idx: usize,
        epoch: Epoch,
        stats: Vec<Stat>,
    },
    /// The choice holds until `next_check_ns`.
    Settled { next_check_ns: u64 },
}

/// What the status file shows per GPU with a lever tuner (adaptive strategy).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeverView {
    pub gpu_id: u32,
    /// Applied now (an epoch's lever while measuring).
    pub lever: String,
    pub chosen: String,
    /// `watching` (waiting for online bursts), `calibrating`, `confirming` or `settled`.
    pub phase: String,
    /// The last decision's figures per lever.
    pub summaries: Vec<Summary>,
}

impl From<LeverView> for crate::observe::status::LeverView {
    fn from(v: LeverView) -> Self {
        Self {
            gpu_id: v.gpu_id,
            lever: v.lever,
            chosen: v.chosen,
            phase: v.phase,
            summaries: v
                .summaries
                .iter()
                .map(|s| crate::observe::status::LeverSummary {
                    lever: s.lever.label().into(),
                    p50_ns: s.p50_ns,
                    p90_ns: s.p90_ns,
                    rate: s.rate,
                    epochs: s.epochs,
                })
                .collect(),
        }
    }
}

/// One GPU's lever tuner.
#[derive(Clone, Debug)]
pub struct LeverTuner {
    candidates: Vec<Lever>,
    budget: Budget,
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
    /// The last decision's summaries (for `top` / the status).
    last: Vec<Summary>,
}

impl LeverTuner {
    /// A tuner that starts from `start` (the policy's `[nvidia] lever` when it is a
    /// candidate, else the first candidate) and measures `candidates` against `budget`.
    pub fn new(candidates: LeverSet, budget: Budget, start: Lever, now_ns: u64) -> Self {
        let mut c: Vec<Lever> = candidates.iter().collect();
        if c.is_empty() {
            c.push(start);
        }
        let start = if c.contains(&start) { start } else { c[0] };
        Self {
            candidates: c,
            budget,
            chosen: start,
            applied: start,
            runner_up: None,
            phase: Phase::Watch {
                since_ns: now_ns,
                bursts: 0,
                units: 0,
            },
            progress_seen: false,
            last_progress_ns: None,
            notes: Vec::new(),
            last: Vec::new(),
        }
    }

    /// The lever to apply on the GPU now.
    pub fn lever(&self) -> Lever {
        self.applied
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

    pub fn view(&self, gpu_id: u32) -> LeverView {
        LeverView {
            gpu_id,
            lever: self.applied.label().into(),
            chosen: self.chosen.label().into(),
            phase: match &self.phase {
                Phase::Watch { .. } => "watching",
                Phase::Measure {
                    kind: Kind::Calibrate,
                    ..
                } => "calibrating",
                Phase::Measure { .. } => "confirming",
                Phase::Settled { .. } => "settled",
            }
            .into(),
            summaries: self.last.clone(),
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

    /// One online burst on the GPU completed at `now_ns` after `duration_ns` (online work
    /// pending from its start until drained).
    pub fn on_burst(&mut self, now_ns: u64, duration_ns: u64) {
        match &mut self.phase {
            Phase::Watch { bursts, .. } => *bursts += 1,
            Phase::Measure { epoch, .. } => {
                // Only bursts wholly under this epoch's lever, after the settling time.
                if now_ns.saturating_sub(duration_ns) >= epoch.measuring_from() {
                    epoch.bursts.push(duration_ns);
                }
            }
            Phase::Settled { .. } => {}
        }
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
    /// the new mix shows evidence.
    pub fn on_mix_change(&mut self, now_ns: u64) {
        self.notes
            .push("mix changed: measuring again once online bursts show".into());
        self.phase = Phase::Watch {
            since_ns: now_ns,
            bursts: 0,
            units: 0,
        };
        // Applied at the next tick (a change to report).
    }

    /// Advances the phase; returns the lever change to apply, if any.
    pub fn tick(&mut self, now_ns: u64) -> Option<LeverChange> {
        match &mut self.phase {
            Phase::Watch {
                since_ns,
                bursts,
                units,
            } => {
                let ready = *bursts >= MIN_BURSTS && (*units > 0 || !self.progress_seen);
                if ready {
                    return self.start(Kind::Calibrate, now_ns);
                }
                if now_ns.saturating_sub(*since_ns) >= WATCH_WINDOW_NS {
                    (*since_ns, *bursts, *units) = (now_ns, 0, 0);
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

    /// Starts a calibration (every candidate) or a confirmation (the choice, `none`, the
    /// runner-up).
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
        // Rotated per round: each lever follows a different one each time.
        let plan: Vec<Lever> = (0..rounds)
            .flat_map(|r| {
                let n = set.len();
                let set = &set;
                (0..n).map(move |i| set[(i + r) % n])
            })
            .collect();
        self.notes.push(format!(
            "{}: {} epochs of {} ms ({})",
            match kind {
                Kind::Calibrate => "calibrating",
                Kind::Confirm => "confirming",
            },
            plan.len(),
            EPOCH_NS / MS,
            set.iter().map(|l| l.label()).collect::<Vec<_>>().join(", ")
        ));
        let first = plan[0];
        self.phase = Phase::Measure {
            kind,
            plan,
            idx: 0,
            epoch: Epoch::new(first, now_ns),
            stats: Vec::new(),
        };
        self.switch(first, &epoch_reason(kind, 1))
    }

    /// A measurement's tick: the epoch ends, is extended, or the measurement is dropped.
    fn step(&mut self, now_ns: u64) -> Option<LeverChange> {
        let Phase::Measure {
            kind,
            plan,
            idx,
            epoch,
            stats,
        } = &mut self.phase
        else {
            return None;
        };
        let age = now_ns.saturating_sub(epoch.start_ns);
        if age < EPOCH_NS {
            return None;
        }
        if epoch.bursts.len() < MIN_BURSTS {
            if age < MAX_EPOCH_NS {
                return None;
            }
            // No disturbed samples is no evidence.
            let why = format!(
                "no conclusion: {} online burst(s) in {} ms under {} (fewer than {MIN_BURSTS}): \
                 keeping {}",
                epoch.bursts.len(),
                age / MS,
                epoch.lever,
                self.chosen
            );
            self.notes.push(why.clone());
            let kind = *kind;
            self.phase = match kind {
                // A confirmation that cannot measure keeps the choice until the next one.
                Kind::Confirm => Phase::Settled {
                    next_check_ns: now_ns.saturating_add(RECHECK_NS),
                },
                Kind::Calibrate => Phase::Watch {
                    since_ns: now_ns,
                    bursts: 0,
                    units: 0,
                },
            };
            return self.switch(self.chosen, &why);
        }
        stats.push(epoch.stat());
        *idx += 1;
        if let Some(&next) = plan.get(*idx) {
            let reason = epoch_reason(*kind, *idx + 1);
            *epoch = Epoch::new(next, now_ns);
            return self.switch(next, &reason);
        }
        let (kind, stats) = (*kind, std::mem::take(stats));
        self.conclude(kind, &stats, now_ns)
    }

    fn conclude(&mut self, kind: Kind, stats: &[Stat], now_ns: u64) -> Option<LeverChange> {
        let sums = summarize(stats);
        let d = decide(&sums, self.budget, self.chosen);
        self.last = sums;
        let settle = Phase::Settled {
            next_check_ns: now_ns.saturating_add(RECHECK_NS),
        };
        match kind {
            Kind::Confirm if d.lever == self.chosen => {
                self.notes
                    .push(format!("confirmed {}: {}", self.chosen, d.reason));
                if d.runner_up.is_some() {
                    self.runner_up = d.runner_up;
                }
                self.phase = settle;
                self.switch(self.chosen, "confirmed")
            }
            Kind::Confirm => {
                // One short measurement does not flip the lever: a full one decides.
                self.notes.push(format!(
                    "the confirmation favours {} over {}: calibrating again ({})",
                    d.lever, self.chosen, d.reason
                ));
                self.start(Kind::Calibrate, now_ns)
            }
            Kind::Calibrate => {
                let reason = format!("chose {}: {}", d.lever, d.reason);
                self.notes.push(reason.clone());
                self.chosen = d.lever;
                self.runner_up = d.runner_up;
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

fn epoch_reason(kind: Kind, n: usize) -> String {
    match kind {
        Kind::Calibrate => format!("calibrating: epoch {n}"),
        Kind::Confirm => format!("confirming: epoch {n}"),
    }
}

fn pct(v: &[u64], p: usize) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    Some(v[(v.len() * p / 100).min(v.len() - 1)])
}

fn median_f(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Each lever's figures: the medians over its epochs (in the order levers first appear).
fn summarize(stats: &[Stat]) -> Vec<Summary> {
    let mut levers: Vec<Lever> = Vec::new();
    for s in stats {
        if !levers.contains(&s.lever) {
            levers.push(s.lever);
        }
    }
    levers
        .into_iter()
        .filter_map(|l| {
            let mine: Vec<&Stat> = stats.iter().filter(|s| s.lever == l).collect();
            let p90 = median_f(
                mine.iter()
                    .filter_map(|s| s.p90)
                    .map(|v| v as f64)
                    .collect(),
            )?;
            let p50 = median_f(
                mine.iter()
                    .filter_map(|s| s.p50)
                    .map(|v| v as f64)
                    .collect(),
            )?;
            Some(Summary {
                lever: l,
                p50_ns: p50 as u64,
                p90_ns: p90 as u64,
                rate: median_f(mine.iter().filter_map(|s| s.rate).collect()),
                epochs: mine.len(),
            })
        })
        .collect()
}

/// A decision over measured levers.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub lever: Lever,
    pub runner_up: Option<Lever>,
    pub reason: String,
}

/// What it costs offline to apply a lever, in order, when nothing measured tells them apart
/// (offline progress not reported): nothing, a timeslice per episode, for good, a pause.
fn cost(l: Lever) -> u8 {
    l.intrusion()
}

/// The rule (module comment), pure: `current` is the incumbent.
pub fn decide(sums: &[Summary], budget: Budget, current: Lever) -> Decision {
    let Some(reference) = sums.iter().map(|s| s.p90_ns).min() else {
        return Decision {
            lever: current,
            runner_up: None,
            reason: "nothing measured".into(),
        };
    };
    let target = match budget {
        Budget::Ratio(r) => reference as f64 * r,
        Budget::Absolute(ns) => ns as f64,
    };
    let meets = |s: &Summary| {
        let slack = if s.lever == current {
            INCUMBENT_SLACK
        } else {
            1.0
        };
        s.p90_ns as f64 <= target * slack
    };
    let rate = |s: &Summary| s.rate.unwrap_or(0.0);
    let figures = sums
        .iter()
        .map(|s| {
            format!(
                "{} p90 {}{}",
                s.lever,
                fmt_ms(s.p90_ns),
                s.rate
                    .map_or(String::new(), |r| format!(" offline {r:.0}/s"))
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let head = format!(
        "{figures}; reference p90 {}, target {}",
        fmt_ms(reference),
        fmt_ms(target as u64)
    );
    let mut within: Vec<&Summary> = sums.iter().filter(|s| meets(s)).collect();
    // Most offline progress first; among equals the cheaper lever.
    within.sort_by(|a, b| {
        rate(b)
            .total_cmp(&rate(a))
            .then(cost(a.lever).cmp(&cost(b.lever)))
    });
    if let Some(none) = within.iter().find(|s| s.lever == Lever::None) {
        return Decision {
            lever: Lever::None,
            runner_up: within
                .iter()
                .find(|s| s.lever != Lever::None)
                .map(|s| s.lever),
            reason: format!(
                "{head}: none is within it (p90 {}): nothing to remove",
                fmt_ms(none.p90_ns)
            ),
        };
    }
    if let Some(best) = within.first() {
        // The incumbent stays unless the best makes clearly more offline progress.
        // (Without progress reports the cost order decides: it has no noise to damp.)
        let keep = within
            .iter()
            .find(|s| s.lever == current)
            .filter(|c| best.rate.is_some() && rate(best) <= rate(c) * RATE_MARGIN);
        let pick = keep.unwrap_or(best);
        let runner_up = within
            .iter()
            .find(|s| s.lever != pick.lever)
            .map(|s| s.lever);
        return Decision {
            lever: pick.lever,
            runner_up,
            reason: format!(
                "{head}: {} is within it with the most offline progress{}",
                pick.lever,
                if keep.is_some() && best.lever != current {
                    format!(" (kept: {} is not {RATE_MARGIN}x better)", best.lever)
                } else {
                    String::new()
                }
            ),
        };
    }
    // Nothing meets the target: closest to the reference, ties by offline progress.
    let mut close: Vec<&Summary> = sums.iter().collect();
    close.sort_by_key(|a| a.p90_ns);
    let best_p90 = close[0].p90_ns as f64;
    let mut tied: Vec<&Summary> = close
        .iter()
        .copied()
        .filter(|s| s.p90_ns as f64 <= best_p90 * TIE)
        .collect();
    tied.sort_by(|a, b| {
        rate(b)
            .total_cmp(&rate(a))
            .then(cost(a.lever).cmp(&cost(b.lever)))
    });
    let pick = tied[0];
    Decision {
        lever: pick.lever,
        runner_up: close
            .iter()
            .find(|s| s.lever != pick.lever)
            .map(|s| s.lever),
        reason: format!(
            "{head}: no lever meets it; {} is the closest (p90 {})",
            pick.lever,
            fmt_ms(pick.p90_ns)
        ),
    }
}

fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

#[cfg(test)]
mod tests;
