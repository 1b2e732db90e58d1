//! `cargo xtask bench`: what tracing costs, measured side by side in one run on this machine.
//!
//! - Added cost per ioctl (KFD-encoded ioctl, non-KFD ioctl, 'K' ioctl outside the KFD range) with
//!   no tracer, `gpreempt-ebpf trace`, a bpftrace one-liner doing the same filtering, and
//!   `strace -e trace=ioctl`. Each cell is the median of several interleaved runs of `kfd-poke
//!   bench` (a tight ioctl loop on a stand-in file, where KFD ioctls fail with ENOTTY after the
//!   tracepoints ran).
//! - Ring-buffer throughput: one flooding producer per CPU under `gpreempt-ebpf trace`, with the
//!   delivered / lost accounting from the tracer's summary.
//! - `top`: CPU and memory of the model + render loop at 10 Hz (`top-load`: synthetic events, a
//!   160x48 screen drawn to a sink) for an empty host, 100 processes x 10 queues and 1,000 x 10,
//!   against the goal for 10,000 queues: under 2% of one core and 50 MB. `--top-only` runs just
//!   this part (no root needed).
use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{root, run as run_cmd};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// ioctls per measurement (strace gets a tenth: it is ~100x slower).
    #[arg(long, default_value_t = 200_000)]
    pub iterations: u64,
    /// Interleaved repetitions per cell (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// ioctls per producer in the throughput test.
    #[arg(long, default_value_t = 1_000_000)]
    pub flood: u64,
    /// Run only the `top` model + render benchmark.
    #[arg(long)]
    pub top_only: bool,
    /// Seconds per `top` scenario.
    #[arg(long, default_value_t = 10.0)]
    pub top_seconds: f64,
    /// Run only the controller benchmark (emulated GPU).
    #[arg(long)]
    pub control_only: bool,
    /// Seconds per controller scenario (without, then with the controller).
    #[arg(long, default_value_t = 30)]
    pub control_seconds: u32,
    /// Run only the launch-uprobe cost benchmark.
    #[arg(long)]
    pub launch_only: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tracer {
    None,
    Gpreempt,
    Bpftrace,
    Strace,
}

impl Tracer {
    fn label(self) -> &'static str {
        match self {
            Tracer::None => "no tracer",
            Tracer::Gpreempt => "gpreempt-ebpf trace",
            Tracer::Bpftrace => "bpftrace one-liner",
            Tracer::Strace => "strace -e trace=ioctl",
        }
    }
}

const KINDS: [&str; 3] = ["kfd", "other", "k_out_of_range"];

/// The same in-kernel filter as gpreempt-ebpf: type 'K', KFD nr ranges; duration at exit.
const BPFTRACE_PROG: &str = r#"
tracepoint:syscalls:sys_enter_ioctl
/ ((args->cmd >> 8) & 0xff) == 0x4b &&
  (((args->cmd & 0xff) >= 0x01 && (args->cmd & 0xff) < 0x29) ||
   ((args->cmd & 0xff) >= 0x80 && (args->cmd & 0xff) < 0x87)) /
{ @start[tid] = nsecs; @cmd[tid] = args->cmd; }
tracepoint:syscalls:sys_exit_ioctl
/ @start[tid] /
{ printf("%d %d %x %d %d\n", pid, tid, @cmd[tid], args->ret, nsecs - @start[tid]);
  delete(@start[tid]); delete(@cmd[tid]); }
"#;

/// `cargo build --release ARGS`.
fn build_release(args: &[&str]) -> Result<()> {
    run_cmd(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release"])
            .args(args),
    )
}

fn release_bin(name: &str) -> PathBuf {
    root().join("target/release").join(name)
}

fn ensure_tools() -> Result<()> {
    let missing: Vec<&str> = ["bpftrace", "strace"]
        .into_iter()
        .filter(|t| {
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {t}"))
                .output()
                .map(|o| !o.status.success())
                .unwrap_or(true)
        })
        .collect();
    if !missing.is_empty() {
        eprintln!("bench: installing {}", missing.join(" "));
        run_cmd(
            Command::new("apt-get")
                .args(["install", "-y", "-qq"])
                .args(&missing),
        )?;
    }
    Ok(())
}

