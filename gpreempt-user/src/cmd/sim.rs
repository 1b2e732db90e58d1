//! `sim`: the emulated AMD GPU (gpreempt-sim) and its workloads, from the command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use gpreempt_sim::run::{ChildSpec, SimOptions};
use gpreempt_sim::workload::{Mode, WorkloadOptions};

use std::path::PathBuf;

use super::Global;

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
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
    /// Mount the emulated driver in this mount namespace, not a private one, so services started
    /// later (a systemd unit) see it too. The mounts outlive `sim`: only on a machine or
    /// container that is thrown away after (the systemd unit test's).
    #[arg(long, hide = true)]
    pub shared_mounts: bool,
    /// Command to run inside, after `--` (default: an online and an offline workload, watched).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum SimAction {
    /// An emulated GPU job replaying a measured kernel timeline (run it inside `sim`).
    Workload(WorkloadArgs),
    /// Per-call cost of the emulator's `hipLaunchKernel`, for measuring launch uprobes' cost.
    #[command(hide = true)]
    LaunchBench(LaunchBenchArgs),
}

#[derive(clap::Args, Debug)]
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

#[derive(clap::Args, Debug)]
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
    /// Idle queues to create at the start beside the working one (at most 126).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=126))]
    pub idle_queues: u32,
    /// Run this many seconds first, unmeasured (a controller's start-up), then `--duration`
    /// measured: one process throughout.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub warmup: f64,
    /// Never enable the KFD debug API (no RUNTIME_ENABLE), as ROCm runtimes before 5.7 (Debian
    /// 12's 5.2): the kernel then refuses to suspend its queues (`no_debug_api` in a policy).
    #[arg(long)]
    pub no_debug_api: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn main(g: &Global, args: &Args) -> Result<ExitCode> {
    match &args.action {
        Some(SimAction::Workload(w)) => return workload(g, w),
        Some(SimAction::LaunchBench(a)) => {
            let opts = gpreempt_sim::launchbench::BenchOptions {
                calls: a.calls,
                rounds: a.rounds,
                ready_file: a.ready_file.clone(),
                pause: Duration::from_millis(a.pause_ms),
            };
            gpreempt_sim::launchbench::run(&opts, &mut std::io::stdout().lock())?;
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let exe = exe.to_string_lossy().into_owned();
    let children = if args.command.is_empty() {
        demo(&exe)?
    } else {
        vec![ChildSpec {
            argv: args.command.clone(),
            foreground: true,
            delay: Duration::ZERO,
        }]
    };
    let opts = SimOptions {
        gpus: args.gpus,
        model: args.model,
        seed: args.seed,
        shared_mounts: args.shared_mounts,
    };
    let code = gpreempt_sim::run::run(&opts, children)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The policy the demo's controller runs (the repository's example for this scenario).
const DEMO_POLICY: &str = include_str!("../../../examples/resnet-online-offline.toml");

/// The demo: the seeds' interference scenario (online ResNet-18 batch 1 at 20 req/s next to
/// offline ResNet-50 batch 1024) under the controller, watched live.
fn demo(exe: &str) -> Result<Vec<ChildSpec>> {
    let policy = std::env::temp_dir().join("gpreempt-ebpf-demo-policy.toml");
    std::fs::write(&policy, DEMO_POLICY)
        .with_context(|| format!("writing {}", policy.display()))?;
    // The workloads' own output would tear top's screen (and they end with the demo, killed,
    // before any report).
    let workload = |args: &[&str]| ChildSpec {
        argv: ["sh", "-c", "exec \"$0\" \"$@\" >/dev/null 2>&1", exe]
            .iter()
            .map(|x| x.to_string())
            .chain(
                ["sim", "workload", "--duration", "86400"]
                    .iter()
                    .chain(args)
                    .map(|x| x.to_string()),
            )
            .collect(),
        foreground: false,
        // `top` in the foreground attaches first, so the queues' creation is in its event log.
        delay: Duration::from_secs(2),
    };
    let controller = ChildSpec {
        argv: [
            "sh",
            "-c",
            "exec \"$0\" \"$@\" >/dev/null 2>&1",
            exe,
            "run",
            "--policy",
        ]
        .iter()
        .map(|x| x.to_string())
        .chain([policy.to_string_lossy().into_owned()])
        .collect(),
        foreground: false,
        delay: Duration::from_secs(1),
    };
    Ok(vec![
        controller,
        workload(&[
            "--profile",
            "resnet18_b1",
            "--rate",
            "20",
            "--priority",
            "15",
        ]),
        workload(&[
            "--profile",
            "resnet50_b1024",
            "--offline",
            "--priority",
            "0",
        ]),
        ChildSpec {
            argv: vec![exe.to_string(), "top".to_string()],
            foreground: true,
            delay: Duration::ZERO,
        },
    ])
}

fn workload(g: &Global, w: &WorkloadArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        w.duration.is_finite() && w.duration > 0.0,
        "--duration must be a positive number of seconds"
    );
    name_process(&w.profile);
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        for s in [libc::SIGINT, libc::SIGTERM] {
            libc::signal(s, on_stop as *const () as libc::sighandler_t);
        }
    }
    let opts = WorkloadOptions {
        profile: w.profile.clone(),
        mode: match w.rate {
            Some(rate) => Mode::Online { rate },
            None => Mode::Offline,
        },
        duration: Duration::from_secs_f64(w.duration),
        priority: w.priority,
        gpu: w.gpu,
        second_queue_after: w
            .second_queue_after
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        idle_queues: w.idle_queues,
        warmup: Duration::from_secs_f64(if w.warmup.is_finite() && w.warmup > 0.0 {
            w.warmup
        } else {
            0.0
        }),
        debug_api: !w.no_debug_api,
    };
    let report = gpreempt_sim::workload::run(&opts, &g.kfd_device, &STOP)?;
    let json = serde_json::to_string_pretty(&report)?;
    match &w.report {
        Some(p) => {
            std::fs::write(p, json + "\n").with_context(|| format!("writing {}", p.display()))?
        }
        None => println!("{json}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Names the workload after its profile (`comm`: `top`, `ps` and policy rules see it), cut to
/// the kernel's 15 bytes. Before any thread starts: threads inherit the name.
fn name_process(profile: &str) {
    let mut name = [0u8; 16];
    let n = profile.len().min(15);
    name[..n].copy_from_slice(&profile.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from `name`.
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) } != 0 {
        log::warn!(
            "naming the workload {profile}: {}",
            std::io::Error::last_os_error()
        );
    }
}
