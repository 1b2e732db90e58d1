//! Classification in the loop: each process's class as the policy gives it (audited with its
//! rule), and another try for processes refused earlier.

use super::*;
use crate::controller::record::{ClassNote, RuleRef};

impl Ctx {
    /// Classes the live processes; a process whose class is new or changed is logged and
    /// audited with the rule that gave it, and handed to its backend.
    pub(super) async fn classify(&mut self, w: &mut Watcher) {
        for (pid, class) in self.engine.classify(&w.state) {
            let rule = self.engine.class_of(pid).and_then(|(_, r)| r);
            let policy = self.engine.policy();
            let reason = policy.verdict(class, rule);
            let rule_line = rule.and_then(|i| policy.rule_line(i));
            self.record(AuditRecord::Class(ClassNote {
                class: class.label().to_string(),
                pid,
                reason: reason.clone(),
                rule: RuleRef::of(rule),
                rule_line,
                ts_ns: monotonic_ns(),
            }));
            log::info!(
                "pid {pid} ({}): {reason}, {} live queue(s)",
                w.state.procs.get(&pid).map_or("?", |p| p.comm()),
                w.state
                    .procs
                    .get(&pid)
                    .map_or(0, |p| p.live_queues().count())
            );
            self.status_dirty = true;
            w.state.apply(Update::Class {
                pid,
                class: Some(class.label().to_string()),
            });
            self.launch_hints(w, pid, class);
            let Ok(b) = self.backends.for_pid(&w.state, pid) else {
                continue;
            };
            match b.classed(&w.state, pid, class).await {
                Ok(()) => self.controllable(w, pid),
                Err(e) => self.refuse(w, pid, e),
            }
        }
    }

    /// Processes refused earlier get another try (the tracer that held one may have let go);
    /// one that is gone is dropped.
    pub(super) async fn retry_refused(&mut self, w: &mut Watcher) {
        let pids: Vec<u32> = self.refused.keys().copied().collect();
        for pid in pids {
            let class = w.state.procs.get(&pid).and_then(|p| p.class.clone());
            let live = w
                .state
                .procs
                .get(&pid)
                .is_some_and(|p| p.exited_ns.is_none());
            let Some(class) = class.filter(|_| live).and_then(|c| Class::parse(&c)) else {
                self.controllable(w, pid);
                continue;
            };
            // Refused by an act, not by the attach (its runtime never enabled the debug API, a
            // freeze refused): an attach that works says nothing, and the report stays until an
            // act succeeds (retracting it here made it come and go between scrapes).
            if self
                .refused
                .get(&pid)
                .is_some_and(|u| refused_by_act(&u.kind))
            {
                continue;
            }
            let Ok(b) = self.backends.for_pid(&w.state, pid) else {
                continue;
            };
            if b.classed(&w.state, pid, class).await.is_ok() {
                log::warn!("pid {pid}: can be controlled now");
                self.controllable(w, pid);
            }
        }
    }
}
