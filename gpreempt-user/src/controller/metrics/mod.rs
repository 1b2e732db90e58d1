//! Prometheus metrics of `run`: per GPU, per process (with class, container and pod labels),
//! and the controller's own health, served as text exposition on the address `--metrics` names.
//!
//! The control loop owns every figure: it feeds each audit record to [`Metrics::record`] as it
//! is written and renders a snapshot of the map once a second ([`Metrics::render`]); the HTTP
//! task only hands out the last rendering, so a slow or hostile scraper never touches the loop.
//! Processes that exit leave the per-process families at the next rendering: label cardinality is
//! bounded by the processes alive. Here: the families and what feeds them; `serve.rs`: the HTTP
//! side.

mod own;
mod serve;

use std::collections::BTreeMap;

use anyhow::Result;
use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use serve::{serve, Page};

use super::record::AuditRecord;
use crate::observe::model::{QueueState, State};

/// Per-process labels, in order.
const PROC_LABELS: [&str; 7] = [
    "pid",
    "comm",
    "class",
    "container",
    "namespace",
    "pod",
    "pod_container",
];

/// Suspension bookkeeping of one process, from the audit records.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    suspends: u64,
    resumes: u64,
    /// Since when it holds at least one queue (the first done suspend), if it does.
    since_ns: Option<u64>,
    total_ns: u64,
}

pub struct Metrics {
    registry: Registry,
    gpu_queues: IntGaugeVec,
    gpu_suspended: IntGaugeVec,
    gpu_hqds_used: IntGaugeVec,
    gpu_hqds_total: IntGaugeVec,
    gpu_runlists: IntCounterVec,
    gpu_unmaps: IntCounterVec,
    gpu_fenced: IntGaugeVec,
    proc_queues: IntGaugeVec,
    proc_suspended: IntGaugeVec,
    proc_dispatches: IntCounterVec,
    proc_backlog: IntGaugeVec,
    proc_suspends: IntCounterVec,
    proc_resumes: IntCounterVec,
    proc_suspended_seconds: prometheus::CounterVec,
    proc_timeslice: IntGaugeVec,
    actions: IntCounterVec,
    decision_latency: HistogramVec,
    request_duration: HistogramVec,
    /// The label values of each process with a request histogram (removed when it exits).
    request_labels: BTreeMap<u32, Vec<String>>,
    events: IntCounterVec,
    events_degraded: IntGauge,
    audit_failing: IntGauge,
    refused: IntGauge,
    unmanaged: IntGauge,
    uncontrollable: IntGaugeVec,
    proc_uncontrollable: IntGaugeVec,
    escaped: IntGaugeVec,
    proc_escapes: IntGaugeVec,
    reloads: IntCounterVec,
    watchdog: prometheus::IntCounter,
    online_goal: prometheus::GaugeVec,
    online_service: prometheus::GaugeVec,
    offline_kept: prometheus::GaugeVec,
    /// Build info and the process's own CPU and memory.
    own: own::Own,
    held: BTreeMap<u32, Held>,
    /// Dispatches per queue seen so far ((pid, queue) -> last read id - first read id).
    dispatched: BTreeMap<(u32, u32), (u64, u64)>,
}

/// The values of [`PROC_LABELS`] for `p`.
fn proc_label_values(p: &crate::observe::model::Process) -> [String; 7] {
    let pod = p.info.as_ref().and_then(|i| i.pod.as_ref());
    [
        p.pid.to_string(),
        p.comm().to_string(),
        p.class.clone().unwrap_or_default(),
        p.info
            .as_ref()
            .and_then(|i| i.container.clone())
            .unwrap_or_default(),
        pod.and_then(|x| x.namespace.clone()).unwrap_or_default(),
        pod.and_then(|x| x.name.clone()).unwrap_or_default(),
        pod.and_then(|x| x.container.clone()).unwrap_or_default(),
    ]
}

