//! The KFD path's lease: a stopped controller must never hold work.
//!
//! amdkfd resumes a debugger's suspended queues when the debugger's process goes away, never
//! while it is merely stopped (SIGSTOP, Ctrl-Z) or wedged. So the KFD backend starts a guardian
//! (the NVIDIA guardian's process and heartbeat protocol, holding nothing here) with
//! `--kill-on-expiry` our pid: when the controller's loop stops beating for [`lease_for`], the
//! guardian SIGKILLs it and the kernel resumes every target. The guardian runs in its own
//! process group and ignores job-control signals, so whatever stops the controller does not stop
//! it.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};

use crate::nv::guardian::GuardianHandle;

/// Shortest lease: a loop that is merely slow (a loaded 2-vCPU host, a big policy reload) is
/// not killed.
pub const MIN_LEASE: Duration = Duration::from_secs(2);
/// Longest lease: however long `max_suspend` is (`suspend` holders default to 300 s), a stopped
/// controller holds work this long at most, plus the guardian's poll (well under a second). A
/// live loop beats every 250 ms at most.
pub const MAX_LEASE: Duration = Duration::from_secs(5);

/// The lease for a controller whose longest allowed suspension is `max_suspend`.
pub fn lease_for(max_suspend: Duration) -> Duration {
    max_suspend.clamp(MIN_LEASE, MAX_LEASE)
}

/// The guardian, and when the loop last beat.
pub struct KfdLease {
    guardian: GuardianHandle,
    every_ns: u64,
    last_ns: u64,
    /// Set once a beat failed (the guardian died): said once.
    lost: bool,
}

impl KfdLease {
    /// Starts the guardian; its journal lives in the run directory.
    pub fn start(dir: &Path, max_suspend: Duration) -> Result<Self> {
        let exe = std::env::current_exe().context("locating our own binary")?;
        let lease = lease_for(max_suspend);
        let guardian = GuardianHandle::spawn_killing(&exe, &dir.join("kfd-journal"), lease)
            .context("starting the KFD lease guardian")?;
        log::info!(
            "KFD lease: guardian pid {} kills this controller after {} ms without a heartbeat",
            guardian.pid(),
            lease.as_millis()
        );
        Ok(Self {
            guardian,
            every_ns: (lease / 4).min(Duration::from_millis(250)).as_nanos() as u64,
            last_ns: 0,
            lost: false,
        })
    }

    /// The controller is done: the guardian exits (it holds nothing), and its journal files
    /// go with it so a clean exit leaves nothing in the run directory.
    pub fn finish(self, dir: &Path) {
        if let Err(e) = self.guardian.shutdown(Duration::from_secs(2)) {
            log::warn!("KFD lease guardian: {e:#}");
            return;
        }
        for f in ["kfd-journal", "kfd-journal.lock"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }

    pub fn lease(&self) -> Duration {
        self.guardian.lease().unwrap_or(MIN_LEASE)
    }

    /// Beats when one is due. Err (once): the guardian is gone and nothing guards a stop now.
    pub fn upkeep(&mut self, now_ns: u64) -> Option<String> {
        if now_ns.saturating_sub(self.last_ns) < self.every_ns {
            return None;
        }
        self.last_ns = now_ns;
        match self.guardian.beat() {
            Ok(()) => None,
            Err(e) if !self.lost => {
                self.lost = true;
                Some(format!(
                    "{e:#}: the KFD lease guardian is gone; a stopped controller would now hold \
                     its targets until it is killed"
                ))
            }
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_follows_max_suspend_within_bounds() {
        assert_eq!(lease_for(Duration::from_millis(100)), MIN_LEASE);
        assert_eq!(lease_for(Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(lease_for(Duration::from_secs(300)), MAX_LEASE);
    }
}
