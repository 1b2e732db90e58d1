//! The decision engine: turns the host model into SUSPEND/RESUME decisions once per tick, and
//! remembers between ticks what it classified, saw launched, suspended and fenced.
//!
//! The engine is a pure function of (host state, its own memory, `now`): no clock, no I/O. The
//! controller acts on its [`Decision`]s and reports back through [`Engine::confirm`], so the
//! engine only believes a queue is suspended once the kernel said so.

use std::collections::{BTreeMap, HashMap};

use super::adaptive::{Tuner, View};
use super::levers::{LeverChange, LeverTuner};
use super::{
    fmt_ms, fmt_ns, off_ns, Action, Budget, Class, Decision, LeverSet, NvLever, Policy, Strategy,
};
use crate::observe::model::{
    Activity, Process, QueueKind, QueueState, SampleStatus, State, Vendor,
};

mod evidence;
use evidence::{online_evidence, strict_work, BusyBy, Evidence};

/// A process's class, cached per (pid, start time) and policy generation.
struct ClassEntry {
    start_time: u64,
    gen: u64,
    class: Class,
    rule: Option<usize>,
    /// What `classify` last returned for it.
    reported: Option<Class>,
    /// Tick of the last visit: entries not visited in a full pass are dropped.
    stamp: u64,
}

/// What the engine remembers of an online queue's write pointer.
struct Launches {
    start_time: u64,
    write: Option<u64>,
    sample_ns: u64,
    /// Sample time of the last change of `write`.
    changed_ns: Option<u64>,
    stamp: u64,
}

/// An offline NVIDIA GR TSG's read id at its last sample.
struct Reads {
    start_time: u64,
    read: u64,
    sample_ns: u64,
    stamp: u64,
}

/// A queue the engine suspended.
#[derive(Clone, Copy, Debug)]
struct Held {
    gpu_id: u32,
    since_ns: u64,
    start_time: u64,
    /// When its RESUME was last decided (retried after `min_interval` if not confirmed).
    resume_sent_ns: Option<u64>,
}

/// Why the held queues of a GPU (or of one process) are resumed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Release {
    Idle {
        idle_ns: Option<u64>,
    },
    MaxSuspend,
    Share,
    Fenced,
    Unmanaged,
    NotOffline(Class),
    /// NVIDIA: the GPU's lever no longer acts per episode (a reload, the lever tuner).
    Lever(NvLever),
}

/// What the engine keeps per GPU.
#[derive(Default)]
struct GpuMem {
    fenced: Option<String>,
    last_busy_ns: Option<u64>,
    /// Online demand is going on: from its first busy tick until `resume_after` of idleness.
    episode: bool,
    /// When the current episode began.
    episode_start_ns: Option<u64>,
    last_suspend_ns: Option<u64>,
    /// Starvation guard: no suspend before this.
    no_suspend_until: u64,
    /// A lever change the controller has not taken yet that no tuner holds (a reload).
    lever_note: Option<LeverChange>,
    /// Timeslice: start of the current cycle.
    slice_start_ns: Option<u64>,
    /// Adaptive: the GPU's tuner.
    tuner: Option<Tuner>,
    /// Adaptive on an NVIDIA GPU: the lever tuner (policy/levers.rs), which replaces `tuner`
    /// there: the decisions follow online episodes as under `priority`, and the lever they
    /// act through is measured.
    nv: Option<NvGpu>,
    /// A settled lever tuner set aside by a reload to another policy, with the candidates and
    /// budget it measured for: taken back when the policy returns to them, so that a reload does
    /// not throw away what was measured (its own re-checks and a mix change still apply).
    nv_parked: Option<(LeverSet, Budget, NvGpu)>,
    // Per tick:
    busy: Option<Evidence>,
    /// Strict evidence of online work (first, last): a hint newer than the sample, a backlog,
    /// a write pointer that moved in the latest sample. What the adaptive tuner measures.
    work: Option<(u64, u64)>,
    /// An offline queue here has work (a backlog or a busy sample).
    offline_active: bool,
    /// NVIDIA online/offline processes here this tick: present, and a fingerprint of who
    /// (pid, class) to notice a mix change.
    nv_present: bool,
    nv_mix: u64,
    /// Offline GR TSGs' progress (GPFIFO entries) in the samples new this tick; None: no new
    /// sample (nothing to report to the lever tuner).
    nv_progress: Option<u64>,
    holding: u32,
    oldest_ns: u64,
    release: Option<Release>,
    suspend: bool,
}

