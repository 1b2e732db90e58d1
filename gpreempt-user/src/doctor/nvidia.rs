//! NVIDIA checks, printed only where the NVIDIA driver is: the driver version, GSP-RM per GPU,
//! the pidfd_getfd pausing needs, and MPS daemons.

use std::{fs, io, os::fd::AsRawFd};

use super::check::{numeric_entries, Check, Root};

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

/// `nvidia-gpus`: the GPUs by the ids nvidia-smi and dcgm-exporter use (index, name, PCI bus id,
/// UUID), as `top` and `queues` name them.
pub fn nvidia_gpus_check(gpus: &[crate::observe::nv::gpus::NvGpu]) -> Check {
    let list: Vec<String> = gpus
        .iter()
        .map(|g| format!("GPU {}", g.describe()))
        .collect();
    Check::ok(
        "nvidia-gpus",
        format!(
            "{} GPU{}: {}",
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" },
            list.join("; ")
        ),
    )
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
    let gpus = crate::observe::nv::gpus::read(&root.path("/proc"));
    if !gpus.is_empty() {
        checks.push(nvidia_gpus_check(&gpus));
    }
    checks.extend(nvidia_gsp_checks(root));
    if let Some(p) = pidfd {
        checks.push(pidfd_getfd_check(p, ptrace));
    }
    checks.push(mps_check(&mps_daemons(root)));
    checks
}

/// Where NVIDIA RM escapes come from: a pair on `nvidia_unlocked_ioctl` (fentry/fexit against
/// the nvidia module's BTF, or kprobes), so that no other ioctl on the host runs a program, or
/// the syscall tracepoints (every ioctl on the host pays). `plan`: the sources this host offers
/// ([`crate::observe::probe::HostProbeFacts::nv_plan`]); `trial`: attaching it for a moment (None:
/// not tried, not the running host).
pub fn nvidia_ioctl_source_check(
    plan: &std::result::Result<Vec<crate::observe::probe::Pair>, String>,
    trial: Option<&std::result::Result<crate::observe::probe::Pair, String>>,
) -> Check {
    use crate::observe::probe::NV_IOCTL;
    const NAME: &str = "nvidia-ioctl-source";
    match (plan, trial) {
        (_, Some(Ok(p))) => Check::ok(
            NAME,
            format!(
                "RM escapes from a {} pair on {NV_IOCTL}: no other ioctl on the host runs a program",
                p.name()
            ),
        ),
        (Ok(_), None) => Check::ok(
            NAME,
            format!("a pair on {NV_IOCTL} can be the source (not tried here)"),
        ),
        (Err(why), _) | (_, Some(Err(why))) => Check::warn(
            NAME,
            format!(
                "RM escapes from the syscall tracepoints ({why}): every ioctl on the host runs \
                 the filter"
            ),
            "a kernel with BPF trampolines and an nvidia module built with BTF \
             (CONFIG_DEBUG_INFO_BTF_MODULES, pahole at DKMS build time), or CONFIG_KPROBES, makes \
             nvidia_unlocked_ioctl the source",
        ),
    }
}
