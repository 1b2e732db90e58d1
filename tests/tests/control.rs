//! The controller end to end, as root, against the emulator: real ptrace, real DBG_TRAP ioctls
//! (served by the emulated KFD), the real eBPF tracer watching. What the emulator shows (its
//! debugfs `hqds`: a suspended queue holds no HQD slot; dispatch ids that stop moving) is the
//! kernel-side truth the tests check against; all figures are emulated.

use std::path::Path;
use std::time::Duration;

use gpreempt_user::controller::record::AuditRecord;
use serde_json::Value;
use tests::{assert_nothing_left, audit_log, serial, sim, TempDir};

fn json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", p.display()))
}

fn text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn num(p: &Path) -> u32 {
    text(p)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// (state, hqd, dispatches/s) of a queue in a `queues --json` document.
fn queue(doc: &Value, pid: u32, qid: u32) -> (String, Value, Value) {
    let p = doc["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {doc}"));
    let q = p["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue_id"] == qid)
        .unwrap_or_else(|| panic!("queue {qid} of {pid} not in {p}"));
    (
        q["state"].as_str().unwrap_or("?").to_string(),
        q["hqd"].clone(),
        q["activity"]["dispatches_per_s"].clone(),
    )
}

fn lines(p: &Path) -> Vec<Value> {
    text(p)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

const OFFLINE: &str = "--profile resnet50_b1024 --offline --priority 0";
const ONLINE: &str = "--profile resnet18_b1 --rate 20 --priority 15";

#[test]
fn manual_suspend_resume_round_trip_seen_by_trace_and_queues() {
    let _one = serial();
    let t = TempDir::new("manual");
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP trace --json > {d}/trace.jsonl 2>{d}/trace.err & TR=$!
sleep 1.5
$GP sim workload {OFFLINE} --duration 30 --second-queue-after 3 --report {d}/off.json 2>{d}/off.err & W=$!
echo $W > {d}/w.pid
sleep 1.5
$GP suspend --pid $W > {d}/suspend.out 2>&1 & S=$!
echo $S > {d}/s.pid
sleep 1
$GP queues --json > {d}/q1.json
sleep 2.5
$GP queues --json > {d}/q2.json
$GP resume --pid $W > {d}/resume.out 2>&1
wait $S; echo $? > {d}/suspend.rc
sleep 0.5
$GP queues --json > {d}/q3.json
kill -INT $W; wait $W
sleep 0.3
kill -INT $TR; wait $TR
"#
    );
    sim(&script, Duration::from_secs(60));
    let w = num(&t.path("w.pid"));
    let s = num(&t.path("s.pid"));
    let out = text(&t.path("suspend.out"));
    assert_eq!(num(&t.path("suspend.rc")), 0, "{out}");
    assert!(
        out.contains(&format!("pid {w}: suspended queue(s) 0")),
        "{out}"
    );
    assert!(
        out.contains("suspended queue(s) 1 (new queue of a suspended process)"),
        "a queue created while the process is suspended is suspended too:\n{out}"
    );
    assert!(
        out.contains("every queue resumed: nothing is left suspended"),
        "{out}"
    );
    assert!(
        text(&t.path("resume.out")).contains(&format!("pid {w}: resumed queue(s) 0, 1")),
        "{}",
        text(&t.path("resume.out"))
    );

    // While suspended: the model says so (from the controller), and the emulated hardware
    // agrees: no HQD slot, no dispatches.
    let q1 = json(&t.path("q1.json"));
    let (state, hqd, rate) = queue(&q1, w, 0);
    assert_eq!(state, "suspended", "{q1}");
    assert!(hqd.is_null(), "a suspended queue holds no HQD: {q1}");
    assert_eq!(rate.as_f64(), Some(0.0), "{q1}");
    let q2 = json(&t.path("q2.json"));
    for qid in [0, 1] {
        let (state, hqd, _) = queue(&q2, w, qid);
        assert_eq!(state, "suspended", "queue {qid}: {q2}");
        assert!(hqd.is_null(), "queue {qid}: {q2}");
    }
    // After the resume: mapped and running again.
    let q3 = json(&t.path("q3.json"));
    for qid in [0, 1] {
        let (state, hqd, _) = queue(&q3, w, qid);
        assert_eq!(state, "active", "queue {qid}: {q3}");
        assert!(!hqd.is_null(), "queue {qid} mapped again: {q3}");
    }
    let (_, _, rate) = queue(&q3, w, 0);
    assert!(rate.as_f64().unwrap_or(0.0) > 0.0, "{q3}");

    // The tracer saw the controller's debug-trap calls on the workload.
    let ops: Vec<String> = lines(&t.path("trace.jsonl"))
        .iter()
        .filter(|e| e["event"] == "dbg_trap" && e["pid"] == s && e["target_pid"] == w)
        .map(|e| e["op"].as_str().unwrap_or("?").to_string())
        .collect();
    for op in [
        "enable",
        "get_queue_snapshot",
        "suspend_queues",
        "resume_queues",
        "disable",
    ] {
        assert!(ops.iter().any(|o| o == op), "no {op} in {ops:?}");
    }
    let first = |op: &str| ops.iter().position(|o| o == op).unwrap();
    assert!(first("enable") < first("suspend_queues"));
    assert!(first("suspend_queues") < first("resume_queues"));
    assert_eq!(ops.last().map(String::as_str), Some("disable"), "{ops:?}");
    assert_nothing_left();
}

