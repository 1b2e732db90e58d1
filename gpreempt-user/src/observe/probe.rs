//! Loading and attaching the eBPF programs, with the host checks that make failures explainable.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
        KProbe, TracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use gpreempt_common::{
    kprobe::{self, KernelOffsets, ProbeSpec, FIELDS, PROBES},
    record::{config_flag, stat, Config, RateState},
};
use serde::Serialize;

use crate::observe::launch::LaunchTarget;

/// The programs, built by build.rs from gpreempt-ebpf.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpreempt-ebpf"));

const TRACEFS: &str = "/sys/kernel/tracing";

/// What to trace.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Only this thread group (filtered in the kernel).
    pub pid: Option<u32>,
    /// Forward the programs' aya-log diagnostics to the `log` crate.
    pub ebpf_log: bool,
    /// Do not attach the kernel-internal probes (kprobes / fentry on amdkfd).
    pub no_kernel_probes: bool,
    /// Launch hints: at most one per process per this many ns (0: every launch).
    pub launch_gap_ns: u64,
    /// The KFD device node (its number, or for a stand-in its inode, selects KFD ioctls).
    pub kfd_device: PathBuf,
    /// NVIDIA nodes beyond those recognised by number (stand-ins).
    pub nvidia_devices: Vec<PathBuf>,
    /// Per-process limit of ioctl records: (per second, burst); None: unlimited.
    pub rate_limit: Option<(u32, u32)>,
    /// Where GPU ioctl records come from (`--ioctl-source`).
    pub ioctl_source: IoctlSource,
}

/// Where KFD ioctl records come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoctlSource {
    /// The fentry + fexit pair where `kfd_ioctl` has BTF and the kernel has trampolines, else
    /// the kprobe pair where kprobes reach it, else the syscall tracepoints.
    #[default]
    Auto,
    /// The fentry + fexit pair on `kfd_ioctl` (amdkfd's own dispatcher, through BPF
    /// trampolines: no other ioctl on the host runs a program, and no breakpoint); an error
    /// where it cannot attach.
    Fentry,
    /// The kprobe + kretprobe pair on `kfd_ioctl` (amdkfd's own dispatcher: no other ioctl on
    /// the host runs a program); an error where it cannot attach.
    Kprobe,
    /// The syscall tracepoints, for KFD and NVIDIA alike (every ioctl on the host runs the
    /// filter).
    Tracepoint,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            pid: None,
            ebpf_log: false,
            no_kernel_probes: false,
            launch_gap_ns: LAUNCH_GAP_NS,
            kfd_device: PathBuf::from("/dev/kfd"),
            nvidia_devices: Vec::new(),
            rate_limit: Some(RATE_LIMIT),
            ioctl_source: IoctlSource::Auto,
        }
    }
}

/// Default [`ProbeOptions::rate_limit`]: a process gets 8192 ioctl records a second, bursts of
/// 32768 (a runtime's start-up allocates thousands of buffers at once). Beyond it, one process
/// flooding its GPU fd cannot fill the ring buffer that every other process's events share;
/// its dropped records are counted per process and reported.
pub const RATE_LIMIT: (u32, u32) = (8192, 32768);

/// How the ioctl programs select GPU driver calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoctlFilter {
    /// By the file behind the fd (the rules, described), any type byte.
    ByFile(String),
    /// By the type byte ('K', 'F'), because the file cannot be looked at (why). A caller can
    /// evade it with another type byte; user space checks the fd of what it sees.
    ByType(String),
}

/// Default [`ProbeOptions::launch_gap_ns`]: one hint per ms per process. A request launches tens
/// of kernels within microseconds; the first one is the hint, the rest would only cost.
pub const LAUNCH_GAP_NS: u64 = 1_000_000;

/// Kind of an event source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Tracepoint,
    Kprobe,
    Fentry,
    Uprobe,
}

/// One event source and whether it is live, with the reason when it is not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The kernel function, tracepoint, or "launch uprobes".
    pub name: String,
    pub kind: SourceKind,
    pub live: bool,
    pub detail: String,
}

/// One short line: which event sources are live (for `top`'s title and `trace`'s banner).
pub fn summarize(sources: &[SourceStatus]) -> String {
    let count = |k: SourceKind| {
        let all = sources.iter().filter(|s| s.kind == k).count();
        let live = sources.iter().filter(|s| s.kind == k && s.live).count();
        (live, all)
    };
    let (tp, tp_all) = count(SourceKind::Tracepoint);
    let (kp, kp_all) = count(SourceKind::Kprobe);
    let (fe, _) = count(SourceKind::Fentry);
    let launch = sources
        .iter()
        .find(|s| s.kind == SourceKind::Uprobe)
        .map_or("off".to_string(), |s| {
            if s.live {
                s.detail.clone()
            } else {
                "none watched".into()
            }
        });
    let mut out = format!(
        "events: tracepoints {tp}/{tp_all}, kprobes {}/{}",
        kp + fe,
        kp_all + fe
    );
    if fe > 0 {
        out.push_str(&format!(" ({fe} through fentry/fexit on kfd_ioctl)"));
    }
    out.push_str(&format!(", launch uprobes {launch}"));
    out
}

