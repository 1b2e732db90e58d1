//! `gpreempt-ebpf kfd-cycles` (hidden): suspend / resume cycles of one KFD process, timed, for the
//! MI host kit (scripts/mi-kit.sh; the NVIDIA analogue is `nv-pause-test`). It becomes the
//! target's debugger through the controller's own KFD path (the backend seam: control thread,
//! watchdog, lease guardian, the run directory's lock), and a sampler thread reads every AQL
//! queue's `read_dispatch_id` from the target's memory (as the sampler of `top` / `run` does)
//! throughout, so each cycle reports:
//!
//! - the SUSPEND and RESUME ioctls' wall time;
//! - time-to-quiesce: from issuing SUSPEND to the first sample showing the value the read id
//!   then keeps while held (0 when it already had it);
//! - whether the read id moved at all between SUSPEND's return and RESUME (a correctness check:
//!   a held queue must consume nothing);
//! - time-to-progress: from issuing RESUME to the first sample where the read id moved, when
//!   there was a backlog (write id > read id) to run.
//!
//! Resolution is the sampler's interval (`--sample-interval`, 100 us by default); one
//! `process_vm_readv` per sample.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use serde_json::json;

use crate::{
    backend::TargetError,
    backend::{ActError, Arrival},
    cmd::manual::DurationArg,
    controller::{
        daemon,
        hold::{Holder, Next},
    },
    observe::kfd::{sampler, Paths},
    observe::model::{Process, QueueKind, SampleRead, State, Update},
    outcome::{Notice, OpReport, QueueOutcome},
    policy::Class,
};

/// The seeds' target for each of SUSPEND and RESUME.
const TARGET_MS: f64 = 10.0;

/// Exit codes besides 0 (done) and 1 (an error before or outside the cycles).
pub const EXIT_TARGET_GONE: u8 = 3;
const EXIT_SIGINT: u8 = 130;
const EXIT_SIGTERM: u8 = 143;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The target process (host pid).
    #[arg(long, required_unless_present = "comm", conflicts_with = "comm")]
    pub pid: Option<u32>,
    /// The target: the first process with this command name that has a KFD queue.
    #[arg(long)]
    pub comm: Option<String>,
    #[arg(long, default_value_t = 20)]
    pub cycles: u32,
    /// Time suspended in each cycle.
    #[arg(long, default_value = "50ms", value_name = "DURATION")]
    pub hold: DurationArg,
    /// Time running between cycles (and before the first).
    #[arg(long, default_value = "100ms", value_name = "DURATION")]
    pub gap: DurationArg,
    /// One JSON object per cycle, then a summary object (JSON Lines on stdout).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the target to have a readable AQL queue.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub wait: DurationArg,
    /// Time between two reads of the dispatch ids (microseconds).
    #[arg(long, default_value_t = 100, value_name = "US")]
    pub sample_interval: u64,
    /// SUSPEND grace period in the kernel's units (1K GPU clocks; default: the kernel's).
    #[arg(long)]
    pub grace: Option<u32>,
}

/// One read of one queue's dispatch ids; `t_ns` is taken before the read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub t_ns: u64,
    pub qid: u32,
    pub read: u64,
    pub write: u64,
}

/// When the two ioctls of a cycle were issued and returned (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug, Default)]
pub struct CycleTimes {
    pub s_issued: u64,
    pub s_returned: u64,
    pub r_issued: u64,
    pub r_returned: u64,
}

/// What one queue did in one cycle.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueCycle {
    pub queue_id: u32,
    pub read_at_suspend: Option<u64>,
    pub read_held: Option<u64>,
    pub quiesce_ms: Option<f64>,
    /// How far the read id moved between SUSPEND's return and RESUME (must be 0).
    pub advanced_while_held: u64,
    /// write - read just before RESUME.
    pub backlog_at_resume: Option<u64>,
    /// RESUME issued -> read id moved (only with a backlog; None if not seen before the next
    /// cycle).
    pub progress_ms: Option<f64>,
    pub samples: usize,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// One queue's cycle from its samples (sorted by time).
