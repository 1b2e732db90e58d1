//! `doctor`: is this host ready for gpreempt-ebpf, and what to change if not.
//!
//! Every check reads files below a [`Root`] (`/` on a host; tests point it at a fake tree) and
//! returns a [`Check`]: a verdict, one finding and, when not ok, one actionable fix. Only five
//! things touch the running kernel directly: the bpf(2) map-create probe, loading (verifying, never
//! attaching) every eBPF program when the root is `/`, opening the KFD device with its GET_VERSION
//! ioctl, the controller lock, and (on NVIDIA hosts, root `/` only) `pidfd_getfd` of one of our own
//! fds. The NVIDIA lines appear only where the NVIDIA driver is. Unreadable files are findings,
//! never errors: the command always prints every line.

use std::{
    collections::BTreeSet,
    fs,
    io::{self, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context as _, Result};
use gpreempt_common::{
    kfd,
    kprobe::{self, ProbeSpec, FIELDS, PROBES},
};
use serde::Serialize;

use crate::{
    kfd::sysfs::{self, GpuNode},
    observe::probe::{HostProbeFacts, ProgramCheck},
};

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub finding: String,
    /// What to change (one sentence); `None` when ok.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: &str, finding: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Ok,
            finding: finding.into(),
            fix: None,
        }
    }
    pub fn warn(name: &str, finding: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Warn,
            finding: finding.into(),
            fix: Some(fix.into()),
        }
    }
    pub fn fail(name: &str, finding: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Fail,
            finding: finding.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Where `/sys`, `/proc`, `/boot` and the like are: `/` on a host, a fake tree in tests.
#[derive(Clone, Debug)]
pub struct Root {
    base: PathBuf,
}

impl Default for Root {
    fn default() -> Self {
        Self::at("/")
    }
}

impl Root {
    pub fn at(base: impl Into<PathBuf>) -> Self {
        Self { base: base.into() }
    }
    /// `abs` (an absolute host path) below this root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.base.join(abs.trim_start_matches('/'))
    }
    fn read(&self, abs: &str) -> io::Result<String> {
        fs::read_to_string(self.path(abs))
    }
    /// The trimmed contents, `None` when unreadable.
    fn value(&self, abs: &str) -> Option<String> {
        self.read(abs).ok().map(|s| s.trim().to_string())
    }
    fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }
}

// -------------------------------------------------------------------------------------------
// 1. Privileges

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities from a `/proc/PID/status` text.
pub fn cap_eff(status: &str) -> Option<u64> {
    u64::from_str_radix(
        crate::observe::procinfo::status_field(status, "CapEff")?,
        16,
    )
    .ok()
}

/// What the process may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Privileges {
    /// bpf(2) loads and tracepoint attach: CAP_SYS_ADMIN, or CAP_BPF + CAP_PERFMON.
    pub bpf: bool,
    /// Attaching to other users' processes (the controller): CAP_SYS_PTRACE.
    pub ptrace: bool,
    /// Reading debugfs and the like.
    pub admin: bool,
}

impl Privileges {
    pub fn from_caps(caps: u64) -> Self {
        let has = |c: u32| caps & (1u64 << c) != 0;
        Self {
            bpf: has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)),
            ptrace: has(CAP_SYS_PTRACE),
            admin: has(CAP_SYS_ADMIN),
        }
    }
    fn all(yes: bool) -> Self {
        Self {
            bpf: yes,
            ptrace: yes,
            admin: yes,
        }
    }
}

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

/// Check 3b: amdgpu's module BTF (kernel-internal probes on amdkfd functions need it).
pub fn btf_amdgpu_check(root: &Root) -> Check {
    const NAME: &str = "btf-amdgpu";
    if root.exists("/sys/kernel/btf/amdgpu") {
        return Check::ok(NAME, "/sys/kernel/btf/amdgpu present");
    }
    if root.exists("/sys/module/amdgpu") {
        Check::warn(
            NAME,
            "amdgpu is loaded but has no module BTF (/sys/kernel/btf/amdgpu): kernel-internal probes on amdkfd cannot be typed",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF_MODULES=y",
        )
    } else {
        Check::warn(
            NAME,
            "no /sys/kernel/btf/amdgpu (amdgpu not loaded): kernel-internal probes on amdkfd need it",
            "load amdgpu (modprobe amdgpu) on a kernel built with CONFIG_DEBUG_INFO_BTF_MODULES=y",
        )
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
// 4b. The kernel-internal probes, their struct offsets, launch uprobes

/// The fix for a kernel-internal probe that cannot attach, by the first obstacle `plan` met.
fn kernel_probe_fix(facts: &HostProbeFacts, spec: &ProbeSpec) -> &'static str {
    if facts.kprobes.is_err() {
        "use a kernel built with CONFIG_KPROBES=y and CONFIG_KPROBE_EVENTS=y"
    } else if !spec.functions.iter().any(|f| facts.kallsyms.contains(*f)) {
        "load amdgpu (modprobe amdgpu) on a host with an AMD GPU; if it is loaded, this build inlines the function"
    } else {
        "use a kernel and amdgpu module built with BTF (CONFIG_DEBUG_INFO_BTF=y, CONFIG_DEBUG_INFO_BTF_MODULES=y) for struct offsets"
    }
}

/// Check 4c: one line per kernel-internal probe ([`PROBES`]), named by its functions, from the
/// plan `trace` and `top` attach by. Never a failure: the ioctl tracepoints remain the floor.
pub fn kernel_probe_checks(facts: &HostProbeFacts) -> Vec<Check> {
    facts
        .plan()
        .into_iter()
        .map(|planned| {
            let spec = planned.spec;
            let name = format!("probe:{}", spec.functions.join("/"));
            match planned.verdict {
                Ok(functions) => {
                    let how = if spec.id == kprobe::id::KFD_IOCTL && facts.kfd_ioctl_in_vmlinux {
                        "fentry"
                    } else {
                        "kprobe"
                    };
                    let on = if functions.len() < spec.functions.len() {
                        format!(" on {}", functions.join(", "))
                    } else {
                        String::new()
                    };
                    Check::ok(&name, format!("attachable ({how}){on}: {}", spec.gives))
                }
                Err(why) => Check::warn(
                    &name,
                    format!(
                        "not attachable: {why}; unseen: {} (the ioctl tracepoints remain)",
                        spec.gives
                    ),
                    kernel_probe_fix(facts, spec),
                ),
            }
        })
        .collect()
}

/// Check 4b: the struct offsets the probes read, resolved from BTF. Ok when every field some
/// probe needs is known; the others are alternatives (`kfd_process.pasid` before about 6.15,
/// `kfd_process_device.pasid` after) or optional reads.
pub fn btf_offsets_check(facts: &HostProbeFacts) -> Check {
    const NAME: &str = "btf-offsets";
    let total = FIELDS.len();
    let resolved = (0..total).filter(|&i| facts.offsets.is_known(i)).count();
    let needed = PROBES.iter().fold(0u64, |acc, p| acc | p.needs);
    let (missing_needed, missing_optional): (Vec<_>, Vec<_>) = facts
        .missing
        .iter()
        .partition(|(f, _)| needed & (1u64 << f) != 0);
    if missing_needed.is_empty() {
        let mut finding = format!("{resolved}/{total} fields resolved (every field a probe needs)");
        if !missing_optional.is_empty() {
            let names: Vec<String> = missing_optional
                .iter()
                .map(|(f, _)| format!("{}.{}", FIELDS[*f].owner, FIELDS[*f].member))
                .collect();
            finding += &format!("; not found, needed by no probe: {}", names.join(", "));
        }
        return Check::ok(NAME, finding);
    }
    let mut reasons: Vec<&str> = Vec::new();
    for (_, why) in &missing_needed {
        if !reasons.contains(&why.as_str()) {
            reasons.push(why);
        }
    }
    const SHOWN: usize = 3;
    let more = if reasons.len() > SHOWN {
        format!(" (+{} more)", reasons.len() - SHOWN)
    } else {
        String::new()
    };
    Check::warn(
        NAME,
        format!(
            "{resolved}/{total} fields resolved; {} that probes need are unknown: {}{more}",
            missing_needed.len(),
            reasons[..reasons.len().min(SHOWN)].join("; ")
        ),
        "use a kernel and amdgpu module built with BTF (CONFIG_DEBUG_INFO_BTF=y, CONFIG_DEBUG_INFO_BTF_MODULES=y) for struct offsets",
    )
}

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
// 6. debugfs

/// Check 6: the `hqds` and `mqds` dumps (HQD slots and queue state). Only opened, never read:
/// reading `hqds` walks the hardware registers.
pub fn debugfs_check(root: &Root, privileged: bool) -> Check {
    const NAME: &str = "debugfs";
    let kfd_dir = root.path("/sys/kernel/debug/kfd");
    let open = |f: &str| fs::File::open(kfd_dir.join(f));
    match (open("hqds"), open("mqds")) {
        (Ok(_), Ok(_)) => return Check::ok(NAME, "/sys/kernel/debug/kfd/{hqds,mqds} readable"),
        (Err(e), _) | (_, Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Check::warn(
                NAME,
                format!("/sys/kernel/debug/kfd is not readable ({e}): no HQD slots or MQD state"),
                if privileged {
                    "check kernel lockdown (/sys/kernel/security/lockdown), which hides debugfs"
                } else {
                    "run as root (debugfs is root-only)"
                },
            )
        }
        _ => {}
    }
    let mounted = root
        .read("/proc/self/mounts")
        .map(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.get(1) == Some(&"/sys/kernel/debug")
            })
        })
        .unwrap_or(false);
    if let Err(e) = fs::read_dir(root.path("/sys/kernel/debug")) {
        if e.kind() == io::ErrorKind::PermissionDenied {
            return Check::warn(
                NAME,
                format!("/sys/kernel/debug is not readable ({e}): no HQD slots or MQD state"),
                "run as root (debugfs is root-only)",
            );
        }
    }
    if !mounted && !kfd_dir.exists() {
        Check::warn(
            NAME,
            "debugfs is not mounted: no HQD slots or MQD state (top and queues show less)",
            "mount -t debugfs none /sys/kernel/debug",
        )
    } else if !kfd_dir.exists() {
        Check::warn(
            NAME,
            "debugfs is mounted but has no kfd directory (amdgpu not loaded?)",
            "load amdgpu (modprobe amdgpu) on a kernel built with CONFIG_DEBUG_FS=y",
        )
    } else {
        Check::warn(
            NAME,
            "/sys/kernel/debug/kfd has no readable hqds/mqds",
            "run as root on a kernel built with CONFIG_DEBUG_FS=y",
        )
    }
}