/// Why sources are not live, grouped: one line per distinct reason, naming the sources.
pub fn not_live_reasons(sources: &[SourceStatus]) -> Vec<String> {
    let mut by_reason: Vec<(String, Vec<&str>)> = Vec::new();
    for s in sources
        .iter()
        .filter(|s| !s.live && s.kind != SourceKind::Uprobe)
    {
        match by_reason.iter_mut().find(|(r, _)| *r == s.detail) {
            Some((_, names)) => names.push(&s.name),
            None => by_reason.push((s.detail.clone(), vec![&s.name])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, names)| {
            if names.len() > 3 {
                format!("{} kernel probes not attached: {reason}", names.len())
            } else {
                format!("{} not attached: {reason}", names.join(", "))
            }
        })
        .collect()
}

/// Facts about the host that decide which kernel-internal probes can attach.
#[derive(Clone, Debug)]
pub struct HostProbeFacts {
    /// Err: why kprobes cannot attach at all.
    pub kprobes: Result<(), String>,
    /// The probed functions present in /proc/kallsyms.
    pub kallsyms: HashSet<String>,
    /// Offsets resolved from BTF, and why the others are missing.
    pub offsets: KernelOffsets,
    pub missing: Vec<(usize, String)>,
    /// `kfd_ioctl`'s BTF (the amdgpu module's, or vmlinux's where amdgpu is built in): the
    /// fentry/fexit target.
    pub kfd_ioctl_btf: Option<crate::observe::tracing::Target>,
    /// `nvidia_unlocked_ioctl`'s BTF (the nvidia module's, where it was built with BTF).
    pub nv_ioctl_btf: Option<crate::observe::tracing::Target>,
}

/// The decision for one kernel-internal probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub spec: &'static ProbeSpec,
    /// Ok: the functions to attach to; Err: why not.
    pub verdict: Result<Vec<&'static str>, String>,
}

const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";

impl HostProbeFacts {
    /// Reads kprobe support, /proc/kallsyms and BTF (vmlinux + amdgpu module) under `root`.
    pub fn read(root: &Path) -> Self {
        let kprobes = if root.join(KPROBE_PMU.trim_start_matches('/')).exists() {
            Ok(())
        } else {
            Err(format!(
                "kprobes are unavailable: this kernel has no kprobe PMU ({KPROBE_PMU}; CONFIG_KPROBES off)"
            ))
        };
        let wanted: HashSet<&str> = PROBES
            .iter()
            .flat_map(|p| p.functions.iter().copied())
            .chain([NV_IOCTL])
            .collect();
        let kallsyms = std::fs::read_to_string(root.join("proc/kallsyms"))
            .map(|t| kallsyms_present(&t, &wanted))
            .unwrap_or_default();
        let (offsets, missing, kfd_ioctl_btf, nv_ioctl_btf) =
            match crate::observe::btf::load_system(root) {
                Ok((vmlinux, module)) => {
                    let r = crate::observe::btf::resolve(&vmlinux, module.as_ref());
                    let nvidia = crate::observe::btf::load_module(root, &vmlinux, "nvidia")
                        .unwrap_or_else(|e| {
                            log::info!("the nvidia module's BTF: {e:#}");
                            None
                        });
                    (
                        r.offsets,
                        r.missing,
                        kfd_ioctl_target(&vmlinux, module.as_ref()),
                        nvidia.as_ref().and_then(|b| {
                            Some(crate::observe::tracing::Target {
                                function: NV_IOCTL.into(),
                                btf_object: "nvidia".into(),
                                type_id: b.function_id(NV_IOCTL)?,
                            })
                        }),
                    )
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    let missing = (0..FIELDS.len()).map(|i| (i, why.clone())).collect();
                    (KernelOffsets::default(), missing, None, None)
                }
            };
        Self {
            kprobes,
            kallsyms,
            offsets,
            missing,
            kfd_ioctl_btf,
            nv_ioctl_btf,
        }
    }

    /// Which probes attach, and why the others do not. Pure: unit-tested.
    pub fn plan(&self) -> Vec<Planned> {
        PROBES
            .iter()
            .map(|spec| Planned {
                spec,
                verdict: self.verdict(spec),
            })
            .collect()
    }

    /// Whether the kprobe pair on `kfd_ioctl` can be the KFD ioctl source; Err: why not.
    pub fn kfd_pair(&self) -> Result<(), String> {
        self.kprobes.clone()?;
        if !self.kallsyms.contains("kfd_ioctl") {
            return Err("kfd_ioctl is not in /proc/kallsyms (amdgpu not loaded)".into());
        }
        Ok(())
    }

    /// The NVIDIA RM escapes' source, in the order to try: a pair on `nvidia_unlocked_ioctl`
    /// (fentry/fexit where the nvidia module has BTF, else a kprobe pair where kprobes reach it),
    /// or Err(why the syscall tracepoints serve them). `by_file`: the tracepoints can tell files
    /// apart (the pair needs the caller's fd table to name a client's fd, and the tracepoints,
    /// where they stay for other files, must leave NVIDIA's to the pair). Pure: unit-tested.
    pub fn nv_plan(
        &self,
        nvidia_loaded: bool,
        source: IoctlSource,
        by_file: bool,
    ) -> Result<Vec<Pair>, String> {
        if !nvidia_loaded {
            return Err("no NVIDIA driver".into());
        }
        if source == IoctlSource::Tracepoint {
            return Err("--ioctl-source tracepoint".into());
        }
        if !by_file {
            return Err("struct file offsets unknown (no BTF): files cannot be told apart".into());
        }
        let mut plan = Vec::new();
        let mut why = Vec::new();
        match &self.nv_ioctl_btf {
            Some(_) => plan.push(Pair::Fentry),
            None => why.push("the nvidia module has no BTF".to_string()),
        }
        match (&self.kprobes, self.kallsyms.contains(NV_IOCTL)) {
            (Ok(()), true) => plan.push(Pair::Kprobe),
            (Ok(()), false) => why.push(format!("{NV_IOCTL} is not in /proc/kallsyms")),
            (Err(e), _) => why.push(e.clone()),
        }
        if plan.is_empty() {
            Err(why.join("; "))
        } else {
            Ok(plan)
        }
    }

