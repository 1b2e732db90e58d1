//! [`Probes::attach`]: the KFD and NVIDIA ioctl sources, the programs' configuration (the file
//! rules the in-kernel filter applies), the tracepoints, the kernel-internal probes and the launch
//! programs, each a step of its own on the state they share.

use std::{collections::HashMap, path::Path};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::Array,
    programs::{KProbe, TracePoint, UProbe},
    Ebpf,
};
use gpreempt_common::{
    kprobe::{self, KernelOffsets, PROBES},
    record::{config_flag, Config},
};

use super::{
    detach::Detacher,
    load::{load_object_sized, preflight, EBPF_OBJECT},
    pairs::{attach_fentry_pair, attach_kfd_pair, attach_nv_pair, load_kfd_pair},
    source::source_name,
    HostProbeFacts, IoctlFilter, IoctlSource, Pair, ProbeOptions, Probes, SourceKind, SourceStatus,
    NV_IOCTL,
};
use crate::observe::{
    gpufiles::Devices,
    tracing::{Attached, Programs, Target},
};

/// The syscall/sched tracepoints: the floor of observation, present on every kernel.
const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("gpu_ioctl_enter", "syscalls", "sys_enter_ioctl"),
    ("gpu_ioctl_exit", "syscalls", "sys_exit_ioctl"),
    ("gpu_process_exit", "sched", "sched_process_exit"),
];

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
    devices: &Devices,
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
    tracing: Option<&Programs>,
    facts: &HostProbeFacts,
    offsets_written: &Result<()>,
) -> (Vec<SourceStatus>, Vec<Attached>) {
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

impl Probes {
    /// Loads the programs, writes the configuration, attaches the tracepoints (the floor: an error
    /// if they fail), then every kernel-internal probe this host allows (each optional), and loads
    /// the launch uprobes for [`Probes::watch_launches`].
    pub fn attach(opts: &ProbeOptions) -> Result<Self> {
        preflight()?;
        let mut ebpf = load_object_sized(opts.ebpf_log, opts.ring_bytes)?;
        // Before the log reader takes its map out of `ebpf`: the tracing programs need them all.
        let programs = Programs::of(&ebpf, EBPF_OBJECT).map_err(|e| format!("{e:#}"));
        let logger = if opts.ebpf_log {
            Some(aya_log::EbpfLogger::init(&mut ebpf).context("starting the eBPF log reader")?)
        } else {
            None
        };
        let mut a = Attach::new(opts, ebpf, programs);
        let kfd = a.plan_kfd()?;
        let config = base_config(opts);
        let nv_pair = a.attach_nv_source();
        let (filter, usable) = a.configure_ioctls(config, kfd.usable.clone())?;
        let attached = usable.and_then(|()| a.attach_kfd_pair(kfd));
        if let (IoctlSource::Fentry, Err(why)) = (opts.ioctl_source, &attached) {
            bail!("--ioctl-source fentry: {why}");
        }
        let (kfd_pair, filter) = a.settle_kfd_source(attached, config, filter)?;
        // With the pair live, the ioctl tracepoints only serve GPU files amdkfd does not.
        let beyond = a.devices.beyond_amdkfd();
        let ioctl_tracepoints = kfd_pair.is_none() || beyond.is_some();
        if let (Some(_), Some(why)) = (kfd_pair, &beyond) {
            log::info!("the syscall ioctl tracepoints stay attached for {why}");
        }
        a.attach_tracepoints(ioctl_tracepoints)?;
        a.add_kernel_probes();
        let launch_ready = a.load_launch();
        a.log_sources();
        Ok(Self {
            ebpf: a.ebpf,
            logger,
            sources: a.sources,
            launch_links: HashMap::new(),
            detacher: Detacher::default(),
            launch_ready,
            filter,
            kfd_pair,
            nv_pair,
            _tracing: a.tracing,
            ioctl_tracepoints,
        })
    }
}

/// The configuration every ioctl program shares: the launch-hint gap, the pid filter, the
/// per-process rate limit (the file rules come later, once the sources are known), and our own
/// RM escapes left out: a scan of the processes already on the GPU makes tens of thousands of
/// driver calls, which would otherwise fill the ring that other processes' records need.
/// `DaemonSets` run with the host's pid namespace, so our pid is the kernel's tgid.
fn base_config(opts: &ProbeOptions) -> Config {
    let mut config = Config {
        launch_gap_ns: opts.launch_gap_ns,
        flags: config_flag::SKIP_OWN_RM,
        own_tgid: std::process::id(),
        ..Config::default()
    };
    if let Some(pid) = opts.pid {
        config.flags |= config_flag::FILTER_TGID;
        config.tgid = pid;
    }
    if let Some((rate, burst)) = opts.rate_limit {
        (config.rate_per_s, config.rate_burst) = (rate, burst.max(1));
    }
    config
}

/// The live status of an ioctl pair.
fn pair_status(name: String, pair: Pair, detail: &str) -> SourceStatus {
    SourceStatus {
        name,
        kind: match pair {
            Pair::Fentry => SourceKind::Fentry,
            Pair::Kprobe => SourceKind::Kprobe,
        },
        live: true,
        detail: detail.into(),
    }
}

/// How KFD ioctl records could come from a pair on `kfd_ioctl`.
struct KfdPlan {
    /// The fentry/fexit target, or why not.
    fentry: Result<Target, String>,
    /// Whether the kprobe pair can be used, or why not.
    kprobe: Result<(), String>,
    /// The kprobe pair already went through the verifier.
    kprobe_loaded: bool,
    /// Whether either can: Err gives both reasons.
    usable: Result<(), String>,
}

/// What [`Probes::attach`]'s steps share.
struct Attach<'o> {
    opts: &'o ProbeOptions,
    ebpf: Ebpf,
    /// The BTF-typed (fentry/fexit) programs, or why there are none.
    programs: Result<Programs, String>,
    /// Links of the programs attached through BTF here (dropping them detaches).
    tracing: Vec<Attached>,
    facts: HostProbeFacts,
    offsets_written: Result<()>,
    devices: Devices,
    sources: Vec<SourceStatus>,
}

