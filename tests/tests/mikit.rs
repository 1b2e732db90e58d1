//! The MI host kit (scripts/mi-kit.sh, docs/mi-kit.md): its report generator on a fixture
//! directory written in the tool's schemas (with pieces missing and failed), `kfd-cycles` when
//! its target exits mid-cycling or it is told to stop, and the whole kit end to end inside `sim`
//! (`--emulated --short`). Root for the last two; every figure is emulated.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{assert_nothing_left, bin, require_root, serial, sim, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

fn text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(p: &Path) -> Value {
    let s = text(p);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", p.display()))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn report_generator_reads_the_fixture_and_reports_what_is_missing() {
    let t = TempDir::new("mikit-fixture");
    let fixture = repo().join("tests/fixtures/mi-kit");
    for e in std::fs::read_dir(&fixture).expect("fixture dir") {
        let e = e.expect("fixture entry");
        std::fs::copy(e.path(), t.path(&e.file_name().to_string_lossy())).expect("copy");
    }
    let out = Command::new("python3")
        .arg(repo().join("scripts/gpu/mi_report.py"))
        .arg(&t.0)
        .output()
        .expect("python3 (the report generator needs only its standard library)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&t.path("report.json"));
    let s = &r["sections"];
    assert_eq!(r["emulated"], false);
    for k in ["doctor", "inventory", "suspend_resume", "colocation"] {
        assert_eq!(s[k]["emulated"], false, "{k}: {}", s[k]);
    }
    // doctor: exit 1 (a failing check) is content, not a failed step.
    assert_eq!(s["doctor"]["status"], "ok");
    assert_eq!(s["doctor"]["fail"], 1);

    // The CNN's trace: only pid 1001's lines, a line cut short ignored.
    let cnn = &s["inventory"]["workloads"][0];
    assert_eq!(cnn["status"], "ok", "{cnn}");
    assert_eq!(cnn["queues"].as_array().unwrap().len(), 2);
    assert_eq!(cnn["queues"][0]["hqd"]["pipe"], 1);
    let m = &cnn["dispatch"];
    assert_eq!(m["aql_samples"], 4);
    assert_eq!(f(&m["read_eq_write_fraction"]), 0.25);
    assert_eq!(m["backlog_max"], 7);
    assert_eq!(m["kernel_dispatches"], 4);
    assert_eq!(m["packets"]["barrier_and"], 1);
    assert_eq!(
        m["grid_histogram"],
        serde_json::json!({"2^9": 1, "2^11": 1, "2^18": 2})
    );
    assert_eq!(m["workgroup_sizes"]["256"], 2);
    assert_eq!(m["top_kernels"][0]["kernel"], "Cijk_Ailk_Bljk_S");
    assert_eq!(m["top_kernels"][0]["count"], 3);
    assert_eq!(
        m["top_kernels"][1]["kernel"], "0x7100",
        "unnamed: by descriptor"
    );
    assert_eq!(f(&m["coverage"]), 0.5);
    assert_eq!(f(&m["seconds"]), 0.006);

    // The transformer's trace step failed: reported with its stderr, the queues still shown.
    let tr = &s["inventory"]["workloads"][1];
    assert_eq!(tr["status"], "partial", "{tr}");
    assert_eq!(s["inventory"]["status"], "partial");
    let fl = tr["failures"].as_array().unwrap();
    assert_eq!(fl.len(), 1, "{fl:?}");
    assert_eq!(fl[0]["rc"], 1);
    assert!(fl[0]["stderr_tail"]
        .as_str()
        .unwrap()
        .contains("Operation not permitted"));
    assert_eq!(tr["queues"][0]["hqd"]["inst"], 1);

    // Cycles: one SUSPEND over the 10 ms target, one cycle with progress while held; the online
    // reports in both forms (online.py's and `sim workload`'s).
    let c = &s["suspend_resume"];
    assert_eq!(c["status"], "ok", "{c}");
    assert_eq!(c["cycles"], 3);
    assert_eq!(f(&c["suspend_ms"]["max"]), 12.0);
    assert_eq!(c["suspend_ms"]["over_target"], 1);
    assert_eq!(c["meets_target_p99"]["suspend_ms"], false);
    assert_eq!(c["meets_target_p99"]["resume_ms"], true);
    assert_eq!(c["progress_ms"]["n"], 2);
    assert_eq!(c["cycles_with_progress_while_held"], 1);
    assert_eq!(f(&c["online_impact"]["p99_ratio"]), 1.25);

    // Co-location: the policy column never ran.
    let co = &s["colocation"];
    assert_eq!(co["status"], "partial");
    assert_eq!(co["columns"]["none"]["status"], "ok");
    assert_eq!(f(&co["columns"]["none"]["offline"]["items_per_s"]), 1024.0);
    assert_eq!(co["columns"]["policy"]["status"], "failed");
    assert!(co["columns"]["policy"]["failure"]["error"]
        .as_str()
        .unwrap()
        .contains("did not run"));

    let md = text(&t.path("report.md"));
    assert!(!md.contains("(emulated)"), "a real-GPU report: {md}");
    assert!(
        md.contains("**failed** `inv-transformer-trace`: exit code 1"),
        "{md}"
    );
    assert!(md.contains("| `Cijk_Ailk_Bljk_S` | 3 |"), "{md}");
}

#[test]
fn kfd_cycles_says_when_its_target_exits_and_resumes_on_sigterm() {
    let _one = serial();
    let t = TempDir::new("mikit-cycles");
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload --profile resnet50_b1024 --offline --priority 0 --duration 2 --report {d}/gone.json 2>{d}/gone.err & W=$!
$GP kfd-cycles --pid $W --cycles 1000 --hold 50ms --gap 20ms --json > {d}/gone.jsonl 2>{d}/gone.cerr || echo $? > {d}/gone.rc
rc=0; wait $W || rc=$?; echo $rc > {d}/gone.wrc
ls -A {d}/run > {d}/run.after
$GP sim workload --profile resnet50_b1024 --offline --priority 0 --duration 30 --report {d}/term.json 2>{d}/term.err & W=$!
$GP kfd-cycles --pid $W --cycles 1000 --hold 200ms --gap 20ms --json > {d}/term.jsonl 2>{d}/term.cerr & K=$!
for i in $(seq 200); do grep -q '"cycle":2,' {d}/term.jsonl 2>/dev/null && break; sleep 0.05; done
sleep 0.1
kill -TERM $K; wait $K || echo $? > {d}/term.rc
$GP queues --json > {d}/q.json
kill -INT $W; wait $W
"#
    );
    sim(&script, Duration::from_secs(60));

    // The target ends after ~2 s of cycles: a clean error naming it, exit code 3.
    assert_eq!(
        text(&t.path("gone.rc")).trim(),
        "3",
        "{}",
        text(&t.path("gone.cerr"))
    );
    let err = text(&t.path("gone.cerr"));
    assert!(
        err.contains("error (target exited)") && err.contains("nothing is left suspended"),
        "{err}"
    );
    let lines: Vec<Value> = text(&t.path("gone.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["type"], "summary");
    assert!(summary["ended"].as_str().unwrap().contains("exited"));
    let n = summary["cycles"].as_u64().unwrap();
    assert!((3..1000).contains(&n), "{summary}");
    assert_eq!(summary["cycles_with_progress_while_held"], 0, "{summary}");
    // Its queue was not left waiting in DESTROY: it exited normally and wrote its report.
    assert_eq!(text(&t.path("gone.wrc")).trim(), "0");
    assert!(t.path("gone.json").exists());
    assert_eq!(
        text(&t.path("run.after")).trim(),
        "",
        "the run directory is left empty"
    );

    // SIGTERM while holding (200 ms of every 220): everything resumed, exit 143.
    assert_eq!(
        text(&t.path("term.rc")).trim(),
        "143",
        "{}",
        text(&t.path("term.cerr"))
    );
    assert!(text(&t.path("term.cerr")).contains("every queue resumed"));
    let q = json(&t.path("q.json"));
    let w = q["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["comm"] == "resnet50_b1024")
        .unwrap_or_else(|| panic!("the workload in {q}"));
    assert_eq!(w["queues"][0]["state"], "active", "{w}");
    assert!(w["debugger"].is_null(), "detached: {w}");
    assert_nothing_left();
}

/// Runs `cmd` to its end, killing it after `limit`.
fn run_limited(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the kit");
    let t0 = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "the kit did not finish in {limit:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn the_kit_runs_end_to_end_in_sim() {
    let _one = serial();
    require_root();
    let t = TempDir::new("mikit");
    let out_dir = t.path("report");
    let t0 = Instant::now();
    let out = run_limited(
        Command::new("bash")
            .arg(repo().join("scripts/mi-kit.sh"))
            .args(["--emulated", "--short", "--out"])
            .arg(&out_dir)
            .arg("--gp")
            .arg(bin("gpreempt-ebpf")),
        Duration::from_secs(240),
    );
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    eprintln!("the kit took {:.1} s", t0.elapsed().as_secs_f64());
    let r = json(&out_dir.join("report.json"));
    assert_eq!(r["emulated"], true);
    let s = &r["sections"];
    for k in ["doctor", "inventory", "suspend_resume", "colocation"] {
        assert_eq!(s[k]["status"], "ok", "{k}: {}\n{log}", s[k]);
        assert_eq!(s[k]["emulated"], true, "{k}");
    }

    // (b) Both workloads' processes, each with an AQL queue with its ring and HQD slot, and
    // their dispatches: the CNN's grids are far larger than the transformer's.
    let w = s["inventory"]["workloads"].as_array().unwrap();
    let comms = ["resnet50_b1024", "transformer_b8_"];
    for (wl, comm) in w.iter().zip(comms) {
        assert_eq!(wl["process"]["comm"], comm, "{wl}");
        let q = wl["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["type"] == "compute_aql")
            .unwrap_or_else(|| panic!("no AQL queue: {wl}"));
        assert!(q["ring_base_address"].as_u64().unwrap() > 0, "{q}");
        assert!(q["ring_size"].as_u64().unwrap() > 0, "{q}");
        assert!(q["hqd"].is_object(), "an HQD slot: {q}");
        let m = &wl["dispatch"];
        assert!(m["kernel_dispatches"].as_u64().unwrap() > 0, "{m}");
        assert!(m["aql_samples"].as_u64().unwrap() > 0, "{m}");
        assert!(m["read_eq_write_fraction"].is_number(), "{m}");
        // Named from the workload's code objects (the timeline's kernel names).
        assert!(
            m["top_kernels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| !k["kernel"].as_str().unwrap_or("0x").starts_with("0x")),
            "no kernel named: {m}"
        );
    }
    assert!(
        f(&w[0]["dispatch"]["work_items"]["p50"]) > f(&w[1]["dispatch"]["work_items"]["p50"]),
        "CNN grids larger than the transformer's"
    );

    // (c) N cycles, every ioctl timed, nothing consumed while held.
    let c = &s["suspend_resume"];
    assert_eq!(c["cycles"], 10, "{c}");
    for cy in c["per_cycle"].as_array().unwrap() {
        assert!(
            f(&cy["suspend_ms"]) > 0.0 && f(&cy["resume_ms"]) > 0.0,
            "{cy}"
        );
        assert_eq!(cy["progress_while_held"], false, "{cy}");
        assert_eq!(cy["emulated"], true);
    }
    assert_eq!(c["cycles_with_progress_while_held"], 0);
    assert!(c["quiesce_ms"]["p99"].is_number(), "{c}");
    for k in ["without_cycling", "with_cycling"] {
        assert!(f(&c["online_impact"][k]["p99_ms"]) > 0.0, "{c}");
    }

    // (d) Both columns, online p99 and offline throughput; the controller acted.
    let co = &s["colocation"]["columns"];
    for col in ["none", "policy"] {
        assert!(f(&co[col]["online"]["p99_ms"]) > 0.0, "{col}: {}", co[col]);
        assert!(
            f(&co[col]["offline"]["items_per_s"]) > 0.0,
            "{col}: {}",
            co[col]
        );
    }
    assert!(
        co["policy"]["suspends"].as_u64().unwrap() > 0,
        "{}",
        co["policy"]
    );

    let md = text(&out_dir.join("report.md"));
    assert!(
        md.starts_with("# gpreempt-ebpf MI host kit report (emulated)"),
        "{md}"
    );
    for h in [
        "## (a) doctor (emulated)",
        "## (b) queue inventory",
        "## (c) suspend",
        "## (d) co-location",
    ] {
        assert!(md.contains(h), "{h} in:\n{md}");
    }
    eprintln!("{md}");
    assert_nothing_left();
}

#[test]
fn the_kit_refuses_with_what_to_install() {
    let _one = serial();
    require_root();
    let kit = repo().join("scripts/mi-kit.sh");
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "bash",
        ])
        .arg(&kit)
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("run it as root"), "{err}");

    // A KFD with a GPU (the emulator's) but a python3 without ROCm PyTorch (a stand-in that
    // fails every import): refused before anything runs, naming the package to install.
    let t = TempDir::new("mikit-refuse");
    let fake = t.path("bin");
    std::fs::create_dir_all(&fake).expect("bin dir");
    std::fs::write(fake.join("python3"), "#!/bin/sh\nexit 1\n").expect("fake python3");
    std::fs::set_permissions(
        fake.join("python3"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let script = format!(
        "PATH={}:$PATH bash {} --out {} --gp \"$GP\"; echo rc=$?",
        fake.display(),
        kit.display(),
        t.path("report").display()
    );
    let out = sim(&script, Duration::from_secs(30));
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(o.contains("rc=2"), "{o}\n{e}");
    assert!(
        e.contains("no ROCm PyTorch") && e.contains("pip3 install torch torchvision"),
        "{e}"
    );
    assert!(
        !t.path("report").exists(),
        "nothing written before refusing"
    );
    assert_nothing_left();
}
