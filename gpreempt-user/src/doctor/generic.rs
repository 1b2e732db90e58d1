//! Host-wide checks: privileges, bpf(2), kernel BTF, kprobes, launch uprobes, the verifier,
//! tracefs, Yama ptrace_scope, processes already traced, a running controller.

use std::{collections::BTreeSet, fs, io, path::Path};

use anyhow::Result;
use gpreempt_common::kprobe;

use super::check::{numeric_entries, Check, Root};
use crate::observe::{
    host::{cap_eff, Privileges, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE},
    probe::ProgramCheck,
};

// -------------------------------------------------------------------------------------------
// 1. Privileges

/// Check 1, from `/proc/self/status` (or the euid when that is unreadable).
pub fn privileges_check(status: Option<&str>, euid: u32) -> (Check, Privileges) {
    const NAME: &str = "privileges";
    let Some(caps) = status.and_then(cap_eff) else {
        let p = Privileges::all(euid == 0);
        let c = if euid == 0 {
            Check::ok(
                NAME,
                "euid 0 (CapEff unreadable: assuming root's capabilities)",
            )
        } else {
            Check::fail(
                NAME,
                format!("euid {euid} and CapEff unreadable: eBPF and the controller need root"),
                "run gpreempt-ebpf with sudo",
            )
        };
        return (c, p);
    };
    let p = Privileges::from_caps(caps);
    let names: Vec<&str> = [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ]
    .iter()
    .filter(|(c, _)| caps & (1u64 << c) != 0)
    .map(|(_, n)| *n)
    .collect();
    let who = format!(
        "euid {euid}, CapEff {caps:#x} ({})",
        if names.is_empty() {
            "none of CAP_SYS_ADMIN/CAP_BPF/CAP_PERFMON/CAP_SYS_PTRACE".to_string()
        } else {
            names.join(", ")
        }
    );
    let c = match (p.bpf, p.ptrace) {
        (true, true) => Check::ok(NAME, who),
        (true, false) => Check::warn(
            NAME,
            format!("{who}: eBPF works (trace, top, queues) but without CAP_SYS_PTRACE the controller (run, suspend, resume) cannot attach"),
            "run the controller as root, or add CAP_SYS_PTRACE to its capabilities",
        ),
        (false, _) => Check::fail(
            NAME,
            format!("{who}: cannot load eBPF programs; the checks below that need root say so"),
            "run gpreempt-ebpf with sudo (or grant CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE)",
        ),
    };
    (c, p)
}

// -------------------------------------------------------------------------------------------
// 2. bpf(2)

/// Creates and closes a one-entry BPF array map: the cheapest proof that bpf(2) works for us.
pub fn try_bpf_map_create() -> io::Result<()> {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    // union bpf_attr, the BPF_MAP_CREATE member: map_type, key_size, value_size, max_entries,
    // map_flags, then fields that must be zero. 128 zeroed bytes cover every kernel's size check.
    let mut attr = [0u32; 32];
    attr[0] = BPF_MAP_TYPE_ARRAY;
    attr[1] = 4; // key_size
    attr[2] = 8; // value_size
    attr[3] = 1; // max_entries
                 // SAFETY: `attr` is a live, zero-initialised buffer of the size passed; the kernel only reads
                 // it for BPF_MAP_CREATE.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the map descriptor just returned to us and owned by nobody else.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

/// Check 2: the outcome of [`try_bpf_map_create`], with the sysctl for context.
pub fn bpf_check(unprivileged_bpf_disabled: Option<&str>, created: &io::Result<()>) -> Check {
    const NAME: &str = "bpf";
    let sysctl = match unprivileged_bpf_disabled.map(str::trim) {
        Some("0") => "kernel.unprivileged_bpf_disabled=0 (unprivileged bpf allowed)".to_string(),
        Some(v @ ("1" | "2")) => {
            format!("kernel.unprivileged_bpf_disabled={v} (bpf(2) needs CAP_BPF or root)")
        }
        Some(v) => format!("kernel.unprivileged_bpf_disabled={v}"),
        None => "kernel.unprivileged_bpf_disabled unreadable".to_string(),
    };
    match created {
        Ok(()) => Check::ok(NAME, format!("bpf(2) works (test array map created); {sysctl}")),
        Err(e) => match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Check::fail(
                NAME,
                format!("bpf(2) map create refused ({e}); {sysctl}"),
                "run as root; if already root, check kernel lockdown (/sys/kernel/security/lockdown) and LSM policy",
            ),
            Some(libc::ENOSYS) => Check::fail(
                NAME,
                "bpf(2) is not implemented by this kernel",
                "use a kernel built with CONFIG_BPF_SYSCALL=y",
            ),
            _ => Check::fail(
                NAME,
                format!("bpf(2) map create failed ({e}); {sysctl}"),
                "check the kernel's BPF support (CONFIG_BPF_SYSCALL) and memlock limits (ulimit -l)",
            ),
        },
    }
}

