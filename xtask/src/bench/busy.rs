//! Start on a busy host, emulated: N processes with Q queues each run before `run` starts (no
//! journal); the time until `run` has acted on every offline process, at its first start and
//! after `kill -9` and an immediate restart, side by side for the host's sizes
//! (`scripts/busy-start-sim.sh` does the run; this prints its summaries).

use anyhow::{bail, Context as _, Result};

use super::{build_release, in_sim, machine, release_bin};
use crate::root;

/// The goal on the emulator: every offline process of 50 processes / 1,000 queues acted on
/// within this long of `run`'s start.
const GOAL_MS: f64 = 1000.0;

pub(super) fn busy_start() -> Result<()> {
    build_release(&["--bins"])?;
    let gp = release_bin("gpreempt-ebpf");
    let script = root().join("scripts/busy-start-sim.sh");
    println!("{}", machine());
    println!("run started into a busy emulated host (release build; all figures emulated):");
    println!(
        "{:>6} {:>7} {:>10} {:>14} {:>14}   (ms from `run`'s exec to its last first act)",
        "procs", "queues", "offline", "first start", "kill-9 restart"
    );
    for (n, q, pace) in [(10, 10, ""), (50, 20, "1"), (50, 20, "")] {
        let dir = std::env::temp_dir().join(format!(
            "gpreempt-bench-busy-{}-{n}-{q}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let cmd = format!(
            "OUT={} N={n} Q={q} PACE={pace} LIMIT=120 sh {}",
            dir.display(),
            script.display()
        );
        let status = in_sim(&gp, &cmd)?;
        if !status.success() {
            bail!(
                "the busy-start scenario failed ({status}); see {}",
                dir.display()
            );
        }
        let p = dir.join("summary.json");
        let s: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
        )?;
        let ms = |k: &str| s[k].as_f64();
        let show = |v: Option<f64>| v.map_or("NEVER".to_string(), |v| format!("{v:.0}"));
        let first = ms("first_start_all_acted_ms");
        println!(
            "{n:>6} {:>7} {:>10} {:>14} {:>14}{}",
            n * q,
            format!(
                "{}{}",
                s["offline"],
                if pace.is_empty() { "" } else { " paced" }
            ),
            show(first),
            show(ms("restart_all_acted_ms")),
            match first {
                Some(v) if n * q >= 1000 => format!(
                    "   goal {GOAL_MS:.0} ms: {}",
                    if v <= GOAL_MS { "met" } else { "MISSED" }
                ),
                _ => String::new(),
            }
        );
    }
    Ok(())
}
