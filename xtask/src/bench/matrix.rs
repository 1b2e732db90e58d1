//! The scenario matrix on the emulated GPU (`cargo xtask bench --matrix`): online profiles at two
//! request rates each against two offline profiles, every cell with the columns alone / offline
//! alone / co-located / one per policy in examples/matrix/, several rounds (each round one
//! emulator session, its columns in a fixed order), medians and spread. All figures emulated.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{build_release, in_sim, machine, pct, release_bin};
use crate::root;

/// Online (profile, requests/s): about 8% and 25% of the emulated GPU for each profile.
const ONLINE: [(&str, u32); 4] = [
    ("resnet18_b1", 20),
    ("resnet18_b1", 60),
    ("transformer_b8_s128", 5),
    ("transformer_b8_s128", 20),
];
/// Offline: long kernels (160 ms per batch) and short ones (a training step of 24 kernels,
/// 0.25 ms in all): the two ends of what an online kernel waits behind.
const OFFLINE: [&str; 2] = ["resnet50_b1024", "seed_model_b_mlp_train_b64"];
/// Seconds a controller sees the pair before each measurement: its start-up (the lever tuner's
/// calibration on AMD: 12 epochs of at least 1 s and 4 requests each, about 15 s at 5
/// requests/s).
const WARMUP_S: u32 = 20;

pub struct Matrix {
    pub seconds: u32,
    pub rounds: u32,
    /// Only the cells whose name ("resnet18_b1@20:resnet50_b1024") contains this.
    pub only: Option<String>,
}

fn cell_name(on: (&str, u32), off: &str) -> String {
    format!("{}@{}:{off}", on.0, on.1)
}

/// One measurement's figures.
#[derive(Clone, Copy, Default)]
struct Fig {
    p50: f64,
    p99: f64,
    max: f64,
    mean: f64,
    offline: f64,
    suspends_per_s: f64,
    decision_p99_us: f64,
}

