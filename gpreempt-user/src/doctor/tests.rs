use super::{amd::*, generic::*, nvidia::*, *};
use crate::{
    observe::kfd::sysfs::GpuNode,
    observe::{
        host::{CAP_BPF, CAP_PERFMON},
        probe::ProgramCheck,
    },
};
use gpreempt_common::kprobe::{FIELDS, PROBES};
use std::sync::atomic::{AtomicU32, Ordering};
use std::{fs, path::PathBuf};

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
    let fw = Some(0x283f_a280); // what the emulator advertises for gfx90a
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

    let c = ioctl_filter_check(&facts, "-");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.finding.starts_with("selected by type byte only (")
            && c.finding.contains("/sys/kernel/btf/vmlinux is missing")
            && c.finding.contains("hide its GPU calls"),
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
    // kfd_ioctl has BTF (the module's, or vmlinux's): fentry needs no kprobes.
    let facts = HostProbeFacts {
        kfd_ioctl_btf: Some(kfd_ioctl_in("amdgpu")),
        ..facts
    };
    let c = &kernel_probe_checks(&facts)[0];
    assert_eq!(c.name, "probe:kfd_ioctl");
    assert_eq!(c.verdict, Verdict::Ok);
    assert!(c.finding.starts_with("attachable (fentry)"), "{c:?}");
}

fn kfd_ioctl_in(object: &str) -> crate::observe::tracing::Target {
    crate::observe::tracing::Target {
        function: "kfd_ioctl".into(),
        btf_object: object.into(),
        type_id: 123_456,
    }
}

