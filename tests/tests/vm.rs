//! The VM tier (root): Debian's distribution kernels with the real amdgpu module, booted under
//! QEMU with TCG by virtme-ng over this machine's root file system (`cargo xtask vm-setup`, run
//! by `cargo xtask test`, prepares them and lists them in .tools/vm/kernels.txt). There is no
//! GPU: amdkfd loads with a CPU-only topology, and every ioctl's dispatch, argument checks and
//! return values are the real kernel's. One boot per kernel runs every step; the host asserts.
//!
//! Not skipped when something is missing: a kernel list that cannot be read fails loudly.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{bin, require_root, serial, sim, TempDir};

struct Kernel {
    version: String,
    vmlinuz: PathBuf,
    /// The Debian package version, and whether it is the pinned one (kernels.txt).
    debian: String,
}

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/vm")
}

fn kernel(series: &str) -> Kernel {
    let list = tools().join("kernels.txt");
    let text = std::fs::read_to_string(&list).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: the VM tier is not prepared (sudo -E cargo xtask vm-setup)",
            list.display()
        )
    });
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[0].starts_with(&format!("{series}.")))
        .map(|f| Kernel {
            version: f[0].to_string(),
            vmlinuz: PathBuf::from(f[1]),
            debian: format!("{} ({})", f[2], f[3]),
        })
        .unwrap_or_else(|| {
            panic!(
                "no Linux {series} kernel in {} (re-run `cargo xtask vm-setup`):\n{text}",
                list.display()
            )
        })
}

/// Boots `k` and runs `script` (sh) inside with $O (a directory shared with the host, writable)
/// and $B (the built binaries). Returns $O.
fn boot(k: &Kernel, t: &TempDir, script: &str) -> PathBuf {
    let out = t.0.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let body = format!(
        "O={o}\nB={b}\n{script}\n",
        o = out.display(),
        b = bin("gpreempt-ebpf").parent().unwrap().display()
    );
    std::fs::write(out.join("script.sh"), body).unwrap();
    let venv = tools().join("venv/bin");
    let path = format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let exec = format!(
        "sh {o}/script.sh > {o}/log 2>&1; echo $? > {o}/rc",
        o = out.display()
    );
    let mut child = Command::new(venv.join("vng"))
        .arg("--run")
        .arg(&k.vmlinuz)
        .args([
            "--disable-kvm",
            "--force-9p",
            "--memory",
            "2G",
            "--cpus",
            "2",
            "--rwdir",
        ])
        .arg(&out)
        .args(["--exec", &exec])
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting vng (virtme-ng)");
    // A TCG boot takes about three minutes alone; beside the kernel lane's tests (lanes.rs) it
    // gets half the CPU or less. The limit only catches a hung guest.
    let deadline = Instant::now() + Duration::from_secs(1200);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("Linux {} did not finish within 1200 s", k.version);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let err = child.wait_with_output().unwrap().stderr;
    let rc = std::fs::read_to_string(out.join("rc")).unwrap_or_else(|_| {
        panic!(
            "Linux {}: the script did not run (vng: {})",
            k.version,
            String::from_utf8_lossy(&err)
        )
    });
    let log = std::fs::read_to_string(out.join("log")).unwrap_or_default();
    assert_eq!(rc.trim(), "0", "Linux {}: script failed:\n{log}", k.version);
    out
}