/// Online p99 with and without the example policy, 60 s each, side by side in one emulator.
/// `run` on the seeds' pair, 60 s without then with the example policy: it acts on the offline
/// process only, holds it for a real share of the time while online requests run, and leaves
/// nothing suspended. The latencies are printed, not asserted: this debug build on two shared
/// vCPUs cannot time them fairly (`cargo xtask bench --control-only` compares them, release).
#[test]
fn run_holds_the_offline_process_while_online_requests_run() {
    let _one = serial();
    let t = TempDir::new("run");
    let d = t.0.display();
    let policy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/resnet-online-offline.toml");
    let policy = policy.display();
    let secs = 60;
    let probe = secs - 10;
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload {ONLINE} --duration {secs} --report {d}/on0.json 2>/dev/null & A=$!
$GP sim workload {OFFLINE} --duration {secs} --report {d}/off0.json 2>/dev/null & B=$!
wait $A $B
$GP run --policy {policy} --audit {d}/audit.jsonl 2>{d}/run.err & R=$!
sleep 2
$GP sim workload {ONLINE} --duration {secs} --report {d}/on1.json 2>{d}/on1.err & A=$!
$GP sim workload {OFFLINE} --duration {secs} --report {d}/off1.json 2>/dev/null & B=$!
echo $B > {d}/b.pid
# What the controller measured of the online service's requests, while it runs.
sleep {probe}; $GP queues --json > {d}/queues.json 2>{d}/queues.err
wait $A $B
kill -INT $R; wait $R; echo $? > {d}/run.rc
"#
    );
    sim(&script, Duration::from_secs(2 * secs + 60));
    assert!(
        t.path("on1.json").exists(),
        "the online workload under the controller wrote no report: {}\ncontroller: {}",
        std::fs::read_to_string(t.path("on1.err")).unwrap_or_default(),
        std::fs::read_to_string(t.path("run.err")).unwrap_or_default()
    );
    let p99 = |f: &str| json(&t.path(f))["latency"]["p99_ms"].as_f64().unwrap();
    let items = |f: &str| json(&t.path(f))["items_per_s"].as_f64().unwrap();
    let (without, with) = (p99("on0.json"), p99("on1.json"));
    let (off0, off1) = (items("off0.json"), items("off1.json"));
    let audit = audit_log(&t.path("audit.jsonl"));
    let acts = || audit.iter().filter_map(AuditRecord::as_act);
    let suspends = acts()
        .filter(|(suspend, a)| *suspend && !a.done().is_empty())
        .count();
    let mut lat: Vec<f64> = acts()
        .filter_map(|(_, a)| a.decision()?.decision_latency_ns)
        .map(|ns| ns as f64 / 1e3)
        .collect();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "emulated, {secs} s each: online p99 {without:.2} ms without the controller, {with:.2} ms with \
         ({:.2}x); offline {off0:.0} -> {off1:.0} items/s ({:.0}%); {suspends} suspends; \
         decision latency p50 {:.0} us p99 {:.0} us",
        without / with,
        100.0 * off1 / off0,
        pct(0.5),
        pct(0.99),
    );
    assert_eq!(num(&t.path("run.rc")), 0, "{}", text(&t.path("run.err")));
    // The controller's request latency of the online service (uprobes on its launches and its
    // blocking syncs), against what the service itself measured (from each request's arrival).
    let queues = json(&t.path("queues.json"));
    let online = json(&t.path("on1.json"));
    let pid = online["pid"].as_u64().unwrap();
    let req = queues["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .map(|p| p["requests"].clone())
        .unwrap_or_default();
    let client = online["latency"]["p50_ms"].as_f64().unwrap();
    let tool = req["p50_ms"].as_f64().unwrap_or(f64::NAN);
    println!(
        "emulated: online requests measured by the controller {req}; by the service: p50 {client:.2} ms p99 {:.2} ms",
        online["latency"]["p99_ms"].as_f64().unwrap()
    );
    assert!(
        req["count"].as_u64().unwrap_or(0) >= 100,
        "the controller timed the online requests: {req}\n{}",
        text(&t.path("queues.err"))
    );
    assert!(
        (tool - client).abs() <= 0.1 * client,
        "request p50: controller {tool} ms, service {client} ms"
    );
    assert!(
        text(&t.path("run.err")).contains("nothing is left suspended"),
        "{}",
        text(&t.path("run.err"))
    );
    assert!(suspends > 100, "the policy acted: {suspends} suspends");
    // Every suspend was triggered by online work the controller saw.
    assert!(
        acts()
            .filter(|(suspend, _)| *suspend)
            .all(|(_, a)| a.decision().is_some_and(|d| d.trigger_ns.is_some())),
        "suspends without a trigger"
    );
    // How long the offline queue was held: from each suspend's return to the next resume's.
    let mut held_ns = 0u64;
    let mut since = None;
    for (suspend, a) in acts() {
        let returned = a.decision().and_then(|d| d.returned_ns);
        match (suspend, returned, !a.done().is_empty()) {
            (true, Some(t), true) => {
                since.get_or_insert(t);
            }
            (false, Some(t), true) => {
                if let Some(s) = since.take() {
                    held_ns += t.saturating_sub(s);
                }
            }
            _ => {}
        }
    }
    println!("offline held {:.1} s of {secs} s", held_ns as f64 / 1e9);
    assert!(
        held_ns > secs * 1_000_000_000 / 20,
        "the offline process was held only {held_ns} ns"
    );
    assert!(
        off1 > 0.2 * off0,
        "offline still progresses: {off0} -> {off1}"
    );
    let b = num(&t.path("b.pid"));
    assert!(
        acts().all(|(_, a)| a.pid() == b),
        "only the offline process is acted on"
    );
    assert_nothing_left();
}

