//! The adaptive strategy's per-GPU tuner: it measures online service times from the host model
//! and chooses, per GPU, the least intervention that keeps them within the operator's budget.
//!
//! The unit of online work is a *burst*: from the first strict evidence of online work (a launch
//! hint newer than the last sample, a backlog, a write pointer that moved in the latest sample)
//! until `resume_after` without any. Its length (first to last evidence) estimates a request's
//! service time at the sampling resolution. Each burst is filed by what offline did meanwhile:
//! *clean* (offline not running, or held from its start on purpose: calibration and
//! exploration; the undisturbed service time),
//! *free* (offline ran and was never held: the disturbed one), or neither. The interference is
//! free p50 / clean p50; the target is `budget x clean p90` (or an absolute latency).
//!
//! The lever is how long into a burst offline may go on before it is suspended (the *defer*),
//! a ladder from 0 (at once, like `priority`) through fractions of the clean p90 to "never".
//! Calibration first (suspend at once until the clean samples are in, then leave offline alone
//! until the free ones are), then a model picks the starting rung: a burst that runs disturbed
//! at `f` times the undisturbed speed for `t` and then undisturbed ends at `U + t (1 - 1/f)`, so
//! the longest defer meeting target `T` is `(T - U) f / (f - 1)`. Feedback then moves the rung:
//! every [`ADJUST`] bursts, the p90 of those bursts against the target: over it (with their
//! median shifted too, [`SHIFT`]: a p90 of a few dozen bursts scatters by as much as a 10%
//! budget), two rungs earlier, and that rung is not tried again for a while (doubling); else
//! one rung later. No suspends at all when the free p90 is within the target or the free
//! median is not [`SHIFT`] above the clean one: suspensions would buy nothing. An escalation
//! whose next step is no faster is undone, and escalations pause for a while (doubling): the
//! slowness was not offline's (the host's, or the online work's own).
//! Every [`EXPLORE_EVERY`] bursts one is held from its start to keep the clean figure fresh.
//!
//! Deterministic: a function of the ticks it is given (no clock, no randomness), so tests drive
//! it with synthetic host models.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{Budget, Policy};

/// Milliseconds with two decimals: defers and service times are often below one.
fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

/// Samples kept per kind of burst.
const RING: usize = 64;
/// Clean and free bursts wanted before the model picks a rung.
pub(crate) const CALIBRATE: usize = 12;
/// Bursts per feedback step.
pub const ADJUST: u32 = 24;
/// A median this much above the clean one is interference; below it, noise. The p90 of a
/// feedback step's bursts scatters by 10-15% in the emulator, as much as a 1.1 budget: a miss
/// needs the median shifted too.
const SHIFT: f64 = 1.05;
/// One burst in this many is held from its start (a clean sample) once calibrated.
pub const EXPLORE_EVERY: u64 = 64;
/// A burst longer than this is not a request (an online process that never idles): it is not
/// filed, and the starvation guard keeps offline going.
const MAX_BURST_NS: u64 = 2_000_000_000;
/// Defers in eighths of the clean p90; `None`: never suspend.
const LADDER: [Option<u64>; 7] = [Some(0), Some(1), Some(2), Some(4), Some(8), Some(16), None];
const NEVER: usize = LADDER.len() - 1;
/// First cool-down (in bursts) of a rung that missed the target; doubles per miss.
const COOLDOWN: u64 = 4 * ADJUST as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Offline held from each burst's start, for the clean samples.
    CalibrateClean,
    /// Offline left alone, for the free samples.
    CalibrateFree,
    Tuned,
}

/// One burst of online work on the GPU.
#[derive(Clone, Copy, Debug)]
struct Burst {
    start_ns: u64,
    last_work_ns: u64,
    /// Offline ran unheld this long during the burst.
    unheld_ns: u64,
    /// Offline was held at some tick of the burst.
    held: bool,
    offline_seen: bool,
    /// Held from its start whatever the rung (calibration, exploration).
    explore: bool,
    /// Never suspended (calibration of the free figure).
    hands_off: bool,
}

#[derive(Default)]
struct Ring(VecDeque<u64>);

impl Ring {
    fn push(&mut self, v: u64) {
        if self.0.len() == RING {
            self.0.pop_front();
        }
        self.0.push_back(v);
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn p90(&self) -> Option<u64> {
        pct(self.0.iter().copied(), 90)
    }
    fn p50(&self) -> Option<u64> {
        pct(self.0.iter().copied(), 50)
    }
}

fn pct(v: impl Iterator<Item = u64>, p: usize) -> Option<u64> {
    let mut v: Vec<u64> = v.collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[(v.len() * p / 100).min(v.len() - 1)])
}