// -------------------------------------------------------------------------------------------
// 3. BTF

/// Check 3a: kernel BTF.
pub fn btf_vmlinux_check(root: &Root) -> Check {
    const NAME: &str = "btf";
    let p = root.path("/sys/kernel/btf/vmlinux");
    match fs::metadata(&p) {
        Ok(m) => Check::ok(
            NAME,
            format!(
                "/sys/kernel/btf/vmlinux present ({} KiB): CO-RE and fentry programs can load",
                m.len() / 1024
            ),
        ),
        Err(_) => Check::warn(
            NAME,
            "no /sys/kernel/btf/vmlinux: CO-RE and fentry programs are impossible; the ioctl tracepoints still work",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        ),
    }
}

// -------------------------------------------------------------------------------------------
// 4. kprobes

/// What a kernel config text says about an option: `Some(true)` =y/=m, `Some(false)` not set.
pub fn config_option(config: &str, opt: &str) -> Option<bool> {
    for l in config.lines() {
        if let Some(v) = l.strip_prefix(opt).and_then(|r| r.strip_prefix('=')) {
            return Some(matches!(v.trim(), "y" | "m"));
        }
        if l.trim() == format!("# {opt} is not set") {
            return Some(false);
        }
    }
    None
}

/// Check 4: can kprobes attach (aya uses the `kprobe` PMU, or tracefs `kprobe_events`)?
pub fn kprobes_check(root: &Root) -> Check {
    const NAME: &str = "kprobes";
    const FIX: &str = "use a kernel built with CONFIG_KPROBES=y and CONFIG_KPROBE_EVENTS=y";
    const WITHOUT: &str =
        "the ioctl tracepoints remain: hardware map/unmap and evictions are not seen";
    if root.exists("/sys/bus/event_source/devices/kprobe") {
        return Check::ok(
            NAME,
            "kprobe PMU present (/sys/bus/event_source/devices/kprobe)",
        );
    }
    for p in [
        "/sys/kernel/tracing/kprobe_events",
        "/sys/kernel/debug/tracing/kprobe_events",
    ] {
        if root.exists(p) {
            return Check::ok(NAME, format!("{p} present"));
        }
    }
    if root.exists("/sys/kernel/debug/kprobes") {
        return Check::warn(
            NAME,
            format!("kprobes are built in (/sys/kernel/debug/kprobes) but neither the kprobe PMU nor kprobe_events exists: {WITHOUT}"),
            FIX,
        );
    }
    let release = root.value("/proc/sys/kernel/osrelease").unwrap_or_default();
    let config_path = format!("/boot/config-{release}");
    if let Ok(cfg) = root.read(&config_path) {
        match config_option(&cfg, "CONFIG_KPROBES") {
            Some(true) => {
                return Check::warn(
                    NAME,
                    format!("{config_path} has CONFIG_KPROBES=y but no kprobe PMU or kprobe_events is visible (tracefs not mounted, or CONFIG_KPROBE_EVENTS off): {WITHOUT}"),
                    "mount tracefs (mount -t tracefs tracefs /sys/kernel/tracing) and check CONFIG_KPROBE_EVENTS=y",
                )
            }
            Some(false) => {
                return Check::warn(
                    NAME,
                    format!("{config_path}: CONFIG_KPROBES is not set: {WITHOUT}"),
                    FIX,
                )
            }
            None => {}
        }
    }
    let kallsyms = match root.read("/proc/kallsyms") {
        Ok(k) => {
            if k.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("register_kprobe"))
            {
                "register_kprobe is in /proc/kallsyms but no kprobe PMU or kprobe_events is visible"
            } else {
                "no kprobe PMU, no kprobe_events, no register_kprobe in /proc/kallsyms (CONFIG_KPROBES off)"
            }
        }
        Err(_) => "no kprobe PMU and no kprobe_events (and /proc/kallsyms unreadable)",
    };
    Check::warn(NAME, format!("{kallsyms}: {WITHOUT}"), FIX)
}

