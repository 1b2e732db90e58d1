//! The KFD facts checked against the numbers upstream defines (the header test in
//! `tests/kfd_header.rs` checks what linux-libc-dev has).
use super::*;

#[test]
fn cmd_values_match_reference() {
    assert_eq!(cmd::GET_VERSION, 0x8008_4B01);
    assert_eq!(cmd::CREATE_QUEUE_V1, 0xC058_4B02);
    assert_eq!(cmd::CREATE_QUEUE, 0xC060_4B02);
    assert_eq!(cmd::DESTROY_QUEUE, 0xC008_4B03);
    assert_eq!(cmd::SET_MEMORY_POLICY, 0x4020_4B04);
    assert_eq!(cmd::GET_PROCESS_APERTURES, 0x8190_4B06);
    assert_eq!(cmd::UPDATE_QUEUE, 0x4018_4B07);
    assert_eq!(cmd::ACQUIRE_VM, 0x4008_4B15);
    assert_eq!(cmd::ALLOC_MEMORY_OF_GPU, 0xC028_4B16);
    assert_eq!(cmd::FREE_MEMORY_OF_GPU, 0x4008_4B17);
    assert_eq!(cmd::SET_CU_MASK, 0x4010_4B1A);
    assert_eq!(cmd::GET_QUEUE_WAVE_STATE, 0xC018_4B1B);
    assert_eq!(cmd::SMI_EVENTS, 0xC008_4B1F);
    assert_eq!(cmd::CRIU_OP, 0xC038_4B22);
    assert_eq!(cmd::RUNTIME_ENABLE, 0xC010_4B25);
    assert_eq!(cmd::DBG_TRAP, 0xC020_4B26);
    assert_eq!(cmd::CREATE_PROCESS, 0x0000_4B27);
}

#[test]
fn decoding_the_encoding() {
    let c = cmd::CREATE_QUEUE;
    assert_eq!(ioc_nr(c), nr::CREATE_QUEUE);
    assert_eq!(ioc_type(c), b'K' as u32);
    assert_eq!(ioc_size(c), 96);
    assert_eq!(ioc_dir(c), IOC_READ | IOC_WRITE);
    assert_eq!(ioc_dir(cmd::UPDATE_QUEUE), IOC_WRITE);
    assert_eq!(ioc_dir(cmd::GET_VERSION), IOC_READ);
}

#[test]
fn table_sizes_and_directions_agree_with_cmds() {
    for (c, n) in [
        (cmd::GET_VERSION, nr::GET_VERSION),
        (cmd::CREATE_QUEUE, nr::CREATE_QUEUE),
        (cmd::DESTROY_QUEUE, nr::DESTROY_QUEUE),
        (cmd::UPDATE_QUEUE, nr::UPDATE_QUEUE),
        (cmd::SET_CU_MASK, nr::SET_CU_MASK),
        (cmd::ACQUIRE_VM, nr::ACQUIRE_VM),
        (cmd::RUNTIME_ENABLE, nr::RUNTIME_ENABLE),
        (cmd::DBG_TRAP, nr::DBG_TRAP),
        (cmd::SVM, nr::SVM),
    ] {
        let d = ioctl(n).unwrap();
        assert_eq!(ioc_size(c), d.size, "{}", d.name);
        assert_eq!(ioc_dir(c), d.dir, "{}", d.name);
        assert_eq!(arg_size(n), d.size);
    }
    // Every table entry is in range, unique, and ARG_SIZE mirrors it.
    for (i, d) in IOCTLS.iter().enumerate() {
        assert!(is_kfd_nr(d.nr), "{}", d.name);
        assert_eq!(arg_size(d.nr), d.size);
        assert!(
            IOCTLS[..i].iter().all(|e| e.nr != d.nr),
            "duplicate nr {:#x}",
            d.nr
        );
    }
    assert_eq!(arg_size(0x50), 0);
    assert_eq!(arg_size(0xFFFF), 0);
    // Every nr of the upstream range 0x01..=0x28 and the DKMS 0x80..=0x86 has a name.
    for n in (0x01..0x29).chain(0x80..0x87) {
        assert!(ioctl_name(n).is_some(), "nr {n:#x} unnamed");
    }
}

