//! The tuners' side of the engine: evidence the controller feeds the lever tuner
//! (bursts, offline progress, mix changes), the lever choices and tuner views it reads back,
//! their notes, and the next deadline at which an adaptive decision falls due.

use std::collections::BTreeMap;

use super::super::adaptive::View;
use super::super::levers::LeverChange;
use super::super::{Budget, Class, Lever, Strategy};
use super::{Engine, LeverGpu};
use crate::observe::model::State;

impl Engine {
    /// Evidence for the lever tuner of `gpu_id` (strategy `adaptive`; ignored
    /// otherwise): one online burst completed at `now_ns`, `duration_ns` long (online work
    /// pending from its start until drained, e.g. from its queues' read and write pointers). Once this
    /// is called for a GPU, the engine's own estimate from launch hints stops there.
    pub fn lever_burst(&mut self, gpu_id: u32, now_ns: u64, duration_ns: u64) {
        if let Some(n) = self.lever_gpu(gpu_id, now_ns) {
            n.external_bursts = true;
            n.burst = None;
            n.tuner.on_burst(now_ns, duration_ns);
        }
    }

    /// Evidence for the lever tuner of `gpu_id`: offline progress since the last call
    /// (`units`: entries the GPU consumed from the offline compute queues there). Once
    /// this is called for a GPU, the engine's own reading of the model's read ids stops there.
    pub fn lever_offline_progress(&mut self, gpu_id: u32, now_ns: u64, units: u64) {
        if let Some(n) = self.lever_gpu(gpu_id, now_ns) {
            n.external_progress = true;
            n.tuner.on_offline_progress(now_ns, units);
        }
    }

    /// The online services' requests that ended since the last tick, to the lever tuner of each
    /// GPU where the service has compute queues, with the service's goal (its rule's `slo_p99`,
    /// else the policy's budget).
    pub(super) fn feed_requests(&mut self, state: &State) {
        let Strategy::Adaptive { budget } = self.policy.strategy else {
            return;
        };
        if !self.gpus.values().any(|g| g.levers.is_some()) {
            return;
        }
        let tick = self.tick;
        for p in state.procs.values() {
            let Some(e) = self
                .classes
                .get(&p.pid)
                .filter(|e| e.class == Class::Online)
            else {
                continue;
            };
            let goal = e
                .rule
                .and_then(|i| self.policy.rules.get(i))
                .and_then(|r| r.slo_p99_ns)
                .map_or(budget, Budget::Absolute);
            let start_time = e.start_time;
            let r = self
                .requests_read
                .entry(p.pid)
                .or_insert((start_time, 0, tick));
            if r.0 != start_time {
                // A reused pid: another service.
                *r = (start_time, 0, tick);
            }
            r.2 = tick;
            let new: Vec<(u64, u64)> = p.requests.ended_after(r.1).collect();
            let Some(&(last, _)) = new.last() else {
                continue;
            };
            r.1 = last;
            let mut gpus: Vec<u32> = p
                .live_queues()
                .filter(|q| q.kind.is_compute())
                .map(|q| q.gpu_id)
                .collect();
            gpus.sort_unstable();
            gpus.dedup();
            for id in gpus {
                if let Some(n) = self.gpus.get_mut(&id).and_then(|g| g.levers.as_mut()) {
                    n.external_bursts = true;
                    for &(end, dur) in &new {
                        n.tuner.on_request(end, p.pid, dur, goal);
                    }
                }
            }
        }
        self.requests_read.retain(|_, r| r.2 == tick);
    }

    /// A mix change on `gpu_id` the engine cannot see itself (it notices processes joining,
    /// leaving and reclassed on its own).
    pub fn lever_mix_change(&mut self, gpu_id: u32, now_ns: u64) {
        if let Some(n) = self.lever_gpu(gpu_id, now_ns) {
            n.tuner.on_mix_change(now_ns);
        }
    }

    /// The lever tuner of a GPU under the adaptive strategy, made on first use.
    fn lever_gpu(&mut self, gpu_id: u32, now: u64) -> Option<&mut LeverGpu> {
        let Strategy::Adaptive { budget } = self.policy.strategy else {
            return None;
        };
        let p = &self.policy;
        let g = self.gpus.entry(gpu_id).or_default();
        let offers = g.offers;
        Some(
            g.levers
                .get_or_insert_with(|| LeverGpu::new(p, budget, now, offers.as_ref())),
        )
    }

    /// The lever tuners' choices per GPU (what the GPU's backend applies there in place of
    /// the policy's lever); empty outside the adaptive strategy.
    pub fn gpu_levers(&self) -> BTreeMap<u32, Lever> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.levers.as_ref().map(|n| (id, n.tuner.lever())))
            .collect()
    }

    /// Per GPU with a lever tuner (adaptive strategy): the tuner's state.
    pub fn lever_views(&self) -> Vec<super::super::LeverView> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.levers.as_ref().map(|n| n.tuner.view(id)))
            .collect()
    }

    /// The lever changes per GPU since the last call (calibration steps included), for the
    /// log and the audit.
    pub fn take_lever_changes(&mut self) -> Vec<(u32, LeverChange)> {
        let mut out = Vec::new();
        for (&id, g) in self.gpus.iter_mut() {
            out.extend(g.lever_note.take().map(|c| (id, c)));
            if let Some(n) = &mut g.levers {
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
            if let Some(n) = &mut g.levers {
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
            .filter(|(&id, g)| g.fenced.is_none() && p.manages(id) && g.deferring())
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
}
