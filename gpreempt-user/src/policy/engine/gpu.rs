//! What the engine keeps per GPU between ticks and computes per tick, and each GPU's plan: from
//! its online evidence and what it holds, release what is held or suspend more (the priority,
//! timeslice and adaptive strategies, the starvation guard and the rate limit).

use super::super::adaptive::Tuner;
use super::super::levers::{LeverChange, LeverTuner};
use super::super::{off_ns, Budget, Class, Lever, LeverSet, Policy, Strategy};
use super::{evidence::Evidence, held::Release};
use crate::lever::Offers;

/// What the engine keeps per GPU.
#[derive(Default)]
pub(super) struct GpuMem {
    pub(super) fenced: Option<String>,
    pub(super) last_busy_ns: Option<u64>,
    /// Online demand is going on: from its first busy tick until `resume_after` of idleness.
    pub(super) episode: bool,
    /// When the current episode began.
    pub(super) episode_start_ns: Option<u64>,
    pub(super) last_suspend_ns: Option<u64>,
    /// Starvation guard: no suspend before this.
    pub(super) no_suspend_until: u64,
    /// A lever change the controller has not taken yet that no tuner holds (a reload).
    pub(super) lever_note: Option<LeverChange>,
    /// Timeslice: start of the current cycle.
    pub(super) slice_start_ns: Option<u64>,
    /// Adaptive: the GPU's tuner.
    pub(super) tuner: Option<Tuner>,
    /// Adaptive on a GPU whose backend offers a choice of levers: the lever tuner
    /// (policy/levers.rs), which replaces `tuner` there: the decisions follow online episodes as under `priority`, and the lever they
    /// act through is measured.
    pub(super) levers: Option<LeverGpu>,
    /// A settled lever tuner set aside by a reload to another policy, with the candidates and
    /// budget it measured for: taken back when the policy returns to them, so that a reload does
    /// not throw away what was measured (its own re-checks and a mix change still apply).
    pub(super) parked: Option<(LeverSet, Budget, LeverGpu)>,
    // Per tick:
    pub(super) busy: Option<Evidence>,
    /// Strict evidence of online work (first, last): a hint newer than the sample, a backlog,
    /// a write pointer that moved in the latest sample. What the adaptive tuner measures.
    pub(super) work: Option<(u64, u64)>,
    /// An offline queue here has work (a backlog or a busy sample).
    pub(super) offline_active: bool,
    /// Online/offline processes whose backend offers a choice of levers are here this tick,
    /// and a fingerprint of who (pid, class) to notice a mix change.
    pub(super) choice: bool,
    pub(super) mix: u64,
    /// Offline compute queues' progress (entries read) in the samples new this tick; None: no
    /// new sample (nothing to report to the lever tuner).
    pub(super) progress: Option<u64>,
    /// What the backend of the processes here offers (known once one was seen).
    pub(super) offers: Option<Offers>,
    pub(super) holding: u32,
    pub(super) oldest_ns: u64,
    pub(super) release: Option<Release>,
    pub(super) suspend: bool,
}

/// The lever tuner of a GPU and what it is fed from.
pub(super) struct LeverGpu {
    pub(super) tuner: LeverTuner,
    /// The mix (fingerprint) it measures.
    pub(super) mix: u64,
    /// Bursts come from the controller ([`Engine::lever_burst`]): the engine's own estimate from
    /// launch hints stops.
    pub(super) external_bursts: bool,
    /// Offline progress comes from the controller ([`Engine::lever_offline_progress`]): the
    /// engine's own reading of the model's read ids stops.
    pub(super) external_progress: bool,
    /// The engine's estimate: the current burst's first and last evidence.
    pub(super) burst: Option<(u64, u64)>,
    /// Changes not yet taken by the controller.
    pub(super) changes: Vec<LeverChange>,
}

impl LeverGpu {
    /// Its candidates are the policy's that `offers` has (all of them where nothing is known).
    pub(super) fn new(p: &Policy, budget: Budget, now: u64, offers: Option<&Offers>) -> Self {
        let (candidates, start, all) = match offers {
            Some(o) => (
                p.levers.candidates.and(o.set()),
                o.resolve(p.levers.lever),
                o.set(),
            ),
            None => (p.levers.candidates, p.levers.lever, p.levers.candidates),
        };
        // A quiet window holds offline throughout: by a pause where the backend offers one,
        // whether or not the policy lists it among the candidates.
        let quiet = all.contains(Lever::Pause).then_some(Lever::Pause);
        Self {
            tuner: LeverTuner::new(candidates, budget, start, quiet, now),
            mix: 0,
            external_bursts: false,
            external_progress: false,
            burst: None,
            changes: Vec::new(),
        }
    }