impl<'o> Attach<'o> {
    /// Reads the host's facts and writes the struct offsets first: the ioctl programs need the
    /// fd -> inode offsets before they attach.
    fn new(opts: &'o ProbeOptions, mut ebpf: Ebpf, programs: Result<Programs, String>) -> Self {
        let facts = HostProbeFacts::read(Path::new("/"));
        let offsets_written = write_offsets(&mut ebpf, &facts.offsets);
        let devices = Devices::read(&opts.kfd_device, &opts.nvidia_devices);
        Self {
            opts,
            ebpf,
            programs,
            tracing: Vec::new(),
            facts,
            offsets_written,
            devices,
            sources: Vec::new(),
        }
    }

    /// The KFD source: a pair on kfd_ioctl where one can be had (fentry/fexit first, loaded and
    /// attached once the configuration that tells the tracepoints to leave amdkfd's node alone
    /// is written; the kprobe pair loaded here to know it passes the verifier). An error where
    /// `--ioctl-source` names a pair that cannot be used.
    fn plan_kfd(&mut self) -> Result<KfdPlan> {
        let source = self.opts.ioctl_source;
        let fentry = match (source, &self.facts.kfd_ioctl_btf, &self.programs) {
            (IoctlSource::Auto | IoctlSource::Fentry, Some(t), Ok(_)) => Ok(t.clone()),
            (IoctlSource::Auto | IoctlSource::Fentry, None, _) => {
                Err("kfd_ioctl has no BTF (amdgpu not loaded, or built without module BTF)".into())
            }
            (IoctlSource::Auto | IoctlSource::Fentry, _, Err(e)) => Err(e.clone()),
            (src, ..) => Err(format!("--ioctl-source {}", source_name(src))),
        };
        let kprobe = match source {
            IoctlSource::Tracepoint | IoctlSource::Fentry => {
                Err(format!("--ioctl-source {}", source_name(source)))
            }
            // With fentry to try first, the kprobe pair goes through the verifier only if it
            // is needed (in `attach_kfd_pair`).
            _ if fentry.is_ok() => self.facts.kfd_pair(),
            _ => self
                .facts
                .kfd_pair()
                .and_then(|()| load_kfd_pair(&mut self.ebpf)),
        };
        let kprobe_loaded = kprobe.is_ok() && fentry.is_err();
        if let (IoctlSource::Kprobe, Err(why)) = (source, &kprobe) {
            bail!("--ioctl-source kprobe: the kprobe pair on kfd_ioctl cannot be used: {why}");
        }
        if let (IoctlSource::Fentry, Err(why)) = (source, &fentry) {
            bail!(
                "--ioctl-source fentry: the fentry/fexit pair on kfd_ioctl cannot be used: {why}"
            );
        }
        let usable = match (&fentry, &kprobe) {
            (Err(a), Err(b)) if a != b => Err(format!("fentry: {a}; kprobe: {b}")),
            (Err(a), Err(_)) => Err(a.clone()),
            _ => Ok(()),
        };
        self.devices.kprobed = usable.is_ok();
        Ok(KfdPlan {
            fentry,
            kprobe,
            kprobe_loaded,
            usable,
        })
    }