// -------------------------------------------------------------------------------------------
// 4d. Launch uprobes

/// Check 4d: the uprobe PMU that launch hints (HIP / HSA entry points) attach through.
pub fn launch_uprobes_check(root: &Root) -> Check {
    const NAME: &str = "launch-uprobes";
    const PMU: &str = "/sys/bus/event_source/devices/uprobe/type";
    let points: Vec<&str> = kprobe::launch::POINTS
        .iter()
        .map(|(point, _, _)| kprobe::launch::name(*point))
        .collect();
    if root.exists(PMU) {
        Check::ok(
            NAME,
            format!(
                "uprobe PMU present ({PMU}): launch hints attach per watched process ({})",
                points.join(", ")
            ),
        )
    } else {
        Check::warn(
            NAME,
            format!("no uprobe PMU ({PMU}): launch hints unavailable (CONFIG_UPROBES / CONFIG_UPROBE_EVENTS off); the ioctl tracepoints remain"),
            "use a kernel built with CONFIG_UPROBES=y and CONFIG_UPROBE_EVENTS=y",
        )
    }
}

// -------------------------------------------------------------------------------------------
// 4e. The verifier

/// At most `head` first and `tail` last lines of a verifier error (the log's end names the
/// reason).
fn verifier_excerpt(text: &str) -> String {
    const HEAD: usize = 2;
    const TAIL: usize = 3;
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() <= HEAD + TAIL {
        return lines.join(" | ");
    }
    format!(
        "{} | ... | {}",
        lines[..HEAD].join(" | "),
        lines[lines.len() - TAIL..].join(" | ")
    )
}

