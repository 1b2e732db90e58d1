//! What comes back to the controller's loop: the results of its acts (at once or from a
//! backend's worker), what backends did or found on their own, and requests on its socket.

use super::*;

impl Ctx {
    /// What came of decision `d`: to the engine, the model and the audit.
    pub(super) fn decided(&mut self, w: &mut Watcher, d: Decision, r: Result<OpReport, ActError>) {
        let suspend = d.action == Action::Suspend;
        let mut rec = self.audit_record(&d);
        match r {
            Ok(report) => {
                let done = report.done();
                self.engine.confirm(&d, &done);
                if suspend
                    && self
                        .refused
                        .get(&d.pid)
                        .is_some_and(|u| refused_by_act(&u.kind))
                {
                    self.controllable(w, d.pid);
                }
                match &report.effect {
                    // The `dynamic` lever: the queues keep running (with a short timeslice
                    // during the episode); the model's states stay as they are.
                    Effect::Timeslice(us) => {
                        rec.lever = Some(ActLever::Dynamic);
                        rec.timeslice_us = Some(*us);
                    }
                    // The freeze lever: the process is frozen, its queues stay mapped.
                    Effect::Frozen(cg) => {
                        rec.lever = Some(ActLever::Freeze);
                        rec.cgroup = Some(cg.clone());
                        if suspend {
                            self.frozen.insert(d.pid, cg.clone());
                        } else {
                            self.frozen.remove(&d.pid);
                        }
                        self.status_dirty = true;
                    }
                    Effect::Paused => self.apply_report(w, &report, suspend),
                }
                let by = |o: QueueOutcome| -> Vec<u32> {
                    report
                        .queues
                        .iter()
                        .filter(|q| q.outcome == o)
                        .map(|q| q.queue_id)
                        .collect()
                };
                rec.done = Some(done);
                rec.invalid = Some(by(QueueOutcome::Invalid));
                rec.error = Some(by(QueueOutcome::Error));
                rec.issued_ns = Some(report.issued_ns);
                rec.returned_ns = Some(report.returned_ns);
                rec.decision_latency_ns = d.trigger_ns.map(|t| report.issued_ns.saturating_sub(t));
                log::info!("{} ({})", report.describe(suspend), d.reason);
            }
            Err(e) => {
                self.engine.confirm(&d, &[]);
                rec.failed = Some(e.to_string());
                // Said once per pid and reason (a process another tool traces failed every
                // decision, ~40 times a second); retried by `retry_refused`.
                self.refuse(w, d.pid, e);
            }
        }
        self.record(AuditRecord::act(suspend, rec));
    }

    pub(super) fn notice(&mut self, w: &mut Watcher, n: Notice) {
        match n {
            Notice::TargetGone { pid, start_time } => {
                // The pid's next owner, if the model knows it already, is another process.
                let reused = w.state.procs.get(&pid).is_some_and(|p| {
                    p.exited_ns.is_none()
                        && p.info.as_ref().is_some_and(|i| i.start_time != start_time)
                });
                if !reused {
                    self.engine.forget(pid, None);
                    for b in &mut self.backends.list {
                        b.forget(pid);
                    }
                }
            }
            Notice::Acted {
                report,
                suspend,
                why,
            } => {
                log::info!("{} ({why})", report.describe(suspend));
                self.apply_report(w, &report, suspend);
                if !suspend {
                    self.engine.forget(report.pid, Some(&report.done()));
                }
                let act = DirectAct {
                    by: By::Control,
                    done: report.done(),
                    pid: report.pid,
                    reason: why,
                    ts_ns: report.returned_ns,
                };
                self.record(AuditRecord::act(suspend, act));
            }
            Notice::Fenced { gpu_id, why } => {
                self.engine.fence_gpu(gpu_id, &why);
                let text = format!("GPU {gpu_id:#x}: {why}: no longer preempting it");
                log::warn!("{text}");
                w.state.apply(Update::Warning {
                    ts_ns: monotonic_ns(),
                    text,
                });
                self.status_dirty = true;
            }
            Notice::Problem { pid, text } => {
                log::warn!("pid {pid}: {text}");
                w.state.apply(Update::Warning {
                    ts_ns: monotonic_ns(),
                    text: format!("pid {pid}: {text}"),
                });
            }
            Notice::Timeslice { change, why } => {
                log::info!(
                    "pid {}: queue {:#x} timeslice {} -> {} us ({why})",
                    change.pid,
                    change.queue_id,
                    change.from_us,
                    change.to_us
                );
                self.record(AuditRecord::Timeslice(TimesliceSet {
                    by: By::Control,
                    from_us: change.from_us,
                    issued_ns: change.issued_ns,
                    original_us: change.original_us,
                    pid: change.pid,
                    reason: why,
                    returned_ns: change.returned_ns,
                    to_us: change.to_us,
                    ts_ns: monotonic_ns(),
                    queue_id: change.queue_id,
                }));
                self.status_dirty = true;
            }
            Notice::Escaped {
                pid,
                kind,
                text,
                answer,
            } => {
                log::debug!("pid {pid}: {text}");
                let now = monotonic_ns();
                let audit = escape::due(
                    &mut self.escape_audited,
                    pid,
                    kind,
                    now,
                    escape::AUDIT_EVERY_NS,
                )
                .is_some();
                self.note_escape(w, pid, kind, now, answer, audit);
            }
            Notice::LeverFailed { pid, text } => {
                let text = format!("pid {pid}: timeslice lever failed, pausing instead: {text}");
                log::warn!("{text}");
                self.engine.pause_anyway(pid);
                w.state.apply(Update::Warning {
                    ts_ns: monotonic_ns(),
                    text,
                });
            }
        }
    }

    pub(super) async fn request(
        &mut self,
        w: &mut Watcher,
        req: Request,
        reply: oneshot::Sender<Response>,
    ) {
        // Cheap next to a driver call; computed first because the backends are borrowed below.
        let status = self.status(w);
        match answer(&mut self.backends, &w.state, req, || status).await {
            Answered::Now(ans) => {
                let _ = reply.send(self.answered(w, *ans));
            }
            Answered::Later {
                ticket,
                pid,
                suspend,
            } => {
                self.pending.insert(
                    ticket,
                    Pending::Request {
                        pid,
                        suspend,
                        reply,
                    },
                );
            }
        }
    }

    /// An operator's act, done: to the model and the audit; the response to send.
    fn answered(&mut self, w: &mut Watcher, ans: Answer) -> Response {
        if let Some((r, suspend)) = &ans.acted {
            self.apply_report(w, r, *suspend);
            let act = DirectAct {
                by: By::Operator,
                done: r.done(),
                pid: r.pid,
                reason: "manual request".into(),
                ts_ns: r.returned_ns,
            };
            self.record(AuditRecord::act(*suspend, act));
        }
        ans.response
    }

    /// What a backend's worker sent: the result of an act handed over, a refusal, a notice.
    pub(super) fn arrival(&mut self, w: &mut Watcher, a: Arrival) {
        match a {
            Arrival::Done { ticket, result } => match self.pending.remove(&ticket) {
                Some(Pending::Decision(d)) => self.decided(w, d, result),
                Some(Pending::Request {
                    pid,
                    suspend,
                    reply,
                }) => {
                    let resp = self.answered(w, finish(pid, suspend, result));
                    let _ = reply.send(resp);
                }
                None => log::debug!("a result for {ticket:?}, which nothing waits for"),
            },
            Arrival::Refused { pid, error } => self.refuse(w, pid, error),
            Arrival::Notice(n) => self.notice(w, n),
        }
    }
}