/// A test policy that keeps the offline queue suspended while the online job saturates the GPU.
const HOLD_POLICY: &str = r#"
[policy]
strategy = "priority"
window = "50ms"
resume_after = "20ms"
max_suspend = "60s"
min_run = "50ms"
default = "ignore"

[[rule]]
class = "online"
cmdline = '--profile resnet18_b1\b'

[[rule]]
class = "offline"
cmdline = '--profile resnet50_b1024\b'
"#;

/// The audit log stays bounded (docs/service.md, "The audit log's bound"): under
/// `--audit-max-size` the controller keeps the file and one FILE.1, each within the size, whole
/// lines only; renamed away (as logrotate does), the file keeps the records until SIGHUP, after
/// which they land in a new file of mode 0640, and the policy is reloaded as before.
#[test]
fn the_audit_log_rotates_at_its_cap_and_reopens_on_sighup() {
    let _one = serial();
    let t = TempDir::new("auditcap");
    let d = t.0.display();
    // The example's short resume_after: a suspend and a resume per online request.
    let policy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/resnet-online-offline.toml");
    let policy = policy.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload {ONLINE} --duration 60 2>/dev/null >/dev/null & A=$!
$GP sim workload {OFFLINE} --duration 60 2>/dev/null >/dev/null & B=$!
sleep 1
$GP run --policy {policy} --audit {d}/log/audit.jsonl --audit-max-size 4KiB 2>{d}/run1.err & R=$!
for i in $(seq 150); do [ -e {d}/log/audit.jsonl.1 ] && break; sleep 0.2; done
sleep 2
kill -INT $R; wait $R; echo $? > {d}/run1.rc
mkdir {d}/cap
mv {d}/log/audit.jsonl {d}/log/audit.jsonl.1 {d}/cap/
$GP run --policy {policy} --audit {d}/log/audit.jsonl 2>{d}/run2.err & R=$!
for i in $(seq 150); do [ -s {d}/log/audit.jsonl ] && break; sleep 0.2; done
sleep 1
mv {d}/log/audit.jsonl {d}/log/audit.jsonl-away
sleep 1
if [ -e {d}/log/audit.jsonl ]; then echo before SIGHUP > {d}/early; fi
kill -HUP $R
sleep 2
kill -INT $R; wait $R; echo $? > {d}/run2.rc
kill -INT $A $B; wait $A $B
"#
    );
    sim(&script, Duration::from_secs(90));
    let run1 = text(&t.path("run1.err"));
    assert_eq!(num(&t.path("run1.rc")), 0, "{run1}");
    assert!(!run1.contains("audit file"), "{run1}");
    let cap = 4096;
    let (cur, prev) = (t.path("cap/audit.jsonl"), t.path("cap/audit.jsonl.1"));
    for f in [&cur, &prev] {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len > 0 && len <= cap, "{}: {len} bytes", f.display());
        // Whole lines only, each a record.
        let body = text(f);
        assert!(body.ends_with('\n'));
        assert_eq!(audit_log(f).len(), body.lines().count(), "{body}");
    }
    let ts = |f: &Path, first: bool| -> u64 {
        let body = text(f);
        let l = if first {
            body.lines().next()
        } else {
            body.lines().last()
        };
        serde_json::from_str::<Value>(l.unwrap()).unwrap()["ts_ns"]
            .as_u64()
            .unwrap()
    };
    assert!(
        ts(&prev, false) <= ts(&cur, true),
        "FILE.1 holds the older records"
    );

    let run2 = text(&t.path("run2.err"));
    assert_eq!(num(&t.path("run2.rc")), 0, "{run2}");
    assert!(
        !t.path("early").exists(),
        "a new file appeared before SIGHUP: {run2}"
    );
    let (away, new) = (t.path("log/audit.jsonl-away"), t.path("log/audit.jsonl"));
    assert!(!audit_log(&away).is_empty());
    assert!(
        !audit_log(&new).is_empty(),
        "no records in the reopened file: {run2}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&new).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    assert!(ts(&away, false) <= ts(&new, true));
    assert!(
        run2.contains("policy reloaded"),
        "SIGHUP still reloads: {run2}"
    );
    assert_nothing_left();
}