/// The active mode of a `/sys/kernel/security/lockdown` text (`none [integrity] confidentiality`).
pub fn lockdown_mode(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// A load refused with EPERM before the verifier ran (no verifier log): lockdown or an LSM, not
/// the program.
fn refused_before_verifier(error: &str) -> bool {
    error.starts_with("Operation not permitted")
        && error
            .split_once(": ")
            .is_none_or(|(_, log)| log.trim().is_empty())
}

/// Check 4e: every program of the object loaded into the kernel (verified), none attached.
/// `lockdown`: the active lockdown mode, when known. A verifier rejection fails (a program this
/// kernel cannot run); a load refused before verification (lockdown, LSM policy) or impossible
/// without vmlinux BTF warns: the fentry has the kprobe, and everything the tracepoints, to fall
/// back on.
pub fn ebpf_programs_check(verified: &Result<Vec<ProgramCheck>>, lockdown: Option<&str>) -> Check {
    const NAME: &str = "ebpf-programs";
    let programs = match verified {
        Ok(p) => p,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("the eBPF object did not load: {e:#}"),
                "see the bpf and btf lines above; a kernel with CONFIG_BPF_SYSCALL and ring buffers (Linux 5.8+) is needed",
            )
        }
    };
    let err = |p: &ProgramCheck| {
        p.result
            .as_ref()
            .err()
            .map_or("", String::as_str)
            .to_string()
    };
    let (mut no_btf, mut refused, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
    for p in programs.iter().filter(|p| p.result.is_err()) {
        let e = err(p);
        if e.starts_with("no vmlinux BTF") {
            no_btf.push(p.program.as_str());
        } else if refused_before_verifier(&e) {
            refused.push(p.program.as_str());
        } else {
            rejected.push(format!("{}: {}", p.program, verifier_excerpt(&e)));
        }
    }
    let passed = programs.iter().filter(|p| p.result.is_ok()).count();
    let mut finding = if passed == programs.len() {
        format!("{passed} programs pass the verifier")
    } else {
        format!("{passed}/{} programs pass the verifier", programs.len())
    };
    let notes: Vec<String> = programs
        .iter()
        .filter_map(|p| match &p.result {
            Ok(note) if !note.is_empty() => Some(format!("{}: {note}", p.program)),
            _ => None,
        })
        .collect();
    if !notes.is_empty() {
        finding += &format!(" ({})", notes.join("; "));
    }
    if !rejected.is_empty() {
        return Check::fail(
            NAME,
            format!("{finding}; the verifier rejected {}", rejected.join("; ")),
            "use a newer kernel (Linux 5.15+), or report this line with `uname -r` to gpreempt-ebpf's maintainers",
        );
    }
    let mut fixes = Vec::new();
    if !refused.is_empty() {
        let by = match lockdown {
            Some(m) if m != "none" => format!("kernel lockdown ({m}) or an LSM policy"),
            _ => "an LSM policy or kernel lockdown".to_string(),
        };
        finding += &format!(
            "; refused before the verifier ran (EPERM, no verifier log; {by}): {}",
            refused.join(", ")
        );
        fixes.push(match lockdown {
            Some(m) if m != "none" => "fentry needs a kernel booted without lockdown (no lockdown= parameter, Secure Boot off); meanwhile the kfd_ioctl kprobe or the ioctl tracepoints stand in",
            _ => "check the LSM policy (/sys/kernel/security/lsm) and lockdown (/sys/kernel/security/lockdown); meanwhile the kfd_ioctl kprobe or the ioctl tracepoints stand in",
        });
    }
    if !no_btf.is_empty() {
        finding += &format!("; not loadable without vmlinux BTF: {}", no_btf.join(", "));
        fixes.push("use a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    if fixes.is_empty() {
        Check::ok(NAME, finding)
    } else {
        Check::warn(NAME, finding, fixes.join("; "))
    }
}

// -------------------------------------------------------------------------------------------
// 5. tracefs

/// Check 5: the tracepoints every gpreempt-ebpf program stands on.
pub fn tracefs_check(root: &Root) -> Check {
    const NAME: &str = "tracefs";
    let dir = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|d| root.path(d).join("events").is_dir());
    let Some(dir) = dir else {
        if let Err(e) = fs::read_dir(root.path("/sys/kernel/tracing")) {
            if e.kind() == io::ErrorKind::PermissionDenied {
                return Check::warn(
                    NAME,
                    format!("/sys/kernel/tracing is not readable ({e}): tracepoints unchecked"),
                    "run as root (tracefs is root-only)",
                );
            }
        }
        let supported = root
            .read("/proc/filesystems")
            .map(|f| {
                f.lines()
                    .any(|l| l.split_whitespace().last() == Some("tracefs"))
            })
            .unwrap_or(false);
        return if supported {
            Check::warn(
                NAME,
                "tracefs is not mounted (gpreempt-ebpf mounts it itself when run as root)",
                "mount -t tracefs tracefs /sys/kernel/tracing",
            )
        } else {
            Check::fail(
                NAME,
                "no tracefs: this kernel has no tracepoints (CONFIG_TRACING/CONFIG_FTRACE off)",
                "use a kernel built with CONFIG_FTRACE=y and CONFIG_FTRACE_SYSCALLS=y",
            )
        };
    };
    let events = root.path(dir).join("events");
    let missing: Vec<&str> = [
        "syscalls/sys_enter_ioctl",
        "syscalls/sys_exit_ioctl",
        "sched/sched_process_exit",
    ]
    .into_iter()
    .filter(|e| !events.join(e).is_dir())
    .collect();
    if missing.is_empty() {
        Check::ok(
            NAME,
            format!(
                "{dir}: syscalls/sys_{{enter,exit}}_ioctl and sched/sched_process_exit present"
            ),
        )
    } else if !events.join("syscalls").exists() && !events.join("sched").exists() {
        Check::fail(
            NAME,
            format!("{dir}/events is empty or unreadable (not root?)"),
            "run as root (tracefs events are root-only)",
        )
    } else {
        Check::fail(
            NAME,
            format!("{dir}: tracepoints missing: {}", missing.join(", ")),
            "use a kernel built with CONFIG_FTRACE_SYSCALLS=y (the syscall tracepoints are the floor every command needs)",
        )
    }
}