// -------------------------------------------------------------------------------------------
// 7. /dev/kfd, GET_VERSION and the topology

/// The verdict on a KFD interface version.
pub fn kfd_version_check(major: u32, minor: u32) -> Check {
    const NAME: &str = "kfd";
    if major != 1 {
        return Check::warn(
            NAME,
            format!("KFD {major}.{minor}: an interface major version this tool does not know"),
            "check that this kernel's amdkfd is compatible (gpreempt-ebpf knows KFD 1.x)",
        );
    }
    if minor < 13 {
        return Check::fail(
            NAME,
            format!("KFD {major}.{minor}: the debug API needs KFD 1.13 (Linux 6.4+)"),
            "upgrade to Linux 6.4 or later (or a ROCm amdgpu-dkms driver with KFD 1.13+)",
        );
    }
    Check::ok(NAME, format!("KFD {major}.{minor} (debug API present)"))
}

/// Opens the KFD device and asks its interface version.
pub fn kfd_get_version(dev: &Path) -> io::Result<(u32, u32)> {
    let f = fs::OpenOptions::new().read(true).write(true).open(dev)?;
    let mut v = kfd::GetVersionArgs::default();
    // SAFETY: GET_VERSION encodes size_of::<GetVersionArgs>() bytes out and `v` is a live,
    // exclusive GetVersionArgs; `f` stays open for the call.
    let r = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            kfd::cmd::GET_VERSION as libc::c_ulong,
            &mut v as *mut kfd::GetVersionArgs,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((v.major_version, v.minor_version))
}