/// Registers `m` and hands it back (the registry keeps a clone; both share the values).
fn reg<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: M) -> Result<M> {
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    reg(r, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

fn fgauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<prometheus::GaugeVec> {
    reg(r, prometheus::GaugeVec::new(Opts::new(name, help), labels)?)
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    reg(r, IntCounterVec::new(Opts::new(name, help), labels)?)
}

impl Metrics {
    pub fn new() -> Result<Self> {
        let r = Registry::new_custom(Some("gpreempt".into()), None)?;
        let p = &PROC_LABELS[..];
        let m = Self {
            gpu_queues: gauge(&r, "gpu_queues", "Live compute queues on the GPU.", &["gpu"])?,
            gpu_suspended: gauge(&r, "gpu_queues_suspended", "Queues suspended on the GPU.", &["gpu"])?,
            gpu_hqds_used: gauge(&r, "gpu_hqds_used", "Hardware queue slots with a mapped queue (last debugfs read).", &["gpu"])?,
            gpu_hqds_total: gauge(&r, "gpu_hqd_slots", "Compute hardware queue slots the driver owns.", &["gpu"])?,
            gpu_runlists: counter(&r, "gpu_runlist_uploads_total", "HWS runlist uploads seen by the kernel probes.", &["gpu"])?,
            gpu_unmaps: counter(&r, "gpu_unmaps_total", "HWS queue unmaps seen by the kernel probes.", &["gpu"])?,
            gpu_fenced: gauge(&r, "gpu_fenced", "1 when the controller stopped preempting the GPU (see the log for why).", &["gpu"])?,
            proc_queues: gauge(&r, "process_queues", "Live compute queues of the process.", p)?,
            proc_suspended: gauge(&r, "process_queues_suspended", "Queues of the process suspended now.", p)?,
            proc_dispatches: counter(&r, "process_dispatches_total", "AQL packets the process's queues consumed while observed (read-id progress).", p)?,
            proc_backlog: gauge(&r, "process_backlog", "AQL packets written but not yet consumed, summed over the process's queues.", p)?,
            proc_suspends: counter(&r, "process_suspends_total", "Suspend actions the controller completed on the process.", p)?,
            proc_resumes: counter(&r, "process_resumes_total", "Resume actions the controller completed on the process.", p)?,
            proc_suspended_seconds: reg(&r, prometheus::CounterVec::new(Opts::new("process_suspended_seconds_total", "Time the controller held queues of the process."), p)?)?,
            proc_timeslice: gauge(&r, "process_timeslice_microseconds", "Hardware timeslice the controller set on an NVIDIA TSG of the process.", &["pid", "tsg", "original"])?,
            actions: counter(&r, "actions_total", "Controller actions by kind and outcome (done, partial, failed, dry_run).", &["action", "outcome"])?,
            decision_latency: reg(&r, HistogramVec::new(
                    HistogramOpts::new(
                        "decision_latency_seconds",
                        "From the evidence that triggered a decision to its ioctl being issued.",
                    )
                    .buckets(vec![5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 0.1]),
                    &["action"],
                )?)?,
            request_duration: reg(&r, HistogramVec::new(
                    HistogramOpts::new(
                        "online_request_duration_seconds",
                        "Requests of a watched (online) process: from the first kernel launch after idleness to the last blocking wait's return before it (uprobes; docs/observability.md).",
                    )
                    .buckets(vec![1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                    p,
                )?)?,
            request_labels: BTreeMap::new(),
            events: counter(&r, "events_total", "The event pipeline: records applied by kind, and the kernel side's counters (seen, lost, rate limited, dropped for other files).", &["kind"])?,
            events_degraded: reg(&r, IntGauge::new("events_degraded", "1 while kernel records are being lost and the map leans on sampling.")?)?,
            audit_failing: reg(&r, IntGauge::new("audit_failing", "1 while audit records cannot be written.")?)?,
            refused: reg(&r, IntGauge::new("processes_refused", "Processes the controller cannot act on (see the log).")?)?,
            unmanaged: reg(&r, IntGauge::new("processes_unmanaged", "GPU processes whose GPU objects the controller does not know (opened the NVIDIA driver before it watched and no journal names them; see the log).")?)?,
            uncontrollable: gauge(&r, "processes_uncontrollable", "Processes the controller cannot act on, by reason (traced: it runs under a tracer of its own, e.g. strace or gdb, and cannot be seized; debugged: another debugger holds its GPU debug trap; ...).", &["reason"])?,
            proc_uncontrollable: gauge(&r, "process_uncontrollable", "1 while the controller cannot act on the process; reason as in processes_uncontrollable.", &[p, &["reason"][..]].concat())?,
            escaped: gauge(&r, "processes_escaped", "Live processes that got out of a hold (and were held again), by the latest way: resumed (its own DBG_TRAP RESUME_QUEUES), trap_disabled, trap_taken, thawed, moved, progress.", &["kind"])?,
            proc_escapes: gauge(&r, "process_escapes", "How many times the process got out of a hold; kind: the latest way, as in processes_escaped.", &[p, &["kind"][..]].concat())?,
            reloads: counter(&r, "policy_reloads_total", "SIGHUP policy reloads by result.", &["result"])?,
            watchdog: reg(&r, prometheus::IntCounter::new("watchdog_resumes_total", "Resumes forced by max_suspend (a hold that lasted too long).")?)?,
            online_goal: fgauge(&r, "online_goal_seconds", "Adaptive strategy: the online service-time goal per GPU.", &["gpu"])?,
            online_service: fgauge(&r, "online_service_seconds", "Adaptive strategy: online service time p90, undisturbed (clean), disturbed (free) and under control (achieved).", &["gpu", "measure"])?,
            offline_kept: fgauge(&r, "offline_kept_ratio", "Adaptive strategy: fraction of the time offline work was not held on the GPU.", &["gpu"])?,
            own: own::Own::new(&r)?,
            registry: r,
            held: BTreeMap::new(),
            dispatched: BTreeMap::new(),
        };
        Ok(m)
    }

    /// One audit record as `run` writes it: suspends and resumes count, the rest do not.
    pub fn record(&mut self, rec: &AuditRecord) {
        let Some((suspend, act)) = rec.as_act() else {
            return;
        };
        let action = if suspend { "suspend" } else { "resume" };
        let decision = act.decision();
        let outcome = match decision {
            Some(d) if d.dry_run => "dry_run",
            Some(d) if d.failed.is_some() => "failed",
            _ if act.done().is_empty() => "none",
            Some(d)
                if [&d.invalid, &d.error]
                    .iter()
                    .any(|v| v.as_ref().is_some_and(|v| !v.is_empty())) =>
            {
                "partial"
            }
            _ => "done",
        };
        self.actions.with_label_values(&[action, outcome]).inc();
        if !suspend && act.reason().contains("max_suspend") {
            self.watchdog.inc();
        }
        if let Some(ns) = decision.and_then(|d| d.decision_latency_ns) {
            self.decision_latency
                .with_label_values(&[action])
                .observe(ns as f64 / 1e9);
        }
        // Only the policy's acts say when they returned: the suspended time runs from there.
        let Some(ts) = decision.and_then(|d| d.returned_ns) else {
            return;
        };
        if !matches!(outcome, "done" | "partial") {
            return;
        }
        let h = self.held.entry(act.pid()).or_default();
        if suspend {
            h.suspends += 1;
            h.since_ns.get_or_insert(ts);
        } else {
            h.resumes += 1;
            if let Some(s) = h.since_ns.take() {
                h.total_ns += ts.saturating_sub(s);
            }
        }
    }

    pub fn reloaded(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// The map and the controller's state now, as text exposition.
    pub fn render(&mut self, state: &State, status: &super::daemon::Status, now_ns: u64) -> String {
        self.reset(status);
        self.gpus(state, status);
        self.processes(state, status, now_ns);
        self.controller(state, status);
        self.own.update();
        let mut families = self.registry.gather();
        families.extend(self.own.registry.gather());
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            log::warn!("encoding metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Gauges and per-scrape counters start again from the state (gone series go).
    fn reset(&mut self, status: &super::daemon::Status) {
        for v in [
            &self.gpu_queues,
            &self.gpu_suspended,
            &self.gpu_hqds_used,
            &self.gpu_hqds_total,
            &self.gpu_fenced,
            &self.proc_queues,
            &self.proc_suspended,
            &self.proc_backlog,
            &self.proc_timeslice,
            &self.uncontrollable,
            &self.proc_uncontrollable,
            &self.escaped,
            &self.proc_escapes,
        ] {
            v.reset();
        }
        // Always present, so that an alert on it has a series to watch.
        self.escaped.with_label_values(&["resumed"]).set(0);
        for e in status.escaped.values() {
            self.escaped.with_label_values(&[&e.kind]).inc();
        }
        // Always present, so that an alert on it has a series to watch.
        self.uncontrollable.with_label_values(&["traced"]).set(0);
        for u in status.uncontrollable.values() {
            self.uncontrollable.with_label_values(&[&u.kind]).inc();
        }
        for v in [
            &self.gpu_runlists,
            &self.gpu_unmaps,
            &self.proc_dispatches,
            &self.proc_suspends,
            &self.proc_resumes,
            &self.events,
        ] {
            v.reset();
        }
        self.proc_suspended_seconds.reset();
        for v in [&self.online_goal, &self.online_service, &self.offline_kept] {
            v.reset();
        }
    }

    fn gpus(&mut self, state: &State, status: &super::daemon::Status) {
        for g in &state.gpus {
            let l = [gpu_label(g.node.gpu_id)];
            let l: Vec<&str> = l.iter().map(String::as_str).collect();
            self.gpu_hqds_total
                .with_label_values(&l)
                .set(i64::from(g.hqds_total));
            if let Some(u) = g.hqds_used {
                self.gpu_hqds_used.with_label_values(&l).set(i64::from(u));
            }
            self.gpu_runlists.with_label_values(&l).inc_by(g.runlists);
            self.gpu_unmaps.with_label_values(&l).inc_by(g.unmaps);
            self.gpu_queues.with_label_values(&l).set(0);
            self.gpu_suspended.with_label_values(&l).set(0);
        }
        for (gpu, _) in &status.fenced {
            self.gpu_fenced
                .with_label_values(&[&gpu_label(*gpu)])
                .set(1);
        }
    }

    /// Requests closed since the last call (`pid` -> durations in ns) into the histogram; the
    /// series of processes gone go.
    pub fn observe_requests(&mut self, state: &State, closed: &[(u32, Vec<u64>)]) {
        for (pid, durations) in closed {
            let Some(p) = state.procs.get(pid) else {
                continue;
            };
            let values = proc_label_values(p);
            let l: Vec<&str> = values.iter().map(String::as_str).collect();
            let h = self.request_duration.with_label_values(&l);
            for d in durations {
                h.observe(*d as f64 / 1e9);
            }
            // A class or pod learnt later changes the labels: the old series goes.
            if let Some(old) = self.request_labels.insert(*pid, values.to_vec()) {
                if old != values {
                    let o: Vec<&str> = old.iter().map(String::as_str).collect();
                    let _ = self.request_duration.remove_label_values(&o);
                }
            }
        }
        let gone: Vec<u32> = self
            .request_labels
            .keys()
            .filter(|pid| state.procs.get(pid).is_none_or(|p| p.exited_ns.is_some()))
            .copied()
            .collect();
        for pid in gone {
            if let Some(old) = self.request_labels.remove(&pid) {
                let o: Vec<&str> = old.iter().map(String::as_str).collect();
                let _ = self.request_duration.remove_label_values(&o);
            }
        }
    }

    /// Per process: queues, what is held, backlog, dispatches, suspensions.
    fn processes(&mut self, state: &State, status: &super::daemon::Status, now_ns: u64) {
        let mut live = std::collections::BTreeSet::new();
        let mut seen_queues = std::collections::BTreeSet::new();
        for p in state.procs.values().filter(|p| p.exited_ns.is_none()) {
            live.insert(p.pid);
            let values = proc_label_values(p);
            let l: Vec<&str> = values.iter().map(String::as_str).collect();
            let live_queues: Vec<_> = p
                .queues
                .values()
                .filter(|q| q.state != QueueState::Destroyed)
                .collect();
            let suspended = live_queues
                .iter()
                .filter(|q| q.state == QueueState::Suspended)
                .count() as i64;
            self.proc_queues
                .with_label_values(&l)
                .set(live_queues.len() as i64);
            self.proc_suspended.with_label_values(&l).set(suspended);
            if let Some(u) = status.uncontrollable.get(&p.pid) {
                let mut lu = l.clone();
                lu.push(&u.kind);
                self.proc_uncontrollable.with_label_values(&lu).set(1);
            }
            if let Some(e) = status.escaped.get(&p.pid) {
                let mut le = l.clone();
                le.push(&e.kind);
                self.proc_escapes
                    .with_label_values(&le)
                    .set(i64::try_from(e.count).unwrap_or(i64::MAX));
            }
            let backlog: u64 = live_queues.iter().filter_map(|q| q.activity.backlog).sum();
            self.proc_backlog.with_label_values(&l).set(backlog as i64);
            let mut dispatched = 0u64;
            for q in &live_queues {
                let key = (p.pid, q.queue_id);
                seen_queues.insert(key);
                if let Some(r) = q.activity.read_dispatch_id {
                    let e = self.dispatched.entry(key).or_insert((r, r));
                    e.1 = e.1.max(r);
                }
                if let Some((first, last)) = self.dispatched.get(&key) {
                    dispatched += last - first;
                }
                let gl = gpu_label(q.gpu_id);
                self.gpu_queues.with_label_values(&[&gl]).inc();
                if q.state == QueueState::Suspended {
                    self.gpu_suspended.with_label_values(&[&gl]).inc();
                }
            }
            self.proc_dispatches
                .with_label_values(&l)
                .inc_by(dispatched);
            let h = self.held.get(&p.pid).copied().unwrap_or_default();
            self.proc_suspends.with_label_values(&l).inc_by(h.suspends);
            self.proc_resumes.with_label_values(&l).inc_by(h.resumes);
            let held_ns = h.total_ns + h.since_ns.map_or(0, |s| now_ns.saturating_sub(s));
            self.proc_suspended_seconds
                .with_label_values(&l)
                .inc_by(held_ns as f64 / 1e9);
        }
        // Exited processes and destroyed queues leave the bookkeeping too.
        self.held.retain(|pid, _| live.contains(pid));
        self.dispatched.retain(|k, _| seen_queues.contains(k));
    }

    /// What the controller publishes: timeslices, event counts, alarms, the adaptive tuner.
    fn controller(&mut self, state: &State, status: &super::daemon::Status) {
        for (pid, queue, original, current) in &status.timeslices {
            self.proc_timeslice
                .with_label_values(&[&pid.to_string(), &queue.to_string(), &original.to_string()])
                .set(*current as i64);
        }
        for (kind, v) in &status.events {
            self.events.with_label_values(&[kind]).inc_by(*v);
        }
        self.events_degraded
            .set(i64::from(status.events_degraded.is_some()));
        self.audit_failing
            .set(i64::from(status.audit_failing.is_some()));
        self.refused.set(status.refused.len() as i64);
        self.unmanaged.set(
            state
                .procs
                .values()
                .filter(|p| p.exited_ns.is_none() && p.unmanaged.is_some())
                .count() as i64,
        );
        for a in &status.adaptive {
            let g = gpu_label(a.gpu_id);
            if let Some(t) = a.target_ns {
                self.online_goal
                    .with_label_values(&[&g])
                    .set(t as f64 / 1e9);
            }
            for (m, v) in [
                ("clean", a.clean_p90_ns),
                ("free", a.free_p90_ns),
                ("achieved", a.achieved_p90_ns),
            ] {
                if let Some(v) = v {
                    self.online_service
                        .with_label_values(&[&g, m])
                        .set(v as f64 / 1e9);
                }
            }
            self.offline_kept
                .with_label_values(&[&g])
                .set(a.offline_kept);
        }
    }
}

fn gpu_label(id: u32) -> String {
    format!("{id:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        controller::{daemon::Status, record::DecisionAct},
        observe::events::{Event, Origin, ProcessExit},
        observe::model::Update,
        tui::app::tests::known_state,
    };

    /// The value of the series whose line starts with `head` (name and labels).
    fn value(page: &str, head: &str) -> Option<f64> {
        page.lines()
            .find(|l| l.starts_with(head))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Each closed request of an online process lands once in its histogram, labelled like
    /// its other series; the series goes with the process.
    #[test]
    fn online_requests_fill_a_histogram_per_process() {
        use gpreempt_common::kprobe::launch;
        let mut m = Metrics::new().unwrap();
        let mut st = known_state();
        let now = st.now_ns;
        st.procs.get_mut(&100).unwrap().feed_requests(
            launch::CU_LAUNCH_KERNEL,
            &[
                (now - 900_000_000, 4_000_000),
                (now - 400_000_000, 30_000_000),
            ],
        );
        st.tick_requests(now);
        let closed = st.take_closed_requests();
        assert_eq!(closed, vec![(100, vec![4_000_000, 30_000_000])]);
        m.observe_requests(&st, &closed);
        // Drained: a second rendering observes nothing new.
        m.observe_requests(&st, &st.clone().take_closed_requests());
        let page = m.render(&st, &Status::default(), now);
        let series = |suffix: &str, le: &str| {
            format!("gpreempt_online_request_duration_seconds_{suffix}{{class=\"online\",comm=\"python\",container=\"abcdef123456\",namespace=\"\",pid=\"100\",pod=\"\",pod_container=\"\"{le}}}")
        };
        assert_eq!(value(&page, &series("count", "")), Some(2.0), "{page}");
        // The build and the controller's own CPU and memory, under the conventional names.
        let build = format!(
            "gpreempt_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&page, &build), Some(1.0), "{page}");
        assert!(
            value(&page, "process_resident_memory_bytes").is_some_and(|v| v > 0.0),
            "{page}"
        );
        assert!(
            value(&page, "process_cpu_seconds_total").is_some_and(|v| v >= 0.0),
            "{page}"
        );
        assert!(
            page.contains("# TYPE process_cpu_seconds_total counter"),
            "{page}"
        );
        assert_eq!(
            value(&page, &series("bucket", ",le=\"0.005\"")),
            Some(1.0),
            "{page}"
        );
        assert_eq!(
            value(&page, &series("bucket", ",le=\"0.05\"")),
            Some(2.0),
            "{page}"
        );
        let sum = value(&page, &series("sum", "")).unwrap();
        assert!((sum - 0.034).abs() < 1e-9, "{sum}");
        // The process exits: its series goes.
        st.procs.get_mut(&100).unwrap().exited_ns = Some(now);
        m.observe_requests(&st, &[]);
        let page = m.render(&st, &Status::default(), now);
        assert!(
            !page.contains("online_request_duration_seconds_count{"),
            "{page}"
        );
    }

    #[test]
    fn the_page_has_gpus_processes_and_the_controllers_own_figures() {
        let mut m = Metrics::new().unwrap();
        let mut st = known_state();
        let status = Status {
            fenced: vec![(1001, "hung".into())],
            events: [("kernel_lost".to_string(), 3)].into(),
            ..Status::default()
        };
        // A suspend of pid 200 done at t=1 s and its resume at t=3 s; a failed resume.
        for (action, ts, failed) in [
            ("suspend", 1_000_000_000u64, false),
            ("resume", 3_000_000_000, false),
            ("resume", 4_000_000_000, true),
        ] {
            let mut rec = DecisionAct {
                pid: 200,
                done: Some(vec![0]),
                invalid: Some(vec![]),
                error: Some(vec![]),
                returned_ns: Some(ts),
                decision_latency_ns: Some(20_000),
                ..DecisionAct::default()
            };
            if failed {
                rec.failed = Some("target gone".into());
                rec.reason = "max_suspend 1s reached".into();
            }
            m.record(&AuditRecord::act(action == "suspend", rec));
        }
        let page = m.render(&st, &status, 5_000_000_000);
        let online = "gpreempt_process_queues{class=\"online\",comm=\"python\",container=\"abcdef123456\",namespace=\"\",pid=\"100\",pod=\"\",pod_container=\"\"}";
        assert_eq!(value(&page, online), Some(2.0), "{page}");
        assert_eq!(
            value(&page, "gpreempt_gpu_fenced{gpu=\"0x3e9\"}"),
            Some(1.0),
            "{page}"
        );
        assert_eq!(
            value(&page, "gpreempt_gpu_queues{gpu=\"0x3e9\"}"),
            Some(3.0),
            "{page}"
        );
        let off = |name: &str| {
            format!("{name}{{class=\"offline\",comm=\"train\",container=\"\",namespace=\"\",pid=\"200\",pod=\"\",pod_container=\"\"}}")
        };
        assert_eq!(
            value(&page, &off("gpreempt_process_suspends_total")),
            Some(1.0),
            "{page}"
        );
        assert_eq!(
            value(&page, &off("gpreempt_process_resumes_total")),
            Some(1.0),
            "{page}"
        );
        assert_eq!(
            value(&page, &off("gpreempt_process_suspended_seconds_total")),
            Some(2.0),
            "{page}"
        );
        assert_eq!(
            value(
                &page,
                "gpreempt_actions_total{action=\"resume\",outcome=\"failed\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &page,
                "gpreempt_decision_latency_seconds_count{action=\"suspend\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&page, "gpreempt_events_total{kind=\"kernel_lost\"}"),
            Some(3.0)
        );
        assert_eq!(value(&page, "gpreempt_watchdog_resumes_total"), Some(1.0));
        assert_eq!(value(&page, "gpreempt_processes_unmanaged"), Some(0.0));
        st.apply(Update::Unmanaged {
            pid: 300,
            why: "opened the NVIDIA driver before the observer attached".into(),
        });
        let page = m.render(&st, &status, 5_000_000_000);
        assert_eq!(value(&page, "gpreempt_processes_unmanaged"), Some(1.0));
        // The process exits: its series leave the next page.
        st.apply(Update::Event(Event::ProcessExit(ProcessExit {
            origin: Origin {
                ts_ns: 6_000_000_000,
                pid: 200,
                tid: 200,
                comm: "train".into(),
            },
            rate_limited: 0,
        })));
        let page = m.render(&st, &status, 7_000_000_000);
        assert!(!page.contains("pid=\"200\""), "{page}");
        assert!(page.contains("pid=\"100\""), "{page}");
    }

    /// A process the controller cannot act on (it runs under a tracer of its own) is a series
    /// of its own with the reason, and counted by reason; `traced` is there (0) when none is.
    #[test]
    fn uncontrollable_processes_are_counted_by_reason() {
        let mut m = Metrics::new().unwrap();
        let st = known_state();
        let page = m.render(&st, &Status::default(), 1);
        assert_eq!(
            value(
                &page,
                "gpreempt_processes_uncontrollable{reason=\"traced\"}"
            ),
            Some(0.0),
            "{page}"
        );
        assert!(!page.contains("gpreempt_process_uncontrollable{"), "{page}");
        let traced = crate::observe::model::Uncontrollable {
            kind: "traced".into(),
            reason: "already traced by pid 4321 (strace)".into(),
        };
        let status = Status {
            refused: [(200, traced.reason.clone())].into(),
            uncontrollable: [(200, traced)].into(),
            ..Status::default()
        };
        let page = m.render(&st, &status, 2);
        assert_eq!(
            value(
                &page,
                "gpreempt_processes_uncontrollable{reason=\"traced\"}"
            ),
            Some(1.0),
            "{page}"
        );
        assert_eq!(value(&page, "gpreempt_processes_refused"), Some(1.0));
        assert_eq!(
            value(
                &page,
                "gpreempt_process_uncontrollable{class=\"offline\",comm=\"train\",container=\"\",namespace=\"\",pid=\"200\",pod=\"\",pod_container=\"\",reason=\"traced\"}"
            ),
            Some(1.0),
            "{page}"
        );
        // Controlled again: the series goes.
        let page = m.render(&st, &Status::default(), 3);
        assert!(!page.contains("gpreempt_process_uncontrollable{"), "{page}");
    }

    /// A process that escaped its hold is a series with its count and latest kind on every
    /// scrape while it lives; `resumed` is there (0) when none escaped.
    #[test]
    fn escaped_processes_are_a_series_on_every_scrape() {
        let mut m = Metrics::new().unwrap();
        let st = known_state();
        let page = m.render(&st, &Status::default(), 1);
        assert_eq!(
            value(&page, "gpreempt_processes_escaped{kind=\"resumed\"}"),
            Some(0.0),
            "{page}"
        );
        let e = crate::observe::model::Escape {
            kind: "trap_disabled".into(),
            count: 4,
            ..Default::default()
        };
        let status = Status {
            escaped: [(200, e)].into(),
            ..Status::default()
        };
        for t in 2..6 {
            let page = m.render(&st, &status, t);
            assert_eq!(
                value(&page, "gpreempt_processes_escaped{kind=\"trap_disabled\"}"),
                Some(1.0),
                "{page}"
            );
            assert_eq!(
                value(
                    &page,
                    "gpreempt_process_escapes{class=\"offline\",comm=\"train\",container=\"\",kind=\"trap_disabled\",namespace=\"\",pid=\"200\",pod=\"\",pod_container=\"\"}"
                ),
                Some(4.0),
                "{page}"
            );
        }
    }
}
