//! The KFD path's lease: a stopped controller must never hold work.
//!
//! amdkfd resumes a debugger's suspended queues when the debugger's process goes away, never
//! while it is merely stopped (SIGSTOP, Ctrl-Z) or wedged. So the KFD backend starts a guardian
//! (the NVIDIA guardian's process and heartbeat protocol, holding nothing here) with
//! `--kill-on-expiry` our pid: when the heartbeat stops for [`lease_for`], the guardian SIGKILLs
//! the controller and the kernel resumes every target. The guardian runs in its own process
//! group and ignores job-control signals, so whatever stops the controller does not stop it.
//!
//! The heartbeat comes from a thread of its own (`kfd-lease`), which beats while the controller
//! is alive in the sense that matters ([`alive`]): the control thread, whose watchdog bounds
//! every hold, keeps turning, and the controller's loop has turned within [`LOOP_STALL`]. Work the
//! loop does meanwhile (waiting for the control thread while it serves a target that floods
//! itself with signals, a slow file system, reconciliation) is not silence. A stopped process
//! stops this thread too; a control thread stuck in a call, or a loop stuck for good, stops the
//! beats. The loop does not beat itself: a loop busy for seconds on work that makes progress
//! (tearing down uprobes) would read as dead, and the guardian would kill a working controller.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{backend::guardian::GuardianHandle, backend::kfd::control::Turns, clock::monotonic_ns};

/// Shortest lease: a loop that is merely slow (a loaded 2-vCPU host, a big policy reload) is
/// not killed.
pub const MIN_LEASE: Duration = Duration::from_secs(2);
/// Longest lease: however long `max_suspend` is (`suspend` holders default to 300 s), a stopped
/// controller holds work this long at most, plus the guardian's poll (well under a second).
pub const MAX_LEASE: Duration = Duration::from_secs(5);
/// The controller's loop may go this long without a turn before the heartbeat stops: longer
/// than anything the loop waits for (a control thread serving a signal storm, uprobes torn down,
/// reconciliation over a slow file system) while no hold can outlive `max_suspend` meanwhile
/// (the control thread's watchdog). A loop stuck for good still gets the controller killed.
pub const LOOP_STALL: Duration = Duration::from_secs(30);

/// The lease for a controller whose longest allowed suspension is `max_suspend`.
pub fn lease_for(max_suspend: Duration) -> Duration {
    max_suspend.clamp(MIN_LEASE, MAX_LEASE)
}

/// Whether the heartbeat may go on at `now`: the control thread turned within `ctl_stall` and
/// the loop within `loop_stall` (all CLOCK_MONOTONIC ns).
pub fn alive(now: u64, ctl_turn: u64, loop_turn: u64, ctl_stall: u64, loop_stall: u64) -> bool {
    now.saturating_sub(ctl_turn) < ctl_stall && now.saturating_sub(loop_turn) < loop_stall
}

/// What the heartbeat thread and the controller share.
struct Shared {
    loop_turn: AtomicU64,
    stop: AtomicBool,
    /// Why a beat failed (the guardian died), for the loop to say once.
    lost: Mutex<Option<String>>,
}

/// The guardian and the thread that beats it.
pub struct KfdLease {
    /// None once finished.
    guardian: Option<GuardianHandle>,
    shared: Arc<Shared>,
    beat: Option<JoinHandle<()>>,
    /// Said already that the guardian is gone.
    said: bool,
}

impl KfdLease {
    /// Starts the guardian (its journal lives in the run directory) and the heartbeat thread,
    /// which watches `ctl` (the control thread's turns) and the loop's [`Self::upkeep`].
    pub fn start(dir: &Path, max_suspend: Duration, ctl: Turns) -> Result<Self> {
        let exe = std::env::current_exe().context("locating our own binary")?;
        let lease = lease_for(max_suspend);
        let guardian = GuardianHandle::spawn_killing(&exe, &dir.join("kfd-journal"), lease)
            .context("starting the KFD lease guardian")?;
        log::info!(
            "KFD lease: guardian pid {} kills this controller after {} ms without a heartbeat",
            guardian.pid(),
            lease.as_millis()
        );
        let shared = Arc::new(Shared {
            loop_turn: AtomicU64::new(monotonic_ns()),
            stop: AtomicBool::new(false),
            lost: Mutex::new(None),
        });
        let beater = guardian.beater();
        let every = (lease / 4).min(Duration::from_millis(250));
        // The control thread turns every 100 ms at most while alive: half the lease of silence
        // from it is a thread stuck in a call.
        let ctl_stall = (lease / 2).as_nanos() as u64;
        let loop_stall = LOOP_STALL.as_nanos() as u64;
        let s = shared.clone();
        let beat = std::thread::Builder::new()
            .name("kfd-lease".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) {
                    let now = monotonic_ns();
                    let (c, l) = (
                        ctl.load(Ordering::Relaxed),
                        s.loop_turn.load(Ordering::Relaxed),
                    );
                    if alive(now, c, l, ctl_stall, loop_stall) {
                        if let Err(e) = beater.beat() {
                            let mut lost = s.lost.lock().unwrap_or_else(|e| e.into_inner());
                            lost.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                    std::thread::sleep(every);
                }
            })
            .context("starting the KFD lease's heartbeat thread")?;
        Ok(Self {
            guardian: Some(guardian),
            shared,
            beat: Some(beat),
            said: false,
        })
    }