/// The lever tuner of an NVIDIA GPU and what it is fed from.
struct NvGpu {
    tuner: LeverTuner,
    /// The mix (fingerprint) it measures.
    mix: u64,
    /// Bursts come from the controller ([`Engine::nv_burst`]): the engine's own estimate from
    /// launch hints stops.
    external_bursts: bool,
    /// Offline progress comes from the controller ([`Engine::nv_offline_progress`]): the
    /// engine's own reading of the model's read ids stops.
    external_progress: bool,
    /// The engine's estimate: the current burst's first and last evidence.
    burst: Option<(u64, u64)>,
    /// Changes not yet taken by the controller.
    changes: Vec<LeverChange>,
}

impl NvGpu {
    fn new(p: &Policy, budget: Budget, now: u64) -> Self {
        Self {
            tuner: LeverTuner::new(p.nvidia.levers, budget, p.nvidia.lever, now),
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

/// The lever that NVIDIA processes on a GPU yield by: its tuner's, else the policy's.
fn gpu_lever(p: &Policy, g: Option<&GpuMem>) -> NvLever {
    g.and_then(|g| g.nv.as_ref())
        .map_or(p.nvidia.lever, |n| n.tuner.lever())
}

/// A (pid, class) pair's share of a GPU's mix fingerprint (summed, so order does not count).
fn mix_term(pid: u32, class: Class) -> u64 {
    (u64::from(pid) << 2 | class as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17)
}

/// The policy's memory between ticks.
pub struct Engine {
    policy: Policy,
    gen: u64,
    tick: u64,
    classes: HashMap<u32, ClassEntry>,
    launches: HashMap<(u32, u32), Launches>,
    /// Offline NVIDIA GR TSGs' last read ids (adaptive: the lever tuner's offline progress).
    offline_reads: HashMap<(u32, u32), Reads>,
    held: BTreeMap<(u32, u32), Held>,
    gpus: BTreeMap<u32, GpuMem>,
    /// NVIDIA processes whose timeslice lever failed: paused like `lever = "pause"`.
    pause_anyway: std::collections::BTreeSet<u32>,
    /// `now` of the last `decide`.
    last_now_ns: u64,
}

impl Engine {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            gen: 0,
            tick: 0,
            classes: HashMap::new(),
            launches: HashMap::new(),
            offline_reads: HashMap::new(),
            held: BTreeMap::new(),
            gpus: BTreeMap::new(),
            pause_anyway: Default::default(),
            last_now_ns: 0,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A reloaded policy: what is held stays held (and is resumed by the next `decide` if its
    /// process is no longer offline, or its GPU no longer managed); every process is classified
    /// again; fences are lifted.
    pub fn set_policy(&mut self, p: Policy) {
        let old_levers = self.policy.nvidia.levers;
        let old_budget = match self.policy.strategy {
            Strategy::Adaptive { budget } => Some(budget),
            _ => None,
        };
        let cycle_changed = p.strategy != self.policy.strategy;
        let levers_changed = cycle_changed || p.nvidia != self.policy.nvidia;
        self.policy = p;
        self.gen += 1;
        for g in self.gpus.values_mut() {
            g.fenced = None;
            if cycle_changed {
                g.slice_start_ns = None;
                // A new goal (or strategy): the adaptive tuner calibrates afresh.
                g.tuner = None;
            }
            if levers_changed {
                // So does the lever tuner; meanwhile the policy's lever applies (said, as a
                // lever change, where it differs from the tuner's).
                if let Some(n) = g.nv.take() {
                    let (from, to) = (n.tuner.lever(), self.policy.nvidia.lever);
                    if from != to {
                        g.lever_note = Some(LeverChange {
                            from,
                            to,
                            reason: "policy reloaded".into(),
                        });
                    }
                    if let (Some(b), true) = (old_budget, n.tuner.settled()) {
                        g.nv_parked = Some((old_levers, b, n));
                    }
                }
            }
        }
    }

    /// Evidence for the NVIDIA lever tuner of `gpu_id` (strategy `adaptive`; ignored
    /// otherwise): one online burst completed at `now_ns`, `duration_ns` long (online work
    /// pending from its start until drained, e.g. from the channels' GP_GET/GP_PUT). Once this
    /// is called for a GPU, the engine's own estimate from launch hints stops there.
    pub fn nv_burst(&mut self, gpu_id: u32, now_ns: u64, duration_ns: u64) {
        if let Some(n) = self.nv_gpu(gpu_id, now_ns) {
            n.external_bursts = true;
            n.burst = None;
            n.tuner.on_burst(now_ns, duration_ns);
        }
    }

    /// Evidence for the NVIDIA lever tuner of `gpu_id`: offline progress since the last call
    /// (`units`: GPFIFO entries the GPU consumed from the offline GR channels there). Once
    /// this is called for a GPU, the engine's own reading of the model's read ids stops there.
    pub fn nv_offline_progress(&mut self, gpu_id: u32, now_ns: u64, units: u64) {
        if let Some(n) = self.nv_gpu(gpu_id, now_ns) {
            n.external_progress = true;
            n.tuner.on_offline_progress(now_ns, units);
        }
    }

    /// A mix change on `gpu_id` the engine cannot see itself (it notices processes joining,
    /// leaving and reclassed on its own).
    pub fn nv_mix_change(&mut self, gpu_id: u32, now_ns: u64) {
        if let Some(n) = self.nv_gpu(gpu_id, now_ns) {
            n.tuner.on_mix_change(now_ns);
        }
    }

    /// The lever tuner of a GPU under the adaptive strategy, made on first use.
    fn nv_gpu(&mut self, gpu_id: u32, now: u64) -> Option<&mut NvGpu> {
        let Strategy::Adaptive { budget } = self.policy.strategy else {
            return None;
        };
        let p = &self.policy;
        let g = self.gpus.entry(gpu_id).or_default();
        Some(g.nv.get_or_insert_with(|| NvGpu::new(p, budget, now)))
    }

    /// The lever tuners' choices per GPU (what the NVIDIA backend applies there in place of
    /// `[nvidia] lever`); empty outside the adaptive strategy.
    pub fn nv_levers(&self) -> BTreeMap<u32, NvLever> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.nv.as_ref().map(|n| (id, n.tuner.lever())))
            .collect()
    }

    /// Per NVIDIA GPU under the adaptive strategy: the lever tuner's state.
    pub fn lever_views(&self) -> Vec<super::LeverView> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.nv.as_ref().map(|n| n.tuner.view(id)))
            .collect()
    }

