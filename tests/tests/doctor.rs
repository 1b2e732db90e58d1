//! `doctor --json` as root: on this host (no amdgpu, no kprobes, vmlinux BTF, the uprobe PMU,
//! lockdown=integrity) it must exit 1 and say exactly what is and is not here; inside `sim` the
//! emulated KFD must pass its device, version, topology and debugfs checks, and the kernel-facing
//! lines must say what they say on the host.

use std::collections::HashMap;
use std::time::Duration;

use gpreempt_common::kprobe::{FIELDS, PROBES};
use serde_json::Value;
use tests::{
    assert_nothing_left, bin, in_fresh_mounts, require_root, serial, sim, unmount_script, TempDir,
};

/// The report's checks by name, after checking the document's shape and counts.
fn checks(doc: &Value) -> HashMap<String, Value> {
    let list = doc["checks"].as_array().expect("checks array");
    let mut by_name = HashMap::new();
    let mut counts = HashMap::<String, u64>::new();
    for c in list {
        for k in ["name", "verdict", "finding"] {
            assert!(c[k].is_string(), "check without {k}: {c}");
        }
        let verdict = c["verdict"].as_str().unwrap().to_string();
        assert!(
            ["ok", "warn", "fail"].contains(&verdict.as_str()),
            "verdict {verdict}"
        );
        assert_eq!(
            c["fix"].is_string(),
            verdict != "ok",
            "a fix exactly when not ok: {c}"
        );
        *counts.entry(verdict).or_default() += 1;
        by_name.insert(c["name"].as_str().unwrap().to_string(), c.clone());
    }
    for v in ["ok", "warn", "fail"] {
        assert_eq!(
            doc[v].as_u64(),
            Some(counts.get(v).copied().unwrap_or(0)),
            "{v} count in {doc}"
        );
    }
    by_name
}

fn verdict<'a>(checks: &'a HashMap<String, Value>, name: &str) -> &'a str {
    checks
        .get(name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:#?}"))["verdict"]
        .as_str()
        .unwrap()
}

fn finding<'a>(checks: &'a HashMap<String, Value>, name: &str) -> &'a str {
    checks[name]["finding"].as_str().unwrap()
}

/// The active kernel lockdown mode (`None`: securityfs not mounted here).
fn lockdown() -> Option<String> {
    let t = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    t.split_whitespace()
        .find_map(|w| Some(w.strip_prefix('[')?.strip_suffix(']')?.to_string()))
}

/// The kernel-facing lines, the same on this host and inside sim (the emulator adds no kernel
/// functions): no kprobe PMU, vmlinux BTF but no amdgpu BTF, the uprobe PMU, and the verifier.
fn assert_kernel_lines(c: &HashMap<String, Value>) {
    assert_eq!(verdict(c, "btf"), "ok");
    assert_eq!(verdict(c, "btf-amdgpu"), "warn");
    assert_eq!(verdict(c, "kprobes"), "warn", "this kernel has no kprobes");
    // One line per kernel-internal probe; none fails (the ioctl tracepoints are the floor).
    for p in PROBES.iter() {
        let name = format!("probe:{}", p.functions.join("/"));
        assert_eq!(verdict(c, &name), "warn", "{}", c[&name]);
        assert!(finding(c, &name).contains("no kprobe PMU"), "{}", c[&name]);
        assert!(
            c[&name]["fix"]
                .as_str()
                .unwrap()
                .contains("CONFIG_KPROBES=y"),
            "{}",
            c[&name]
        );
    }
    // vmlinux resolves task_struct.tgid, file.private_data and the nine fields of the fd ->
    // file -> inode chain; the amdkfd structs need amdgpu's BTF.
    assert_eq!(verdict(c, "btf-offsets"), "warn");
    let f = finding(c, "btf-offsets");
    assert!(
        f.starts_with(&format!("11/{} fields resolved; ", FIELDS.len())),
        "{f}"
    );
    // So GPU ioctls are selected by file, whatever their type byte.
    assert_eq!(verdict(c, "ioctl-filter"), "ok", "{}", c["ioctl-filter"]);
    assert!(
        finding(c, "ioctl-filter").contains("NVIDIA major 195"),
        "{}",
        c["ioctl-filter"]
    );
    assert!(f.contains("/sys/kernel/btf/amdgpu missing"), "{f}");
    assert_eq!(
        verdict(c, "launch-uprobes"),
        "ok",
        "{}",
        c["launch-uprobes"]
    );
    // Every program loads; under lockdown the kernel refuses the fentry before the verifier runs.
    let f = finding(c, "ebpf-programs");
    assert!(!f.contains("the verifier rejected"), "{f}");
    match lockdown().as_deref() {
        Some("none") => assert_eq!(verdict(c, "ebpf-programs"), "ok", "{f}"),
        Some(mode) => {
            assert_eq!(verdict(c, "ebpf-programs"), "warn", "{f}");
            assert!(
                f.contains(&format!("kernel lockdown ({mode})"))
                    && f.ends_with(
                        ": fe_kfd_ioctl, kfd_ioctl_fentry, kfd_ioctl_fexit, nv_ioctl_fentry, \
                         nv_ioctl_fexit"
                    ),
                "{f}"
            );
        }
        None => assert_ne!(verdict(c, "ebpf-programs"), "fail", "{f}"),
    }
    assert!(f.contains("programs pass the verifier"), "{f}");
}