    fn tick(&mut self, now: u64) {
        if let Some(c) = self.tuner.tick(now) {
            self.changes.push(c);
        }
    }
}

/// The lever a process yields by on a GPU: the GPU's tuner's, else the policy's where the
/// process's backend offers it, else that backend's default.
pub(super) fn gpu_lever(p: &Policy, g: Option<&GpuMem>, offers: &Offers) -> Lever {
    match g.and_then(|g| g.levers.as_ref()) {
        Some(n) => n.tuner.lever(),
        None => offers.resolve(p.levers.lever),
    }
}

/// A (pid, class) pair's share of a GPU's mix fingerprint (summed, so order does not count).
pub(super) fn mix_term(pid: u32, class: Class) -> u64 {
    (u64::from(pid) << 2 | class as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17)
}

impl GpuMem {
    /// The defer tuner decides this GPU's suspends: it runs on its own (no lever tuner), or the
    /// lever tuner applies `defer` outside a quiet window.
    pub(super) fn deferring(&self) -> bool {
        match &self.levers {
            None => self.tuner.is_some(),
            Some(n) => n.tuner.lever() == Lever::Defer && !n.tuner.quiet(),
        }
    }

    /// Clears what each tick computes afresh.
    pub(super) fn new_tick(&mut self) {
        self.busy = None;
        self.work = None;
        self.offline_active = false;
        self.choice = false;
        self.mix = 0;
        self.progress = None;
        self.holding = 0;
        self.oldest_ns = u64::MAX;
        self.release = None;
        self.suspend = false;
    }

    /// This tick's plan for the GPU, from its online evidence and what it holds: release what
    /// is held (`release`), or suspend more (`suspend`), or neither.
    pub(super) fn plan(&mut self, p: &Policy, gpu_id: u32, now: u64) {
        if self.fenced.is_some() || !p.manages(gpu_id) {
            // Left alone: its held queues were released per process, and a later return starts
            // from a fresh episode and cycle.
            self.episode = false;
            self.slice_start_ns = None;
            return;
        }
        if let Strategy::Adaptive { budget } = p.strategy {
            if self.choice && self.levers.is_none() {
                self.levers = Some(match self.parked.take() {
                    // Back to what a settled tuner measured for: its choice applies again.
                    Some((levers, b, mut n)) if levers == p.levers.candidates && b == budget => {
                        n.tuner.taken_back(now);
                        // Classes settle over the ticks after a reload: the mix it comes back
                        // to is adopted, not taken for a change (its confirmation, a minute
                        // on, catches a pair that changed meanwhile).
                        n.mix = 0;
                        let (from, to) = (p.levers.lever, n.tuner.lever());
                        if from != to {
                            n.changes.push(LeverChange {
                                from,
                                to,
                                reason: "policy reloaded: the lever measured before".into(),
                            });
                        }
                        n
                    }
                    _ => LeverGpu::new(p, budget, now, self.offers.as_ref()),
                });
            }
            if self.levers.is_none() {
                self.plan_adaptive(p, budget, now);
                return;
            }
        }
        let idle_ns = self.track_episode(p, now);
        self.feed_lever_tuner(p, now);
        if let Strategy::Adaptive { budget } = p.strategy {
            // The deferred pause: the defer tuner decides when in a burst to suspend (it keeps
            // what it learnt across the lever tuner's epochs).
            if self.levers.is_some() && self.deferring() {
                self.plan_adaptive(p, budget, now);
                return;
            }
        }
        if self.starvation_guard(p, now) {
            return;
        }
        // A quiet window holds offline throughout (the starvation guard still bounds each hold).
        let quiet = self.levers.as_ref().is_some_and(|n| n.tuner.quiet());
        let want = self.strategy_wants_suspend(p, now) || quiet;
        if !self.episode && !quiet && self.holding > 0 {
            self.release = Some(Release::Idle { idle_ns });
        }
        self.suspend = want && self.rate_allows_suspend(p, now);
    }

    /// The adaptive plan: the tuner sees the tick and says whether offline should be held; an
    /// episode is the tuner's burst (strict evidence, `resume_after` of idleness ends it).
    fn plan_adaptive(&mut self, p: &Policy, budget: Budget, now: u64) {
        let (work, held, active) = (self.work, self.holding > 0, self.offline_active);
        let t = self.tuner.get_or_insert_with(Tuner::default);
        t.tick(p, budget, now, work, held, active);
        let (in_burst, start, want) = (t.in_burst(), t.burst_start_ns(), t.wants_suspend(now));
        if let Some((_, last)) = work {
            self.last_busy_ns = Some(last);
        }
        self.episode = in_burst;
        self.episode_start_ns = start;
        if self.starvation_guard(p, now) {
            return;
        }
        if !in_burst && self.holding > 0 {
            let idle_ns = self.last_busy_ns.map(|t| now.saturating_sub(t));
            self.release = Some(Release::Idle { idle_ns });
        }
        self.suspend = want && self.rate_allows_suspend(p, now);
    }

