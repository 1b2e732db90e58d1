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
//! stops this thread too; a control thread stuck outside the driver, or a loop stuck for good,
//! stops the beats. The loop does not beat itself: a loop busy for seconds on work that makes
//! progress (tearing down uprobes) would read as dead, and the guardian would kill a working
//! controller.
//!
//! Liveness is not speed. A control thread waiting in one driver call is slow, not stopped: a
//! loaded driver (a thousand queues, a GPU being preempted, an emulator serving fifty busy
//! processes) can take seconds to answer, and killing the controller then throws away its whole
//! start on the host it was taking over. Such a call may last [`CALL_STALL`] before the beats
//! stop, and says so once it outlasts half a lease. A stopped controller is still caught
//! within the lease: its heartbeat thread stops with it.

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
/// One driver call may take this long before the control thread reads as stuck. Meanwhile a
/// hold can outlive `max_suspend` (the watchdog waits for the call): a slow driver delays the
/// starvation guard, it does not end the controller. A call stuck for good still gets the
/// controller killed, and the kernel resumes every target.
pub const CALL_STALL: Duration = Duration::from_secs(10);
/// The controller's start (its eBPF programs loaded and attached, the host read) may take this
/// long before its loop first turns: tens of seconds on a loaded 2-vCPU host. Nothing is held
/// by a loop that has never turned; a stopped start is still caught within the lease.
pub const START_STALL: Duration = Duration::from_secs(180);

/// The lease for a controller whose longest allowed suspension is `max_suspend`.
pub fn lease_for(max_suspend: Duration) -> Duration {
    max_suspend.clamp(MIN_LEASE, MAX_LEASE)
}

/// How long each part may be silent (ns).
#[derive(Debug, Clone, Copy)]
pub struct Stalls {
    /// The control thread outside a driver call.
    pub ctl: u64,
    /// One driver call.
    pub call: u64,
    /// The controller's loop, once it has turned.
    pub looping: u64,
    /// The controller's start, until its loop first turns.
    pub start: u64,
}

/// What the heartbeat thread sees (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// The control thread's last turn.
    pub ctl_turn: u64,
    /// When its driver call in flight began; 0: none.
    pub ctl_call: u64,
    /// The loop's last turn, or the lease's start before the first.
    pub loop_turn: u64,
    /// Whether the loop has turned at all (start-up is over).
    pub looping: bool,
}

impl Seen {
    fn loop_stall(&self, s: Stalls) -> u64 {
        if self.looping {
            s.looping
        } else {
            s.start
        }
    }
}

/// Whether the heartbeat may go on at `now`: the control thread turned within `ctl` or is in a
/// driver call begun within `call`, and the loop turned within `looping` (`start` while the
/// controller starts: loading its eBPF programs on a loaded host is slow, and a loop that has
/// never turned holds nothing).
pub fn alive(now: u64, w: Seen, s: Stalls) -> bool {
    let ctl = now.saturating_sub(w.ctl_turn) < s.ctl
        || (w.ctl_call != 0 && now.saturating_sub(w.ctl_call) < s.call);
    ctl && now.saturating_sub(w.loop_turn) < w.loop_stall(s)
}

/// Why [`alive`] said no, in words.
fn silence(now: u64, w: Seen, s: Stalls) -> String {
    let ms = |t: u64| now.saturating_sub(t) / 1_000_000;
    if now.saturating_sub(w.loop_turn) >= w.loop_stall(s) {
        if w.looping {
            format!(
                "the controller's loop has not turned for {} ms",
                ms(w.loop_turn)
            )
        } else {
            format!(
                "the controller has been starting for {} ms",
                ms(w.loop_turn)
            )
        }
    } else if w.ctl_call != 0 {
        format!(
            "one GPU driver call has not returned for {} ms",
            ms(w.ctl_call)
        )
    } else {
        format!(
            "the control thread has been silent for {} ms outside any driver call",
            ms(w.ctl_turn)
        )
    }
}

/// The driver call begun at `call` (0: none) has been waited on long enough at `now` to say so,
/// and it is not `said` (the call already reported).
fn slow_call(now: u64, call: u64, said: u64, ctl_stall: u64) -> bool {
    call != 0 && call != said && now.saturating_sub(call) >= ctl_stall
}