fn gpu_list(gpus: &[GpuNode]) -> String {
    gpus.iter()
        .map(|g| format!("{} (node {}, gpu_id {})", g.gfx_target(), g.node, g.gpu_id))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Check 7: the device, its version and the topology's GPUs. `nvidia`: the host has the NVIDIA
/// driver, so a missing KFD only means the AMD backend is not needed.
pub fn kfd_check(
    dev: &Path,
    version: &io::Result<(u32, u32)>,
    topology: &Result<Vec<GpuNode>>,
    nvidia: bool,
) -> Check {
    const NAME: &str = "kfd";
    let d = dev.display();
    let mut c = match version {
        Ok((major, minor)) => kfd_version_check(*major, *minor),
        Err(e) if e.kind() == io::ErrorKind::NotFound && nvidia => {
            return Check::ok(
                NAME,
                format!("no {d}: not an AMD host (its NVIDIA GPUs use the NVIDIA backend)"),
            )
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Check::fail(
                NAME,
                format!("no {d}: no AMD GPU driver (amdkfd) here"),
                "on a host with an AMD Instinct GPU, load amdgpu (modprobe amdgpu)",
            )
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Check::fail(
                NAME,
                format!("cannot open {d} ({e})"),
                "run as root, or add the user to the render group",
            )
        }
        Err(e) => {
            return Check::fail(
                NAME,
                format!("{d}: opening it or GET_VERSION failed ({e})"),
                "check that amdgpu initialised the GPU (dmesg | grep -i kfd)",
            )
        }
    };
    match topology {
        Ok(gpus) if gpus.is_empty() => {
            c.finding += "; the topology lists no GPU";
            if c.verdict == Verdict::Ok {
                c.verdict = Verdict::Fail;
                c.fix =
                    Some("check that amdgpu initialised the GPU (dmesg | grep -i kfd)".to_string());
            }
        }
        Ok(gpus) => {
            c.finding += &format!(
                "; {} GPU{}: {}",
                gpus.len(),
                if gpus.len() == 1 { "" } else { "s" },
                gpu_list(gpus)
            );
        }
        Err(e) => {
            c.finding += &format!("; topology unreadable: {e:#}");
            if c.verdict == Verdict::Ok {
                c.verdict = Verdict::Warn;
                c.fix = Some("check /sys/class/kfd/kfd/topology (sysfs mounted?)".to_string());
            }
        }
    }
    c
}

/// Check 7b (informational): KFD PC sampling. Mainline amdkfd has no PC-sampling ioctl (through
/// KFD 1.18 and the later 1.19/1.20 changes); AMD's out-of-tree amdgpu-dkms has one (nr 0x85), and
/// one DKMS branch numbered it "1.15", so the version cannot tell (docs/kfd.md).
pub fn pc_sampling_check(version: &io::Result<(u32, u32)>) -> Check {
    const NAME: &str = "pc-sampling";
    let what = format!(
        "KFD PC sampling (AMDKFD_IOC_PC_SAMPLE, nr {:#x}) exists only in AMD's amdgpu-dkms driver, mainline amdkfd has none; gpreempt-ebpf does not use it",
        kfd::nr::PC_SAMPLE
    );
    match version {
        Ok((major, minor)) => Check::ok(
            NAME,
            format!("KFD {major}.{minor}: whether this driver has PC sampling cannot be determined from its version (DKMS numbering differs); {what}"),
        ),
        Err(_) => Check::ok(
            NAME,
            format!("cannot be determined: no KFD version (see kfd); {what}"),
        ),
    }
}

// -------------------------------------------------------------------------------------------
// 8. amdgpu module parameters

/// `amdgpu.sched_policy`.
pub fn sched_policy_check(value: Option<&str>) -> Check {
    const NAME: &str = "amdgpu.sched_policy";
    match value.map(str::trim) {
        Some("0") => Check::ok(NAME, "0 (HWS, the default)"),
        Some("1") => Check::warn(
            NAME,
            "1 (HWS_NO_OVERSUBSCRIPTION): more queues than HQD slots are not scheduled",
            "set amdgpu.sched_policy=0 (kernel command line or /etc/modprobe.d) unless you need it",
        ),
        Some("2") => Check::fail(
            NAME,
            "2 (NO_HWS): the debug API refuses NO_HWS",
            "set amdgpu.sched_policy=0 (kernel command line or /etc/modprobe.d) and reboot",
        ),
        Some(v) => Check::warn(
            NAME,
            format!("{v}: an unknown scheduling policy"),
            "set amdgpu.sched_policy=0 (the default, HWS)",
        ),
        None => Check::warn(
            NAME,
            "unreadable",
            "read /sys/module/amdgpu/parameters/sched_policy as root",
        ),
    }
}

/// `amdgpu.cwsr_enable`.
pub fn cwsr_check(value: Option<&str>) -> Check {
    const NAME: &str = "amdgpu.cwsr_enable";
    match value.map(str::trim) {
        Some("0") => Check::fail(
            NAME,
            "0: preemption needs CWSR (without it a long kernel is not preempted and the unmap times out into a GPU reset)",
            "set amdgpu.cwsr_enable=1 (the default) and reboot",
        ),
        Some(v) if v.parse::<i64>().is_ok() => Check::ok(NAME, format!("{v} (CWSR on)")),
        Some(v) => Check::warn(
            NAME,
            format!("{v:?}: not a number"),
            "set amdgpu.cwsr_enable=1 (the default)",
        ),
        None => Check::warn(
            NAME,
            "unreadable",
            "read /sys/module/amdgpu/parameters/cwsr_enable as root",
        ),
    }
}

/// `amdgpu.mes` (informational).
pub fn mes_check(value: Option<&str>) -> Check {
    const NAME: &str = "amdgpu.mes";
    let v = value.map(str::trim).unwrap_or("absent");
    Check::ok(
        NAME,
        format!("{v} (GFX11/12 GPUs use MES regardless; MES GPUs ignore the grace period, MI200/MI300 use HWS)"),
    )
}

/// Check 8: the module parameters, or one warning when amdgpu is not loaded.
pub fn amdgpu_params_checks(root: &Root) -> Vec<Check> {
    if !root.exists("/sys/module/amdgpu") {
        return vec![Check::warn(
            "amdgpu",
            "amdgpu not loaded (no /sys/module/amdgpu)",
            "load amdgpu (modprobe amdgpu) on a host with an AMD GPU",
        )];
    }
    let p = |n: &str| root.value(&format!("/sys/module/amdgpu/parameters/{n}"));
    vec![
        sched_policy_check(p("sched_policy").as_deref()),
        cwsr_check(p("cwsr_enable").as_deref()),
        mes_check(p("mes").as_deref()),
    ]
}

// -------------------------------------------------------------------------------------------
// 9. Per GPU

/// `capability` bits (include/uapi/linux/kfd_sysfs.h).
const HSA_CAP_TRAP_DEBUG_SUPPORT: u64 = kfd::hsa_cap::TRAP_DEBUG_SUPPORT as u64;
const HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED: u64 =
    kfd::hsa_cap::TRAP_DEBUG_FIRMWARE_SUPPORTED as u64;

/// Whether the KFD debugs per VMID on this target (`kfd_dbg_is_per_vmid_supported`: GC 9.4.2,
/// 9.4.3 and later 9.4.x/9.5, and 11.0.0+; docs/kfd.md). GC 9.4.2 is gfx90a (90010),
/// GC 9.4.3/9.4.4 gfx940-942 (9040x), GC 9.5.0 gfx950 (90500).
pub fn per_vmid_debug(gfx_target_version: u32) -> bool {
    gfx_target_version == 90010
        || (90400..90600).contains(&gfx_target_version)
        || gfx_target_version >= 110000
}

/// Check 9 for one GPU node; `capability` from its `properties` when present.
pub fn gpu_check(g: &GpuNode, capability: Option<u64>) -> Check {
    let name = format!("gpu:{}", g.node);
    let gfx = g.gfx_target();
    let mut finding = format!(
        "{gfx} (gpu_id {}, {} CUs, {} HQD slots)",
        g.gpu_id, g.cu_count, g.hqd_slots
    );
    if let Some(c) = capability {
        finding += &format!(
            ", capability {c:#x}: trap debug {}, debug firmware {}",
            if c & HSA_CAP_TRAP_DEBUG_SUPPORT != 0 {
                "yes"
            } else {
                "not advertised"
            },
            if c & HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED != 0 {
                "yes"
            } else {
                "no"
            },
        );
    }
    if g.gfx_target_version >= 110000 {
        finding += "; MES: the suspend grace period is ignored";
    }
    if g.gfx_target_version == 0 {
        return Check::warn(
            &name,
            finding + "; no gfx_target_version in its properties",
            "check /sys/class/kfd/kfd/topology/nodes/N/properties (an old kernel?)",
        );
    }
    if let Some(c) = capability {
        if c & HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED == 0 {
            return Check::warn(
                &name,
                finding + "; the firmware is not advertised as debugger-capable (HSA_CAP_TRAP_DEBUG_FIRMWARE_SUPPORTED clear)",
                "update the GPU firmware (linux-firmware / amdgpu-dkms-firmware)",
            );
        }
    }
    if per_vmid_debug(g.gfx_target_version) {
        Check::ok(
            &name,
            finding + "; per-VMID debug: several processes per device can be controlled",
        )
    } else {
        Check::warn(
            &name,
            finding
                + "; no per-VMID debug: the KFD reserves a debug VMID device-wide, one debugged (controlled) process per device at a time (docs/kfd.md)",
            "for more than one controlled process per GPU use gfx90a (MI200), gfx94x (MI300) or newer",
        )
    }
}

/// Check 9 for every GPU of the topology (nothing when it is unreadable: check 7 says so).
pub fn gpu_checks(root: &Root, topology: &Result<Vec<GpuNode>>) -> Vec<Check> {
    let Ok(gpus) = topology else {
        return Vec::new();
    };
    gpus.iter()
        .map(|g| {
            let props = root
                .read(&format!(
                    "/sys/class/kfd/kfd/topology/nodes/{}/properties",
                    g.node
                ))
                .unwrap_or_default();
            let cap = sysfs::parse_properties(&props).get("capability").copied();
            gpu_check(g, cap)
        })
        .collect()
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

fn numeric_entries(dir: &Path) -> Vec<u32> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
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
                tracer_comm: root
                    .value(&format!("/proc/{tracer}/comm"))
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
    if crate::controller::daemon::lock_held(run_dir) {
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

// -------------------------------------------------------------------------------------------
// 13. NVIDIA (only on hosts with the NVIDIA driver; docs/nvidia-rm.md)

/// The driver version pausing was measured on.
const NV_MEASURED: &str = "580.159.04";
/// Older major versions are untested.
const NV_MIN_MAJOR: u32 = 580;
/// Pausing's other precondition, said on the NVIDIA lines' fixes.
const NV_PTRACE: &str = "pausing duplicates the target's /dev/nvidiactl fd with pidfd_getfd, which needs ptrace-attach rights over it (root, or CAP_SYS_PTRACE with Yama ptrace_scope <= 2: see privileges and ptrace_scope)";

/// Whether this host has the NVIDIA driver: its control device or its procfs version file.
pub fn nvidia_present(root: &Root) -> bool {
    root.exists(gpreempt_common::nv::NVIDIACTL) || root.exists("/proc/driver/nvidia/version")
}

/// The kernel module's version and flavour, from `/proc/driver/nvidia/version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvDriver {
    /// `580.159.04`
    pub version: String,
    pub major: u32,
    /// The open kernel module (`NVIDIA UNIX Open Kernel Module for x86_64`), not the proprietary one.
    pub open: bool,
}

/// Parses the `NVRM version:` line: `NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release
/// Build (...)` or the proprietary `NVIDIA UNIX x86_64 Kernel Module  550.54.14  <date>`.
pub fn parse_nvidia_version(text: &str) -> Option<NvDriver> {
    let line = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("NVRM version:"))?;
    let version = line.split_whitespace().find(|w| {
        w.starts_with(|c: char| c.is_ascii_digit())
            && w.contains('.')
            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
    })?;
    Some(NvDriver {
        version: version.to_string(),
        major: version.split('.').next()?.parse().ok()?,
        open: line.contains("Open Kernel Module"),
    })
}

/// `nvidia-driver`: the version file's text (`None`: unreadable) and whether `/dev/nvidiactl`
/// exists.
pub fn nvidia_driver_check(version_file: Option<&str>, nvidiactl: bool) -> Check {
    const NAME: &str = "nvidia-driver";
    let Some(text) = version_file else {
        let finding = if nvidiactl {
            "/dev/nvidiactl exists but /proc/driver/nvidia/version is unreadable: the nvidia module is not (fully) loaded"
        } else {
            "/proc/driver/nvidia/version is unreadable"
        };
        return Check::fail(
            NAME,
            finding,
            "load the nvidia kernel module (modprobe nvidia) and check dmesg | grep NVRM",
        );
    };
    let Some(d) = parse_nvidia_version(text) else {
        let first = text.lines().next().unwrap_or("").trim();
        return Check::warn(
            NAME,
            format!("/proc/driver/nvidia/version not understood: {first:?}"),
            format!("pausing was measured on the open kernel module {NV_MEASURED}: use it or a later one"),
        );
    };
    let flavour = if d.open {
        "open kernel module"
    } else {
        "proprietary kernel module"
    };
    let finding = format!("NVIDIA {} ({flavour})", d.version);
    if d.major < NV_MIN_MAJOR {
        Check::warn(
            NAME,
            format!("{finding}: pausing was measured on {NV_MEASURED}; older drivers untested"),
            format!("upgrade to the open kernel module {NV_MEASURED} or later (nvidia-open); {NV_PTRACE}"),
        )
    } else if d.version == NV_MEASURED {
        Check::ok(
            NAME,
            format!("{finding}: the driver pausing was measured on"),
        )
    } else {
        Check::ok(
            NAME,
            format!("{finding} (pausing was measured on {NV_MEASURED})"),
        )
    }
}

/// The value of `key:` in a `/proc/driver/nvidia/gpus/*/information` text (`Model: \t\t NVIDIA H200`).
fn info_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix(':'))
        .map(str::trim)
}

