//! systemd's readiness protocol (`sd_notify`): under `Type=notify` the unit is active only once
//! the controller says `READY=1`, which it does after its start-up self-test, with its control
//! socket up. Around a SIGHUP reload it says `RELOADING=1` then `READY=1`, `STOPPING=1` when it
//! begins to restore everything, and, with `WatchdogSec=`, `WATCHDOG=1` from the main loop at half
//! the interval systemd asks for, so a loop that stops turning gets the service restarted.
//!
//! The protocol is one datagram per state change to the socket `$NOTIFY_SOCKET` names (a path, or
//! an abstract name written with a leading `@`), `KEY=VALUE` lines. Written here with std's
//! `UnixDatagram` (no libsystemd): without `$NOTIFY_SOCKET` (started by hand, or in a pod) every
//! call does nothing. A failed send is logged once and never fails the controller.

use std::{
    os::unix::net::{SocketAddr, UnixDatagram},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// Where the messages go: `$NOTIFY_SOCKET`, as systemd writes it.
pub fn parse_address(s: &str) -> Result<SocketAddr> {
    if let Some(name) = s.strip_prefix('@') {
        // Abstract names: '@' stands for the leading NUL byte.
        use std::os::linux::net::SocketAddrExt as _;
        return SocketAddr::from_abstract_name(name.as_bytes())
            .with_context(|| format!("NOTIFY_SOCKET {s:?}: not a valid abstract socket name"));
    }
    if !s.starts_with('/') {
        bail!("NOTIFY_SOCKET {s:?}: neither an absolute path nor an abstract name (@...)");
    }
    SocketAddr::from_pathname(s).with_context(|| format!("NOTIFY_SOCKET {s:?}"))
}

/// One state change, as the datagram's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Start-up done (self-tested, socket up).
    Ready { status: &'a str },
    /// A reload began; `monotonic_us` is CLOCK_MONOTONIC in µs (systemd 253 wants it).
    Reloading { monotonic_us: u64 },
    /// Restoring everything before the exit.
    Stopping { status: &'a str },
    /// The loop still turns.
    Watchdog,
    /// Start-up will take longer (a busy host delays the self-test): this much more from now.
    ExtendTimeout { by: Duration },
    /// A line for `systemctl status`.
    Status(&'a str),
}

/// A status line fit for one `STATUS=` field: no newline can start a field of its own.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

impl Message<'_> {
    pub fn text(&self) -> String {
        match self {
            Message::Ready { status } => format!("READY=1\nSTATUS={}\n", one_line(status)),
            Message::Reloading { monotonic_us } => {
                format!("RELOADING=1\nMONOTONIC_USEC={monotonic_us}\nSTATUS=reloading the policy\n")
            }
            Message::Stopping { status } => {
                format!("STOPPING=1\nSTATUS={}\n", one_line(status))
            }
            Message::Watchdog => "WATCHDOG=1\n".into(),
            Message::ExtendTimeout { by } => {
                format!("EXTEND_TIMEOUT_USEC={}\n", by.as_micros())
            }
            Message::Status(s) => format!("STATUS={}\n", one_line(s)),
        }
    }
}

/// The watchdog interval systemd asks this process for: `$WATCHDOG_USEC`, when `$WATCHDOG_PID`
/// (if set) names this process. None: no watchdog (unset, 0, malformed, or another process's).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(p) = pid {
        if p.trim().parse::<u32>().ok()? != me {
            return None;
        }
    }
    let us: u64 = usec?.trim().parse().ok()?;
    (us > 0).then(|| Duration::from_micros(us))
}

/// When to say `WATCHDOG=1`: at half systemd's interval (its own advice), so one late turn of the
/// loop does not cost the service.
#[derive(Debug)]
pub struct Pacer {
    every: Duration,
    last: Option<Instant>,
}

impl Pacer {
    pub fn new(interval: Duration) -> Self {
        Self {
            every: interval / 2,
            last: None,
        }
    }

    /// Whether a ping is due at `now` (the first one at once); a true answer counts as sent.
    pub fn due(&mut self, now: Instant) -> bool {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => false,
            _ => {
                self.last = Some(now);
                true
            }
        }
    }
}

/// The sender; inert where systemd did not ask for notifications.
#[derive(Debug, Default)]
pub struct Notifier {
    to: Option<(UnixDatagram, SocketAddr)>,
    pacer: Option<Pacer>,
    warned: bool,
}

impl Notifier {
    /// From this process's environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`).
    pub fn from_env() -> Self {
        let var = |k| std::env::var(k).ok();
        let Some(addr) = var("NOTIFY_SOCKET") else {
            return Self::default();
        };
        let watchdog = watchdog_interval(
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        );
        match Self::to(&addr, watchdog) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("systemd notifications off: {e:#}");
                Self::default()
            }
        }
    }

    /// Sends to `addr` (a `$NOTIFY_SOCKET` value); `watchdog`: the interval to keep.
    pub fn to(addr: &str, watchdog: Option<Duration>) -> Result<Self> {
        let addr = parse_address(addr)?;
        let sock = UnixDatagram::unbound().context("making a datagram socket")?;
        if let Some(w) = watchdog {
            log::info!(
                "systemd watchdog: every {} ms, pinged at half that",
                w.as_millis()
            );
        }
        Ok(Self {
            to: Some((sock, addr)),
            pacer: watchdog.map(Pacer::new),
            warned: false,
        })
    }

    pub fn send(&mut self, m: &Message) {
        let Some((sock, addr)) = &self.to else {
            return;
        };
        if let Err(e) = sock.send_to_addr(m.text().as_bytes(), addr) {
            if !std::mem::replace(&mut self.warned, true) {
                log::warn!("systemd notification {m:?} not sent: {e}");
            }
        }
    }

    /// Called as the loop turns: `WATCHDOG=1` when one is due.
    pub fn alive(&mut self, now: Instant) {
        if self.pacer.as_mut().is_some_and(|p| p.due(now)) {
            self.send(&Message::Watchdog);
        }
    }
}

#[cfg(test)]
mod tests;
