//! Which files are GPU devices, for the ioctl programs' in-kernel filter ([`GpuFile`] rules in
//! the `CONFIG` map).
//!
//! The drivers pick an ioctl's handler by its number alone (amdkfd's `kfd_ioctl` indexes its
//! table by `_IOC_NR`; any type byte reaches it), so the programs select calls by the file
//! behind the fd, as the kernel does, never by the type byte a caller chooses. Devices are
//! matched by number: the KFD node's own, the `kfd` major from /proc/devices (nodes made
//! elsewhere, e.g. in containers), NVIDIA's fixed major 195 without nvidia-modeset. A file that
//! is no device (the emulator's FUSE stand-in) is matched by identity (filesystem, inode).

use std::path::{Path, PathBuf};

use gpreempt_common::{
    nv,
    record::{file_kind, file_match, mkdev, GpuFile, MAJOR_MASK, MAX_GPU_FILES},
};

/// What `stat` says about a file, in the kernel's `dev_t` encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    /// The device number of a character device node.
    pub rdev: Option<u32>,
    /// The filesystem's device (`s_dev`) and the inode number.
    pub dev: u32,
    pub ino: u64,
}

/// `stat(2)` device numbers to the kernel's internal encoding (`MKDEV`).
fn kernel_dev(d: u64) -> u32 {
    mkdev(
        nix::sys::stat::major(d) as u32,
        nix::sys::stat::minor(d) as u32,
    )
}

impl FileId {
    /// Follows links (/dev/kfd may be one in containers); None when it cannot be stat'ed.
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            rdev: m.file_type().is_char_device().then(|| kernel_dev(m.rdev())),
            dev: kernel_dev(m.dev()),
            ino: m.ino(),
        })
    }
}

/// The major number /proc/devices gives a character driver (`kfd` for amdkfd).
pub fn char_major(proc_devices: &str, driver: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| l.trim() != "Character devices:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let (n, name) = l.trim().split_once(' ')?;
            (name.trim() == driver).then(|| n.parse().ok()).flatten()
        })
}

/// The files to match, in the order the programs try them (first match decides).
#[derive(Clone, Debug, Default)]
pub struct Devices {
    /// The KFD node (`--kfd-device`), when it exists.
    pub kfd: Option<FileId>,
    /// amdkfd's major from /proc/devices, when the driver is loaded.
    pub kfd_major: Option<u32>,
    /// Further NVIDIA nodes that are not recognised by number (`--nvidia-device` stand-ins).
    pub nvidia: Vec<FileId>,
    /// The NVIDIA driver is loaded (its major in /proc/devices).
    pub nvidia_loaded: bool,
    /// amdkfd's calls come from the kprobe pair on `kfd_ioctl`: its major's rule says
    /// [`file_kind::KPROBED`].
    pub kprobed: bool,
    /// NVIDIA's calls come from the pair on `nvidia_unlocked_ioctl`: its major's rule says
    /// [`file_kind::KPROBED`] too (the tracepoints leave those files to the pair).
    pub nv_pair: bool,
}

impl Devices {
    /// Reads the host: `kfd_device`, /proc/devices, `nvidia`.
    pub fn read(kfd_device: &Path, nvidia: &[PathBuf]) -> Self {
        let devices = std::fs::read_to_string("/proc/devices").unwrap_or_default();
        Self {
            kfd: FileId::of(kfd_device),
            kfd_major: char_major(&devices, "kfd"),
            nvidia: nvidia.iter().filter_map(|p| FileId::of(p)).collect(),
            nvidia_loaded: char_major(&devices, "nvidia-frontend").is_some()
                || char_major(&devices, "nvidia").is_some(),
            kprobed: false,
            nv_pair: false,
        }
    }

    /// Why GPU files beyond amdkfd's own nodes need the syscall tracepoints (None: the kprobe
    /// pair on `kfd_ioctl` sees every GPU call here, and no other ioctl runs a program).
    pub fn beyond_amdkfd(&self) -> Option<String> {
        if !self.nvidia.is_empty() {
            return Some("NVIDIA stand-in devices".into());
        }
        if self.nvidia_loaded && !self.nv_pair {
            return Some("NVIDIA devices".into());
        }
        self.kfd_stand_in()
            .then(|| "a KFD node amdkfd does not serve (a stand-in)".into())
    }

    /// [`config_flag`](gpreempt_common::record::config_flag) bits for the vendors that have no
    /// file the tracepoints serve here (no node at all, or the vendor's pair serves them all):
    /// their nrs end the tracepoint program at once. Only honoured with the file filter.
    pub fn tracepoint_skips(&self) -> u32 {
        use gpreempt_common::record::config_flag;
        let mut f = 0;
        let kfd_none = self.kfd.is_none() && self.kfd_major.is_none();
        if kfd_none || (self.kprobed && !self.kfd_stand_in()) {
            f |= config_flag::NO_KFD_FILES;
        }
        if self.nvidia.is_empty() && (!self.nvidia_loaded || self.nv_pair) {
            f |= config_flag::NO_NVIDIA_FILES;
        }
        f
    }