/// `doctor --json` on this host in a private mount namespace where tracefs and debugfs start
/// unmounted (a freshly booted machine), or with tracefs mounted: its report and exit code.
fn host_doctor(mount_tracefs: bool) -> std::process::Output {
    in_fresh_mounts(mount_tracefs, &bin("gpreempt-ebpf"), &["doctor", "--json"])
        .env_remove("GPREEMPT_KFD_DEVICE")
        .output()
        .expect("running doctor")
}

#[test]
fn doctor_says_whether_tracefs_is_mounted() {
    require_root();
    let _one = serial();
    for mounted in [false, true] {
        let out = host_doctor(mounted);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let doc: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
        let c = checks(&doc);
        if mounted {
            assert_eq!(verdict(&c, "tracefs"), "ok", "{}", c["tracefs"]);
            assert!(
                finding(&c, "tracefs").starts_with("/sys/kernel/tracing: syscalls/"),
                "{}",
                c["tracefs"]
            );
        } else {
            assert_eq!(verdict(&c, "tracefs"), "warn", "{}", c["tracefs"]);
            assert!(
                finding(&c, "tracefs").contains("tracefs is not mounted"),
                "{}",
                c["tracefs"]
            );
            assert!(
                c["tracefs"]["fix"]
                    .as_str()
                    .unwrap()
                    .contains("mount -t tracefs"),
                "{}",
                c["tracefs"]
            );
        }
        // Mounted or not, the rest of the report is the same: no amdgpu, so no kfd debugfs.
        assert_eq!(verdict(&c, "debugfs"), "warn", "{}", c["debugfs"]);
        assert_eq!(verdict(&c, "kfd"), "fail");
        assert_eq!(out.status.code(), Some(1), "{stdout}");
    }
}

#[test]
fn doctor_on_this_host_without_amdgpu() {
    require_root();
    let _one = serial();
    // Unmounted trace filesystems: what a freshly booted machine has.
    let out = host_doctor(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "doctor must exit 1 without /dev/kfd: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let c = checks(&doc);
    for (name, want) in [
        ("privileges", "ok"),
        ("bpf", "ok"),
        ("tracefs", "warn"), // not mounted here: `trace`, `top` and `run` mount it themselves
        ("debugfs", "warn"), // no amdgpu: no /sys/kernel/debug/kfd, mounted or not
        ("ioctl-source", "warn"), // no kprobes: the syscall tracepoints
        ("kfd", "fail"),
        ("pc-sampling", "ok"),
        ("amdgpu", "warn"),
        ("ptrace_scope", "ok"),
        ("controller", "ok"),
    ] {
        assert_eq!(verdict(&c, name), want, "{name}: {}", c[name]);
    }
    assert_kernel_lines(&c);
    assert!(
        c["kfd"]["finding"]
            .as_str()
            .unwrap()
            .contains("no AMD GPU driver (amdkfd) here"),
        "{}",
        c["kfd"]
    );
    assert!(
        finding(&c, "pc-sampling").starts_with("cannot be determined: no KFD version"),
        "{}",
        c["pc-sampling"]
    );
    // No NVIDIA GPU here: none of the NVIDIA lines (they appear only with /dev/nvidiactl or
    // /proc/driver/nvidia/version).
    assert!(
        !std::path::Path::new("/dev/nvidiactl").exists()
            && !std::path::Path::new("/proc/driver/nvidia/version").exists(),
        "this test expects a host without the NVIDIA driver"
    );
    let nvidia: Vec<&String> = c
        .keys()
        .filter(|n| n.starts_with("nvidia") || *n == "pidfd_getfd")
        .collect();
    assert!(
        nvidia.is_empty(),
        "NVIDIA lines on a host without NVIDIA: {nvidia:?}"
    );
    // Every line is printed (traced depends on what else runs here).
    verdict(&c, "traced");
    assert_eq!(verdict(&c, "suspendable"), "ok", "{}", c["suspendable"]);
    assert_eq!(c.len(), 19 + PROBES.len(), "{:?}", c.keys());
    assert_eq!(doc["fail"], 1, "only the KFD fails here: {doc:#}");

    // The text form: same exit code, a summary line.
    let out = in_fresh_mounts(false, &bin("gpreempt-ebpf"), &["doctor"])
        .output()
        .expect("running doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("fail  kfd"), "{text}");
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.ends_with("warn, 1 fail")),
        "{text}"
    );
}