/// What `top` and the status file show per GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct View {
    pub gpu_id: u32,
    pub phase: Phase,
    /// The online goal (ns): budget x clean p90, or the absolute budget.
    pub target_ns: Option<u64>,
    pub budget: String,
    /// Undisturbed (clean) and disturbed (free) service time p90s, and the last feedback
    /// step's p90 under control.
    pub clean_p90_ns: Option<u64>,
    pub free_p90_ns: Option<u64>,
    pub achieved_p90_ns: Option<u64>,
    /// The current defer (ns); None: never suspend.
    pub defer_ns: Option<u64>,
    /// Fraction of the time offline was not held on this GPU.
    pub offline_kept: f64,
    pub bursts: u64,
}

/// One line for `top`: "goal 4.30ms (1.10x undisturbed): service p90 4.12ms, undisturbed
/// 3.91ms, defer 0.49ms, offline kept 93%".
impl std::fmt::Display for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<u64>| v.map_or("-".to_owned(), fmt_ms);
        let action = match (self.phase, self.defer_ns) {
            (Phase::Tuned, None) => "no suspends".to_owned(),
            (Phase::Tuned, Some(0)) => "suspend at once".to_owned(),
            (Phase::Tuned, Some(d)) => format!("defer {}", fmt_ms(d)),
            _ => "calibrating".to_owned(),
        };
        write!(
            f,
            "goal {} ({}): service p90 {}, undisturbed {}, {action}, offline kept {:.0}%",
            ms(self.target_ns),
            self.budget,
            ms(self.achieved_p90_ns),
            ms(self.clean_p90_ns),
            self.offline_kept * 100.0
        )
    }
}

/// The tuner of one GPU.
pub struct Tuner {
    phase: Phase,
    burst: Option<Burst>,
    last_tick_ns: Option<u64>,
    clean: Ring,
    free: Ring,
    /// Lengths of the bursts since the last rung change.
    step: Vec<u64>,
    achieved: Option<u64>,
    bursts: u64,
    /// Bursts filed since calibration of the free figure began.
    free_tries: u64,
    rung: usize,
    /// Per rung: not tried again before this burst count, and the cool-down of its next miss.
    blocked_until: [u64; LADDER.len()],
    cooldown: [u64; LADDER.len()],
    /// The last feedback step's rung and p90: whether an escalation bought anything.
    last_step: Option<(usize, u64)>,
    /// No escalation before this burst count (an escalation bought nothing), and the next such
    /// pause.
    calm_until: u64,
    calm: u64,
    held_ns: u64,
    elapsed_ns: u64,
    notes: Vec<String>,
}

impl Default for Tuner {
    fn default() -> Self {
        Self {
            phase: Phase::CalibrateClean,
            burst: None,
            last_tick_ns: None,
            clean: Ring::default(),
            free: Ring::default(),
            step: Vec::new(),
            achieved: None,
            bursts: 0,
            free_tries: 0,
            rung: 0,
            blocked_until: [0; LADDER.len()],
            cooldown: [COOLDOWN; LADDER.len()],
            last_step: None,
            calm_until: 0,
            calm: COOLDOWN,
            held_ns: 0,
            elapsed_ns: 0,
            notes: Vec::new(),
        }
    }
}

impl Tuner {
    /// One tick. `work`: this tick's strict evidence of online work on the GPU (first, last);
    /// `held`: offline queues are held there; `offline_active`: an offline queue there has work.
    pub fn tick(
        &mut self,
        p: &Policy,
        budget: Budget,
        now: u64,
        work: Option<(u64, u64)>,
        held: bool,
        offline_active: bool,
    ) {
        let dt = self.last_tick_ns.map_or(0, |t| now.saturating_sub(t));
        self.last_tick_ns = Some(now);
        self.elapsed_ns += dt;
        if held {
            self.held_ns += dt;
        }
        if let Some(b) = &mut self.burst {
            if offline_active && !held {
                b.unheld_ns += dt;
            }
            b.held |= held;
            b.offline_seen |= offline_active;
        }
        match (self.burst.as_mut(), work) {
            (Some(b), Some((_, last))) => b.last_work_ns = b.last_work_ns.max(last),
            (Some(b), None) if now.saturating_sub(b.last_work_ns) >= p.resume_after_ns => {
                let b = *b;
                self.burst = None;
                self.end(b, budget);
            }
            (Some(_), None) => {}
            (None, Some((first, last))) => {
                let start = first.min(now);
                self.bursts += 1;
                let explore = match self.phase {
                    Phase::CalibrateClean => true,
                    Phase::CalibrateFree => false,
                    Phase::Tuned => self.bursts.is_multiple_of(EXPLORE_EVERY),
                };
                self.burst = Some(Burst {
                    start_ns: start,
                    last_work_ns: last.min(now).max(start),
                    unheld_ns: 0,
                    held,
                    offline_seen: offline_active,
                    explore,
                    hands_off: self.phase == Phase::CalibrateFree,
                });
            }
            (None, None) => {}
        }
    }