    /// The KFD node is not amdkfd's own (the emulator's, or another driver's).
    pub fn kfd_stand_in(&self) -> bool {
        match (&self.kfd, self.kfd_major) {
            (Some(id), Some(m)) => id.rdev.is_none_or(|r| r & MAJOR_MASK != mkdev(m, 0)),
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The rules, and the ones that did not fit (so the caller can say so).
    pub fn rules(&self) -> (Vec<GpuFile>, usize) {
        let exact = |kind, id: &FileId| match id.rdev {
            Some(rdev) => GpuFile {
                kind,
                by: file_match::RDEV,
                dev: rdev,
                mask: u32::MAX,
                ino: 0,
            },
            None => GpuFile {
                kind,
                by: file_match::INODE,
                dev: id.dev,
                mask: 0,
                ino: id.ino,
            },
        };
        let major = |kind, major: u32| GpuFile {
            kind,
            by: file_match::RDEV,
            dev: mkdev(major, 0),
            mask: MAJOR_MASK,
            ino: 0,
        };
        let mut v = Vec::new();
        // nvidia-modeset shares NVIDIA's major and speaks another ABI.
        v.push(GpuFile {
            kind: file_kind::NONE,
            by: file_match::RDEV,
            dev: mkdev(nv::NV_MAJOR_DEVICE_NUMBER, nv::NV_MODESET_MINOR),
            mask: u32::MAX,
            ino: 0,
        });
        v.push(major(
            if self.nv_pair {
                file_kind::KPROBED
            } else {
                file_kind::NVIDIA
            },
            nv::NV_MAJOR_DEVICE_NUMBER,
        ));
        if let Some(id) = &self.kfd {
            // A node with amdkfd's major is covered by the major rule.
            let covered = matches!((id.rdev, self.kfd_major),
                (Some(r), Some(m)) if r & MAJOR_MASK == mkdev(m, 0));
            if !covered {
                v.push(exact(file_kind::KFD, id));
            }
        }
        if let Some(m) = self.kfd_major {
            let kind = if self.kprobed {
                file_kind::KPROBED
            } else {
                file_kind::KFD
            };
            v.push(major(kind, m));
        }
        v.extend(self.nvidia.iter().map(|id| exact(file_kind::NVIDIA, id)));
        let dropped = v.len().saturating_sub(MAX_GPU_FILES);
        v.truncate(MAX_GPU_FILES);
        (v, dropped)
    }
}

/// Whether `pid` has a GPU device open (`/proc/PID/fd`): the KFD node (by number, or for a
/// stand-in by identity), a node with amdkfd's major, or an NVIDIA RM node. Err: its fds cannot
/// be read (gone, or not ours to look at).
pub fn opens_gpu(proc_root: &Path, pid: u32, kfd_device: &Path) -> std::io::Result<bool> {
    let kfd = FileId::of(kfd_device);
    let kfd_major = std::fs::read_to_string("/proc/devices")
        .ok()
        .and_then(|t| char_major(&t, "kfd"));
    let (rules, _) = Devices {
        kfd,
        kfd_major,
        ..Devices::default()
    }
    .rules();
    for e in std::fs::read_dir(proc_root.join(pid.to_string()).join("fd"))? {
        let Some(id) = e.ok().and_then(|e| FileId::of(&e.path())) else {
            continue;
        };
        let kind = rules
            .iter()
            .find(|r| match (r.by, id.rdev) {
                (file_match::RDEV, Some(rdev)) => rdev & r.mask == r.dev,
                (file_match::INODE, None) => id.dev == r.dev && id.ino == r.ino,
                _ => false,
            })
            .map(|r| r.kind);
        if matches!(kind, Some(file_kind::KFD | file_kind::NVIDIA)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One line for logs and `doctor`: what the filter matches.
pub fn describe(rules: &[GpuFile]) -> String {
    let one = |r: &GpuFile| {
        let what = match r.kind {
            file_kind::KFD => "KFD",
            file_kind::NVIDIA => "NVIDIA",
            file_kind::KPROBED if r.dev >> 20 == nv::NV_MAJOR_DEVICE_NUMBER => {
                "NVIDIA (by the nvidia_unlocked_ioctl pair)"
            }
            file_kind::KPROBED => "KFD (by the kfd_ioctl pair)",
            _ => "not GPU",
        };
        let (maj, min) = (r.dev >> 20, r.dev & !MAJOR_MASK);
        match r.by {
            file_match::RDEV if r.mask == MAJOR_MASK => format!("{what} major {maj}"),
            file_match::RDEV => format!("{what} {maj}:{min}"),
            _ => format!("{what} inode {} on {maj}:{min}", r.ino),
        }
    };
    rules.iter().map(one).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n\
        226 drm\n510 kfd\n\nBlock devices:\n  8 sd\n511 kfd\n";

    #[test]
    fn the_kfd_major_comes_from_the_character_section_only() {
        assert_eq!(char_major(PROC_DEVICES, "kfd"), Some(510));
        assert_eq!(char_major(PROC_DEVICES, "sd"), None);
        assert_eq!(char_major("Character devices:\n  1 mem\n", "kfd"), None);
        assert_eq!(char_major("", "kfd"), None);
    }

    #[test]
    fn rules_put_exclusions_first_and_match_devices_by_number() {
        let d = Devices {
            kfd: Some(FileId {
                rdev: Some(mkdev(510, 0)),
                dev: 5,
                ino: 99,
            }),
            kfd_major: Some(510),
            nvidia: vec![],
            ..Devices::default()
        };
        let (r, dropped) = d.rules();
        assert_eq!(dropped, 0);
        assert_eq!(
            describe(&r),
            "not GPU 195:254, NVIDIA major 195, KFD major 510"
        );
    }

    #[test]
    fn a_stand_in_that_is_no_device_is_matched_by_inode() {
        let d = Devices {
            kfd: Some(FileId {
                rdev: None,
                dev: mkdev(0, 53),
                ino: 7,
            }),
            kfd_major: None,
            nvidia: vec![FileId {
                rdev: None,
                dev: mkdev(0, 40),
                ino: 3,
            }],
            ..Devices::default()
        };
        let (r, _) = d.rules();
        assert_eq!(r[2].kind, file_kind::KFD);
        assert_eq!((r[2].by, r[2].dev, r[2].ino), (file_match::INODE, 53, 7));
        assert_eq!(r[3].kind, file_kind::NVIDIA);
        assert_eq!(
            describe(&r[2..]),
            "KFD inode 7 on 0:53, NVIDIA inode 3 on 0:40"
        );
    }

    #[test]
    fn a_kfd_node_outside_the_driver_major_keeps_its_own_rule() {
        let d = Devices {
            kfd: Some(FileId {
                rdev: Some(mkdev(1, 3)),
                dev: 5,
                ino: 9,
            }),
            kfd_major: Some(510),
            nvidia: vec![],
            ..Devices::default()
        };
        assert_eq!(
            describe(&d.rules().0),
            "not GPU 195:254, NVIDIA major 195, KFD 1:3, KFD major 510"
        );
    }

    #[test]
    fn rules_beyond_the_map_are_counted() {
        let id = FileId {
            rdev: None,
            dev: 1,
            ino: 1,
        };
        let d = Devices {
            kfd: Some(id),
            kfd_major: Some(510),
            nvidia: vec![id; 4],
            ..Devices::default()
        };
        let (r, dropped) = d.rules();
        assert_eq!(r.len(), MAX_GPU_FILES);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn with_the_kprobe_pair_only_other_gpu_files_need_the_tracepoints() {
        let kfd = |rdev| {
            Some(FileId {
                rdev,
                dev: 5,
                ino: 9,
            })
        };
        let mut d = Devices {
            kfd: kfd(Some(mkdev(510, 0))),
            kfd_major: Some(510),
            kprobed: true,
            ..Devices::default()
        };
        assert_eq!(d.beyond_amdkfd(), None);
        assert_eq!(
            describe(&d.rules().0),
            "not GPU 195:254, NVIDIA major 195, KFD (by the kfd_ioctl pair) major 510"
        );
        d.nvidia_loaded = true;
        assert_eq!(d.beyond_amdkfd().as_deref(), Some("NVIDIA devices"));
        d.nvidia_loaded = false;
        // The emulator's node (no device, or another driver's) is no kfd_ioctl call.
        d.kfd = kfd(None);
        assert!(d.beyond_amdkfd().unwrap().contains("stand-in"));
        d.kfd = kfd(Some(mkdev(1, 3)));
        assert!(d.beyond_amdkfd().unwrap().contains("stand-in"));
        // No KFD node at all: nothing beyond amdkfd.
        d.kfd = None;
        assert_eq!(d.beyond_amdkfd(), None);
    }

    #[test]
    fn a_process_is_known_to_use_a_gpu_by_its_open_files() {
        let dir = std::env::temp_dir().join(format!("gpreempt-opens-gpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stand_in = dir.join("kfd");
        std::fs::write(&stand_in, b"").unwrap();
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        assert!(!opens_gpu(proc_root, me, &stand_in).unwrap());
        let f = std::fs::File::open(&stand_in).unwrap();
        assert!(opens_gpu(proc_root, me, &stand_in).unwrap());
        drop(f);
        assert!(!opens_gpu(proc_root, me, &stand_in).unwrap());
        assert!(opens_gpu(proc_root, u32::MAX - 7, &stand_in).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stat_numbers_become_kernel_numbers() {
        let null = FileId::of(Path::new("/dev/null")).expect("/dev/null");
        assert_eq!(null.rdev, Some(mkdev(1, 3)));
        let tmp = FileId::of(Path::new("/proc/self/exe")).unwrap();
        assert_eq!(tmp.rdev, None);
        assert!(tmp.ino > 0);
    }
}