    fn verdict(&self, spec: &ProbeSpec) -> Result<Vec<&'static str>, String> {
        if spec.id == kprobe::id::KFD_IOCTL && self.kfd_ioctl_btf.is_some() && self.kprobes.is_err()
        {
            return Ok(vec!["kfd_ioctl"]); // fentry needs no kprobes
        }
        self.kprobes.clone()?;
        let present: Vec<&'static str> = spec
            .functions
            .iter()
            .copied()
            .filter(|f| self.kallsyms.contains(*f))
            .collect();
        if present.is_empty() {
            return Err(format!(
                "{} not in /proc/kallsyms (amdgpu not loaded, or the function is inlined in this build)",
                spec.functions.join(" / ")
            ));
        }
        if !self.offsets.has_all(spec.needs) {
            let why: Vec<&str> = self
                .missing
                .iter()
                .filter(|(f, _)| spec.needs & (1 << f) != 0)
                .map(|(_, w)| w.as_str())
                .collect();
            let mut why = why;
            why.dedup();
            return Err(format!("struct offsets unknown: {}", why.join("; ")));
        }
        Ok(present)
    }
}

/// Where `kfd_ioctl`'s prototype is: vmlinux (amdgpu built in) or the amdgpu module's BTF.
pub fn kfd_ioctl_target(
    vmlinux: &crate::observe::btf::Btf,
    module: Option<&crate::observe::btf::Btf>,
) -> Option<crate::observe::tracing::Target> {
    let (btf_object, type_id) = match vmlinux.function_id("kfd_ioctl") {
        Some(id) => ("vmlinux", id),
        None => ("amdgpu", module?.function_id("kfd_ioctl")?),
    };
    Some(crate::observe::tracing::Target {
        function: "kfd_ioctl".into(),
        btf_object: btf_object.into(),
        type_id,
    })
}

/// The probed functions named in kallsyms text (`ADDR TYPE NAME [MODULE]`); text symbols only.
pub fn kallsyms_present(text: &str, wanted: &HashSet<&str>) -> HashSet<String> {
    let mut found = HashSet::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(_), Some(t), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if matches!(t, "t" | "T") && wanted.contains(name) {
            found.insert(name.to_string());
        }
    }
    found
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    sources: Vec<SourceStatus>,
    /// Launch uprobes per watched pid.
    launch_links: HashMap<u32, Vec<(&'static str, UProbeLinkId)>>,
    /// Err: why launch uprobes cannot be used (a program failed to load).
    launch_ready: Result<(), String>,
    filter: IoctlFilter,
    /// Which pair on `kfd_ioctl` KFD ioctls come from (None: the syscall tracepoints).
    kfd_pair: Option<Pair>,
    /// Which pair on `nvidia_unlocked_ioctl` RM escapes come from (None: the tracepoints).
    nv_pair: Option<Pair>,
    /// Programs loaded against kernel BTF here rather than by aya; dropping detaches them.
    _tracing: Vec<crate::observe::tracing::Attached>,
    /// The syscall ioctl tracepoints are attached (the floor, or for GPU files beyond amdkfd).
    ioctl_tracepoints: bool,
    /// Launch uprobes taken off their programs, dropped (detached) on a thread of their own.
    detacher: Detacher,
}

/// Detaches launch uprobes off the caller's thread. Closing a uprobe's perf event waits for
/// RCU grace periods (`perf_uprobe_destroy` -> `uprobe_unregister` -> `synchronize_rcu`): about
/// 0.25 s per process on a loaded 2-vCPU host, seconds for many processes or under a signal
/// storm. On the controller's loop that time was silence to the lease guardian, which killed a
/// controller that was only tearing probes down (issue 34 finding 5).
#[derive(Default)]
struct Detacher {
    tx: Option<std::sync::mpsc::Sender<Vec<aya::programs::uprobe::UProbeLink>>>,
}

impl Detacher {
    /// Hands `links` to the detaching thread (started on first use); where no thread can be
    /// started they are dropped here, as before.
    fn detach(&mut self, links: Vec<aya::programs::uprobe::UProbeLink>) {
        if self.tx.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<aya::programs::uprobe::UProbeLink>>();
            let started = std::thread::Builder::new()
                .name("uprobe-detach".into())
                .spawn(move || {
                    for links in rx {
                        drop(links);
                    }
                });
            match started {
                Ok(_) => self.tx = Some(tx),
                Err(e) => log::warn!("uprobes are detached on the loop (no thread: {e})"),
            }
        }
        let Some(tx) = &self.tx else {
            drop(links);
            return;
        };
        if let Err(std::sync::mpsc::SendError(links)) = tx.send(links) {
            self.tx = None;
            drop(links);
        }
    }
}

/// Counters the programs keep, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub seen: u64,
    pub ringbuf_full: u64,
    pub inflight_full: u64,
    pub args_fault: u64,
    pub kernel_seen: u64,
    pub launch_seen: u64,
    pub launch_emitted: u64,
    /// GPU-typed ioctls on other files, dropped in the kernel.
    pub other_file: u64,
    /// Records dropped by the per-process rate limit.
    pub rate_limited: u64,
}

impl KernelStats {
    /// Records lost in the kernel (never delivered).
    pub fn lost(&self) -> u64 {
        self.ringbuf_full + self.inflight_full
    }
}

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
    match status.as_deref().and_then(super::host::cap_eff) {
        Some(caps) => super::host::Privileges::from_caps(caps).bpf,
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

/// The syscall/sched tracepoints: the floor of observation, present on every kernel.
const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("gpu_ioctl_enter", "syscalls", "sys_enter_ioctl"),
    ("gpu_ioctl_exit", "syscalls", "sys_exit_ioctl"),
    ("gpu_process_exit", "sched", "sched_process_exit"),
];