    /// The NVIDIA source: a pair on nvidia_unlocked_ioctl where one can be had, so that no
    /// other ioctl on the host runs a program; None: the syscall tracepoints.
    fn attach_nv_source(&mut self) -> Option<Pair> {
        let by_file =
            self.offsets_written.is_ok() && self.facts.offsets.has_all(kprobe::field::FILE_CHAIN);
        let attached = self
            .facts
            .nv_plan(self.devices.nvidia_loaded, self.opts.ioctl_source, by_file)
            .and_then(|plan| {
                attach_nv_pair(
                    &mut self.ebpf,
                    self.programs.as_ref().ok(),
                    &self.facts,
                    &plan,
                )
            });
        match attached {
            Ok((p, links)) => {
                self.tracing.extend(links);
                self.devices.nv_pair = true;
                self.sources.push(pair_status(
                    format!("{NV_IOCTL} entry/return"),
                    p,
                    "NVIDIA RM escapes",
                ));
                Some(p)
            }
            Err(why) => {
                if self.devices.nvidia_loaded {
                    log::info!("NVIDIA ioctls from the syscall tracepoints: {why}");
                }
                None
            }
        }
    }

    /// Chooses how ioctls are selected and writes the configuration; the KFD pair stays usable
    /// unless the tracepoints, without file rules, could not leave a stand-in node to it.
    fn configure_ioctls(
        &mut self,
        config: Config,
        usable: Result<(), String>,
    ) -> Result<(IoctlFilter, Result<(), String>)> {
        let (filter, rules) = choose_filter(&self.facts, &self.offsets_written, &self.devices);
        let usable = match (&filter, usable) {
            // Without the file rules the tracepoints cannot tell a stand-in from amdkfd's node.
            (IoctlFilter::ByType(_), Ok(())) if self.devices.kfd_stand_in() => {
                self.devices.kprobed = false;
                Err("the KFD node is a stand-in and files cannot be told apart".into())
            }
            (_, p) => p,
        };
        configure(
            &mut self.ebpf,
            config,
            &filter,
            &rules,
            self.devices.kprobed,
            self.devices.tracepoint_skips(),
        )?;
        Ok((filter, usable))
    }

    /// Attaches the KFD pair: fentry/fexit first, then the kprobe pair; Err gives each reason.
    fn attach_kfd_pair(&mut self, plan: KfdPlan) -> Result<Pair, String> {
        let mut why = Vec::new();
        if let (Ok(target), Ok(programs)) = (&plan.fentry, &self.programs) {
            match attach_fentry_pair(programs, target) {
                Ok(links) => {
                    self.tracing.extend(links);
                    return Ok(Pair::Fentry);
                }
                Err(e) if self.opts.ioctl_source == IoctlSource::Fentry => return Err(e),
                Err(e) => {
                    log::info!("the fentry/fexit pair on kfd_ioctl: {e}; trying the kprobe pair");
                    why.push(format!("fentry: {e}"));
                }
            }
        }
        let kprobe = plan.kprobe.and_then(|()| {
            if !plan.kprobe_loaded {
                load_kfd_pair(&mut self.ebpf)?;
            }
            attach_kfd_pair(&mut self.ebpf)
        });
        match kprobe {
            Ok(()) => Ok(Pair::Kprobe),
            Err(e) => {
                why.push(format!("kprobe: {e}"));
                Err(why.join("; "))
            }
        }
    }