#[test]
fn kill_9_of_run_leaves_nothing_suspended_and_sigterm_resumes() {
    let _one = serial();
    let t = TempDir::new("kill9");
    let d = t.0.display();
    std::fs::write(t.path("hold.toml"), HOLD_POLICY).unwrap();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload --profile resnet18_b1 --rate 400 --priority 15 --duration 60 2>/dev/null >/dev/null & A=$!
$GP sim workload {OFFLINE} --duration 60 2>/dev/null >/dev/null & B=$!
echo $B > {d}/b.pid
sleep 1
$GP run --policy {d}/hold.toml 2>{d}/run1.err & R=$!
sleep 3
$GP queues --json > {d}/q1.json
kill -KILL $R; wait $R || true
sleep 0.5
$GP queues --json > {d}/q2.json
$GP run --policy {d}/hold.toml 2>{d}/run2.err & R=$!
sleep 3
$GP queues --json > {d}/q3.json
kill -TERM $R; wait $R; echo $? > {d}/run2.rc
sleep 0.3
$GP queues --json > {d}/q4.json
kill -INT $A $B; wait $A $B
"#
    );
    sim(&script, Duration::from_secs(60));
    let b = num(&t.path("b.pid"));
    let q1 = json(&t.path("q1.json"));
    let (state, hqd, _) = queue(&q1, b, 0);
    assert_eq!(state, "suspended", "held while online saturates: {q1}");
    assert!(hqd.is_null(), "{q1}");
    // kill -9: the kernel (here the emulator, as amdkfd does) disables the trap of every target
    // of a debugger whose mm goes away, and resumes their queues.
    let q2 = json(&t.path("q2.json"));
    let (state, hqd, rate) = queue(&q2, b, 0);
    assert_eq!(state, "active", "{q2}");
    assert!(
        !hqd.is_null(),
        "running again after kill -9 of the controller: {q2}"
    );
    assert!(rate.as_f64().unwrap_or(0.0) > 0.0, "{q2}");
    // The next controller finds what the killed one recorded and resumes it (a no-op here:
    // the kernel already did), then controls again.
    let run2 = text(&t.path("run2.err"));
    assert!(
        run2.contains(&format!("pid {b}: left by an earlier controller")),
        "{run2}"
    );
    let q3 = json(&t.path("q3.json"));
    assert_eq!(queue(&q3, b, 0).0, "suspended", "{q3}");
    // SIGTERM: resumed, released, exit 0.
    assert_eq!(num(&t.path("run2.rc")), 0, "{run2}");
    assert!(
        run2.contains("terminated: nothing is left suspended"),
        "{run2}"
    );
    let q4 = json(&t.path("q4.json"));
    let (state, hqd, _) = queue(&q4, b, 0);
    assert_eq!(state, "active", "{q4}");
    assert!(!hqd.is_null(), "{q4}");
    assert_nothing_left();
}

#[test]
fn a_target_that_exits_while_suspended_is_not_left_hanging() {
    let _one = serial();
    let t = TempDir::new("exit");
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP sim workload {OFFLINE} --duration 60 --report {d}/off.json 2>/dev/null & W=$!
sleep 1
$GP suspend --pid $W > {d}/s1.out 2>&1 & S=$!
sleep 1
# A normal exit destroys the (suspended) queue: the kernel makes that wait for a resume.
kill -TERM $W
T0=$(date +%s%N); wait $W; echo $(( ($(date +%s%N) - T0) / 1000000 )) > {d}/exit.ms
wait $S; echo $? > {d}/s1.rc
$GP sim workload {OFFLINE} --duration 60 2>/dev/null >/dev/null & W=$!
echo $W > {d}/w2.pid
sleep 1
$GP suspend --pid $W > {d}/s2.out 2>&1 & S=$!
sleep 1
kill -KILL $W; wait $W || true
wait $S; echo $? > {d}/s2.rc
"#
    );
    sim(&script, Duration::from_secs(40));
    let s1 = text(&t.path("s1.out"));
    assert_eq!(num(&t.path("s1.rc")), 0, "{s1}");
    assert!(
        num(&t.path("exit.ms")) < 3000,
        "the workload exits promptly: {} ms\n{s1}",
        num(&t.path("exit.ms"))
    );
    assert!(s1.contains("(the process is destroying it)"), "{s1}");
    assert!(
        json(&t.path("off.json"))["iterations"].as_u64().is_some(),
        "report written"
    );
    let s2 = text(&t.path("s2.out"));
    assert_eq!(num(&t.path("s2.rc")), 0, "{s2}");
    assert!(
        s2.contains(&format!(
            "pid {} exited: nothing is left suspended",
            num(&t.path("w2.pid"))
        )),
        "{s2}"
    );
    assert_nothing_left();
}

