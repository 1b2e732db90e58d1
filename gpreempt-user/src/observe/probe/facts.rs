//! What the host allows: kprobe support, the probed functions in kallsyms, and the struct
//! offsets and function prototypes from BTF, turned into a plan per probe. Pure where it can be,
//! so the decisions are unit-tested without a kernel.

use std::{collections::HashSet, path::Path};

use gpreempt_common::kprobe::{self, KernelOffsets, ProbeSpec, FIELDS, PROBES};

use super::{IoctlSource, Pair, NV_IOCTL};

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
