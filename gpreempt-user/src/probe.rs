//! Loading and attaching the eBPF programs, with the host checks that make failures explainable.

use std::path::Path;

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use gpreempt_common::record::{config_flag, stat, Config};

/// The programs, built by build.rs from gpreempt-ebpf.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpreempt-ebpf"));

const TRACEFS: &str = "/sys/kernel/tracing";

/// What to trace.
#[derive(Clone, Debug, Default)]
pub struct ProbeOptions {
    /// Only this thread group (filtered in the kernel).
    pub pid: Option<u32>,
    /// Forward the programs' aya-log diagnostics to the `log` crate.
    pub ebpf_log: bool,
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

/// Counters the programs keep, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub seen: u64,
    pub ringbuf_full: u64,
    pub inflight_full: u64,
    pub args_fault: u64,
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
    match status.as_deref().and_then(crate::doctor::cap_eff) {
        Some(caps) => crate::doctor::Privileges::from_caps(caps).bpf,
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
    nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .with_context(|| {
        format!("tracefs is not mounted and mounting it at {TRACEFS} failed: mount -t tracefs tracefs {TRACEFS}")
    })?;
    log::info!("mounted tracefs at {TRACEFS}");
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
    /// Loads the programs, writes the configuration, attaches the tracepoints.
    pub fn attach(opts: &ProbeOptions) -> Result<Self> {
        preflight()?;
        // aya-log statements cost one global load each while disabled (level 0).
        let level: u8 = if opts.ebpf_log { 0xff } else { 0 };
        let mut ebpf = EbpfLoader::new()
            .override_global("AYA_LOG_LEVEL", &level, false)
            .load(EBPF_OBJECT)
            .map_err(explain_load_error)?;
        let logger = if opts.ebpf_log {
            Some(aya_log::EbpfLogger::init(&mut ebpf).context("starting the eBPF log reader")?)
        } else {
            None
        };

        let mut config = Config::default();
        if let Some(pid) = opts.pid {
            config.flags |= config_flag::FILTER_TGID;
            config.tgid = pid;
        }
        let mut cfg_map: Array<_, Config> =
            Array::try_from(ebpf.map_mut("CONFIG").context("map CONFIG missing")?)?;
        cfg_map
            .set(0, config, 0)
            .context("writing the probe configuration")?;

        for (prog, category, name) in [
            ("kfd_ioctl_enter", "syscalls", "sys_enter_ioctl"),
            ("kfd_ioctl_exit", "syscalls", "sys_exit_ioctl"),
            ("kfd_process_exit", "sched", "sched_process_exit"),
        ] {
            let tp: &mut TracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?
                .try_into()?;
            tp.load()
                .with_context(|| format!("the verifier rejected {prog}"))?;
            tp.attach(category, name)
                .with_context(|| format!("attaching {prog} to tracepoint {category}/{name}"))?;
        }
        Ok(Self { ebpf, logger })
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
        })
    }

    /// Drains pending aya-log records to the logger.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }
}
