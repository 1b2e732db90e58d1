//! One file per command: each owns its arguments and reaches the kernel only through the
//! observer ([`crate::observe`]) and the backend seam ([`crate::backend`]).

use std::path::PathBuf;

pub mod doctor;
pub mod kfd_cycles;
pub mod manual;
pub mod nv_guardian;
pub mod nv_pause_test;
pub mod nv_selftest_target;
pub mod policy;
pub mod queues;
pub mod run;
#[cfg(feature = "sim")]
pub mod sim;
/// Without the `sim` feature, `sim` says how to get a build with the emulator.
#[cfg(not(feature = "sim"))]
#[path = "nosim.rs"]
pub mod sim;
pub mod top;
pub mod trace;

/// Options every command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Global {
    /// The KFD device node (ioctls on other files are not KFD ioctls).
    #[arg(
        long,
        global = true,
        env = "GPREEMPT_KFD_DEVICE",
        default_value = "/dev/kfd"
    )]
    pub kfd_device: PathBuf,
    /// An NVIDIA RM node that is no device node (a stand-in); real ones are known by number.
    #[arg(
        long,
        global = true,
        env = "GPREEMPT_NVIDIA_DEVICE",
        value_name = "PATH"
    )]
    pub nvidia_device: Vec<PathBuf>,
    /// Where GPU ioctl events come from. `auto`: a pair on the driver's ioctl entry (amdkfd's
    /// `kfd_ioctl`, NVIDIA's `nvidia_unlocked_ioctl`), fentry/fexit where the module has BTF and
    /// trampolines, else kprobes, so no other ioctl on the host runs a program; else
    /// the syscall tracepoints. `fentry` and `kprobe` insist on that pair for KFD; `tracepoint`
    /// forces the tracepoints for both vendors.
    #[arg(
        long,
        global = true,
        env = "GPREEMPT_IOCTL_SOURCE",
        value_enum,
        default_value_t = crate::observe::probe::IoctlSource::Auto
    )]
    pub ioctl_source: crate::observe::probe::IoctlSource,
    /// Size of the kernel's event ring buffer in KiB (a power of two, 4 to 1048576). Records that
    /// find it full are lost and counted; the map then leans on sysfs until losses stop.
    #[arg(
        long,
        global = true,
        env = "GPREEMPT_RING_KIB",
        value_name = "KIB",
        default_value_t = gpreempt_common::record::RING_BYTES / 1024,
        value_parser = parse_ring_kib
    )]
    pub ring_kib: u32,
    /// More diagnostics on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl Global {
    /// The observer's options for the devices named here (rate limit on).
    pub fn probe_options(&self) -> crate::observe::probe::ProbeOptions {
        crate::observe::probe::ProbeOptions {
            kfd_device: self.kfd_device.clone(),
            nvidia_devices: self.nvidia_device.clone(),
            ioctl_source: self.ioctl_source,
            ring_bytes: self.ring_kib * 1024,
            ..Default::default()
        }
    }
}

/// `--ring-kib`: a power of two from one page (4 KiB) to 1 GiB.
fn parse_ring_kib(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|e| format!("{s:?}: {e} (a size in KiB, e.g. 8192)"))?;
    if !(4..=1 << 20).contains(&v) || !v.is_power_of_two() {
        return Err(format!(
            "{v} KiB: the ring buffer is a power of two from 4 to 1048576 KiB"
        ));
    }
    Ok(v)
}
