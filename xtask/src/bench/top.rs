//! `top` cost: CPU and peak RSS of `top-load` (model + render at 10 Hz) per host size.

use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

use super::{build_release, machine, release_bin};

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
pub(super) fn top(seconds: f64) -> Result<()> {
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