    /// Records the KFD source; where the pair was loaded but did not attach, rewrites the
    /// configuration so that the tracepoints take amdkfd's node back.
    fn settle_kfd_source(
        &mut self,
        attached: Result<Pair, String>,
        config: Config,
        filter: IoctlFilter,
    ) -> Result<(Option<Pair>, IoctlFilter)> {
        let why = match attached {
            Ok(p) => {
                self.sources.push(pair_status(
                    "kfd_ioctl entry/return".into(),
                    p,
                    "KFD ioctls",
                ));
                return Ok((Some(p), filter));
            }
            Err(why) => why,
        };
        if !self.devices.kprobed {
            log::info!("KFD ioctls from the syscall tracepoints: {why}");
            return Ok((None, filter));
        }
        // Loaded but not attached: back to the tracepoints for amdkfd's node too.
        log::warn!("the kprobe pair on kfd_ioctl did not attach ({why}): KFD ioctls come from the syscall tracepoints");
        self.devices.kprobed = false;
        let (filter, rules) = choose_filter(&self.facts, &self.offsets_written, &self.devices);
        configure(
            &mut self.ebpf,
            config,
            &filter,
            &rules,
            false,
            self.devices.tracepoint_skips(),
        )?;
        Ok((None, filter))
    }

    /// The syscall/sched tracepoints (the floor: an error if one fails); the ioctl ones only
    /// where `ioctl` says something still needs them.
    fn attach_tracepoints(&mut self, ioctl: bool) -> Result<()> {
        for (prog, category, name) in TRACEPOINTS {
            if !ioctl && category == "syscalls" {
                continue;
            }
            let tp: &mut TracePoint = self
                .ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?
                .try_into()?;
            tp.load()
                .with_context(|| format!("the verifier rejected {prog}"))?;
            tp.attach(category, name)
                .with_context(|| format!("attaching {prog} to tracepoint {category}/{name}"))?;
            self.sources.push(SourceStatus {
                name: format!("{category}/{name}"),
                kind: SourceKind::Tracepoint,
                live: true,
                detail: String::new(),
            });
        }
        Ok(())
    }

    /// The kernel-internal probes, unless `--no-kernel-probes`.
    fn add_kernel_probes(&mut self) {
        if self.opts.no_kernel_probes {
            self.sources.push(SourceStatus {
                name: "amdkfd kprobes".into(),
                kind: SourceKind::Kprobe,
                live: false,
                detail: "not requested".into(),
            });
            return;
        }
        let (s, links) = attach_kernel_probes(
            &mut self.ebpf,
            self.programs.as_ref().ok(),
            &self.facts,
            &self.offsets_written,
        );
        self.sources.extend(s);
        self.tracing.extend(links);
    }

    /// Loads the launch uprobe programs and lists them as a source (live once a process is
    /// watched).
    fn load_launch(&mut self) -> Result<(), String> {
        let ready = load_launch_programs(&mut self.ebpf);
        self.sources.push(SourceStatus {
            name: "launch uprobes".into(),
            kind: SourceKind::Uprobe,
            live: false,
            detail: match &ready {
                Ok(()) => "ready; no process watched".into(),
                Err(e) => e.clone(),
            },
        });
        ready
    }

    fn log_sources(&self) {
        for s in &self.sources {
            if s.live {
                log::debug!("event source {}: live {}", s.name, s.detail);
            } else {
                log::info!("event source {}: not live: {}", s.name, s.detail);
            }
        }
    }
}
