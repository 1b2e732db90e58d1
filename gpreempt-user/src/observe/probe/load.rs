//! Getting the programs into the kernel: the privilege and tracefs checks, loading the object,
//! the verifier's verdict per program (doctor), and the sentences that explain a failure.

use std::path::Path;

use anyhow::{bail, Context as _, Result};
use aya::{Ebpf, EbpfLoader};

use super::kfd_ioctl_target;

/// The programs, built by build.rs from gpreempt-ebpf (public for the licence test, which reads
/// the object's `license` section).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpreempt-ebpf"));

const TRACEFS: &str = "/sys/kernel/tracing";

/// Checks that loading can work here, turning the usual failures into one actionable sentence.
pub fn preflight() -> Result<()> {
    if !has_bpf_privileges() {
        bail!(
            "gpreempt-ebpf loads eBPF programs and needs root (or CAP_BPF + CAP_PERFMON): run it with sudo"
        );
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        log::warn!(
            "this kernel exposes no BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF): the ioctl \
             tracepoints work, kernel-internal probes will not"
        );
    }
    ensure_tracefs()
}

/// Effective capabilities allow bpf(2) program loads and tracepoint attach.
fn has_bpf_privileges() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").ok();
    match status.as_deref().and_then(crate::observe::host::cap_eff) {
        Some(caps) => crate::observe::host::Privileges::from_caps(caps).bpf,
        None => nix::unistd::geteuid().is_root(),
    }
}

/// Tracepoint attach needs tracefs; minimal VMs and some containers do not mount it.
fn ensure_tracefs() -> Result<()> {
    for dir in [TRACEFS, "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(());
        }
    }
    let r = nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    );
    // Another instance starting at the same moment mounted it first.
    if r == Err(nix::errno::Errno::EBUSY) && Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    r.with_context(|| {
        format!("tracefs is not mounted and mounting it at {TRACEFS} failed: mount -t tracefs tracefs {TRACEFS}")
    })?;
    log::info!("mounted tracefs at {TRACEFS}");
    Ok(())
}

/// Loads the object (programs not yet loaded into the kernel), with aya-log enabled or not.
pub fn load_object(ebpf_log: bool) -> Result<Ebpf> {
    load_object_sized(ebpf_log, gpreempt_common::record::RING_BYTES)
}

/// [`load_object`] with the event ring buffer `ring_bytes` long (a power-of-two number of pages).
pub fn load_object_sized(ebpf_log: bool, ring_bytes: u32) -> Result<Ebpf> {
    // aya-log statements cost one global load each while disabled (level 0).
    let level: u8 = if ebpf_log { 0xff } else { 0 };
    EbpfLoader::new()
        .override_global("AYA_LOG_LEVEL", &level, false)
        .map_max_entries("EVENTS", ring_bytes)
        .load(EBPF_OBJECT)
        .map_err(explain_load_error)
}

/// The verdict of the verifier on one program.
#[derive(Clone, Debug)]
pub struct ProgramCheck {
    pub program: String,
    /// Ok: a note (empty, or what the fentry was verified against); Err: the verifier's words.
    pub result: Result<String, String>,
}

/// Loads every program of the object into the kernel (the verifier's check) without attaching
/// anything. The fentry/fexit programs are verified against `kfd_ioctl` where BTF has it (the
/// amdgpu module's or vmlinux's), else against `compat_ptr_ioctl`, whose prototype is the same
/// (`file_operations.unlocked_ioctl`).
pub fn verify_programs() -> Result<Vec<ProgramCheck>> {
    use crate::observe::tracing::{Hook, Programs, Target};
    use aya::programs::Program;
    let mut ebpf = load_object(false)?;
    let tracing = Programs::of(&ebpf, EBPF_OBJECT);
    let target = match crate::observe::btf::load_system(Path::new("/")) {
        Ok((vmlinux, module)) => kfd_ioctl_target(&vmlinux, module.as_ref())
            .or_else(|| {
                vmlinux
                    .function_id("compat_ptr_ioctl")
                    .map(|type_id| Target {
                        function: "compat_ptr_ioctl".into(),
                        btf_object: "vmlinux".into(),
                        type_id,
                    })
            })
            .ok_or_else(|| "neither kfd_ioctl nor compat_ptr_ioctl has BTF".to_string()),
        Err(e) => Err(format!("{e:#}")),
    };
    let mut out = Vec::new();
    for (name, prog) in ebpf.programs_mut() {
        let hook = match prog {
            Program::FEntry(_) => Some(Hook::Entry),
            Program::FExit(_) => Some(Hook::Exit),
            _ => None,
        };
        if let Some(hook) = hook {
            let result = match (&tracing, &target) {
                (Ok(p), Ok(t)) => p.verify(name, hook, t).map(|()| {
                    if t.function == "kfd_ioctl" {
                        format!("verified against kfd_ioctl in {} BTF", t.btf_object)
                    } else {
                        format!(
                            "verified against {} (same prototype as kfd_ioctl)",
                            t.function
                        )
                    }
                }),
                (Err(e), _) => Err(format!("{e:#}")),
                (_, Err(e)) => Err(format!("no BTF target for tracing programs: {e}")),
            };
            out.push(ProgramCheck {
                program: name.to_string(),
                result,
            });
            continue;
        }
        let r = match prog {
            Program::TracePoint(p) => p.load(),
            Program::KProbe(p) => p.load(),
            Program::UProbe(p) => p.load(),
            other => {
                out.push(ProgramCheck {
                    program: name.to_string(),
                    result: Err(format!("unexpected program type {:?}", other.prog_type())),
                });
                continue;
            }
        };
        out.push(ProgramCheck {
            program: name.to_string(),
            result: r.map(|()| String::new()).map_err(|e| verifier_text(&e)),
        });
    }
    out.sort_by(|a, b| a.program.cmp(&b.program));
    Ok(out)
}

/// An aya program error with the verifier log, when there is one.
pub(super) fn verifier_text(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            format!("{io_error}: {verifier_log}")
        }
        other => format!("{other:#}"),
    }
}

/// Turns a load error into the sentence a user needs.
fn explain_load_error(err: aya::EbpfError) -> anyhow::Error {
    let text = format!("{err:#}");
    let hint = if text.contains("Operation not permitted") {
        "the kernel refused bpf(2): run as root, and check kernel.unprivileged_bpf_disabled / lockdown"
    } else if text.contains("Function not implemented") || text.contains("Invalid argument") {
        "this kernel lacks the BPF features gpreempt-ebpf needs (CONFIG_BPF_SYSCALL, ring buffers: Linux 5.8+)"
    } else {
        "loading the eBPF programs failed"
    };
    anyhow::Error::new(err).context(hint)
}