/// The source line follows what attached: the fentry pair where the trial attach worked, the
/// kprobe pair (saying why not fentry) where kprobes reach kfd_ioctl, else the tracepoints.
#[test]
fn doctor_ioctl_source_follows_the_fentry_trial() {
    let devices = crate::observe::gpufiles::Devices::read(Path::new("/nonexistent/kfd"), &[]);
    let mut facts = HostProbeFacts {
        kprobes: Ok(()),
        kallsyms: ["kfd_ioctl".to_string()].into_iter().collect(),
        offsets: Default::default(),
        missing: Vec::new(),
        kfd_ioctl_btf: Some(kfd_ioctl_in("amdgpu")),
        nv_ioctl_btf: None,
    };
    let c = ioctl_source_check(&facts, &devices, Some(&Ok(())));
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    assert!(
        c.finding.starts_with(
            "KFD ioctls from an fentry + fexit pair on kfd_ioctl (BPF trampolines, amdgpu BTF)"
        ),
        "{c:?}"
    );
    let refused = Err("the kernel refused kfd_ioctl_fexit: Operation not permitted".to_string());
    let c = ioctl_source_check(&facts, &devices, Some(&refused));
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    assert!(
        c.finding
            .starts_with("KFD ioctls from a kprobe + kretprobe on kfd_ioctl")
            && c.finding
                .contains("fentry/fexit: the kernel refused kfd_ioctl_fexit"),
        "{c:?}"
    );
    facts.kprobes = Err("no kprobe PMU".into());
    let c = ioctl_source_check(&facts, &devices, Some(&refused));
    assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
    assert!(
        c.finding.starts_with("KFD ioctls from the syscall tracepoints (no kprobe PMU; fentry/fexit: the kernel refused"),
        "{c:?}"
    );
    // Without BTF for kfd_ioctl a successful trial cannot be (no target): never claimed.
    facts.kfd_ioctl_btf = None;
    let c = ioctl_source_check(&facts, &devices, Some(&Ok(())));
    assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
    assert!(c.finding.contains("kfd_ioctl has no BTF"), "{c:?}");
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
        kfd_ioctl_btf: None,
        nv_ioctl_btf: None,
    };
    let c = btf_offsets_check(&facts);
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    let n = FIELDS.len();
    assert!(
        c.finding.starts_with(&format!(
            "{}/{n} fields resolved (every field a probe or the ioctl filter needs)",
            n - 1
        )),
        "{c:?}"
    );
    assert!(c.finding.contains("kfd_process.pasid"), "{c:?}");
    let c = ioctl_filter_check(&facts, "KFD major 510");
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    assert!(c.finding.ends_with("any type byte: KFD major 510"), "{c:?}");
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
        // 400: listed by the KFD, held by the controller (500) through its control thread
        // (501, `gpreempt-ctl`): TracerPid names the thread.
        .write("/proc/400/status", "Name:\ttrain\nTracerPid:\t501\n")
        .mkdir("/sys/class/kfd/kfd/proc/400")
        .write("/proc/500/comm", "gpreempt-ebpf\n")
        .write(
            "/proc/501/status",
            "Name:\tgpreempt-ctl\nTgid:\t500\nTracerPid:\t0\n",
        )
        .write("/proc/501/comm", "gpreempt-ctl\n")
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
                tracer: 501,
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
            ("nvidia-gpus", Verdict::Ok),
            ("nvidia-gsp:0000:00:06.0", Verdict::Ok),
            ("pidfd_getfd", Verdict::Ok),
            ("nvidia-mps", Verdict::Ok),
        ],
        "{cs:#?}"
    );
    // Not probed (a fake root): no pidfd_getfd line.
    assert_eq!(
        nv_names(&nvidia_checks(&t.root(), None, true)),
        [
            "nvidia-driver",
            "nvidia-gpus",
            "nvidia-gsp:0000:00:06.0",
            "nvidia-mps"
        ]
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
            ("nvidia-gpus", Verdict::Ok),
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

/// NVIDIA RM escapes: the pair on nvidia_unlocked_ioctl, fentry first where the module has BTF,
/// the kprobe pair where kprobes reach it, else the syscall tracepoints with the reason.
#[test]
fn the_nvidia_source_is_the_driver_entry_pair_where_one_can_attach() {
    use crate::observe::probe::{IoctlSource, Pair, NV_IOCTL};
    let mut facts = HostProbeFacts {
        kprobes: Ok(()),
        kallsyms: [NV_IOCTL.to_string()].into_iter().collect(),
        offsets: Default::default(),
        missing: Vec::new(),
        kfd_ioctl_btf: None,
        nv_ioctl_btf: Some(crate::observe::tracing::Target {
            function: NV_IOCTL.into(),
            btf_object: "nvidia".into(),
            type_id: 77,
        }),
    };
    assert_eq!(
        facts.nv_plan(true, IoctlSource::Auto, true),
        Ok(vec![Pair::Fentry, Pair::Kprobe])
    );
    // Not an NVIDIA host, forced to the tracepoints, or files cannot be told apart.
    assert!(facts.nv_plan(false, IoctlSource::Auto, true).is_err());
    let e = facts
        .nv_plan(true, IoctlSource::Tracepoint, true)
        .unwrap_err();
    assert!(e.contains("--ioctl-source tracepoint"), "{e}");
    let e = facts.nv_plan(true, IoctlSource::Auto, false).unwrap_err();
    assert!(e.contains("files cannot be told apart"), "{e}");
    // No module BTF: the kprobe pair.
    facts.nv_ioctl_btf = None;
    assert_eq!(
        facts.nv_plan(true, IoctlSource::Auto, true),
        Ok(vec![Pair::Kprobe])
    );
    // Neither (the device VM has fentry but no kprobes; here neither): both reasons.
    facts.kprobes = Err("kprobes are unavailable: no kprobe PMU".into());
    let e = facts.nv_plan(true, IoctlSource::Auto, true).unwrap_err();
    assert!(e.contains("no BTF") && e.contains("no kprobe PMU"), "{e}");
    facts.kprobes = Ok(());
    facts.kallsyms.clear();
    let e = facts.nv_plan(true, IoctlSource::Auto, true).unwrap_err();
    assert!(e.contains("not in /proc/kallsyms"), "{e}");
}

/// With the pair live the tracepoints leave NVIDIA's major to it, and no longer need to stay
/// attached for it.
#[test]
fn the_nvidia_pair_takes_the_major_from_the_tracepoints() {
    use gpreempt_common::{nv, record::file_kind};
    let mut d = crate::observe::gpufiles::Devices {
        nvidia_loaded: true,
        ..Default::default()
    };
    let kind_of_major = |d: &crate::observe::gpufiles::Devices| {
        d.rules()
            .0
            .iter()
            .find(|r| r.dev >> 20 == nv::NV_MAJOR_DEVICE_NUMBER && r.mask != u32::MAX)
            .map(|r| r.kind)
    };
    use gpreempt_common::record::config_flag::{NO_KFD_FILES, NO_NVIDIA_FILES};
    assert_eq!(kind_of_major(&d), Some(file_kind::NVIDIA));
    assert!(d.beyond_amdkfd().is_some());
    // An NVIDIA host without KFD: KFD nrs (tty ioctls share them) end the tracepoint at once.
    assert_eq!(d.tracepoint_skips(), NO_KFD_FILES);
    d.nv_pair = true;
    assert_eq!(kind_of_major(&d), Some(file_kind::KPROBED));
    assert_eq!(d.beyond_amdkfd(), None);
    assert_eq!(d.tracepoint_skips(), NO_KFD_FILES | NO_NVIDIA_FILES);
    // amdkfd loaded: its nrs are the tracepoints' unless the kfd_ioctl pair serves them.
    d.kfd_major = Some(510);
    assert_eq!(d.tracepoint_skips(), NO_NVIDIA_FILES);
    d.kprobed = true;
    assert_eq!(d.tracepoint_skips(), NO_KFD_FILES | NO_NVIDIA_FILES);
    // A stand-in node is still the tracepoints' to serve.
    d.nvidia.push(crate::observe::gpufiles::FileId {
        rdev: None,
        dev: 5,
        ino: 9,
    });
    assert!(d.beyond_amdkfd().is_some());
    assert_eq!(d.tracepoint_skips(), NO_KFD_FILES);
}

/// `suspendable` names the processes a running controller found without the debug API, and
/// the fallback; processes held frozen are listed; no controller: where to look.
#[test]
fn suspendable_names_processes_without_the_debug_api_and_the_fallback() {
    let c = suspendable_check(None);
    assert_eq!(c.verdict, Verdict::Ok);
    assert!(c.finding.contains("no controller running"), "{}", c.finding);
    let mut s = crate::observe::status::Status {
        controller_pid: 7,
        ..Default::default()
    };
    s.uncontrollable.insert(
        300,
        crate::observe::model::Uncontrollable {
            kind: "traced".into(),
            reason: "already traced".into(),
        },
    );
    let c = suspendable_check(Some(&s));
    assert_eq!(
        c.verdict,
        Verdict::Ok,
        "a traced process is another check's"
    );
    s.uncontrollable.insert(
        200,
        crate::observe::model::Uncontrollable {
            kind: "no_debug_api".into(),
            reason: "never enabled".into(),
        },
    );
    s.frozen.insert(100, "/sys/fs/cgroup/job".into());
    let c = suspendable_check(Some(&s));
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.finding.starts_with("pid(s) 200:"), "{}", c.finding);
    assert!(
        c.finding.contains("pid 100 (/sys/fs/cgroup/job)"),
        "{}",
        c.finding
    );
    assert!(
        c.fix
            .as_deref()
            .unwrap_or_default()
            .contains("no_debug_api"),
        "{c:?}"
    );
}