#[test]
fn dry_run_acts_on_nothing_a_second_controller_is_refused_and_reloads_validate() {
    let _one = serial();
    let t = TempDir::new("dry");
    let d = t.0.display();
    std::fs::write(t.path("p.toml"), HOLD_POLICY).unwrap();
    // Line 4 of the bad file has the error.
    std::fs::write(
        t.path("bad.toml"),
        "[policy]\nstrategy = \"priority\"\nwindow = \"10ms\"\nresume_after = \"3 parsecs\"\n",
    )
    .unwrap();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
$GP trace --json > {d}/trace.jsonl 2>/dev/null & TR=$!
sleep 1.5
$GP sim workload --profile resnet18_b1 --rate 400 --priority 15 --duration 60 2>/dev/null >/dev/null & A=$!
$GP sim workload {OFFLINE} --duration 60 2>/dev/null >/dev/null & B=$!
echo $B > {d}/b.pid
sleep 1
$GP run --policy {d}/p.toml --reload-on-change --dry-run --audit {d}/audit.jsonl 2>{d}/run.err & R=$!
echo $R > {d}/r.pid
sleep 3
$GP queues --json > {d}/q1.json
$GP run --policy {d}/p.toml > {d}/second.out 2>&1 && echo 0 > {d}/second.rc || echo $? > {d}/second.rc
echo '# edited' >> {d}/p.toml
sleep 3
cp {d}/bad.toml {d}/p.toml
kill -HUP $R
sleep 0.5
kill -0 $R
kill -INT $R; wait $R; echo $? > {d}/run.rc
$GP run --policy {d}/bad.toml > {d}/bad.out 2>&1 && echo 0 > {d}/bad.rc || echo $? > {d}/bad.rc
kill -INT $A $B; wait $A $B
kill -INT $TR; wait $TR
"#
    );
    sim(&script, Duration::from_secs(60));
    let b = num(&t.path("b.pid"));
    let r = num(&t.path("r.pid"));
    let run = text(&t.path("run.err"));
    assert_eq!(num(&t.path("run.rc")), 0, "{run}");
    // Dry run: decisions are made and audited...
    let audit = audit_log(&t.path("audit.jsonl"));
    assert!(
        audit.iter().any(|a| matches!(a, AuditRecord::Suspend(s)
            if s.pid() == b && s.decision().is_some_and(|d| d.dry_run))),
        "{audit:?}"
    );
    // ...and nothing is done: no debug-trap call by the controller, the queue keeps running.
    let calls = lines(&t.path("trace.jsonl"))
        .iter()
        .filter(|e| e["event"] == "dbg_trap" && e["pid"] == r)
        .count();
    assert_eq!(calls, 0, "a dry run issues no DBG_TRAP");
    let q1 = json(&t.path("q1.json"));
    let (state, hqd, _) = queue(&q1, b, 0);
    assert_eq!(state, "active", "{q1}");
    assert!(!hqd.is_null(), "{q1}");
    // One controller at a time.
    assert_eq!(num(&t.path("second.rc")), 1);
    let second = text(&t.path("second.out"));
    assert!(
        second.contains(&format!(
            "another gpreempt-ebpf controller is running (pid {r})"
        )),
        "{second}"
    );
    // An edit of the file reloads it without a signal (--reload-on-change).
    assert!(
        run.contains("the policy file changed: reloading") && run.contains("policy reloaded:"),
        "{run}"
    );
    // SIGHUP with a broken file keeps the old policy and says where the problem is.
    assert!(
        run.contains("policy NOT reloaded, keeping the old one"),
        "{run}"
    );
    assert!(
        run.contains("bad.toml:4:") || run.contains("p.toml:4:"),
        "{run}"
    );
    // A malformed policy at start: a line-numbered error, exit 1.
    assert_eq!(num(&t.path("bad.rc")), 1);
    let bad = text(&t.path("bad.out"));
    assert!(bad.contains("bad.toml:4:"), "{bad}");
    assert!(bad.contains("resume_after"), "{bad}");
    assert_nothing_left();
}

