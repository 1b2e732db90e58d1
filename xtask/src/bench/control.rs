//! The controller on the emulated GPU: the online / offline scenario without and with a policy,
//! side by side, and the decision latency.

use anyhow::{bail, Context as _, Result};

use super::{build_release, in_sim, machine, pct, release_bin};
use crate::root;

/// Decision latency goal for the software path (trigger sample -> SUSPEND ioctl issued), p99.
const DECISION_P99_GOAL_US: f64 = 50.0;

/// The controller on the emulated GPU: the seeds' scenario (online ResNet-18 batch 1 at 20 req/s,
/// offline ResNet-50 batch 1024) without and then with `run --policy
/// examples/resnet-online-offline.toml`, in one emulator, side by side.
pub(super) fn control(seconds: u32) -> Result<()> {
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