/// `nvidia-gsp:<bus id>`: does the GPU run GSP-RM? The driver prints `GPU Firmware: <version>`
/// only when the GPU runs the GSP firmware (`GSP Firmware Version:`, nvidia-smi's spelling, is
/// accepted too); `N/A` or no such line means the legacy, CPU-side RM.
pub fn nvidia_gsp_check(bus_id: &str, information: Option<&str>) -> Check {
    let name = format!("nvidia-gsp:{bus_id}");
    let Some(info) = information else {
        return Check::warn(
            &name,
            format!("/proc/driver/nvidia/gpus/{bus_id}/information is unreadable: GSP unknown"),
            "read it as root; pausing needs the GPU to run GSP-RM",
        );
    };
    let model = info_field(info, "Model").unwrap_or("unknown model");
    let firmware = ["GPU Firmware", "GSP Firmware Version", "GSP Firmware"]
        .iter()
        .find_map(|k| info_field(info, k))
        .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("N/A"));
    match firmware {
        Some(v) => Check::ok(&name, format!("{model}: GSP-RM (GSP firmware {v})")),
        None => Check::fail(
            &name,
            format!("{model}: no GSP firmware (legacy RM): NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS is NOT_SUPPORTED without GSP, so its processes cannot be paused"),
            format!("use the open kernel module (nvidia-open, always GSP-RM) or load the proprietary one with NVreg_EnableGpuFirmware=1 (GSP needs Turing or newer); {NV_PTRACE}"),
        ),
    }
}

/// `nvidia-gsp:*` for every GPU under `/proc/driver/nvidia/gpus`, by bus id.
pub fn nvidia_gsp_checks(root: &Root) -> Vec<Check> {
    let dir = root.path("/proc/driver/nvidia/gpus");
    let mut buses: Vec<String> = fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    buses.sort();
    if buses.is_empty() {
        return vec![Check::warn(
            "nvidia-gsp",
            "no GPU under /proc/driver/nvidia/gpus: GSP unknown",
            "check that the nvidia module initialised the GPUs (nvidia-smi, dmesg | grep NVRM)",
        )];
    }
    buses
        .iter()
        .map(|b| {
            nvidia_gsp_check(
                b,
                fs::read_to_string(dir.join(b).join("information"))
                    .ok()
                    .as_deref(),
            )
        })
        .collect()
}

/// A failed pidfd_getfd probe: the syscall that failed and how.
#[derive(Debug)]
pub struct PidfdError {
    /// `pidfd_open` or `pidfd_getfd`.
    pub call: &'static str,
    pub error: io::Error,
}

/// `pidfd_open` on ourselves, then `pidfd_getfd` of one of our own fds (a fresh `/dev/null`): the
/// syscalls pausing duplicates a target's nvidiactl fd with. Touches nothing but this process.
pub fn try_pidfd_getfd() -> std::result::Result<(), PidfdError> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let err = |call| PidfdError {
        call,
        error: io::Error::last_os_error(),
    };
    let probe = fs::File::open("/dev/null").map_err(|error| PidfdError {
        call: "open(/dev/null)",
        error,
    })?;
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if r < 0 {
        return Err(err("pidfd_open"));
    }
    // SAFETY: `r` is a fresh fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(r as libc::c_int) };
    // SAFETY: pidfd_getfd takes two fds and flags by value and returns a new fd or -1; both fds
    // stay open for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            probe.as_raw_fd(),
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(err("pidfd_getfd"));
    }
    // SAFETY: `r` is a fresh fd that nothing else owns; dropping it closes it.
    drop(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) });
    Ok(())
}

/// `pidfd_getfd`: the outcome of [`try_pidfd_getfd`]; `ptrace`: whether we hold CAP_SYS_PTRACE.
pub fn pidfd_getfd_check(probe: &std::result::Result<(), PidfdError>, ptrace: bool) -> Check {
    const NAME: &str = "pidfd_getfd";
    match probe {
        Ok(()) if ptrace => Check::ok(
            NAME,
            "pidfd_open + pidfd_getfd work (own fd duplicated); with CAP_SYS_PTRACE a target's nvidiactl fd can be duplicated",
        ),
        Ok(()) => Check::warn(
            NAME,
            "pidfd_open + pidfd_getfd work (own fd duplicated), but without CAP_SYS_PTRACE only processes we may ptrace-attach to can be paused",
            format!("run the controller as root; {NV_PTRACE}"),
        ),
        Err(PidfdError { call, error }) => {
            let why = match error.raw_os_error() {
                Some(libc::ENOSYS) if *call == "pidfd_open" => {
                    " (no pidfd_open: Linux < 5.3)".to_string()
                }
                Some(libc::ENOSYS) => " (no pidfd_getfd: Linux < 5.6)".to_string(),
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    " (refused: a seccomp filter or LSM policy?)".to_string()
                }
                _ => String::new(),
            };
            Check::fail(
                NAME,
                format!("{call} failed: {error}{why}: a target's nvidiactl fd cannot be duplicated, so NVIDIA processes cannot be paused"),
                format!("use Linux 5.6 or later, outside a seccomp filter that blocks pidfd_open/pidfd_getfd; {NV_PTRACE}"),
            )
        }
    }
}

/// A running MPS daemon: pid and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsDaemon {
    pub pid: u32,
    pub name: String,
}

/// Processes whose `comm` starts with `nvidia-cuda-mps` (comm is cut at 15 characters, so the
/// control daemon and the server both read `nvidia-cuda-mps`; the name comes from argv[0]).
pub fn mps_daemons(root: &Root) -> Vec<MpsDaemon> {
    let mut pids = numeric_entries(&root.path("/proc"));
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| {
            let comm = root.value(&format!("/proc/{pid}/comm"))?;
            if !comm.starts_with("nvidia-cuda-mps") {
                return None;
            }
            let argv0 = fs::read(root.path(&format!("/proc/{pid}/cmdline")))
                .ok()
                .and_then(|c| {
                    let a = c.split(|&b| b == 0).next()?;
                    let a = String::from_utf8_lossy(a);
                    let base = a.rsplit('/').next()?.to_string();
                    base.starts_with("nvidia-cuda-mps").then_some(base)
                });
            Some(MpsDaemon {
                pid,
                name: argv0.unwrap_or(comm),
            })
        })
        .collect()
}

/// `nvidia-mps`: under MPS every client's work runs on the MPS server's channels.
pub fn mps_check(daemons: &[MpsDaemon]) -> Check {
    const NAME: &str = "nvidia-mps";
    if daemons.is_empty() {
        return Check::ok(NAME, "no MPS daemon: each process has its own channels");
    }
    let list = daemons
        .iter()
        .map(|d| format!("{} (pid {})", d.name, d.pid))
        .collect::<Vec<_>>()
        .join(", ");
    Check::warn(
        NAME,
        format!("MPS running: {list}. MPS: clients share the server's channels; per-process pausing would pause every MPS client"),
        "stop MPS for the processes to control (echo quit | nvidia-cuda-mps-control), or run them outside it",
    )
}

/// Every NVIDIA line, or none when the host has no NVIDIA driver. `pidfd`: the
/// [`try_pidfd_getfd`] outcome (`None`: not probed, no line, as under a fake root).
pub fn nvidia_checks(
    root: &Root,
    pidfd: Option<&std::result::Result<(), PidfdError>>,
    ptrace: bool,
) -> Vec<Check> {
    if !nvidia_present(root) {
        return Vec::new();
    }
    let mut checks = vec![nvidia_driver_check(
        root.read("/proc/driver/nvidia/version").ok().as_deref(),
        root.exists(gpreempt_common::nv::NVIDIACTL),
    )];
    checks.extend(nvidia_gsp_checks(root));
    if let Some(p) = pidfd {
        checks.push(pidfd_getfd_check(p, ptrace));
    }
    checks.push(mps_check(&mps_daemons(root)));
    checks
}

// -------------------------------------------------------------------------------------------
// The report

/// Every check, in order.
pub fn run_checks(root: &Root, kfd_device: &Path, run_dir: &Path) -> Vec<Check> {
    let status = root.read("/proc/self/status").ok();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let (privileges, p) = privileges_check(status.as_deref(), euid);
    let mut checks = vec![privileges];
    checks.push(bpf_check(
        root.value("/proc/sys/kernel/unprivileged_bpf_disabled")
            .as_deref(),
        &try_bpf_map_create(),
    ));
    checks.push(btf_vmlinux_check(root));
    checks.push(btf_amdgpu_check(root));
    let facts = HostProbeFacts::read(&root.base);
    checks.push(btf_offsets_check(&facts));
    checks.push(kprobes_check(root));
    checks.extend(kernel_probe_checks(&facts));
    checks.push(launch_uprobes_check(root));
    checks.push(tracefs_check(root));
    // Loading programs touches the running kernel: only for the host itself, never a fake tree.
    if root.base == Path::new("/") {
        checks.push(if p.bpf {
            ebpf_programs_check(
                &crate::observe::probe::verify_programs(),
                root.value("/sys/kernel/security/lockdown")
                    .as_deref()
                    .and_then(lockdown_mode),
            )
        } else {
            Check::warn(
                "ebpf-programs",
                "not verified: loading programs needs root (or CAP_BPF + CAP_PERFMON)",
                "run gpreempt-ebpf doctor with sudo",
            )
        });
    }
    checks.push(debugfs_check(root, p.admin || euid == 0));
    let topology = sysfs::read_topology(&root.path("/sys/class/kfd/kfd"));
    let version = kfd_get_version(kfd_device);
    checks.push(kfd_check(
        kfd_device,
        &version,
        &topology,
        nvidia_present(root),
    ));
    checks.push(pc_sampling_check(&version));
    checks.extend(amdgpu_params_checks(root));
    checks.extend(gpu_checks(root, &topology));
    // The pidfd probe is a syscall on this process: only for the host itself, and only when it has
    // the NVIDIA driver (nothing NVIDIA is printed elsewhere).
    let pidfd = (root.base == Path::new("/") && nvidia_present(root)).then(try_pidfd_getfd);
    checks.extend(nvidia_checks(root, pidfd.as_ref(), p.ptrace));
    checks.push(ptrace_scope_check(
        root.value("/proc/sys/kernel/yama/ptrace_scope").as_deref(),
        p.ptrace,
    ));
    let (n, traced) = traced_kfd_processes(root, kfd_device, Some(std::process::id()));
    checks.push(traced_check(n, &traced));
    checks.push(controller_check(run_dir));
    checks
}