/// `top`'s `s` / `r` keys: with no controller running, top becomes one on the first key.
#[test]
fn top_keys_suspend_and_resume_through_the_controller() {
    let _one = serial();
    let t = TempDir::new("topkeys");
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
export TERM=xterm-256color
S="tmux -S {d}/tmux.sock"
$GP sim workload {OFFLINE} --duration 60 2>/dev/null >/dev/null & W=$!
echo $W > {d}/w.pid
sleep 1
$S new-session -d -x 160 -y 40 "$GP top --interval 100 --sample-interval 100 2>{d}/top.err; echo TOP_EXIT=\$?; sleep 30"
i=0; until $S capture-pane -p | grep -q "$W"; do i=$((i+1)); [ $i -lt 100 ] || {{ $S capture-pane -p; exit 1; }}; sleep 0.1; done
$S send-keys / "$W" Enter
sleep 0.5
$S send-keys s
sleep 1.5
$S capture-pane -p > {d}/suspended.txt
$GP queues --json > {d}/q1.json
$S send-keys r
sleep 1.5
$S capture-pane -p > {d}/resumed.txt
$GP queues --json > {d}/q2.json
$S send-keys s
sleep 1
$S send-keys q
i=0; until $S capture-pane -p | grep -q TOP_EXIT; do i=$((i+1)); [ $i -lt 50 ] || exit 1; sleep 0.1; done
$S capture-pane -p > {d}/exit.txt
sleep 0.5
$GP queues --json > {d}/q3.json
$S kill-server
kill -INT $W; wait $W
"#
    );
    sim(&script, Duration::from_secs(60));
    let w = num(&t.path("w.pid"));
    let sus = text(&t.path("suspended.txt"));
    assert!(
        sus.contains(&format!("pid {w}: suspended queue(s) 0")),
        "{sus}"
    );
    let q1 = json(&t.path("q1.json"));
    let (state, hqd, _) = queue(&q1, w, 0);
    assert_eq!(state, "suspended", "{q1}");
    assert!(hqd.is_null(), "{q1}");
    let res = text(&t.path("resumed.txt"));
    assert!(
        res.contains(&format!("pid {w}: resumed queue(s) 0")),
        "{res}"
    );
    let q2 = json(&t.path("q2.json"));
    let (state, hqd, _) = queue(&q2, w, 0);
    assert_eq!(state, "active", "{q2}");
    assert!(!hqd.is_null(), "{q2}");
    // Quitting top with a queue suspended resumes it.
    assert!(text(&t.path("exit.txt")).contains("TOP_EXIT=0"));
    let q3 = json(&t.path("q3.json"));
    let (state, hqd, _) = queue(&q3, w, 0);
    assert_eq!(state, "active", "{q3}");
    assert!(!hqd.is_null(), "running again after top exits: {q3}");
    assert_nothing_left();
}

