//! Launch hints against the sampling trigger (emulated GPU): the controller with hints off and
//! on, at two sampling periods.

use anyhow::{bail, Context as _, Result};

use super::{build_release, in_sim, machine, pct, release_bin};
use crate::root;

/// Launch hints against the sampling trigger (emulated GPU): the controller with hints off and
/// on, sampling every 1 ms and every 10 ms. An observer (`trace --launches`, in every scenario)
/// marks when each online request began, so "first launch -> offline queue off the GPU" is
/// measured the same way whatever triggered the suspend.
pub(super) fn hints(seconds: u32) -> Result<()> {
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
