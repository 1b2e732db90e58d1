//! `doctor`: is this host ready for gpreempt-ebpf, and what to change if not.
//!
//! Every check reads files below a [`Root`] (`/` on a host; tests point it at a fake tree) and
//! returns a [`Check`]: a verdict, one finding and, when not ok, one actionable fix. Only five
//! things touch the running kernel directly: the bpf(2) map-create probe, loading (verifying, never
//! attaching) every eBPF program when the root is `/`, opening the KFD device with its GET_VERSION
//! ioctl, the controller lock, and (on NVIDIA hosts, root `/` only) `pidfd_getfd` of one of our own
//! fds. The NVIDIA lines appear only where the NVIDIA driver is. Unreadable files are findings,
//! never errors: the command always prints every line.
//!
//! The checks live by concern: [`generic`] (host-wide), [`amd`] and [`nvidia`]; this module
//! holds the report's types, runs every check in report order ([`run_checks`]) and prints it.

use std::{
    io::{self, Write},
    path::Path,
    process::ExitCode,
};

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::{observe::kfd::sysfs, observe::probe::HostProbeFacts};

pub mod amd;
mod check;
pub mod generic;
pub mod nvidia;

pub use check::{Check, Root, Verdict};

use amd::{
    amdgpu_params_checks, btf_amdgpu_check, btf_offsets_check, debugfs_check, gpu_checks,
    ioctl_filter_check, ioctl_source_check, kernel_probe_checks, kfd_check, kfd_get_version,
    pc_sampling_check,
};
use generic::{
    bpf_check, btf_vmlinux_check, controller_check, ebpf_programs_check, kprobes_check,
    launch_uprobes_check, lockdown_mode, privileges_check, ptrace_scope_check, suspendable_check,
    traced_check, traced_kfd_processes, tracefs_check, try_bpf_map_create,
};
use nvidia::{nvidia_checks, nvidia_present, try_pidfd_getfd};

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
    // A host with the NVIDIA driver and no trace of amdgpu gets one line for every AMD check.
    let amd = amd_applies(root, kfd_device);
    if amd {
        checks.push(btf_amdgpu_check(root));
    }
    let facts = HostProbeFacts::read(&root.base);
    if amd {
        checks.push(btf_offsets_check(&facts));
    }
    let mut devices = crate::observe::gpufiles::Devices::read(kfd_device, &[]);
    devices.kprobed = facts.kfd_pair().is_ok();
    let (rules, _) = devices.rules();
    checks.push(ioctl_filter_check(
        &facts,
        &crate::observe::gpufiles::describe(&rules),
    ));
    // Attaching for a moment is the only way to know: lockdown, LSMs and trampoline support
    // decide, not the BTF alone. Only on the running host.
    let fentry = (root.base == Path::new("/") && p.bpf)
        .then(|| crate::observe::probe::try_fentry_pair(&facts));
    if amd {
        checks.push(ioctl_source_check(&facts, &devices, fentry.as_ref()));
    }
    checks.push(kprobes_check(root));
    if amd {
        checks.extend(kernel_probe_checks(&facts));
    }
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
    if amd {
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
    } else {
        checks.push(Check::ok(
            "amd",
            "not applicable: no amdgpu on this host (no amdgpu module, no KFD node; the NVIDIA \
             driver is loaded): the AMD checks are skipped",
        ));
    }
    // The pidfd probe is a syscall on this process: only for the host itself, and only when it has
    // the NVIDIA driver (nothing NVIDIA is printed elsewhere).
    let pidfd = (root.base == Path::new("/") && nvidia_present(root)).then(try_pidfd_getfd);
    checks.extend(nvidia_checks(root, pidfd.as_ref(), p.ptrace));
    if nvidia_present(root) {
        let by_file = facts
            .offsets
            .has_all(gpreempt_common::kprobe::field::FILE_CHAIN);
        let plan = facts.nv_plan(true, crate::observe::probe::IoctlSource::Auto, by_file);
        let trial = (root.base == Path::new("/") && p.bpf).then(|| {
            plan.as_ref()
                .map_err(Clone::clone)
                .and_then(|pl| crate::observe::probe::try_nv_pair(&facts, pl))
        });
        checks.push(nvidia::nvidia_ioctl_source_check(&plan, trial.as_ref()));
    }
    checks.push(ptrace_scope_check(
        root.value("/proc/sys/kernel/yama/ptrace_scope").as_deref(),
        p.ptrace,
    ));
    let (n, traced) = traced_kfd_processes(root, kfd_device, Some(std::process::id()));
    checks.push(traced_check(n, &traced));
    checks.push(controller_check(run_dir));
    let status = crate::observe::status::lock_held(run_dir)
        .then(|| crate::observe::status::read_status(run_dir))
        .flatten();
    checks.push(suspendable_check(status.as_ref()));
    checks
}

/// Whether the AMD checks apply: the host has amdgpu (its module, the KFD topology or the KFD
/// node), or has no NVIDIA driver either (then they say what an AMD host needs).
pub fn amd_applies(root: &Root, kfd_device: &Path) -> bool {
    !nvidia_present(root)
        || root.exists("/sys/module/amdgpu")
        || root.exists("/sys/class/kfd/kfd")
        || kfd_device.exists()
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
        // Findings quote process names and files: one line each, nothing a terminal obeys.
        s += &format!(
            "{:<5} {:<width$} {}\n",
            c.verdict.as_str(),
            c.name,
            crate::term::clean(&c.finding)
        );
        if let Some(fix) = &c.fix {
            s += &format!(
                "{:<5} {:<width$} fix: {}\n",
                "",
                "",
                crate::term::clean(fix)
            );
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
    let checks = run_checks(&Root::default(), kfd_device, &crate::rundir::run_dir());
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
mod tests;
