//! NVIDIA resource-manager (RM) ioctl ABI facts, x86-64 (docs/nvidia-rm.md; NVIDIA
//! open-gpu-kernel-modules tag 580.142: nv-ioctl-numbers.h, nv_escape.h, nvos.h, ctrl2080fifo.h).
//!
//! The driver dispatches on `_IOC_NR` and copies `_IOC_SIZE` bytes; libcuda issues
//! `_IOWR('F', nr, sizeof(params))`. RM_ALLOC has two parameter layouts, told apart by size.

/// The RM control device: its presence makes a host an NVIDIA host.
pub const NVIDIACTL: &str = "/dev/nvidiactl";

/// Character-device major of /dev/nvidiactl (minor 255) and /dev/nvidiaN (minor N), wherever a
/// container or runtime mounts them (nv-linux.h NV_MAJOR_DEVICE_NUMBER).
pub const NV_MAJOR_DEVICE_NUMBER: u32 = 195;
/// /dev/nvidia-modeset shares the major: another ABI, not RM escapes.
pub const NV_MODESET_MINOR: u32 = 254;

/// ioctl type (magic) of /dev/nvidiactl and /dev/nvidiaN.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

/// RM escapes (`_IOC_NR`).
pub mod nr {
    pub const RM_FREE: u32 = 0x29;
    pub const RM_CONTROL: u32 = 0x2A;
    pub const RM_ALLOC: u32 = 0x2B;
}

/// Whether `nr` is an RM escape the observer decodes.
pub const fn is_rm_nr(nr: u32) -> bool {
    matches!(nr, nr::RM_FREE | nr::RM_CONTROL | nr::RM_ALLOC)
}

/// Largest parameter struct of each escape (NVOS00 16, NVOS54 32, NVOS64 48 bytes): the copy cap.
pub const fn arg_size(nr: u32) -> u32 {
    match nr {
        nr::RM_FREE => 16,
        nr::RM_CONTROL => 32,
        nr::RM_ALLOC => 48,
        _ => 0,
    }
}

/// Offset in `IoctlRecord::out` where the programs put the head of an RM_ALLOC's class-specific
/// parameters (`*pAllocParms`) or an RM_CONTROL's (`*params`), read at exit, after the re-read
/// NVOS21/NVOS64/NVOS54 struct.
pub const PARAMS_HEAD_AT: usize = 48;
/// Bytes of an RM_CONTROL's parameters copied (enough for the controls the trace decodes), at most
/// paramsSize (32, 8 or 4).
pub const PARAMS_HEAD_LEN: usize = 32;
/// Bytes of an RM_ALLOC's parameters copied: a channel's up to its first USERD offset
/// ([`channel`]); a TSG's engineType at 12 is well inside. Where that many cannot be read (the
/// struct ends at the end of a mapping) the programs fall back to [`PARAMS_HEAD_LEN`].
pub const ALLOC_HEAD_LEN: usize = 72;
const _: () = assert!(PARAMS_HEAD_AT + ALLOC_HEAD_LEN <= crate::record::ARGS_MAX);
const _: () = assert!(PARAMS_HEAD_LEN <= ALLOC_HEAD_LEN);

/// `NV_CHANNEL_ALLOC_PARAMS` (alloc params of every `*_CHANNEL_GPFIFO_*` class, 368 bytes;
/// alloc/alloc_channel.h): where the channel's GPFIFO ring and its USERD (the control page whose
/// GP_GET / GP_PUT say how far the GPU and the client are) live. `NV_MAX_SUBDEVICES` is 8.
pub mod channel {
    /// hObjectBuffer: the memory object of the ring (documented "no longer used"; libcuda 13
    /// fills it with the ring's memory, the same object as hUserdMemory[0]).
    pub const H_OBJECT_BUFFER: usize = 4;
    /// gpFifoOffset (u64): the ring's GPU virtual address.
    pub const GPFIFO_OFFSET: usize = 8;
    /// gpFifoEntries (u32): ring entries (8 bytes each); GP_GET / GP_PUT are indices modulo it.
    pub const GPFIFO_ENTRIES: usize = 16;
    /// hUserdMemory[0]: the memory object that holds the USERD (0: the RM's own USERD pool).
    pub const H_USERD_MEMORY: usize = 32;
    /// userdOffset[0] (u64): the USERD's offset inside that memory object.
    pub const USERD_OFFSET: usize = 64;
}

