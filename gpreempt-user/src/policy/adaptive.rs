//! The adaptive strategy's per-GPU tuner: it measures online service times from the host model
//! and chooses, per GPU, the least intervention that keeps them within the operator's budget.
//!
//! The unit of online work is a *burst*: from the first strict evidence of online work (a launch
//! hint newer than the last sample, a backlog, a write pointer that moved in the latest sample)
//! until `resume_after` without any. Its length (first to last evidence) estimates a request's
//! service time at the sampling resolution. Each burst is filed by what offline did meanwhile:
//! *clean* (offline not running, or held from its start on purpose: calibration and
//! exploration; the undisturbed service time),
//! *free* (offline ran and was never held: the disturbed one), or neither.
//!
//! The lever is how long into a burst offline may go on before it is suspended (the *defer*),
//! a ladder from 0 (at once, like `priority`) through fractions of the clean p90 to "never".
//! The controller wakes at the defer's deadline ([`Tuner::deadline_ns`]), so a rung's defer is
//! what offline gets, not rounded up to the next tick.
//!
//! **Which tail.** The goal is about the request p99, which no sample count here can estimate:
//! the p99 of 24 bursts is their maximum. So:
//! - the target is `budget x` the clean p90 (or an absolute latency): the clean figure has few
//!   samples (12 from calibration, one per [`EXPLORE_EVERY`] bursts after), and the p90 is the
//!   highest quantile that is not their maximum;
//! - what a rung achieves is the p95 ([`TAIL`]) of every burst since the rung was set, up to the
//!   last [`POOL`] (a pooled window: the 5th largest of 96 scatters far less than the p90 of one
//!   step of [`ADJUST`]). Measuring the achieved p95 against the clean p90 is tighter than like
//!   against like, on purpose: the check is a p99, and the control's own cost (the suspend call
//!   at a held burst's start) is inside the clean figure already.
//!
//! **Decisions.** Calibration first (suspend at once until the clean samples are in, then leave
//! offline alone until the free ones are), then a model picks the starting rung: a burst that
//! runs disturbed at `f` times the undisturbed speed for `t` and then undisturbed ends at
//! `U + t (1 - 1/f)`, so the longest defer meeting target `T` is `(T - U) f / (f - 1)`, with
//! `f` the larger of the free/clean ratio of the medians and that of the p95s (interference
//! that hits a few requests hard shows in the tail only); no suspends when the free p90 is
//! within the target (like for like here: of a dozen samples a p95 is the maximum) or `f` is
//! under [`SHIFT`]. Then every [`ADJUST`] bursts:
//! - a rung that suspends *misses* when its pooled p95 is over the target: two rungs earlier,
//!   and that rung is not tried again for [`COOLDOWN`] bursts (doubling per miss). The tail
//!   alone decides, down to rung 0: once suspending, how early is a question about the tail.
//!   At rung 0 a miss changes nothing: it is the best there is (`priority`'s);
//! - at "never", a miss also needs the interference to show: the step's median [`SHIFT`] above
//!   the clean one, or the pooled p95 [`SHIFT`] above the clean p95 (like quantiles, so the
//!   clean bursts' own spread is not counted). Without either, suspensions would buy nothing;
//! - a rung that met the target over at least two steps' bursts moves one rung later, unless
//!   that rung is cooling down. Escalating needs one step, relaxing two: the asymmetry favours
//!   the online tail;
//! - an escalation after which neither the pooled p95 (over two steps at the new rung) nor the
//!   median improved by [`GAIN`] bought nothing: the slowness is not offline's (the host's, the
//!   online work's own). It is undone, and escalations pause for a while (doubling).
//!
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
/// Bursts at the current rung whose tail is judged (the pooled window).
pub const POOL: usize = 96;
/// The quantile of the achieved (and free) bursts compared with the target.
pub const TAIL: usize = 95;
/// A figure this much above (or below) another is a change; within it, noise (the p90 of one
/// step's 24 bursts scatters by 10-15% in the emulator, a pooled p95 by about half that).
const SHIFT: f64 = 1.05;
/// A pooled p95 (of at least 48 bursts) or a median this much lower after an escalation: it
/// bought something. A quarter of a 1.1 budget: smaller than noise-sized [`SHIFT`], since that
/// much of the tail is what the budget is about.
const GAIN: f64 = 1.025;
/// One burst in this many is held from its start (a clean sample) once calibrated.
pub const EXPLORE_EVERY: u64 = 64;
/// A burst longer than this is not a request (an online process that never idles): it is not
/// filed, and the starvation guard keeps offline going.
const MAX_BURST_NS: u64 = 2_000_000_000;
/// Defers in eighths of the clean p90; `None`: never suspend.
const LADDER: [Option<u64>; 7] = [Some(0), Some(1), Some(2), Some(4), Some(8), Some(16), None];
const NEVER: usize = LADDER.len() - 1;
/// First cool-down (in bursts) of a rung that missed the target; doubles per miss. Each
/// return to a rung that missed costs a step of bursts over the target: ten steps apart at
/// first, so a rung known to miss is a small share of the requests (the tail the goal is
/// about), yet tried again should the interference go.
const COOLDOWN: u64 = 10 * ADJUST as u64;
/// First pause of escalations after one that bought nothing; doubles each time.
const CALM: u64 = 4 * ADJUST as u64;

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
    fn tail(&self) -> Option<u64> {
        pct(self.0.iter().copied(), TAIL)
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
    /// The undisturbed (clean) service time p90 (the target's base), the disturbed (free) p95,
    /// and the p95 of the bursts at the current rung as of the last feedback step.
    pub clean_p90_ns: Option<u64>,
    pub free_p95_ns: Option<u64>,
    pub achieved_p95_ns: Option<u64>,
    /// The current defer (ns); None: never suspend.
    pub defer_ns: Option<u64>,
    /// Fraction of the time offline was not held on this GPU.
    pub offline_kept: f64,
    pub bursts: u64,
}

