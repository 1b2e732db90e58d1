//! mmap offsets of the emulated devices.
//!
//! *Emulator convention, not upstream:* amdkfd encodes an mmap type in bits 62-63 of the offsets it
//! hands out (`KFD_MMAP_TYPE_DOORBELL` 3 << 62, `EVENTS` 2 << 62) and the gpu_id in bits 46-61.
//! A FUSE-served `/dev/kfd` is a regular file, and the kernel refuses an mmap of a regular file
//! whose offset passes `MAX_LFS_FILESIZE` (2^63 - 1) with EOVERFLOW (`file_mmap_ok` in mm/mmap.c),
//! so the emulator moves the type to bits 60-61 and the gpu_id to bits 44-59, and puts the
//! process's doorbell slice in bits 32-43 (all processes map one backing file, where the kernel
//! maps each process's own doorbell page). The low 32 bits are upstream's: the byte offset inside
//! the page, which the thunk splits off (`hsaKmtCreateQueue`). `trace` prints the offsets the
//! emulator returns.
//!
//! Render-node buffer objects get offsets from 4 GiB up, as DRM's mmap offset manager
//! (`DRM_FILE_PAGE_OFFSET_START`) gives them.

pub const TYPE_MMIO: u64 = 0;
pub const TYPE_EVENTS: u64 = 2;
pub const TYPE_DOORBELL: u64 = 3;
const TYPE_SHIFT: u32 = 60;
const GPU_SHIFT: u32 = 44;
const SLICE_SHIFT: u32 = 32;
/// Doorbell slices that fit bits 32-43.
pub const SLICES: u32 = 1 << (GPU_SHIFT - SLICE_SHIFT);

/// An offset into `/dev/kfd`.
pub const fn kfd_offset(kind: u64, gpu_id: u32, slice: u32, low: u32) -> u64 {
    (kind << TYPE_SHIFT)
        | ((gpu_id as u64 & 0xffff) << GPU_SHIFT)
        | (((slice % SLICES) as u64) << SLICE_SHIFT)
        | low as u64
}

/// The first buffer-object offset of a render node.
pub const BO_BASE: u64 = 1 << 32;

/// The size the backing files of the FUSE passthrough must have: every offset above is below it.
pub const BACKING_SIZE: u64 = 1 << 62;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_below_max_lfs_filesize_and_keep_the_page_offset() {
        let o = kfd_offset(TYPE_DOORBELL, 0xffff, SLICES - 1, 0x1ff8);
        assert!(o + 8192 < BACKING_SIZE && BACKING_SIZE <= i64::MAX as u64);
        // The thunk's first doorbell map: offset & !0xffff_ffff, in-page offset & 0xffff_ffff.
        assert_eq!(o & 0xffff_ffff, 0x1ff8);
        assert_eq!(
            kfd_offset(TYPE_DOORBELL, 1, SLICES + 3, 0),
            kfd_offset(TYPE_DOORBELL, 1, 3, 0)
        );
        assert_ne!(
            kfd_offset(TYPE_EVENTS, 0, 0, 0),
            kfd_offset(TYPE_MMIO, 0, 0, 0)
        );
    }
}
