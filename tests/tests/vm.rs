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
use tests::{bin, require_root, serial, TempDir};

struct Kernel {
    version: String,
    vmlinuz: PathBuf,
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
        .filter_map(|l| l.split_once(' '))
        .find(|(v, _)| v.starts_with(&format!("{series}.")))
        .map(|(v, p)| Kernel {
            version: v.to_string(),
            vmlinuz: PathBuf::from(p),
        })
        .unwrap_or_else(|| panic!("no Linux {series} kernel in {}:\n{text}", list.display()))
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
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("Linux {} did not finish within 600 s", k.version);
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

/// Everything one boot does: load amdgpu, `doctor --json`, then `trace` while kfd-poke runs its
/// script on the real /dev/kfd (type 'K', then 'X') and on /dev/null.
const STEPS: &str = r#"set -ex
modprobe amdgpu
test -c /dev/kfd
stat -c '%t:%T' /dev/kfd > $O/kfd-rdev
cat /sys/class/kfd/kfd/topology/nodes/0/properties > $O/node0
$B/gpreempt-ebpf doctor --json > $O/doctor.json || true
$B/gpreempt-ebpf trace --json --output $O/trace.jsonl 2> $O/trace.err & T=$!
for i in $(seq 300); do grep -q "tracing KFD" $O/trace.err && break; sleep 0.2; done
echo go | $B/kfd-poke /dev/kfd script > /dev/null & P1=$!; wait $P1; echo $P1 > $O/pid-k
echo go | $B/kfd-poke /dev/kfd script-x > /dev/null & P2=$!; wait $P2; echo $P2 > $O/pid-x
echo go | $B/kfd-poke /dev/null script > /dev/null & P3=$!; wait $P3; echo $P3 > $O/pid-null
sleep 1
kill -INT $T; wait $T
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
    let out = boot(&k, &t, STEPS);
    let v = &k.version;

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
            .contains(&format!("KFD major {major}")),
        "Linux {v}: {}",
        line(&c, "ioctl-filter").1
    );
    assert_eq!(line(&c, "probe:kfd_ioctl").0, "ok", "Linux {v}");
    // Every kernel-internal probe either attaches or says why not.
    for (name, p) in c.iter().filter(|(n, _)| n.starts_with("probe:")) {
        let f = p["finding"].as_str().unwrap();
        assert!(
            f.starts_with("attachable") || f.starts_with("not attachable: "),
            "Linux {v}: {name}: {f}"
        );
    }
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

    // trace on the real character device.
    let err = read(&out, "trace.err");
    assert!(err.contains("ioctls by device"), "Linux {v}: {err}");
    let events: Vec<Value> = read(&out, "trace.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pid = |f: &str| read(&out, f).trim().parse::<u64>().unwrap();
    let (pk, px, pnull) = (pid("pid-k"), pid("pid-x"), pid("pid-null"));
    let of = |p: u64, kprobe: bool| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["pid"] == p && e["event"] != "process_exit")
            .filter(|e| (e["source"] == "kprobe") == kprobe)
            .collect()
    };
    // amdkfd saw every call with a KFD nr or not (kfd_ioctl fired for each), whatever its type
    // byte: create_queue twice, destroy_queue, dbg_trap, FIONREAD, the out-of-range 'K', and
    // runtime_enable.
    let cmds = |p: u64| -> Vec<u64> {
        of(p, true)
            .iter()
            .filter(|e| e["event"] == "kfd_ioctl")
            .map(|e| e["cmd"].as_u64().unwrap())
            .collect()
    };
    let (ck, cx) = (cmds(pk), cmds(px));
    assert_eq!(ck.len(), 7, "Linux {v}: kfd_ioctl hits {ck:x?}");
    assert_eq!(cx.len(), 7, "Linux {v}: kfd_ioctl hits {cx:x?}");
    assert!(
        ck.iter().zip(&cx).all(|(k, x)| k & 0xff == x & 0xff),
        "Linux {v}: same nrs: {ck:x?} {cx:x?}"
    );
    assert_eq!((cx[0] >> 8) & 0xff, u64::from(b'X'), "Linux {v}");
    // The tracepoint path decoded the same calls for both, by nr, with the kernel's answers.
    let calls = |p: u64| -> Vec<(String, i64)> {
        of(p, false)
            .iter()
            .map(|e| {
                (
                    e["event"].as_str().unwrap().to_string(),
                    e["ret"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let (tk, tx) = (calls(pk), calls(px));
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
    assert_eq!(tk, want, "Linux {v}: 'K' calls");
    assert_eq!(
        tx, want,
        "Linux {v}: 'X' calls (the kernel dispatches by nr)"
    );
    // /dev/null: nothing reported, the 'K' calls counted as dropped in the kernel.
    assert!(
        events.iter().all(|e| e["pid"] != pnull),
        "Linux {v}: /dev/null calls reported"
    );
    assert!(err.contains("dropped_other_file=5"), "Linux {v}: {err}");
}

#[test]
fn linux_6_12_real_amdkfd() {
    run_tier("6.12", true);
}

#[test]
fn linux_6_1_real_amdkfd() {
    run_tier("6.1", false);
}
