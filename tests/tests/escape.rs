//! Held offline jobs that get out of their hold by themselves, as root against the emulator:
//! amdkfd lets a process debug-trap itself without ptrace, so a held job can RESUME_QUEUES its
//! own queues, DISABLE the controller's debug session (the kernel resumes every queue) and
//! ENABLE one of its own. `run` sees each call through the eBPF observer, holds the job again
//! (taking the session back), and shows the escape as a state: status file, `queues --json`,
//! metrics, audit log. The job is `kfd-poke escape`: an offline workload on a second thread, and
//! DBG_TRAP calls on its own pid on request. Emulated.

use std::path::Path;
use std::time::Duration;

use gpreempt_user::controller::record::AuditRecord;
use serde_json::Value;
use tests::{assert_nothing_left, audit_log, bin, serial, sim, TempDir};

fn text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(p: &Path) -> Value {
    let s = text(p);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", p.display()))
}

/// The process `pid` in a `queues --json` document.
fn process(doc: &Value, pid: u64) -> Value {
    doc["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(pid)))
        .cloned()
        .unwrap_or_else(|| panic!("pid {pid} not in {doc:#}"))
}

const POLICY: &str = r#"[policy]
strategy = "priority"
window = "10ms"
resume_after = "3ms"
max_suspend = "30s"
min_run = "50ms"
min_interval = "10ms"
default = "ignore"

[[rule]]
class = "online"
comm = "resnet18_b1"
uid = 0

[[rule]]
class = "offline"
comm = "kfd-poke"
uid = 0
"#;

#[test]
fn a_held_job_that_resumes_disables_or_takes_over_its_debug_trap_is_held_again_and_shown() {
    let _one = serial();
    let t = TempDir::new("escape");
    let d = t.0.display();
    std::fs::write(t.path("p.toml"), POLICY).unwrap();
    let poke = bin("kfd-poke");
    let poke = poke.display();
    // Each step waits until the controller published the escape (or 10 s), then snapshots.
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
S=$GPREEMPT_RUN_DIR/status.json
$GP run --policy {d}/p.toml --audit {d}/audit.jsonl --metrics 127.0.0.1:0 2>{d}/run.err & R=$!
sleep 2
mkfifo {d}/cmd
{poke} /dev/kfd escape < {d}/cmd > {d}/poke.out 2>{d}/poke.err & P=$!
exec 3>{d}/cmd
echo $P > {d}/pid
$GP sim workload --profile resnet18_b1 --offline --priority 15 --duration 60 >/dev/null 2>&1 & A=$!
for i in $(seq 300); do grep -q "\[$P,0," $S 2>/dev/null && break; sleep 0.1; done
$GP queues --json > {d}/q0.json
echo resume >&3
for i in $(seq 100); do grep -q '"kind":"resumed"' $S 2>/dev/null && break; sleep 0.1; done
sleep 0.5
$GP queues --json > {d}/q-resume.json
echo disable >&3
for i in $(seq 100); do grep -q '"kind":"trap_disabled"' $S 2>/dev/null && break; sleep 0.1; done
sleep 0.5
$GP queues --json > {d}/q-disable.json
echo takeover >&3
for i in $(seq 100); do grep -q '"kind":"trap_taken"' $S 2>/dev/null && break; sleep 0.1; done
sleep 0.5
$GP queues --json > {d}/q-takeover.json
# The metrics page is rendered once a second.
sleep 1.5
cp $S {d}/status.json
ADDR=$(sed -n 's|.*metrics at http://\([^/]*\)/metrics.*|\1|p' {d}/run.err)
perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(shift) or die "connect: $!"; print $s "GET /metrics HTTP/1.0\r\n\r\n"; print while <$s>' $ADDR > {d}/metrics
exec 3>&-
wait $P || true
kill -INT $R; wait $R; echo $? > {d}/run.rc
kill -INT $A 2>/dev/null || true; wait $A || true
"#
    );
    sim(&script, Duration::from_secs(150));
    let err = text(&t.path("run.err"));
    let pid: u64 = text(&t.path("pid")).trim().parse().unwrap();
    let out = text(&t.path("poke.out"));
    let said = |op: &str| -> i64 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{op} ")))
            .and_then(|r| r.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {op} in {out}\n{}", text(&t.path("poke.err"))))
    };
    // The emulated kernel let it do all three to itself (no ptrace needed).
    assert!(said("resume") >= 0, "{out}");
    assert_eq!(said("disable"), 0, "{out}");
    assert_eq!(said("takeover"), 0, "{out}");

    let q0 = process(&json(&t.path("q0.json")), pid);
    assert!(
        q0.get("escaped").is_none(),
        "held, not escaped yet: {q0:#}\n{err}"
    );
    for (step, kind) in [
        ("resume", "resumed"),
        ("disable", "trap_disabled"),
        ("takeover", "trap_taken"),
    ] {
        let p = process(&json(&t.path(&format!("q-{step}.json"))), pid);
        assert_eq!(p["escaped"]["kind"], kind, "{step}: {p:#}\n{err}");
        // Held again: the working queue is suspended and off the (emulated) hardware.
        let q = p["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["queue_id"] == 0))
            .unwrap_or_else(|| panic!("{p:#}"));
        assert_eq!(q["state"], "suspended", "{step}: held again: {p:#}\n{err}");
        assert!(q["hqd"].is_null(), "{step}: no HQD while held: {q:#}");
    }
    // A state, not an event: still in the status file at the end, with every escape counted.
    let st = json(&t.path("status.json"));
    let e = &st["escaped"][pid.to_string()];
    assert_eq!(e["kind"], "trap_taken", "{st:#}");
    assert!(e["count"].as_u64().unwrap_or(0) >= 3, "{e:#}");
    assert!(
        e["answer"].as_str().unwrap_or("").contains("held again"),
        "{e:#}"
    );
    let m = text(&t.path("metrics"));
    assert!(
        m.lines()
            .any(|l| l == "gpreempt_processes_escaped{kind=\"trap_taken\"} 1"),
        "{m}"
    );
    assert!(
        m.lines().any(|l| l.starts_with("gpreempt_process_escapes{")
            && l.contains(&format!("pid=\"{pid}\""))
            && l.contains("kind=\"trap_taken\"")),
        "{m}"
    );
    // The audit log has each escape and the act that held it again.
    let audit = audit_log(&t.path("audit.jsonl"));
    let kinds: Vec<&str> = audit
        .iter()
        .filter_map(|r| match r {
            AuditRecord::Escape(e) if u64::from(e.pid) == pid => Some(e.kind.as_str()),
            _ => None,
        })
        .collect();
    for k in ["resumed", "trap_disabled", "trap_taken"] {
        assert!(kinds.contains(&k), "no {k} in {kinds:?}");
    }
    assert!(
        audit.iter().any(|r| matches!(r.as_act(), Some((true, a))
            if u64::from(a.pid()) == pid && a.reason().starts_with("held again"))),
        "no re-hold act in the audit log"
    );
    // Said, not flooded: at most one warning per kind here.
    let warnings = err
        .lines()
        .filter(|l| l.contains("escaped its hold"))
        .count();
    assert!((1..=3).contains(&warnings), "{warnings} warnings:\n{err}");
    assert_eq!(text(&t.path("run.rc")).trim(), "0", "{err}");
    assert_nothing_left();
}

/// Under `escape = "freeze"` a job that keeps resuming itself is frozen at its third escape: by
/// its cgroup's threaded domain, although its leader thread sits in a threaded child (freezing
/// the child alone left the working thread running). Thawing that cgroup behind the
/// controller's back (`cgroup.freeze` written 0) is an escape too: seen, frozen again, shown.
/// SIGINT of the controller thaws it and the job ends normally.
#[test]
fn a_job_that_keeps_escaping_is_frozen_by_its_domain_and_a_thaw_is_undone() {
    let _one = serial();
    let root = tests::cgroup2_root().expect("cgroup v2 is mounted");
    let t = TempDir::new("escape-freeze");
    let d = t.0.display();
    let policy = POLICY.replace(
        "default = \"ignore\"",
        "default = \"ignore\"\nescape = \"freeze\"",
    );
    std::fs::write(t.path("p.toml"), policy).unwrap();
    let poke = bin("kfd-poke");
    let poke = poke.display();
    let cg = format!("{root}/gpreempt-test-escape-{}", std::process::id());
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
S=$GPREEMPT_RUN_DIR/status.json
mkdir -p {cg}
$GP run --policy {d}/p.toml --audit {d}/audit.jsonl 2>{d}/run.err & R=$!
sleep 2
mkfifo {d}/cmd
sh -c 'echo $$ > {cg}/cgroup.procs; exec {poke} /dev/kfd escape' < {d}/cmd > {d}/poke.out 2>{d}/poke.err & P=$!
exec 3>{d}/cmd
echo $P > {d}/pid
for i in $(seq 100); do grep -q ready {d}/poke.out && break; sleep 0.1; done
# Its leader thread into a threaded child; the working thread stays in the domain.
mkdir {cg}/t
echo threaded > {cg}/t/cgroup.type
echo $P > {cg}/t/cgroup.threads
cat /proc/$P/cgroup > {d}/leader.cgroup
$GP sim workload --profile resnet18_b1 --offline --priority 15 --duration 60 >/dev/null 2>&1 & A=$!
for i in $(seq 300); do grep -q "\[$P,0," $S 2>/dev/null && break; sleep 0.1; done
# From the third escape on it is frozen; on a loaded machine two resumes may land in one
# hold (one escape), so it keeps escaping until the freeze shows.
for n in 1 2 3 4 5 6 7 8; do
  echo resume >&3
  for i in $(seq 50); do grep -q "\"count\":$n," $S 2>/dev/null && break; sleep 0.1; done
  sleep 0.3
  [ "$(cat {cg}/cgroup.freeze)" = 1 ] && break
done
sleep 0.5
cat {cg}/cgroup.freeze > {d}/freeze1
cat {cg}/t/cgroup.freeze > {d}/freeze1t
cp $S {d}/status1.json
# Thawed behind the controller's back.
echo 0 > {cg}/cgroup.freeze
for i in $(seq 100); do grep -q '"kind":"thawed"' $S 2>/dev/null && break; sleep 0.1; done
sleep 0.3
cat {cg}/cgroup.freeze > {d}/freeze2
cp $S {d}/status2.json
kill -INT $R; wait $R; echo $? > {d}/run.rc
cat {cg}/cgroup.freeze > {d}/freeze3
exec 3>&-
wait $P || true
kill -INT $A 2>/dev/null || true; wait $A || true
rmdir {cg}/t {cg}
"#
    );
    sim(&script, Duration::from_secs(150));
    let err = text(&t.path("run.err"));
    let pid = text(&t.path("pid")).trim().to_string();
    assert!(
        text(&t.path("leader.cgroup")).contains("/t"),
        "{}",
        text(&t.path("leader.cgroup"))
    );
    let st = json(&t.path("status1.json"));
    let e = &st["escaped"][&pid];
    assert_eq!(e["kind"], "resumed", "{st:#}\n{err}");
    assert!(e["count"].as_u64().unwrap_or(0) >= 3, "{e:#}");
    // Frozen by the threaded domain: the job's own cgroup, not the leader's threaded child.
    let cg = format!("gpreempt-test-escape-{}", std::process::id());
    let answer = e["answer"].as_str().unwrap_or_default();
    assert!(
        answer.contains("froze its cgroup") && answer.contains(&cg) && !answer.contains("/t"),
        "{answer}\n{err}"
    );
    assert_eq!(text(&t.path("freeze1")).trim(), "1", "{err}");
    // The thaw was seen, shown and undone.
    let st = json(&t.path("status2.json"));
    let e = &st["escaped"][&pid];
    assert_eq!(e["kind"], "thawed", "{st:#}\n{err}");
    assert_eq!(e["answer"], "frozen again", "{e:#}");
    assert_eq!(text(&t.path("freeze2")).trim(), "1", "frozen again\n{err}");
    // SIGINT thaws it.
    assert_eq!(text(&t.path("run.rc")).trim(), "0", "{err}");
    assert_eq!(
        text(&t.path("freeze3")).trim(),
        "0",
        "thawed at exit\n{err}"
    );
    let audit = audit_log(&t.path("audit.jsonl"));
    assert!(
        audit
            .iter()
            .any(|r| matches!(r, AuditRecord::Escape(e) if e.kind == "thawed")),
        "no thawed escape in the audit log"
    );
    assert_nothing_left();
}