/// Loads the object (programs not yet loaded into the kernel), with aya-log enabled or not.
pub fn load_object(ebpf_log: bool) -> Result<Ebpf> {
    // aya-log statements cost one global load each while disabled (level 0).
    let level: u8 = if ebpf_log { 0xff } else { 0 };
    EbpfLoader::new()
        .override_global("AYA_LOG_LEVEL", &level, false)
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
fn verifier_text(e: &aya::programs::ProgramError) -> String {
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

/// Writes the struct offsets the programs read (the ioctl programs' file lookup, the kernel
/// probes).
fn write_offsets(ebpf: &mut Ebpf, offsets: &KernelOffsets) -> Result<()> {
    let mut m: Array<_, KernelOffsets> =
        Array::try_from(ebpf.map_mut("OFFSETS").context("map OFFSETS missing")?)?;
    m.set(0, offsets, 0)
        .context("writing kernel struct offsets")?;
    Ok(())
}

/// How to select ioctls here: by file when every field of the fd -> inode chain is known.
fn choose_filter(
    facts: &HostProbeFacts,
    offsets_written: &Result<()>,
    devices: &crate::observe::gpufiles::Devices,
) -> (IoctlFilter, Vec<gpreempt_common::record::GpuFile>) {
    use kprobe::field::FILE_CHAIN;
    if let Err(e) = offsets_written {
        return (IoctlFilter::ByType(format!("{e:#}")), Vec::new());
    }
    if !facts.offsets.has_all(FILE_CHAIN) {
        let mut why: Vec<&str> = facts
            .missing
            .iter()
            .filter(|(f, _)| FILE_CHAIN & (1 << f) != 0)
            .map(|(_, w)| w.as_str())
            .collect();
        why.dedup();
        return (
            IoctlFilter::ByType(format!("struct file layout unknown: {}", why.join("; "))),
            Vec::new(),
        );
    }
    let (rules, dropped) = devices.rules();
    let mut text = crate::observe::gpufiles::describe(&rules);
    if dropped > 0 {
        text.push_str(&format!(
            " ({dropped} more device(s) did not fit and are not seen)"
        ));
    }
    (IoctlFilter::ByFile(text), rules)
}

/// Loads and attaches the kernel-internal probes the facts allow; one status per probe, and the
/// links of those attached through BTF here.
fn attach_kernel_probes(
    ebpf: &mut Ebpf,
    tracing: Option<&crate::observe::tracing::Programs>,
    facts: &HostProbeFacts,
    offsets_written: &Result<()>,
) -> (Vec<SourceStatus>, Vec<crate::observe::tracing::Attached>) {
    let mut out = Vec::new();
    let mut links = Vec::new();
    if let Err(e) = offsets_written {
        // Without offsets the programs read nothing: no kernel probe is attached.
        let detail = format!("{e:#}");
        let statuses = PROBES
            .iter()
            .map(|spec| SourceStatus {
                name: spec.functions.join(" / "),
                kind: SourceKind::Kprobe,
                live: false,
                detail: detail.clone(),
            })
            .collect();
        return (statuses, links);
    }
    for planned in facts.plan() {
        let spec = planned.spec;
        let name = spec.functions.join(" / ");
        let mut status = SourceStatus {
            name,
            kind: SourceKind::Kprobe,
            live: false,
            detail: String::new(),
        };
        let functions = match planned.verdict {
            Ok(f) => f,
            Err(why) => {
                status.detail = why;
                out.push(status);
                continue;
            }
        };
        if let (kprobe::id::KFD_IOCTL, Some(target), Some(programs)) =
            (spec.id, &facts.kfd_ioctl_btf, tracing)
        {
            use crate::observe::tracing::Hook;
            match programs.attach("fe_kfd_ioctl", Hook::Entry, target) {
                Ok(link) => {
                    links.push(link);
                    status.kind = SourceKind::Fentry;
                    status.live = true;
                    out.push(status);
                    continue;
                }
                Err(e) => log::info!("fentry on kfd_ioctl: {e:#}; trying the kprobe"),
            }
        }
        match attach_kprobe(ebpf, spec.program, &functions) {
            Ok(n) => {
                status.live = true;
                status.detail = format!("{n} function(s)");
            }
            Err(e) => status.detail = format!("{e:#}"),
        }
        out.push(status);
    }
    (out, links)
}

fn attach_kprobe(ebpf: &mut Ebpf, program: &str, functions: &[&str]) -> Result<usize> {
    let kp: &mut KProbe = ebpf
        .program_mut(program)
        .with_context(|| format!("program {program} missing from the eBPF object"))?
        .try_into()?;
    kp.load()
        .with_context(|| format!("the verifier rejected {program}"))?;
    let mut n = 0;
    let mut last = None;
    for f in functions {
        match kp.attach(f, 0) {
            Ok(_) => n += 1,
            Err(e) => last = Some(anyhow::Error::new(e).context(format!("kprobe on {f}"))),
        }
    }
    match (n, last) {
        (0, Some(e)) => Err(e),
        _ => Ok(n),
    }
}

/// Writes the programs' configuration: `config` plus the file rules (or the type-byte fallback)
/// and whether the kprobe pair has amdkfd's calls.
fn configure(
    ebpf: &mut Ebpf,
    mut config: Config,
    filter: &IoctlFilter,
    rules: &[gpreempt_common::record::GpuFile],
    kprobed: bool,
    skip: u32,
) -> Result<()> {
    match filter {
        IoctlFilter::ByFile(rules_text) => {
            config.flags |= config_flag::FILTER_FILES | skip;
            config.files[..rules.len()].copy_from_slice(rules);
            log::info!("GPU ioctls selected by file: {rules_text}");
        }
        IoctlFilter::ByType(why) => log::warn!(
            "GPU ioctls selected by type byte only ({why}): a process can hide its calls \
             with another type byte, and ioctls on other files cost user-space checks"
        ),
    }
    if kprobed {
        config.flags |= config_flag::KFD_BY_KPROBE;
    }
    let mut cfg_map: Array<_, Config> =
        Array::try_from(ebpf.map_mut("CONFIG").context("map CONFIG missing")?)?;
    cfg_map
        .set(0, config, 0)
        .context("writing the probe configuration")
}

/// The kprobe pair's programs, entry then return.
const KFD_PAIR: [&str; 2] = ["kfd_ioctl_entry", "kfd_ioctl_return"];

fn pair_program<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut KProbe, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))
}

