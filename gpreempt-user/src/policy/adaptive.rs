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
//! Calibration measures both figures side by side: bursts that start with offline running
//! alternate between held from the start and left alone, so drift (a process starting up, the
//! host) weighs on both alike. It ends once interference is evident by a one-sided test, a rank
//! test for a shifted distribution or a two-proportion test for more bursts over the target (a
//! long offline kernel blocks some requests and leaves the medians alone), or once it is absent.
//! The model then picks the rung: a burst that runs disturbed at `f` times the undisturbed speed
//! for `t` and then undisturbed ends at `U + t (1 - 1/f)`, so the longest defer meeting target
//! `T` is `(T - U) f / (f - 1)`, with `f` the larger of the median and p90 ratios; where the
//! tail's slowdown is well past the median's ([`BLOCKING`]), offline kernels block some requests
//! outright, such a request pays the whole defer, and the defer is at most `T - U`. Feedback every [`ADJUST`] bursts: a p90 over the target that
//! the same tests call real (against the clean bursts) moves two rungs earlier and cools that
//! rung down (doubling); one over the target within noise stays; a met step moves one rung later, but no later than the model's rung
//! (a few dozen bursts' p90 can meet the target where the request p99 does not). An escalation
//! whose next step is no faster is undone and escalations pause (doubling): the slowness was
//! not offline's. A miss at "never" runs the side-by-side experiment again instead.
//! One burst in [`EXPLORE_EVERY`] that starts with offline running is held from its start to
//! keep the clean figure fresh.
//!
//! Deterministic: a function of the ticks it is given (no clock, no randomness), so tests drive
//! it with synthetic host models.

use std::collections::VecDeque;

use super::{Budget, Policy};
pub use crate::observe::status::{AdaptivePhase as Phase, AdaptiveView as View};

/// Milliseconds with two decimals: defers and service times are often below one.
fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

/// Samples kept per kind of burst.
const RING: usize = 64;
/// Clean and free bursts wanted before the model picks a rung.
pub(crate) const CALIBRATE: usize = 16;
/// Clean and free bursts after which calibration calls interference absent.
pub(crate) const CALIBRATE_MAX: usize = 48;
/// Bursts per feedback step.
pub const ADJUST: u32 = 24;
/// A median this much above the clean one is a shift worth a rank test; an escalation must
/// make the next step this much faster to count.
const SHIFT: f64 = 1.05;
/// A free tail this many times the median's slowdown is blocking, not sharing.
const BLOCKING: f64 = 1.2;
/// The rank test's z (one-sided, p ~ 0.01) that calls disturbed bursts slower than clean ones.
const Z: f64 = 2.33;
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
    fn values(&self) -> Vec<u64> {
        self.0.iter().copied().collect()
    }
}

/// How far `a` lies above `b`, as the Mann-Whitney U statistic's z-score (ties count a half).
/// A rank test: a few outliers or a scattered p90 do not make two samples of one distribution
/// look apart, where a ratio of two small samples' percentiles often does.
fn rank_z(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let u: f64 = a
        .iter()
        .map(|x| {
            b.iter()
                .map(|y| match x.cmp(y) {
                    std::cmp::Ordering::Greater => 1.0,
                    std::cmp::Ordering::Equal => 0.5,
                    std::cmp::Ordering::Less => 0.0,
                })
                .sum::<f64>()
        })
        .sum();
    let (n, m) = (a.len() as f64, b.len() as f64);
    (u - n * m / 2.0) / (n * m * (n + m + 1.0) / 12.0).sqrt()
}

/// How much more often `a` than `b` exceeds `t`, as a two-proportion z-score: the budget is
/// about the tail, and interference in the tail (a long offline kernel blocking some requests)
/// can leave both medians where they were.
fn tail_z(a: &[u64], b: &[u64], t: u64) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let over = |v: &[u64]| v.iter().filter(|&&x| x > t).count() as f64;
    let (n, m) = (a.len() as f64, b.len() as f64);
    let (pa, pb) = (over(a) / n, over(b) / m);
    let p = (over(a) + over(b)) / (n + m);
    let se = (p * (1.0 - p) * (1.0 / n + 1.0 / m)).sqrt();
    if se == 0.0 {
        return 0.0;
    }
    (pa - pb) / se
}

