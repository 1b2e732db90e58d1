//! AMD (amdkfd): the KFD's own files, sysfs (`/sys/class/kfd/kfd`: topology and per-process
//! queues) and debugfs (`/sys/kernel/debug/kfd`: `hqds` and `mqds` dumps) parsed in the kernel's
//! formats ([`sysfs`], [`debugfs`]; docs/kfd.md), the AQL dispatch-id [`sampler`] and the
//! code-object names ([`codeobj`]). The control thread is `backend::kfd::control`.

pub mod codeobj;
pub mod debugfs;
pub mod remote;
pub mod sampler;
pub mod sysfs;

/// Where the KFD's files are (tests point these at other trees).
#[derive(Clone, Debug)]
pub struct Paths {
    /// `/sys/class/kfd/kfd`
    pub sysfs: std::path::PathBuf,
    /// `/sys/kernel/debug/kfd`
    pub debugfs: std::path::PathBuf,
    /// `/proc`
    pub proc: std::path::PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            sysfs: "/sys/class/kfd/kfd".into(),
            debugfs: "/sys/kernel/debug/kfd".into(),
            proc: "/proc".into(),
        }
    }
}