/// Per online request: its first launch (a burst start in an observer's launch hints: no hint in
/// the 10 ms before) to the offline queue off the GPU (the next SUSPEND's return), in us. Requests
/// that needed no suspend (offline already held) are left out.
fn first_launch_to_suspended_us(hints: &[u64], audit: &[AuditRecord]) -> Vec<f64> {
    let suspends: Vec<(u64, u64)> = audit
        .iter()
        .filter_map(|a| match a {
            AuditRecord::Suspend(s) if !s.done().is_empty() => s.decision(),
            _ => None,
        })
        .filter_map(|d| Some((d.issued_ns?, d.returned_ns?)))
        .collect();
    let mut out = Vec::new();
    for (i, &b) in hints.iter().enumerate() {
        if i > 0 && b - hints[i - 1] < 10_000_000 {
            continue;
        }
        if let Some(&(_, ret)) = suspends
            .iter()
            .find(|&&(iss, _)| iss >= b && iss < b + 20_000_000)
        {
            out.push((ret - b) as f64 / 1e3);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

#[test]
fn launch_hints_trigger_the_suspend_sooner_than_sampling() {
    let _one = serial();
    let t = TempDir::new("hints");
    let d = t.0.display();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/resnet-online-offline.toml");
    let base = text(&example);
    assert!(
        !base.contains("launch_hints"),
        "the example relies on the default"
    );
    std::fs::write(t.path("on.toml"), &base).unwrap();
    std::fs::write(
        t.path("off.toml"),
        base.replacen("[policy]", "[policy]\nlaunch_hints = false", 1),
    )
    .unwrap();
    let secs = 30;
    // Sampling every 10 ms in both modes: polling that cheap leaves the suspend up to 10 ms late,
    // which is what launch hints are for. An observer traces the online process's launches in
    // both modes (the same uprobe cost in both); its hints mark when each request began.
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
for mode in off on; do
  $GP run --policy {d}/$mode.toml --sample-interval 10 --audit {d}/audit-$mode.jsonl \
    2>{d}/run-$mode.err & R=$!
  sleep 2
  $GP sim workload {ONLINE} --duration {secs} --report {d}/on-$mode.json 2>/dev/null & A=$!
  $GP trace --launches --pid $A --json --output {d}/hints-$mode.json 2>{d}/trace-$mode.err & T=$!
  $GP sim workload {OFFLINE} --duration {secs} --report {d}/off-$mode.json 2>/dev/null & B=$!
  wait $A $B
  kill -INT $T $R; wait $T; wait $R
done
"#
    );
    sim(&script, Duration::from_secs(2 * secs + 90));
    let mut summary = Vec::new();
    let mut med = Vec::new();
    for mode in ["off", "on"] {
        let on = json(&t.path(&format!("on-{mode}.json")));
        let pid = on["pid"].as_u64().unwrap();
        let hints: Vec<u64> = lines(&t.path(&format!("hints-{mode}.json")))
            .iter()
            .filter(|h| h["pid"] == pid)
            .filter_map(|h| h["ts_ns"].as_u64())
            .collect();
        let audit = audit_log(&t.path(&format!("audit-{mode}.jsonl")));
        let by_hint = audit
            .iter()
            .filter(|a| a.reason().contains("launch hint"))
            .count();
        let suspends = audit
            .iter()
            .filter(|a| matches!(a, AuditRecord::Suspend(_)))
            .count();
        let lead = first_launch_to_suspended_us(&hints, &audit);
        assert!(
            lead.len() >= 100,
            "{mode}: only {} requests measured",
            lead.len()
        );
        let m = lead[lead.len() / 2];
        let p90 = lead[lead.len() * 9 / 10];
        let p99 = on["latency"]["p99_ms"].as_f64().unwrap();
        let mean = on["latency"]["mean_ms"].as_f64().unwrap();
        summary.push(format!(
            "hints {mode}: online mean {mean:.2} ms p99 {p99:.2} ms; first launch -> offline \
             suspended p50 {m:.0} us p90 {p90:.0} us ({} requests); {suspends} suspends, \
             {by_hint} triggered by a launch hint",
            lead.len()
        ));
        med.push((m, p99, mean, by_hint, suspends));
        let err = text(&t.path(&format!("run-{mode}.err")));
        assert!(err.contains("nothing is left suspended"), "{err}");
    }
    println!(
        "emulated, {secs} s each, sampling every 10 ms:\n  {}",
        summary.join("\n  ")
    );
    let ((m_off, p99_off, mean_off, hint_off, _), (m_on, p99_on, mean_on, hint_on, sus_on)) =
        (med[0], med[1]);
    assert_eq!(hint_off, 0, "hints off: no hint-triggered suspend");
    assert!(
        hint_on * 2 >= sus_on,
        "hints on: most suspends come from a hint ({hint_on} of {sus_on})"
    );
    // Sooner, not by how much: the margin moves with the 2-vCPU host (0.52x in one CI run,
    // under 0.5x in others); `cargo xtask bench --control-only` measures it side by side.
    assert!(
        m_on < m_off,
        "the hint reacts sooner: p50 {m_on:.0} us with hints, {m_off:.0} us sampling"
    );
    // Online mean and p99 are printed, not asserted: on this 2-vCPU emulator they move with the
    // host (a CI run saw mean 4.60 vs 4.57 ms); `cargo xtask bench --control-only` measures them
    // side by side.
    let _ = (p99_off, mean_off, p99_on, mean_on);
    assert_nothing_left();
}

/// `run` in a private mount namespace that looks like an NVIDIA host without an AMD GPU (/dev is
/// a tmpfs with a stand-in nvidiactl; `driver` files, if any, under a tmpfs /proc/driver). Returns
/// (exit code, stderr).
fn run_on_stand_in_nvidia_host(t: &TempDir, driver: &[(&str, &str)]) -> (i32, String) {
    tests::require_root();
    let d = t.0.display();
    std::fs::write(
        t.path("p.toml"),
        "[policy]\nstrategy = \"priority\"\n[[rule]]\nclass = \"offline\"\ncomm = 'x'\n",
    )
    .unwrap();
    let mut files = String::new();
    for (path, text) in driver {
        let path = format!("/proc/driver/{path}");
        files += &format!("mkdir -p $(dirname {path}) && printf '%s' '{text}' > {path} && ");
    }
    let proc_driver = if driver.is_empty() {
        String::new()
    } else {
        format!("mount -t tmpfs none /proc/driver && {files}")
    };
    let script = format!(
        "mount -t tmpfs none /dev && : > /dev/nvidiactl && : > /dev/null && chmod 666 /dev/null && \
         {proc_driver} GPREEMPT_RUN_DIR={d}/run exec \"$0\" run --policy {d}/p.toml"
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(tests::bin("gpreempt-ebpf"))
        .output()
        .expect("unshare");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// On an NVIDIA host the controller proves it can pause before acting: without a usable driver
/// (here: none, then one without a CUDA library to start our own test process with) it refuses
/// to start, saying why, and leaves nothing behind.
#[test]
fn an_nvidia_host_that_fails_the_self_test_is_refused_with_the_reason() {
    let _one = serial();
    let t = TempDir::new("nvrefuse");
    let (rc, err) = run_on_stand_in_nvidia_host(&t, &[]);
    assert_ne!(rc, 0, "{err}");
    assert!(
        err.contains("the NVIDIA (RM) backend failed its self-test: refusing to control anything"),
        "{err}"
    );
    assert!(
        err.contains("nvidia-driver: /dev/nvidiactl exists but"),
        "{err}"
    );
    assert!(err.contains("modprobe nvidia"), "{err}");

    let version = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Jan  1 00:00:00 UTC 2026\n";
    let info =
        "Model: \t\t NVIDIA H100\nGPU Firmware: \t 580.159.04\nBus Location: \t 0000:00:06.0\n";
    let (rc, err) = run_on_stand_in_nvidia_host(
        &t,
        &[
            ("nvidia/version", version),
            ("nvidia/gpus/0000:00:06.0/information", info),
        ],
    );
    assert_ne!(rc, 0, "{err}");
    assert!(err.contains("failed its self-test"), "{err}");
    assert!(
        !err.contains("nvidia-driver:") && !err.contains("nvidia-gsp"),
        "the driver checks pass now: {err}"
    );
    assert!(err.contains("starting the self-test target"), "{err}");
    assert!(err.contains("libcuda.so.1"), "{err}");
    assert!(
        !tests_guardian_running(),
        "no guardian may outlive a refused controller"
    );
    assert_nothing_left();
}

fn tests_guardian_running() -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains("nv-guardian"))
            .unwrap_or(false)
    })
}

