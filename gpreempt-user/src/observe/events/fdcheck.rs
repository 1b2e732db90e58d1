//! Whether the fd of an event is the device its decoder expects (KFD, or an NVIDIA node), from
//! `/proc/PID/fd/N`: the type byte of an ioctl is the caller's choice, the file it went to is not.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use gpreempt_common::nv;

/// Whether (pid, fd) is the device its events' decoder expects (KFD, or an NVIDIA node), from
/// `/proc/PID/fd/N`, cached per (pid, fd).
pub struct FdCheck {
    /// The KFD device node; NVIDIA nodes are recognised by their device number (or, for files
    /// that are no device, by name: /dev/nvidiactl, /dev/nvidiaN).
    device: PathBuf,
    /// The KFD device's number, when it is a character device here.
    device_rdev: Option<u64>,
    proc_root: PathBuf,
    cache: HashMap<(u32, i32), Node>,
}

/// `/dev/nvidiactl` or `/dev/nvidia<digits>` (not nvidia-uvm, nvidia-modeset: other ABIs).
pub fn is_nvidia_node(p: &Path) -> bool {
    let Some(name) = p.to_str().and_then(|s| s.strip_prefix("/dev/nvidia")) else {
        return false;
    };
    name == "ctl" || (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()))
}

/// What an open file is, for the events on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Kfd,
    Nvidia,
    Other,
}

/// The verdict on one (pid, fd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdVerdict {
    /// The GPU device the event asked for: `/dev/kfd` for a KFD ioctl, an NVIDIA node for an
    /// RM escape.
    Device,
    /// Another file: the event is not a GPU driver call and is dropped.
    Other,
    /// The process or fd was gone before it could be checked.
    Unknown,
}

fn char_rdev(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    meta.file_type().is_char_device().then(|| meta.rdev())
}

impl FdCheck {
    pub fn new(device: impl Into<PathBuf>) -> Self {
        Self::with_proc(device, "/proc")
    }

    /// For tests: a different procfs root.
    pub fn with_proc(device: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Self {
        let device = device.into();
        let device_rdev = std::fs::metadata(&device).ok().as_ref().and_then(char_rdev);
        Self {
            device,
            device_rdev,
            proc_root: proc_root.into(),
            cache: HashMap::new(),
        }
    }

    pub fn device(&self) -> &Path {
        &self.device
    }

    /// Whether `pid`'s `fd` is an NVIDIA device node (RM escapes go to nvidiactl and nvidiaN).
    pub fn check_nv(&mut self, pid: u32, fd: i32) -> FdVerdict {
        self.check_for(pid, fd, Node::Nvidia)
    }

    /// Whether `pid`'s `fd` is the KFD device.
    pub fn check(&mut self, pid: u32, fd: i32) -> FdVerdict {
        self.check_for(pid, fd, Node::Kfd)
    }

    fn check_for(&mut self, pid: u32, fd: i32, want: Node) -> FdVerdict {
        // Only devices are cached: the check runs after the event, and a process may have closed
        // the fd and reused its number for another file by then (libcuda opens nvidiactl, closes
        // it, reads /proc/driver/nvidia/params on the same number, then opens nvidiactl again
        // for good): a cached "other file" would drop every later event on that number.
        let node = match self.cache.get(&(pid, fd)) {
            Some(&n) => n,
            None => match self.judge(pid, fd) {
                Some(Node::Other) => Node::Other,
                Some(n) => {
                    self.cache.insert((pid, fd), n);
                    n
                }
                None => return FdVerdict::Unknown,
            },
        };
        if node == want {
            FdVerdict::Device
        } else {
            FdVerdict::Other
        }
    }

    /// By device number for character devices (the node may be mounted anywhere: containers,
    /// /usr/local/nvidia/dev, ...), by path for anything else (the tests' stand-in files).
    fn judge(&self, pid: u32, fd: i32) -> Option<Node> {
        let link = self
            .proc_root
            .join(pid.to_string())
            .join("fd")
            .join(fd.to_string());
        let by_number = std::fs::metadata(&link).ok().as_ref().and_then(char_rdev);
        let node = match by_number {
            Some(rdev) if Some(rdev) == self.device_rdev => Node::Kfd,
            Some(rdev)
                if nix::sys::stat::major(rdev) == u64::from(nv::NV_MAJOR_DEVICE_NUMBER)
                    && nix::sys::stat::minor(rdev) != u64::from(nv::NV_MODESET_MINOR) =>
            {
                Node::Nvidia
            }
            // Not a device here (the tests' stand-ins), or not one of ours by number: by name.
            _ => {
                let target = std::fs::read_link(&link).ok()?;
                if target == self.device {
                    Node::Kfd
                } else if is_nvidia_node(&target) {
                    Node::Nvidia
                } else {
                    log::debug!(
                        "pid {pid} fd {fd} ({}, device {}) is neither KFD nor NVIDIA: its events \
                         are dropped",
                        target.display(),
                        by_number.map_or("none".into(), |r| format!(
                            "{}:{}",
                            nix::sys::stat::major(r),
                            nix::sys::stat::minor(r)
                        ))
                    );
                    Node::Other
                }
            }
        };
        Some(node)
    }

    /// Forget a process (its fds, and a later process reusing its pid).
    pub fn forget(&mut self, pid: u32) {
        self.cache.retain(|&(p, _), _| p != pid);
    }

    /// Number of cached (pid, fd) verdicts.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}