    /// The lever changes per GPU since the last call (calibration steps included), for the
    /// log and the audit.
    pub fn take_lever_changes(&mut self) -> Vec<(u32, LeverChange)> {
        let mut out = Vec::new();
        for (&id, g) in self.gpus.iter_mut() {
            out.extend(g.lever_note.take().map(|c| (id, c)));
            if let Some(n) = &mut g.nv {
                out.extend(n.changes.drain(..).map(|c| (id, c)));
            }
        }
        out
    }

    /// The adaptive tuners' conclusions since the last call, per GPU (for the log and audit).
    pub fn take_notes(&mut self) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for (&id, g) in self.gpus.iter_mut() {
            if let Some(t) = &mut g.tuner {
                out.extend(t.take_notes().into_iter().map(|n| (id, n)));
            }
            if let Some(n) = &mut g.nv {
                out.extend(
                    n.tuner
                        .take_notes()
                        .into_iter()
                        .map(|n| (id, format!("lever: {n}"))),
                );
            }
        }
        out
    }

    /// The earliest time after the last `decide` at which a decision falls due with no new
    /// evidence: a deferred suspend's deadline (the burst's start plus the defer, or later
    /// where the rate limit or the starvation guard hold it back). The controller decides
    /// again then, not at its next tick, so the SUSPEND is issued at the deadline.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        if !matches!(self.policy.strategy, Strategy::Adaptive { .. }) {
            return None;
        }
        let p = &self.policy;
        self.gpus
            .iter()
            .filter(|(&id, g)| g.fenced.is_none() && p.manages(id))
            .filter_map(|(_, g)| {
                let due = g.tuner.as_ref()?.trigger_ns()?;
                let allowed = g
                    .last_suspend_ns
                    .map_or(0, |t| t.saturating_add(p.min_interval_ns));
                Some(due.max(allowed).max(g.no_suspend_until))
            })
            .filter(|&t| t > self.last_now_ns)
            .min()
    }

    /// Per GPU under the adaptive strategy: its goal and what it measured.
    pub fn adaptive_views(&self) -> Vec<View> {
        let Strategy::Adaptive { budget } = self.policy.strategy else {
            return Vec::new();
        };
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.tuner.as_ref().map(|t| t.view(id, budget)))
            .collect()
    }

    /// The cached class of `pid` and the rule that gave it, if it was classified.
    pub fn class_of(&self, pid: u32) -> Option<(Class, Option<usize>)> {
        self.classes.get(&pid).map(|e| (e.class, e.rule))
    }

    /// Classifies the live processes whose `/proc` facts are known; returns the (pid, class)
    /// pairs that changed since the last call (new processes included).
    pub fn classify(&mut self, state: &State) -> Vec<(u32, Class)> {
        self.tick += 1;
        let mut visited = 0;
        let mut changed = Vec::new();
        for p in state.procs.values() {
            let Some(e) = self.entry(p) else {
                continue;
            };
            visited += 1;
            if e.reported != Some(e.class) {
                e.reported = Some(e.class);
                changed.push((p.pid, e.class));
            }
        }
        self.sweep_classes(visited);
        changed
    }

    /// The class-cache entry of a live process with `/proc` facts, (re)classified if needed.
    fn entry(&mut self, p: &Process) -> Option<&mut ClassEntry> {
        if p.exited_ns.is_some() {
            return None;
        }
        let info = p.info.as_ref()?;
        let (policy, gen, tick) = (&self.policy, self.gen, self.tick);
        let e = self.classes.entry(p.pid).or_insert_with(|| ClassEntry {
            start_time: info.start_time,
            gen: gen.wrapping_sub(1),
            class: Class::Ignore,
            rule: None,
            reported: None,
            stamp: tick,
        });
        if e.start_time != info.start_time {
            // A new process under the pid: it has not been reported yet.
            e.start_time = info.start_time;
            e.reported = None;
            e.gen = gen.wrapping_sub(1);
        }
        if e.gen != gen {
            (e.class, e.rule) = policy.classify(info, p.pid);
            e.gen = gen;
        }
        e.stamp = tick;
        Some(e)
    }

    fn sweep_classes(&mut self, visited: usize) {
        if self.classes.len() > visited {
            let tick = self.tick;
            self.classes.retain(|_, e| e.stamp == tick);
        }
    }

    /// This tick's decisions, sorted by GPU, then pid (RESUME before SUSPEND).
    ///
    /// The phases run in the order their inputs are ready: online activity says which GPUs are
    /// busy; the review of held queues counts what each GPU holds (the starvation guard reads
    /// it); each GPU's plan turns both into "release" or "suspend more"; only then are the
    /// decisions made.
    pub fn decide(&mut self, state: &State, now_ns: u64) -> Vec<Decision> {
        self.tick += 1;
        self.last_now_ns = now_ns;
        for g in self.gpus.values_mut() {
            g.new_tick();
        }
        let any_offline = self.gather_online(state, now_ns);
        let mut out = Vec::new();
        self.review_held(state, now_ns, &mut out);
        let policy = &self.policy;
        for (&gpu_id, g) in self.gpus.iter_mut() {
            g.plan(policy, gpu_id, now_ns);
        }
        self.resume_released(now_ns, &mut out);
        // Without an offline process there is nothing to suspend: skip the pass over processes.
        if any_offline {
            self.suspend_offline(state, now_ns, &mut out);
        }
        sort_decisions(&mut out);
        out
    }

    /// Classifies the live processes and records, per GPU, the first evidence (by pid, then
    /// queue) of online work on a managed compute queue: what makes offline queues yield there.
    /// Returns whether any process is offline.
    fn gather_online(&mut self, state: &State, now: u64) -> bool {
        let mut visited = 0;
        let mut visited_launches = 0;
        let mut any_offline = false;
        for p in state.procs.values() {
            let Some(e) = self.entry(p) else {
                continue;
            };
            visited += 1;
            let (class, start_time) = (e.class, e.start_time);
            any_offline |= class == Class::Offline;
            if class != Class::Ignore && p.vendor() == Some(Vendor::Nvidia) {
                self.note_nv_mix(p, class);
            }
            if class == Class::Offline {
                self.note_offline_activity(p);
                if matches!(self.policy.strategy, Strategy::Adaptive { .. }) {
                    self.note_offline_progress(p, start_time);
                }
                continue;
            }
            if class != Class::Online {
                continue;
            }
            for q in p.queues.values() {
                if !q.alive() || !q.kind.is_compute() || !self.policy.manages(q.gpu_id) {
                    continue;
                }
                visited_launches += 1;
                let changed_ns = self.track_launches((p.pid, q.queue_id), start_time, &q.activity);
                if let Some(t) = strict_work(&self.policy, p, &q.activity, changed_ns, now) {
                    let g = self.gpus.entry(q.gpu_id).or_default();
                    g.work = Some(g.work.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
                }
                let Some((what, at_ns)) =
                    online_evidence(&self.policy, p, &q.activity, changed_ns, now)
                else {
                    continue;
                };
                let g = self.gpus.entry(q.gpu_id).or_default();
                if g.busy.is_none() {
                    g.busy = Some(Evidence {
                        pid: p.pid,
                        qid: q.queue_id,
                        what,
                        at_ns,
                    });
                }
            }
        }
        self.sweep_classes(visited);
        let tick = self.tick;
        if self.launches.len() > visited_launches {
            self.launches.retain(|_, l| l.stamp == tick);
        }
        // TSGs gone or no longer offline (a few per process: cheap).
        self.offline_reads.retain(|_, r| r.stamp == tick);
        any_offline
    }

    /// Marks the GPUs where an NVIDIA online or offline process has live compute queues, and
    /// folds it into their mix fingerprint.
    fn note_nv_mix(&mut self, p: &Process, class: Class) {
        let mut seen: Vec<u32> = Vec::new();
        for q in p.live_queues() {
            if q.kind.is_compute() && !seen.contains(&q.gpu_id) {
                seen.push(q.gpu_id);
                let g = self.gpus.entry(q.gpu_id).or_default();
                g.nv_present = true;
                g.nv_mix = g.nv_mix.wrapping_add(mix_term(p.pid, class));
            }
        }
    }

    /// Marks the GPUs where an offline process's compute queues have work.
    fn note_offline_activity(&mut self, p: &Process) {
        for q in p.queues.values() {
            let a = &q.activity;
            let has_work = a.status == SampleStatus::Valid
                && (a.backlog.is_some_and(|n| n > 0) || a.busy == Some(true));
            if q.alive() && q.kind.is_compute() && has_work {
                self.gpus.entry(q.gpu_id).or_default().offline_active = true;
            }
        }
    }

    /// Offline progress for the NVIDIA lever tuner: how far each offline GR TSG's read id (the
    /// channels' GP_GET, unwrapped: nv/activity.rs) moved since its last sample, per GPU.
    fn note_offline_progress(&mut self, p: &Process, start_time: u64) {
        let tick = self.tick;
        for q in p.queues.values() {
            let a = &q.activity;
            if !q.alive() || q.kind != QueueKind::NvCompute || a.status != SampleStatus::Valid {
                continue;
            }
            let Some(read) = a.read_dispatch_id else {
                continue;
            };
            let key = (p.pid, q.queue_id);
            let prev = self.offline_reads.insert(
                key,
                Reads {
                    start_time,
                    read,
                    sample_ns: a.sample_ns,
                    stamp: tick,
                },
            );
            // The first sighting is history; a reused pid is a first sighting.
            let Some(prev) = prev.filter(|r| r.start_time == start_time) else {
                continue;
            };
            if prev.sample_ns != a.sample_ns {
                let g = self.gpus.entry(q.gpu_id).or_default();
                let moved = read.saturating_sub(prev.read);
                g.nv_progress = Some(g.nv_progress.unwrap_or(0).saturating_add(moved));
            }
        }
    }

    /// Follows an online queue's write pointer from sample to sample; returns the sample time
    /// of its last change. A change between two samples is a launch even when the GPU drained
    /// it before the next sample, which the backlog alone would miss.
    fn track_launches(&mut self, key: (u32, u32), start_time: u64, a: &Activity) -> Option<u64> {
        let tick = self.tick;
        let l = self
            .launches
            .entry(key)
            .or_insert_with(|| Launches::first(start_time, a, tick));
        l.stamp = tick;
        if l.start_time != start_time {
            // The pid was reused: first sighting of a different queue.
            *l = Launches::first(start_time, a, tick);
        } else if a.sample_ns != l.sample_ns {
            if let (Some(old), Some(new)) = (l.write, a.write_dispatch_id) {
                if old != new {
                    l.changed_ns = Some(a.sample_ns);
                }
            }
            if a.write_dispatch_id.is_some() {
                l.write = a.write_dispatch_id;
            }
            l.sample_ns = a.sample_ns;
        }
        l.changed_ns
    }

    /// Goes over the held queues: forgets those that are gone (nothing to resume), resumes
    /// those whose own process or GPU no longer qualifies, and counts the rest per GPU with
    /// the oldest suspension, which the starvation guard reads.
    fn review_held(&mut self, state: &State, now: u64, out: &mut Vec<Decision>) {
        let (classes, policy, gpus) = (&self.classes, &self.policy, &mut self.gpus);
        let pause_anyway = &self.pause_anyway;
        let mut proc: Option<&Process> = None;
        self.held.retain(|&(pid, qid), h| {
            // Held queues are in pid order: each process is looked up once.
            if proc.is_none_or(|p| p.pid != pid) {
                proc = state.procs.get(&pid);
            }
            if !proc.is_some_and(|p| still_held(p, qid, h)) {
                return false;
            }
            let class = classes.get(&pid).map_or(Class::Ignore, |e| e.class);
            let g = gpus.entry(h.gpu_id).or_default();
            // An NVIDIA process held under a lever that acts per episode, on a GPU whose
            // lever no longer does (a reload, the lever tuner): what the old lever did is
            // undone now, not at the episode's end.
            let lever = gpu_lever(policy, Some(g));
            let lever_gone = (lever == NvLever::None
                || !lever.acts_per_episode() && !pause_anyway.contains(&pid))
                && proc.is_some_and(|p| p.vendor() == Some(Vendor::Nvidia));
            let release = match process_release(policy, class, h.gpu_id, g) {
                None if lever_gone => Some(Release::Lever(lever)),
                r => r,
            };
            match release {
                // This is the first pass to add to `out`: its RESUMEs start at 0.
                Some(r) => push_resume(out, 0, policy, g, now, pid, qid, h, r),
                None => {
                    g.holding += 1;
                    g.oldest_ns = g.oldest_ns.min(h.since_ns);
                }
            }
            true
        });
    }

    /// RESUMEs for the GPU-wide releases of this tick's plans: every queue still held there.
    fn resume_released(&mut self, now: u64, out: &mut Vec<Decision>) {
        if !self.gpus.values().any(|g| g.release.is_some()) {
            return;
        }
        let first = out.len();
        let (policy, gpus) = (&self.policy, &mut self.gpus);
        for (&(pid, qid), h) in self.held.iter_mut() {
            let Some(g) = gpus.get_mut(&h.gpu_id) else {
                continue;
            };
            if let Some(r) = g.release {
                push_resume(out, first, policy, g, now, pid, qid, h, r);
            }
        }
    }

    /// SUSPENDs for the offline processes on the GPUs whose plan says so; each GPU that got one
    /// remembers when, for `min_interval`.
    fn suspend_offline(&mut self, state: &State, now: u64, out: &mut Vec<Decision>) {
        if !self.gpus.values().any(|g| g.suspend) {
            return;
        }
        let first = out.len();
        for p in state.procs.values() {
            let offline = p.exited_ns.is_none()
                && p.info.is_some()
                && self
                    .classes
                    .get(&p.pid)
                    .is_some_and(|e| e.class == Class::Offline);
            if offline && self.nvidia_may_pause(p, now) {
                self.suspend_process(p, now, out);
            }
        }
        for d in &out[first..] {
            if let Some(g) = self.gpus.get_mut(&d.gpu_id) {
                g.last_suspend_ns = Some(now);
            }
        }
    }

    /// NVIDIA processes yield by the policy's lever: never suspended with `timeslice` (the
    /// hardware timeslice does it) or `none` (left alone), suspended with `both` only once an
    /// online episode on one of their GPUs has outlasted `pause_after`; with `dynamic` a
    /// "suspend" is the short timeslice for the episode. Everything else may be suspended.
    fn nvidia_may_pause(&self, p: &Process, now: u64) -> bool {
        if p.vendor() != Some(crate::observe::model::Vendor::Nvidia) {
            return true;
        }
        let nv = &self.policy.nvidia;
        let fallback = self.pause_anyway.contains(&p.pid);
        // The lever of each GPU it is on (the lever tuner's under `adaptive`).
        p.live_queues().any(|q| {
            let g = self.gpus.get(&q.gpu_id);
            match gpu_lever(&self.policy, g) {
                // Nothing is done, whatever failed before.
                NvLever::None => false,
                // Its timeslice could not be set: paused instead.
                _ if fallback => true,
                // Under `dynamic` the decisions reach the backend, which shortens the
                // timeslice instead of pausing (backend/nv/worker.rs).
                NvLever::Pause | NvLever::Dynamic => true,
                NvLever::Timeslice => false,
                NvLever::Both => g
                    .and_then(|g| g.episode_start_ns)
                    .is_some_and(|s| now.saturating_sub(s) >= nv.pause_after_ns),
            }
        })
    }

    /// One SUSPEND per GPU for an offline process: its active compute queues there that are
    /// not held yet (a queue created while the others are held joins them).
    fn suspend_process(&self, p: &Process, now: u64, out: &mut Vec<Decision>) {
        // This process's decisions start here (one per GPU at most).
        let mine = out.len();
        for q in p.queues.values() {
            if q.state != QueueState::Active
                || !q.kind.is_compute()
                || self.held.contains_key(&(p.pid, q.queue_id))
            {
                continue;
            }
            let Some(g) = self.gpus.get(&q.gpu_id).filter(|g| g.suspend) else {
                continue;
            };
            let i = match out[mine..].iter().position(|d| d.gpu_id == q.gpu_id) {
                Some(i) => mine + i,
                None => {
                    out.push(Decision {
                        ts_ns: now,
                        gpu_id: q.gpu_id,
                        pid: p.pid,
                        action: Action::Suspend,
                        queues: Vec::new(),
                        grace: self.policy.grace,
                        reason: suspend_reason(&self.policy, g, now),
                        trigger_ns: match &g.tuner {
                            Some(t) => t.trigger_ns(),
                            None => g.busy.map(|e| e.at_ns),
                        },
                    });
                    out.len() - 1
                }
            };
            out[i].queues.push(q.queue_id);
        }
    }

    /// The timeslice lever failed for `pid`: it is paused instead, whatever the lever says.
    pub fn pause_anyway(&mut self, pid: u32) {
        self.pause_anyway.insert(pid);
    }

    /// What the controller did for a decision: `done` are the queue ids whose state changed.
    pub fn confirm(&mut self, d: &Decision, done: &[u32]) {
        match d.action {
            Action::Suspend => {
                let start_time = self.classes.get(&d.pid).map_or(0, |e| e.start_time);
                for &qid in done.iter().filter(|q| d.queues.contains(q)) {
                    self.held.insert(
                        (d.pid, qid),
                        Held {
                            gpu_id: d.gpu_id,
                            since_ns: d.ts_ns,
                            start_time,
                            resume_sent_ns: None,
                        },
                    );
                }
            }
            Action::Resume => {
                for qid in done {
                    self.held.remove(&(d.pid, *qid));
                }
            }
        }
    }

    /// Queues the engine holds suspended: (pid, queue id, gpu id, since).
    pub fn held(&self) -> Vec<(u32, u32, u32, u64)> {
        self.held
            .iter()
            .map(|(&(pid, qid), h)| (pid, qid, h.gpu_id, h.since_ns))
            .collect()
    }

    /// Something else resumed these queues (all of `pid`'s when `queues` is None): forget them.
    pub fn forget(&mut self, pid: u32, queues: Option<&[u32]>) {
        match queues {
            None => {
                self.held.retain(|&(p, _), _| p != pid);
                self.pause_anyway.remove(&pid);
            }
            Some(ids) => {
                for q in ids {
                    self.held.remove(&(pid, *q));
                }
            }
        }
    }

    /// Stops suspending on a GPU that reported a queue error (until `set_policy`); what is held
    /// there is resumed by the next `decide`.
    pub fn fence_gpu(&mut self, gpu_id: u32, why: &str) {
        self.gpus.entry(gpu_id).or_default().fenced = Some(why.to_owned());
    }

    /// Fenced GPUs and why.
    pub fn fenced(&self) -> Vec<(u32, String)> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.fenced.clone().map(|w| (id, w)))
            .collect()
    }
}