#[test]
fn kfd_nr_range_boundaries() {
    assert!(!is_kfd_nr(0x00));
    assert!(is_kfd_nr(0x01));
    assert!(is_kfd_nr(0x28));
    assert!(!is_kfd_nr(0x29));
    assert!(!is_kfd_nr(0x7F));
    assert!(is_kfd_nr(0x80));
    assert!(is_kfd_nr(0x86));
    assert!(!is_kfd_nr(0x87));
}

#[test]
fn names() {
    assert_eq!(ioctl_name(nr::CREATE_QUEUE), Some("create_queue"));
    assert_eq!(ioctl_name(nr::DBG_TRAP), Some("dbg_trap"));
    assert_eq!(
        ioctl_name(nr::DBG_TRAP_DEPRECATED),
        Some("dbg_trap_deprecated")
    );
    assert_eq!(ioctl_name(0x50), None);
    assert_eq!(dbg_op_name(dbg_op::SUSPEND_QUEUES), Some("suspend_queues"));
    assert_eq!(
        dbg_op_name(dbg_op::GET_DEVICE_SNAPSHOT),
        Some("get_device_snapshot")
    );
    assert_eq!(dbg_op_name(15), None);
    assert_eq!(
        queue_type_name(queue_type::COMPUTE_AQL),
        Some("compute_aql")
    );
    assert_eq!(queue_type_name(9), None);
}

#[test]
fn exception_masks() {
    assert_eq!(ec_mask(ec::QUEUE_NEW), 0x4000_0000);
    assert_eq!(ec_mask(ec::DEVICE_QUEUE_DELETE), 0x8000_0000);
    assert_eq!(ec_mask(ec::PROCESS_RUNTIME), 0x0000_8000_0000_0000);
    assert_eq!(ec_mask(ec::DEVICE_NEW), 0x8_0000_0000);
    assert_eq!(EC_MASK_QUEUE, 0x0000_0000_607F_803F);
    assert_eq!(EC_MASK_DEVICE, 0x0000_000F_8000_0000);
    assert_eq!(EC_MASK_PROCESS, 0x0001_8000_0000_0000);
    assert_eq!(KFD_DBG_QUEUE_ERROR_MASK, 0x4000_0000);
    assert_eq!(KFD_DBG_QUEUE_INVALID_MASK, 0x8000_0000);
}

#[test]
fn doorbell_offsets() {
    let off = doorbell_mmap_offset(0x1234, 0x18);
    assert_eq!(off >> 62, 3);
    assert_eq!(mmap_offset_gpu_id(off), 0x1234);
    assert_eq!(off & 0xFFF, 0x18);
}