/// USERD of a Volta+ GPFIFO channel (clc86f.h `Nvc86fControl`, dev_ram.h NV_RAMUSERD): 512 bytes.
pub mod userd {
    /// GPGet: the next entry the GPU's host will fetch (written back by the GPU).
    pub const GP_GET: usize = 0x88;
    /// GPPut: one past the last entry the client submitted.
    pub const GP_PUT: usize = 0x8c;
    pub const SIZE: usize = 512;
}

/// NVOS21 (RM_ALLOC, 32 bytes) and NVOS64 (48 bytes, libcuda 13) field offsets.
pub mod alloc {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
    pub const P_ALLOC_PARMS: usize = 16;
    /// NVOS21 only.
    pub const NVOS21_PARAMS_SIZE: usize = 24;
    pub const NVOS21_STATUS: usize = 28;
    pub const NVOS21_SIZE: u32 = 32;
    /// NVOS64 only.
    pub const NVOS64_P_RIGHTS_REQUESTED: usize = 24;
    pub const NVOS64_PARAMS_SIZE: usize = 32;
    pub const NVOS64_FLAGS: usize = 36;
    pub const NVOS64_STATUS: usize = 40;
    pub const NVOS64_SIZE: u32 = 48;
}

/// NVOS00 (RM_FREE, 16 bytes).
pub mod free {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_OLD: usize = 8;
    pub const STATUS: usize = 12;
    pub const SIZE: u32 = 16;
}

/// NVOS54 (RM_CONTROL, 32 bytes).
pub mod control {
    pub const H_CLIENT: usize = 0;
    pub const H_OBJECT: usize = 4;
    pub const CMD: usize = 8;
    pub const FLAGS: usize = 12;
    pub const PARAMS: usize = 16;
    pub const PARAMS_SIZE: usize = 24;
    pub const STATUS: usize = 28;
    pub const SIZE: u32 = 32;
}

/// Classes (`hClass`) the observer names.
pub mod class {
    /// NV01_ROOT (a client); also NV01_ROOT_NON_PRIV 0x1 and NV01_ROOT_CLIENT 0x41.
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    /// KEPLER_CHANNEL_GROUP_A: a TSG; alloc params engineType at 12.
    pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xA06C;
    /// GPFIFO channel classes by architecture (parent: a TSG).
    pub const AMPERE_CHANNEL_GPFIFO_A: u32 = 0xC56F;
    pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xC86F;
    pub const BLACKWELL_CHANNEL_GPFIFO_A: u32 = 0xC96F;
    pub const BLACKWELL_CHANNEL_GPFIFO_B: u32 = 0xCA6F;
    pub const AMPERE_COMPUTE_A: u32 = 0xC6C0;
    pub const HOPPER_COMPUTE_A: u32 = 0xCBC0;
    pub const HOPPER_DMA_COPY_A: u32 = 0xC8B5;

    /// A client (root) object.
    pub const fn is_client(c: u32) -> bool {
        matches!(c, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
    }

    /// A GPFIFO channel (`*_CHANNEL_GPFIFO_*`: low byte 0x6F, Kepler and later).
    pub const fn is_channel(c: u32) -> bool {
        c & 0xff == 0x6f && c >= 0xA06F && c <= 0xFF6F
    }

    /// A compute engine object (`*_COMPUTE_*`: low byte 0xC0, Kepler and later), made under a
    /// channel of a graphics/compute TSG.
    pub const fn is_compute(c: u32) -> bool {
        c & 0xff == 0xc0 && c >= 0xA0C0 && c <= 0xFFC0
    }

    /// The driver's name of a class, when the observer knows it.
    pub fn name(c: u32) -> Option<&'static str> {
        Some(match c {
            NV01_ROOT => "NV01_ROOT",
            NV01_ROOT_NON_PRIV => "NV01_ROOT_NON_PRIV",
            NV01_ROOT_CLIENT => "NV01_ROOT_CLIENT",
            NV01_DEVICE_0 => "NV01_DEVICE_0",
            NV20_SUBDEVICE_0 => "NV20_SUBDEVICE_0",
            KEPLER_CHANNEL_GROUP_A => "KEPLER_CHANNEL_GROUP_A",
            AMPERE_CHANNEL_GPFIFO_A => "AMPERE_CHANNEL_GPFIFO_A",
            HOPPER_CHANNEL_GPFIFO_A => "HOPPER_CHANNEL_GPFIFO_A",
            BLACKWELL_CHANNEL_GPFIFO_A => "BLACKWELL_CHANNEL_GPFIFO_A",
            BLACKWELL_CHANNEL_GPFIFO_B => "BLACKWELL_CHANNEL_GPFIFO_B",
            AMPERE_COMPUTE_A => "AMPERE_COMPUTE_A",
            HOPPER_COMPUTE_A => "HOPPER_COMPUTE_A",
            HOPPER_DMA_COPY_A => "HOPPER_DMA_COPY_A",
            _ => return None,
        })
    }
}

/// NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (TSG alloc params): `engineType` at 12.
pub const TSG_ENGINE_TYPE_AT: usize = 12;
/// NV2080_ENGINE_TYPE_GRAPHICS (graphics/compute); copy engines are 0xb and up.
pub const ENGINE_TYPE_GRAPHICS: u32 = 1;

/// `NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS` on a subdevice (GSP-RM drivers only).
pub const CTRL_FIFO_DISABLE_CHANNELS: u32 = 0x2080_110b;
/// Its parameters (536 bytes).
pub mod disable_channels {
    pub const B_DISABLE: usize = 0;
    pub const NUM_CHANNELS: usize = 4;
    pub const B_ONLY_DISABLE_SCHEDULING: usize = 8;
    pub const B_REWIND_GP_PUT: usize = 9;
    /// Must be 0.
    pub const P_RUNLIST_PREEMPT_EVENT: usize = 16;
    pub const H_CLIENT_LIST: usize = 24;
    pub const H_CHANNEL_LIST: usize = 280;
    /// Pairs per call.
    pub const MAX_CHANNELS: usize = 64;
    pub const SIZE: usize = 536;
}

/// `NVA06C_CTRL_CMD_SET_TIMESLICE` on a TSG (class A06C): how long it may run before the
/// scheduler switches to another runnable TSG of its runlist. NON_PRIVILEGED in RM; the call
/// goes to GSP.
pub const CTRL_TSG_SET_TIMESLICE: u32 = 0xa06c_0103;
/// `NVA06C_CTRL_CMD_GET_TIMESLICE`: the same parameters, filled in.
pub const CTRL_TSG_GET_TIMESLICE: u32 = 0xa06c_0104;
/// `NVA06C_CTRL_TIMESLICE_PARAMS`: `{ NvU64 timesliceUs; }`.
pub const TIMESLICE_PARAMS_SIZE: usize = 8;
/// `NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL`: `{ NvU32 tsgInterleaveLevel; }` (0 LOW, 1 MEDIUM,
/// 2 HIGH); needs CAP_SYS_NICE or an administrator.
pub const CTRL_TSG_SET_INTERLEAVE_LEVEL: u32 = 0xa06c_0107;

/// `NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO` on a client (class 0x41): the parent or the
/// external class of one of the client's objects (`cliresCtrlCmdClientGetHandleInfo_IMPL` in
/// src/nvidia/src/kernel/rmapi/client_resource.c). Through a duplicate of the process's own fd it
/// proves that a handle a journal remembers is still that object.
pub const CTRL_CLIENT_GET_HANDLE_INFO: u32 = 0x0d02;
/// `NV0000_CTRL_CLIENT_GET_HANDLE_INFO_PARAMS`: `{ NvHandle hObject; NvU32 index; union {
/// NvHandle hResult; NvU64 iResult; } data; }` (the union 8-aligned).
pub mod handle_info {
    pub const H_OBJECT: usize = 0;
    pub const INDEX: usize = 4;
    pub const DATA: usize = 8;
    pub const SIZE: usize = 16;
    pub const INDEX_PARENT: u32 = 1;
    pub const INDEX_CLASSID: u32 = 2;
}