pub fn analyze_queue(qid: u32, s: &[Sample], t: &CycleTimes) -> QueueCycle {
    let mut out = QueueCycle {
        queue_id: qid,
        samples: s.len(),
        ..Default::default()
    };
    let before = s.iter().rev().find(|x| x.t_ns <= t.s_issued);
    out.read_at_suspend = before.map(|x| x.read);
    let during: Vec<&Sample> = s
        .iter()
        .filter(|x| x.t_ns > t.s_issued && x.t_ns < t.r_issued)
        .collect();
    let Some(last) = during.last() else {
        return out;
    };
    let held = last.read;
    out.read_held = Some(held);
    // The first sample of the final run of `held` values.
    let first_final = during
        .iter()
        .rposition(|x| x.read != held)
        .map_or(0, |i| i + 1);
    out.quiesce_ms = Some(
        if first_final == 0 && before.is_none_or(|b| b.read == held) {
            0.0
        } else {
            ms(during[first_final].t_ns.saturating_sub(t.s_issued))
        },
    );
    let held_reads = during
        .iter()
        .filter(|x| x.t_ns > t.s_returned)
        .map(|x| x.read);
    if let (Some(lo), Some(hi)) = (held_reads.clone().min(), held_reads.max()) {
        out.advanced_while_held = hi - lo;
    }
    let backlog = last.write.saturating_sub(last.read);
    out.backlog_at_resume = Some(backlog);
    if backlog > 0 {
        out.progress_ms = s
            .iter()
            .find(|x| x.t_ns >= t.r_issued && x.read > held)
            .map(|x| ms(x.t_ns - t.r_issued));
    }
    out
}

/// A cycle's JSON object: the ioctls and every queue, with the figures that sum it up (the
/// slowest queue's quiesce, the first queue's progress).
pub fn cycle_json(
    cycle: u32,
    pid: u32,
    t: &CycleTimes,
    queues: &[QueueCycle],
    emulated: bool,
) -> serde_json::Value {
    let quiesce = queues
        .iter()
        .filter_map(|q| q.quiesce_ms)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let progress = queues
        .iter()
        .filter_map(|q| q.progress_ms)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    json!({
        "type": "cycle",
        "cycle": cycle,
        "pid": pid,
        "emulated": emulated,
        "suspend_ms": ms(t.s_returned.saturating_sub(t.s_issued)),
        "resume_ms": ms(t.r_returned.saturating_sub(t.r_issued)),
        "held_ms": ms(t.r_issued.saturating_sub(t.s_returned)),
        "quiesce_ms": quiesce,
        "progress_ms": progress,
        "progress_while_held": queues.iter().any(|q| q.advanced_while_held > 0),
        "backlog_at_resume": queues.iter().filter_map(|q| q.backlog_at_resume).sum::<u64>(),
        "queues": queues,
    })
}