/// (ok, warn, fail)
pub fn counts(checks: &[Check]) -> (usize, usize, usize) {
    let n = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    (n(Verdict::Ok), n(Verdict::Warn), n(Verdict::Fail))
}

/// The text report: one line per check (verdict, name, finding), its fix below when not ok.
pub fn to_text(checks: &[Check]) -> String {
    // Longer names (the kernel probes') overflow the column rather than widen it for every line.
    const MAX_WIDTH: usize = 20;
    let width = checks
        .iter()
        .map(|c| c.name.len())
        .filter(|&n| n <= MAX_WIDTH)
        .max()
        .unwrap_or(0)
        .max(5);
    let mut s = format!("{:<5} {:<width$} FINDING\n", "", "CHECK");
    for c in checks {
        s += &format!(
            "{:<5} {:<width$} {}\n",
            c.verdict.as_str(),
            c.name,
            c.finding
        );
        if let Some(fix) = &c.fix {
            s += &format!("{:<5} {:<width$} fix: {fix}\n", "", "");
        }
    }
    let (ok, warn, fail) = counts(checks);
    s += &format!("{ok} ok, {warn} warn, {fail} fail\n");
    s
}

#[derive(Serialize)]
struct Report<'a> {
    checks: &'a [Check],
    ok: usize,
    warn: usize,
    fail: usize,
}

/// The JSON report: `{"checks": [{name, verdict, finding, fix}], "ok", "warn", "fail"}`.
pub fn to_json(checks: &[Check]) -> Result<String> {
    let (ok, warn, fail) = counts(checks);
    serde_json::to_string_pretty(&Report {
        checks,
        ok,
        warn,
        fail,
    })
    .context("serialising the report")
}