/// A stand-in host with the NVIDIA driver (`nvidia`), an amdgpu module and KFD node (`amd`),
/// both or neither.
fn vendor_host(nvidia: bool, amd: bool) -> Tree {
    let t = Tree::new();
    t.write(
        "/proc/self/status",
        "Name:\tdoctor\nCapEff:\t000001ffffffffff\n",
    );
    if nvidia {
        t.write("/dev/nvidiactl", "")
            .write("/proc/driver/nvidia/version", NV_OPEN_580);
        crate::observe::nv::gpus::fixture::write_gpus(
            &t.root().path("/proc"),
            &crate::observe::nv::gpus::fixture::TWO_H100,
        );
    }
    if amd {
        t.write("/dev/kfd", "")
            .write("/sys/module/amdgpu/parameters/sched_policy", "0\n");
    }
    t
}

/// What an AMD check's line or fix says: amdgpu, the KFD, its debugfs.
fn amd_advice(cs: &[Check]) -> Vec<String> {
    cs.iter()
        .filter(|c| c.name != "amd")
        .filter(|c| {
            let text = format!("{} {}", c.finding, c.fix.as_deref().unwrap_or(""));
            ["amdgpu", "/dev/kfd", "kfd_ioctl", "debugfs"]
                .iter()
                .any(|w| text.contains(w))
                && c.verdict != Verdict::Ok
        })
        .map(|c| format!("{}: {} / {:?}", c.name, c.finding, c.fix))
        .collect()
}

