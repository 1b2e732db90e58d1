//! Held processes that get out of their hold, and the answer: held again (or frozen too, under
//! `[policy] escape = "freeze"`), reported as a state (status file, model, metrics) and in the
//! audit log, and said in the log at most once per process and kind every [`SAY_EVERY_NS`].
//!
//! What the observer sees: the DBG_TRAP calls that undo a hold made by anyone but this
//! controller (`State::take_debug_calls`): a target's RESUME_QUEUES, DISABLE or ENABLE on
//! itself. What a backend finds itself (a frozen cgroup thawed) comes as `Notice::Escaped`.

use super::*;
use crate::{
    controller::record::EscapeNote,
    observe::model::{DebugCall, DebugOp, Escape, QueueState},
    outcome::EscapeKind,
    policy::{OnEscape, ESCALATE_AFTER},
};

/// One warning per process and kind this often (the rest are counted into the next one).
pub(super) const SAY_EVERY_NS: u64 = 10_000_000_000;

/// One audit record (the escape, and the act that held it again) per process and kind this
/// often: a job escaping in a loop must not flood the log (the count says how many there were).
pub(super) const AUDIT_EVERY_NS: u64 = 1_000_000_000;

/// A held queue's first sample counts as its baseline only this long after it was seen held
/// (the kernel's unmap is done by then).
pub(super) const SETTLE_NS: u64 = 50_000_000;

/// Dispatches past the baseline that make a held queue's progress an escape.
pub(super) const PROGRESS_MARGIN: u64 = 2;

/// The dispatches a held queue made past its baseline, when more than [`PROGRESS_MARGIN`]
/// (the baseline moves up to the new read id); the baseline is the first sample taken
/// [`SETTLE_NS`] after it was seen held. A suspended queue is off the hardware: the command
/// processor consumes none of its packets, so its read id stands still.
pub(super) fn progressed(w: &mut Watch, sample_ns: u64, read: u64) -> Option<u64> {
    if sample_ns < w.since_ns.saturating_add(SETTLE_NS) {
        return None;
    }
    let Some(base) = w.base else {
        w.base = Some(read);
        return None;
    };
    let n = read.saturating_sub(base);
    if n > PROGRESS_MARGIN {
        w.base = Some(read);
        Some(n)
    } else {
        None
    }
}

/// The escapes in a batch of debug calls, one per process (its most telling kind: a take-over
/// over a disable over a resume) with the time of its latest call. `held(pid)`: whether
/// anything of it is held now (a RESUME_QUEUES of a process held by nothing escapes nothing);
/// `ours(pid)`: whether it is an offline process under this controller's control.
pub(super) fn escapes_in(
    calls: &[DebugCall],
    me: u32,
    ours: impl Fn(u32) -> bool,
    held: impl Fn(u32) -> bool,
) -> BTreeMap<u32, (EscapeKind, u64)> {
    let mut out: BTreeMap<u32, (EscapeKind, u64)> = BTreeMap::new();
    for c in calls {
        if c.caller == me || !ours(c.target) {
            continue;
        }
        let kind = match c.op {
            DebugOp::Resume if held(c.target) => EscapeKind::Resumed,
            DebugOp::Resume => continue,
            DebugOp::Disable => EscapeKind::TrapDisabled,
            DebugOp::Enable => EscapeKind::TrapTaken,
        };
        let e = out.entry(c.target).or_insert((kind, c.ts_ns));
        e.0 = e.0.max(kind);
        e.1 = e.1.max(c.ts_ns);
    }
    out
}

/// Whether a warning about (pid, kind) is due at `now`; `said` keeps when the last one was and
/// how many went unsaid since. Some(n): say it, with the `n` unsaid before it.
pub(super) fn say_due(
    said: &mut BTreeMap<(u32, EscapeKind), (u64, u64)>,
    pid: u32,
    kind: EscapeKind,
    now: u64,
) -> Option<u64> {
    due(said, pid, kind, now, SAY_EVERY_NS)
}

/// [`say_due`] with its own interval.
pub(super) fn due(
    said: &mut BTreeMap<(u32, EscapeKind), (u64, u64)>,
    pid: u32,
    kind: EscapeKind,
    now: u64,
    every_ns: u64,
) -> Option<u64> {
    match said.get_mut(&(pid, kind)) {
        Some((at, unsaid)) if now.saturating_sub(*at) < every_ns => {
            *unsaid += 1;
            None
        }
        Some((at, unsaid)) => {
            let n = std::mem::take(unsaid);
            *at = now;
            Some(n)
        }
        None => {
            said.insert((pid, kind), (now, 0));
            Some(0)
        }
    }
}

