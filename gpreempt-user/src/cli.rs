//! Command line: `gpreempt-ebpf <command>`.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    observe::events::{Event, EventSource, FdCheck},
    observe::probe::{ProbeOptions, Probes},
    trace::{Format, Sink},
};

#[derive(Parser, Debug)]
#[command(
    name = "gpreempt-ebpf",
    version,
    about = "Watch and preempt AMD GPU compute queues (amdkfd) with eBPF"
)]
pub struct Cli {
    /// The KFD device node (ioctls on other files are not KFD ioctls).
    #[arg(
        long,
        global = true,
        env = "GPREEMPT_KFD_DEVICE",
        default_value = "/dev/kfd"
    )]
    pub kfd_device: PathBuf,
    /// More diagnostics on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Live view of every GPU compute queue: processes, queues, HQD slots, state, activity.
    Top(TopArgs),
    /// The PID -> queue -> HQD map once, as a table or JSON.
    Queues(QueuesArgs),
    /// Print KFD events (queue create/destroy/update, debug-trap calls, process exits) live.
    Trace(TraceArgs),
    /// Run an emulated AMD GPU (KFD) and commands against it (default: the demo).
    Sim(SimArgs),
    /// The controller: classify processes by a policy and suspend offline queues while online
    /// work runs.
    Run(RunArgs),
    /// Suspend a process's queues (held until Ctrl-C, `resume`, --for or --max-suspend).
    Suspend(SuspendArgs),
    /// Resume a process's queues.
    Resume(ResumeArgs),
    /// Is this host ready, and what to change if not.
    Doctor(DoctorArgs),
    /// Resumes NVIDIA channels a dead controller paused (started by the controller).
    #[command(hide = true)]
    NvGuardian(crate::nv::guardian::Args),
    /// NVIDIA pause/resume cycles of a process started after it (GPU experiment kit).
    #[command(hide = true)]
    NvPauseTest(crate::nv::pausetest::Args),
    /// A CUDA process of our own that the controller pauses and resumes at start (self-test).
    #[command(hide = true)]
    NvSelftestTarget(crate::nv::selftest::TargetArgs),
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// One JSON document: {"checks": [{name, verdict, finding, fix}], "ok", "warn", "fail"}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The policy file (TOML; see examples/ and README).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// Decide and log, act on nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Append every decision and its outcome here, as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// How often the policy decides (ms).
    #[arg(long, default_value_t = 1, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub tick: u64,
    /// How often the queues' dispatch ids are read (ms): how fast online work is noticed.
    #[arg(long, default_value_t = 1, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sample_interval: u64,
    /// How often to reconcile with sysfs and /proc (ms).
    #[arg(long, default_value_t = 500, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub reconcile_interval: u64,
    /// How often to read debugfs `hqds` (ms).
    #[arg(long, default_value_t = 2000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub hqd_interval: u64,
}

#[derive(Args, Debug)]
pub struct SuspendArgs {
    /// The process (host pid).
    #[arg(long)]
    pub pid: u32,
    /// Only these queue ids (repeatable; default: every queue, including new ones).
    #[arg(long)]
    pub queue: Vec<u32>,
    /// Preemption grace period in the kernel's units (1K GPU clocks; default: the kernel's).
    #[arg(long)]
    pub grace: Option<u32>,
    /// Resume after this long (e.g. 500ms, 30s, 5m).
    #[arg(long = "for", value_name = "DURATION")]
    pub for_: Option<crate::cmd::manual::DurationArg>,
    /// The watchdog: nothing stays suspended longer than this.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub max_suspend: crate::cmd::manual::DurationArg,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The process (host pid).
    #[arg(long)]
    pub pid: u32,
    /// Only these queue ids (repeatable; default: all).
    #[arg(long)]
    pub queue: Vec<u32>,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub action: Option<SimAction>,
    /// Number of emulated GPUs.
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// GPU model: mi210 (104 CUs, gfx90a) or mi300x (304 CUs, gfx942).
    #[arg(long, default_value = "mi210")]
    pub model: gpreempt_sim::spec::Model,
    /// Seed for everything the emulator derives (gpu_ids); runs with one seed are reproducible.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Command to run inside, after `--` (default: an online and an offline workload, watched).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum SimAction {
    /// An emulated GPU job replaying a measured kernel timeline (run it inside `sim`).
    Workload(WorkloadArgs),
    /// Per-call cost of the emulator's `hipLaunchKernel`, for measuring launch uprobes' cost.
    #[command(hide = true)]
    LaunchBench(LaunchBenchArgs),
}