pub(super) fn matrix(m: &Matrix) -> Result<()> {
    build_release(&["--bins"])?;
    let gp = release_bin("gpreempt-ebpf");
    // Under target/: nothing else cleans it up while the matrix runs (minutes).
    let dir = root().join(format!("target/bench-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut policies: Vec<PathBuf> = std::fs::read_dir(root().join("examples/matrix"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    policies.sort();
    let pname = |p: &PathBuf| {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let cells: Vec<((&str, u32), &str)> = ONLINE
        .iter()
        .flat_map(|&on| OFFLINE.iter().map(move |&off| (on, off)))
        .filter(|&(on, off)| {
            m.only
                .as_ref()
                .is_none_or(|o| cell_name(on, off).contains(o))
        })
        .collect();
    if cells.is_empty() {
        bail!("--pairs matches no cell");
    }
    let s = m.seconds;
    let d = dir.display();
    let mut figs: BTreeMap<(String, String), Vec<Fig>> = BTreeMap::new();
    let started = std::time::Instant::now();
    for k in 1..=m.rounds {
        let (sh, onlines, offlines) = round_script(k, &cells, &policies, &d.to_string(), s);
        eprintln!(
            "bench: matrix round {k}/{} ({} cells, {} s per measurement; emulated GPU)",
            m.rounds,
            cells.len(),
            s
        );
        let status = in_sim(&gp, &sh)?;
        if !status.success() {
            bail!("matrix round {k} failed ({status}); files in {d}");
        }
        // Collect this round.
        let read = |name: &str| -> Result<Value> {
            let p = dir.join(format!("{name}.json"));
            let t =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            Ok(serde_json::from_str(&t)?)
        };
        let online_fig = |v: &Value, f: &mut Fig| {
            let l = |k: &str| v["latency"][k].as_f64().unwrap_or(f64::NAN);
            (f.p50, f.p99, f.max, f.mean) = (l("p50_ms"), l("p99_ms"), l("max_ms"), l("mean_ms"));
        };
        for &on in &onlines {
            let mut f = Fig::default();
            online_fig(&read(&format!("r{k}-alone-{}@{}", on.0, on.1))?, &mut f);
            figs.entry((format!("{}@{}", on.0, on.1), "alone".into()))
                .or_default()
                .push(f);
        }
        for &off in &offlines {
            let f = Fig {
                offline: read(&format!("r{k}-solo-{off}"))?["items_per_s"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                ..Fig::default()
            };
            figs.entry((off.to_owned(), "solo_off".into()))
                .or_default()
                .push(f);
        }
        for &(on, off) in &cells {
            let c = cell_name(on, off);
            let cols = std::iter::once("colo".to_owned()).chain(policies.iter().map(pname));
            for col in cols {
                let mut f = Fig::default();
                online_fig(&read(&format!("r{k}-{col}-{c}-on"))?, &mut f);
                f.offline = read(&format!("r{k}-{col}-{c}-off"))?["items_per_s"]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                if col != "colo" {
                    (f.suspends_per_s, f.decision_p99_us) =
                        audit_figs(&dir.join(format!("r{k}-{col}-{c}.audit")), s);
                }
                figs.entry((c.clone(), col)).or_default().push(f);
            }
        }
    }
    let (md, doc) = report(
        m,
        &cells,
        &policies.iter().map(pname).collect::<Vec<_>>(),
        &figs,
    );
    println!("\n{md}");
    let out = root().join("target");
    std::fs::write(out.join("bench-matrix.md"), &md)?;
    std::fs::write(
        out.join("bench-matrix.json"),
        serde_json::to_vec_pretty(&doc)?,
    )?;
    eprintln!(
        "bench: matrix done in {:.0} s; target/bench-matrix.md and .json",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// (median, min, max) of one figure over rounds.
fn spread(v: &[Fig], f: impl Fn(&Fig) -> f64) -> (f64, f64, f64) {
    let mut x: Vec<f64> = v.iter().map(f).filter(|x| !x.is_nan()).collect();
    if x.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    x.sort_by(f64::total_cmp);
    (x[x.len() / 2], x[0], x[x.len() - 1])
}

fn cellf((m, lo, hi): (f64, f64, f64), nd: usize) -> String {
    if m.is_nan() {
        return "-".into();
    }
    format!("{m:.nd$} ({lo:.nd$}-{hi:.nd$})")
}

/// The markdown table and its JSON, with the verdicts against the goals: online p99 <= 1.10x
/// alone; offline >= 0.90x of the share online leaves it (solo x (1 - online's busy fraction,
/// rate x its mean service time alone)); never worse than no control on both.
fn report(
    m: &Matrix,
    cells: &[((&str, u32), &str)],
    policies: &[String],
    figs: &BTreeMap<(String, String), Vec<Fig>>,
) -> (String, Value) {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let date = std::process::Command::new("date")
        .arg("+%F")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut md = format!(
        "Scenario matrix, EMULATED GPU (gpreempt-sim MI210, seed 3), {date}, commit {commit}, {} \
         round(s) of {} s per measurement; median (min-max) over rounds; {}\n\n\
         | cell | column | online p50 ms | online p99 ms | p99 / alone | max ms | offline items/s \
         | / colo | / share left | suspends/s | decision p99 us | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        m.rounds,
        m.seconds,
        machine()
    );
    let mut doc = Vec::new();
    let get = |a: &str, b: &str| {
        figs.get(&(a.to_owned(), b.to_owned()))
            .cloned()
            .unwrap_or_default()
    };
    for &(on, off) in cells {
        let c = cell_name(on, off);
        let alone = get(&format!("{}@{}", on.0, on.1), "alone");
        let solo = get(off, "solo_off");
        let a99 = spread(&alone, |f| f.p99).0;
        let busy = (f64::from(on.1) * spread(&alone, |f| f.mean).0 / 1e3).min(1.0);
        let share_left = spread(&solo, |f| f.offline).0 * (1.0 - busy);
        let colo = get(&c, "colo");
        let (c99, coff) = (spread(&colo, |f| f.p99).0, spread(&colo, |f| f.offline).0);
        let _ = writeln!(
            md,
            "| {c} (online busy {:.0}%) | alone | {} | {} | 1.00 | {} | - | - | - | - | - | |",
            busy * 100.0,
            cellf(spread(&alone, |f| f.p50), 2),
            cellf(spread(&alone, |f| f.p99), 2),
            cellf(spread(&alone, |f| f.max), 1)
        );
        for col in std::iter::once("colo".to_owned()).chain(policies.iter().cloned()) {
            let v = get(&c, &col);
            let (p99, off) = (spread(&v, |f| f.p99).0, spread(&v, |f| f.offline).0);
            let r99 = p99 / a99;
            let (r_colo, r_share) = (off / coff, off / share_left);
            let verdict = if col == "colo" {
                String::new()
            } else {
                let mut parts = vec![
                    format!("p99 {}", if r99 <= 1.10 { "met" } else { "missed" }),
                    format!("offline {}", if r_share >= 0.90 { "met" } else { "missed" }),
                ];
                if p99 > c99 && off < coff {
                    parts.push("WORSE than no control on both".into());
                }
                parts.join(", ")
            };
            let _ = writeln!(
                md,
                "| | {col} | {} | {} | {r99:.2} | {} | {} | {r_colo:.2} | {r_share:.2} | {} | {} | {verdict} |",
                cellf(spread(&v, |f| f.p50), 2),
                cellf(spread(&v, |f| f.p99), 2),
                cellf(spread(&v, |f| f.max), 1),
                cellf(spread(&v, |f| f.offline), 0),
                if col == "colo" { "-".into() } else { format!("{:.1}", spread(&v, |f| f.suspends_per_s).0) },
                if col == "colo" { "-".into() } else { format!("{:.0}", spread(&v, |f| f.decision_p99_us).0) },
            );
            doc.push(json!({
                "cell": c, "column": col, "emulated": true, "rounds": v.len(),
                "online_p50_ms": spread(&v, |f| f.p50).0, "online_p99_ms": p99,
                "online_max_ms": spread(&v, |f| f.max).0, "offline_items_per_s": off,
                "p99_vs_alone": r99, "offline_vs_colo": r_colo, "offline_vs_share_left": r_share,
                "suspends_per_s": spread(&v, |f| f.suspends_per_s).0,
                "decision_p99_us": spread(&v, |f| f.decision_p99_us).0, "verdict": verdict,
            }));
        }
    }
    md.push_str(
        "\nEach suspend and its resume cause two runlist uploads in the HWS model (docs/kfd.md): \
         uploads/s = 2 x suspends/s.\n",
    );
    (
        md,
        json!({ "emulated": true, "date": date, "commit": commit, "rows": doc }),
    )
}

/// One round's shell script: each online job alone, each offline job alone, then every pair
/// together with no controller and under every policy. Also the distinct online and offline jobs.
#[allow(clippy::type_complexity)]
fn round_script<'a>(
    k: u32,
    cells: &[((&'a str, u32), &'a str)],
    policies: &[PathBuf],
    d: &str,
    s: u32,
) -> (String, Vec<(&'a str, u32)>, Vec<&'a str>) {
    let pname = |p: &PathBuf| {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let w = |args: &str, out: &str| {
        format!("$GP sim workload {args} --duration {s} --report {d}/{out}.json 2>/dev/null")
    };
    let on_args = |(p, r): (&str, u32)| format!("--profile {p} --rate {r} --priority 15");
    let off_args = |p: &str| format!("--profile {p} --offline --priority 0");
    let mut sh = format!("set -e\nexport GPREEMPT_RUN_DIR={d}/run\n");
    let mut onlines: Vec<(&str, u32)> = cells.iter().map(|c| c.0).collect();
    onlines.dedup();
    let mut offlines: Vec<&str> = cells.iter().map(|c| c.1).collect();
    offlines.sort();
    offlines.dedup();
    for &on in &onlines {
        let _ = writeln!(
            sh,
            "{}",
            w(&on_args(on), &format!("r{k}-alone-{}@{}", on.0, on.1))
        );
    }
    for &off in &offlines {
        let _ = writeln!(sh, "{}", w(&off_args(off), &format!("r{k}-solo-{off}")));
    }
    for &(on, off) in cells {
        let c = cell_name(on, off);
        let _ = writeln!(
            sh,
            "{} & A=$!\n{} & B=$!\nwait $A $B",
            w(&on_args(on), &format!("r{k}-colo-{c}-on")),
            w(&off_args(off), &format!("r{k}-colo-{c}-off"))
        );
        for p in policies {
            let n = pname(p);
            // The controller first sees the pair for WARMUP_S (its start-up: the lever tuner's
            // calibration), then the same processes are measured: a new pair would be a mix
            // change, measured again. The audit is cut at the measurement's start.
            let wu = |a: &str| format!("{a} --warmup {WARMUP_S}");
            let _ = writeln!(
                sh,
                "$GP run --policy {} --audit {d}/r{k}-{n}-{c}.audit 2>{d}/r{k}-{n}-{c}.err & R=$!\n\
                 sleep 2\n{} & A=$!\n{} & B=$!\n\
                 sleep {WARMUP_S}; cp {d}/r{k}-{n}-{c}.audit {d}/r{k}-{n}-{c}.warmup.audit; \
                 : > {d}/r{k}-{n}-{c}.audit\n\
                 wait $A $B\nkill -INT $R; wait $R",
                p.display(),
                w(&wu(&on_args(on)), &format!("r{k}-{n}-{c}-on")),
                w(&wu(&off_args(off)), &format!("r{k}-{n}-{c}-off"))
            );
        }
    }
    (sh, onlines, offlines)
}

/// From a controller's audit log over `s` seconds: suspends per second and the p99 decision
/// latency (us).
fn audit_figs(path: &std::path::Path, s: u32) -> (f64, f64) {
    let audit = std::fs::read_to_string(path).unwrap_or_default();
    let recs: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let sus: Vec<&Value> = recs
        .iter()
        .filter(|r| r["action"] == "suspend" && r["issued_ns"].is_u64())
        .collect();
    let mut lat: Vec<f64> = sus
        .iter()
        .filter_map(|r| r["decision_latency_ns"].as_f64())
        .map(|ns| ns / 1e3)
        .collect();
    lat.sort_by(f64::total_cmp);
    (sus.len() as f64 / f64::from(s), pct(&lat, 0.99))
}