/// Everything one boot does: load amdgpu, `doctor --json`; `trace` with the default KFD source
/// (the fentry/fexit pair on kfd_ioctl), again with the kprobe pair and with the syscall
/// tracepoints while kfd-poke runs its script on the real /dev/kfd (type 'K', then 'X') and on
/// /dev/null; each source timed; the
/// controller's life cycle on a KFD process without queues (`suspend`, `run`, a second debugger,
/// the debugger killed, `suspend` again) under a trace; the differential sequence.
const STEPS: &str = r#"set -ex
modprobe amdgpu
test -c /dev/kfd
stat -c '%t:%T' /dev/kfd > $O/kfd-rdev
cat /sys/class/kfd/kfd/topology/nodes/0/properties > $O/node0
$B/gpreempt-ebpf doctor --json > $O/doctor.json || true
traced() { # $1: output name, $2...: global options
  n=$1; shift
  $B/gpreempt-ebpf "$@" trace --json --output $O/$n.jsonl 2> $O/$n.err & T=$!
  for i in $(seq 300); do grep -q "tracing KFD" $O/$n.err && break; sleep 0.2; done
  echo go | $B/kfd-poke /dev/kfd script > /dev/null & P1=$!; wait $P1; echo $P1 > $O/$n.pid-k
  echo go | $B/kfd-poke /dev/kfd script-x > /dev/null & P2=$!; wait $P2; echo $P2 > $O/$n.pid-x
  echo go | $B/kfd-poke /dev/null script > /dev/null & P3=$!; wait $P3; echo $P3 > $O/$n.pid-null
  sleep 1
  kill -INT $T; wait $T
}
traced trace
traced trace-kp --ioctl-source kprobe
traced trace-tp --ioctl-source tracepoint
for src in none tracepoint kprobe fentry; do
  if [ $src != none ]; then
    $B/gpreempt-ebpf --ioctl-source $src trace --output /dev/null 2> $O/bench.err & T=$!
    for i in $(seq 300); do grep -q "tracing KFD" $O/bench.err && break; sleep 0.2; done
  fi
  echo "$src other $(echo go | $B/kfd-poke /dev/null bench 200000 other | grep ns_per)" >> $O/bench
  echo "$src kfd $(echo go | $B/kfd-poke /dev/kfd bench 200000 kfd | grep ns_per)" >> $O/bench
  if [ $src != none ]; then kill -INT $T; wait $T; fi
done
cat > $O/policy.toml <<'P'
[policy]
strategy = "priority"
default = "ignore"
[[rule]]
class = "online"
comm = "no-such-service"
uid = 0
[[rule]]
class = "offline"
comm = "kfd-poke"
uid = 0
P
(echo go; sleep 120) | $B/kfd-poke /dev/kfd script > /dev/null &
sleep 1; P=$(pgrep -n kfd-poke); echo $P > $O/target
$B/gpreempt-ebpf trace --json --output $O/life.jsonl 2> $O/life.err & T=$!
for i in $(seq 300); do grep -q "tracing KFD" $O/life.err && break; sleep 0.2; done
rc=0; $B/gpreempt-ebpf suspend --pid $P --for 1s > $O/suspend1.out 2>&1 || rc=$?; echo $rc > $O/suspend1.rc
grep TracerPid /proc/$P/status > $O/tracer1
$B/gpreempt-ebpf run --policy $O/policy.toml > $O/run.out 2>&1 & R=$!; echo $R > $O/run.pid
for i in $(seq 150); do grep -q "^TracerPid:[[:space:]]*[1-9]" /proc/$P/status && break; grep -q "debug API" $O/run.out && break; sleep 0.2; done
grep TracerPid /proc/$P/status > $O/tracer2
echo go | $B/kfd-poke /dev/kfd intrude $P > $O/intrude.txt 2>&1
kill -9 $R 2>/dev/null || true; rc=0; wait $R || rc=$?; echo $rc > $O/run.rc
sleep 1
grep TracerPid /proc/$P/status > $O/tracer3
rc=0; $B/gpreempt-ebpf suspend --pid $P --for 1s > $O/suspend2.out 2>&1 || rc=$?; echo $rc > $O/suspend2.rc
kill -0 $P; echo alive > $O/target-alive
sleep 1; kill -INT $T; wait $T
echo go | $B/kfd-poke /dev/kfd diff > $O/diff.txt 2>&1
dmesg > $O/dmesg
"#;