/// One line for `top`: "goal 4.30ms (1.10x undisturbed): service p95 4.12ms, undisturbed p90
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
            "goal {} ({}): service p95 {}, undisturbed p90 {}, {action}, offline kept {:.0}%",
            ms(self.target_ns),
            self.budget,
            ms(self.achieved_p95_ns),
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
    /// Lengths of the bursts since the last rung change (the last [`POOL`]), and how many
    /// came since the last feedback step.
    pool: VecDeque<u64>,
    step_n: usize,
    achieved: Option<u64>,
    bursts: u64,
    /// Bursts filed since calibration of the free figure began.
    free_tries: u64,
    rung: usize,
    /// Per rung: not tried again before this burst count, and the cool-down of its next miss.
    blocked_until: [u64; LADDER.len()],
    cooldown: [u64; LADDER.len()],
    /// The last feedback step's rung, pooled p95 and median: whether an escalation bought
    /// anything.
    last_step: Option<(usize, u64, u64)>,
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
            pool: VecDeque::new(),
            step_n: 0,
            achieved: None,
            bursts: 0,
            free_tries: 0,
            rung: 0,
            blocked_until: [0; LADDER.len()],
            cooldown: [COOLDOWN; LADDER.len()],
            last_step: None,
            calm_until: 0,
            calm: CALM,
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

    /// When offline falls due for suspension in the current burst, whether or not that has
    /// passed: the controller wakes then rather than at its next tick. None: not in a burst,
    /// or nothing to suspend in it (calibrating the free figure, the "never" rung).
    pub fn deadline_ns(&self) -> Option<u64> {
        if self.burst.as_ref()?.hands_off {
            return None;
        }
        self.trigger_ns()
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
                    if self.pool.len() == POOL {
                        self.pool.pop_front();
                    }
                    self.pool.push_back(len);
                    self.step_n += 1;
                }
                if self.step_n >= ADJUST as usize {
                    self.step_n = 0;
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
        // The verdict like for like: with a dozen samples of each, the free p95 is their maximum
        // and would find interference in noise.
        let d = self.free.p90();
        // The slowdown: from the medians (robust to a few outliers) or, where offline hits a
        // few requests hard and leaves the rest, from the tails.
        let ratio = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) if self.free.len() >= CALIBRATE / 2 => a as f64 / b.max(1) as f64,
            _ => 1.0,
        };
        let (f50, f95) = (
            ratio(self.free.p50(), self.clean.p50()),
            ratio(self.free.tail(), self.clean.tail()),
        );
        let f = f50.max(f95);
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
            "calibrated: clean p90 {}, free p90 {}, interference {f:.2}x (p50 {f50:.2}x, \
             p{TAIL} {f95:.2}x), target {}: {}",
            fmt_ms(u),
            d.map_or("-".into(), fmt_ms),
            fmt_ms(t),
            self.rung_text()
        ));
    }

    /// One feedback step: the pooled tail of the current rung against the target.
    fn feedback(&mut self, budget: Budget) {
        let tail = pct(self.pool.iter().copied(), TAIL);
        self.achieved = tail;
        let (Some(a), Some(t), Some(u50), Some(u95)) = (
            tail,
            self.target_ns(budget),
            self.clean.p50(),
            self.clean.tail(),
        ) else {
            return;
        };
        let median = pct(self.pool.iter().rev().take(ADJUST as usize).copied(), 50).unwrap_or(0);
        let old = self.rung;
        // Before any suspend, a tail over the target must come with interference: the median
        // shifted, or the tail above the clean tail (like for like). Once suspending, the tail
        // alone says how early.
        let interference = median as f64 > u50 as f64 * SHIFT || a as f64 > u95 as f64 * SHIFT;
        let missed = a > t && (old < NEVER || interference);
        let n = self.pool.len();
        // Right after an escalation, a miss waits for a second step before it is judged: the
        // p95 of 24 bursts is their second largest, too rough to compare rungs with.
        let escalated = self.last_step.is_some_and(|(r, _, _)| r > old);
        if escalated && missed && n < 2 * ADJUST as usize {
            return;
        }
        let last = self.last_step.replace((old, a, median));
        // The step before escalated, and holding offline earlier bought nothing (neither the
        // tail nor the median moved): the slowness is not offline's doing (the host, the
        // online work itself). Back to the rung before, and no escalation for a while (longer
        // each time).
        let no_gain = missed
            && last.is_some_and(|(r, prev, prev_median)| {
                r > old
                    && a as f64 >= prev as f64 / GAIN
                    && median as f64 >= prev_median as f64 / GAIN
            });
        if no_gain {
            let (back, prev, _) = last.unwrap_or((NEVER, a, median));
            self.calm_until = self.bursts + self.calm;
            self.calm = (self.calm * 2).min(64 * CALM);
            self.set_rung(back);
            self.last_step = None;
            self.notes.push(format!(
                "p{TAIL} {} at this rung vs {} before suspending earlier: suspensions bought \
                 nothing; {} (no escalation for {} bursts)",
                fmt_ms(a),
                fmt_ms(prev),
                self.rung_text(),
                self.calm_until - self.bursts
            ));
            return;
        }
        if missed && (self.bursts < self.calm_until || old == 0) {
            // Calm after a useless escalation; or at once already, the best there is: stay,
            // and keep pooling.
            return;
        }
        if missed {
            // Missed: this rung cools down (longer each time), two rungs earlier.
            self.blocked_until[old] = self.bursts + self.cooldown[old];
            self.cooldown[old] = (self.cooldown[old] * 2).min(64 * COOLDOWN);
            self.set_rung(old.saturating_sub(2));
        } else if old < NEVER
            && n >= 2 * ADJUST as usize
            && self.bursts >= self.blocked_until[old + 1]
        {
            self.set_rung(old + 1);
        } else {
            return;
        }
        self.notes.push(format!(
            "p{TAIL} of the last {n} bursts at this rung {} vs target {} ({}; median {}, clean \
             p50 {}): {}",
            fmt_ms(a),
            fmt_ms(t),
            if missed { "missed" } else { "met" },
            fmt_ms(median),
            fmt_ms(u50),
            self.rung_text()
        ));
    }

    fn set_rung(&mut self, rung: usize) {
        self.rung = rung;
        self.pool.clear();
        self.step_n = 0;
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
            "adaptive: {why}; target {}, clean p90 {}, free p{TAIL} {}",
            self.target_ns(budget).map_or("-".into(), fmt_ms),
            self.clean.p90().map_or("-".into(), fmt_ms),
            self.free.tail().map_or("-".into(), fmt_ms),
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
            free_p95_ns: self.free.tail(),
            achieved_p95_ns: self.achieved,
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