// -------------------------------------------------------------------------------------------
// 10. Yama

/// Check 10: `kernel.yama.ptrace_scope` (`None`: Yama absent).
pub fn ptrace_scope_check(value: Option<&str>, has_ptrace_cap: bool) -> Check {
    const NAME: &str = "ptrace_scope";
    const FIX_CAP: &str = "run the controller as root (CAP_SYS_PTRACE)";
    match value.map(str::trim) {
        None => Check::ok(NAME, "Yama not enabled: ptrace is limited only by capabilities"),
        Some("0") => Check::ok(NAME, "0 (classic ptrace permissions)"),
        Some("1") if has_ptrace_cap => Check::ok(
            NAME,
            "1 (restricted to descendants; CAP_SYS_PTRACE attaches anyway)",
        ),
        Some("1") => Check::warn(
            NAME,
            "1 (restricted to descendants): without CAP_SYS_PTRACE the controller cannot attach to processes it did not start",
            FIX_CAP,
        ),
        Some("2") if has_ptrace_cap => {
            Check::ok(NAME, "2 (admin-only attach; we have CAP_SYS_PTRACE)")
        }
        Some("2") => Check::warn(
            NAME,
            "2 (admin-only attach): the controller needs CAP_SYS_PTRACE",
            FIX_CAP,
        ),
        Some("3") => Check::fail(
            NAME,
            "3: ptrace disabled: the controller cannot attach",
            "set kernel.yama.ptrace_scope=1 or 2 (3 can only be lowered by a reboot)",
        ),
        Some(v) => Check::warn(
            NAME,
            format!("{v}: an unknown value"),
            "set kernel.yama.ptrace_scope to 0, 1 or 2",
        ),
    }
}

// -------------------------------------------------------------------------------------------
// 11. Processes already traced

/// One KFD process and its tracer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traced {
    pub pid: u32,
    pub comm: String,
    pub tracer: u32,
    pub tracer_comm: String,
}

/// KFD processes: listed in the KFD's sysfs `proc`, or holding `kfd_device` open.
pub fn kfd_pids(root: &Root, kfd_device: &Path) -> BTreeSet<u32> {
    let mut pids: BTreeSet<u32> = numeric_entries(&root.path("/sys/class/kfd/kfd/proc"))
        .into_iter()
        .collect();
    let proc = root.path("/proc");
    for pid in numeric_entries(&proc) {
        if pids.contains(&pid) {
            continue;
        }
        let Ok(fds) = fs::read_dir(proc.join(pid.to_string()).join("fd")) else {
            continue;
        };
        if fds
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .any(|t| t == kfd_device)
        {
            pids.insert(pid);
        }
    }
    pids
}

/// The KFD processes with a tracer, leaving out `skip` (doctor itself: having opened the device,
/// it stays a KFD process until it exits).
pub fn traced_kfd_processes(
    root: &Root,
    kfd_device: &Path,
    skip: Option<u32>,
) -> (usize, Vec<Traced>) {
    let mut pids = kfd_pids(root, kfd_device);
    if let Some(s) = skip {
        pids.remove(&s);
    }
    let traced = pids
        .iter()
        .filter_map(|&pid| {
            let status = root.read(&format!("/proc/{pid}/status")).ok()?;
            let tracer: u32 = crate::observe::procinfo::status_field(&status, "TracerPid")?
                .parse()
                .ok()?;
            (tracer != 0).then(|| Traced {
                pid,
                comm: crate::observe::procinfo::status_field(&status, "Name")
                    .unwrap_or("?")
                    .to_string(),
                tracer,
                // TracerPid names the tracing thread (the controller's `gpreempt-ctl`): its
                // process's name is what tells a controller from another tool.
                tracer_comm: root
                    .read(&format!("/proc/{tracer}/status"))
                    .ok()
                    .and_then(|st| {
                        crate::observe::procinfo::status_field(&st, "Tgid").map(str::to_string)
                    })
                    .and_then(|tgid| root.value(&format!("/proc/{tgid}/comm")))
                    .or_else(|| root.value(&format!("/proc/{tracer}/comm")))
                    .unwrap_or_else(|| "?".into()),
            })
        })
        .collect();
    (pids.len(), traced)
}

