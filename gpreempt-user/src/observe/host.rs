//! `host`: what this process may do on the host, from its effective capabilities: the fact both
//! the probe loader (may it load eBPF?) and `doctor` (the privileges line) stand on.

/// Capability bit numbers (include/uapi/linux/capability.h).
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Effective capabilities from a `/proc/PID/status` text.
pub fn cap_eff(status: &str) -> Option<u64> {
    u64::from_str_radix(
        crate::observe::procinfo::status_field(status, "CapEff")?,
        16,
    )
    .ok()
}

/// What the process may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Privileges {
    /// bpf(2) loads and tracepoint attach: CAP_SYS_ADMIN, or CAP_BPF + CAP_PERFMON.
    pub bpf: bool,
    /// Attaching to other users' processes (the controller): CAP_SYS_PTRACE.
    pub ptrace: bool,
    /// Reading debugfs and the like.
    pub admin: bool,
}

impl Privileges {
    pub fn from_caps(caps: u64) -> Self {
        let has = |c: u32| caps & (1u64 << c) != 0;
        Self {
            bpf: has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)),
            ptrace: has(CAP_SYS_PTRACE),
            admin: has(CAP_SYS_ADMIN),
        }
    }
    /// Every privilege or none: what euid 0 (or not) implies when CapEff is unreadable.
    pub fn all(yes: bool) -> Self {
        Self {
            bpf: yes,
            ptrace: yes,
            admin: yes,
        }
    }
}