/// A machine where a controller died with SIGKILL (or lost power) keeps its files in
/// /run/gpreempt-ebpf: an unlocked lock naming it, a dead socket, its last status claiming
/// held queues, a targets record. None of it may pass for a live controller, the next one starts
/// over them, and its clean exit leaves the directory empty. At the default path, on a /run of
/// the test's own (sim's mount namespace is private).
#[test]
fn stale_run_files_are_not_a_controller_and_a_clean_exit_leaves_none() {
    let _one = serial();
    let t = TempDir::new("stalerun");
    let d = t.0.display();
    let script = format!(
        r#"set -e
unset GPREEMPT_RUN_DIR
mount -t tmpfs stale-run /run
R=/run/gpreempt-ebpf
mkdir -p $R
$GP sim workload {OFFLINE} --duration 30 2>{d}/off.err >/dev/null & W=$!
echo $W > {d}/w.pid
sleep 1.5
echo 999999 > $R/controller.lock
: > $R/control.sock
echo '{{"controller_pid":999999,"mode":"run","policy":null,"dry_run":false,"classes":{{}},"held":[['$W',0,null]],"fenced":[],"refused":{{}},"decisions":[]}}' > $R/status.json
echo '[{{"pid":999999,"start_time":1}}]' > $R/targets.json
$GP queues --json > {d}/q0.json
$GP doctor --json > {d}/doctor.json || true
$GP suspend --pid $W --for 2s > {d}/suspend.out 2>&1 || echo "suspend failed: $?" >> {d}/suspend.out
ls -A $R > {d}/left.txt
$GP queues --json > {d}/q1.json
kill -INT $W; wait $W || true
"#
    );
    sim(&script, Duration::from_secs(60));
    let w = num(&t.path("w.pid"));
    // The stale status is not believed: nothing holds the lock.
    let (state, hqd, _) = queue(&json(&t.path("q0.json")), w, 0);
    assert_eq!(state, "active");
    assert!(!hqd.is_null());
    let doctor = json(&t.path("doctor.json"));
    let line = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "controller")
        .expect("controller line")
        .clone();
    assert!(
        line["finding"]
            .as_str()
            .unwrap()
            .starts_with("no controller running (/run/gpreempt-ebpf not locked)"),
        "{line}"
    );
    // A new controller starts over the stale files and holds the queue.
    let out = text(&t.path("suspend.out"));
    assert!(
        out.contains(&format!("pid {w}: suspended queue(s) 0")),
        "{out}"
    );
    assert!(
        out.contains("--for elapsed: nothing is left suspended"),
        "{out}"
    );
    // Its clean exit removes lock, socket, status and the (empty) targets record.
    assert_eq!(
        text(&t.path("left.txt")).trim(),
        "",
        "left in /run/gpreempt-ebpf"
    );
    let (state, _, _) = queue(&json(&t.path("q1.json")), w, 0);
    assert_eq!(state, "active");
    assert_nothing_left();
}