    /// Whether offline should be held now: in a burst, once its defer has passed.
    pub fn wants_suspend(&self, now: u64) -> bool {
        let Some(b) = &self.burst else {
            return false;
        };
        if b.hands_off {
            return false;
        }
        if b.explore {
            return true;
        }
        match self.defer_ns() {
            Some(d) => now.saturating_sub(b.start_ns) >= d,
            None => false,
        }
    }

    /// A burst is going on (online work is not `resume_after` idle).
    pub fn in_burst(&self) -> bool {
        self.burst.is_some()
    }

    /// When the current burst made offline due for suspension: its start when held from the
    /// start, else its start plus the defer.
    pub fn trigger_ns(&self) -> Option<u64> {
        let b = self.burst.as_ref()?;
        if b.explore {
            return Some(b.start_ns);
        }
        self.defer_ns().map(|d| b.start_ns + d)
    }

    pub fn burst_start_ns(&self) -> Option<u64> {
        self.burst.map(|b| b.start_ns)
    }

    /// The current defer; None: never (also before calibration gives the clean figure).
    fn defer_ns(&self) -> Option<u64> {
        let eighths = LADDER[self.rung]?;
        Some(self.clean.p90().unwrap_or(0) * eighths / 8)
    }

    fn target_ns(&self, budget: Budget) -> Option<u64> {
        match budget {
            Budget::Ratio(r) => self.clean.p90().map(|u| (u as f64 * r) as u64),
            Budget::Absolute(ns) => Some(ns),
        }
    }

    fn end(&mut self, b: Burst, budget: Budget) {
        let len = b.last_work_ns.saturating_sub(b.start_ns);
        if len > MAX_BURST_NS {
            return;
        }
        // Undisturbed: offline idle throughout, or a burst held from its start on purpose
        // (calibration, exploration) with a quarter of it unheld at most (the tick and the
        // suspend call). Bursts the rungs held are not: the figure the target is made of
        // would then follow the control's own overheads upwards.
        let clean = !b.offline_seen || (b.explore && b.held && b.unheld_ns <= len / 4);
        let free = b.offline_seen && !b.held;
        if clean {
            self.clean.push(len);
        }
        if free {
            self.free.push(len);
        }
        match self.phase {
            Phase::CalibrateClean => {
                if self.clean.len() >= CALIBRATE {
                    self.phase = Phase::CalibrateFree;
                    self.free_tries = 0;
                }
            }
            Phase::CalibrateFree => {
                self.free_tries += 1;
                // Without running offline work there is nothing to measure: no interference.
                if self.free.len() >= CALIBRATE || self.free_tries >= 2 * CALIBRATE as u64 {
                    self.calibrated(budget);
                }
            }
            Phase::Tuned => {
                if !b.explore {
                    self.step.push(len);
                }
                if self.step.len() >= ADJUST as usize {
                    self.feedback(budget);
                }
            }
        }
    }

    /// The model's first rung, from the clean and free figures.
    fn calibrated(&mut self, budget: Budget) {
        self.phase = Phase::Tuned;
        let (Some(u), Some(t)) = (self.clean.p90(), self.target_ns(budget)) else {
            return;
        };
        let d = self.free.p90();
        // The slowdown from the medians (robust to a few outliers), the verdict from the tail.
        let f = match (self.free.p50(), self.clean.p50()) {
            (Some(a), Some(b)) if self.free.len() >= CALIBRATE / 2 => a as f64 / b.max(1) as f64,
            _ => 1.0,
        };
        let rung = match d {
            Some(d) if d > t && f >= SHIFT => {
                let tmax = t.saturating_sub(u) as f64 * f / (f - 1.0);
                // The longest defer within tmax.
                (0..NEVER)
                    .rev()
                    .find(|&i| LADDER[i].is_some_and(|e| (u * e / 8) as f64 <= tmax))
                    .unwrap_or(0)
            }
            _ => NEVER,
        };
        self.set_rung(rung);
        self.notes.push(format!(
            "calibrated: clean p90 {}, free p90 {}, interference {f:.2}x, target {}: {}",
            fmt_ms(u),
            d.map_or("-".into(), fmt_ms),
            fmt_ms(t),
            self.rung_text()
        ));
    }

