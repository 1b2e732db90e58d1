//! `queues` and `top` end to end inside `sim`, as root: real workloads create queues on the
//! emulated KFD; `queues --json` must agree with sysfs, debugfs and the workloads' own reports, and
//! `top` (driven in tmux) must show every workload queue with its HQD slot and state, then lose it
//! when the workload exits.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tests::{assert_nothing_left, serial, sim, TempDir};

fn json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", p.display()))
}

/// Compute HQD slots of a `hqds` dump: (gpu_id, "inst.pipe.queue") -> register values.
fn hqd_slots(text: &str) -> HashMap<(u64, String), Vec<u64>> {
    let mut out = HashMap::new();
    let mut gpu = 0;
    let mut cur: Option<(u64, String)> = None;
    for l in text.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("Node ") {
            let id = rest.split("gpu_id ").nth(1).unwrap().trim_end_matches(':');
            gpu = u64::from_str_radix(id, 16).unwrap();
            cur = None;
        } else if t.starts_with("Inst ") && t.contains("CP Pipe") {
            let n: Vec<u64> = t
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            let key = (gpu, format!("{}.{}.{}", n[0], n[1], n[2]));
            out.insert(key.clone(), Vec::new());
            cur = Some(key);
        } else if t.contains(": ") && cur.is_some() && t.as_bytes()[0].is_ascii_hexdigit() {
            let vals = t.split_once(": ").unwrap().1;
            out.get_mut(cur.as_ref().unwrap()).unwrap().extend(
                vals.split_whitespace()
                    .map(|v| u64::from_str_radix(v, 16).unwrap()),
            );
        } else {
            cur = None;
        }
    }
    out
}

const WORKLOADS: &str = r#"
$GP sim workload --profile resnet18_b1 --rate 40 --duration $DUR --priority 12 --report $T/online.json &
$GP sim workload --profile resnet50_b1024 --offline --duration $DUR --priority 2 --report $T/offline.json &
"#;

