//! Launch hints: what a launch uprobe adds to every call of a launch entry point.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    machine, median, release_bin,
    tracer::{lines, stop, wait_line, Running},
};

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

pub(super) fn launch(repeat: usize) -> Result<()> {
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
