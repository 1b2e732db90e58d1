//! The adaptive strategy end to end, as root, against the emulator (all figures emulated): it
//! calibrates from what it measures, leaves offline work alone where that costs online nothing,
//! and acts where it does.

use std::time::Duration;

use gpreempt_user::controller::record::{Act, AuditRecord};
use tests::{assert_nothing_left, audit_log, serial, sim, TempDir};

const ONLINE: &str = "--profile resnet18_b1 --rate 20 --priority 15";

const POLICY: &str = r#"
[policy]
strategy = "adaptive"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
min_run = "50ms"
min_interval = "1ms"
default = "ignore"
[adaptive]
online_p99_budget = 1.1
[[rule]]
class = "online"
comm = "resnet18_b1"
uid = 0
[[rule]]
class = "offline"
cmdline = '--offline|seed_model_a'
"#;

/// `run` with the adaptive policy next to the online service and `offline` for `secs`; the
/// audit records and the controller's stderr.
fn run_pair(offline: &str, secs: u32) -> (Vec<AuditRecord>, String) {
    let t = TempDir::new("adaptive");
    std::fs::write(t.path("policy.toml"), POLICY).unwrap();
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP run --policy {d}/policy.toml --audit {d}/audit.jsonl 2>{d}/run.err & R=$!
sleep 2
$GP sim workload {ONLINE} --duration {secs} --report {d}/on.json 2>/dev/null & A=$!
$GP sim workload {offline} --duration {secs} --report {d}/off.json 2>/dev/null & B=$!
wait $A $B
kill -INT $R; wait $R
"#
    );
    sim(&script, Duration::from_secs(u64::from(secs) + 90));
    let err = std::fs::read_to_string(t.path("run.err")).unwrap_or_default();
    (audit_log(&t.path("audit.jsonl")), err)
}

fn notes(audit: &[AuditRecord]) -> Vec<String> {
    audit
        .iter()
        .filter_map(|a| match a {
            AuditRecord::Adapt(n) => Some(n.reason.clone()),
            _ => None,
        })
        .collect()
}

fn suspends(audit: &[AuditRecord]) -> Vec<&Act> {
    audit
        .iter()
        .filter_map(|a| match a {
            AuditRecord::Suspend(s) => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn without_interference_the_adaptive_controller_leaves_offline_alone() {
    let _one = serial();
    // A light "offline" job: a small MLP twice a second, rarely on the GPU with the online one.
    let (audit, err) = run_pair("--profile seed_model_a_mlp_b32 --rate 2 --priority 0", 20);
    let notes = notes(&audit);
    println!("emulated: {notes:#?}\n{} suspends", suspends(&audit).len());
    assert!(err.contains("nothing is left suspended"), "{err}");
    assert!(
        notes.iter().any(|n| n.starts_with("calibrated:")),
        "no calibration: {notes:?}\n{err}"
    );
    // 20 s at 20 requests/s: 16 calibration bursts held, one in 64 explored, and at most two feedback
    // steps' worth (48) beyond that: one noisy step can escalate before the next backs off.
    let n = suspends(&audit).len();
    assert!(n <= 16 + 400 / 64 + 48, "{n} suspends: {notes:?}");
    assert!(
        notes.iter().any(|n| n.contains("no suspends")),
        "the tuner should settle on no suspends: {notes:?}"
    );
    assert_nothing_left();
}

#[test]
fn on_the_seeds_pair_the_adaptive_controller_measures_interference_and_acts() {
    let _one = serial();
    // 30 s: at 20 s one CI run on a loaded 2-vCPU host ended after a recalibration at z 2.1
    // (the test needs 2.33), with no time left for the next.
    let (audit, err) = run_pair("--profile resnet50_b1024 --offline --priority 0", 30);
    let notes = notes(&audit);
    let s = suspends(&audit);
    println!("emulated: {notes:#?}\n{} suspends", s.len());
    assert!(err.contains("nothing is left suspended"), "{err}");
    assert!(
        notes.iter().any(|n| n.starts_with("calibrated:")),
        "no calibration: {notes:?}\n{err}"
    );
    // It decides to act at calibration, or (when the free bursts happened to meet the target,
    // seen once in CI on a loaded host) after a miss, when held and free bursts measured side
    // by side again show the interference: "calibrated: clean p90 5.12ms, free p90 7.17ms,
    // interference 1.28x (tail 1.40x, z 2.6), target 5.63ms: suspend after 1.28ms of a burst".
    let acted = notes
        .iter()
        .find(|n| n.contains("calibrated:") && !n.ends_with("no suspends"))
        .unwrap_or_else(|| panic!("never decided to suspend: {notes:?}\n{err}"));
    let figure = |key: &str, end: char| -> f64 {
        acted
            .split(key)
            .nth(1)
            .and_then(|r| r.split(end).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key:?} figure in {acted:?}"))
    };
    // Offline running measurably slows the online bursts: the free ones are slower by the
    // tuner's test (z >= 2.33), and their tail at least 5% longer (on a quiet host about 2x; a
    // CI host under load measured medians 1.1x apart with the tails 1.4x apart).
    assert!(figure("z ", ')') >= 2.33, "{acted}");
    assert!(figure("(tail ", 'x') >= 1.05, "{acted}");
    // It acts on many requests (600 in 30 s), every suspend with the tuner's reasoning.
    assert!(s.len() > 50, "{} suspends: {notes:?}", s.len());
    assert!(
        s.iter().all(|a| a.reason().starts_with("adaptive: ")),
        "{:?}",
        s.first()
    );
    assert_nothing_left();
}