#[derive(Args, Debug)]
pub struct LaunchBenchArgs {
    /// Calls per round.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub calls: u64,
    /// Rounds (one JSON line each).
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Write this file, then wait until it is deleted before the first round (max 30 s).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Sleep between rounds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub pause_ms: u64,
}

#[derive(Args, Debug)]
pub struct WorkloadArgs {
    /// Timeline: resnet18_b1, resnet50_b8, resnet50_b1024, transformer_b8_s128,
    /// seed_model_a_mlp_b32, seed_model_b_mlp_train_b64.
    #[arg(long)]
    pub profile: String,
    /// Online: requests per second (latency is reported).
    #[arg(long, conflicts_with = "offline", required_unless_present = "offline")]
    pub rate: Option<f64>,
    /// Offline: iterations back to back (throughput is reported).
    #[arg(long)]
    pub offline: bool,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// KFD queue priority (0..15; ROCr's normal priority is 7).
    #[arg(long, default_value_t = 7)]
    pub priority: u32,
    /// GPU index in topology order.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Create a second (idle) queue after this many seconds, as a runtime adding a stream.
    #[arg(long, value_name = "SECONDS")]
    pub second_queue_after: Option<f64>,
    /// Write the JSON report here instead of stdout.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Screen refresh interval in milliseconds.
    #[arg(long, default_value_t = 100, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub interval: u64,
    /// How often to read debugfs `hqds` for HQD slots (ms; not free on real GPUs).
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub hqd_interval: u64,
    /// How often to read the queues' dispatch ids (ms; one syscall per process).
    #[arg(long, default_value_t = 500, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub sample_interval: u64,
    /// How often to reconcile with sysfs and /proc (ms).
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub reconcile_interval: u64,
}

#[derive(Args, Debug)]
pub struct QueuesArgs {
    /// One JSON document (schema in README).
    #[arg(long)]
    pub json: bool,
    /// Time between the two reads of dispatch ids that give dispatch rates (ms).
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub sample_gap: u64,
}

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// JSON Lines, one object per event (schema in README).
    #[arg(long)]
    pub json: bool,
    /// Only this process (thread group id; filtered in the kernel).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only processes whose command name (comm) is this.
    #[arg(long)]
    pub comm: Option<String>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Write events to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Show the eBPF programs' own diagnostics (aya-log) on stderr.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Launch hints: uprobes on the HIP/HSA launch entry points of every KFD process seen (or
    /// only of --pid).
    #[arg(long)]
    pub launches: bool,
    /// At most one launch hint per process per this many ms (0: every launch).
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    pub launch_gap: f64,
    /// Only the ioctl tracepoints: no kprobes / fentry on amdkfd.
    #[arg(long)]
    pub no_kernel_probes: bool,
}

