//! The running controller (another process), mirrored into the model from what it publishes:
//! classes, what it cannot act on, held queues and timeslices (`top` formats its title line).

use super::Watcher;
use crate::{
    clock::monotonic_ns,
    observe::{model::Update, status::Status},
};

impl Watcher {
    /// The running controller's classes and held queues (its suspend arrays cannot be read
    /// back reliably from its events: they are gone by the time we look).
    pub fn controller_now(&mut self) {
        let status = crate::observe::status::read_status(&crate::rundir::run_dir())
            .filter(|s| s.controller_pid != 0 && s.controller_pid != std::process::id());
        let Some(s) = status else {
            self.controller_gone();
            return;
        };
        self.mirror_classes(&s);
        self.mirror_uncontrollable(&s);
        self.mirror_held(&s);
        // Only on a change: applying walks every queue.
        let before = self.controller.as_ref().map(|c| &c.timeslices);
        if before.unwrap_or(&Vec::new()) != &s.timeslices {
            self.state.apply(Update::Timeslices(s.timeslices.clone()));
        }
        self.state.adaptive = s.adaptive.iter().map(|v| (v.gpu_id, v.clone())).collect();
        self.state.controller = Some(s.clone());
        self.controller = Some(s);
    }

    /// The controller is gone: the kernel resumed whatever it held, and nothing it changed is in
    /// force (its guardian put the timeslices back).
    fn controller_gone(&mut self) {
        self.state.controller = None;
        self.state.adaptive.clear();
        let Some(old) = self.controller.take() else {
            return;
        };
        // What it could not act on is nobody's business now.
        for &pid in old.uncontrollable.keys().chain(old.refused.keys()) {
            self.state.apply(Update::Uncontrollable { pid, why: None });
        }
        for &pid in old.escaped.keys() {
            self.state.apply(Update::Escaped { pid, escape: None });
        }
        if !old.timeslices.is_empty() {
            self.state.apply(Update::Timeslices(Vec::new()));
        }
        let ts_ns = monotonic_ns();
        for &(pid, q, _) in &old.held {
            self.state.apply(Update::Resumed {
                ts_ns,
                by: old.controller_pid,
                target: pid,
                queues: Some(vec![q]),
            });
        }
    }

    fn mirror_classes(&mut self, s: &Status) {
        for (&pid, class) in &s.classes {
            if self
                .state
                .procs
                .get(&pid)
                .is_some_and(|p| p.class.as_ref() != Some(class))
            {
                self.state.apply(Update::Class {
                    pid,
                    class: Some(class.clone()),
                });
            }
        }
    }

    /// What the controller cannot act on (an older controller publishes the sentence only), and
    /// what escaped its hold.
    fn mirror_uncontrollable(&mut self, s: &Status) {
        let mut changed = Vec::new();
        for p in self.state.procs.values() {
            let want = s.uncontrollable.get(&p.pid).cloned().or_else(|| {
                s.refused
                    .get(&p.pid)
                    .map(|reason| crate::observe::model::Uncontrollable {
                        kind: "other".into(),
                        reason: reason.clone(),
                    })
            });
            if p.uncontrollable != want {
                changed.push(Update::Uncontrollable {
                    pid: p.pid,
                    why: want,
                });
            }
        }
        for p in self.state.procs.values() {
            let want = s.escaped.get(&p.pid);
            if p.escaped.as_ref() != want {
                changed.push(Update::Escaped {
                    pid: p.pid,
                    escape: want.cloned(),
                });
            }
        }
        for u in changed {
            self.state.apply(u);
        }
    }

    /// Queues the controller holds show suspended; those it let go of, resumed.
    fn mirror_held(&mut self, s: &Status) {
        let ts_ns = monotonic_ns();
        let by = s.controller_pid;
        let mut held: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for &(pid, q, _) in &s.held {
            held.entry(pid).or_default().push(q);
        }
        let mut updates = Vec::new();
        for p in self.state.procs.values() {
            let want = held.get(&p.pid);
            let (mut sus, mut res) = (Vec::new(), Vec::new());
            for q in p.live_queues() {
                let is = q.state == crate::observe::model::QueueState::Suspended;
                let should = want.is_some_and(|w| w.contains(&q.queue_id));
                if should && !is {
                    sus.push(q.queue_id);
                } else if !should && is && q.suspended_by == Some(by) {
                    res.push(q.queue_id);
                }
            }
            if !sus.is_empty() {
                updates.push(Update::Suspended {
                    ts_ns,
                    by,
                    target: p.pid,
                    queues: Some(sus),
                });
            }
            if !res.is_empty() {
                updates.push(Update::Resumed {
                    ts_ns,
                    by,
                    target: p.pid,
                    queues: Some(res),
                });
            }
        }
        for u in updates {
            self.state.apply(u);
        }
    }
}