/// What the heartbeat thread and the controller share.
struct Shared {
    loop_turn: AtomicU64,
    looping: AtomicBool,
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
            looping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lost: Mutex::new(None),
        });
        let beater = guardian.beater();
        let every = (lease / 4).min(Duration::from_millis(250));
        // The control thread turns every 100 ms at most while alive: half the lease of silence
        // outside a driver call is a thread stuck.
        let stalls = Stalls {
            ctl: (lease / 2).as_nanos() as u64,
            call: CALL_STALL.as_nanos() as u64,
            looping: LOOP_STALL.as_nanos() as u64,
            start: START_STALL.as_nanos() as u64,
        };
        let s = shared.clone();
        let beat = std::thread::Builder::new()
            .name("kfd-lease".into())
            .spawn(move || {
                let (mut said, mut quiet) = (0, false);
                while !s.stop.load(Ordering::Relaxed) {
                    let now = monotonic_ns();
                    let (turn, call) = ctl.read();
                    let w = Seen {
                        ctl_turn: turn,
                        ctl_call: call,
                        loop_turn: s.loop_turn.load(Ordering::Relaxed),
                        looping: s.looping.load(Ordering::Relaxed),
                    };
                    if slow_call(now, call, said, stalls.ctl) {
                        said = call;
                        log::warn!(
                            "the GPU driver has not answered a call for {} ms: waiting (a slow \
                             driver is not a stopped controller; one call may take {} s)",
                            now.saturating_sub(call) / 1_000_000,
                            CALL_STALL.as_secs()
                        );
                    }
                    let ok = alive(now, w, stalls);
                    if !ok && !quiet {
                        // Said once a silence, before the guardian acts on it.
                        quiet = true;
                        log::error!("KFD lease: heartbeat stopped: {}", silence(now, w, stalls));
                    }
                    quiet &= !ok;
                    if ok {
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
        self.shared.looping.store(true, Ordering::Relaxed);
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
    const ST: Stalls = Stalls {
        ctl: S,
        call: 10 * S,
        looping: 30 * S,
        start: 180 * S,
    };

    /// Seen: the control thread turned at `turn`, in a call since `call` (0: none), the loop
    /// turned at `lp`.
    fn seen(turn: u64, call: u64, lp: u64) -> Seen {
        Seen {
            ctl_turn: turn,
            ctl_call: call,
            loop_turn: lp,
            looping: true,
        }
    }

    /// Beats go on while the control thread turns and the loop has turned within its stall; a
    /// control thread silent for half a lease outside the driver or a loop silent for 30 s stops
    /// them. A loop busy for seconds (waiting on the control thread, tearing uprobes down) does
    /// not.
    #[test]
    fn the_heartbeat_follows_the_control_thread_and_a_loop_that_still_turns() {
        let now = 1000 * S;
        assert!(alive(now, seen(now, 0, now), ST));
        assert!(
            alive(now, seen(now - S / 10, 0, now - 5 * S), ST),
            "loop busy 5 s"
        );
        assert!(alive(now, seen(now - S / 10, 0, now - 29 * S), ST));
        let stuck = seen(now - S / 10, 0, now - 30 * S);
        assert!(!alive(now, stuck, ST), "loop stuck");
        assert!(silence(now, stuck, ST).contains("loop has not turned for 30000 ms"));
        let ctl = seen(now - S, 0, now);
        assert!(!alive(now, ctl, ST), "control thread stuck");
        assert!(silence(now, ctl, ST).contains("silent for 1000 ms outside any driver call"));
        // Stamps from the future (another CPU's clock read a moment later) are fresh.
        assert!(alive(now, seen(now + 5, 0, now + 5), ST));
    }

    /// A control thread waiting in one slow driver call (a busy host's driver, seconds per
    /// answer) keeps the beats going up to the call stall, and is said once; stuck in a call
    /// longer, or silent outside one, it stops them.
    #[test]
    fn a_slow_driver_call_is_slowness_not_death() {
        let now = 1000 * S;
        let began = now - 3 * S;
        assert!(alive(now, seen(began, began, now), ST), "3 s in one call");
        assert!(alive(now, seen(now - 9 * S, now - 9 * S, now), ST));
        let stuck = seen(now - 10 * S, now - 10 * S, now);
        assert!(!alive(now, stuck, ST), "stuck in the call");
        assert!(silence(now, stuck, ST).contains("driver call has not returned for 10000 ms"));
        assert!(
            !alive(now, seen(began, 0, now), ST),
            "3 s silent outside a call"
        );
        // The loop's own stall still holds while the control thread waits.
        assert!(!alive(now, seen(began, began, now - 30 * S), ST));
        assert!(slow_call(now, began, 0, ST.ctl));
        assert!(!slow_call(now, began, began, ST.ctl), "said once a call");
        assert!(!slow_call(now, now - S / 2, 0, ST.ctl), "not slow yet");
        assert!(!slow_call(now, 0, 0, ST.ctl), "no call");
    }

    /// Before its loop first turns the controller is starting (tens of seconds loading eBPF
    /// programs on a loaded host): that is not a stuck loop, up to the start stall. The control
    /// thread is watched as ever.
    #[test]
    fn a_slow_start_is_not_a_stuck_loop() {
        let now = 1000 * S;
        let starting = |lp| Seen {
            looping: false,
            ..seen(now, 0, lp)
        };
        assert!(alive(now, starting(now - 60 * S), ST), "a 60 s start");
        let long = starting(now - 180 * S);
        assert!(!alive(now, long, ST));
        assert!(silence(now, long, ST).contains("starting for 180000 ms"));
        let ctl = Seen {
            ctl_turn: now - 2 * S,
            ..starting(now - 60 * S)
        };
        assert!(
            !alive(now, ctl, ST),
            "the control thread is watched while starting"
        );
    }
    #[test]
    fn the_lease_follows_max_suspend_within_bounds() {
        assert_eq!(lease_for(Duration::from_millis(100)), MIN_LEASE);
        assert_eq!(lease_for(Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(lease_for(Duration::from_secs(300)), MAX_LEASE);
    }
}