fn pct(v: impl Iterator<Item = u64>, p: usize) -> Option<u64> {
    let mut v: Vec<u64> = v.collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[(v.len() * p / 100).min(v.len() - 1)])
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
    rung: usize,
    /// The latest rung feedback relaxes to: the model's. A feedback step judges a few dozen
    /// bursts' p90, which can meet the target at a rung where the request p99 misses it.
    cap: usize,
    /// Per rung: not tried again before this burst count, and the cool-down of its next miss.
    blocked_until: [u64; LADDER.len()],
    cooldown: [u64; LADDER.len()],
    /// The last feedback step's rung and p90: whether an escalation bought anything.
    last_step: Option<(usize, u64)>,
    /// No escalation before this burst count (an escalation bought nothing), and the next such
    /// pause.
    calm_until: u64,
    calm: u64,
    /// Calibrating again after a miss with no suspends, since this burst count.
    recalibrating: bool,
    cal_start: u64,
    held_ns: u64,
    elapsed_ns: u64,
    notes: Vec<String>,
}

impl Default for Tuner {
    fn default() -> Self {
        Self {
            phase: Phase::Calibrate,
            burst: None,
            last_tick_ns: None,
            clean: Ring::default(),
            free: Ring::default(),
            step: Vec::new(),
            achieved: None,
            bursts: 0,
            rung: 0,
            cap: NEVER,
            blocked_until: [0; LADDER.len()],
            cooldown: [COOLDOWN; LADDER.len()],
            last_step: None,
            calm_until: 0,
            calm: COOLDOWN,
            recalibrating: false,
            cal_start: 0,
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
                // Held on purpose only where offline runs: with offline idle the burst is a
                // clean sample anyway, and a suspend would buy nothing.
                let explore = offline_active
                    && match self.phase {
                        // Alternating, so that what drifts meanwhile (a process starting, the
                        // host) weighs on both figures alike.
                        Phase::Calibrate => self.bursts % 2 == 1,
                        Phase::Tuned => self.bursts.is_multiple_of(EXPLORE_EVERY),
                    };
                self.burst = Some(Burst {
                    start_ns: start,
                    last_work_ns: last.min(now).max(start),
                    unheld_ns: 0,
                    held,
                    offline_seen: offline_active,
                    explore,
                    hands_off: self.phase == Phase::Calibrate && !explore,
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
    /// None for a burst left alone on purpose. Also the deadline at which the engine decides
    /// again with no new evidence.
    pub fn trigger_ns(&self) -> Option<u64> {
        let b = self.burst.as_ref()?;
        if b.hands_off {
            return None;
        }
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
            Phase::Calibrate => {
                // Done once interference is evident, or at the latest once there are enough
                // samples to call it absent. Without running offline work there is nothing to
                // measure: no interference.
                let (c, f) = (self.clean.len(), self.free.len());
                let evident = c >= CALIBRATE
                    && f >= CALIBRATE
                    && self.model(budget).is_some_and(|(r, _)| r < NEVER);
                let met = (self.free.p90())
                    .zip(self.target_ns(budget))
                    .is_some_and(|(d, t)| d <= t);
                let absent = (c >= CALIBRATE && f >= CALIBRATE && met)
                    || (c >= CALIBRATE_MAX && f >= CALIBRATE_MAX);
                let no_offline =
                    c >= CALIBRATE && self.bursts - self.cal_start >= 4 * CALIBRATE as u64;
                if evident || absent || no_offline {
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
        let again = std::mem::take(&mut self.recalibrating);
        let Some((rung, text)) = self.model(budget) else {
            return;
        };
        self.cap = rung;
        self.set_rung(rung);
        self.last_step = None;
        if again && rung == NEVER {
            // The miss was not offline's: no new experiment for a while (longer each time).
            self.calm_until = self.bursts + self.calm;
            self.calm = (self.calm * 2).min(64 * COOLDOWN);
        }
        self.notes.push(format!(
            "{}: {text}: {}",
            if again { "recalibrated" } else { "calibrated" },
            self.rung_text()
        ));
    }

    /// The longest defer the interference model allows, and the figures it came from. A burst
    /// that runs disturbed at `f` times the undisturbed speed for `t`, then undisturbed, ends at
    /// `U + t (1 - 1/f)`: the longest defer meeting target `T` is `(T - U) f / (f - 1)`. The
    /// verdict (suspend at all) needs the free p90 over the target and the free bursts slower
    /// than the clean ones by a rank or tail test ([`Z`]); `f` is the larger of the median and p90
    /// ratios, because the request tail is what the budget is about: a long offline kernel
    /// blocks an online request outright (no progress for the defer), which the median hides.
    fn model(&self, budget: Budget) -> Option<(usize, String)> {
        let (u, t) = (self.clean.p90()?, self.target_ns(budget)?);
        let d = self.free.p90();
        let f_med = match (self.free.p50(), self.clean.p50()) {
            (Some(a), Some(b)) if self.free.len() >= CALIBRATE / 2 => a as f64 / b.max(1) as f64,
            _ => 1.0,
        };
        let f = f_med.max(d.map_or(1.0, |d| d as f64 / u.max(1) as f64));
        let (free, clean) = (self.free.values(), self.clean.values());
        let z = rank_z(&free, &clean).max(tail_z(&free, &clean, t));
        let rung = match d {
            Some(d) if d > t && free.len() >= CALIBRATE / 2 && z >= Z => {
                // Tail well past the median's shift: offline kernels block some requests
                // outright (no progress until the suspend), and such a request pays the whole
                // defer: f is unbounded, the defer at most T - U.
                let blocking = f >= f_med * BLOCKING;
                let tmax = if blocking {
                    t.saturating_sub(u) as f64
                } else {
                    t.saturating_sub(u) as f64 * f / (f - 1.0)
                };
                (0..NEVER)
                    .rev()
                    .find(|&i| LADDER[i].is_some_and(|e| (u * e / 8) as f64 <= tmax))
                    .unwrap_or(0)
            }
            _ => NEVER,
        };
        Some((
            rung,
            format!(
                "clean p90 {}, free p90 {}, interference {f_med:.2}x (tail {f:.2}x, z {z:.1}), \
                 target {}",
                fmt_ms(u),
                d.map_or("-".into(), fmt_ms),
                fmt_ms(t)
            ),
        ))
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
        let clean = self.clean.values();
        let missed = a > t
            && (tail_z(&self.step, &clean, t) >= Z
                || (median as f64 > u50 as f64 * SHIFT && rank_z(&self.step, &clean) >= Z));
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
        if missed && old == NEVER {
            // At "never" the figures to compare with are old, and a miss may be the host's or
            // the online work's own: held and free bursts measured side by side again decide.
            self.notes.push(format!(
                "p90 of the last {ADJUST} bursts {} vs target {} (missed) with no suspends: \
                 measuring held against free bursts again",
                fmt_ms(a),
                fmt_ms(t)
            ));
            self.phase = Phase::Calibrate;
            self.recalibrating = true;
            self.cal_start = self.bursts;
            self.clean = Ring::default();
            self.free = Ring::default();
            self.step.clear();
            return;
        }
        if missed {
            // Missed: this rung cools down (longer each time), two rungs earlier.
            self.blocked_until[old] = self.bursts + self.cooldown[old];
            self.cooldown[old] = (self.cooldown[old] * 2).min(64 * COOLDOWN);
            self.set_rung(old.saturating_sub(2));
            // What the model now allows bounds the relaxation that follows (NEVER where
            // calibration saw no interference).
            if let Some((r, _)) = self.model(budget) {
                self.cap = r.max(self.rung);
            }
        } else if a <= t && old < self.cap && self.bursts >= self.blocked_until[old + 1] {
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
                match (missed, a > t) {
                    (true, _) => "missed",
                    (false, true) => "over it, within noise",
                    (false, false) => "met",
                },
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
            Phase::Calibrate => "calibrating (clean sample)".to_owned(),
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
                Phase::Calibrate => None,
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

#[cfg(test)]
mod tests {
    use super::rank_z;

    #[test]
    fn the_rank_test_separates_a_shift_from_scatter() {
        let base: Vec<u64> = (0..24).map(|i| 3_000 + (i * 7919) % 2_000).collect();
        // One sample against itself, and against itself reordered with two outliers: no shift.
        assert!(rank_z(&base, &base).abs() < 1e-9);
        let mut outliers = base.clone();
        outliers.reverse();
        outliers[0] = 90_000;
        outliers[1] = 80_000;
        assert!(rank_z(&outliers, &base) < 1.0);
        // Every value 15% longer: far apart.
        let slow: Vec<u64> = base.iter().map(|v| v * 115 / 100).collect();
        assert!(rank_z(&slow, &base) > super::Z, "{}", rank_z(&slow, &base));
        assert!(rank_z(&base, &slow) < -super::Z);
        assert_eq!(rank_z(&[], &base), 0.0);
    }
}
