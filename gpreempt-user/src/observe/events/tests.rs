//! Record decoding against hand-built records (also used by the model's tests).
use super::source::check_fds_with;
use super::*;
use gpreempt_common::{
    kfd::{self, DbgTrapSuspendQueuesArgs},
    nv,
    record::{file_kind, kind, IoctlRecord, ProcessExitRecord, RecordHeader},
};

pub(crate) fn bytes_of<T: Plain>(v: &T) -> Vec<u8> {
    // SAFETY: T: Plain is a #[repr(C)] integer struct; reading its bytes is defined.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

fn put(dst: &mut [u8], b: &[u8]) -> u32 {
    dst[..b.len()].copy_from_slice(b);
    b.len() as u32
}

pub(crate) fn record(cmd: u32, ret: i64, args: &[u8], out: &[u8]) -> IoctlRecord {
    let mut r = IoctlRecord::default();
    r.hdr.kind = kind::IOCTL;
    r.hdr.pid = 100;
    r.hdr.tid = 101;
    r.hdr.ts_ns = 5_000;
    r.hdr.comm[..6].copy_from_slice(b"python");
    r.fd = 7;
    r.cmd = cmd;
    r.ret = ret;
    r.duration_ns = 1234;
    r.args[..args.len()].copy_from_slice(args);
    r.args_len = args.len() as u32;
    r.out[..out.len()].copy_from_slice(out);
    r.out_len = out.len() as u32;
    r
}

pub(crate) fn create_queue(ret: i64) -> IoctlEvent {
    let input = kfd::CreateQueueArgs {
        ring_base_address: 0x1000,
        gpu_id: 0xbeef,
        queue_type: kfd::queue_type::COMPUTE_AQL,
        queue_priority: 7,
        ring_size: 4096,
        ..Default::default()
    };
    let output = kfd::CreateQueueArgs {
        queue_id: 9,
        doorbell_offset: kfd::doorbell_mmap_offset(0xbeef, 0x48),
        ..input
    };
    let r = record(
        kfd::cmd::CREATE_QUEUE,
        ret,
        input.as_bytes(),
        output.as_bytes(),
    );
    match decode(&bytes_of(&r)).unwrap() {
        Event::Ioctl(i) => i,
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_successful_call_shows_the_kernels_outputs() {
    let ev = create_queue(0);
    assert_eq!(ev.name(), "create_queue");
    assert_eq!(ev.origin.pid, 100);
    assert_eq!(ev.origin.tid, 101);
    assert_eq!(ev.origin.comm, "python");
    assert_eq!(ev.fd, 7);
    assert_eq!(ev.duration_ns, 1234);
    assert!(!ev.verified);
    let KfdCall::CreateQueue { args, args_size } = ev.call else {
        panic!()
    };
    assert_eq!(args_size, 96);
    assert_eq!(args.queue_id, 9);
    assert_eq!(args.gpu_id, 0xbeef);
    assert_eq!(kfd::mmap_offset_gpu_id(args.doorbell_offset), 0xbeef);
}

#[test]
fn a_failed_call_shows_what_the_caller_passed() {
    let ev = create_queue(-22);
    let KfdCall::CreateQueue { args, .. } = ev.call else {
        panic!()
    };
    assert_eq!(args.queue_id, 0);
    assert_eq!(args.doorbell_offset, 0);
    assert_eq!(args.queue_priority, 7);
}

#[test]
fn short_argument_structs_read_as_zero_filled() {
    let input = kfd::CreateQueueArgs {
        sdma_engine_id: 3,
        queue_priority: 2,
        ..Default::default()
    };
    let b = input.as_bytes();
    let r = record(kfd::cmd::CREATE_QUEUE_V1, -25, &b[..88], &[]);
    let Event::Ioctl(ev) = decode(&bytes_of(&r)).unwrap() else {
        panic!()
    };
    let KfdCall::CreateQueue { args, args_size } = ev.call else {
        panic!()
    };
    assert_eq!(args_size, 88);
    assert_eq!(args.queue_priority, 2);
    assert_eq!(
        args.sdma_engine_id, 0,
        "bytes beyond the caller's struct are not read"
    );
}

#[test]
fn every_decoded_ioctl_maps_to_its_struct() {
    let dbg = kfd::DbgTrapArgs::new(
        55,
        DbgTrapSuspendQueuesArgs {
            exception_mask: 1,
            queue_array_ptr: 0x10,
            num_queues: 2,
            grace_period: 3,
        },
    );
    let mut buf = [0u8; 96];
    let n = put(&mut buf, dbg.as_bytes());
    let r = record(
        kfd::cmd::DBG_TRAP,
        2,
        &buf[..n as usize],
        &buf[..n as usize],
    );
    let Event::Ioctl(ev) = decode(&bytes_of(&r)).unwrap() else {
        panic!()
    };
    assert_eq!(ev.call, KfdCall::DbgTrap(dbg));
    for (cmd, check) in [
        (kfd::cmd::DESTROY_QUEUE, "DestroyQueue"),
        (kfd::cmd::UPDATE_QUEUE, "UpdateQueue"),
        (kfd::cmd::SET_CU_MASK, "SetCuMask"),
        (kfd::cmd::GET_QUEUE_WAVE_STATE, "GetQueueWaveState"),
        (kfd::cmd::ACQUIRE_VM, "AcquireVm"),
        (kfd::cmd::ALLOC_MEMORY_OF_GPU, "AllocMemoryOfGpu"),
        (kfd::cmd::FREE_MEMORY_OF_GPU, "FreeMemoryOfGpu"),
        (kfd::cmd::SMI_EVENTS, "SmiEvents"),
        (kfd::cmd::RUNTIME_ENABLE, "RuntimeEnable"),
        (kfd::cmd::GET_VERSION, "GetVersion"),
        (kfd::cmd::SVM, "Other"),
    ] {
        let r = record(cmd, 0, &[1; 8], &[1; 8]);
        let Event::Ioctl(ev) = decode(&bytes_of(&r)).unwrap() else {
            panic!()
        };
        assert!(
            format!("{:?}", ev.call).starts_with(check),
            "{cmd:#x}: {:?}",
            ev.call
        );
    }
    // No argument bytes at all (unreadable pointer): only the number is reported.
    let r = record(kfd::cmd::DESTROY_QUEUE, -14, &[], &[]);
    let Event::Ioctl(ev) = decode(&bytes_of(&r)).unwrap() else {
        panic!()
    };
    assert_eq!(ev.call, KfdCall::Other);
}

#[test]
fn malformed_records_are_errors_not_panics() {
    assert!(matches!(decode(&[0u8; 3]), Err(DecodeError::Short { .. })));
    let mut r = record(kfd::cmd::DESTROY_QUEUE, 0, &[], &[]);
    r.hdr.kind = 77;
    assert_eq!(decode(&bytes_of(&r)), Err(DecodeError::UnknownKind(77)));
    let r = record(kfd::cmd::DESTROY_QUEUE, 0, &[], &[]);
    let b = bytes_of(&r);
    assert!(matches!(
        decode(&b[..100]),
        Err(DecodeError::Short {
            kind: kind::IOCTL,
            ..
        })
    ));
    // Oversized lengths from a corrupt record are clamped.
    let mut r = record(kfd::cmd::DESTROY_QUEUE, 0, &[3, 0, 0, 0], &[4, 0, 0, 0]);
    r.out_len = 100_000;
    assert!(decode(&bytes_of(&r)).is_ok());
}

#[test]
fn process_exit_records() {
    let rec = ProcessExitRecord {
        hdr: RecordHeader {
            kind: kind::PROCESS_EXIT,
            pid: 42,
            tid: 42,
            ts_ns: 9,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
            ..Default::default()
        },
        rate_limited: 0,
    };
    let Event::ProcessExit(p) = decode(&bytes_of(&rec)).unwrap() else {
        panic!()
    };
    assert_eq!(
        (p.origin.pid, p.origin.comm.as_str(), p.origin.ts_ns),
        (42, "worker", 9)
    );
}

#[test]
fn fd_check_reads_proc_links_and_caches_them() {
    let root = std::env::temp_dir().join(format!("fdcheck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("10/fd")).unwrap();
    std::os::unix::fs::symlink("/dev/kfd", root.join("10/fd/3")).unwrap();
    std::os::unix::fs::symlink("/dev/null", root.join("10/fd/4")).unwrap();
    let mut c = FdCheck::with_proc("/dev/kfd", &root);
    assert_eq!(c.check(10, 3), FdVerdict::Device);
    assert_eq!(c.check(10, 4), FdVerdict::Other);
    assert_eq!(c.check(10, 5), FdVerdict::Unknown);
    assert_eq!(c.check(11, 3), FdVerdict::Unknown);
    assert_eq!(c.cached(), 1, "only devices are cached");
    // Cached: the verdict survives the process's /proc entry going away...
    std::fs::remove_dir_all(root.join("10")).unwrap();
    assert_eq!(c.check(10, 3), FdVerdict::Device);
    // ...until the process exit is seen.
    c.forget(10);
    assert_eq!(c.cached(), 0);
    assert_eq!(c.check(10, 3), FdVerdict::Unknown);
    let _ = std::fs::remove_dir_all(&root);
}

/// NVIDIA nodes are known by their device number wherever they are mounted (a GPU host here
/// had them at /usr/local/nvidia/dev); nvidia-modeset shares the major but is not RM.
#[test]
fn fd_check_knows_nvidia_nodes_by_device_number() {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let root = std::env::temp_dir().join(format!("fdcheck-nv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dev = root.join("usr/local/nvidia/dev");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::create_dir_all(root.join("20/fd")).unwrap();
    for (name, minor) in [("nvidiactl", 255), ("nvidia0", 0), ("nvidia-modeset", 254)] {
        mknod(
            &dev.join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(195, minor),
        )
        .expect("mknod (the unit tests run as root)");
    }
    std::os::unix::fs::symlink(dev.join("nvidiactl"), root.join("20/fd/8")).unwrap();
    std::os::unix::fs::symlink(dev.join("nvidia0"), root.join("20/fd/9")).unwrap();
    std::os::unix::fs::symlink(dev.join("nvidia-modeset"), root.join("20/fd/10")).unwrap();
    std::os::unix::fs::symlink("/dev/null", root.join("20/fd/11")).unwrap();
    let mut c = FdCheck::with_proc("/dev/kfd", &root);
    assert_eq!(c.check_nv(20, 8), FdVerdict::Device);
    assert_eq!(c.check_nv(20, 9), FdVerdict::Device);
    assert_eq!(c.check_nv(20, 10), FdVerdict::Other);
    assert_eq!(c.check_nv(20, 11), FdVerdict::Other);
    // An NVIDIA node is not the KFD device.
    assert_eq!(c.check(20, 8), FdVerdict::Other);
    let _ = std::fs::remove_dir_all(&root);
}

/// A number judged "another file" is judged again next time: the fd may be reused (seen on
/// an H100: libcuda's fd 8 was /proc/driver/nvidia/params when its first escapes were
/// checked, and nvidiactl, holding the process's main RM client, from then on).
#[test]
fn fd_check_rejudges_a_number_that_was_another_file() {
    let root = std::env::temp_dir().join(format!("fdcheck-reuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("30/fd")).unwrap();
    let fd8 = root.join("30/fd/8");
    std::os::unix::fs::symlink("/proc/driver/nvidia/params", &fd8).unwrap();
    let mut c = FdCheck::with_proc("/dev/kfd", &root);
    assert_eq!(c.check_nv(30, 8), FdVerdict::Other);
    std::fs::remove_file(&fd8).unwrap();
    std::os::unix::fs::symlink("/dev/nvidiactl", &fd8).unwrap();
    assert_eq!(c.check_nv(30, 8), FdVerdict::Device);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn records_matched_by_file_decode_by_the_file_whatever_the_type_byte() {
    let input = kfd::DestroyQueueArgs {
        queue_id: 4,
        ..Default::default()
    };
    // 'X' instead of 'K': amdkfd dispatches by nr, so the kernel's file match decides.
    let x = (kfd::cmd::DESTROY_QUEUE & !0xff00) | u32::from(b'X') << 8;
    let mut r = record(x, 0, input.as_bytes(), &[]);
    r.hdr.file_kind = file_kind::KFD;
    match decode(&bytes_of(&r)).unwrap() {
        Event::Ioctl(i) => {
            assert_eq!(i.name(), "destroy_queue");
            assert!(i.verified, "the kernel saw the file: no /proc check needed");
        }
        e => panic!("{e:?}"),
    }
    // An RM nr on an NVIDIA file is an RM escape even when typed 'K'.
    let mut r = record(kfd::iowr(nv::nr::RM_FREE, 16), 0, &[0; 16], &[]);
    r.hdr.file_kind = file_kind::NVIDIA;
    assert!(matches!(decode(&bytes_of(&r)).unwrap(), Event::Nv(n) if n.verified));
    // Unchecked (no file lookup in the kernel): by type byte, verified later in /proc.
    let mut r = record(kfd::cmd::DESTROY_QUEUE, 0, input.as_bytes(), &[]);
    r.hdr.file_kind = file_kind::UNCHECKED;
    assert!(matches!(decode(&bytes_of(&r)).unwrap(), Event::Ioctl(i) if !i.verified));
}

#[test]
fn kernel_matched_records_skip_the_proc_check() {
    let mut r = record(kfd::cmd::GET_VERSION, 0, &[0; 8], &[0; 8]);
    r.hdr.file_kind = file_kind::KFD;
    r.hdr.pid = u32::MAX - 1; // no such process: a /proc check would say Unknown
    let mut out = vec![decode(&bytes_of(&r)).unwrap()];
    let mut fds = FdCheck::with_proc("/dev/kfd", "/nonexistent");
    let mut stats = UserStats::default();
    check_fds_with(&mut fds, &mut stats, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(
        stats,
        UserStats::default(),
        "nothing looked up, nothing unverified"
    );
}