/// RM client handles: `RS_CLIENT_HANDLE_BASE` + an index below `RS_CLIENT_HANDLE_MAX`, given out
/// in increasing order (wrapping) by `_serverCreateEntryAndLockForNewClient`
/// (src/nvidia/src/libraries/resserv/src/rs_server.c; constants in g_resserv_nvoc.h).
pub const CLIENT_HANDLE_BASE: u32 = 0xC1D0_0000;
pub const CLIENT_HANDLE_MAX: u32 = 0x10_0000;
/// `NV2080_CTRL_CMD_GPU_GET_ID` on a subdevice: `{ NvU32 gpuId; }`.
pub const CTRL_GPU_GET_ID: u32 = 0x2080_0142;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` on a client: `{ gpuId; gpuFlags; deviceInstance;
/// subDeviceInstance; ... }` (32 bytes): the device instance is a device's alloc `deviceId`.
pub const CTRL_GPU_GET_ID_INFO_V2: u32 = 0x0205;
pub const ID_INFO_V2_SIZE: usize = 32;
pub const ID_INFO_V2_DEVICE_INSTANCE: usize = 8;
/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS` on a client: `{ NvU32 gpuIds[32]; }`, the list ended
/// by `NV0000_CTRL_GPU_INVALID_ID` (src/common/sdk/nvidia/inc/ctrl/ctrl0000/ctrl0000gpu.h).
pub const CTRL_GPU_GET_ATTACHED_IDS: u32 = 0x0201;
pub const ATTACHED_IDS_SIZE: usize = 32 * 4;
pub const GPU_INVALID_ID: u32 = 0xffff_ffff;

/// NV_STATUS values the tool explains.
pub mod status {
    pub const OK: u32 = 0;
    pub const INSUFFICIENT_PERMISSIONS: u32 = 0x1B;
    pub const INVALID_CHANNEL: u32 = 0x21;
    pub const INVALID_CLIENT: u32 = 0x23;
    pub const INVALID_OBJECT_HANDLE: u32 = 0x33;
    pub const NOT_SUPPORTED: u32 = 0x56;
    pub const OBJECT_NOT_FOUND: u32 = 0x57;

    pub fn name(s: u32) -> &'static str {
        match s {
            OK => "NV_OK",
            INSUFFICIENT_PERMISSIONS => "NV_ERR_INSUFFICIENT_PERMISSIONS",
            INVALID_CHANNEL => "NV_ERR_INVALID_CHANNEL",
            INVALID_CLIENT => "NV_ERR_INVALID_CLIENT",
            INVALID_OBJECT_HANDLE => "NV_ERR_INVALID_OBJECT_HANDLE",
            NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
            OBJECT_NOT_FOUND => "NV_ERR_OBJECT_NOT_FOUND",
            _ => "NV_ERR_(other)",
        }
    }
}

/// `_IOWR('F', nr, size)`.
pub const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | ((size & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | (nr & 0xff)
}

/// Little-endian u32 at `at` (0 past the end).
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

/// Little-endian u64 at `at` (0 past the end).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    match b.get(at..at + 8) {
        Some(s) => u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_match_what_libcuda_issues() {
        // RM_CONTROL as seen from libcuda 13 (docs/nvidia-rm.md).
        assert_eq!(iowr(nr::RM_CONTROL, control::SIZE), 0xC020_462A);
        assert_eq!(iowr(nr::RM_ALLOC, alloc::NVOS64_SIZE), 0xC030_462B);
        assert_eq!(iowr(nr::RM_FREE, free::SIZE), 0xC010_4629);
        assert!(is_rm_nr(0x2A) && !is_rm_nr(0x2C));
    }

    #[test]
    fn layouts_are_consistent() {
        assert_eq!(
            disable_channels::H_CHANNEL_LIST,
            disable_channels::H_CLIENT_LIST + 4 * 64
        );
        assert_eq!(
            disable_channels::SIZE,
            disable_channels::H_CHANNEL_LIST + 4 * 64
        );
        assert_eq!(PARAMS_HEAD_AT as u32, alloc::NVOS64_SIZE);
        // hUserdMemory[8] (u32) then userdOffset[8] (u64), and the head ends after the first.
        assert_eq!(channel::USERD_OFFSET, channel::H_USERD_MEMORY + 4 * 8);
        assert_eq!(ALLOC_HEAD_LEN, channel::USERD_OFFSET + 8);
        assert_eq!(userd::GP_PUT, userd::GP_GET + 4);
        assert!(class::is_channel(class::HOPPER_CHANNEL_GPFIFO_A));
        assert!(!class::is_channel(class::KEPLER_CHANNEL_GROUP_A));
        assert!(class::is_client(0) && class::is_client(0x41));
        assert_eq!(u32_at(&[1, 0, 0, 0, 2], 0), 1);
        assert_eq!(u32_at(&[1, 0], 0), 0);
    }
}