    fn feedback(&mut self, budget: Budget) {
        let achieved = pct(self.step.iter().copied(), 90);
        self.achieved = achieved;
        let (Some(a), Some(t), Some(u50)) = (achieved, self.target_ns(budget), self.clean.p50())
        else {
            self.step.clear();
            return;
        };
        let median = pct(self.step.iter().copied(), 50).unwrap_or(0);
        let missed = a > t && median as f64 > u50 as f64 * SHIFT;
        let old = self.rung;
        let last = self.last_step.replace((old, a));
        // The step before escalated, and holding offline earlier bought nothing: the slowness
        // is not offline's doing (the host, the online work itself). Back to the rung before,
        // and no escalation for a while (longer each time).
        let no_gain =
            missed && last.is_some_and(|(r, prev)| r > old && a as f64 >= prev as f64 / SHIFT);
        if no_gain {
            let (back, prev) = last.unwrap_or((NEVER, a));
            self.calm_until = self.bursts + self.calm;
            self.calm = (self.calm * 2).min(64 * COOLDOWN);
            self.set_rung(back);
            self.last_step = None;
            self.notes.push(format!(
                "p90 of the last {ADJUST} bursts {} vs {} before suspending earlier: suspensions \
                 bought nothing; {} (no escalation for {} bursts)",
                fmt_ms(a),
                fmt_ms(prev),
                self.rung_text(),
                self.calm_until - self.bursts
            ));
            return;
        }
        if missed && self.bursts < self.calm_until {
            self.step.clear();
            return;
        }
        if missed {
            // Missed: this rung cools down (longer each time), two rungs earlier.
            self.blocked_until[old] = self.bursts + self.cooldown[old];
            self.cooldown[old] = (self.cooldown[old] * 2).min(64 * COOLDOWN);
            self.set_rung(old.saturating_sub(2));
        } else if old < NEVER && self.bursts >= self.blocked_until[old + 1] {
            self.set_rung(old + 1);
        } else {
            self.step.clear();
            return;
        }
        if self.rung != old {
            self.notes.push(format!(
                "p90 of the last {} bursts {} vs target {} ({}): {}",
                ADJUST,
                fmt_ms(a),
                fmt_ms(t),
                if missed { "missed" } else { "met" },
                self.rung_text()
            ));
        }
    }

    fn set_rung(&mut self, rung: usize) {
        self.rung = rung;
        self.step.clear();
    }

    fn rung_text(&self) -> String {
        match self.defer_ns() {
            None => "no suspends".into(),
            Some(0) => "suspend at once".into(),
            Some(d) => format!("suspend after {} of a burst", fmt_ms(d)),
        }
    }

    /// Why offline is suspended now, for the decision's reason.
    pub fn reason(&self, budget: Budget) -> String {
        let b = self.burst.as_ref();
        let why = match self.phase {
            Phase::CalibrateClean => "calibrating (clean sample)".to_owned(),
            Phase::CalibrateFree => "calibrating".to_owned(),
            Phase::Tuned if b.is_some_and(|b| b.explore) => "exploring (clean sample)".to_owned(),
            Phase::Tuned => self.rung_text(),
        };
        format!(
            "adaptive: {why}; target {}, clean p90 {}, free p90 {}",
            self.target_ns(budget).map_or("-".into(), fmt_ms),
            self.clean.p90().map_or("-".into(), fmt_ms),
            self.free.p90().map_or("-".into(), fmt_ms),
        )
    }

    /// What the tuner concluded since the last call (rung changes, calibration).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    pub fn view(&self, gpu_id: u32, budget: Budget) -> View {
        View {
            gpu_id,
            phase: self.phase,
            target_ns: self.target_ns(budget),
            budget: budget.to_string(),
            clean_p90_ns: self.clean.p90(),
            free_p90_ns: self.free.p90(),
            achieved_p90_ns: self.achieved,
            defer_ns: match self.phase {
                Phase::CalibrateClean => Some(0),
                Phase::CalibrateFree => None,
                Phase::Tuned => self.defer_ns(),
            },
            offline_kept: if self.elapsed_ns == 0 {
                1.0
            } else {
                1.0 - self.held_ns as f64 / self.elapsed_ns as f64
            },
            bursts: self.bursts,
        }
    }
}