impl Ctx {
    /// The escapes the observer saw since the last tick, each answered.
    pub(super) async fn escapes(&mut self, w: &mut Watcher) {
        let calls = w.state.take_debug_calls();
        if self.dry_run || calls.is_empty() {
            return;
        }
        let held: BTreeSet<u32> = self.engine.held().into_iter().map(|(p, ..)| p).collect();
        let found = escapes_in(
            &calls,
            self.me,
            |pid| {
                self.engine
                    .class_of(pid)
                    .is_some_and(|(c, _)| c == Class::Offline)
                    && !self.refused.contains_key(&pid)
            },
            |pid| held.contains(&pid) || self.frozen.contains_key(&pid),
        );
        for (pid, (kind, ts_ns)) in found {
            self.escaped(w, pid, kind, ts_ns).await;
        }
    }

    /// Held queues whose dispatch ids move although the model has them suspended: an escape
    /// no call seen explains (a DBG_TRAP call the observer lost, a way out unknown here).
    pub(super) async fn progress_escapes(&mut self, w: &mut Watcher) {
        if self.dry_run {
            return;
        }
        let now = monotonic_ns();
        let mut found: BTreeMap<u32, u64> = BTreeMap::new();
        let mut watched = BTreeSet::new();
        for (pid, qid, ..) in self.engine.held() {
            let Some(q) = w.state.queue(pid, qid) else {
                continue;
            };
            let (Some(read), sample_ns) = (q.activity.read_dispatch_id, q.activity.sample_ns)
            else {
                continue;
            };
            if q.state != QueueState::Suspended {
                continue;
            }
            watched.insert((pid, qid));
            let watch = self.progress.entry((pid, qid)).or_insert(Watch {
                since_ns: now,
                base: None,
            });
            if let Some(n) = progressed(watch, sample_ns, read) {
                *found.entry(pid).or_default() += n;
            }
        }
        self.progress.retain(|k, _| watched.contains(k));
        for (pid, n) in found {
            log::debug!("pid {pid}: {n} dispatch(es) while held");
            self.escaped(w, pid, EscapeKind::Progress, now).await;
        }
    }

    /// `pid` escaped (`kind`, at `ts_ns`): held again (frozen too once it has escaped
    /// [`ESCALATE_AFTER`] times under `escape = "freeze"`), then noted.
    pub(super) async fn escaped(
        &mut self,
        w: &mut Watcher,
        pid: u32,
        kind: EscapeKind,
        ts_ns: u64,
    ) {
        let count = self.escaped.get(&pid).map_or(0, |e| e.count) + 1;
        let escalate = self.engine.policy().escape == OnEscape::Freeze && count >= ESCALATE_AFTER;
        let audit = due(
            &mut self.escape_audited,
            pid,
            kind,
            monotonic_ns(),
            AUDIT_EVERY_NS,
        )
        .is_some();
        let answer = self.hold_again(w, pid, kind, escalate, audit).await;
        // Its queues' baselines are taken again once the new hold has settled.
        self.progress.retain(|(p, _), _| *p != pid);
        self.note_escape(w, pid, kind, ts_ns, answer, audit);
    }

    /// An escape and what was done about it: counted, published, audited (when `audit`) and
    /// said (rate-limited).
    pub(super) fn note_escape(
        &mut self,
        w: &mut Watcher,
        pid: u32,
        kind: EscapeKind,
        ts_ns: u64,
        answer: String,
        audit: bool,
    ) {
        let comm = w
            .state
            .procs
            .get(&pid)
            .map_or("?", |p| p.comm())
            .to_string();
        let reason = format!("pid {pid} ({comm}) {}", kind.what());
        let e = self.escaped.entry(pid).or_insert_with(|| Escape {
            first_ns: ts_ns,
            ..Escape::default()
        });
        e.kind = kind.label().into();
        e.count += 1;
        e.reason = reason.clone();
        e.answer = answer.clone();
        e.last_ns = ts_ns;
        let count = e.count;
        let escape = Some(e.clone());
        w.state.apply(Update::Escaped { pid, escape });
        let now = monotonic_ns();
        if let Some(unsaid) = say_due(&mut self.escape_said, pid, kind, now) {
            let more = if unsaid > 0 {
                format!(
                    " ({unsaid} more time(s) in the last {} s)",
                    SAY_EVERY_NS / 1_000_000_000
                )
            } else {
                String::new()
            };
            let text = format!("{reason}: escaped its hold{more}: {answer}");
            log::warn!("{text}");
            w.state.apply(Update::Warning { ts_ns: now, text });
        }
        if audit {
            self.record(AuditRecord::Escape(EscapeNote {
                answer,
                count,
                kind: kind.label().into(),
                pid,
                reason,
                ts_ns,
            }));
        }
    }

