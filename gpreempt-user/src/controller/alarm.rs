//! A one-shot wake-up at an absolute CLOCK_MONOTONIC time, for the controller's loop: a
//! deferred suspend is due at a deadline the engine names, which the 1 ms tick would miss by up
//! to a tick. tokio's own timers round up to the millisecond, so this is a timerfd (no timer
//! slack either: timerfd's hrtimer is armed without one).

use anyhow::{Context as _, Result};
use nix::sys::{
    time::TimeSpec,
    timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags},
};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use tokio::io::unix::AsyncFd;

/// nix's TimerFd has `AsFd` only; tokio registers a raw fd.
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

pub struct Alarm {
    fd: AsyncFd<Timer>,
    /// The armed deadline (ns, CLOCK_MONOTONIC: the clock of `clock::monotonic_ns`).
    at: Option<u64>,
}

impl Alarm {
    pub fn new() -> Result<Self> {
        let t = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .context("timerfd_create")?;
        // SAFETY: the Timer owns its fd; it stays open and unchanged until the AsyncFd (which
        // owns the Timer) is dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(Timer(t), tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
                .context("registering the timerfd")?;
        Ok(Self { fd, at: None })
    }

    /// Arms the alarm for `at` (None: disarms it). The same deadline again costs no syscall.
    pub fn set(&mut self, at: Option<u64>) -> Result<()> {
        if at == self.at {
            return Ok(());
        }
        let t = &self.fd.get_ref().0;
        match at {
            // 0 would disarm the timer: a deadline that early is due anyway.
            Some(ns) => t.set(
                Expiration::OneShot(TimeSpec::new(
                    (ns / 1_000_000_000) as _,
                    (ns % 1_000_000_000).max(1) as _,
                )),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => t.unset(),
        }
        .context("timerfd_settime")?;
        self.at = at;
        Ok(())
    }

    pub fn armed(&self) -> bool {
        self.at.is_some()
    }

    /// Waits until the armed deadline has passed; the alarm is then disarmed.
    pub async fn fired(&mut self) -> Result<()> {
        loop {
            let mut g = self.fd.readable().await?;
            // The expiration count; EAGAIN: a spurious wake-up (or re-armed since).
            match nix::unistd::read(self.fd.get_ref().0.as_fd(), &mut [0u8; 8]) {
                Ok(_) => {
                    // Drained: the next wait is for the next expiration.
                    g.clear_ready();
                    self.at = None;
                    return Ok(());
                }
                Err(nix::errno::Errno::EAGAIN) => g.clear_ready(),
                Err(e) => return Err(e).context("reading the timerfd"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::monotonic_ns;

    #[tokio::test(flavor = "current_thread")]
    async fn fires_at_the_deadline_not_at_a_millisecond_boundary() {
        let mut a = Alarm::new().unwrap();
        for _ in 0..5 {
            // 300 us ahead: tokio's timer would wake at the next millisecond or later.
            let at = monotonic_ns() + 300_000;
            a.set(Some(at)).unwrap();
            assert!(a.armed());
            a.fired().await.unwrap();
            let now = monotonic_ns();
            assert!(now >= at, "fired {} ns early", at - now);
            assert!(!a.armed());
        }
        // Disarmed, it does not fire.
        a.set(Some(monotonic_ns() + 200_000)).unwrap();
        a.set(None).unwrap();
        let slept = tokio::time::timeout(std::time::Duration::from_millis(5), a.fired()).await;
        assert!(slept.is_err(), "a disarmed alarm fired");
    }
}
