//! `cargo xtask test`'s runner. The test binaries are built once, then run in two lanes at the
//! same time: the kernel lane runs, one binary after another, every test that starts sims or
//! controllers (they share the run directory and the host's eBPF and KFD state), and the side
//! lane runs what does not: the crates' unit tests, the docs and layering checks and the image
//! test. The VM tier (QEMU with TCG) stays in the kernel lane: beside it its guest's own waits
//! ran out on a 2-vCPU machine. `cargo test --workspace` ran all of them one after
//! another; on a 2-vCPU machine the side lane's minutes now pass beside the kernel lane's.
//!
//! Each binary's output goes to target/test-logs/NAME.log and is printed whole when it ends, so
//! the two lanes never interleave; a summary with each binary's time closes the run.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, root};

/// Test binaries of the `tests` crate that start neither sims nor controllers, by file name
/// (tests/tests/NAME.rs); with every crate's unit tests they make the side lane. Any other
/// binary, a new one included, runs in the kernel lane: the safe default.
const SIDE: &[&str] = &[
    "packaging",
    "btf",
    "trace",
    "layers",
    "docs",
    "policy",
    "kfd_header",
];

/// What the tests crate's leftover check reads (tests/src/lib.rs `LANE_VAR`): a sim or a
/// workload counts as a test's leftover only in the lane that started it.
const LANE_VAR: &str = "GPREEMPT_TEST_LANE";

struct Bin {
    /// `crate::target` as shown.
    name: String,
    exe: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    dir: PathBuf,
    side: bool,
}

struct Outcome {
    name: String,
    ok: bool,
    secs: f64,
}

/// Builds every test binary of the workspace (but the eBPF crate) and lists them.
fn build() -> Result<Vec<Bin>> {
    let mut child = cargo()
        .args([
            "test",
            "--workspace",
            "--exclude",
            "gpreempt-ebpf",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test --no-run")?;
    let mut bins = Vec::new();
    let out = child.stdout.take().context("cargo's stdout")?;
    for line in BufReader::new(out).lines() {
        let line = line.context("reading cargo's messages")?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest)) = (v["executable"].as_str(), v["manifest_path"].as_str())
        else {
            continue;
        };
        let target = v["target"]["name"].as_str().unwrap_or("?");
        let dir = PathBuf::from(manifest)
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(root);
        let krate = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let integration = v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        bins.push(Bin {
            name: format!("{krate}::{target}"),
            exe: PathBuf::from(exe),
            dir,
            side: !integration || SIDE.contains(&target),
        });
    }
    let status = child.wait().context("waiting for cargo test --no-run")?;
    if !status.success() {
        bail!("building the tests failed: {status}");
    }
    Ok(bins)
}

/// Runs `bins` one after another; each one's log is printed when it ends.
fn lane(lane: &str, bins: &[&Bin], args: &[String], print: &Mutex<()>) -> Vec<Outcome> {
    let logs = root().join("target/test-logs");
    let _ = std::fs::create_dir_all(&logs);
    let mut done = Vec::new();
    for b in bins {
        let log = logs.join(format!("{}.log", b.name.replace("::", "-")));
        let start = Instant::now();
        let ok = std::fs::File::create(&log)
            .and_then(|f| {
                let err = f.try_clone()?;
                Command::new(&b.exe)
                    .args(args)
                    .current_dir(&b.dir)
                    .env(LANE_VAR, lane)
                    .stdout(f)
                    .stderr(err)
                    .status()
            })
            .map(|s| s.success())
            .unwrap_or(false);
        let secs = start.elapsed().as_secs_f64();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        {
            let _p = print.lock().unwrap_or_else(|e| e.into_inner());
            println!(
                "\n===== {} ({lane} lane, {secs:.1} s, {}) =====\n{text}",
                b.name,
                if ok { "ok" } else { "FAILED" }
            );
        }
        done.push(Outcome {
            name: b.name.clone(),
            ok,
            secs,
        });
    }
    done
}

/// Builds and runs every test, the two lanes side by side; fails when any binary failed.
pub fn test(args: &[String]) -> Result<()> {
    let bins = build()?;
    let mut kernel: Vec<&Bin> = bins.iter().filter(|b| !b.side).collect();
    let mut side: Vec<&Bin> = bins.iter().filter(|b| b.side).collect();
    // The longest first, so the side lane's long tests overlap the kernel lane's.
    let order = |b: &&Bin| {
        SIDE.iter()
            .position(|s| b.name.ends_with(&format!("::{s}")))
    };
    side.sort_by_key(|b| order(b).unwrap_or(SIDE.len()));
    kernel.sort_by(|a, b| a.name.cmp(&b.name));
    let print = Mutex::new(());
    let start = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let k = s.spawn(|| lane("kernel", &kernel, args, &print));
        let o = lane("side", &side, args, &print);
        (k.join(), o)
    });
    let a = a.map_err(|_| anyhow::anyhow!("the kernel lane's runner panicked"))?;
    let wall = start.elapsed();
    println!("\n===== test binaries (kernel lane, then side lane) =====");
    let mut failed = Vec::new();
    for o in a.iter().chain(&b) {
        println!(
            "{:>8.1} s  {:<6} {}",
            o.secs,
            if o.ok { "ok" } else { "FAILED" },
            o.name
        );
        if !o.ok {
            failed.push(o.name.clone());
        }
    }
    let sum = |v: &[Outcome]| Duration::from_secs_f64(v.iter().map(|o| o.secs).sum());
    println!(
        "kernel lane {:.0} s, side lane {:.0} s, together {:.0} s",
        sum(&a).as_secs_f64(),
        sum(&b).as_secs_f64(),
        wall.as_secs_f64()
    );
    if !failed.is_empty() {
        bail!(
            "{} test binaries failed: {} (logs: target/test-logs/)",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