fn load_kfd_pair(ebpf: &mut Ebpf) -> Result<(), String> {
    for program in KFD_PAIR {
        pair_program(ebpf, program)?
            .load()
            .map_err(|e| format!("the verifier rejected {program}: {}", verifier_text(&e)))?;
    }
    Ok(())
}

/// Return first: an entry without its return would leave calls in flight.
fn attach_kfd_pair(ebpf: &mut Ebpf) -> Result<(), String> {
    for program in KFD_PAIR.iter().rev() {
        pair_program(ebpf, program)?
            .attach("kfd_ioctl", 0)
            .map_err(|e| format!("attaching {program} to kfd_ioctl: {e}"))?;
    }
    Ok(())
}

/// Attaches the fentry/fexit pair on `kfd_ioctl` for a moment (doctor's check): Err says why
/// it cannot be the source here.
pub fn try_fentry_pair(facts: &HostProbeFacts) -> Result<(), String> {
    use crate::observe::tracing::Programs;
    let target = facts
        .kfd_ioctl_btf
        .as_ref()
        .ok_or("kfd_ioctl has no BTF (amdgpu not loaded, or built without module BTF)")?;
    let ebpf = load_object(false).map_err(|e| format!("{e:#}"))?;
    let programs = Programs::of(&ebpf, EBPF_OBJECT).map_err(|e| format!("{e:#}"))?;
    attach_fentry_pair(&programs, target).map(drop)
}

/// Attaches the NVIDIA pair for a moment (doctor's check): which one attached, or why none.
pub fn try_nv_pair(facts: &HostProbeFacts, plan: &[Pair]) -> Result<Pair, String> {
    let mut ebpf = load_object(false).map_err(|e| format!("{e:#}"))?;
    let programs = crate::observe::tracing::Programs::of(&ebpf, EBPF_OBJECT).ok();
    attach_nv_pair(&mut ebpf, programs.as_ref(), facts, plan).map(|(p, _links)| p)
}

/// Which pair of programs on `kfd_ioctl` gives the KFD ioctl records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pair {
    Fentry,
    Kprobe,
}

impl Pair {
    pub fn name(self) -> &'static str {
        match self {
            Pair::Fentry => "fentry/fexit",
            Pair::Kprobe => "kprobe",
        }
    }
}

fn source_name(s: IoctlSource) -> &'static str {
    match s {
        IoctlSource::Auto => "auto",
        IoctlSource::Fentry => "fentry",
        IoctlSource::Kprobe => "kprobe",
        IoctlSource::Tracepoint => "tracepoint",
    }
}

/// The NVIDIA driver's ioctl entry for /dev/nvidiactl and /dev/nvidiaN (kernel-open/nvidia/nv.c).
pub const NV_IOCTL: &str = "nvidia_unlocked_ioctl";
/// The fentry/fexit programs of the NVIDIA ioctl pair, exit first.
pub const NV_FENTRY_PAIR: [(&str, crate::observe::tracing::Hook); 2] = [
    ("nv_ioctl_fexit", crate::observe::tracing::Hook::Exit),
    ("nv_ioctl_fentry", crate::observe::tracing::Hook::Entry),
];
/// The kprobe pair's programs, entry first (attached in reverse).
const NV_PAIR: [&str; 2] = ["nv_ioctl_entry", "nv_ioctl_return"];

/// Attaches the NVIDIA ioctl source per `plan` (the first that attaches wins).
fn attach_nv_pair(
    ebpf: &mut Ebpf,
    programs: Option<&crate::observe::tracing::Programs>,
    facts: &HostProbeFacts,
    plan: &[Pair],
) -> Result<(Pair, Vec<crate::observe::tracing::Attached>), String> {
    let mut why = Vec::new();
    for p in plan {
        let r = match p {
            Pair::Fentry => match (programs, &facts.nv_ioctl_btf) {
                (Some(programs), Some(t)) => NV_FENTRY_PAIR
                    .iter()
                    .map(|(name, hook)| programs.attach(name, *hook, t))
                    .collect::<Result<Vec<_>>>()
                    .map_err(|e| format!("{e:#}")),
                _ => Err("no BTF-typed programs".into()),
            },
            Pair::Kprobe => (|| {
                for program in NV_PAIR {
                    pair_program(ebpf, program)?.load().map_err(|e| {
                        format!("the verifier rejected {program}: {}", verifier_text(&e))
                    })?;
                }
                for program in NV_PAIR.iter().rev() {
                    pair_program(ebpf, program)?
                        .attach(NV_IOCTL, 0)
                        .map_err(|e| format!("attaching {program} to {NV_IOCTL}: {e}"))?;
                }
                Ok(Vec::new())
            })(),
        };
        match r {
            Ok(links) => return Ok((*p, links)),
            Err(e) => why.push(format!("{}: {e}", p.name())),
        }
    }
    Err(why.join("; "))
}

/// The fentry/fexit programs of the KFD ioctl pair, exit first (an entry without its exit
/// would leave calls in flight).
pub const FENTRY_PAIR: [(&str, crate::observe::tracing::Hook); 2] = [
    ("kfd_ioctl_fexit", crate::observe::tracing::Hook::Exit),
    ("kfd_ioctl_fentry", crate::observe::tracing::Hook::Entry),
];