/// An NVIDIA-only host: the AMD checks are one `amd` line ("not applicable"), no line advises
/// amdgpu, and `nvidia-gpus` lists the GPUs by index, name, bus id and UUID.
#[test]
fn doctor_on_an_nvidia_only_host_says_the_amd_checks_do_not_apply() {
    let t = vendor_host(true, false);
    assert!(!amd_applies(&t.root(), &t.root().path("/dev/kfd")));
    let cs = run_checks(&t.root(), &t.root().path("/dev/kfd"), &t.0);
    let amd = by_name(&cs, "amd");
    assert_eq!(amd.verdict, Verdict::Ok);
    assert!(
        amd.finding
            .starts_with("not applicable: no amdgpu on this host"),
        "{amd:?}"
    );
    for name in [
        "kfd",
        "debugfs",
        "amdgpu",
        "btf-amdgpu",
        "btf-offsets",
        "ioctl-source",
    ] {
        assert!(cs.iter().all(|c| c.name != name), "{name} listed: {cs:#?}");
    }
    assert!(amd_advice(&cs).is_empty(), "{:#?}", amd_advice(&cs));
    assert_eq!(
        by_name(&cs, "nvidia-gpus").finding,
        "2 GPUs: GPU 0 NVIDIA H100 80GB HBM3 00000000:19:00.0 \
         GPU-11111111-2222-3333-4444-555555555555; GPU 1 NVIDIA H100 80GB HBM3 00000000:3B:00.0 \
         GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
    );
}

/// A host with both drivers gets both vendors' lines; one with neither keeps the AMD advice
/// (what an AMD host needs) and no NVIDIA line.
#[test]
fn doctor_on_a_mixed_host_and_one_with_neither() {
    for (nvidia, amd) in [(true, true), (false, false), (false, true)] {
        let t = vendor_host(nvidia, amd);
        assert!(amd_applies(&t.root(), &t.root().path("/dev/kfd")));
        let cs = run_checks(&t.root(), &t.root().path("/dev/kfd"), &t.0);
        assert!(cs.iter().all(|c| c.name != "amd"), "{cs:#?}");
        assert!(cs.iter().any(|c| c.name == "kfd"), "{cs:#?}");
        assert!(cs.iter().any(|c| c.name == "debugfs"), "{cs:#?}");
        assert_eq!(
            cs.iter().any(|c| c.name == "nvidia-gpus"),
            nvidia,
            "{cs:#?}"
        );
    }
    // Neither: the AMD advice is today's (load amdgpu).
    let t = vendor_host(false, false);
    let cs = run_checks(&t.root(), &t.root().path("/dev/kfd"), &t.0);
    assert!(!amd_advice(&cs).is_empty(), "{cs:#?}");
}
