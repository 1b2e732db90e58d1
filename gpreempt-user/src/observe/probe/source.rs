//! The names of where events come from: the ioctl pair or tracepoints, and each source's kind.
//! The host facts, the pairs and the attach steps all speak of them.

use serde::Serialize;

/// Where KFD ioctl records come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoctlSource {
    /// The fentry + fexit pair where `kfd_ioctl` has BTF and the kernel has trampolines, else
    /// the kprobe pair where kprobes reach it, else the syscall tracepoints.
    #[default]
    Auto,
    /// The fentry + fexit pair on `kfd_ioctl` (amdkfd's own dispatcher, through BPF
    /// trampolines: no other ioctl on the host runs a program, and no breakpoint); an error
    /// where it cannot attach.
    Fentry,
    /// The kprobe + kretprobe pair on `kfd_ioctl` (amdkfd's own dispatcher: no other ioctl on
    /// the host runs a program); an error where it cannot attach.
    Kprobe,
    /// The syscall tracepoints, for KFD and NVIDIA alike (every ioctl on the host runs the
    /// filter).
    Tracepoint,
}

/// Kind of an event source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Tracepoint,
    Kprobe,
    Fentry,
    Uprobe,
}

/// Which pair of programs on `kfd_ioctl` gives the KFD ioctl records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pair {
    Fentry,
    Kprobe,
}

impl Pair {
    pub fn name(self) -> &'static str {
        match self {
            Pair::Fentry => "fentry/fexit",
            Pair::Kprobe => "kprobe",
        }
    }
}

pub(super) fn source_name(s: IoctlSource) -> &'static str {
    match s {
        IoctlSource::Auto => "auto",
        IoctlSource::Fentry => "fentry",
        IoctlSource::Kprobe => "kprobe",
        IoctlSource::Tracepoint => "tracepoint",
    }
}

/// The NVIDIA driver's ioctl entry for /dev/nvidiactl and /dev/nvidiaN (kernel-open/nvidia/nv.c).
pub const NV_IOCTL: &str = "nvidia_unlocked_ioctl";