pub fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    let ebpf_log = matches!(&cli.command, Command::Trace(t) if t.ebpf_log);
    env_logger::Builder::new()
        .filter_level(if ebpf_log {
            log::LevelFilter::Debug
        } else {
            level
        })
        // -vv: timestamps, to line debug output up with other tools' clocks.
        .format_timestamp((cli.verbose >= 2).then_some(env_logger::TimestampPrecision::Micros))
        .target(env_logger::Target::Stderr)
        .init();
    if matches!(
        cli.command,
        Command::Run(_) | Command::Suspend(_) | Command::Resume(_) | Command::Top(_)
    ) {
        // The control thread takes its tracees' stops from a signalfd: SIGCHLD must be blocked
        // in every thread, so before the runtime starts any.
        crate::kfd::control::block_sigchld()?;
    }
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")
    };
    match cli.command {
        Command::Sim(SimArgs {
            action: Some(SimAction::LaunchBench(ref a)),
            ..
        }) => {
            let opts = gpreempt_sim::launchbench::BenchOptions {
                calls: a.calls,
                rounds: a.rounds,
                ready_file: a.ready_file.clone(),
                pause: Duration::from_millis(a.pause_ms),
            };
            gpreempt_sim::launchbench::run(&opts, &mut std::io::stdout().lock())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sim(ref args) => crate::cmd::sim::main(&cli, args),
        Command::Queues(ref args) => queues(args),
        Command::Top(ref args) => rt()?.block_on(crate::cmd::top::main(&cli, args)),
        Command::Trace(ref args) => rt()?.block_on(trace(&cli, args)),
        Command::Run(ref args) => rt()?.block_on(crate::cmd::run::main(&cli, args)),
        Command::Suspend(ref args) => rt()?.block_on(crate::cmd::manual::suspend(&cli, args)),
        Command::Resume(ref args) => rt()?.block_on(crate::cmd::manual::resume(&cli, args)),
        Command::Doctor(ref args) => crate::doctor::main(&cli, args),
        Command::NvGuardian(ref args) => crate::nv::guardian::main(args),
        Command::NvPauseTest(ref args) => rt()?.block_on(crate::nv::pausetest::main(args)),
        Command::NvSelftestTarget(ref args) => crate::nv::selftest::target_main(args),
    }
}

fn queues(args: &QueuesArgs) -> Result<ExitCode> {
    let (state, warnings) = crate::observe::watch::Watcher::snapshot(
        &crate::kfd::Paths::default(),
        Duration::from_millis(args.sample_gap),
    )?;
    let text = if args.json {
        crate::cmd::queues::to_json(&state, &warnings).context("serialising the map")? + "\n"
    } else {
        crate::cmd::queues::to_table(&state, &warnings)
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        return write_failed(e);
    }
    Ok(ExitCode::SUCCESS)
}