/// A tracer process running in the background, ready.
struct Running {
    child: Option<Child>,
    stderr: Option<mpsc::Receiver<String>>,
}

/// Starts `tracer`; its output goes to `out` (a file for both eBPF tracers, for a fair comparison).
fn start(tracer: Tracer, dev: &Path, out: &Path) -> Result<Running> {
    match tracer {
        Tracer::None | Tracer::Strace => Ok(Running {
            child: None,
            stderr: None,
        }),
        Tracer::Gpreempt => {
            let mut child = Command::new(release_bin("gpreempt-ebpf"))
                .args(["trace", "--json", "--output"])
                .arg(out)
                .arg("--kfd-device")
                .arg(dev)
                .stderr(Stdio::piped())
                .spawn()
                .context("starting gpreempt-ebpf trace")?;
            let rx = lines(child.stderr.take().context("stderr")?);
            wait_line(&rx, "tracing KFD ioctls")?;
            Ok(Running {
                child: Some(child),
                stderr: Some(rx),
            })
        }
        Tracer::Bpftrace => {
            let _ = std::fs::remove_file(out);
            let mut child = Command::new("bpftrace")
                .arg("-o")
                .arg(out)
                .args(["-e", BPFTRACE_PROG])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting bpftrace")?;
            // bpftrace writes "Attaching N probes..." to its output once attached.
            let t = Instant::now();
            while !std::fs::read_to_string(out)
                .unwrap_or_default()
                .contains("Attaching")
            {
                if t.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("bpftrace did not attach within 60 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(200));
            Ok(Running {
                child: Some(child),
                stderr: None,
            })
        }
    }
}

/// A tracer left running would skew every later measurement: kill it on any early return.
impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Stops a tracer; returns its remaining output lines.
fn stop(mut r: Running) -> Result<Vec<String>> {
    let Some(mut child) = r.child.take() else {
        return Ok(Vec::new());
    };
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait()?;
    let mut out = Vec::new();
    if let Some(rx) = r.stderr.take() {
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
            out.push(l);
        }
    }
    Ok(out)
}

fn lines(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(l) if l.contains(needle) => return Ok(()),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("tracer exited before '{needle}'"),
        }
    }
    bail!("tracer did not print '{needle}' within 60 s")
}

