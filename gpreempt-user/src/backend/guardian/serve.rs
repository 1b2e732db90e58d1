//! The guardian loop ([`serve`]): the controller's lines and silences ([`Source`]), the heartbeat
//! lease, and stdin with SIGTERM as its end.

use std::{
    io::{BufRead, Write},
    os::fd::AsFd,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::signalfd::SignalFd,
};

use super::{holds::Guardian, say::say, targets::Targets};

/// How long the guardian waits for a line when no lease is due sooner: exited targets are reaped
/// at least this often.
const TICK: Duration = Duration::from_secs(1);

/// Extra time before the controller's first line is due.
pub const STARTUP: Duration = Duration::from_secs(20);
/// A controller to kill on expiry that is silent but running (not stopped) is slow, not
/// stopped: on a loaded host its heartbeat can miss a short lease. It is killed only after this
/// much silence; a stopped one still at the lease.
pub const SLOW_LEASE: Duration = Duration::from_secs(10);
/// How often an overdue lease is looked at again while the controller is slow.
const SLOW_POLL: Duration = Duration::from_millis(100);

/// What [`serve`] reads from the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A line, without its newline (empty: a heartbeat).
    Line(String),
    /// No line within the wait.
    Idle,
    /// EOF, SIGTERM, a read error or an unterminated last line: the controller's end.
    End,
}

/// The controller's lines and silences, on a clock of its own (injectable for tests).
pub trait Source {
    /// The next line, or [`Event::Idle`] once `wait` passed without one.
    fn next(&mut self, wait: Duration) -> Event;
    /// The clock `wait` and the lease are measured on.
    fn now(&self) -> Instant;
}

const TORN: &str = "ignoring an unterminated last request";

