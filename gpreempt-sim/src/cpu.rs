//! The host's CPU node: what the KFD topology (`topology`, `views`) reports of the real machine.

/// Facts of the real host the CPU node reports: the kernel's CPU node describes the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCpu {
    /// Logical CPUs (`cpu_cores_count`).
    pub cores: u32,
    /// The first CPU's APIC id (`cpu_core_id_base`; the thunk matches it against /proc/cpuinfo
    /// to name the CPU agent).
    pub apic_base: u32,
    /// System memory (the CPU node's one memory bank).
    pub mem_bytes: u64,
}

impl Default for HostCpu {
    fn default() -> Self {
        HostCpu {
            cores: 2,
            apic_base: 0,
            mem_bytes: 8 << 30,
        }
    }
}

impl HostCpu {
    /// From /proc/cpuinfo and /proc/meminfo; what cannot be read keeps the default.
    pub fn probe() -> Self {
        let mut h = HostCpu::default();
        if let Ok(s) = std::fs::read_to_string("/proc/cpuinfo") {
            let n = s.lines().filter(|l| l.starts_with("processor")).count();
            if n > 0 {
                h.cores = n as u32;
            }
            if let Some(a) = s
                .lines()
                .find(|l| l.starts_with("apicid"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse().ok())
            {
                h.apic_base = a;
            }
        }
        if let Some(kb) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        }) {
            h.mem_bytes = kb * 1024;
        }
        h
    }
}