/// Runs `kfd-poke DEV bench N KIND` (under strace if asked); returns ns per ioctl.
fn poke(tracer: Tracer, dev: &Path, n: u64, kind: &str) -> Result<f64> {
    let mut cmd = if tracer == Tracer::Strace {
        let mut c = Command::new("strace");
        c.args(["-f", "-qq", "-e", "trace=ioctl", "-o", "/dev/null"])
            .arg(release_bin("kfd-poke"));
        c
    } else {
        Command::new(release_bin("kfd-poke"))
    };
    let mut child = cmd
        .arg(dev)
        .args(["bench", &n.to_string(), kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting kfd-poke")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let out = BufReader::new(child.stdout.take().context("stdout")?);
    stdin.write_all(b"go\n")?;
    stdin.flush()?;
    let mut ns = None;
    for l in out.lines() {
        let l = l?;
        if let Some(v) = l.strip_prefix("ns_per_op ") {
            ns = Some(v.trim().parse::<f64>()?);
        }
        if l == "done" {
            break;
        }
    }
    drop(stdin);
    child.wait()?;
    ns.context("kfd-poke printed no ns_per_op")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `machine: CPU model, N CPUs, kernel K`.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "machine: {cpu}, {} CPUs, kernel {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.top_only {
        return top(args.top_seconds);
    }
    if args.control_only {
        control(args.control_seconds)?;
        return hints(args.control_seconds);
    }
    if args.launch_only {
        build_release(&["--bins"])?;
        return launch(args.repeat);
    }
    build_release(&["--bins"])?;
    ensure_tools()?;
    let dir = std::env::temp_dir().join(format!("gpreempt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let dev = dir.join("kfd");
    std::fs::write(&dev, b"")?;

    let tracers = [
        Tracer::None,
        Tracer::Gpreempt,
        Tracer::Bpftrace,
        Tracer::Strace,
    ];
    let mut samples = vec![vec![Vec::new(); KINDS.len()]; tracers.len()];
    for rep in 0..args.repeat {
        for (ti, &t) in tracers.iter().enumerate() {
            let running = start(t, &dev, &dir.join("trace.out"))?;
            for (ki, kind) in KINDS.iter().enumerate() {
                let n = if t == Tracer::Strace {
                    args.iterations / 10
                } else {
                    args.iterations
                };
                samples[ti][ki].push(poke(t, &dev, n, kind)?);
            }
            stop(running)?;
        }
        eprintln!("bench: round {}/{} done", rep + 1, args.repeat);
    }
    let cell: Vec<Vec<f64>> = samples
        .into_iter()
        .map(|k| k.into_iter().map(median).collect())
        .collect();

    println!(
        "\nioctl cost, ns per call (median of {} runs; {} calls each, strace {}):",
        args.repeat,
        args.iterations,
        args.iterations / 10
    );
    println!("{}", machine());
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "tracer", "KFD ioctl", "x untraced", "non-KFD", "x untraced", "'K' non-KFD", "x untraced"
    );
    for (ti, t) in tracers.iter().enumerate() {
        print!("{:<24}", t.label());
        for (ns, base) in cell[ti].iter().zip(&cell[0]) {
            print!(" {:>12.1} {:>12.3}", ns, ns / base);
        }
        println!();
    }
    let added = |ti: usize, ki: usize| cell[ti][ki] - cell[0][ki];
    println!(
        "added per KFD ioctl: gpreempt-ebpf {:.0} ns, bpftrace {:.0} ns (gpreempt/bpftrace = {:.2}), strace {:.0} ns",
        added(1, 0),
        added(2, 0),
        added(1, 0) / added(2, 0),
        added(3, 0)
    );
    println!(
        "non-KFD ioctls under gpreempt-ebpf: {:+.1}% ('K' outside the KFD range: {:+.1}%)",
        (cell[1][1] / cell[0][1] - 1.0) * 100.0,
        (cell[1][2] / cell[0][2] - 1.0) * 100.0
    );

    throughput(args.flood, &dev)?;
    launch(args.repeat)?;
    control(args.control_seconds)?;
    hints(args.control_seconds)?;
    let _ = std::fs::remove_file(dir.join("trace.out"));
    let _ = std::fs::remove_dir_all(&dir);
    top(args.top_seconds)
}

/// One producer per CPU floods KFD ioctls; the tracer's accounting must cover every one.
fn throughput(per_producer: u64, dev: &Path) -> Result<()> {
    let producers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let running = start(Tracer::Gpreempt, dev, Path::new("/dev/null"))?;
    let t = Instant::now();
    let handles: Vec<_> = (0..producers)
        .map(|_| {
            let dev = dev.to_path_buf();
            std::thread::spawn(move || poke(Tracer::None, &dev, per_producer, "kfd"))
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    }
    let wall = t.elapsed().as_secs_f64();
    // Let the consumer drain before stopping it.
    std::thread::sleep(Duration::from_millis(500));
    let out = stop(running)?;
    let summary = out
        .iter()
        .find(|l| l.contains("summary:"))
        .context("no summary from the tracer")?;
    let field = |k: &str| -> u64 {
        summary
            .split_whitespace()
            .find_map(|kv| {
                kv.strip_prefix(&format!("{k}="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    };
    let issued = per_producer * producers as u64;
    // Each producer's exit is one more written event.
    let written = field("written").saturating_sub(producers as u64);
    let lost = field("lost_ringbuf_full") + field("lost_inflight_full");
    println!(
        "\nring-buffer throughput: {producers} producers x {per_producer} KFD ioctls in {wall:.2} s = {:.2} M events/s offered",
        issued as f64 / wall / 1e6
    );
    println!(
        "delivered {written} ({:.2} M/s), lost and counted {lost}, unaccounted {}",
        written as f64 / wall / 1e6,
        issued as i64 - written as i64 - lost as i64
    );
    Ok(())
}

/// The `top` goal for 10,000 queues at 10 Hz: CPU, % of one core, and peak RSS, MB.
const TOP_CPU_GOAL_PCT: f64 = 2.0;
const TOP_RSS_GOAL_MB: f64 = 50.0;
const TOP_HZ: u32 = 10;

/// What `top-load` measured for one scenario.
struct TopRun {
    label: String,
    queues: u64,
    cpu_pct: f64,
    peak_rss_mb: f64,
    rss_after_build_mb: f64,
    model_mean_ms: f64,
    model_max_ms: f64,
    render_mean_ms: f64,
    render_max_ms: f64,
    late_ticks: u64,
}

impl TopRun {
    fn met(&self) -> bool {
        self.cpu_pct < TOP_CPU_GOAL_PCT && self.peak_rss_mb < TOP_RSS_GOAL_MB
    }
}

/// Runs `top-load` for `procs` x `per_proc` queues; parses its JSON line.
fn top_load(procs: u32, per_proc: u32, seconds: f64) -> Result<TopRun> {
    let out = Command::new(release_bin("top-load"))
        .args(["--procs", &procs.to_string()])
        .args(["--queues-per-proc", &per_proc.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args(["--hz", &TOP_HZ.to_string()])
        .args(["--gpus", "8"])
        .stderr(Stdio::inherit())
        .output()
        .context("running top-load")?;
    if !out.status.success() {
        bail!("top-load failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("top-load printed no JSON line")?;
    let v: serde_json::Value = serde_json::from_str(line).context("top-load's JSON line")?;
    let f = |k: &str| -> Result<f64> {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .with_context(|| format!("no {k} in top-load's output"))
    };
    let mb = |kb: f64| kb * 1024.0 / 1e6;
    let queues = u64::from(procs) * u64::from(per_proc);
    let label = if procs == 0 {
        "empty host".to_string()
    } else {
        format!("{procs} procs x {per_proc} = {queues} queues")
    };
    Ok(TopRun {
        label,
        queues,
        cpu_pct: f("cpu_pct_one_core")?,
        peak_rss_mb: mb(f("peak_rss_kb")?),
        rss_after_build_mb: mb(f("rss_after_build_kb")?),
        model_mean_ms: f("model_ms_mean")?,
        model_max_ms: f("model_ms_max")?,
        render_mean_ms: f("render_ms_mean")?,
        render_max_ms: f("render_ms_max")?,
        late_ticks: f("late_ticks")? as u64,
    })
}

/// The `top` model + render loop at 10 Hz under synthetic load, one scenario after the other.
fn top(seconds: f64) -> Result<()> {
    build_release(&["-p", "tests", "--bin", "top-load"])?;
    let scenarios = [(0u32, 10u32), (100, 10), (1000, 10)];
    let mut runs = Vec::new();
    for (procs, per_proc) in scenarios {
        eprintln!("bench: top-load {procs} x {per_proc} for {seconds} s");
        runs.push(top_load(procs, per_proc, seconds)?);
    }
    println!(
        "\ntop: model + render loop at {TOP_HZ} Hz, 8 GPUs, 160x48 screen to a sink, synthetic \
         events ({seconds} s per scenario; churn 1% of the queues per second, samples at 2 Hz, \
         hqds + sysfs reconcile at 1 Hz)"
    );
    println!("{}", machine());
    println!(
        "goal: under {TOP_CPU_GOAL_PCT}% of one core and {TOP_RSS_GOAL_MB} MB (ratios below 1 \
         meet it)"
    );
    println!(
        "{:<32} {:>7} {:>8} {:>9} {:>8} {:>10} {:>17} {:>17} {:>5} {:>8}",
        "scenario",
        "CPU %",
        "x goal",
        "peak MB",
        "x goal",
        "built MB",
        "model ms mean/max",
        "render ms mean/max",
        "late",
        "goals"
    );
    for r in &runs {
        println!(
            "{:<32} {:>7.2} {:>8.2} {:>9.1} {:>8.2} {:>10.1} {:>17} {:>17} {:>5} {:>8}",
            r.label,
            r.cpu_pct,
            r.cpu_pct / TOP_CPU_GOAL_PCT,
            r.peak_rss_mb,
            r.peak_rss_mb / TOP_RSS_GOAL_MB,
            r.rss_after_build_mb,
            format!("{:.3}/{:.2}", r.model_mean_ms, r.model_max_ms),
            format!("{:.3}/{:.2}", r.render_mean_ms, r.render_max_ms),
            r.late_ticks,
            if r.met() { "met" } else { "NOT met" }
        );
    }
    let base = &runs[0];
    if let Some(big) = runs.iter().max_by_key(|r| r.queues) {
        println!(
            "{}: {:.1}x the empty host's CPU, +{:.1} MB peak RSS",
            big.label,
            big.cpu_pct / base.cpu_pct,
            big.peak_rss_mb - base.peak_rss_mb
        );
        if big.met() {
            println!(
                "top goal for {} queues: met ({:.2}% < {TOP_CPU_GOAL_PCT}% of one core, {:.1} MB < {TOP_RSS_GOAL_MB} MB)",
                big.queues, big.cpu_pct, big.peak_rss_mb
            );
        } else {
            println!(
                "top goal for {} queues: NOT met ({:.2}% of one core, goal {TOP_CPU_GOAL_PCT}%; {:.1} MB, goal {TOP_RSS_GOAL_MB} MB)",
                big.queues, big.cpu_pct, big.peak_rss_mb
            );
        }
    }
    Ok(())
}

/// Decision latency goal for the software path (trigger sample -> SUSPEND ioctl issued), p99.
const DECISION_P99_GOAL_US: f64 = 50.0;

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The controller on the emulated GPU: the seeds' scenario (online ResNet-18 batch 1 at 20 req/s,
/// offline ResNet-50 batch 1024) without and then with `run --policy
/// examples/resnet-online-offline.toml`, in one emulator, side by side.
fn control(seconds: u32) -> Result<()> {
    build_release(&["--bins"])?;
    let dir = std::env::temp_dir().join(format!("gpreempt-bench-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let d = dir.display();
    let gp = release_bin("gpreempt-ebpf");
    let policy = root().join("examples/resnet-online-offline.toml");
    let online = "--profile resnet18_b1 --rate 20 --priority 15";
    let offline = "--profile resnet50_b1024 --offline --priority 0";
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload {online} --duration {seconds} --report {d}/on0.json 2>/dev/null & A=$!
$GP sim workload {offline} --duration {seconds} --report {d}/off0.json 2>/dev/null & B=$!
wait $A $B
$GP run --policy {policy} --audit {d}/audit.jsonl 2>{d}/run.err & R=$!
sleep 2
$GP sim workload {online} --duration {seconds} --report {d}/on1.json 2>/dev/null & A=$!
$GP sim workload {offline} --duration {seconds} --report {d}/off1.json 2>/dev/null & B=$!
wait $A $B
kill -INT $R; wait $R
"#,
        policy = policy.display()
    );
    eprintln!("bench: controller, {seconds} s without then {seconds} s with (emulated GPU)");
    let status = in_sim(&gp, &script)?;
    if !status.success() {
        bail!(
            "the controller scenario failed ({status}); see {}",
            dir.join("run.err").display()
        );
    }
    let json = |name: &str| -> Result<serde_json::Value> {
        let p = dir.join(name);
        let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(serde_json::from_str(&t)?)
    };
    let lat = |v: &serde_json::Value, k: &str| v["latency"][k].as_f64().unwrap_or(f64::NAN);
    let (on0, on1, off0, off1) = (
        json("on0.json")?,
        json("on1.json")?,
        json("off0.json")?,
        json("off1.json")?,
    );
    let audit = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap_or_default();
    let recs: Vec<serde_json::Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let suspends: Vec<&serde_json::Value> = recs
        .iter()
        .filter(|r| r["action"] == "suspend" && r["issued_ns"].is_u64())
        .collect();
    let us = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        let mut v: Vec<f64> = suspends.iter().filter_map(|r| f(r)).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let field = |r: &serde_json::Value, k: &str| r[k].as_f64();
    let decision = us(&|r| Some(field(r, "decision_latency_ns")? / 1e3));
    let decide_to_issue = us(&|r| Some((field(r, "issued_ns")? - field(r, "ts_ns")?) / 1e3));
    let ioctl = us(&|r| Some((field(r, "returned_ns")? - field(r, "issued_ns")?) / 1e3));
    let e2e = us(&|r| Some((field(r, "returned_ns")? - field(r, "trigger_ns")?) / 1e3));

    println!("\ncontroller (EMULATED GPU: gpreempt-sim MI210, seed 3; {seconds} s per column)");
    println!("{}", machine());
    println!(
        "{:<34} {:>16} {:>16} {:>8}",
        "", "no controller", "run --policy", "ratio"
    );
    for (label, k) in [
        ("online p50 ms", "p50_ms"),
        ("online p99 ms", "p99_ms"),
        ("online max ms", "max_ms"),
    ] {
        let (a, b) = (lat(&on0, k), lat(&on1, k));
        println!("{label:<34} {a:>16.2} {b:>16.2} {:>8.2}", b / a);
    }
    let (a, b) = (
        off0["items_per_s"].as_f64().unwrap_or(f64::NAN),
        off1["items_per_s"].as_f64().unwrap_or(f64::NAN),
    );
    println!(
        "{:<34} {a:>16.0} {b:>16.0} {:>8.2}",
        "offline items/s",
        b / a
    );
    println!(
        "\n{} suspends; latencies in us over them (p50 / p99 / max):",
        suspends.len()
    );
    for (label, v) in [
        ("trigger sample -> SUSPEND issued", &decision),
        ("decision -> SUSPEND issued", &decide_to_issue),
        ("SUSPEND ioctl (emulated preemption)", &ioctl),
        ("trigger -> queue off the GPU (emulated)", &e2e),
    ] {
        println!(
            "{label:<40} {:>9.1} / {:>9.1} / {:>9.1}",
            pct(v, 0.5),
            pct(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    let p99 = pct(&decision, 0.99);
    println!(
        "decision latency goal (software path, p99 < {DECISION_P99_GOAL_US} us): {} ({p99:.1} us, {:.2}x the goal)",
        if p99 < DECISION_P99_GOAL_US { "met" } else { "NOT met" },
        p99 / DECISION_P99_GOAL_US
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Launch hints: what a launch uprobe adds to every call of a launch entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaunchProbe {
    None,
    /// The default: a record for the first launch of a burst (1 ms gap), the rest only counted.
    RateLimited,
    /// `--launch-gap 0`: a ring-buffer record for every launch.
    EveryLaunch,
}

impl LaunchProbe {
    fn label(self) -> &'static str {
        match self {
            LaunchProbe::None => "no uprobe",
            LaunchProbe::RateLimited => "uprobe, rate-limited (default)",
            LaunchProbe::EveryLaunch => "uprobe, record per launch",
        }
    }
}

/// One `sim launch-bench` run (200k calls x 5 rounds), with `probe` attached by `trace --launches
/// --pid` before the first round; returns the median ns per call.
fn launch_once(probe: LaunchProbe, dir: &Path) -> Result<f64> {
    let gp = release_bin("gpreempt-ebpf");
    let ready = dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    let mut bench = Command::new(&gp)
        .args(["sim", "launch-bench", "--calls", "200000", "--rounds", "5"])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting sim launch-bench")?;
    let out = lines(bench.stdout.take().context("stdout")?);
    let t = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&ready)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break pid;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = bench.kill();
            bail!("launch-bench did not write its ready file");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let tracer = if probe == LaunchProbe::None {
        None
    } else {
        let gap = if probe == LaunchProbe::EveryLaunch {
            "0"
        } else {
            "1"
        };
        let mut child = Command::new(&gp)
            .args(["trace", "--launches", "--json", "--output", "/dev/null"])
            .args(["--pid", &pid.to_string(), "--launch-gap", gap])
            .stderr(Stdio::piped())
            .spawn()
            .context("starting gpreempt-ebpf trace --launches")?;
        let rx = lines(child.stderr.take().context("stderr")?);
        let r = Running {
            child: Some(child),
            stderr: Some(rx),
        };
        wait_line(r.stderr.as_ref().context("stderr")?, "launch hints from")?;
        Some(r)
    };
    std::fs::remove_file(&ready).context("releasing launch-bench")?;
    let status = bench.wait()?;
    if !status.success() {
        bail!("launch-bench failed: {status}");
    }
    if let Some(r) = tracer {
        stop(r)?;
    }
    let per_call: Vec<f64> = out
        .try_iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter_map(|v| v["ns_per_call"].as_f64())
        .collect();
    if per_call.is_empty() {
        bail!("launch-bench printed no rounds");
    }
    Ok(median(per_call))
}

fn launch(repeat: usize) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("gpreempt-bench-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let probes = [
        LaunchProbe::None,
        LaunchProbe::RateLimited,
        LaunchProbe::EveryLaunch,
    ];
    let mut cells: Vec<Vec<f64>> = vec![Vec::new(); probes.len()];
    for rep in 0..repeat.max(1) {
        for (i, &p) in probes.iter().enumerate() {
            cells[i].push(launch_once(p, &dir)?);
        }
        eprintln!("bench: launch round {}/{} done", rep + 1, repeat.max(1));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med: Vec<f64> = cells.into_iter().map(median).collect();
    println!();
    println!("Launch hints: cost per call of a launch entry point (hipLaunchKernel, 200k calls x 5 rounds, median of {} interleaved runs)", repeat.max(1));
    println!("{}", machine());
    println!("{:<34} {:>12} {:>12}", "", "ns/call", "added ns");
    for (p, m) in probes.iter().zip(&med) {
        println!("{:<34} {:>12.1} {:>12.1}", p.label(), m, m - med[0]);
    }
    Ok(())
}

/// Runs a shell script inside the emulator (seed 3), with `$GP` naming the binary.
fn in_sim(gp: &Path, script: &str) -> Result<std::process::ExitStatus> {
    Command::new(gp)
        .args(["sim", "--seed", "3", "--", "sh", "-c", script])
        .env("GP", gp)
        .status()
        .context("running the emulator")
}

/// Launch hints against the sampling trigger (emulated GPU): the controller with hints off and
/// on, sampling every 1 ms and every 10 ms. An observer (`trace --launches`, in every scenario)
/// marks when each online request began, so "first launch -> offline queue off the GPU" is
/// measured the same way whatever triggered the suspend.
fn hints(seconds: u32) -> Result<()> {
    build_release(&["--bins"])?;
    let dir = std::env::temp_dir().join(format!("gpreempt-bench-hints-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let d = dir.display();
    let gp = release_bin("gpreempt-ebpf");
    let base = std::fs::read_to_string(root().join("examples/resnet-online-offline.toml"))?;
    std::fs::write(dir.join("on.toml"), &base)?;
    std::fs::write(
        dir.join("off.toml"),
        base.replacen("[policy]", "[policy]\nlaunch_hints = false", 1),
    )?;
    let online = "--profile resnet18_b1 --rate 20 --priority 15";
    let offline = "--profile resnet50_b1024 --offline --priority 0";
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
for s in 1 10; do for mode in off on; do
  $GP run --policy {d}/$mode.toml --sample-interval $s --audit {d}/audit-$s-$mode.jsonl 2>{d}/run.err & R=$!
  sleep 2
  $GP sim workload {online} --duration {seconds} --report {d}/on-$s-$mode.json 2>/dev/null & A=$!
  $GP trace --launches --pid $A --json --output {d}/hints-$s-$mode.json 2>/dev/null & T=$!
  $GP sim workload {offline} --duration {seconds} --report {d}/off-$s-$mode.json 2>/dev/null & B=$!
  wait $A $B
  kill -INT $T $R; wait $T; wait $R
done; done
"#
    );
    eprintln!("bench: launch hints vs sampling, 4 x {seconds} s (emulated GPU)");
    let status = in_sim(&gp, &script)?;
    if !status.success() {
        bail!("the launch-hint scenario failed ({status}); see {d}/run.err");
    }
    let read = |name: &str| -> Result<Vec<serde_json::Value>> {
        let p = dir.join(name);
        let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(t.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    };
    let report = |name: &str| -> Result<serde_json::Value> {
        let p = dir.join(name);
        let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&t).with_context(|| format!("parsing {}", p.display()))
    };
    println!("\nlaunch hints vs the sampling trigger (EMULATED GPU: gpreempt-sim MI210, seed 3; {seconds} s per row)");
    println!("{}", machine());
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>22} {:>10}",
        "", "mean ms", "p99 ms", "offline/s", "launch->off p50/p90 us", "by hint"
    );
    for s in [1, 10] {
        for mode in ["off", "on"] {
            let on = report(&format!("on-{s}-{mode}.json"))?;
            let off = report(&format!("off-{s}-{mode}.json"))?;
            let pid = on["pid"].as_u64().unwrap_or(0);
            let hints: Vec<u64> = read(&format!("hints-{s}-{mode}.json"))?
                .iter()
                .filter(|h| h["pid"] == pid)
                .filter_map(|h| h["ts_ns"].as_u64())
                .collect();
            let audit = read(&format!("audit-{s}-{mode}.jsonl"))?;
            let suspends: Vec<(u64, u64)> = audit
                .iter()
                .filter(|a| a["action"] == "suspend")
                .filter(|a| a["done"].as_array().is_some_and(|d| !d.is_empty()))
                .filter_map(|a| Some((a["issued_ns"].as_u64()?, a["returned_ns"].as_u64()?)))
                .collect();
            let by_hint = audit
                .iter()
                .filter(|a| {
                    a["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("launch hint"))
                })
                .count();
            // A request begins at a hint with no hint in the 10 ms before it.
            let mut lead: Vec<f64> = hints
                .iter()
                .enumerate()
                .filter(|&(i, &b)| i == 0 || b - hints[i - 1] >= 10_000_000)
                .filter_map(|(_, &b)| {
                    let &(_, ret) = suspends
                        .iter()
                        .find(|&&(iss, _)| iss >= b && iss < b + 20_000_000)?;
                    Some((ret - b) as f64 / 1e3)
                })
                .collect();
            lead.sort_by(f64::total_cmp);
            let label = format!("sample {s} ms, hints {mode}");
            println!(
                "{label:<28} {:>9.2} {:>9.2} {:>9.0} {:>12.0} / {:>7.0} {:>6}/{}",
                on["latency"]["mean_ms"].as_f64().unwrap_or(f64::NAN),
                on["latency"]["p99_ms"].as_f64().unwrap_or(f64::NAN),
                off["items_per_s"].as_f64().unwrap_or(f64::NAN),
                pct(&lead, 0.5),
                pct(&lead, 0.9),
                by_hint,
                suspends.len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