/// Nearest-rank percentile of `v` (sorted in place).
pub fn pct(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

fn stats(cycles: &[serde_json::Value], key: &str) -> serde_json::Value {
    let mut v: Vec<f64> = cycles.iter().filter_map(|c| c[key].as_f64()).collect();
    let n = v.len();
    let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
    json!({
        "n": n,
        "p50": p50,
        "p99": p99,
        "max": v.last(),
        "over_target": v.iter().filter(|x| **x > TARGET_MS).count(),
    })
}

/// The summary of the cycles done (all of them, or up to an early end).
pub fn summary_json(
    pid: u32,
    cycles: &[serde_json::Value],
    asked: u32,
    interval_us: Option<f64>,
    emulated: bool,
    ended: &str,
) -> serde_json::Value {
    json!({
        "type": "summary",
        "pid": pid,
        "emulated": emulated,
        "cycles": cycles.len(),
        "cycles_asked": asked,
        "target_ms": TARGET_MS,
        "suspend_ms": stats(cycles, "suspend_ms"),
        "resume_ms": stats(cycles, "resume_ms"),
        "quiesce_ms": stats(cycles, "quiesce_ms"),
        "progress_ms": stats(cycles, "progress_ms"),
        "cycles_with_progress_while_held": cycles
            .iter()
            .filter(|c| c["progress_while_held"] == true)
            .count(),
        "sample_interval_us": interval_us,
        "ended": ended,
    })
}

/// The target's process in a model of its own (sysfs + debugfs `mqds`: the queues' read
/// pointers), once it has an AQL queue whose dispatch ids can be read.
fn find_target(a: &Args) -> Result<Process> {
    let start = Instant::now();
    let mut last_why = String::from("no such process with a KFD queue yet");
    loop {
        let (state, _) =
            crate::observe::watch::Watcher::snapshot(&Paths::default(), Duration::ZERO)?;
        let found = state.procs.values().find(|p| {
            p.exited_ns.is_none()
                && match (&a.pid, &a.comm) {
                    (Some(pid), _) => p.pid == *pid,
                    (None, Some(c)) => p.comm() == c,
                    (None, None) => false,
                }
                && p.live_queues().next().is_some()
        });
        if let Some(p) = found {
            let aql = p
                .live_queues()
                .filter(|q| q.kind == QueueKind::ComputeAql && q.read_pointer_address.is_some())
                .count();
            if aql > 0 {
                return Ok(p.clone());
            }
            last_why = format!(
                "pid {} has {} KFD queue(s) but none whose AQL dispatch ids can be read: their \
                 read pointers come from debugfs (mount it: `mount -t debugfs none \
                 /sys/kernel/debug`)",
                p.pid,
                p.live_queues().count()
            );
        }
        if let Some(pid) = a.pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                bail!("pid {pid} does not exist");
            }
        }
        if start.elapsed() >= a.wait.0 {
            bail!("{last_why} (waited {:?})", a.wait.0);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Samples the target's AQL queues until told to stop, into a shared list the cycles drain.
struct SamplerThread {
    stop: Arc<AtomicBool>,
    buf: Arc<Mutex<Vec<Sample>>>,
    gaps: Arc<Mutex<Vec<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SamplerThread {
    fn start(p: Process, interval: Duration) -> Result<Self> {
        let mut state = State::new();
        let pid = p.pid;
        state.procs.insert(pid, p);
        // The first read checks each amd_queue_t against CREATE_QUEUE's view; later reads take
        // only the two ids of queues that passed.
        let first = sampler::sample(&state);
        let readable: Vec<u32> = first
            .iter()
            .filter(|(_, _, r)| matches!(r, SampleRead::Ids { .. }))
            .map(|s| s.1)
            .collect();
        if readable.is_empty() {
            bail!("pid {pid}: no AQL queue could be read: {first:?}");
        }
        state.apply(Update::Samples {
            ts_ns: crate::clock::monotonic_ns(),
            samples: first,
        });
        // Only the ids from now on: without a read id in the model the sampler reads no ring
        // window (the packets are `trace --dispatches`'s business; 4 KiB a sample would only
        // slow the loop and the target).
        if let Some(p) = state.procs.get_mut(&pid) {
            for q in p.queues.values_mut() {
                q.activity.read_dispatch_id = None;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let buf = Arc::new(Mutex::new(Vec::new()));
        let gaps = Arc::new(Mutex::new(Vec::new()));
        let (s, b, g) = (stop.clone(), buf.clone(), gaps.clone());
        let thread = std::thread::Builder::new()
            .name("kfd-cycles-sampler".into())
            .spawn(move || {
                let mut prev = 0u64;
                while !s.load(Ordering::Relaxed) {
                    let t_ns = crate::clock::monotonic_ns();
                    let reads = sampler::sample(&state);
                    let mut out = b.lock().unwrap_or_else(|e| e.into_inner());
                    for (_, qid, r) in reads {
                        if let SampleRead::Ids { read, write, .. } = r {
                            out.push(Sample {
                                t_ns,
                                qid,
                                read,
                                write,
                            });
                        }
                    }
                    drop(out);
                    if prev != 0 {
                        let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
                        // A bounded record of the real interval (sleep overshoots).
                        if g.len() < 100_000 {
                            g.push(t_ns - prev);
                        }
                    }
                    prev = t_ns;
                    std::thread::sleep(interval);
                }
            })
            .context("starting the sampler thread")?;
        Ok(Self {
            stop,
            buf,
            gaps,
            thread: Some(thread),
        })
    }

    /// Takes every sample so far but keeps the newest of each queue (the reference before the
    /// next SUSPEND).
    fn drain(&self) -> Vec<Sample> {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let all = std::mem::take(&mut *b);
        let mut keep: Vec<Sample> = Vec::new();
        for s in all.iter().rev() {
            if !keep.iter().any(|k| k.qid == s.qid) {
                keep.push(*s);
            }
        }
        keep.reverse();
        *b = keep;
        all
    }

    /// The median time between two samples (us).
    fn interval_us(&self) -> Option<f64> {
        let mut g: Vec<f64> = self
            .gaps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|&n| n as f64 / 1e3)
            .collect();
        pct(&mut g, 0.5)
    }
}

impl Drop for SamplerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Why the cycles ended early.
enum Stop {
    Signal(&'static str, u8),
    Gone,
    Failed(String),
}

/// Waits `d` while beating the lease, watching the control thread's notices and the signals.
struct Waiter {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    pid: u32,
}

impl Waiter {
    async fn wait(&mut self, hold: &mut Holder, d: Duration) -> Result<(), Stop> {
        let end = Instant::now() + d;
        let state = State::new();
        loop {
            for n in hold.upkeep(&state) {
                if let Notice::Problem { text, .. } = n {
                    eprintln!("kfd-cycles: {text}");
                }
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            let step = left.min(Duration::from_millis(100));
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = self.int.recv() => return Err(Stop::Signal("interrupted (SIGINT)", EXIT_SIGINT)),
                _ = self.term.recv() => return Err(Stop::Signal("terminated (SIGTERM)", EXIT_SIGTERM)),
                // The KFD control thread sends notices only; the holder applied them.
                next = hold.next() => match next {
                    Next::Arrival(Arrival::Notice(n)) => match n {
                        Notice::TargetGone { pid, .. } if pid == self.pid => return Err(Stop::Gone),
                        Notice::Problem { pid, text } => eprintln!("kfd-cycles: pid {pid}: {text}"),
                        Notice::Fenced { gpu_id, why } => {
                            return Err(Stop::Failed(format!("GPU {gpu_id:#x} fenced: {why}")))
                        }
                        Notice::Acted { report, suspend, why } => {
                            eprintln!("kfd-cycles: {} ({why})", report.describe(suspend));
                        }
                        _ => {}
                    },
                    Next::Arrival(_) | Next::Request(_) => {}
                },
            }
        }
    }
}

/// Ok(report) when every queue acted on was done; the early end otherwise.
async fn judge(r: Result<OpReport, ActError>, pid: u32, what: &str) -> Result<OpReport, Stop> {
    match r {
        Ok(rep) if rep.queues.iter().all(|q| q.outcome == QueueOutcome::Done) => Ok(rep),
        // A queue that vanished under the call because its process is exiting (its queues go
        // before the process does): the target ended, not a failure.
        Ok(_) if exiting(pid).await => Err(Stop::Gone),
        Ok(rep) => Err(Stop::Failed(format!(
            "pid {pid}: {}",
            rep.describe(what == "suspend")
        ))),
        Err(ActError::Target(TargetError::Gone)) => Err(Stop::Gone),
        Err(e) => Err(Stop::Failed(format!("pid {pid}: {what}: {e}"))),
    }
}

/// Whether `pid` is gone or a zombie within half a second.
async fn exiting(pid: u32) -> bool {
    for _ in 0..10 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            // The state follows the comm's closing parenthesis.
            Ok(t)
                if matches!(
                    t.rsplit_once(") ").and_then(|(_, r)| r.chars().next()),
                    Some('Z' | 'X')
                ) =>
            {
                return true
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    false
}

fn emit(json_out: bool, v: &serde_json::Value) {
    if json_out {
        println!("{v}");
    } else if v["type"] == "cycle" {
        let f = |k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.3}"));
        println!(
            "cycle {:>3}: suspend {} ms  resume {} ms  quiesce {} ms  progress {} ms{}",
            v["cycle"],
            f("suspend_ms"),
            f("resume_ms"),
            f("quiesce_ms"),
            f("progress_ms"),
            if v["progress_while_held"] == true {
                "  PROGRESS WHILE HELD"
            } else {
                ""
            }
        );
    } else {
        let line = |k: &str| {
            let s = &v[k];
            let f = |x: &serde_json::Value| x.as_f64().map_or("-".into(), |x| format!("{x:.3}"));
            format!(
                "{k:<12} p50 {} p99 {} max {} (over {} ms: {})",
                f(&s["p50"]),
                f(&s["p99"]),
                f(&s["max"]),
                TARGET_MS,
                s["over_target"]
            )
        };
        println!(
            "pid {}: {} of {} cycles{}",
            v["pid"],
            v["cycles"],
            v["cycles_asked"],
            if v["emulated"] == true {
                " (emulated)"
            } else {
                ""
            }
        );
        for k in ["suspend_ms", "resume_ms", "quiesce_ms", "progress_ms"] {
            println!("  {}", line(k));
        }
        println!(
            "  progress while held: {} cycle(s)",
            v["cycles_with_progress_while_held"]
        );
    }
}

/// What ended the cycles: the line to say, the exit code, and the error kind (None: no error).
fn ending(end: Option<Stop>, pid: u32, cycles_done: usize) -> (String, u8, Option<&'static str>) {
    match end {
        None => ("done".to_string(), 0u8, None),
        Some(Stop::Signal(why, code)) => (why.to_string(), code, None),
        Some(Stop::Gone) => (
            format!(
                "pid {pid} exited during cycle {cycles_done}: nothing is left suspended (its \
                 queues went with it)"
            ),
            EXIT_TARGET_GONE,
            Some("target exited"),
        ),
        Some(Stop::Failed(e)) => (e, 1, Some("failed")),
    }
}

pub async fn main(g: &crate::cmd::Global, a: &Args) -> Result<ExitCode> {
    anyhow::ensure!(a.cycles > 0, "--cycles must be at least 1");
    let emulated = std::env::var_os("GPREEMPT_LABEL").is_some();
    // The run directory's lock first: with a controller running, say so before waiting.
    let lock = daemon::Lock::acquire(&crate::rundir::run_dir())?;
    let target = find_target(a)?;
    // From here on (not while waiting for the target, whose loop would not see them) SIGINT and
    // SIGTERM end the cycles with everything resumed, attaching included.
    use tokio::signal::unix::{signal, SignalKind};
    let (int, term) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let pid = target.pid;
    let qids: Vec<u32> = target
        .live_queues()
        .filter(|q| q.kind == QueueKind::ComputeAql)
        .map(|q| q.queue_id)
        .collect();
    eprintln!(
        "kfd-cycles: pid {pid} ({}): AQL queue(s) {qids:?}; {} cycles of {:?} held, {:?} running",
        target.comm(),
        a.cycles,
        a.hold.0,
        a.gap.0
    );
    let sampler = SamplerThread::start(target, Duration::from_micros(a.sample_interval.max(1)))?;
    // The controller's own path, as a `suspend` holder takes it: one controller at a time (the
    // lock above), the control thread's watchdog (a hold never outlives `hold` + 2 s), the lease
    // guardian.
    let max_suspend = a.hold.0 + Duration::from_secs(2);
    let mut hold = Holder::by_pid(lock, &g.kfd_device, max_suspend, "kfd-cycles").await?;
    let state = State::new();
    if let Err(e) = hold.classed(&state, pid, Class::Offline).await {
        hold.shutdown().await;
        bail!("pid {pid}: {e}");
    }
    let mut w = Waiter { int, term, pid };
    let mut done: Vec<serde_json::Value> = Vec::new();
    let mut end: Option<Stop> = None;
    // Running first: the sampler has a reference before the first SUSPEND.
    if let Err(s) = w.wait(&mut hold, a.gap.0).await {
        end = Some(s);
    }
    for cycle in 0..a.cycles {
        if end.is_some() {
            break;
        }
        sampler.drain();
        let r = async {
            let s = hold.suspend(&state, pid, None, a.grace).await;
            let s = judge(s, pid, "suspend").await?;
            let held = w.wait(&mut hold, a.hold.0).await;
            let r = judge(hold.resume(&state, pid, None).await, pid, "resume").await?;
            held?;
            w.wait(&mut hold, a.gap.0).await?;
            Ok::<_, Stop>(CycleTimes {
                s_issued: s.issued_ns,
                s_returned: s.returned_ns,
                r_issued: r.issued_ns,
                r_returned: r.returned_ns,
            })
        }
        .await;
        match r {
            Ok(t) => {
                let mut all = sampler.drain();
                all.sort_by_key(|s| s.t_ns);
                let queues: Vec<QueueCycle> = qids
                    .iter()
                    .map(|&q| {
                        let mine: Vec<Sample> =
                            all.iter().filter(|s| s.qid == q).copied().collect();
                        analyze_queue(q, &mine, &t)
                    })
                    .collect();
                let v = cycle_json(cycle, pid, &t, &queues, emulated);
                emit(a.json, &v);
                done.push(v);
            }
            Err(s) => end = Some(s),
        }
    }
    // Whatever ended the cycles: resume everything, let go, stop the guardian.
    let resumed = hold.shutdown().await;
    for r in resumed.iter().filter(|r| !r.queues.is_empty()) {
        eprintln!("kfd-cycles: {}", r.describe(false));
    }
    let interval = sampler.interval_us();
    drop(sampler);
    let (ended, code, err) = ending(end, pid, done.len());
    let summary = summary_json(pid, &done, a.cycles, interval, emulated, &ended);
    emit(a.json, &summary);
    if let Some(kind) = err {
        eprintln!("kfd-cycles: error ({kind}): {ended}");
    } else if code != 0 {
        eprintln!("kfd-cycles: {ended}: every queue resumed");
    }
    Ok(ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t_ns: u64, read: u64, write: u64) -> Sample {
        Sample {
            t_ns,
            qid: 0,
            read,
            write,
        }
    }

    const T: CycleTimes = CycleTimes {
        s_issued: 1000,
        s_returned: 1100,
        r_issued: 5000,
        r_returned: 5100,
    };

    #[test]
    fn a_busy_queue_quiesces_then_holds_then_progresses() {
        let v = [
            s(900, 10, 20),
            s(1050, 11, 20),
            s(1150, 12, 21),
            s(2000, 12, 25),
            s(4900, 12, 30),
            s(5050, 12, 30),
            s(5300, 13, 30),
        ];
        let q = analyze_queue(0, &v, &T);
        assert_eq!(q.read_at_suspend, Some(10));
        assert_eq!(q.read_held, Some(12));
        assert_eq!(q.quiesce_ms, Some(150.0 / 1e6));
        assert_eq!(q.advanced_while_held, 0);
        assert_eq!(q.backlog_at_resume, Some(18));
        assert_eq!(q.progress_ms, Some(300.0 / 1e6));
    }

    #[test]
    fn progress_while_held_is_caught_and_an_idle_queue_quiesces_at_once() {
        let v = [s(900, 5, 9), s(1200, 5, 9), s(3000, 7, 9), s(4000, 7, 9)];
        let q = analyze_queue(0, &v, &T);
        assert_eq!(q.advanced_while_held, 2);
        let idle = [s(900, 5, 5), s(1200, 5, 5), s(6000, 5, 5)];
        let q = analyze_queue(0, &idle, &T);
        assert_eq!(q.quiesce_ms, Some(0.0));
        assert_eq!(q.backlog_at_resume, Some(0));
        assert_eq!(q.progress_ms, None, "no backlog: no progress to wait for");
        let none = analyze_queue(0, &[], &T);
        assert_eq!(none.read_held, None);
    }

    #[test]
    fn summary_counts_and_percentiles() {
        let q = analyze_queue(0, &[s(900, 1, 2), s(1200, 1, 2), s(5200, 2, 2)], &T);
        let c: Vec<_> = (0..4)
            .map(|i| {
                let t = CycleTimes {
                    s_returned: T.s_issued + (i + 1) * 1_000_000,
                    ..T
                };
                cycle_json(i as u32, 7, &t, std::slice::from_ref(&q), true)
            })
            .collect();
        let sum = summary_json(7, &c, 5, Some(100.0), true, "done");
        assert_eq!(sum["cycles"], 4);
        assert_eq!(sum["suspend_ms"]["p50"].as_f64(), Some(2.0));
        assert_eq!(sum["suspend_ms"]["max"].as_f64(), Some(4.0));
        assert_eq!(sum["cycles_with_progress_while_held"], 0);
        assert_eq!(sum["emulated"], true);
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(pct(&mut v, 0.99), Some(3.0));
        assert_eq!(pct(&mut [], 0.5), None);
    }
}