async fn trace(cli: &Cli, args: &TraceArgs) -> Result<ExitCode> {
    if let Some(d) = args.duration {
        anyhow::ensure!(
            d.is_finite() && d > 0.0,
            "--duration must be a positive number of seconds"
        );
    }
    let out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let mut sink = Sink::new(
        out,
        if args.json {
            Format::Json
        } else {
            Format::Text
        },
    );

    anyhow::ensure!(
        args.launch_gap.is_finite() && args.launch_gap >= 0.0,
        "--launch-gap must be a number of milliseconds >= 0"
    );
    let mut probes = Probes::attach(&ProbeOptions {
        pid: args.pid,
        ebpf_log: args.ebpf_log,
        no_kernel_probes: args.no_kernel_probes,
        launch_gap_ns: (args.launch_gap * 1e6) as u64,
    })?;
    let mut source = EventSource::new(probes.take_events()?, FdCheck::new(&cli.kfd_device))
        .context("watching the ring buffer")?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = tokio::time::sleep(
        args.duration
            .map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(u64::MAX / 4)),
    );
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut launches = args.launches.then(LaunchWatch::default);
    if let Some(l) = launches.as_mut() {
        let pids: Vec<u32> = match args.pid {
            Some(p) => vec![p],
            None => crate::kfd::sysfs::read_procs(&crate::kfd::Paths::default().sysfs, |_, _| None)
                .map(|s| s.procs.iter().map(|p| p.pid).collect())
                .unwrap_or_default(),
        };
        for pid in pids {
            l.watch(&mut probes, pid);
        }
    }
    eprintln!(
        "gpreempt-ebpf: {}",
        crate::observe::probe::summarize(probes.sources())
    );
    for why in crate::observe::probe::not_live_reasons(probes.sources()) {
        eprintln!("gpreempt-ebpf: {why}");
    }
    // Tests and scripts wait for this line before they start the workload.
    eprintln!(
        "gpreempt-ebpf: tracing KFD ioctls on {}{} (Ctrl-C to stop)",
        cli.kfd_device.display(),
        args.pid.map(|p| format!(" of pid {p}")).unwrap_or_default()
    );
    let mut batch: Vec<Event> = Vec::with_capacity(256);
    let mut reported_lost = 0;
    let mut written = 0u64;
    loop {
        tokio::select! {
            r = source.next_batch(&mut batch) => {
                r.context("reading the ring buffer")?;
                if let Some(l) = launches.as_mut() {
                    l.follow(&mut probes, &batch);
                }
                if let Err(e) = emit(&batch, args, &mut sink, &mut written) {
                    return write_failed(e);
                }
            }
            _ = tick.tick() => {
                probes.flush_log();
                let lost = probes.stats()?.lost();
                if lost > reported_lost {
                    log::warn!("{} KFD records lost in the kernel so far (ring buffer or in-flight map full)", lost);
                    reported_lost = lost;
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut deadline => break,
        }
    }
    // Drain what is already in the ring buffer without waiting for more.
    while let Ok(Ok(())) =
        tokio::time::timeout(Duration::from_millis(20), source.next_batch(&mut batch)).await
    {
        if batch.is_empty() {
            break;
        }
        if emit(&batch, args, &mut sink, &mut written).is_err() {
            break;
        }
    }
    probes.flush_log();
    let k = probes.stats()?;
    let u = source.stats;
    eprintln!(
        "gpreempt-ebpf: summary: written={written} seen={} lost_ringbuf_full={} lost_inflight_full={} \
         args_unreadable={} not_kfd={} unverified={} malformed={} kernel_probe_hits={} \
         launches_seen={} launch_hints={}",
        k.seen,
        k.ringbuf_full,
        k.inflight_full,
        k.args_fault,
        u.not_kfd,
        u.unverified,
        u.malformed,
        k.kernel_seen,
        k.launch_seen,
        k.launch_emitted
    );
    Ok(ExitCode::SUCCESS)
}

/// `trace --launches`: launch uprobes on every KFD process as it shows up, off at its exit.
#[derive(Default)]
struct LaunchWatch {
    resolver: crate::observe::launch::LaunchResolver,
    tried: std::collections::HashSet<u32>,
}

impl LaunchWatch {
    fn watch(&mut self, probes: &mut Probes, pid: u32) {
        if !self.tried.insert(pid) || pid == std::process::id() {
            return;
        }
        let targets = match self.resolver.resolve(pid) {
            Ok(t) => t,
            Err(e) => return log::debug!("pid {pid}: launch points: {e:#}"),
        };
        if targets.is_empty() {
            return log::info!("pid {pid}: no HIP/HSA launch entry point mapped");
        }
        match probes.watch_launches(pid, &targets) {
            Ok(n) => eprintln!("gpreempt-ebpf: pid {pid}: launch hints from {n} entry point(s)"),
            Err(e) => eprintln!("gpreempt-ebpf: pid {pid}: no launch hints: {e:#}"),
        }
    }

    fn follow(&mut self, probes: &mut Probes, batch: &[Event]) {
        for ev in batch {
            match ev {
                Event::Ioctl(i) => self.watch(probes, i.origin.pid),
                Event::Nv(n) => self.watch(probes, n.origin.pid),
                Event::ProcessExit(p) => {
                    probes.unwatch_launches(p.origin.pid);
                    self.tried.remove(&p.origin.pid);
                }
                _ => {}
            }
        }
    }
}

/// Writes the wanted events of a batch and flushes, counting what was written.
fn emit<W: Write>(
    batch: &[Event],
    args: &TraceArgs,
    sink: &mut Sink<W>,
    written: &mut u64,
) -> std::io::Result<()> {
    for ev in batch.iter().filter(|e| wanted(e, args)) {
        sink.write(ev)?;
        *written += 1;
    }
    sink.flush()
}

/// The user-space filters of `trace` (the pid filter runs in the kernel).
fn wanted(ev: &Event, args: &TraceArgs) -> bool {
    let comm = &ev.origin().comm;
    args.comm.as_ref().is_none_or(|c| c == comm)
}

/// A closed stdout (e.g. `| head`) ends tracing quietly; other write errors are reported.
fn write_failed(e: std::io::Error) -> Result<ExitCode> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(ExitCode::SUCCESS);
    }
    Err(e).context("writing events")
}
