//! AMD checks: amdgpu's module BTF, the kernel-internal probes on amdkfd and their struct
//! offsets, debugfs (HQD/MQD dumps), /dev/kfd and its version, PC sampling, the amdgpu module
//! parameters, and one line per GPU of the KFD topology.

use std::{fs, io, os::fd::AsRawFd, path::Path};

use anyhow::Result;
use gpreempt_common::{
    kfd,
    kprobe::{self, ProbeSpec, FIELDS, PROBES},
};

use super::{Check, Root, Verdict};
use crate::{
    observe::kfd::sysfs::{self, GpuNode},
    observe::probe::HostProbeFacts,
};

// -------------------------------------------------------------------------------------------
// 3b. amdgpu's module BTF

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
                    let how = if spec.id == kprobe::id::KFD_IOCTL && facts.kfd_ioctl_btf.is_some() {
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
    let needed = PROBES.iter().fold(0u64, |acc, p| acc | p.needs)
        | gpreempt_common::kprobe::field::FILE_CHAIN;
    let (missing_needed, missing_optional): (Vec<_>, Vec<_>) = facts
        .missing
        .iter()
        .partition(|(f, _)| needed & (1u64 << f) != 0);
    if missing_needed.is_empty() {
        let mut finding = format!(
            "{resolved}/{total} fields resolved (every field a probe or the ioctl filter needs)"
        );
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
            "{resolved}/{total} fields resolved; {} that probes or the ioctl filter need are unknown: {}{more}",
            missing_needed.len(),
            reasons[..reasons.len().min(SHOWN)].join("; ")
        ),
        "use a kernel and amdgpu module built with BTF (CONFIG_DEBUG_INFO_BTF=y, CONFIG_DEBUG_INFO_BTF_MODULES=y) for struct offsets",
    )
}

/// Check 4c: whether the ioctl programs can select GPU calls by the file behind the fd (the
/// fd -> file -> inode fields of vmlinux BTF), as the drivers dispatch them, or only by the
/// type byte a caller chooses.
pub fn ioctl_filter_check(facts: &HostProbeFacts, devices: &str) -> Check {
    const NAME: &str = "ioctl-filter";
    use gpreempt_common::kprobe::field::FILE_CHAIN;
    if facts.offsets.has_all(FILE_CHAIN) {
        return Check::ok(
            NAME,
            format!("GPU ioctls selected in the kernel by the file behind the fd, any type byte: {devices}"),
        );
    }
    let mut why: Vec<&str> = facts
        .missing
        .iter()
        .filter(|(f, _)| FILE_CHAIN & (1u64 << f) != 0)
        .map(|(_, w)| w.as_str())
        .collect();
    why.dedup();
    Check::warn(
        NAME,
        format!(
            "selected by type byte only ({}): a process can hide its GPU calls behind another type \
             byte, and ioctls of the GPU type bytes ('K' KFD, 'F' NVIDIA) on other files reach \
             user space",
            why.join("; ")
        ),
        "use a kernel built with BTF (CONFIG_DEBUG_INFO_BTF=y)",
    )
}

/// Check 4d: where KFD ioctl events come from: the fentry/fexit pair on `kfd_ioctl`, the kprobe
/// pair (either way only KFD calls run a program), or the syscall tracepoints (every ioctl on
/// the host runs the filter). `fentry`: the outcome of attaching the fentry/fexit pair for a
/// moment (None: not tried, e.g. not the running host).
pub fn ioctl_source_check(
    facts: &HostProbeFacts,
    devices: &crate::observe::gpufiles::Devices,
    fentry: Option<&Result<(), String>>,
) -> Check {
    const NAME: &str = "ioctl-source";
    let beyond = |mut f: String| {
        if let Some(why) = devices.beyond_amdkfd() {
            f += &format!("; the syscall ioctl tracepoints stay attached for {why}");
        }
        f
    };
    if let (Some(Ok(())), Some(t)) = (fentry, &facts.kfd_ioctl_btf) {
        return Check::ok(
            NAME,
            beyond(format!(
                "KFD ioctls from an fentry + fexit pair on kfd_ioctl (BPF trampolines, {} BTF): \
                 no other ioctl on the host runs a program",
                t.btf_object
            )),
        );
    }
    let no_fentry = match fentry {
        Some(Err(why)) => format!("fentry/fexit: {why}"),
        _ if facts.kfd_ioctl_btf.is_none() => "fentry/fexit: kfd_ioctl has no BTF".to_string(),
        _ => "fentry/fexit not tried".to_string(),
    };
    match facts.kfd_pair() {
        Ok(()) => Check::ok(
            NAME,
            beyond(format!(
                "KFD ioctls from a kprobe + kretprobe on kfd_ioctl: no other ioctl on the host \
                 runs a program ({no_fentry})"
            )),
        ),
        Err(why) => Check::warn(
            NAME,
            format!(
                "KFD ioctls from the syscall tracepoints ({why}; {no_fentry}): every ioctl on \
                 the host runs the filter"
            ),
            if facts.kprobes.is_err() {
                "a kernel with BPF trampolines or CONFIG_KPROBES makes kfd_ioctl the source"
            } else {
                "load amdgpu before starting gpreempt-ebpf (modprobe amdgpu)"
            },
        ),
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