/// `gpreempt-ebpf doctor`: exit 0 without a failing check, 1 with one.
pub fn main(kfd_device: &Path, json: bool) -> Result<ExitCode> {
    let checks = run_checks(
        &Root::default(),
        kfd_device,
        &crate::controller::daemon::run_dir(),
    );
    let text = if json {
        to_json(&checks)? + "\n"
    } else {
        to_text(&checks)
    };
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        if e.kind() != io::ErrorKind::BrokenPipe {
            return Err(e).context("writing the report");
        }
    }
    let (_, _, fail) = counts(&checks);
    Ok(if fail == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fake `/` removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "gpreempt-doctor-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Self(p)
        }
        fn root(&self) -> Root {
            Root::at(&self.0)
        }
        fn write(&self, abs: &str, text: &str) -> &Self {
            let p = self.root().path(abs);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
            self
        }
        fn mkdir(&self, abs: &str) -> &Self {
            fs::create_dir_all(self.root().path(abs)).unwrap();
            self
        }
        fn link(&self, abs: &str, target: &str) -> &Self {
            let p = self.root().path(abs);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, p).unwrap();
            self
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn verdicts(cs: &[Check]) -> Vec<(&str, Verdict)> {
        cs.iter().map(|c| (c.name.as_str(), c.verdict)).collect()
    }

    #[test]
    fn doctor_sched_policy_verdicts() {
        assert_eq!(sched_policy_check(Some("0\n")).verdict, Verdict::Ok);
        let c = sched_policy_check(Some("1"));
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.fix.is_some());
        let c = sched_policy_check(Some("2\n"));
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.finding.contains("refuses NO_HWS"), "{c:?}");
        assert!(c.fix.unwrap().contains("amdgpu.sched_policy=0"));
        assert_eq!(sched_policy_check(None).verdict, Verdict::Warn);
    }

    #[test]
    fn doctor_cwsr_and_mes() {
        let c = cwsr_check(Some("0\n"));
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.finding.contains("preemption needs CWSR"));
        assert_eq!(cwsr_check(Some("1\n")).verdict, Verdict::Ok);
        assert_eq!(mes_check(Some("0")).verdict, Verdict::Ok);
        assert_eq!(mes_check(None).verdict, Verdict::Ok);
    }

    #[test]
    fn doctor_module_params_from_tree() {
        let t = Tree::new();
        let c = amdgpu_params_checks(&t.root());
        assert_eq!(verdicts(&c), [("amdgpu", Verdict::Warn)]);
        assert!(c[0].finding.contains("amdgpu not loaded"));
        t.write("/sys/module/amdgpu/parameters/sched_policy", "2\n")
            .write("/sys/module/amdgpu/parameters/cwsr_enable", "1\n")
            .write("/sys/module/amdgpu/parameters/mes", "0\n");
        assert_eq!(
            verdicts(&amdgpu_params_checks(&t.root())),
            [
                ("amdgpu.sched_policy", Verdict::Fail),
                ("amdgpu.cwsr_enable", Verdict::Ok),
                ("amdgpu.mes", Verdict::Ok)
            ]
        );
    }

    #[test]
    fn doctor_ptrace_scope_levels() {
        assert_eq!(ptrace_scope_check(None, false).verdict, Verdict::Ok);
        assert_eq!(ptrace_scope_check(Some("0\n"), false).verdict, Verdict::Ok);
        assert_eq!(ptrace_scope_check(Some("1"), true).verdict, Verdict::Ok);
        assert_eq!(ptrace_scope_check(Some("1"), false).verdict, Verdict::Warn);
        assert_eq!(ptrace_scope_check(Some("2"), true).verdict, Verdict::Ok);
        assert_eq!(ptrace_scope_check(Some("2"), false).verdict, Verdict::Warn);
        let c = ptrace_scope_check(Some("3\n"), true);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c
            .finding
            .contains("ptrace disabled: the controller cannot attach"));
    }

    #[test]
    fn doctor_kfd_version_verdicts() {
        let c = kfd_version_check(1, 11);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.finding.contains("needs KFD 1.13 (Linux 6.4+)"), "{c:?}");
        assert_eq!(kfd_version_check(1, 13).verdict, Verdict::Ok);
        assert_eq!(kfd_version_check(1, 18).verdict, Verdict::Ok);
        assert!(kfd_version_check(1, 18).finding.contains("KFD 1.18"));
        assert_eq!(kfd_version_check(2, 0).verdict, Verdict::Warn);
    }

    #[test]
    fn doctor_kfd_check_device_and_topology() {
        let dev = Path::new("/dev/kfd");
        let missing = Err(io::Error::from(io::ErrorKind::NotFound));
        let c = kfd_check(dev, &missing, &Ok(vec![]), false);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.finding.contains("no AMD GPU driver (amdkfd) here"));
        // On an NVIDIA host a missing KFD is no failure; a broken one still is.
        let c = kfd_check(dev, &missing, &Ok(vec![]), true);
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(c.finding.contains("not an AMD host"), "{c:?}");
        let denied = Err(io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(
            kfd_check(dev, &denied, &Ok(vec![]), true).verdict,
            Verdict::Fail
        );
        let g = GpuNode {
            node: 1,
            gpu_id: 4242,
            gfx_target_version: 90010,
            ..Default::default()
        };
        let c = kfd_check(dev, &Ok((1, 18)), &Ok(vec![g]), false);
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(
            c.finding.contains("KFD 1.18") && c.finding.contains("gfx90a"),
            "{c:?}"
        );
        let c = kfd_check(dev, &Ok((1, 18)), &Ok(vec![]), false);
        assert_eq!(c.verdict, Verdict::Fail);
        let c = kfd_check(dev, &Ok((1, 18)), &Err(anyhow::anyhow!("nope")), false);
        assert_eq!(c.verdict, Verdict::Warn);
    }

    #[test]
    fn doctor_gpu_debug_modes() {
        let g = |v| GpuNode {
            node: 1,
            gpu_id: 1,
            gfx_target_version: v,
            ..Default::default()
        };
        let fw = Some(0x283f_8280); // what the emulator advertises for gfx90a
        assert_eq!(gpu_check(&g(90010), fw).verdict, Verdict::Ok); // gfx90a
        assert!(gpu_check(&g(90010), fw)
            .finding
            .contains("trap debug yes, debug firmware yes"));
        assert!(gpu_check(&g(90010), Some(0x2000_0000))
            .finding
            .contains("trap debug not advertised"));
        assert_eq!(gpu_check(&g(90402), fw).verdict, Verdict::Ok); // gfx942
        assert_eq!(gpu_check(&g(110000), fw).verdict, Verdict::Ok); // gfx1100
        assert!(gpu_check(&g(110000), fw)
            .finding
            .contains("grace period is ignored"));
        let c = gpu_check(&g(90008), fw); // gfx908 (MI100)
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c
            .finding
            .contains("one debugged (controlled) process per device"));
        assert_eq!(gpu_check(&g(90010), Some(0x8000)).verdict, Verdict::Warn);
        assert_eq!(gpu_check(&g(90010), None).verdict, Verdict::Ok);
        assert_eq!(gpu_check(&g(0), None).verdict, Verdict::Warn);
    }

    #[test]
    fn doctor_missing_btf_files() {
        let t = Tree::new();
        assert_eq!(btf_vmlinux_check(&t.root()).verdict, Verdict::Warn);
        let c = btf_amdgpu_check(&t.root());
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.fix.unwrap().contains("CONFIG_DEBUG_INFO_BTF_MODULES"));
        t.write("/sys/kernel/btf/vmlinux", "x")
            .write("/sys/kernel/btf/amdgpu", "x");
        assert_eq!(btf_vmlinux_check(&t.root()).verdict, Verdict::Ok);
        assert_eq!(btf_amdgpu_check(&t.root()).verdict, Verdict::Ok);
    }

    #[test]
    fn doctor_kprobes_sources() {
        let t = Tree::new();
        t.write("/proc/kallsyms", "0000 T vfs_read\n")
            .write("/proc/sys/kernel/osrelease", "6.18.0\n");
        let c = kprobes_check(&t.root());
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c
            .finding
            .contains("hardware map/unmap and evictions are not seen"));
        t.write("/boot/config-6.18.0", "# CONFIG_KPROBES is not set\n");
        assert!(kprobes_check(&t.root())
            .finding
            .contains("CONFIG_KPROBES is not set"));
        t.write("/sys/kernel/tracing/kprobe_events", "");
        assert_eq!(kprobes_check(&t.root()).verdict, Verdict::Ok);
        assert_eq!(
            config_option("CONFIG_KPROBES=y\n", "CONFIG_KPROBES"),
            Some(true)
        );
        assert_eq!(
            config_option("CONFIG_KPROBES_X=y\n", "CONFIG_KPROBES"),
            None
        );
    }

    fn by_name<'a>(cs: &'a [Check], name: &str) -> &'a Check {
        cs.iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {cs:#?}"))
    }

    #[test]
    fn doctor_kernel_probes_with_kprobes_and_no_btf() {
        let t = Tree::new();
        t.write("/sys/bus/event_source/devices/kprobe/type", "6\n")
            .write(
                "/proc/kallsyms",
                "ffffffffc0a00000 t kfd_ioctl\t[amdgpu]\n\
                 ffffffffc0a01000 t kgd_gfx_v9_hqd_load\t[amdgpu]\n\
                 ffffffffc0a02000 T kfd_procfs_add_queue\t[amdgpu]\n\
                 ffffffff81000000 T vfs_read\n",
            );
        let facts = HostProbeFacts::read(&t.0);
        let cs = kernel_probe_checks(&facts);
        assert_eq!(cs.len(), PROBES.len());
        assert!(cs.iter().all(|c| c.verdict != Verdict::Fail), "{cs:#?}");
        // No fields needed: attachable on the kprobe PMU alone.
        let c = by_name(&cs, "probe:kfd_ioctl");
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(c.finding.starts_with("attachable (kprobe): "), "{c:?}");
        let c = by_name(&cs, "probe:kgd_gfx_v9_hqd_load/kgd_gfx_v9_4_3_hqd_load");
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(
            c.finding
                .starts_with("attachable (kprobe) on kgd_gfx_v9_hqd_load: "),
            "{c:?}"
        );
        // Not in kallsyms: amdgpu.
        let c = by_name(
            &cs,
            "probe:kgd_gfx_v9_hqd_destroy/kgd_gfx_v9_4_3_hqd_destroy",
        );
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.finding.contains("not in /proc/kallsyms"), "{c:?}");
        assert!(
            c.fix.as_deref().unwrap().starts_with("load amdgpu"),
            "{c:?}"
        );
        // In kallsyms but its struct offsets are unknown: BTF.
        let c = by_name(&cs, "probe:kfd_procfs_add_queue");
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.finding.contains("struct offsets unknown"), "{c:?}");
        assert!(c.finding.contains("CONFIG_DEBUG_INFO_BTF"), "{c:?}");
        assert!(
            c.fix
                .as_deref()
                .unwrap()
                .contains("CONFIG_DEBUG_INFO_BTF_MODULES"),
            "{c:?}"
        );
        assert!(c.finding.contains("the ioctl tracepoints remain"), "{c:?}");

        let c = btf_offsets_check(&facts);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(
            c.finding
                .starts_with(&format!("0/{} fields resolved; ", FIELDS.len())),
            "{c:?}"
        );
        assert!(
            c.finding.contains("/sys/kernel/btf/vmlinux is missing"),
            "{c:?}"
        );

        let c = launch_uprobes_check(&t.root());
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.finding.contains("CONFIG_UPROBES"), "{c:?}");
        t.write("/sys/bus/event_source/devices/uprobe/type", "7\n");
        let c = launch_uprobes_check(&t.root());
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(c.finding.contains("hipLaunchKernel"), "{c:?}");
    }

    #[test]
    fn doctor_kernel_probes_without_the_kprobe_pmu() {
        let t = Tree::new();
        t.write("/proc/kallsyms", "ffffffffc0a00000 t kfd_ioctl\t[amdgpu]\n");
        let facts = HostProbeFacts::read(&t.0);
        let cs = kernel_probe_checks(&facts);
        assert_eq!(cs.len(), PROBES.len());
        for c in &cs {
            assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
            assert!(c.finding.contains("no kprobe PMU"), "{c:?}");
            assert!(
                c.fix.as_deref().unwrap().contains("CONFIG_KPROBES=y"),
                "{c:?}"
            );
        }
        // kfd_ioctl in vmlinux BTF (amdgpu built in): fentry needs no kprobes.
        let facts = HostProbeFacts {
            kfd_ioctl_in_vmlinux: true,
            ..facts
        };
        let c = &kernel_probe_checks(&facts)[0];
        assert_eq!(c.name, "probe:kfd_ioctl");
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(c.finding.starts_with("attachable (fentry)"), "{c:?}");
    }

    #[test]
    fn doctor_btf_offsets_ok_when_every_needed_field_resolves() {
        use gpreempt_common::kprobe::{field, KernelOffsets};
        let mut offsets = KernelOffsets::default();
        let mut missing = Vec::new();
        for f in FIELDS.iter() {
            if f.id == field::PROCESS_PASID {
                missing.push((f.id, "struct kfd_process has no member pasid".to_string()));
            } else {
                offsets.set(f.id, 8, 4);
            }
        }
        let facts = HostProbeFacts {
            kprobes: Ok(()),
            kallsyms: Default::default(),
            offsets,
            missing,
            kfd_ioctl_in_vmlinux: false,
        };
        let c = btf_offsets_check(&facts);
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        let n = FIELDS.len();
        assert!(
            c.finding.starts_with(&format!(
                "{}/{n} fields resolved (every field a probe needs)",
                n - 1
            )),
            "{c:?}"
        );
        assert!(c.finding.contains("kfd_process.pasid"), "{c:?}");
    }

    #[test]
    fn doctor_ebpf_programs_verdicts() {
        let pc = |name: &str, r: Result<&str, &str>| ProgramCheck {
            program: name.into(),
            result: r.map(str::to_string).map_err(str::to_string),
        };
        let all_ok = Ok(vec![
            pc(
                "fe_kfd_ioctl",
                Ok("verified against compat_ptr_ioctl (same prototype as kfd_ioctl)"),
            ),
            pc("kfd_ioctl_enter", Ok("")),
            pc("kp_unmap", Ok("")),
        ]);
        let c = ebpf_programs_check(&all_ok, Some("none"));
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(
            c.finding.starts_with("3 programs pass the verifier"),
            "{c:?}"
        );
        assert!(
            c.finding.contains("compat_ptr_ioctl (same prototype"),
            "{c:?}"
        );

        let refused = Ok(vec![
            pc(
                "fe_kfd_ioctl",
                Err("Operation not permitted (os error 1): "),
            ),
            pc("kfd_ioctl_enter", Ok("")),
        ]);
        let c = ebpf_programs_check(&refused, Some("integrity"));
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.finding.starts_with("1/2 programs pass"), "{c:?}");
        assert!(c.finding.contains("lockdown (integrity)") && c.finding.contains("fe_kfd_ioctl"));
        assert!(c.fix.unwrap().contains("without lockdown"));

        let log = "Permission denied (os error 13): 0: (bf) r6 = r1\n1: (85) call 113\n\
                   2: (b7) r0 = 0\n3: (95) exit\nR1 invalid mem access 'scalar'\n\
                   processed 4 insns (limit 1000000)\n";
        let rejected = Ok(vec![
            pc("kp_unmap", Err(log)),
            pc("kfd_ioctl_enter", Ok("")),
        ]);
        let c = ebpf_programs_check(&rejected, None);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(
            c.finding
                .contains("the verifier rejected kp_unmap: Permission denied"),
            "{c:?}"
        );
        assert!(c.finding.contains("R1 invalid mem access"), "{c:?}");
        assert!(
            !c.finding.contains("(b7) r0 = 0"),
            "only the head and tail: {c:?}"
        );

        let no_btf = Ok(vec![pc(
            "fe_kfd_ioctl",
            Err("no vmlinux BTF: fentry programs cannot load"),
        )]);
        assert_eq!(ebpf_programs_check(&no_btf, None).verdict, Verdict::Warn);
        let c = ebpf_programs_check(&Err(anyhow::anyhow!("EPERM")), None);
        assert_eq!(c.verdict, Verdict::Fail);

        assert_eq!(
            lockdown_mode("none [integrity] confidentiality\n"),
            Some("integrity")
        );
        assert_eq!(
            lockdown_mode("[none] integrity confidentiality"),
            Some("none")
        );
        assert_eq!(lockdown_mode(""), None);
    }

    #[test]
    fn doctor_pc_sampling_is_informational() {
        let c = pc_sampling_check(&Ok((1, 18)));
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(c.finding.starts_with("KFD 1.18: "), "{c:?}");
        assert!(c.finding.contains("cannot be determined"), "{c:?}");
        assert!(c.finding.contains("nr 0x85"), "{c:?}");
        let c = pc_sampling_check(&Err(io::Error::from(io::ErrorKind::NotFound)));
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(
            c.finding
                .starts_with("cannot be determined: no KFD version"),
            "{c:?}"
        );
    }

    #[test]
    fn doctor_tracefs_and_debugfs() {
        let t = Tree::new();
        t.write("/proc/filesystems", "nodev\ttracefs\n");
        assert_eq!(tracefs_check(&t.root()).verdict, Verdict::Warn);
        t.write("/proc/filesystems", "nodev\tproc\n");
        assert_eq!(tracefs_check(&t.root()).verdict, Verdict::Fail);
        t.mkdir("/sys/kernel/tracing/events/syscalls/sys_enter_ioctl")
            .mkdir("/sys/kernel/tracing/events/sched/sched_process_exit");
        let c = tracefs_check(&t.root());
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.finding.contains("sys_exit_ioctl"), "{c:?}");
        t.mkdir("/sys/kernel/tracing/events/syscalls/sys_exit_ioctl");
        assert_eq!(tracefs_check(&t.root()).verdict, Verdict::Ok);

        t.write("/proc/self/mounts", "proc /proc proc rw 0 0\n");
        let c = debugfs_check(&t.root(), true);
        assert_eq!(c.verdict, Verdict::Warn);
        assert_eq!(
            c.fix.as_deref(),
            Some("mount -t debugfs none /sys/kernel/debug")
        );
        t.write("/sys/kernel/debug/kfd/hqds", "")
            .write("/sys/kernel/debug/kfd/mqds", "");
        assert_eq!(debugfs_check(&t.root(), true).verdict, Verdict::Ok);
    }

    #[test]
    fn doctor_privileges_from_capeff() {
        let st = |caps: u64| format!("Name:\tx\nCapEff:\t{caps:016x}\n");
        let (c, p) = privileges_check(Some(&st(0x1ff_ffff_ffff)), 0);
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(p.bpf && p.ptrace);
        let bpf_perfmon = (1 << CAP_BPF) | (1 << CAP_PERFMON);
        let (c, _) = privileges_check(Some(&st(bpf_perfmon)), 1000);
        assert_eq!(c.verdict, Verdict::Warn);
        let (c, p) = privileges_check(Some(&st(0)), 1000);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(!p.bpf);
        assert_eq!(privileges_check(None, 0).0.verdict, Verdict::Ok);
        assert_eq!(privileges_check(None, 1000).0.verdict, Verdict::Fail);
    }

    #[test]
    fn doctor_bpf_verdicts() {
        assert_eq!(bpf_check(Some("2\n"), &Ok(())).verdict, Verdict::Ok);
        let eperm = Err(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(bpf_check(Some("2"), &eperm).verdict, Verdict::Fail);
        let enosys = Err(io::Error::from_raw_os_error(libc::ENOSYS));
        assert_eq!(bpf_check(None, &enosys).verdict, Verdict::Fail);
    }

    #[test]
    fn doctor_traced_processes_from_fake_proc() {
        let t = Tree::new();
        // 100: holds /dev/kfd open, traced by gdb (200).
        t.write("/proc/100/status", "Name:\tpython3\nTracerPid:\t200\n")
            .link("/proc/100/fd/3", "/dev/kfd")
            .link("/proc/100/fd/0", "/dev/null")
            .write("/proc/200/status", "Name:\tgdb\nTracerPid:\t0\n")
            .write("/proc/200/comm", "gdb\n")
            // 300: listed by the KFD, untraced.
            .write("/proc/300/status", "Name:\tworker\nTracerPid:\t0\n")
            .mkdir("/sys/class/kfd/kfd/proc/300")
            // 400: listed by the KFD, held by the controller (500).
            .write("/proc/400/status", "Name:\ttrain\nTracerPid:\t500\n")
            .mkdir("/sys/class/kfd/kfd/proc/400")
            .write("/proc/500/comm", "gpreempt-ebpf\n")
            // 600: traced but no KFD process.
            .write("/proc/600/status", "Name:\tls\nTracerPid:\t200\n");
        let (n, traced) = traced_kfd_processes(&t.root(), Path::new("/dev/kfd"), Some(999));
        assert_eq!(n, 3);
        assert_eq!(
            traced,
            [
                Traced {
                    pid: 100,
                    comm: "python3".into(),
                    tracer: 200,
                    tracer_comm: "gdb".into()
                },
                Traced {
                    pid: 400,
                    comm: "train".into(),
                    tracer: 500,
                    tracer_comm: "gpreempt-ebpf".into()
                }
            ]
        );
        let c = traced_check(n, &traced);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(
            c.finding.contains("pid 100 (python3) traced by 200 (gdb)")
                && !c.finding.contains("pid 400"),
            "{c:?}"
        );
        assert_eq!(traced_check(n, &traced[1..]).verdict, Verdict::Ok);
        assert_eq!(traced_check(0, &[]).verdict, Verdict::Ok);
    }

    #[test]
    fn doctor_report_counts_text_and_json() {
        let cs = vec![
            Check::ok("a", "fine"),
            Check::warn("b", "meh", "do x"),
            Check::fail("c", "bad", "do y"),
        ];
        assert_eq!(counts(&cs), (1, 1, 1));
        let text = to_text(&cs);
        assert!(text.contains("fail  c"), "{text}");
        assert!(text.contains("fix: do y"), "{text}");
        assert!(text.ends_with("1 ok, 1 warn, 1 fail\n"), "{text}");
        // A long name overflows its column instead of widening every line.
        let mut long = cs.clone();
        long.push(Check::ok("probe:a_very_long_function/another_one", "x"));
        let text = to_text(&long);
        assert!(text.contains("ok    a     fine\n"), "{text}");
        assert!(
            text.contains("ok    probe:a_very_long_function/another_one x\n"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&to_json(&cs).unwrap()).unwrap();
        assert_eq!(v["fail"], 1);
        assert_eq!(v["checks"][1]["verdict"], "warn");
        assert_eq!(v["checks"][0]["fix"], serde_json::Value::Null);
    }

    #[test]
    fn doctor_controller_lock() {
        let t = Tree::new();
        assert!(controller_check(&t.0)
            .finding
            .contains("no controller running"));
        let _lock = crate::controller::daemon::Lock::acquire(&t.0).unwrap();
        let c = controller_check(&t.0);
        assert!(
            c.finding.contains(&format!("pid {}", std::process::id())),
            "{c:?}"
        );
    }

    // What the open kernel module 580.159.04 prints (an H200, GSP-RM), verbatim.
    const NV_OPEN_580: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";
    const H200_INFO: &str = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 41\nGPU UUID: \t GPU-030c94aa-1b45-c8bb-b21a-a586bf0e7e3e\nVideo BIOS: \t 96.00.a5.00.1a\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n";
    // The proprietary module's line; a GPU without GSP prints no firmware line.
    const NV_PROP_535: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
    const T4_INFO_NO_GSP: &str = "Model: \t\t Tesla T4\nIRQ:   \t\t 35\nBus Location: \t 0000:00:1e.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n";

    fn nv_names(cs: &[Check]) -> Vec<&str> {
        cs.iter()
            .map(|c| c.name.as_str())
            .filter(|n| n.starts_with("nvidia") || *n == "pidfd_getfd")
            .collect()
    }

    #[test]
    fn doctor_nvidia_version_lines() {
        assert_eq!(
            parse_nvidia_version(NV_OPEN_580),
            Some(NvDriver {
                version: "580.159.04".into(),
                major: 580,
                open: true
            })
        );
        assert_eq!(
            parse_nvidia_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
            ),
            Some(NvDriver {
                version: "550.54.14".into(),
                major: 550,
                open: false
            })
        );
        assert_eq!(parse_nvidia_version("GCC version: 12.2.0\n"), None);

        let c = nvidia_driver_check(Some(NV_OPEN_580), true);
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(
            c.finding
                .starts_with("NVIDIA 580.159.04 (open kernel module)"),
            "{c:?}"
        );
        let c = nvidia_driver_check(
            Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build\n"),
            true,
        );
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(c.finding.contains("measured on 580.159.04"), "{c:?}");
        let c = nvidia_driver_check(Some(NV_PROP_535), true);
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(
            c.finding.starts_with("NVIDIA 535.183.01 (proprietary kernel module): pausing was measured on 580.159.04; older drivers untested"),
            "{c:?}"
        );
        assert!(c.fix.unwrap().contains("ptrace-attach rights"));
        let c = nvidia_driver_check(None, true);
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.finding.starts_with("/dev/nvidiactl exists"), "{c:?}");
        assert_eq!(
            nvidia_driver_check(Some("garbage\n"), true).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn doctor_nvidia_gsp_lines() {
        let c = nvidia_gsp_check("0000:00:06.0", Some(H200_INFO));
        assert_eq!(c.name, "nvidia-gsp:0000:00:06.0");
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert_eq!(c.finding, "NVIDIA H200: GSP-RM (GSP firmware 580.159.04)");
        // nvidia-smi's spelling, with N/A: legacy RM.
        let na = "Model: \t\t NVIDIA A100-SXM4-40GB\nGSP Firmware Version: \t N/A\n";
        let c = nvidia_gsp_check("0000:07:00.0", Some(na));
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(
            c.finding
                .starts_with("NVIDIA A100-SXM4-40GB: no GSP firmware"),
            "{c:?}"
        );
        assert!(c.finding.contains("NOT_SUPPORTED without GSP"), "{c:?}");
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("open kernel module") && fix.contains("NVreg_EnableGpuFirmware=1"),
            "{fix}"
        );
        let c = nvidia_gsp_check("0000:00:1e.0", Some(T4_INFO_NO_GSP));
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.finding.starts_with("Tesla T4: "), "{c:?}");
        assert_eq!(
            nvidia_gsp_check("0000:00:1e.0", None).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn doctor_pidfd_getfd_lines() {
        // This process duplicating its own fd: works on any Linux 5.6+.
        let probe = try_pidfd_getfd();
        assert!(probe.is_ok(), "{probe:?}");
        assert_eq!(pidfd_getfd_check(&Ok(()), true).verdict, Verdict::Ok);
        let c = pidfd_getfd_check(&Ok(()), false);
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.fix.unwrap().contains("ptrace-attach rights"));
        let e = |call, errno| {
            Err(PidfdError {
                call,
                error: io::Error::from_raw_os_error(errno),
            })
        };
        let c = pidfd_getfd_check(&e("pidfd_getfd", libc::ENOSYS), true);
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(
            c.finding.starts_with("pidfd_getfd failed: ")
                && c.finding.contains("(no pidfd_getfd: Linux < 5.6)"),
            "{c:?}"
        );
        let c = pidfd_getfd_check(&e("pidfd_open", libc::ENOSYS), true);
        assert!(c.finding.contains("Linux < 5.3"), "{c:?}");
        let c = pidfd_getfd_check(&e("pidfd_getfd", libc::EPERM), true);
        assert!(c.finding.contains("seccomp"), "{c:?}");
        assert!(c.fix.unwrap().contains("CAP_SYS_PTRACE"));
    }

    #[test]
    fn doctor_nvidia_open_580_with_gsp_is_all_ok() {
        let t = Tree::new();
        t.write("/dev/nvidiactl", "")
            .write("/proc/driver/nvidia/version", NV_OPEN_580)
            .write(
                "/proc/driver/nvidia/gpus/0000:00:06.0/information",
                H200_INFO,
            )
            .write("/proc/1/comm", "init\n")
            .write("/proc/4242/comm", "python3\n");
        let cs = nvidia_checks(&t.root(), Some(&Ok(())), true);
        assert_eq!(
            verdicts(&cs),
            [
                ("nvidia-driver", Verdict::Ok),
                ("nvidia-gsp:0000:00:06.0", Verdict::Ok),
                ("pidfd_getfd", Verdict::Ok),
                ("nvidia-mps", Verdict::Ok),
            ],
            "{cs:#?}"
        );
        // Not probed (a fake root): no pidfd_getfd line.
        assert_eq!(
            nv_names(&nvidia_checks(&t.root(), None, true)),
            ["nvidia-driver", "nvidia-gsp:0000:00:06.0", "nvidia-mps"]
        );
    }

    #[test]
    fn doctor_nvidia_proprietary_535_without_gsp() {
        let t = Tree::new();
        t.write("/dev/nvidiactl", "")
            .write("/proc/driver/nvidia/version", NV_PROP_535)
            .write(
                "/proc/driver/nvidia/gpus/0000:00:1e.0/information",
                T4_INFO_NO_GSP,
            )
            .write(
                "/proc/driver/nvidia/gpus/0000:00:1f.0/information",
                H200_INFO,
            );
        let cs = nvidia_checks(&t.root(), None, true);
        assert_eq!(
            verdicts(&cs),
            [
                ("nvidia-driver", Verdict::Warn),
                ("nvidia-gsp:0000:00:1e.0", Verdict::Fail),
                ("nvidia-gsp:0000:00:1f.0", Verdict::Ok),
                ("nvidia-mps", Verdict::Ok),
            ],
            "{cs:#?}"
        );
        // The driver loaded but listing no GPU: one warning.
        let t = Tree::new();
        t.write("/proc/driver/nvidia/version", NV_OPEN_580);
        let cs = nvidia_checks(&t.root(), None, true);
        assert_eq!(
            verdicts(&cs),
            [
                ("nvidia-driver", Verdict::Ok),
                ("nvidia-gsp", Verdict::Warn),
                ("nvidia-mps", Verdict::Ok),
            ]
        );
        // /dev/nvidiactl without the version file: the driver line fails.
        let t = Tree::new();
        t.write("/dev/nvidiactl", "");
        assert_eq!(
            nvidia_checks(&t.root(), None, true)[0].verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn doctor_nvidia_mps_running() {
        let t = Tree::new();
        t.write("/dev/nvidiactl", "")
            .write("/proc/driver/nvidia/version", NV_OPEN_580)
            .write(
                "/proc/driver/nvidia/gpus/0000:00:06.0/information",
                H200_INFO,
            )
            .write("/proc/77/comm", "nvidia-cuda-mps\n")
            .write("/proc/77/cmdline", "/usr/bin/nvidia-cuda-mps-control\0-d\0")
            .write("/proc/78/comm", "nvidia-cuda-mps\n")
            .write("/proc/78/cmdline", "nvidia-cuda-mps-server\0")
            .write("/proc/79/comm", "nvidia-cuda-mps\n") // cmdline unreadable: comm
            .write("/proc/80/comm", "python3\n");
        assert_eq!(
            mps_daemons(&t.root()),
            [
                MpsDaemon {
                    pid: 77,
                    name: "nvidia-cuda-mps-control".into()
                },
                MpsDaemon {
                    pid: 78,
                    name: "nvidia-cuda-mps-server".into()
                },
                MpsDaemon {
                    pid: 79,
                    name: "nvidia-cuda-mps".into()
                },
            ]
        );
        let cs = nvidia_checks(&t.root(), None, true);
        let c = by_name(&cs, "nvidia-mps");
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(
            c.finding.starts_with(
                "MPS running: nvidia-cuda-mps-control (pid 77), nvidia-cuda-mps-server (pid 78)"
            ),
            "{c:?}"
        );
        assert!(
            c.finding.contains("MPS: clients share the server's channels; per-process pausing would pause every MPS client"),
            "{c:?}"
        );
        assert!(c.fix.as_deref().unwrap().contains("stop MPS"), "{c:?}");
        assert_eq!(mps_check(&[]).verdict, Verdict::Ok);
        assert!(mps_check(&[]).finding.starts_with("no MPS daemon"));
    }

    #[test]
    fn doctor_no_nvidia_line_on_an_amd_host() {
        let t = Tree::new();
        t.write("/dev/kfd", "")
            .write("/sys/module/amdgpu/parameters/sched_policy", "0\n")
            .write("/proc/100/comm", "nvidia-cuda-mps\n") // a stray name is not a driver
            .write(
                "/proc/self/status",
                "Name:\tdoctor\nCapEff:\t000001ffffffffff\n",
            );
        assert!(!nvidia_present(&t.root()));
        // Even with a probe outcome at hand, nothing NVIDIA without the driver.
        assert!(nvidia_checks(&t.root(), Some(&Ok(())), true).is_empty());
        let cs = run_checks(&t.root(), &t.root().path("/dev/kfd"), &t.0);
        assert!(nv_names(&cs).is_empty(), "{cs:#?}");
    }
}