/// Loads and attaches the fentry/fexit pair on `target` (all or nothing).
pub fn attach_fentry_pair(
    programs: &crate::observe::tracing::Programs,
    target: &crate::observe::tracing::Target,
) -> Result<Vec<crate::observe::tracing::Attached>, String> {
    FENTRY_PAIR
        .iter()
        .map(|(p, hook)| programs.attach(p, *hook, target))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| format!("{e:#}"))
}

/// Loads (verifies) the launch uprobe programs; they attach per process later.
fn load_launch_programs(ebpf: &mut Ebpf) -> Result<(), String> {
    for (_, program, _) in kprobe::launch::POINTS {
        let up: &mut UProbe = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        up.load()
            .map_err(|e| format!("the verifier rejected {program}: {e}"))?;
    }
    Ok(())
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

impl Probes {
    /// Loads the programs, writes the configuration, attaches the tracepoints (the floor: an error
    /// if they fail), then every kernel-internal probe this host allows (each optional), and loads
    /// the launch uprobes for [`Probes::watch_launches`].
    pub fn attach(opts: &ProbeOptions) -> Result<Self> {
        preflight()?;
        let mut ebpf = load_object(opts.ebpf_log)?;
        // Before the log reader takes its map out of `ebpf`: the tracing programs need them all.
        let tracing_programs =
            crate::observe::tracing::Programs::of(&ebpf, EBPF_OBJECT).map_err(|e| format!("{e:#}"));
        let mut tracing = Vec::new();
        let logger = if opts.ebpf_log {
            Some(aya_log::EbpfLogger::init(&mut ebpf).context("starting the eBPF log reader")?)
        } else {
            None
        };

        // BTF first: the ioctl programs need the fd -> inode offsets before they attach.
        let facts = HostProbeFacts::read(Path::new("/"));
        let offsets_written = write_offsets(&mut ebpf, &facts.offsets);
        let mut devices =
            crate::observe::gpufiles::Devices::read(&opts.kfd_device, &opts.nvidia_devices);
        // The KFD source: a pair on kfd_ioctl where one can be had (fentry/fexit first, loaded
        // and attached once the configuration that tells the tracepoints to leave amdkfd's node
        // alone is written; the kprobe pair loaded here to know it passes the verifier).
        let fentry = match (opts.ioctl_source, &facts.kfd_ioctl_btf, &tracing_programs) {
            (IoctlSource::Auto | IoctlSource::Fentry, Some(t), Ok(_)) => Ok(t.clone()),
            (IoctlSource::Auto | IoctlSource::Fentry, None, _) => {
                Err("kfd_ioctl has no BTF (amdgpu not loaded, or built without module BTF)".into())
            }
            (IoctlSource::Auto | IoctlSource::Fentry, _, Err(e)) => Err(e.clone()),
            (src, ..) => Err(format!("--ioctl-source {}", source_name(src))),
        };
        let kprobe_pair = match opts.ioctl_source {
            IoctlSource::Tracepoint | IoctlSource::Fentry => {
                Err(format!("--ioctl-source {}", source_name(opts.ioctl_source)))
            }
            // With fentry to try first, the kprobe pair goes through the verifier only if it
            // is needed (below).
            _ if fentry.is_ok() => facts.kfd_pair(),
            _ => facts.kfd_pair().and_then(|()| load_kfd_pair(&mut ebpf)),
        };
        let kprobe_loaded = kprobe_pair.is_ok() && fentry.is_err();
        if let (IoctlSource::Kprobe, Err(why)) = (opts.ioctl_source, &kprobe_pair) {
            bail!("--ioctl-source kprobe: the kprobe pair on kfd_ioctl cannot be used: {why}");
        }
        if let (IoctlSource::Fentry, Err(why)) = (opts.ioctl_source, &fentry) {
            bail!(
                "--ioctl-source fentry: the fentry/fexit pair on kfd_ioctl cannot be used: {why}"
            );
        }
        let pair: Result<(), String> = match (&fentry, &kprobe_pair) {
            (Err(a), Err(b)) if a != b => Err(format!("fentry: {a}; kprobe: {b}")),
            (Err(a), Err(_)) => Err(a.clone()),
            _ => Ok(()),
        };
        devices.kprobed = pair.is_ok();
        let mut config = Config {
            launch_gap_ns: opts.launch_gap_ns,
            ..Config::default()
        };
        if let Some(pid) = opts.pid {
            config.flags |= config_flag::FILTER_TGID;
            config.tgid = pid;
        }
        if let Some((rate, burst)) = opts.rate_limit {
            (config.rate_per_s, config.rate_burst) = (rate, burst.max(1));
        }
        // The NVIDIA source: a pair on nvidia_unlocked_ioctl where one can be had, so that no
        // other ioctl on the host runs a program; the syscall tracepoints otherwise.
        let by_file = offsets_written.is_ok() && facts.offsets.has_all(kprobe::field::FILE_CHAIN);
        let nv_pair = facts
            .nv_plan(devices.nvidia_loaded, opts.ioctl_source, by_file)
            .and_then(|plan| {
                attach_nv_pair(&mut ebpf, tracing_programs.as_ref().ok(), &facts, &plan)
            });
        let nv_pair = match nv_pair {
            Ok((p, links)) => {
                tracing.extend(links);
                devices.nv_pair = true;
                Some(p)
            }
            Err(why) => {
                if devices.nvidia_loaded {
                    log::info!("NVIDIA ioctls from the syscall tracepoints: {why}");
                }
                None
            }
        };
        let (mut filter, mut rules) = choose_filter(&facts, &offsets_written, &devices);
        let pair = match (&filter, pair) {
            // Without the file rules the tracepoints cannot tell a stand-in from amdkfd's node.
            (IoctlFilter::ByType(_), Ok(())) if devices.kfd_stand_in() => {
                devices.kprobed = false;
                Err("the KFD node is a stand-in and files cannot be told apart".into())
            }
            (_, p) => p,
        };
        configure(
            &mut ebpf,
            config,
            &filter,
            &rules,
            devices.kprobed,
            devices.tracepoint_skips(),
        )?;
        let mut sources = Vec::new();
        if let Some(p) = nv_pair {
            sources.push(SourceStatus {
                name: format!("{NV_IOCTL} entry/return"),
                kind: match p {
                    Pair::Fentry => SourceKind::Fentry,
                    Pair::Kprobe => SourceKind::Kprobe,
                },
                live: true,
                detail: "NVIDIA RM escapes".into(),
            });
        }
        let attached = pair.and_then(|()| {
            let mut why = Vec::new();
            if let (Ok(target), Ok(programs)) = (&fentry, &tracing_programs) {
                match attach_fentry_pair(programs, target) {
                    Ok(links) => {
                        tracing.extend(links);
                        return Ok(Pair::Fentry);
                    }
                    Err(e) if opts.ioctl_source == IoctlSource::Fentry => return Err(e),
                    Err(e) => {
                        log::info!(
                            "the fentry/fexit pair on kfd_ioctl: {e}; trying the kprobe pair"
                        );
                        why.push(format!("fentry: {e}"));
                    }
                }
            }
            let kprobe = kprobe_pair.and_then(|()| {
                if !kprobe_loaded {
                    load_kfd_pair(&mut ebpf)?;
                }
                attach_kfd_pair(&mut ebpf)
            });
            match kprobe {
                Ok(()) => Ok(Pair::Kprobe),
                Err(e) => {
                    why.push(format!("kprobe: {e}"));
                    Err(why.join("; "))
                }
            }
        });
        if let (IoctlSource::Fentry, Err(why)) = (opts.ioctl_source, &attached) {
            bail!("--ioctl-source fentry: {why}");
        }
        let kfd_pair = match attached {
            Ok(p) => {
                sources.push(SourceStatus {
                    name: "kfd_ioctl entry/return".into(),
                    kind: match p {
                        Pair::Fentry => SourceKind::Fentry,
                        Pair::Kprobe => SourceKind::Kprobe,
                    },
                    live: true,
                    detail: "KFD ioctls".into(),
                });
                Some(p)
            }
            Err(why) => {
                if devices.kprobed {
                    // Loaded but not attached: back to the tracepoints for amdkfd's node too.
                    log::warn!("the kprobe pair on kfd_ioctl did not attach ({why}): KFD ioctls come from the syscall tracepoints");
                    devices.kprobed = false;
                    (filter, rules) = choose_filter(&facts, &offsets_written, &devices);
                    configure(
                        &mut ebpf,
                        config,
                        &filter,
                        &rules,
                        false,
                        devices.tracepoint_skips(),
                    )?;
                } else {
                    log::info!("KFD ioctls from the syscall tracepoints: {why}");
                }
                None
            }
        };
        // With the pair live, the ioctl tracepoints only serve GPU files amdkfd does not.
        let beyond = devices.beyond_amdkfd();
        let ioctl_tracepoints = kfd_pair.is_none() || beyond.is_some();
        if let (Some(_), Some(why)) = (kfd_pair, &beyond) {
            log::info!("the syscall ioctl tracepoints stay attached for {why}");
        }
        for (prog, category, name) in TRACEPOINTS {
            if !ioctl_tracepoints && category == "syscalls" {
                continue;
            }
            let tp: &mut TracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?
                .try_into()?;
            tp.load()
                .with_context(|| format!("the verifier rejected {prog}"))?;
            tp.attach(category, name)
                .with_context(|| format!("attaching {prog} to tracepoint {category}/{name}"))?;
            sources.push(SourceStatus {
                name: format!("{category}/{name}"),
                kind: SourceKind::Tracepoint,
                live: true,
                detail: String::new(),
            });
        }

        if opts.no_kernel_probes {
            sources.push(SourceStatus {
                name: "amdkfd kprobes".into(),
                kind: SourceKind::Kprobe,
                live: false,
                detail: "not requested".into(),
            });
        } else {
            let (s, links) = attach_kernel_probes(
                &mut ebpf,
                tracing_programs.as_ref().ok(),
                &facts,
                &offsets_written,
            );
            sources.extend(s);
            tracing.extend(links);
        }

        let launch_ready = load_launch_programs(&mut ebpf);
        sources.push(SourceStatus {
            name: "launch uprobes".into(),
            kind: SourceKind::Uprobe,
            live: false,
            detail: match &launch_ready {
                Ok(()) => "ready; no process watched".into(),
                Err(e) => e.clone(),
            },
        });
        for s in &sources {
            if s.live {
                log::debug!("event source {}: live {}", s.name, s.detail);
            } else {
                log::info!("event source {}: not live: {}", s.name, s.detail);
            }
        }
        Ok(Self {
            ebpf,
            logger,
            sources,
            launch_links: HashMap::new(),
            detacher: Detacher::default(),
            launch_ready,
            filter,
            kfd_pair,
            nv_pair,
            _tracing: tracing,
            ioctl_tracepoints,
        })
    }

    /// How ioctls are selected in the kernel.
    pub fn filter(&self) -> &IoctlFilter {
        &self.filter
    }

    /// [`summarize`] plus how ioctls are selected, for logs and `top`.
    pub fn summary(&self) -> String {
        let how = match &self.filter {
            IoctlFilter::ByFile(_) => "by device",
            IoctlFilter::ByType(_) => "by TYPE BYTE (evadable)",
        };
        let ioctls = match (self.kfd_pair, self.ioctl_tracepoints) {
            (Some(p), false) => format!(
                "KFD ioctls from {} kfd_ioctl (no other ioctl runs a program)",
                p.name()
            ),
            (Some(p), true) => format!(
                "KFD ioctls from {} kfd_ioctl, other GPU ioctls from syscall tracepoints {how}",
                p.name()
            ),
            _ => format!("ioctls from syscall tracepoints {how}"),
        };
        let nv = match (self.nv_pair, self.ioctl_tracepoints) {
            (Some(p), false) => format!(
                ", NVIDIA RM escapes from {} {NV_IOCTL} (no other ioctl runs a program)",
                p.name()
            ),
            (Some(p), true) => format!(", NVIDIA RM escapes from {} {NV_IOCTL}", p.name()),
            (None, _) => String::new(),
        };
        format!("{}, {ioctls}{nv}", summarize(&self.sources))
    }

    /// Where NVIDIA RM escape records come from (Tracepoint: the syscall tracepoints).
    pub fn nv_source(&self) -> IoctlSource {
        match self.nv_pair {
            Some(Pair::Fentry) => IoctlSource::Fentry,
            Some(Pair::Kprobe) => IoctlSource::Kprobe,
            None => IoctlSource::Tracepoint,
        }
    }

    /// Where KFD ioctl records come from.
    pub fn kfd_source(&self) -> IoctlSource {
        match self.kfd_pair {
            Some(Pair::Fentry) => IoctlSource::Fentry,
            Some(Pair::Kprobe) => IoctlSource::Kprobe,
            None => IoctlSource::Tracepoint,
        }
    }

    /// Processes whose ioctl records the rate limit dropped, with the count so far.
    pub fn rate_limited(&self) -> Result<Vec<(u32, u32)>> {
        let map: BpfHashMap<_, u32, RateState> =
            BpfHashMap::try_from(self.ebpf.map("RATES").context("map RATES missing")?)?;
        Ok(map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, s)| s.dropped > 0)
            .map(|(pid, s)| (pid, s.dropped))
            .collect())
    }

    /// Every event source and whether it is live.
    pub fn sources(&self) -> &[SourceStatus] {
        &self.sources
    }

    /// Attaches the launch uprobes to `pid` at `targets` (from [`crate::observe::launch`]). Returns how
    /// many points were attached; points that fail are logged and skipped.
    pub fn watch_launches(&mut self, pid: u32, targets: &[LaunchTarget]) -> Result<usize> {
        if let Err(e) = &self.launch_ready {
            bail!("launch uprobes unavailable: {e}");
        }
        if self.launch_links.contains_key(&pid) {
            return Ok(self.launch_links[&pid].len());
        }
        let Some(scope) = std::num::NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
            bail!("pid 0 cannot be watched");
        };
        let mut links = Vec::new();
        let mut last_err = None;
        for t in targets {
            let prog: &mut UProbe = match self.ebpf.program_mut(t.program) {
                Some(p) => p.try_into()?,
                None => bail!("program {} missing from the eBPF object", t.program),
            };
            match prog.attach(
                UProbeAttachLocation::AbsoluteOffset(t.file_offset),
                &t.path,
                scope,
            ) {
                Ok(link) => links.push((t.program, link)),
                Err(e) => {
                    log::debug!(
                        "uprobe {} at {}+{:#x} for pid {pid}: {e:#}",
                        t.symbol,
                        t.path.display(),
                        t.file_offset
                    );
                    last_err = Some(e);
                }
            }
        }
        if links.is_empty() {
            if let Some(e) = last_err {
                return Err(
                    anyhow::Error::new(e).context(format!("attaching launch uprobes to pid {pid}"))
                );
            }
        }
        let n = links.len();
        self.launch_links.insert(pid, links);
        self.update_launch_source();
        Ok(n)
    }

    /// Detaches the launch uprobes of `pid` (its exit, or it is no longer watched).
    pub fn unwatch_launches(&mut self, pid: u32) {
        let Some(links) = self.launch_links.remove(&pid) else {
            return;
        };
        let mut taken = Vec::with_capacity(links.len());
        for (program, link) in links {
            if let Some(Ok(p)) = self.ebpf.program_mut(program).map(<&mut UProbe>::try_from) {
                if let Ok(l) = p.take_link(link) {
                    taken.push(l);
                }
            }
        }
        self.detacher.detach(taken);
        self.update_launch_source();
    }

    /// Pids whose launches are watched.
    pub fn watched_launches(&self) -> impl Iterator<Item = u32> + '_ {
        self.launch_links.keys().copied()
    }

    fn update_launch_source(&mut self) {
        let procs = self.launch_links.len();
        let points: usize = self.launch_links.values().map(Vec::len).sum();
        if let Some(s) = self
            .sources
            .iter_mut()
            .find(|s| s.kind == SourceKind::Uprobe)
        {
            s.live = procs > 0;
            s.detail = if procs > 0 {
                format!("{procs} process(es), {points} entry point(s)")
            } else {
                "ready; no process watched".into()
            };
        }
    }

    /// The ring buffer of records (taken once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .context("ring buffer EVENTS missing or taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The programs' counters, summed over CPUs.
    pub fn stats(&self) -> Result<KernelStats> {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("STATS").context("map STATS missing")?)?;
        let sum = |i: u32| -> Result<u64> { Ok(map.get(&i, 0)?.iter().sum()) };
        Ok(KernelStats {
            seen: sum(stat::SEEN)?,
            ringbuf_full: sum(stat::RINGBUF_FULL)?,
            inflight_full: sum(stat::INFLIGHT_FULL)?,
            args_fault: sum(stat::ARGS_FAULT)?,
            kernel_seen: sum(stat::KERNEL_SEEN)?,
            launch_seen: sum(stat::LAUNCH_SEEN)?,
            launch_emitted: sum(stat::LAUNCH_EMITTED)?,
            other_file: sum(stat::OTHER_FILE)?,
            rate_limited: sum(stat::RATE_LIMITED)?,
        })
    }

    /// Drains pending aya-log records to the logger.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }
}
