//! The decision engine: turns the host model into SUSPEND/RESUME decisions once per tick, and
//! remembers between ticks what it classified, saw launched, suspended and fenced.
//!
//! The engine is a pure function of (host state, its own memory, `now`): no clock, no I/O. The
//! controller acts on its [`Decision`]s and reports back through [`Engine::confirm`], so the
//! engine only believes a queue is suspended once the kernel said so.
//!
//! This file holds the engine's memory, classification, a tick's phases ([`Engine::decide`])
//! and what the controller reports back. The phases live in their own files, in the order they
//! run:
//! - [`gather`]: online evidence, offline activity and progress, read from the host model;
//! - [`gpu`]: what the engine keeps per GPU, and each GPU's plan (release, or suspend more);
//! - [`act`]: the plans turned into RESUME and SUSPEND decisions, with their reasons;
//! - [`tuners`]: the adaptive and lever tuners' inputs from the controller and views;
//! - [`evidence`]: what counts as online work.

use std::collections::{BTreeMap, HashMap};

use super::levers::LeverChange;
use super::{Action, Class, Decision, Policy, Strategy};
use crate::lever::Offers;
use crate::observe::model::{Process, State, Vendor};

mod act;
mod evidence;
mod gather;
mod gpu;
mod held;
mod tuners;

use gpu::{GpuMem, LeverGpu};
use held::{sort_decisions, Held};

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

/// An offline compute queue's read id at its last sample.
struct Reads {
    start_time: u64,
    read: u64,
    sample_ns: u64,
    stamp: u64,
}

/// The policy's memory between ticks.
pub struct Engine {
    policy: Policy,
    gen: u64,
    tick: u64,
    classes: HashMap<u32, ClassEntry>,
    launches: HashMap<(u32, u32), Launches>,
    /// Offline compute queues' last read ids (adaptive: the lever tuner's offline progress).
    offline_reads: HashMap<(u32, u32), Reads>,
    held: BTreeMap<(u32, u32), Held>,
    gpus: BTreeMap<u32, GpuMem>,
    /// Processes whose timeslice lever failed: paused like `lever = "pause"`.
    pause_anyway: std::collections::BTreeSet<u32>,
    /// What each backend offers, by the vendor of the processes it acts on (the controller's
    /// `Backends::offers`); a process of a vendor not here is paused.
    offers: BTreeMap<Vendor, Offers>,
    /// `now` of the last `decide`.
    last_now_ns: u64,
    /// Per online process: (start time, the end of the last request fed to the lever tuners,
    /// tick of the last visit).
    requests_read: HashMap<u32, (u64, u64, u64)>,
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
            offers: BTreeMap::new(),
            last_now_ns: 0,
            requests_read: HashMap::new(),
        }
    }

    /// The levers each backend offers: the engine chooses among them.
    pub fn with_offers(mut self, offers: BTreeMap<Vendor, Offers>) -> Self {
        self.offers = offers;
        self
    }

    /// What the backend of `p` offers.
    fn offers_of(&self, p: &Process) -> Offers {
        p.vendor()
            .and_then(|v| self.offers.get(&v))
            .copied()
            .unwrap_or(Offers::UNKNOWN)
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A reloaded policy: what is held stays held (and is resumed by the next `decide` if its
    /// process is no longer offline, or its GPU no longer managed); every process is classified
    /// again; fences are lifted.
    pub fn set_policy(&mut self, p: Policy) {
        let old_levers = self.policy.levers.candidates;
        let old_budget = match self.policy.strategy {
            Strategy::Adaptive { budget } => Some(budget),
            _ => None,
        };
        let cycle_changed = p.strategy != self.policy.strategy;
        let levers_changed = cycle_changed || p.levers != self.policy.levers;
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
                if let Some(n) = g.levers.take() {
                    let (from, to) = (n.tuner.lever(), self.policy.levers.lever);
                    if from != to {
                        g.lever_note = Some(LeverChange {
                            from,
                            to,
                            reason: "policy reloaded".into(),
                        });
                    }
                    if let (Some(b), true) = (old_budget, n.tuner.concluded()) {
                        g.parked = Some((old_levers, b, n));
                    }
                }
            }
        }
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
        self.feed_requests(state);
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
