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
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{root, run as run_cmd};

mod busy;
mod control;
mod hints;
mod launch;
mod matrix;
mod ring;
mod top;
mod tracer;

use self::{
    control::control,
    hints::hints,
    launch::launch,
    ring::throughput,
    top::top,
    tracer::{poke, start, stop, Tracer, KINDS},
};

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
    /// Run only the busy-host start-up benchmark: `run` started into 50 emulated processes with
    /// 1,000 queues (and smaller hosts), first start and `kill -9` restart.
    #[arg(long)]
    pub busy_start: bool,
    /// Run only the launch-uprobe cost benchmark.
    #[arg(long)]
    pub launch_only: bool,
    /// Run only the per-ioctl cost table (no throughput, launch, control or top parts).
    #[arg(long)]
    pub ioctl_only: bool,
    /// The emulated scenario matrix only: online x offline profiles, columns alone / offline
    /// alone / co-located / each policy in examples/matrix/ (root).
    #[arg(long)]
    pub matrix: bool,
    /// Matrix: rounds (each one emulator session).
    #[arg(long, default_value_t = 3)]
    pub matrix_rounds: u32,
    /// Matrix: seconds per measurement.
    #[arg(long, default_value_t = 8)]
    pub matrix_seconds: u32,
    /// Matrix: only the cells whose name (e.g. "resnet18_b1@20:resnet50_b1024") contains this.
    #[arg(long)]
    pub pairs: Option<String>,
}

/// `cargo build --release ARGS`, with the emulator (the benches run `sim`).
fn build_release(args: &[&str]) -> Result<()> {
    run_cmd(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release"])
            .args(crate::SIM)
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
    if args.busy_start {
        return busy::busy_start();
    }
    if args.matrix {
        return matrix::matrix(&matrix::Matrix {
            seconds: args.matrix_seconds,
            rounds: args.matrix_rounds,
            only: args.pairs.clone(),
        });
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
                // KFD ioctls on a file that is no GPU device (the flood of a local user).
                let (file, kind) = match *kind {
                    "kfd_on_null" => (Path::new("/dev/null"), "kfd"),
                    k => (dev.as_path(), k),
                };
                samples[ti][ki].push(poke(t, file, n, kind)?);
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
        "{:<24} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "tracer",
        "KFD ioctl",
        "x untraced",
        "non-KFD",
        "x untraced",
        "'K' non-KFD",
        "x untraced",
        "KFD on null",
        "x untraced"
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
        "non-KFD ioctls under gpreempt-ebpf: {:+.1}% ('K' outside the KFD range: {:+.1}%; \
         KFD ioctls on /dev/null, looked up and dropped in the kernel: {:+.0} ns, bpftrace's \
         type-byte filter {:+.0} ns)",
        (cell[1][1] / cell[0][1] - 1.0) * 100.0,
        (cell[1][2] / cell[0][2] - 1.0) * 100.0,
        added(1, 3),
        added(2, 3)
    );
    if args.ioctl_only {
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }

    throughput(args.flood, &dev)?;
    launch(args.repeat)?;
    control(args.control_seconds)?;
    hints(args.control_seconds)?;
    let _ = std::fs::remove_file(dir.join("trace.out"));
    let _ = std::fs::remove_dir_all(&dir);
    top(args.top_seconds)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs a shell script inside the emulator (seed 3), with `$GP` naming the binary.
fn in_sim(gp: &Path, script: &str) -> Result<std::process::ExitStatus> {
    Command::new(gp)
        .args(["sim", "--seed", "3", "--", "sh", "-c", script])
        .env("GP", gp)
        .status()
        .context("running the emulator")
}
