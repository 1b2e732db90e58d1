//! Checks gpreempt-common's KFD definitions against the real uapi header
//! (/usr/include/linux/kfd_ioctl.h from linux-libc-dev: KFD 1.11 on Debian 12).
//!
//! A C program compiled against the header prints sizes, field offsets, command values and
//! constants; every one must match the Rust side. Structs newer than the installed header
//! (debug API, 1.12+) are checked against docs/kfd.md in the unit tests instead.

use std::{collections::HashMap, path::Path, process::Command};

use gpreempt_common::kfd::{self, *};

const HEADER: &str = "/usr/include/linux/kfd_ioctl.h";

/// (C struct, Rust size, Rust (field, offset) list).
type StructInfo = (&'static str, usize, &'static [(&'static str, usize)]);

/// Every struct the KFD 1.11 header defines.
fn structs() -> Vec<StructInfo> {
    macro_rules! s {
        ($($t:ty),* $(,)?) => { vec![$((<$t>::C_NAME, core::mem::size_of::<$t>(), <$t>::FIELDS)),*] };
    }
    let mut v = s!(
        GetVersionArgs,
        DestroyQueueArgs,
        UpdateQueueArgs,
        SetCuMaskArgs,
        GetQueueWaveStateArgs,
        GetAvailableMemoryArgs,
        SetMemoryPolicyArgs,
        GetClockCountersArgs,
        ProcessDeviceApertures,
        GetProcessAperturesArgs,
        GetProcessAperturesNewArgs,
        DbgRegisterArgs,
        DbgUnregisterArgs,
        DbgAddressWatchArgs,
        DbgWaveControlArgs,
        CreateEventArgs,
        DestroyEventArgs,
        SetEventArgs,
        ResetEventArgs,
        MemoryExceptionFailure,
        HsaMemoryExceptionData,
        HsaHwExceptionData,
        EventData,
        WaitEventsArgs,
        SetScratchBackingVaArgs,
        GetTileConfigArgs,
        SetTrapHandlerArgs,
        AcquireVmArgs,
        AllocMemoryOfGpuArgs,
        FreeMemoryOfGpuArgs,
        MapMemoryToGpuArgs,
        UnmapMemoryFromGpuArgs,
        AllocQueueGwsArgs,
        GetDmabufInfoArgs,
        ImportDmabufArgs,
        SmiEventsArgs,
        CriuArgs,
        CriuDeviceBucket,
        CriuBoBucket,
        SvmAttribute,
        SvmArgs,
        SetXnackModeArgs,
    );
    // The 1.11 header has the 88-byte create_queue: its fields are the prefix of ours.
    let cq: Vec<_> = CreateQueueArgs::FIELDS
        .iter()
        .copied()
        .filter(|(_, off)| *off < CREATE_QUEUE_ARGS_SIZE_V1)
        .collect();
    v.push((
        CreateQueueArgs::C_NAME,
        CREATE_QUEUE_ARGS_SIZE_V1,
        Box::leak(cq.into_boxed_slice()),
    ));
    v
}

/// (macro, Rust value) for the commands and constants the header defines.
fn constants() -> Vec<(&'static str, u64)> {
    let mut v = commands();
    v.extend(values());
    v.extend(flags());
    v
}

/// The ioctl commands.
fn commands() -> Vec<(&'static str, u64)> {
    use kfd::cmd;
    vec![
        ("AMDKFD_IOC_GET_VERSION", cmd::GET_VERSION.into()),
        ("AMDKFD_IOC_CREATE_QUEUE", cmd::CREATE_QUEUE_V1.into()),
        ("AMDKFD_IOC_DESTROY_QUEUE", cmd::DESTROY_QUEUE.into()),
        (
            "AMDKFD_IOC_SET_MEMORY_POLICY",
            cmd::SET_MEMORY_POLICY.into(),
        ),
        (
            "AMDKFD_IOC_GET_CLOCK_COUNTERS",
            cmd::GET_CLOCK_COUNTERS.into(),
        ),
        (
            "AMDKFD_IOC_GET_PROCESS_APERTURES",
            cmd::GET_PROCESS_APERTURES.into(),
        ),
        ("AMDKFD_IOC_UPDATE_QUEUE", cmd::UPDATE_QUEUE.into()),
        ("AMDKFD_IOC_CREATE_EVENT", cmd::CREATE_EVENT.into()),
        ("AMDKFD_IOC_DESTROY_EVENT", cmd::DESTROY_EVENT.into()),
        ("AMDKFD_IOC_SET_EVENT", cmd::SET_EVENT.into()),
        ("AMDKFD_IOC_RESET_EVENT", cmd::RESET_EVENT.into()),
        ("AMDKFD_IOC_WAIT_EVENTS", cmd::WAIT_EVENTS.into()),
        (
            "AMDKFD_IOC_DBG_REGISTER_DEPRECATED",
            cmd::DBG_REGISTER_DEPRECATED.into(),
        ),
        (
            "AMDKFD_IOC_DBG_UNREGISTER_DEPRECATED",
            cmd::DBG_UNREGISTER_DEPRECATED.into(),
        ),
        (
            "AMDKFD_IOC_DBG_ADDRESS_WATCH_DEPRECATED",
            cmd::DBG_ADDRESS_WATCH_DEPRECATED.into(),
        ),
        (
            "AMDKFD_IOC_DBG_WAVE_CONTROL_DEPRECATED",
            cmd::DBG_WAVE_CONTROL_DEPRECATED.into(),
        ),
        (
            "AMDKFD_IOC_SET_SCRATCH_BACKING_VA",
            cmd::SET_SCRATCH_BACKING_VA.into(),
        ),
        ("AMDKFD_IOC_GET_TILE_CONFIG", cmd::GET_TILE_CONFIG.into()),
        ("AMDKFD_IOC_SET_TRAP_HANDLER", cmd::SET_TRAP_HANDLER.into()),
        (
            "AMDKFD_IOC_GET_PROCESS_APERTURES_NEW",
            cmd::GET_PROCESS_APERTURES_NEW.into(),
        ),
        ("AMDKFD_IOC_ACQUIRE_VM", cmd::ACQUIRE_VM.into()),
        (
            "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU",
            cmd::ALLOC_MEMORY_OF_GPU.into(),
        ),
        (
            "AMDKFD_IOC_FREE_MEMORY_OF_GPU",
            cmd::FREE_MEMORY_OF_GPU.into(),
        ),
        (
            "AMDKFD_IOC_MAP_MEMORY_TO_GPU",
            cmd::MAP_MEMORY_TO_GPU.into(),
        ),
        (
            "AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU",
            cmd::UNMAP_MEMORY_FROM_GPU.into(),
        ),
        ("AMDKFD_IOC_SET_CU_MASK", cmd::SET_CU_MASK.into()),
        (
            "AMDKFD_IOC_GET_QUEUE_WAVE_STATE",
            cmd::GET_QUEUE_WAVE_STATE.into(),
        ),
        ("AMDKFD_IOC_GET_DMABUF_INFO", cmd::GET_DMABUF_INFO.into()),
        ("AMDKFD_IOC_IMPORT_DMABUF", cmd::IMPORT_DMABUF.into()),
        ("AMDKFD_IOC_ALLOC_QUEUE_GWS", cmd::ALLOC_QUEUE_GWS.into()),
        ("AMDKFD_IOC_SMI_EVENTS", cmd::SMI_EVENTS.into()),
        ("AMDKFD_IOC_SVM", cmd::SVM.into()),
        ("AMDKFD_IOC_SET_XNACK_MODE", cmd::SET_XNACK_MODE.into()),
        ("AMDKFD_IOC_CRIU_OP", cmd::CRIU_OP.into()),
        ("AMDKFD_IOC_AVAILABLE_MEMORY", cmd::AVAILABLE_MEMORY.into()),
    ]
}

/// Queue types, limits, SMI events, eviction triggers and CRIU operations.
fn values() -> Vec<(&'static str, u64)> {
    vec![
        ("AMDKFD_IOCTL_BASE", AMDKFD_IOCTL_BASE.into()),
        ("AMDKFD_COMMAND_START", AMDKFD_COMMAND_START.into()),
        ("KFD_IOC_QUEUE_TYPE_COMPUTE", queue_type::COMPUTE.into()),
        ("KFD_IOC_QUEUE_TYPE_SDMA", queue_type::SDMA.into()),
        (
            "KFD_IOC_QUEUE_TYPE_COMPUTE_AQL",
            queue_type::COMPUTE_AQL.into(),
        ),
        ("KFD_IOC_QUEUE_TYPE_SDMA_XGMI", queue_type::SDMA_XGMI.into()),
        ("KFD_MAX_QUEUE_PERCENTAGE", KFD_MAX_QUEUE_PERCENTAGE.into()),
        ("KFD_MAX_QUEUE_PRIORITY", KFD_MAX_QUEUE_PRIORITY.into()),
        ("KFD_MIN_QUEUE_RING_SIZE", KFD_MIN_QUEUE_RING_SIZE.into()),
        ("NUM_OF_SUPPORTED_GPUS", NUM_OF_SUPPORTED_GPUS as u64),
        ("KFD_INVALID_FD", KFD_INVALID_FD.into()),
        ("KFD_SMI_EVENT_MSG_SIZE", smi_event::MSG_SIZE as u64),
        ("KFD_SMI_EVENT_VMFAULT", smi_event::VMFAULT.into()),
        (
            "KFD_SMI_EVENT_THERMAL_THROTTLE",
            smi_event::THERMAL_THROTTLE.into(),
        ),
        (
            "KFD_SMI_EVENT_GPU_PRE_RESET",
            smi_event::GPU_PRE_RESET.into(),
        ),
        (
            "KFD_SMI_EVENT_GPU_POST_RESET",
            smi_event::GPU_POST_RESET.into(),
        ),
        (
            "KFD_SMI_EVENT_MIGRATE_START",
            smi_event::MIGRATE_START.into(),
        ),
        ("KFD_SMI_EVENT_MIGRATE_END", smi_event::MIGRATE_END.into()),
        (
            "KFD_SMI_EVENT_PAGE_FAULT_START",
            smi_event::PAGE_FAULT_START.into(),
        ),
        (
            "KFD_SMI_EVENT_PAGE_FAULT_END",
            smi_event::PAGE_FAULT_END.into(),
        ),
        (
            "KFD_SMI_EVENT_QUEUE_EVICTION",
            smi_event::QUEUE_EVICTION.into(),
        ),
        (
            "KFD_SMI_EVENT_QUEUE_RESTORE",
            smi_event::QUEUE_RESTORE.into(),
        ),
        (
            "KFD_SMI_EVENT_UNMAP_FROM_GPU",
            smi_event::UNMAP_FROM_GPU.into(),
        ),
        ("KFD_SMI_EVENT_ALL_PROCESS", smi_event::ALL_PROCESS.into()),
        (
            "KFD_QUEUE_EVICTION_TRIGGER_SVM",
            eviction_trigger::SVM.into(),
        ),
        (
            "KFD_QUEUE_EVICTION_TRIGGER_USERPTR",
            eviction_trigger::USERPTR.into(),
        ),
        (
            "KFD_QUEUE_EVICTION_TRIGGER_TTM",
            eviction_trigger::TTM.into(),
        ),
        (
            "KFD_QUEUE_EVICTION_TRIGGER_SUSPEND",
            eviction_trigger::SUSPEND.into(),
        ),
        (
            "KFD_QUEUE_EVICTION_CRIU_CHECKPOINT",
            eviction_trigger::CRIU_CHECKPOINT.into(),
        ),
        (
            "KFD_QUEUE_EVICTION_CRIU_RESTORE",
            eviction_trigger::CRIU_RESTORE.into(),
        ),
        ("KFD_CRIU_OP_PROCESS_INFO", criu_op::PROCESS_INFO.into()),
        ("KFD_CRIU_OP_CHECKPOINT", criu_op::CHECKPOINT.into()),
        ("KFD_CRIU_OP_UNPAUSE", criu_op::UNPAUSE.into()),
        ("KFD_CRIU_OP_RESTORE", criu_op::RESTORE.into()),
        ("KFD_CRIU_OP_RESUME", criu_op::RESUME.into()),
    ]
}

/// The VFS's own ioctls and the allocation flags.
fn flags() -> Vec<(&'static str, u64)> {
    let mut v = Vec::new();
    // The ioctls the VFS answers before any driver (gpreempt_common::vfs), from the same
    // installed uapi headers. FS_IOC_GETFSUUID/GETFSSYSFSPATH are newer than Debian 12's, and
    // FS_IOC_RESVSP* are kernel-internal (include/linux/falloc.h): not checked here.
    use gpreempt_common::vfs;
    for (name, val) in [
        "FIOCLEX",
        "FIONCLEX",
        "FIONBIO",
        "FIOASYNC",
        "FIOQSIZE",
        "FIFREEZE",
        "FITHAW",
        "FS_IOC_FIEMAP",
        "FIGETBSZ",
        "FICLONE",
        "FICLONERANGE",
        "FIDEDUPERANGE",
    ]
    .into_iter()
    .zip(vfs::ALL_FILES)
    .chain([
        ("FIBMAP", vfs::REGULAR_FILES[0]),
        ("FIONREAD", vfs::REGULAR_FILES[1]),
    ]) {
        v.push((name, u64::from(val)));
    }
    use alloc_mem_flags as f;
    for (n, val) in [
        ("VRAM", f::VRAM),
        ("GTT", f::GTT),
        ("USERPTR", f::USERPTR),
        ("DOORBELL", f::DOORBELL),
        ("MMIO_REMAP", f::MMIO_REMAP),
        ("WRITABLE", f::WRITABLE),
        ("EXECUTABLE", f::EXECUTABLE),
        ("PUBLIC", f::PUBLIC),
        ("NO_SUBSTITUTE", f::NO_SUBSTITUTE),
        ("AQL_QUEUE_MEM", f::AQL_QUEUE_MEM),
        ("COHERENT", f::COHERENT),
        ("UNCACHED", f::UNCACHED),
    ] {
        v.push((
            Box::leak(format!("KFD_IOC_ALLOC_MEM_FLAGS_{n}").into_boxed_str()),
            u64::from(val),
        ));
    }
    v
}

#[test]
fn rust_abi_matches_the_installed_kfd_header() {
    assert!(
        std::path::Path::new(HEADER).exists(),
        "{HEADER} is missing: install linux-libc-dev (apt-get install linux-libc-dev)"
    );
    let dir = std::env::temp_dir().join(format!("kfd-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <linux/kfd_ioctl.h>\n\
         #include <sys/ioctl.h>\n#include <linux/fs.h>\n#include <linux/fiemap.h>\nint main(void) {\n",
    );
    let mut expected: HashMap<String, u64> = HashMap::new();
    for (cname, size, fields) in structs() {
        c += &format!("printf(\"size {cname} %zu\\n\", sizeof(struct {cname}));\n");
        expected.insert(format!("size {cname}"), size as u64);
        for (f, off) in fields.iter().filter(|(f, _)| !f.starts_with('_')) {
            let f = f.trim_start_matches("r#");
            c += &format!("printf(\"off {cname} {f} %zu\\n\", offsetof(struct {cname}, {f}));\n");
            expected.insert(format!("off {cname} {f}"), *off as u64);
        }
    }
    for (name, val) in constants() {
        // All these are 32-bit in the ABI; `1 << 31` is a negative int in C.
        c += &format!("printf(\"const {name} %u\\n\", (unsigned int)({name}));\n");
        expected.insert(format!("const {name}"), val);
    }
    c += "return 0;\n}\n";
    // A stand-in <drm/drm.h> for hosts without libdrm-dev (see the file).
    let fallback = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/c/fallback");
    let src = dir.join("kfd_header.c");
    let exe = dir.join("kfd_header");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-idirafter"])
        .arg(&fallback)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e} (install gcc)"));
    assert!(
        out.status.success(),
        "compiling against {HEADER} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .expect("running the header probe");
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    let mut seen = 0;
    let mut mismatches = Vec::new();
    for line in text.lines() {
        let (key, val) = line.rsplit_once(' ').unwrap();
        let val: u64 = val.parse().unwrap();
        let want = expected[key];
        seen += 1;
        if want != val {
            mismatches.push(format!("{key}: header {val:#x}, Rust {want:#x}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        mismatches.is_empty(),
        "ABI mismatches:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(
        seen,
        expected.len(),
        "the header probe printed too few lines"
    );
    // 42 structs plus create_queue: every struct of the 1.11 header.
    assert_eq!(structs().len(), 43);
}