    /// The lever tuner's tick: a mix change, the engine's own evidence (unless the
    /// controller feeds its own), then the tuner's phase. Its lever applies from this tick.
    fn feed_lever_tuner(&mut self, p: &Policy, now: u64) {
        let (mix, present, work, progress) = (self.mix, self.choice, self.work, self.progress);
        let Some(n) = &mut self.levers else {
            return;
        };
        if present && mix != n.mix {
            if n.mix != 0 {
                n.tuner.on_mix_change(now);
            }
            n.mix = mix;
        }
        if let Some(units) = progress.filter(|_| !n.external_progress) {
            n.tuner.on_offline_progress(now, units);
        }
        if !n.external_bursts {
            // A burst from the strict evidence of online work: a backlog or a write id that
            // moved in the channels' samples (first to last: its length at the sampling
            // resolution), or, where channels cannot be read, launch hints (the spread of a
            // request's launches, not its GPU time); ended by `resume_after` without any.
            match (work, n.burst) {
                (Some((_, last)), Some((first, prev))) => {
                    n.burst = Some((first, prev.max(last)));
                }
                (Some((a, b)), None) => n.burst = Some((a, b)),
                (None, Some((first, last))) => {
                    // (A hint counts for `window`: by the time it stops, that has passed.)
                    if now.saturating_sub(last) >= p.resume_after_ns {
                        n.tuner.on_burst(now, last.saturating_sub(first));
                        n.burst = None;
                    }
                }
                (None, None) => {}
            }
        }
        n.tick(now);
    }

    /// Online demand is an episode, from its first busy tick until `resume_after` of idleness,
    /// so the gaps between an online process's kernels do not resume offline work each time.
    /// Returns how long online has been idle (None: never seen busy).
    fn track_episode(&mut self, p: &Policy, now: u64) -> Option<u64> {
        let busy = self.busy.is_some();
        if busy {
            self.last_busy_ns = Some(now);
        }
        let idle_ns = self.last_busy_ns.map(|t| now.saturating_sub(t));
        let recent = idle_ns.is_some_and(|i| i < p.resume_after_ns);
        self.episode = busy || (self.episode && recent);
        self.episode_start_ns = if self.episode {
            Some(self.episode_start_ns.unwrap_or(now))
        } else {
            None
        };
        idle_ns
    }

    /// Offline work held for `max_suspend` is released whatever online does, and not suspended
    /// again for `min_run`, so that it always makes progress. True when it fired.
    fn starvation_guard(&mut self, p: &Policy, now: u64) -> bool {
        if self.holding > 0 && now.saturating_sub(self.oldest_ns) >= p.max_suspend_ns {
            self.release = Some(Release::MaxSuspend);
            self.no_suspend_until = now.saturating_add(p.min_run_ns);
            return true;
        }
        false
    }

    /// Whether the strategy wants offline suspended now. Priority: for the whole episode.
    /// Timeslice: during the off part of each period of the episode, counted from its start;
    /// in the on part what is held is released (`Share`).
    fn strategy_wants_suspend(&mut self, p: &Policy, now: u64) -> bool {
        match p.strategy {
            Strategy::Priority | Strategy::Adaptive { .. } => self.episode,
            Strategy::Timeslice { period_ns, share } => {
                if !self.episode {
                    self.slice_start_ns = None;
                    return false;
                }
                let start = *self.slice_start_ns.get_or_insert(now);
                let phase = now.saturating_sub(start) % period_ns.max(1);
                if phase < off_ns(period_ns, share) {
                    return true;
                }
                if self.holding > 0 {
                    self.release = Some(Release::Share);
                }
                false
            }
        }
    }

    /// Rate limiting: no SUSPEND while the starvation guard's `min_run` lasts, nor within
    /// `min_interval` of this GPU's last batch, so the kernel is not asked at every tick.
    fn rate_allows_suspend(&self, p: &Policy, now: u64) -> bool {
        now >= self.no_suspend_until
            && self
                .last_suspend_ns
                .is_none_or(|t| now.saturating_sub(t) >= p.min_interval_ns)
    }
}
