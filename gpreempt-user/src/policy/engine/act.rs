//! A tick's last phases: held queues reviewed (gone, no longer qualifying, or counted for the
//! starvation guard), the GPUs' plans turned into RESUMEs and SUSPENDs, and the reasons the
//! audit and the log give for each.

use super::super::{fmt_ms, fmt_ns, Action, Class, Decision, Lever, Policy, Strategy};
use super::{
    evidence::{BusyBy, Evidence},
    gpu::{gpu_lever, GpuMem},
    held::{Held, Release},
    Engine,
};
use crate::lever::Offers;
use crate::observe::model::{Process, QueueState, State};

impl Engine {
    /// Goes over the held queues: forgets those that are gone (nothing to resume), resumes
    /// those whose own process or GPU no longer qualifies, and counts the rest per GPU with
    /// the oldest suspension, which the starvation guard reads.
    pub(super) fn review_held(&mut self, state: &State, now: u64, out: &mut Vec<Decision>) {
        let (classes, policy, gpus) = (&self.classes, &self.policy, &mut self.gpus);
        let (pause_anyway, offers) = (&self.pause_anyway, &self.offers);
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
            // A process held under a lever that acts per episode, on a GPU whose lever no
            // longer does (a reload, the lever tuner): what the old lever did is undone now,
            // not at the episode's end.
            let o = proc
                .and_then(|p| p.vendor())
                .and_then(|v| offers.get(&v))
                .unwrap_or(&Offers::UNKNOWN);
            let lever = gpu_lever(policy, Some(g), o);
            let lever_gone =
                lever == Lever::None || !lever.acts_per_episode() && !pause_anyway.contains(&pid);
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
    pub(super) fn resume_released(&mut self, now: u64, out: &mut Vec<Decision>) {
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
    pub(super) fn suspend_offline(&mut self, state: &State, now: u64, out: &mut Vec<Decision>) {
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
            if offline && self.may_suspend(p, now) {
                self.suspend_process(p, now, out);
            }
        }
        for d in &out[first..] {
            if let Some(g) = self.gpus.get_mut(&d.gpu_id) {
                g.last_suspend_ns = Some(now);
            }
        }
    }

    /// A process yields by its GPU's lever: never suspended with `timeslice` (the hardware
    /// timeslice does it) or `none` (left alone), suspended with `both` only once an online
    /// episode on one of its GPUs has outlasted `pause_after`; with `dynamic` a "suspend" is the
    /// short timeslice for the episode, with `freeze` a frozen cgroup.
    fn may_suspend(&self, p: &Process, now: u64) -> bool {
        let offers = self.offers_of(p);
        let fallback = self.pause_anyway.contains(&p.pid);
        p.live_queues().any(|q| {
            let g = self.gpus.get(&q.gpu_id);
            match gpu_lever(&self.policy, g, &offers) {
                // Nothing is done, whatever failed before.
                Lever::None => false,
                // Its timeslice could not be set: paused instead.
                _ if fallback => true,
                // Under `dynamic` the decisions reach the backend, which shortens the
                // timeslice instead of pausing.
                // Under `defer` the GPU's plan holds the suspend back until the deferral.
                Lever::Pause | Lever::Dynamic | Lever::Freeze | Lever::Defer => true,
                Lever::Timeslice => false,
                Lever::Both => g
                    .and_then(|g| g.episode_start_ns)
                    .is_some_and(|s| now.saturating_sub(s) >= self.policy.levers.pause_after_ns),
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
                        trigger_ns: match (&g.tuner, g.deferring()) {
                            (Some(t), true) => t.trigger_ns(),
                            _ => g.busy.map(|e| e.at_ns),
                        },
                    });
                    out.len() - 1
                }
            };
            out[i].queues.push(q.queue_id);
        }
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
        Release::Lever(l) => format!("lever now {l}"),
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
        (Strategy::Adaptive { budget }, Some(t)) if g.deferring() => {
            format!("{}; {why}", t.reason(budget))
        }
        (Strategy::Adaptive { .. }, _) => match &g.levers {
            Some(n) if n.tuner.quiet() => {
                "adaptive: quiet window (offline held to measure the online services alone)".into()
            }
            Some(n) => format!("adaptive: lever {}; {why}", n.tuner.lever()),
            None => why,
        },
        (Strategy::Timeslice { .. }, _) => format!("timeslice: online share; {why}"),
        _ => why,
    }
}
