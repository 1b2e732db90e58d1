//! A tick's first phase: the live processes classified and, per GPU, the first evidence of online
//! work, the strict evidence the adaptive tuner measures, offline activity, and the mix
//! and offline progress the lever tuner is fed.

use super::super::{Class, Strategy};
use super::{
    evidence::{online_evidence, strict_work, Evidence},
    gpu::mix_term,
    Engine, Launches, Reads,
};
use crate::lever::Offers;
use crate::observe::model::{Activity, Process, SampleStatus, State};

impl Engine {
    /// Classifies the live processes and records, per GPU, the first evidence (by pid, then
    /// queue) of online work on a managed compute queue: what makes offline queues yield there.
    /// Returns whether any process is offline.
    pub(super) fn gather_online(&mut self, state: &State, now: u64) -> bool {
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
            let offers = self.offers_of(p);
            let choice = offers.choice(self.policy.levers.candidates);
            if class != Class::Ignore && choice {
                self.note_mix(p, class, offers);
            }
            if class == Class::Offline {
                self.note_offline_activity(p);
                // Read only where a lever tuner can use it.
                if choice && matches!(self.policy.strategy, Strategy::Adaptive { .. }) {
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
        // Queues gone or no longer offline (a few per process: cheap).
        self.offline_reads.retain(|_, r| r.stamp == tick);
        any_offline
    }

    /// Marks the GPUs where an online or offline process with a choice of levers has live
    /// compute queues, and folds it into their mix fingerprint.
    fn note_mix(&mut self, p: &Process, class: Class, offers: Offers) {
        let mut seen: Vec<u32> = Vec::new();
        for q in p.live_queues() {
            if q.kind.is_compute() && !seen.contains(&q.gpu_id) {
                seen.push(q.gpu_id);
                let g = self.gpus.entry(q.gpu_id).or_default();
                g.choice = true;
                g.offers = Some(offers);
                g.mix = g.mix.wrapping_add(mix_term(p.pid, class));
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

    /// Offline progress for the lever tuner: how far each offline compute queue's read id (as
    /// its vendor's reader unwraps it) moved since its last sample, per GPU.
    fn note_offline_progress(&mut self, p: &Process, start_time: u64) {
        let tick = self.tick;
        for q in p.queues.values() {
            let a = &q.activity;
            if !q.alive() || !q.kind.is_compute() || a.status != SampleStatus::Valid {
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
                g.progress = Some(g.progress.unwrap_or(0).saturating_add(moved));
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