impl Launches {
    /// The first sighting of a queue: its current write pointer is history, not a launch.
    fn first(start_time: u64, a: &Activity, stamp: u64) -> Self {
        Self {
            start_time,
            write: a.write_dispatch_id,
            sample_ns: a.sample_ns,
            changed_ns: None,
            stamp,
        }
    }
}

impl GpuMem {
    /// Clears what each tick computes afresh.
    fn new_tick(&mut self) {
        self.busy = None;
        self.work = None;
        self.offline_active = false;
        self.nv_present = false;
        self.nv_mix = 0;
        self.nv_progress = None;
        self.holding = 0;
        self.oldest_ns = u64::MAX;
        self.release = None;
        self.suspend = false;
    }

    /// This tick's plan for the GPU, from its online evidence and what it holds: release what
    /// is held (`release`), or suspend more (`suspend`), or neither.
    fn plan(&mut self, p: &Policy, gpu_id: u32, now: u64) {
        if self.fenced.is_some() || !p.manages(gpu_id) {
            // Left alone: its held queues were released per process, and a later return starts
            // from a fresh episode and cycle.
            self.episode = false;
            self.slice_start_ns = None;
            return;
        }
        if let Strategy::Adaptive { budget } = p.strategy {
            if self.nv_present && self.nv.is_none() {
                self.nv = Some(match self.nv_parked.take() {
                    // Back to what a settled tuner measured for: its choice applies again.
                    Some((levers, b, mut n)) if levers == p.nvidia.levers && b == budget => {
                        let (from, to) = (p.nvidia.lever, n.tuner.lever());
                        if from != to {
                            n.changes.push(LeverChange {
                                from,
                                to,
                                reason: "policy reloaded: the lever measured before".into(),
                            });
                        }
                        n
                    }
                    _ => NvGpu::new(p, budget, now),
                });
            }
            if self.nv.is_none() {
                self.plan_adaptive(p, budget, now);
                return;
            }
        }
        let idle_ns = self.track_episode(p, now);
        self.feed_lever_tuner(p, now);
        if self.starvation_guard(p, now) {
            return;
        }
        let want = self.strategy_wants_suspend(p, now);
        if !self.episode && self.holding > 0 {
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

    /// The NVIDIA lever tuner's tick: a mix change, the engine's own evidence (unless the
    /// controller feeds its own), then the tuner's phase. Its lever applies from this tick.
    fn feed_lever_tuner(&mut self, p: &Policy, now: u64) {
        let (mix, present, work, progress) =
            (self.nv_mix, self.nv_present, self.work, self.nv_progress);
        let Some(n) = &mut self.nv else {
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

/// Whether a held queue is still the one that was suspended: its process has not exited (same
/// start time: the pid was not reused), and the queue is alive on the same GPU and not created
/// after the suspension (the id now naming another queue). If not, there is nothing to resume.
fn still_held(p: &Process, qid: u32, h: &Held) -> bool {
    let same_process = p.exited_ns.is_none()
        && p.info
            .as_ref()
            .is_some_and(|i| i.start_time == h.start_time);
    let same_queue = p.queues.get(&qid).is_some_and(|q| {
        q.alive() && q.gpu_id == h.gpu_id && q.created_ns.is_none_or(|c| c <= h.since_ns)
    });
    same_process && same_queue
}

/// Why one process's held queue is resumed whatever its GPU's plan: the process is no longer
/// offline (a reload), or its GPU is no longer managed or is fenced.
fn process_release(policy: &Policy, class: Class, gpu_id: u32, g: &GpuMem) -> Option<Release> {
    if class != Class::Offline {
        Some(Release::NotOffline(class))
    } else if !policy.manages(gpu_id) {
        Some(Release::Unmanaged)
    } else if g.fenced.is_some() {
        Some(Release::Fenced)
    } else {
        None
    }
}

/// The order the controller acts in and logs: by GPU, then pid, RESUME before SUSPEND; queue
/// ids ascending.
fn sort_decisions(out: &mut [Decision]) {
    out.sort_by_key(|d| (d.gpu_id, d.pid, d.action == Action::Suspend));
    for d in out {
        d.queues.sort_unstable();
    }
}

/// Adds a held queue to the RESUME of its (GPU, process), unless it is already in one this
/// tick, or one was sent within `min_interval` and not confirmed yet. `out[first..]` holds this
/// pass's RESUMEs, made in (pid, queue) order: a process's are at the end.
#[allow(clippy::too_many_arguments)]
fn push_resume(
    out: &mut Vec<Decision>,
    first: usize,
    policy: &Policy,
    g: &GpuMem,
    now: u64,
    pid: u32,
    qid: u32,
    h: &mut Held,
    r: Release,
) {
    if h.resume_sent_ns
        .is_some_and(|t| t == now || now.saturating_sub(t) < policy.min_interval_ns)
    {
        return;
    }
    h.resume_sent_ns = Some(now);
    match out[first..]
        .iter_mut()
        .rev()
        .take_while(|d| d.pid == pid)
        .find(|d| d.gpu_id == h.gpu_id)
    {
        Some(d) => d.queues.push(qid),
        None => out.push(Decision {
            ts_ns: now,
            gpu_id: h.gpu_id,
            pid,
            action: Action::Resume,
            queues: vec![qid],
            grace: None,
            reason: release_reason(policy, g, h.gpu_id, r),
            trigger_ns: None,
        }),
    }
}

fn release_reason(p: &Policy, g: &GpuMem, gpu_id: u32, r: Release) -> String {
    match r {
        Release::Idle { idle_ns: Some(i) } => format!("online idle {}", fmt_ms(i)),
        Release::Idle { idle_ns: None } => "online idle".into(),
        Release::MaxSuspend => format!("max_suspend {} reached", fmt_ns(p.max_suspend_ns)),
        Release::Share => "timeslice: offline share".into(),
        Release::Fenced => format!(
            "gpu {gpu_id:#x} fenced: {}",
            g.fenced.as_deref().unwrap_or("queue error")
        ),
        Release::Unmanaged => format!("gpu {gpu_id:#x} no longer managed"),
        Release::NotOffline(c) => format!("no longer offline (now {c})"),
        Release::Lever(l) => format!("NVIDIA lever now {l}"),
    }
}

fn suspend_reason(p: &Policy, g: &GpuMem, now: u64) -> String {
    let why = match g.busy {
        Some(Evidence { pid, qid, what, .. }) => {
            let how = match what {
                BusyBy::Backlog(n) => format!("busy (backlog {n})"),
                BusyBy::Launched { ago_ns } => format!("launched {} ago", fmt_ms(ago_ns)),
                BusyBy::Busy => "busy".into(),
                BusyBy::LaunchHint { ago_ns } => {
                    format!("launch hint {} ago", fmt_ms(ago_ns))
                }
            };
            format!("online pid {pid} queue {qid} {how}")
        }
        None => match g.last_busy_ns {
            Some(t) => format!("online busy {} ago", fmt_ms(now.saturating_sub(t))),
            None => "online busy".into(),
        },
    };
    match (p.strategy, &g.tuner) {
        (Strategy::Adaptive { budget }, Some(t)) => format!("{}; {why}", t.reason(budget)),
        (Strategy::Adaptive { .. }, None) if g.nv.is_some() => {
            format!("adaptive: lever {}; {why}", gpu_lever(p, Some(g)))
        }
        (Strategy::Timeslice { .. }, _) => format!("timeslice: online share; {why}"),
        _ => why,
    }
}