/// Check 11. A process traced by a gpreempt-ebpf controller is under control, not in the way.
pub fn traced_check(kfd_processes: usize, traced: &[Traced]) -> Check {
    const NAME: &str = "traced";
    let (ours, others): (Vec<&Traced>, Vec<&Traced>) = traced
        .iter()
        .partition(|t| t.tracer_comm.starts_with("gpreempt-ebpf"));
    let list = |v: &[&Traced]| {
        v.iter()
            .map(|t| {
                format!(
                    "pid {} ({}) traced by {} ({})",
                    t.pid, t.comm, t.tracer, t.tracer_comm
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ours_text = if ours.is_empty() {
        String::new()
    } else {
        format!("; {} held by gpreempt-ebpf", ours.len())
    };
    if others.is_empty() {
        Check::ok(
            NAME,
            format!("{kfd_processes} KFD process(es), none traced by another tool{ours_text}"),
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "{}: cannot be controlled while traced{ours_text}",
                list(&others)
            ),
            "detach the debugger or tracer (or stop it) before controlling these processes",
        )
    }
}

// -------------------------------------------------------------------------------------------
// 12. A running controller

/// Check 12.
pub fn controller_check(run_dir: &Path) -> Check {
    const NAME: &str = "controller";
    if crate::observe::status::lock_held(run_dir) {
        let pid = fs::read_to_string(run_dir.join("controller.lock"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "?".into());
        Check::ok(
            NAME,
            format!(
                "a controller is running (pid {pid}, {}): suspend/resume talk to it",
                run_dir.display()
            ),
        )
    } else {
        Check::ok(
            NAME,
            format!("no controller running ({} not locked)", run_dir.display()),
        )
    }
}

/// Which processes a running controller found it cannot suspend because their GPU runtime never
/// enabled the KFD debug API, and which it holds frozen instead (docs/controller.md). Without a
/// controller there is no ioctl history to judge by: it says where to look.
pub fn suspendable_check(status: Option<&crate::observe::status::Status>) -> Check {
    const NAME: &str = "suspendable";
    let Some(s) = status else {
        return Check::ok(
            NAME,
            "no controller running: whether a process can be suspended shows once one watches \
             its ioctls (`top` detail pane `suspendable`, `queues --json` `debug_api`)",
        );
    };
    let no_api: Vec<String> = s
        .uncontrollable
        .iter()
        .filter(|(_, u)| u.kind == "no_debug_api")
        .map(|(pid, _)| pid.to_string())
        .collect();
    let frozen: Vec<String> = s
        .frozen
        .iter()
        .map(|(pid, cg)| format!("pid {pid} ({cg})"))
        .collect();
    let frozen_text = if frozen.is_empty() {
        String::new()
    } else {
        format!("; held by freezing their cgroup: {}", frozen.join(", "))
    };
    if no_api.is_empty() {
        Check::ok(
            NAME,
            format!(
                "every process the controller (pid {}) acted on can be suspended{frozen_text}",
                s.controller_pid
            ),
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "pid(s) {}: their GPU runtime never enabled the KFD debug API (ROCm before 5.7), \
                 so their queues cannot be suspended{frozen_text}",
                no_api.join(", ")
            ),
            "run them with ROCm 5.7 or later, or set `[policy] no_debug_api = \"freeze\"` to \
             freeze their cgroup instead (docs/controller.md, the freeze fallback)",
        )
    }
}
