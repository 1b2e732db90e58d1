//! ioctl commands the VFS answers itself, before any driver (fs/ioctl.c: `do_vfs_ioctl` for
//! every file, `file_ioctl` for regular files). A driver that dispatches by nr alone (amdkfd)
//! never sees them, although their nr may be one of its own: FIONBIO carries nr 0x21, FIONREAD
//! 0x1b. The ioctl programs skip them so that they are not decoded as driver calls.

/// Answered by the VFS on every file (`do_vfs_ioctl`).
pub const ALL_FILES: [u32; 14] = [
    0x5451,      // FIOCLEX
    0x5450,      // FIONCLEX
    0x5421,      // FIONBIO
    0x5452,      // FIOASYNC
    0x5460,      // FIOQSIZE
    0xc004_5877, // FIFREEZE
    0xc004_5878, // FITHAW
    0xc020_660b, // FS_IOC_FIEMAP
    0x2,         // FIGETBSZ
    0x4004_9409, // FICLONE
    0x4020_940d, // FICLONERANGE
    0xc018_9436, // FIDEDUPERANGE
    0x8011_1500, // FS_IOC_GETFSUUID (Linux 6.8+)
    0x8081_1501, // FS_IOC_GETFSSYSFSPATH (Linux 6.9+)
];

/// Answered by the VFS on regular files only (`file_ioctl`): the emulator's stand-in is one.
pub const REGULAR_FILES: [u32; 4] = [
    0x1,         // FIBMAP
    0x541b,      // FIONREAD
    0x4030_5828, // FS_IOC_RESVSP
    0x4030_582a, // FS_IOC_RESVSP64
];

/// Whether the VFS answers `cmd` on a file (`regular`: a regular file, not a device node).
#[inline(always)]
pub fn answers(cmd: u32, regular: bool) -> bool {
    let mut i = 0;
    while i < ALL_FILES.len() {
        if ALL_FILES[i] == cmd {
            return true;
        }
        i += 1;
    }
    if regular {
        let mut i = 0;
        while i < REGULAR_FILES.len() {
            if REGULAR_FILES[i] == cmd {
                return true;
            }
            i += 1;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vfs_takes_fionbio_everywhere_and_fionread_on_regular_files() {
        assert!(answers(0x5421, false));
        assert!(answers(0x541b, true));
        assert!(!answers(0x541b, false));
        // A KFD command is never one of them.
        assert!(!answers(crate::kfd::iowr(0x02, 96), true));
    }
}