fn raw<P: DbgTrapPayload + Copy + PartialEq + core::fmt::Debug>(p: P) -> [u8; 24] {
    let a = DbgTrapArgs::new(77, p);
    assert_eq!(a.op, P::OP);
    assert_eq!(a.payload::<P>(), p, "round trip");
    let mut b = [0u8; 24];
    for (i, w) in a.data.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// The packed union's fields at (offset, length) pairs, offsets as kfd.md gives them
/// (relative to the union).
fn at(b: &[u8; 24], layout: &[(usize, usize)]) -> std::vec::Vec<u64> {
    layout
        .iter()
        .map(|&(off, len)| {
            let mut v = [0u8; 8];
            v[..len].copy_from_slice(&b[off..off + len]);
            u64::from_le_bytes(v)
        })
        .collect()
}

#[test]
fn dbg_payload_layouts() {
    let b = raw(DbgTrapEnableArgs {
        exception_mask: 1,
        rinfo_ptr: 2,
        rinfo_size: 3,
        dbg_fd: 4,
    });
    assert_eq!(at(&b, &[(0, 8), (8, 8), (16, 4), (20, 4)]), [1, 2, 3, 4]);
    let b = raw(DbgTrapSuspendQueuesArgs {
        exception_mask: 5,
        queue_array_ptr: 6,
        num_queues: 7,
        grace_period: 8,
    });
    assert_eq!(at(&b, &[(0, 8), (8, 8), (16, 4), (20, 4)]), [5, 6, 7, 8]);
    let b = raw(DbgTrapResumeQueuesArgs {
        queue_array_ptr: 9,
        num_queues: 10,
        pad: 0,
    });
    assert_eq!(at(&b, &[(0, 8), (8, 4)]), [9, 10]);
    let b = raw(DbgTrapQueryDebugEventArgs {
        exception_mask: 11,
        gpu_id: 12,
        queue_id: 13,
    });
    assert_eq!(at(&b, &[(0, 8), (8, 4), (12, 4)]), [11, 12, 13]);
    let b = raw(DbgTrapQueueSnapshotArgs {
        exception_mask: 14,
        snapshot_buf_ptr: 15,
        num_queues: 16,
        entry_size: 17,
    });
    assert_eq!(
        at(&b, &[(0, 8), (8, 8), (16, 4), (20, 4)]),
        [14, 15, 16, 17]
    );
    let b = raw(DbgTrapDeviceSnapshotArgs {
        exception_mask: 18,
        snapshot_buf_ptr: 19,
        num_devices: 20,
        entry_size: 21,
    });
    assert_eq!(
        at(&b, &[(0, 8), (8, 8), (16, 4), (20, 4)]),
        [18, 19, 20, 21]
    );
    let b = raw(DbgTrapSendRuntimeEventArgs {
        exception_mask: 22,
        gpu_id: 23,
        queue_id: 24,
    });
    assert_eq!(at(&b, &[(0, 8), (8, 4), (12, 4)]), [22, 23, 24]);
    let b = raw(DbgTrapSetExceptionsEnabledArgs { exception_mask: 25 });
    assert_eq!(at(&b, &[(0, 8)]), [25]);
    let b = raw(DbgTrapSetWaveLaunchOverrideArgs {
        override_mode: 26,
        enable_mask: 27,
        support_request_mask: 28,
        pad: 0,
    });
    assert_eq!(at(&b, &[(0, 4), (4, 4), (8, 4)]), [26, 27, 28]);
    let b = raw(DbgTrapSetWaveLaunchModeArgs {
        launch_mode: 29,
        pad: 0,
    });
    assert_eq!(at(&b, &[(0, 4)]), [29]);
    let b = raw(DbgTrapSetNodeAddressWatchArgs {
        address: 30,
        mode: 31,
        mask: 32,
        gpu_id: 33,
        id: 34,
    });
    assert_eq!(
        at(&b, &[(0, 8), (8, 4), (12, 4), (16, 4), (20, 4)]),
        [30, 31, 32, 33, 34]
    );
    let b = raw(DbgTrapClearNodeAddressWatchArgs { gpu_id: 35, id: 36 });
    assert_eq!(at(&b, &[(0, 4), (4, 4)]), [35, 36]);
    let b = raw(DbgTrapSetFlagsArgs { flags: 37, pad: 0 });
    assert_eq!(at(&b, &[(0, 4)]), [37]);
    let b = raw(DbgTrapQueryExceptionInfoArgs {
        info_ptr: 38,
        info_size: 39,
        source_id: 40,
        exception_code: 41,
        clear_exception: 42,
    });
    assert_eq!(
        at(&b, &[(0, 8), (8, 4), (12, 4), (16, 4), (20, 4)]),
        [38, 39, 40, 41, 42]
    );
    // Payload struct offsets match their packing (struct layout == union layout).
    assert_eq!(
        DbgTrapEnableArgs::FIELDS,
        &[
            ("exception_mask", 0),
            ("rinfo_ptr", 8),
            ("rinfo_size", 16),
            ("dbg_fd", 20)
        ]
    );
}

#[test]
fn create_queue_v1_is_a_prefix() {
    assert_eq!(
        core::mem::offset_of!(CreateQueueArgs, sdma_engine_id),
        CREATE_QUEUE_ARGS_SIZE_V1
    );
}