#[test]
fn queues_json_agrees_with_sysfs_debugfs_and_the_workloads() {
    let _one = serial();
    let tmp = TempDir::new("queues");
    let script = format!(
        r#"set -e
T={t}; DUR=4
{WORKLOADS}
sleep 2
$GP queues --json > $T/during.json
$GP queues > $T/during.txt
for d in /sys/class/kfd/kfd/proc/*/queues/*; do
  echo "$d $(cat $d/gpuid) $(cat $d/type) $(cat $d/size)"
done > $T/sysfs.txt
cat /sys/kernel/debug/kfd/hqds > $T/hqds.txt
wait
$GP queues --json > $T/after.json
"#,
        t = tmp.0.display()
    );
    sim(&script, Duration::from_secs(60));
    let during = json(&tmp.path("during.json"));
    let hqds = hqd_slots(&std::fs::read_to_string(tmp.path("hqds.txt")).unwrap());
    let sysfs = std::fs::read_to_string(tmp.path("sysfs.txt")).unwrap();
    let table = std::fs::read_to_string(tmp.path("during.txt")).unwrap();

    let gpus = during["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{during:#}");
    let active_slots = hqds.values().filter(|r| r[2] & 1 == 1).count() as u64;
    assert_eq!(gpus[0]["hqds_used"], active_slots, "{during:#}");
    assert_eq!(gpus[0]["hqds_total"], hqds.len() as u64);
    assert_eq!(gpus[0]["gfx_target"], "gfx90a");
    assert_eq!(gpus[0]["cu_count"], 104);

    for name in ["online", "offline"] {
        let rep = json(&tmp.path(&format!("{name}.json")));
        let pid = rep["pid"].as_u64().unwrap();
        let qid = rep["queue_id"].as_u64().unwrap();
        let p = during["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("{name} pid {pid} missing:\n{during:#}"));
        assert!(
            p["cmdline"].as_str().unwrap().contains("sim workload"),
            "{p:#}"
        );
        let qs = p["queues"].as_array().unwrap();
        assert_eq!(qs.len(), 1, "{p:#}");
        let q = &qs[0];
        assert_eq!(q["queue_id"], qid);
        assert_eq!(q["gpu_id"], rep["gpu_id"]);
        assert_eq!(q["state"], "active");
        // `queues` has no events: ring and pointers come from debugfs mqds.
        assert_eq!(q["source"], "sysfs");
        assert_eq!(q["pointers_from_mqds"], true);
        assert_eq!(q["type"], "compute_aql");
        for f in [
            "ring_base_address",
            "read_pointer_address",
            "write_pointer_address",
        ] {
            assert_eq!(q[f], rep[f], "{name} {f}: {q:#}");
        }
        assert_eq!(q["priority"], rep["queue_priority"]);
        // sysfs has the queue with this gpu and size.
        let line = format!("/proc/{pid}/queues/{qid} {}", rep["gpu_id"]);
        assert!(sysfs.contains(&line), "{line} not in sysfs:\n{sysfs}");
        assert!(
            sysfs.contains(&format!("{line} 0 {}", q["ring_size"])),
            "{sysfs}"
        );
        // The HQD the map names holds this ring in debugfs.
        let hqd = q["hqd"]
            .as_object()
            .unwrap_or_else(|| panic!("no HQD: {q:#}"));
        let slot = format!("{}.{}.{}", hqd["inst"], hqd["pipe"], hqd["queue"]);
        let regs = &hqds[&(rep["gpu_id"].as_u64().unwrap(), slot.clone())];
        let ring = rep["ring_base_address"].as_u64().unwrap();
        assert_eq!(regs[2] & 1, 1, "{slot} not active");
        assert_eq!(
            regs[8] | regs[9] << 32,
            ring >> 8,
            "{slot} holds another ring"
        );
        // Activity from the dispatch ids.
        assert_eq!(q["activity"]["status"], "valid", "{q:#}");
        assert!(
            q["activity"]["dispatches_per_s"].as_f64().unwrap() > 0.0,
            "{q:#}"
        );
        // The table shows the same row.
        let row = table
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{pid} ")))
            .unwrap_or_else(|| panic!("pid {pid} not in table:\n{table}"));
        assert!(row.contains(&slot) && row.contains("active"), "{row}");
    }
    let after = json(&tmp.path("after.json"));
    assert_eq!(after["processes"].as_array().unwrap().len(), 0, "{after:#}");
    assert_eq!(after["gpus"][0]["hqds_used"], 0, "{after:#}");
    drop(tmp);
    assert_nothing_left();
}

/// `top` in a tmux pane inside sim; captures are written while the workloads run and after.
#[test]
fn top_shows_workload_queues_with_hqd_slots_then_loses_them() {
    let _one = serial();
    let tmp = TempDir::new("top");
    let script = format!(
        r#"set -e
T={t}; DUR=5
export TERM=xterm-256color
# A socket of its own: a tmux server an earlier run left behind is never reused.
S="tmux -S $T/tmux.sock"
$S new-session -d -x 120 -y 50 "$GP top --interval 100 --hqd-interval 200 --sample-interval 200 2>$T/top.err; echo TOP_EXIT=\$?; sleep 30"
i=0; until $S capture-pane -p | grep -q "GPU "; do i=$((i+1)); [ $i -lt 100 ] || {{ $S capture-pane -p; cat $T/top.err; exit 1; }}; sleep 0.1; done
{WORKLOADS}
sleep 2.5
$GP queues --json > $T/queues.json
sleep 0.5
$S capture-pane -p > $T/during.txt
# The offline queue's detail pane (its backlog keeps packets pending at 200 ms samples): its
# dispatch mix.
$S send-keys /; $S send-keys -l resnet50; $S send-keys Enter; sleep 0.3
$S send-keys Down; sleep 0.3; $S send-keys Enter; sleep 0.8
$S capture-pane -p > $T/detail.txt
$S send-keys Enter; $S send-keys /; $S send-keys C-u; $S send-keys Enter
wait
sleep 5
$S capture-pane -p > $T/after.txt
$S send-keys q
i=0; until $S capture-pane -p | grep -q TOP_EXIT; do i=$((i+1)); [ $i -lt 50 ] || exit 1; sleep 0.1; done
$S capture-pane -p > $T/exit.txt
# Ctrl-C (a key in raw mode) and SIGTERM end it the same way.
for how in ctrlc term; do
  $S new-window -n $how "$GP top 2>>$T/top.err; echo EXIT_$how=\$?; sleep 30"
  i=0; until $S capture-pane -p -t :$how | grep -q "GPU "; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done
  if [ $how = ctrlc ]; then $S send-keys -t :$how C-c; else pkill -TERM -f "^$GP top\$"; fi
  i=0; until $S capture-pane -p -t :$how | grep -q EXIT_$how; do i=$((i+1)); [ $i -lt 50 ] || exit 1; sleep 0.1; done
  $S capture-pane -p -t :$how > $T/exit_$how.txt
done
$S kill-server
"#,
        t = tmp.0.display()
    );
    sim(&script, Duration::from_secs(90));
    let during = std::fs::read_to_string(tmp.path("during.txt")).unwrap();
    let after = std::fs::read_to_string(tmp.path("after.txt")).unwrap();
    // The process table: everything above the event log pane.
    let table_of = |screen: &str| -> String {
        screen
            .lines()
            .take_while(|l| !l.contains(" events "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let after_table = table_of(&after);
    assert!(
        during.contains("[emulated GPU]"),
        "title labels the GPU:\n{during}"
    );
    assert!(after_table.contains("no KFD processes"), "{after}");
    assert!(
        after.contains("exit"),
        "the event log shows the exits:\n{after}"
    );
    let exit = std::fs::read_to_string(tmp.path("exit.txt")).unwrap();
    let queues = json(&tmp.path("queues.json"));
    for name in ["online", "offline"] {
        let rep = json(&tmp.path(&format!("{name}.json")));
        let pid = rep["pid"].as_u64().unwrap();
        let qid = rep["queue_id"].as_u64().unwrap();
        let q = queues["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["queues"][0].clone())
            .unwrap_or_else(|| panic!("{pid} not in queues:\n{queues:#}"));
        let hqd = &q["hqd"];
        let slot = format!("{}.{}.{}", hqd["inst"], hqd["pipe"], hqd["queue"]);
        // The process row, then its queue row with the same HQD slot and state.
        let lines: Vec<&str> = during.lines().collect();
        let at = lines
            .iter()
            .position(|l| {
                l.contains(&format!(" {pid} ")) || l.trim_start().starts_with(&pid.to_string())
            })
            .unwrap_or_else(|| panic!("pid {pid} not shown:\n{during}"));
        let qrow = lines[at + 1..]
            .iter()
            .find(|l| l.contains(&slot))
            .unwrap_or_else(|| panic!("queue {qid} of {pid} with HQD {slot} not shown:\n{during}"));
        assert!(qrow.contains("active"), "{qrow}");
        assert!(qrow.contains(&format!(" {qid} ")), "queue id {qid}: {qrow}");
        assert!(
            !after_table.contains(&pid.to_string()),
            "pid {pid} still shown:\n{after}"
        );
    }
    assert!(
        during.contains("create"),
        "event log shows creates:\n{during}"
    );
    // The detail pane of a live queue shows its dispatch mix, with kernels named as in the
    // timeline its workload replays (cut to the pane's width).
    let detail = std::fs::read_to_string(tmp.path("detail.txt")).unwrap();
    assert!(
        detail.contains("decoded of") && detail.contains("grid items"),
        "no dispatch mix in the detail pane:\n{detail}"
    );
    assert!(detail.contains("(resnet50_b1024)"), "{detail}");
    let names: Vec<String> = gpreempt_sim::workload::profile("resnet50_b1024")
        .unwrap()
        .kernels
        .into_iter()
        .map(|k| k.name)
        .collect();
    let kernel_lines: Vec<&str> = detail
        .lines()
        .filter(|l| l.trim_start().starts_with("kernel "))
        .collect();
    assert!(!kernel_lines.is_empty(), "{detail}");
    for l in &kernel_lines {
        // `kernel  12.5%  grid AxBxC wg AxBxC  NAME`
        let name = l.split("  ").last().unwrap().trim_end_matches(['│', ' ']);
        assert!(
            name.len() >= 8 && names.iter().any(|n| n.starts_with(name)),
            "{name:?} is no kernel of the workloads:\n{detail}"
        );
    }
    let offline_pid = json(&tmp.path("offline.json"))["pid"].clone();
    for p in queues["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == offline_pid)
    {
        let mix = &p["queues"][0]["activity"]["dispatches"];
        assert!(mix["decoded"].as_u64() > Some(0), "{mix}");
        assert!(
            mix["kernels"]
                .as_object()
                .unwrap()
                .values()
                .any(|k| k["name"]
                    .as_str()
                    .is_some_and(|n| names.iter().any(|m| m == n))),
            "queues --json names no kernel: {mix}"
        );
    }
    assert!(
        exit.contains("TOP_EXIT=0"),
        "top did not exit cleanly on q:\n{exit}"
    );
    // The terminal was restored: the TUI's header is gone from the pane.
    assert!(!exit.contains("HQD"), "{exit}");
    drop(tmp);
    assert_nothing_left();
}

/// On a host without the KFD (this machine, outside `sim`), both commands fail with one sentence
/// that says what is missing; `top` without privileges says to use sudo.
#[test]
fn without_a_kfd_or_root_the_errors_say_what_to_do() {
    let gp = tests::bin("gpreempt-ebpf");
    assert!(
        !Path::new("/sys/class/kfd/kfd").exists(),
        "this test expects a host without amdgpu"
    );
    for cmd in [&["queues"][..], &["queues", "--json"], &["top"]] {
        let out = std::process::Command::new(&gp).args(cmd).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{cmd:?}: {err}");
        assert!(
            err.contains("/sys/class/kfd/kfd/topology/nodes (is amdgpu loaded"),
            "{cmd:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{cmd:?}");
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&gp)
        .arg("top")
        .output()
        .expect("setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root") && err.contains("sudo"), "{err}");
}

/// The demo (`sim` with no command: workloads, `run` and `top`) as a newcomer runs it: `q` ends
/// it, the controller is stopped cleanly (SIGTERM, not killed) and leaves its run directory
/// empty, and no sim process or directory remains.
#[test]
fn quitting_the_demo_leaves_an_empty_run_directory() {
    let _one = serial();
    tests::require_root();
    let t = TempDir::new("demo");
    let d = t.0.display();
    let gp = tests::bin("gpreempt-ebpf");
    let sock = t.path("tmux.sock");
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(&sock)
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("tmux")
    };
    let cmd = format!(
        "GPREEMPT_RUN_DIR={d}/run {} sim 2>{d}/sim.err; echo DEMO_EXIT=$? > {d}/rc; sleep 30",
        gp.display()
    );
    assert!(tmux(&["new-session", "-d", "-x", "150", "-y", "40", &cmd])
        .status
        .success());
    // The controller holds the offline queue at some point: the demo is running.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut screen = String::new();
    while std::time::Instant::now() < deadline && !screen.contains("suspended by pid") {
        std::thread::sleep(Duration::from_millis(200));
        screen = String::from_utf8_lossy(&tmux(&["capture-pane", "-p"]).stdout).into_owned();
    }
    assert!(screen.contains("resnet50_b1024"), "{screen}");
    assert!(screen.contains("suspended by pid"), "{screen}");
    tmux(&["send-keys", "q"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline && !t.path("rc").exists() {
        std::thread::sleep(Duration::from_millis(100));
    }
    tmux(&["kill-server"]);
    let rc = std::fs::read_to_string(t.path("rc")).unwrap_or_default();
    assert_eq!(
        rc.trim(),
        "DEMO_EXIT=0",
        "{}",
        std::fs::read_to_string(t.path("sim.err")).unwrap_or_default()
    );
    let left: Vec<String> = std::fs::read_dir(t.path("run"))
        .map(|r| {
            r.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the run directory: {left:?}");
    assert_nothing_left();
}