fn text(line: &[u8]) -> String {
    String::from_utf8_lossy(line)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

/// A blocking reader (a script of requests): never idle.
impl<R: BufRead> Source for R {
    fn next(&mut self, _wait: Duration) -> Event {
        let mut line = Vec::new();
        match self.read_until(b'\n', &mut line) {
            Ok(0) => Event::End,
            Ok(_) if line.last() != Some(&b'\n') => {
                // The controller died mid-request: it had no `ok`, so it paused nothing for it.
                say(TORN);
                Event::End
            }
            Ok(_) => Event::Line(text(&line)),
            Err(e) => {
                say(&format!(
                    "reading requests: {e}; taking it as the controller's end"
                ));
                Event::End
            }
        }
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The heartbeat lease: due `lease` after the controller's last line; once it has run out it
/// stays quiet until the next line re-arms it. Before the first line it is due [`STARTUP`]
/// later: the controller's start-up (loading eBPF programs, BTF, a self-test) may take longer
/// than a lease, but a controller stopped during it is still caught.
#[derive(Debug)]
struct Lease {
    lease: Duration,
    last: Instant,
    armed: bool,
    /// Said already that this silence is a running controller's.
    said_slow: bool,
}

impl Lease {
    fn new(lease: Duration, now: Instant) -> Self {
        Self {
            lease,
            last: now + STARTUP,
            armed: true,
            said_slow: false,
        }
    }

    fn due(&self) -> Option<Instant> {
        self.last.checked_add(self.lease).filter(|_| self.armed)
    }

    fn renew(&mut self, now: Instant) {
        self.last = now;
        self.armed = true;
        self.said_slow = false;
    }

    /// How long to wait for a line: until it is due (so expiry is seen on time), at most a TICK;
    /// a little while once overdue (a slow controller is looked at again).
    fn wait(&self, now: Instant) -> Duration {
        self.due()
            .map_or(TICK, |d| match d.checked_duration_since(now) {
                Some(left) if !left.is_zero() => left.min(TICK),
                _ => SLOW_POLL,
            })
    }

    /// The silence, when the lease ran out by `now`.
    fn overdue(&self, now: Instant) -> Option<Duration> {
        self.due()
            .filter(|&d| now >= d)
            .map(|_| now.saturating_duration_since(self.last))
    }
}

/// The guardian loop: requests from `input` until its end, replies to `output`, then
/// [`Guardian::shutdown`]. Exited targets are reaped on every line and every idle wait. With a
/// `lease`, a controller silent that long gets everything held resumed ([`Guardian::resume_held`])
/// once per silence. Returns shutdown's verdict.
pub fn serve<S: Source, W: Write, T: Targets>(
    mut input: S,
    mut output: W,
    g: &mut Guardian<T>,
    lease: Option<Duration>,
) -> bool {
    let mut lease = lease
        .filter(|l| !l.is_zero())
        .map(|l| Lease::new(l, input.now()));
    loop {
        let wait = lease.as_ref().map_or(TICK, |l| l.wait(input.now()));
        match input.next(wait) {
            Event::End => break,
            Event::Idle => {
                g.reap();
                let now = input.now();
                if let Some(l) = lease.as_mut() {
                    if let Some(silent) = l.overdue(now) {
                        // One read of the controller's state: the verdict and the log line.
                        let state = g.controller_state();
                        match overdue(silent, state) {
                            Overdue::Exiting(c) => {
                                // Killed and not yet gone (threads still leaving the driver):
                                // put back what it held; there is nothing left to kill.
                                l.armed = false;
                                g.resume_held(&format!(
                                    "controller exiting (state {c}, no heartbeat for {} ms)",
                                    silent.as_millis()
                                ));
                                say(&format!(
                                    "the controller is exiting (state {c}): put back what it held"
                                ));
                            }
                            Overdue::Slow => {
                                if !l.said_slow {
                                    l.said_slow = true;
                                    say(&format!(
                                        "no heartbeat for {} ms, but the controller is running \
                                         (not stopped): it gets up to {} s",
                                        silent.as_millis(),
                                        SLOW_LEASE.as_secs()
                                    ));
                                }
                            }
                            Overdue::Expired => {
                                l.armed = false;
                                g.expired(&format!(
                                    "controller silent for {} ms (state {})",
                                    silent.as_millis(),
                                    state.unwrap_or('?')
                                ));
                            }
                        }
                    }
                }
            }
            Event::Line(req) => {
                g.reap();
                let req = req.trim();
                if !req.is_empty() {
                    let reply = g.handle(req);
                    // A failed write: the controller is gone, and EOF follows.
                    let _ = writeln!(output, "{reply}").and_then(|_| output.flush());
                }
                // After the reply: a controller waiting for it cannot beat meanwhile.
                let now = input.now();
                if let Some(l) = lease.as_mut() {
                    l.renew(now);
                }
            }
        }
    }
    g.shutdown()
}

/// What an overdue lease means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Overdue {
    /// The controller was killed and is not gone yet (state Z or X): put back, no kill.
    Exiting(char),
    /// Running, sleeping or waiting, and silent for less than [`SLOW_LEASE`]: slowness.
    Slow,
    /// Stopped, unreadable, or silent too long: put back and kill.
    Expired,
}

/// The verdict on a controller silent for `silent` past its lease, in `state`
/// (`/proc/PID/stat`'s letter; None: unreadable).
pub(super) fn overdue(silent: Duration, state: Option<char>) -> Overdue {
    match state {
        Some(c) if super::stopper::is_exiting(c) => Overdue::Exiting(c),
        Some(c) if silent < SLOW_LEASE && super::stopper::is_running(c) => Overdue::Slow,
        _ => Overdue::Expired,
    }
}

/// Milliseconds for poll, rounded up (a wait never ends early), capped.
fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_nanos().div_ceil(1_000_000).min(u16::MAX as u128) as u16;
    PollTimeout::from(ms)
}

/// The guardian's stdin (`fd`) for [`serve`]: SIGTERM reads as its end.
pub(super) struct Input<F> {
    sigterm: SignalFd,
    fd: F,
    buf: Vec<u8>,
}

impl<F: AsFd> Input<F> {
    pub(super) fn new(sigterm: SignalFd, fd: F) -> Self {
        Self {
            sigterm,
            fd,
            buf: Vec::new(),
        }
    }
}

impl<F: AsFd> Source for Input<F> {
    fn next(&mut self, wait: Duration) -> Event {
        let deadline = Instant::now().checked_add(wait);
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Event::Line(text(&line));
            }
            // Polled even when nothing is left of the wait: a line already sent is no silence.
            let left = deadline.map_or(TICK, |d| d.saturating_duration_since(Instant::now()));
            let mut fds = [
                PollFd::new(self.sigterm.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.fd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, poll_timeout(left)) {
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    say(&format!(
                        "polling for requests: {}; taking it as the controller's end",
                        e.desc()
                    ));
                    return Event::End;
                }
                Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => return Event::Idle,
                Ok(0) => continue,
                Ok(_) => {}
            }
            if fds[0].any() == Some(true) {
                let _ = self.sigterm.read_signal();
                say("SIGTERM");
                return Event::End;
            }
            if fds[1].any() != Some(false) {
                let mut chunk = [0u8; 4096];
                match nix::unistd::read(self.fd.as_fd(), &mut chunk) {
                    Err(Errno::EINTR | Errno::EAGAIN) => continue,
                    Err(e) => {
                        say(&format!(
                            "reading requests: {}; taking it as the controller's end",
                            e.desc()
                        ));
                        return Event::End;
                    }
                    Ok(0) => {
                        if !self.buf.is_empty() {
                            // As for a blocking reader: it paused nothing for a torn request.
                            say(TORN);
                        }
                        return Event::End;
                    }
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}