    /// Holds `pid` again through its backend (`escalate`: frozen too); what was done, said.
    async fn hold_again(
        &mut self,
        w: &mut Watcher,
        pid: u32,
        kind: EscapeKind,
        escalate: bool,
        audit: bool,
    ) -> String {
        let b = match self.backends.for_pid(&w.state, pid) {
            Ok(b) => b,
            Err(e) => return format!("could not hold it again: {e}"),
        };
        let reports = match b.rehold(&w.state, pid, kind, escalate).await {
            Ok(r) => r,
            Err(e) => return format!("could not hold it again: {e}"),
        };
        let mut said = Vec::new();
        for r in reports {
            match &r.effect {
                Effect::Frozen(cg) => said.push(format!("froze its cgroup {cg}")),
                _ if r.done().is_empty() => {
                    said.push("nothing of it was held; the debug session is ours again".into());
                    continue;
                }
                _ => {
                    self.apply_report(w, &r, true);
                    said.push(format!("held again (queues {:?})", r.done()));
                }
            }
            if audit {
                let act = DirectAct {
                    by: By::Control,
                    done: r.done(),
                    pid,
                    reason: format!("held again: it {}", kind.what()),
                    ts_ns: r.returned_ns,
                };
                self.record(AuditRecord::act(true, act));
            }
        }
        if said.is_empty() {
            "nothing of it is held".into()
        } else {
            said.join("; ")
        }
    }

    /// Escapes of processes that are gone are forgotten.
    pub(super) fn forget_escapes(&mut self, w: &Watcher) {
        let live = |pid: &u32| {
            w.state
                .procs
                .get(pid)
                .is_some_and(|p| p.exited_ns.is_none())
        };
        self.escaped.retain(|pid, _| live(pid));
        self.escape_said.retain(|(pid, _), _| live(pid));
        self.escape_audited.retain(|(pid, _), _| live(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(caller: u32, target: u32, op: DebugOp, ts_ns: u64) -> DebugCall {
        DebugCall {
            ts_ns,
            caller,
            target,
            op,
            debugger: Some(1),
        }
    }

    #[test]
    fn a_burst_of_calls_is_one_escape_per_process_of_its_most_telling_kind() {
        let calls = [
            call(10, 10, DebugOp::Resume, 5),
            call(10, 10, DebugOp::Resume, 6),
            call(20, 20, DebugOp::Disable, 7),
            call(20, 20, DebugOp::Enable, 8),
            call(20, 20, DebugOp::Resume, 9),
            // Our own calls, processes not ours, a resume of a process held by nothing.
            call(1, 30, DebugOp::Disable, 9),
            call(40, 40, DebugOp::Disable, 9),
            call(50, 50, DebugOp::Resume, 9),
            // A third process disabling ours.
            call(99, 60, DebugOp::Disable, 11),
        ];
        let got = escapes_in(&calls, 1, |p| p != 40, |p| p != 50);
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            vec![
                (10, (EscapeKind::Resumed, 6)),
                (20, (EscapeKind::TrapTaken, 9)),
                (60, (EscapeKind::TrapDisabled, 11)),
            ]
        );
    }

    #[test]
    fn a_held_queue_whose_read_id_moves_past_its_settled_baseline_made_progress() {
        let mut w = Watch {
            since_ns: 1_000,
            base: None,
        };
        // Before the hold settled: no baseline (the kernel may still be unmapping).
        assert_eq!(progressed(&mut w, 1_000 + SETTLE_NS - 1, 40), None);
        assert_eq!(w.base, None);
        assert_eq!(progressed(&mut w, 1_000 + SETTLE_NS, 50), None);
        assert_eq!(w.base, Some(50));
        // Standing still, or within the margin: nothing.
        assert_eq!(progressed(&mut w, 2 * SETTLE_NS, 50), None);
        assert_eq!(
            progressed(&mut w, 3 * SETTLE_NS, 50 + PROGRESS_MARGIN),
            None
        );
        // Past it: the dispatches since the baseline, which moves up.
        assert_eq!(progressed(&mut w, 4 * SETTLE_NS, 60), Some(10));
        assert_eq!(progressed(&mut w, 5 * SETTLE_NS, 61), None);
    }

    #[test]
    fn warnings_are_said_once_per_process_and_kind_per_interval_with_a_count() {
        let mut said = BTreeMap::new();
        let s = SAY_EVERY_NS;
        assert_eq!(say_due(&mut said, 7, EscapeKind::Resumed, 100), Some(0));
        for t in 1..=40 {
            assert_eq!(say_due(&mut said, 7, EscapeKind::Resumed, 100 + t), None);
        }
        // Another kind, another process: their own counts.
        assert_eq!(say_due(&mut said, 7, EscapeKind::Thawed, 150), Some(0));
        assert_eq!(say_due(&mut said, 8, EscapeKind::Resumed, 150), Some(0));
        assert_eq!(
            say_due(&mut said, 7, EscapeKind::Resumed, 100 + s),
            Some(40)
        );
        assert_eq!(say_due(&mut said, 7, EscapeKind::Resumed, 101 + s), None);
        assert_eq!(
            say_due(&mut said, 7, EscapeKind::Resumed, 100 + 2 * s),
            Some(1)
        );
    }
}