#[test]
fn doctor_inside_sim_sees_the_emulated_kfd() {
    let _one = serial();
    let tmp = TempDir::new("doctor");
    let report = tmp.path("doctor.json");
    let rc = tmp.path("rc");
    let unmounted = tmp.path("doctor-unmounted.json");
    // sim fails if the script does: keep doctor's exit code in a file instead. First with the
    // tracefs unmounted (only in sim's private mount namespace; debugfs stays: sim's view of the
    // emulated KFD is mounted over it), then with tracefs mounted.
    let script = format!(
        "{}; $GP doctor --json > {} 2>&1; \
         mount -t tracefs tracefs /sys/kernel/tracing; \
         $GP doctor --json > {} 2>&1; echo $? > {}; exit 0",
        unmount_script(&["tracefs"]),
        unmounted.display(),
        report.display(),
        rc.display()
    );
    sim(&script, Duration::from_secs(60));
    let text = std::fs::read_to_string(&unmounted).expect("doctor's report");
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let c = checks(&doc);
    assert_eq!(verdict(&c, "tracefs"), "warn", "{}", c["tracefs"]);
    assert_eq!(verdict(&c, "kfd"), "ok", "{}", c["kfd"]);
    let text = std::fs::read_to_string(&report).expect("doctor's report");
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let c = checks(&doc);
    assert_eq!(verdict(&c, "kfd"), "ok", "{}", c["kfd"]);
    let kfd = c["kfd"]["finding"].as_str().unwrap();
    assert!(kfd.contains("KFD 1.18"), "{kfd}");
    assert!(kfd.contains("1 GPU: gfx90a"), "{kfd}");
    assert_eq!(verdict(&c, "gpu:1"), "ok", "{}", c["gpu:1"]);
    let gpu = finding(&c, "gpu:1");
    assert!(gpu.starts_with("gfx90a"), "{gpu}");
    // The emulator advertises the bits upstream sets on gfx90a (trap debug, doorbell type 2.0).
    assert!(
        gpu.contains("capability 0x283fa280: trap debug yes, debug firmware yes"),
        "{gpu}"
    );
    assert_eq!(verdict(&c, "debugfs"), "ok", "{}", c["debugfs"]);
    assert_eq!(verdict(&c, "privileges"), "ok");
    assert_eq!(verdict(&c, "tracefs"), "ok");
    assert_eq!(verdict(&c, "pc-sampling"), "ok");
    assert!(
        finding(&c, "pc-sampling")
            .starts_with("KFD 1.18: whether this driver has PC sampling cannot be determined"),
        "{}",
        c["pc-sampling"]
    );
    assert_kernel_lines(&c);
    // Doctor itself opened /dev/kfd and is not counted as a KFD process of the host.
    assert!(
        c["traced"]["finding"]
            .as_str()
            .unwrap()
            .starts_with("0 KFD process"),
        "{}",
        c["traced"]
    );
    assert_eq!(doc["fail"], 0, "{doc:#}");
    let code = std::fs::read_to_string(&rc).expect("doctor's exit code");
    assert_eq!(code.trim(), "0", "no check fails inside sim: {doc:#}");
    assert_nothing_left();
}