fn read(out: &Path, f: &str) -> String {
    std::fs::read_to_string(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

fn checks(out: &Path) -> HashMap<String, Value> {
    let doc: Value = serde_json::from_str(&read(out, "doctor.json")).unwrap();
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c.clone()))
        .collect()
}

/// `(verdict, finding)` of a doctor line.
fn line<'a>(c: &'a HashMap<String, Value>, name: &str) -> (&'a str, &'a str) {
    let v = c
        .get(name)
        .unwrap_or_else(|| panic!("no doctor line {name}: {:?}", c.keys()));
    (
        v["verdict"].as_str().unwrap(),
        v["finding"].as_str().unwrap(),
    )
}

fn run_tier(series: &str, debug_api: bool) {
    let _one = serial();
    require_root();
    let k = kernel(series);
    let t = TempDir::new(&format!("vm-{series}"));
    // The boot's outputs stay in target/vm-SERIES for inspection; GPREEMPT_VM_REUSE=1 asserts
    // on them again without booting (while changing the assertions only).
    let kept = bin("gpreempt-ebpf")
        .parent()
        .unwrap()
        .join(format!("../vm-{series}"));
    let out = if std::env::var_os("GPREEMPT_VM_REUSE").is_some() {
        kept
    } else {
        let out = boot(&k, &t, STEPS);
        let _ = std::fs::remove_dir_all(&kept);
        let _ = Command::new("cp").arg("-r").arg(&out).arg(&kept).status();
        out
    };
    let v = &k.version;
    println!("Linux {v}: Debian package version {}", k.debian);

    // doctor on the real kernel: kprobes, module BTF, every program through this verifier, and
    // the ioctl filter by the real /dev/kfd's major.
    let c = checks(&out);
    for ok in [
        "kprobes",
        "btf",
        "btf-amdgpu",
        "tracefs",
        "ebpf-programs",
        "ioctl-filter",
    ] {
        assert_eq!(line(&c, ok).0, "ok", "Linux {v}: {ok}: {}", line(&c, ok).1);
    }
    let rdev = read(&out, "kfd-rdev");
    let major = u32::from_str_radix(rdev.trim().split(':').next().unwrap(), 16).unwrap();
    assert!(
        line(&c, "ioctl-filter")
            .1
            .contains(&format!("KFD (by the kfd_ioctl pair) major {major}")),
        "Linux {v}: {}",
        line(&c, "ioctl-filter").1
    );
    assert_eq!(line(&c, "probe:kfd_ioctl").0, "ok", "Linux {v}");
    // Every kernel-internal probe attaches, except (before the debug API, Linux 6.4) the
    // debug-trap functions that do not exist yet, which say so.
    let probes: Vec<(&String, &str)> = c
        .iter()
        .filter(|(n, _)| n.starts_with("probe:"))
        .map(|(n, p)| (n, p["finding"].as_str().unwrap()))
        .collect();
    assert_eq!(probes.len(), 14, "Linux {v}: {probes:?}");
    for (name, f) in probes {
        let absent = [
            "probe:suspend_queues",
            "probe:resume_queues",
            "probe:kfd_dbg_ev_raise",
        ];
        if !debug_api && absent.contains(&name.as_str()) {
            assert!(
                f.starts_with("not attachable: ") && f.contains("not in /proc/kallsyms"),
                "Linux {v}: {name}: {f}"
            );
        } else {
            assert!(f.starts_with("attachable"), "Linux {v}: {name}: {f}");
        }
    }
    // Every field a probe or the filter needs, from the real amdgpu BTF (6.1 names the device
    // struct kfd_dev, 6.5+ kfd_node); KFD ioctls from the fentry/fexit pair, loaded against the
    // module's BTF; every tracing program verified against kfd_ioctl there.
    assert_eq!(
        line(&c, "btf-offsets").0,
        "ok",
        "Linux {v}: {:?}",
        line(&c, "btf-offsets")
    );
    assert!(
        line(&c, "ioctl-source").1.starts_with(
            "KFD ioctls from an fentry + fexit pair on kfd_ioctl (BPF trampolines, amdgpu BTF)"
        ),
        "Linux {v}: {:?}",
        line(&c, "ioctl-source")
    );
    let programs = line(&c, "ebpf-programs").1;
    for p in ["fe_kfd_ioctl", "kfd_ioctl_fentry", "kfd_ioctl_fexit"] {
        assert!(
            programs.contains(&format!("{p}: verified against kfd_ioctl in amdgpu BTF")),
            "Linux {v}: {programs}"
        );
    }
    assert!(
        line(&c, "probe:kfd_ioctl")
            .1
            .starts_with("attachable (fentry)"),
        "Linux {v}: {:?}",
        line(&c, "probe:kfd_ioctl")
    );
    let (kfd_verdict, kfd) = line(&c, "kfd");
    assert_eq!(kfd_verdict, "fail", "no GPU here: {kfd}");
    assert!(
        kfd.contains("the topology lists no GPU"),
        "Linux {v}: {kfd}"
    );
    if debug_api {
        assert!(kfd.contains("(debug API present)"), "Linux {v}: {kfd}");
    } else {
        assert!(
            kfd.contains("the debug API needs KFD 1.13"),
            "Linux {v}: {kfd}"
        );
    }

    // trace on the real character device, from each KFD source.
    let fe = traced(&out, "trace", v);
    let kp = traced(&out, "trace-kp", v);
    let tp = traced(&out, "trace-tp", v);
    let err = read(&out, "trace.err");
    assert!(
        err.contains("KFD ioctls from fentry/fexit kfd_ioctl (no other ioctl runs a program)"),
        "Linux {v}: {err}"
    );
    let err_kp = read(&out, "trace-kp.err");
    assert!(
        err_kp.contains("KFD ioctls from kprobe kfd_ioctl (no other ioctl runs a program)"),
        "Linux {v}: {err_kp}"
    );
    let err_tp = read(&out, "trace-tp.err");
    assert!(
        err_tp.contains("ioctls from syscall tracepoints by device"),
        "Linux {v}: {err_tp}"
    );
    // Without the debug API (KFD < 1.13) DBG_TRAP and RUNTIME_ENABLE are beyond the command
    // table: ENOTTY. With it, DBG_TRAP on a pid that does not exist is ESRCH.
    let (dbg_ret, rt_ret) = if debug_api { (-3, 0) } else { (-25, -25) };
    let want: Vec<(String, i64)> = [
        ("create_queue", -22),
        ("create_queue", -22),
        ("destroy_queue", -22),
        ("dbg_trap", dbg_ret),
        // FIONREAD on a character device is not the VFS's: amdkfd takes it by nr (0x1b).
        ("get_queue_wave_state", -14),
        ("runtime_enable", rt_ret),
    ]
    .iter()
    .map(|(n, r)| (n.to_string(), *r))
    .collect();
    for (name, t) in [
        ("fentry pair", &fe),
        ("kprobe pair", &kp),
        ("tracepoints", &tp),
    ] {
        // amdkfd saw every call with a KFD nr or not (kfd_ioctl fired for each), whatever its
        // type byte: create_queue twice, destroy_queue, dbg_trap, FIONREAD, the out-of-range
        // 'K', and runtime_enable.
        assert_eq!(
            t.hits_k.len(),
            7,
            "Linux {v} {name}: kfd_ioctl hits {:x?}",
            t.hits_k
        );
        assert_eq!(
            t.hits_x.len(),
            7,
            "Linux {v} {name}: kfd_ioctl hits {:x?}",
            t.hits_x
        );
        assert!(
            t.hits_k
                .iter()
                .zip(&t.hits_x)
                .all(|(k, x)| k & 0xff == x & 0xff),
            "Linux {v} {name}: same nrs: {:x?} {:x?}",
            t.hits_k,
            t.hits_x
        );
        assert_eq!((t.hits_x[0] >> 8) & 0xff, u64::from(b'X'), "Linux {v}");
        let calls = |c: &[Value]| -> Vec<(String, i64)> {
            c.iter()
                .map(|e| {
                    (
                        e["event"].as_str().unwrap().to_string(),
                        e["ret"].as_i64().unwrap(),
                    )
                })
                .collect()
        };
        assert_eq!(calls(&t.calls_k), want, "Linux {v} {name}: 'K' calls");
        assert_eq!(
            calls(&t.calls_x),
            want,
            "Linux {v} {name}: 'X' calls (the kernel dispatches by nr)"
        );
        assert!(
            t.null_seen == 0,
            "Linux {v} {name}: /dev/null calls reported"
        );
        assert_eq!(
            t.other_kernel, 0,
            "Linux {v} {name}: kernel probes beyond kfd_ioctl fired"
        );
    }
    // The three sources decode to the same events, field for field (but the fd: the pairs see
    // the file, not the number; and the stack addresses of separate runs).
    let strip = |e: &Value| {
        let mut e = e.clone();
        let o = e.as_object_mut().unwrap();
        for k in ["ts_ns", "pid", "tid", "duration_ns", "fd", "arg"] {
            o.remove(k);
        }
        o.retain(|k, _| !k.ends_with("_ptr"));
        e
    };
    let f: Vec<Value> = fe.calls_k.iter().chain(&fe.calls_x).map(strip).collect();
    let a: Vec<Value> = kp.calls_k.iter().chain(&kp.calls_x).map(strip).collect();
    let b: Vec<Value> = tp.calls_k.iter().chain(&tp.calls_x).map(strip).collect();
    assert_eq!(
        a, b,
        "Linux {v}: the kprobe pair and the tracepoints disagree"
    );
    assert_eq!(
        f, b,
        "Linux {v}: the fentry pair and the tracepoints disagree"
    );
    // /dev/null: the tracepoints drop the 'K' calls in the kernel and count them; with either
    // pair they never run a program at all.
    assert!(
        err_tp.contains("dropped_other_file=5"),
        "Linux {v}: {err_tp}"
    );
    assert!(err.contains("dropped_other_file=0"), "Linux {v}: {err}");
    assert!(
        err_kp.contains("dropped_other_file=0"),
        "Linux {v}: {err_kp}"
    );
    let bench = read(&out, "bench");
    let ns = |src: &str, kind: &str| -> f64 {
        bench
            .lines()
            .find(|l| l.starts_with(&format!("{src} {kind} ")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("Linux {v}: no {src} {kind} figure in {bench}"))
    };
    println!(
        "Linux {v} (TCG: ratios only): per ioctl, relative to no tracing: other files {:.2}x with \
         the tracepoints, {:.2}x with the kprobe pair, {:.2}x with the fentry pair; KFD {:.2}x / \
         {:.2}x / {:.2}x",
        ns("tracepoint", "other") / ns("none", "other"),
        ns("kprobe", "other") / ns("none", "other"),
        ns("fentry", "other") / ns("none", "other"),
        ns("tracepoint", "kfd") / ns("none", "kfd"),
        ns("kprobe", "kfd") / ns("none", "kfd"),
        ns("fentry", "kfd") / ns("none", "kfd"),
    );

    lifecycle(&out, v, debug_api);
}

/// One trace run's records (see STEPS' `traced`).
struct Traced {
    hits_k: Vec<u64>,
    hits_x: Vec<u64>,
    calls_k: Vec<Value>,
    calls_x: Vec<Value>,
    null_seen: usize,
    /// Kernel-probe events other than kfd_ioctl (the ioctls here create no queue: none).
    other_kernel: usize,
}

fn traced(out: &Path, name: &str, v: &str) -> Traced {
    let events: Vec<Value> = read(out, &format!("{name}.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pid = |f: &str| {
        read(out, &format!("{name}.{f}"))
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let (pk, px, pnull) = (pid("pid-k"), pid("pid-x"), pid("pid-null"));
    let of = |p: u64, kprobe: bool| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["pid"] == p && e["event"] != "process_exit")
            .filter(|e| (e["source"] == "kprobe") == kprobe)
            .cloned()
            .collect()
    };
    let hits = |p: u64| -> Vec<u64> {
        of(p, true)
            .iter()
            .filter(|e| e["event"] == "kfd_ioctl")
            .map(|e| e["cmd"].as_u64().unwrap())
            .collect()
    };
    let t = Traced {
        hits_k: hits(pk),
        hits_x: hits(px),
        calls_k: of(pk, false),
        calls_x: of(px, false),
        null_seen: events.iter().filter(|e| e["pid"] == pnull).count(),
        other_kernel: events
            .iter()
            .filter(|e| e["source"] == "kprobe" && e["event"] != "kfd_ioctl")
            .count(),
    };
    assert!(!t.calls_k.is_empty(), "Linux {v} {name}: no records");
    t
}

/// The controller on the real kernel, on a KFD process without queues.
fn lifecycle(out: &Path, v: &str, debug_api: bool) {
    let rc = |f: &str| read(out, f).trim().parse::<i32>().unwrap();
    let tracer = |f: &str| read(out, f).split_whitespace().nth(1).unwrap().to_string();
    let s1 = read(out, "suspend1.out");
    let target: u64 = read(out, "target").trim().parse().unwrap();
    assert_eq!(read(out, "target-alive").trim(), "alive", "Linux {v}");
    assert_eq!(tracer("tracer1"), "0", "Linux {v}: left traced");
    assert_eq!(tracer("tracer3"), "0", "Linux {v}: left traced");
    if !debug_api {
        // KFD 1.11: `suspend` and `run` refuse, naming the missing debug API.
        assert_eq!(rc("suspend1.rc"), 1, "Linux {v}: {s1}");
        assert!(s1.contains("1.13"), "Linux {v}: {s1}");
        let run = read(out, "run.out");
        assert!(run.contains("1.13"), "Linux {v}: {run}");
        return;
    }
    // KFD 1.17: seize, ENABLE, the runtime event, snapshots, nothing to suspend, DISABLE,
    // detach; `suspend` then says there is nothing to hold.
    assert_eq!(rc("suspend1.rc"), 1, "Linux {v}: {s1}");
    assert!(s1.contains("no queues"), "Linux {v}: {s1}");
    let life: Vec<Value> = read(out, "life.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["event"] == "dbg_trap")
        .collect();
    let run_pid: u64 = read(out, "run.pid").trim().parse().unwrap();
    // Controllers in order of their first call: suspend, run, the intruder, suspend again.
    let mut pids: Vec<u64> = Vec::new();
    for e in &life {
        let p = e["pid"].as_u64().unwrap();
        if !pids.contains(&p) {
            pids.push(p);
        }
    }
    assert_eq!(pids.len(), 4, "Linux {v}: {life:#?}");
    assert_eq!(pids[1], run_pid, "Linux {v}");
    let ops = |p: u64| -> Vec<(String, i64)> {
        life.iter()
            .filter(|e| e["pid"] == p)
            .map(|e| {
                (
                    e["op"].as_str().unwrap().to_string(),
                    e["ret"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    for p in [pids[0], pids[3]] {
        let o = ops(p);
        assert_eq!(
            o.first().map(|x| x.0.as_str()),
            Some("enable"),
            "Linux {v}: {o:?}"
        );
        assert_eq!(
            o.last().map(|x| x.0.as_str()),
            Some("disable"),
            "Linux {v}: {o:?}"
        );
        assert!(o.iter().all(|x| x.1 == 0), "Linux {v}: {o:?}");
        assert!(
            o.iter().any(|x| x.0 == "get_queue_snapshot"),
            "Linux {v}: {o:?}"
        );
    }
    // The target enabled its runtime before any controller came: each one acknowledges
    // EC_PROCESS_RUNTIME right after ENABLE, so a runtime waiting in hsa_init goes on.
    for p in [pids[0], run_pid, pids[3]] {
        let o = ops(p);
        assert_eq!(
            o.get(1),
            Some(&("send_runtime_event".to_string(), 0)),
            "Linux {v}: {o:?}"
        );
    }
    let runtime_mask = life
        .iter()
        .find(|e| e["op"] == "send_runtime_event")
        .map(|e| e["exception_mask"].as_u64().unwrap());
    assert_eq!(
        runtime_mask,
        Some(gpreempt_common::kfd::ec_mask(
            gpreempt_common::kfd::ec::PROCESS_RUNTIME
        )),
        "Linux {v}: EC_PROCESS_RUNTIME"
    );
    // `run` attached ahead: ENABLE succeeded and it was the tracer, then it was killed.
    assert_eq!(
        ops(run_pid).first(),
        Some(&("enable".to_string(), 0)),
        "Linux {v}"
    );
    assert_ne!(tracer("tracer2"), "0", "Linux {v}: run did not attach");
    assert_eq!(rc("run.rc"), 137, "Linux {v}");
    // A second debugger while `run` held it: ptrace and KFD both refuse.
    let intrude = read(out, "intrude.txt");
    assert!(intrude.contains("ptrace_seize -1 "), "Linux {v}: {intrude}");
    assert!(intrude.contains("enable -1 "), "Linux {v}: {intrude}");
    assert_eq!(ops(pids[2]), vec![("enable".to_string(), -1)], "Linux {v}");
    // What else fires on the real kernel without queues: amdkfd's resume_queues, with no queue
    // array, for the target (DISABLE and debugger death deactivate the session and resume
    // everything), at least once per session (two `suspend`s and the killed `run`); nothing is
    // ever suspended, and no other kernel probe fires.
    let kernel: Vec<Value> = read(out, "life.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["source"] == "kprobe" && e["event"] != "kfd_ioctl")
        .collect();
    assert!(
        kernel.iter().all(|e| e["event"] == "resume_queues"
            && e["target_pid"] == target
            && e["num_queues"] == 0),
        "Linux {v}: {kernel:#?}"
    );
    assert!(kernel.len() >= 3, "Linux {v}: {kernel:#?}");
    // The kernel ended the killed debugger's session: the next ENABLE is no EALREADY.
    let s2 = read(out, "suspend2.out");
    assert_eq!(rc("suspend2.rc"), 1, "Linux {v}: {s2}");
    assert!(s2.contains("no queues"), "Linux {v}: {s2}");

    // The differential sequence, against the emulator (KFD 1.18, the debug API).
    let real = read(out, "diff.txt");
    let kp = bin("kfd-poke");
    let emulated = sim(
        &format!("echo go | {} /dev/kfd diff", kp.display()),
        Duration::from_secs(120),
    );
    let emulated = String::from_utf8_lossy(&emulated.stdout);
    let steps = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains(' '))
            .map(|l| l.trim_end().to_string())
            .collect()
    };
    let (r, e) = (steps(&real), steps(&emulated));
    assert!(r.len() > 25, "Linux {v}: {real}");
    for (a, b) in r.iter().zip(&e) {
        assert_eq!(a, b, "Linux {v}: the emulator differs from the kernel\nkernel:\n{real}\nemulator:\n{emulated}");
    }
    assert_eq!(
        r.len(),
        e.len(),
        "Linux {v}\nkernel:\n{real}\nemulator:\n{emulated}"
    );
}

#[test]
fn linux_6_12_real_amdkfd() {
    run_tier("6.12", true);
}

#[test]
fn linux_6_1_real_amdkfd() {
    run_tier("6.1", false);
}