    /// The controller is done (every target resumed and released): the heartbeat stops, the
    /// guardian exits (it holds nothing), and its journal files go with it so a clean exit
    /// leaves nothing in the run directory.
    pub fn finish(mut self, dir: &Path) {
        self.stop_beating();
        let Some(g) = self.guardian.take() else {
            return;
        };
        if let Err(e) = g.shutdown(Duration::from_secs(2)) {
            log::warn!("KFD lease guardian: {e:#}");
            return;
        }
        for f in ["kfd-journal", "kfd-journal-frozen", "kfd-journal.lock"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }

    fn stop_beating(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.beat.take() {
            let _ = t.join();
        }
    }

    /// The guardian's pid (never frozen with a target).
    pub fn guardian_pid(&self) -> Option<u32> {
        self.guardian.as_ref().map(GuardianHandle::pid)
    }

    /// Has the guardian answer for `entry`'s cgroup before it is frozen.
    pub fn freeze(&mut self, entry: &crate::backend::guardian::FrozenEntry) -> Result<()> {
        match self.guardian.as_mut() {
            Some(g) => g.freeze(entry),
            None => anyhow::bail!("the KFD lease guardian is gone: nothing would thaw it"),
        }
    }

    /// Tells the guardian that `cgroup` is thawed.
    pub fn thaw(&mut self, cgroup: &Path) -> Result<()> {
        match self.guardian.as_mut() {
            Some(g) => g.thaw(cgroup),
            None => Ok(()),
        }
    }

    pub fn lease(&self) -> Duration {
        self.guardian
            .as_ref()
            .and_then(GuardianHandle::lease)
            .unwrap_or(MIN_LEASE)
    }

    /// The loop turned at `now_ns`. Err (once): the guardian is gone and nothing guards a stop
    /// now.
    pub fn upkeep(&mut self, now_ns: u64) -> Option<String> {
        self.shared.loop_turn.store(now_ns, Ordering::Relaxed);
        if self.said {
            return None;
        }
        let e = self
            .shared
            .lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        self.said = true;
        Some(format!(
            "{e}: the KFD lease guardian is gone; a stopped controller would now hold its \
             targets until it is killed"
        ))
    }
}

impl Drop for KfdLease {
    fn drop(&mut self) {
        // A controller that ends without `finish` (an error path) stops beating first: the
        // guardian's handle closes its pipe next, and an end is not a silence.
        self.stop_beating();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Beats go on while the control thread turns and the loop has turned within its stall; a
    /// control thread silent for half a lease (stuck in a call) or a loop silent for 30 s stops
    /// them. A loop busy for seconds (waiting on the control thread, tearing uprobes down) does
    /// not.
    #[test]
    fn the_heartbeat_follows_the_control_thread_and_a_loop_that_still_turns() {
        let (ctl, lp) = (S, 30 * S);
        let now = 100 * S;
        assert!(alive(now, now, now, ctl, lp));
        assert!(
            alive(now, now - S / 10, now - 5 * S, ctl, lp),
            "loop busy 5 s"
        );
        assert!(alive(now, now - S / 10, now - 29 * S, ctl, lp));
        assert!(
            !alive(now, now - S / 10, now - 30 * S, ctl, lp),
            "loop stuck"
        );
        assert!(!alive(now, now - S, now, ctl, lp), "control thread stuck");
        // Stamps from the future (another CPU's clock read a moment later) are fresh.
        assert!(alive(now, now + 5, now + 5, ctl, lp));
    }

    #[test]
    fn the_lease_follows_max_suspend_within_bounds() {
        assert_eq!(lease_for(Duration::from_millis(100)), MIN_LEASE);
        assert_eq!(lease_for(Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(lease_for(Duration::from_secs(300)), MAX_LEASE);
    }
}
