//! `sim launch-bench` (hidden): the per-call cost of a launch entry point, to measure what launch
//! uprobes add to every kernel launch.
//!
//! It calls the emulator's exported `hipLaunchKernel` with null `args`/`stream` (its immediate
//! error return, so one call costs a few ns without probes) in a tight loop and prints ns per
//! call for each round as a JSON line. A harness runs it once without probes and once with them
//! attached to this pid (`--ready-file` holds the first round until it has attached) and compares
//! the two side by side.

use std::ffi::c_void;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::workload::{hipLaunchKernel, Dim3};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Calls per round (at least 1).
    pub calls: u64,
    /// Rounds, one JSON line each.
    pub rounds: u32,
    /// Written before the first round, which waits until something deletes it.
    pub ready_file: Option<PathBuf>,
    /// Sleep between rounds.
    pub pause: Duration,
}

/// How long a ready file may stay before the bench gives up on its harness.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const READY_POLL: Duration = Duration::from_millis(10);

type LaunchFn =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, *mut c_void) -> i32;

/// Runs the bench, writing one `{"round":i,"calls":N,"ns_per_call":x}` line per round to `out`.
pub fn run(opts: &BenchOptions, out: &mut impl Write) -> Result<()> {
    anyhow::ensure!(opts.calls >= 1, "--calls must be at least 1");
    if let Some(f) = &opts.ready_file {
        wait_ready(f, READY_TIMEOUT)?;
    }
    for round in 0..opts.rounds {
        if round > 0 && !opts.pause.is_zero() {
            std::thread::sleep(opts.pause);
        }
        let ns = measure_round(opts.calls);
        writeln!(
            out,
            r#"{{"round":{round},"calls":{},"ns_per_call":{ns:.3}}}"#,
            opts.calls
        )
        .context("writing a result line")?;
        out.flush().context("writing a result line")?;
    }
    Ok(())
}

/// Mean ns per `hipLaunchKernel` call over `calls` calls (0 for no calls).
pub fn measure_round(calls: u64) -> f64 {
    // Through an opaque pointer: the optimizer can neither drop nor specialize the calls, so each
    // one enters the exported function where the uprobe sits.
    let launch: LaunchFn = std::hint::black_box(hipLaunchKernel);
    let dim = Dim3 { x: 1, y: 1, z: 1 };
    let t0 = Instant::now();
    for i in 0..calls {
        // SAFETY: null `args` and `stream` take hipLaunchKernel's documented early return
        // (hipErrorInvalidValue) before anything is dereferenced.
        let rc = unsafe {
            launch(
                std::hint::black_box(i as *const c_void),
                dim,
                dim,
                std::hint::black_box(std::ptr::null_mut()),
                0,
                std::hint::black_box(std::ptr::null_mut()),
            )
        };
        std::hint::black_box(rc);
    }
    if calls == 0 {
        return 0.0;
    }
    t0.elapsed().as_nanos() as f64 / calls as f64
}

/// Writes `path` (with this pid) and waits until it is deleted: the harness's signal that its
/// probes are attached.
fn wait_ready(path: &Path, timeout: Duration) -> Result<()> {
    // Written aside and renamed: a harness polling for the file never reads it half-written.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()))?;
    let start = Instant::now();
    while path.exists() {
        anyhow::ensure!(
            start.elapsed() < timeout,
            "{} was not deleted within {timeout:?}",
            path.display()
        );
        std::thread::sleep(READY_POLL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_measures_calls() {
        assert_eq!(measure_round(0), 0.0);
        let ns = measure_round(10_000);
        // An early-return call: well under a millisecond each, even unoptimized.
        assert!(ns.is_finite() && ns > 0.0 && ns < 1e6, "{ns}");
    }

    #[test]
    fn prints_one_line_per_round() {
        let mut out = Vec::new();
        let opts = BenchOptions {
            calls: 100,
            rounds: 3,
            ready_file: None,
            pause: Duration::from_millis(1),
        };
        run(&opts, &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["round"], i);
            assert_eq!(l["calls"], 100);
            assert!(l["ns_per_call"].as_f64().unwrap() > 0.0);
        }
        assert!(run(&BenchOptions { calls: 0, ..opts }, &mut Vec::new()).is_err());
    }

    #[test]
    fn ready_file_handshake() {
        let f = std::env::temp_dir().join(format!("gpreempt-launchbench-{}", std::process::id()));
        let _ = std::fs::remove_file(&f);
        let harness = {
            let f = f.clone();
            std::thread::spawn(move || {
                while !f.exists() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let pid = std::fs::read_to_string(&f).unwrap();
                std::fs::remove_file(&f).unwrap();
                pid
            })
        };
        wait_ready(&f, Duration::from_secs(10)).unwrap();
        assert_eq!(
            harness.join().unwrap().trim(),
            std::process::id().to_string()
        );
        // Nobody deletes it: the wait gives up.
        let err = wait_ready(&f, Duration::from_millis(30)).unwrap_err();
        assert!(err.to_string().contains("not deleted"), "{err}");
        std::fs::remove_file(&f).unwrap();
    }
}
