//! The guardian: nothing in the NVIDIA driver resumes channels that a dead controller paused
//! (unlike KFD, which drops the debug trap with the debugger's mm), so a separate process does.
//!
//! The controller spawns `gpreempt-ebpf nv-guardian --journal PATH` ([`GuardianHandle::spawn`])
//! with a pipe as its stdin, in its own process group (a Ctrl-C to the controller's group does
//! not reach it; it also ignores SIGINT/SIGHUP/SIGQUIT). Protocol, one JSON line per request,
//! one reply line (`ok` or `err <reason>`) per request, `ready` once at start:
//!
//! - `{"op":"hold","pid":P,"fd":F,"h_client":C,"h_subdevice":S,"channels":[..]}` before a pause:
//!   the guardian takes its own duplicate of the target's fd, resumes the listed channels once
//!   through it (they are running: this proves it can undo the pause), journals the entry
//!   (fsync) and replies `ok`. Only then may the controller pause. A repeated hold of the same
//!   (pid, client, subdevice) adds channels.
//! - `{"op":"release","pid":P,"h_client":C}` after the resume: the entries go (journal
//!   rewritten) and so do the duplicates. A hold may also span many pause/resume cycles:
//!   resuming channels that run is harmless.
//! - An empty line is a heartbeat, with no reply. EOF catches a controller that dies, not one
//!   that hangs (its event loop stuck) with channels paused and its stdin still open. With
//!   `--lease-ms N` ([`GuardianHandle::spawn_with_lease`]) the controller owes a line (a request
//!   or [`GuardianHandle::beat`]) at least every N ms; after a longer silence the guardian resumes
//!   everything held, once until the next line, but keeps the holds and the journal: a
//!   controller that wakes up carries on with them (and may pause again).
//!
//! On EOF of stdin (the controller exited or was killed, any way) or SIGTERM, it resumes every
//! held entry through its own duplicates, says so on stderr, empties the journal and exits (0 if
//! everything was resumed). A target that exits is dropped at once: our duplicate of its fd
//! would keep its RM client, and so its GPU memory, alive. If the guardian itself dies, the
//! journal remains: [`recover`] (and every guardian at start) resumes what it lists.

use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io::{self, BufRead, Read, Write},
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use gpreempt_common::nv;
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::{
        signal::{SigHandler, SigSet, Signal},
        signalfd::{SfdFlags, SignalFd},
    },
};
use serde::{Deserialize, Serialize};

use super::rm::{self as control, Channels};

/// `gpreempt-ebpf nv-guardian` (hidden; started by the controller).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The re-enable journal (in the run dir; the controller names it).
    #[arg(long, value_name = "FILE")]
    pub journal: PathBuf,
    /// Resume what is held when the controller sends no line for this long (0: no lease).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub lease_ms: u64,
}

/// Channels of one client of one target that the controller is about to pause: where to find
/// the target's nvidiactl file (`pid`, `fd`) and what to resume through it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldEntry {
    pub pid: u32,
    pub fd: i32,
    pub h_client: u32,
    pub h_subdevice: u32,
    pub channels: Vec<u32>,
}

impl HoldEntry {
    fn key(&self) -> (u32, u32, u32) {
        (self.pid, self.h_client, self.h_subdevice)
    }

    pub fn to_channels(&self) -> Channels {
        Channels {
            h_client: self.h_client,
            h_subdevice: self.h_subdevice,
            channels: self.channels.clone(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} channel(s) of pid {} (fd {}, client {:#x}, subdevice {:#x})",
            self.channels.len(),
            self.pid,
            self.fd,
            self.h_client,
            self.h_subdevice
        )
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Hold(HoldEntry),
    Release { pid: u32, h_client: u32 },
}

fn say(msg: &str) {
    eprintln!("gpreempt-ebpf nv-guardian: {msg}");
}

/// One line, for a reply.
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace(['\n', '\r'], " ")
}

/// The journal: one [`HoldEntry`] per line (JSON). Appended (fsync) on hold, rewritten
/// atomically (rename) on release; a later line for the same (pid, client, subdevice) replaces an
/// earlier one. `<path>.lock` (flock) is held by the guardian that owns it.
#[derive(Clone, Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sibling(&self, suffix: &str) -> PathBuf {
        let mut s = OsString::from(self.path.as_os_str());
        s.push(suffix);
        PathBuf::from(s)
    }

    /// Exclusive ownership; fails while a live guardian owns the journal. Released with the
    /// returned lock, or when its holder dies.
    pub fn lock(&self) -> Result<Flock<File>> {
        let path = self.sibling(".lock");
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            Errno::EWOULDBLOCK => anyhow!(
                "a live guardian owns {} (it resumes what it holds when its controller goes)",
                self.path.display()
            ),
            e => anyhow!("locking {}: {}", path.display(), e.desc()),
        })
    }

    /// The entries (none when the file does not exist). An unreadable line (a write torn by a
    /// crash) is skipped with a warning.
    pub fn read(&self) -> Result<Vec<HoldEntry>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        let mut out: Vec<HoldEntry> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<HoldEntry>(line) {
                Ok(e) => match out.iter_mut().find(|o| o.key() == e.key()) {
                    Some(o) => *o = e,
                    None => out.push(e),
                },
                Err(err) => log::warn!(
                    "{}:{}: unreadable entry skipped: {err}",
                    self.path.display(),
                    n + 1
                ),
            }
        }
        Ok(out)
    }

    /// Appends `e`, durably.
    pub fn append(&self, e: &HoldEntry) -> Result<()> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        f.write_all(&line)
            .and_then(|_| f.sync_data())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Replaces the contents with `entries`, atomically and durably.
    pub fn rewrite(&self, entries: &[HoldEntry]) -> Result<()> {
        let tmp = self.sibling(".tmp");
        let mut text = Vec::new();
        for e in entries {
            serde_json::to_writer(&mut text, e)?;
            text.push(b'\n');
        }
        let write = || -> io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            let dir = match self.path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            File::open(dir)?.sync_all()
        };
        write().with_context(|| format!("rewriting {}", self.path.display()))
    }
}

/// What the guardian needs from the system, injectable for tests.
pub trait Targets {
    /// The guardian's own hold on a target's fd.
    type Dup;
    /// Duplicates the target's fd ([`control::dup_fd`]).
    fn dup(&mut self, pid: u32, fd: i32) -> Result<Self::Dup>;
    /// Resumes `e`'s channels through `dup`.
    fn enable(&mut self, dup: &Self::Dup, e: &HoldEntry) -> Result<()>;
    /// Whether the target behind `dup` has exited.
    fn exited(&mut self, dup: &Self::Dup) -> bool;
}

/// The real system: pidfds and RM controls.
pub struct Rm;

/// A target's pidfd (to see it exit; it never names another process) and our duplicate of its
/// nvidiactl fd.
pub struct TargetFd {
    pub pidfd: OwnedFd,
    pub fd: OwnedFd,
}

impl Targets for Rm {
    type Dup = TargetFd;

    fn dup(&mut self, pid: u32, fd: i32) -> Result<TargetFd> {
        let pidfd = control::pidfd_open(pid)?;
        let fd = control::getfd(pidfd.as_fd(), pid, fd)?;
        Ok(TargetFd { pidfd, fd })
    }

    fn enable(&mut self, dup: &TargetFd, e: &HoldEntry) -> Result<()> {
        enable_entry(dup.fd.as_fd(), e)
    }

    fn exited(&mut self, dup: &TargetFd) -> bool {
        let mut fds = [PollFd::new(dup.pidfd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }
}

/// Resumes `e`'s channels. One handle the target has freed since makes the whole call fail, so
/// on failure the channels are retried one by one; a freed one (INVALID_CHANNEL) is not a
/// failure.
pub fn enable_entry(fd: BorrowedFd, e: &HoldEntry) -> Result<()> {
    let all = e.to_channels();
    let first = match control::set_disabled(fd, &all, false) {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let whole_client = matches!(
        control::nv_status(&first),
        None | Some(nv::status::INVALID_CLIENT | nv::status::NOT_SUPPORTED)
    );
    if all.channels.len() <= 1 || whole_client {
        return Err(first);
    }
    let failed: Vec<u32> = all
        .channels
        .iter()
        .copied()
        .filter(|&c| {
            let one = Channels {
                channels: vec![c],
                ..all.clone()
            };
            match control::set_disabled(fd, &one, false) {
                Ok(_) => false,
                Err(e) => control::nv_status(&e) != Some(nv::status::INVALID_CHANNEL),
            }
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(first.context(format!("channel(s) {failed:#x?} not resumed")))
    }
}

/// Outcome of resuming one entry left in a journal: resumed, or nothing left to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovered {
    Resumed,
    Gone,
}

/// Resumes a journal entry with a fresh duplicate. A target that exited, closed the fd, or whose
/// fd no longer holds the client (a reused pid or fd) has nothing left paused that we could
/// reach: `Gone`.
fn recover_entry<T: Targets>(t: &mut T, e: &HoldEntry) -> Result<Recovered> {
    let dup = match t.dup(e.pid, e.fd) {
        Ok(d) => d,
        Err(err) if control::is_gone(&err) => return Ok(Recovered::Gone),
        Err(err) => return Err(err),
    };
    match t.enable(&dup, e) {
        Ok(()) => Ok(Recovered::Resumed),
        Err(err) if control::nv_status(&err) == Some(nv::status::INVALID_CLIENT) => {
            Ok(Recovered::Gone)
        }
        Err(err) => Err(err),
    }
}

/// Resumes every entry of an unlocked journal; keeps the entries that failed in it.
fn recover_with<T: Targets>(j: &Journal, t: &mut T) -> Vec<(HoldEntry, Result<()>)> {
    let entries = match j.read() {
        Ok(e) => e,
        Err(e) => {
            log::warn!("{e:#}");
            return vec![];
        }
    };
    if entries.is_empty() {
        return vec![];
    }
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for e in entries {
        let r = match recover_entry(t, &e) {
            Ok(Recovered::Resumed) => {
                say(&format!(
                    "left by a dead guardian, resumed {}",
                    e.describe()
                ));
                Ok(())
            }
            Ok(Recovered::Gone) => {
                say(&format!(
                    "left by a dead guardian: {}: the process or its client is gone",
                    e.describe()
                ));
                Ok(())
            }
            Err(err) => {
                say(&format!(
                    "left by a dead guardian: could not resume {}: {err:#}",
                    e.describe()
                ));
                failed.push(e.clone());
                Err(err)
            }
        };
        out.push((e, r));
    }
    if let Err(e) = j.rewrite(&failed) {
        log::warn!("{e:#}");
    }
    out
}

/// For a next controller: resumes every entry of a journal left by a guardian that died (a
/// fresh duplicate of each fd; processes that are gone are skipped, with `Ok`). Entries that
/// could not be resumed stay in the journal. Nothing happens while a live guardian owns it.
pub fn recover(journal: &Path) -> Vec<(HoldEntry, Result<()>)> {
    let j = Journal::new(journal);
    let _lock = match j.lock() {
        Ok(l) => l,
        Err(e) => {
            log::warn!("not recovering: {e:#}");
            return vec![];
        }
    };
    recover_with(&j, &mut Rm)
}

/// The guardian's state: what it holds, each with its own duplicate of the target's fd.
pub struct Guardian<T: Targets> {
    targets: T,
    journal: Journal,
    held: Vec<(HoldEntry, T::Dup)>,
    /// Entries a previous guardian left that could not be resumed: kept in the journal.
    stale: Vec<HoldEntry>,
}

impl<T: Targets> Guardian<T> {
    /// Takes over `journal` (its owner must hold its lock): leftovers are resumed first.
    pub fn new(mut targets: T, journal: Journal) -> Result<Self> {
        let stale = recover_with(&journal, &mut targets)
            .into_iter()
            .filter(|(_, r)| r.is_err())
            .map(|(e, _)| e)
            .collect::<Vec<_>>();
        journal.rewrite(&stale)?;
        Ok(Self {
            targets,
            journal,
            held: Vec::new(),
            stale,
        })
    }

    /// What is held now.
    pub fn held(&self) -> impl Iterator<Item = &HoldEntry> {
        self.held.iter().map(|(e, _)| e)
    }

    fn entries(&self) -> Vec<HoldEntry> {
        self.stale
            .iter()
            .cloned()
            .chain(self.held().cloned())
            .collect()
    }

    /// One request line; the reply line (without its newline).
    pub fn handle(&mut self, line: &str) -> String {
        let r = serde_json::from_str::<Request>(line)
            .context("unreadable request")
            .and_then(|req| match req {
                Request::Hold(e) => self.hold(e),
                Request::Release { pid, h_client } => self.release(pid, h_client),
            });
        match r {
            Ok(()) => "ok".into(),
            Err(e) => format!("err {}", one_line(&e)),
        }
    }

    fn hold(&mut self, mut e: HoldEntry) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        e.channels.retain(|c| seen.insert(*c));
        let dup = self.targets.dup(e.pid, e.fd)?;
        let at = self.held.iter().position(|(h, _)| h.key() == e.key());
        let old: &[u32] = at.map_or(&[], |i| &self.held[i].0.channels);
        let new: Vec<u32> = e
            .channels
            .iter()
            .copied()
            .filter(|c| !old.contains(c))
            .collect();
        let merged = HoldEntry {
            channels: old.iter().copied().chain(new.iter().copied()).collect(),
            ..e.clone()
        };
        if !new.is_empty() {
            // They are running (the controller pauses after our `ok`): resuming them is a no-op
            // that proves our duplicate reaches them.
            let probe = HoldEntry { channels: new, ..e };
            self.targets
                .enable(&dup, &probe)
                .context("the guardian could not resume these channels itself")?;
        }
        self.journal.append(&merged)?;
        match at {
            Some(i) => self.held[i] = (merged, dup),
            None => self.held.push((merged, dup)),
        }
        Ok(())
    }

    fn release(&mut self, pid: u32, h_client: u32) -> Result<()> {
        let before = self.held.len();
        self.held
            .retain(|(h, _)| !(h.pid == pid && h.h_client == h_client));
        if self.held.len() != before {
            self.journal.rewrite(&self.entries())?;
        }
        Ok(())
    }

    /// Drops what exited targets held: our duplicate would keep their RM client alive.
    pub fn reap(&mut self) {
        let before = self.held.len();
        let targets = &mut self.targets;
        self.held.retain(|(h, d)| {
            let gone = targets.exited(d);
            if gone {
                say(&format!("pid {} exited; dropped {}", h.pid, h.describe()));
            }
            !gone
        });
        if self.held.len() != before {
            if let Err(e) = self.journal.rewrite(&self.entries()) {
                say(&format!("{e:#}"));
            }
        }
    }

    /// The controller is alive but silent (its lease ran out): resume everything held, as
    /// [`Self::shutdown`] does, but keep holding it, journaled: it may recover and carry on.
    /// True when everything held was resumed.
    pub fn resume_held(&mut self, why: &str) -> bool {
        let mut all = true;
        for (e, dup) in &self.held {
            if self.targets.exited(dup) {
                continue; // the next reap drops it
            }
            match self.targets.enable(dup, e) {
                Ok(()) => say(&format!("{why}: resumed {}", e.describe())),
                Err(err) => {
                    say(&format!(
                        "{why}: could not resume {}: {err:#}",
                        e.describe()
                    ));
                    all = false;
                }
            }
        }
        all
    }

    /// The controller is gone: resume everything held (and the stale leftovers), empty the
    /// journal of what succeeded. True when nothing is left paused that we know of.
    pub fn shutdown(&mut self) -> bool {
        let mut failed = Vec::new();
        for (e, dup) in std::mem::take(&mut self.held) {
            if self.targets.exited(&dup) {
                say(&format!("pid {} exited; nothing to resume", e.pid));
                continue;
            }
            match self.targets.enable(&dup, &e) {
                Ok(()) => say(&format!("controller gone: resumed {}", e.describe())),
                Err(err) => {
                    say(&format!("could not resume {}: {err:#}", e.describe()));
                    failed.push(e);
                }
            }
        }
        for e in std::mem::take(&mut self.stale) {
            match recover_entry(&mut self.targets, &e) {
                Ok(_) => say(&format!("resumed (or gone) {}", e.describe())),
                Err(err) => {
                    say(&format!("still could not resume {}: {err:#}", e.describe()));
                    failed.push(e);
                }
            }
        }
        if let Err(e) = self.journal.rewrite(&failed) {
            say(&format!("{e:#}"));
            return false;
        }
        failed.is_empty()
    }
}

/// How long the guardian waits for a line when no lease is due sooner: exited targets are reaped
/// at least this often.
const TICK: Duration = Duration::from_secs(1);

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
/// stays quiet until the next line re-arms it.
#[derive(Debug)]
struct Lease {
    lease: Duration,
    last: Instant,
    armed: bool,
}

impl Lease {
    fn new(lease: Duration, now: Instant) -> Self {
        Self {
            lease,
            last: now,
            armed: true,
        }
    }

    fn due(&self) -> Option<Instant> {
        self.last.checked_add(self.lease).filter(|_| self.armed)
    }

    fn renew(&mut self, now: Instant) {
        self.last = now;
        self.armed = true;
    }

    /// How long to wait for a line: until it is due (so expiry is seen on time), at most a TICK.
    fn wait(&self, now: Instant) -> Duration {
        self.due()
            .map_or(TICK, |d| d.saturating_duration_since(now).min(TICK))
    }

    /// The silence, when the lease ran out by `now` (it is disarmed then).
    fn expire(&mut self, now: Instant) -> Option<Duration> {
        let silent = self.due().filter(|&d| now >= d).map(|_| now - self.last)?;
        self.armed = false;
        Some(silent)
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
                if let Some(silent) = lease.as_mut().and_then(|l| l.expire(now)) {
                    g.resume_held(&format!("controller silent for {} ms", silent.as_millis()));
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

/// Milliseconds for poll, rounded up (a wait never ends early), capped.
fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_nanos().div_ceil(1_000_000).min(u16::MAX as u128) as u16;
    PollTimeout::from(ms)
}

/// The guardian's stdin (`fd`) for [`serve`]: SIGTERM reads as its end.
struct Input<F> {
    sigterm: SignalFd,
    fd: F,
    buf: Vec<u8>,
}

impl<F: AsFd> Input<F> {
    fn new(sigterm: SignalFd, fd: F) -> Self {
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

/// `gpreempt-ebpf nv-guardian --journal PATH [--lease-ms N]`.
pub fn main(args: &Args) -> Result<ExitCode> {
    for s in [Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT] {
        // SAFETY: SIG_IGN installs no handler code; nothing else in this process handles these.
        unsafe { nix::sys::signal::signal(s, SigHandler::SigIgn) }
            .with_context(|| format!("ignoring {s}"))?;
    }
    // Out of the controller's session too, when not already a group leader (spawn makes us one).
    let _ = nix::unistd::setsid();
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.thread_block().context("blocking SIGTERM")?;
    let sigterm = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).context("signalfd")?;

    let mut out = io::stdout().lock();
    let journal = Journal::new(&args.journal);
    let started = journal
        .lock()
        .and_then(|lock| Ok((lock, Guardian::new(Rm, journal.clone())?)));
    let (_lock, mut g) = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(out, "err {}", one_line(&e)).and_then(|_| out.flush());
            return Err(e);
        }
    };
    writeln!(out, "ready")
        .and_then(|_| out.flush())
        .context("answering the controller")?;
    let lease = (args.lease_ms > 0).then(|| Duration::from_millis(args.lease_ms));
    Ok(
        if serve(Input::new(sigterm, io::stdin()), out, &mut g, lease) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// The controller's side of a guardian.
pub struct GuardianHandle {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    buf: Vec<u8>,
    /// How long a round trip may take (a hold fsyncs the journal).
    pub timeout: Duration,
    /// After a lost reply the stream cannot be trusted: every later call fails.
    broken: Option<String>,
    lease: Option<Duration>,
}

impl GuardianHandle {
    pub const TIMEOUT: Duration = Duration::from_secs(5);

    /// Starts `exe nv-guardian --journal journal` in its own process group and waits for it to be
    /// ready (it first resumes whatever a dead predecessor left in the journal).
    pub fn spawn(exe: &Path, journal: &Path) -> Result<Self> {
        Self::spawn_with_lease(exe, journal, None)
    }

    /// [`Self::spawn`], with a heartbeat lease (rounded up to whole ms; zero is none): from then
    /// on, send a line ([`Self::beat`] or a request) more often than `lease`, or what the
    /// guardian holds is resumed.
    pub fn spawn_with_lease(exe: &Path, journal: &Path, lease: Option<Duration>) -> Result<Self> {
        let lease_ms = lease.map_or(0, |l| {
            u64::try_from(l.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        let mut cmd = Command::new(exe);
        cmd.arg("nv-guardian").arg("--journal").arg(journal);
        if lease_ms > 0 {
            cmd.arg("--lease-ms").arg(lease_ms.to_string());
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting the guardian ({})", exe.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the guardian's stdout")?;
        let mut h = Self {
            child,
            stdin,
            stdout,
            buf: Vec::new(),
            timeout: Self::TIMEOUT,
            broken: None,
            lease: (lease_ms > 0).then(|| Duration::from_millis(lease_ms)),
        };
        match h.read_reply(Duration::from_secs(30)) {
            Ok(r) if r == "ready" => Ok(h),
            Ok(r) => {
                let _ = h.child.wait();
                bail!(
                    "the guardian did not start: {}",
                    r.strip_prefix("err ").unwrap_or(&r)
                )
            }
            Err(e) => {
                // It holds nothing yet.
                let _ = h.child.kill();
                let _ = h.child.wait();
                Err(e.context("the guardian did not start"))
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The lease the guardian enforces, if any.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// A heartbeat: an empty line, which renews the lease and has no reply. It never waits on the
    /// guardian: a pipe too full to take it (a guardian that stopped reading) is an error, and
    /// like a write error it makes the handle unusable.
    pub fn beat(&mut self) -> Result<()> {
        if let Some(b) = &self.broken {
            bail!("the guardian is unusable: {b}");
        }
        let r = self.write_beat();
        if let Err(e) = &r {
            self.broken = Some(one_line(e));
        }
        r.context("guardian heartbeat")
    }

    fn write_beat(&mut self) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the guardian's stdin is closed")?;
        loop {
            let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLOUT)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Err(Errno::EINTR) => continue,
                Err(e) => bail!("poll: {}", e.desc()),
                Ok(0) => bail!("the guardian stopped reading its stdin (the pipe is full)"),
                Ok(_) => break,
            }
        }
        stdin
            .write_all(b"\n")
            .and_then(|_| stdin.flush())
            .map_err(|e| self.gone(e.into()))
    }

    /// Asks the guardian to vouch for `entry`; pause only after this returns Ok.
    pub fn hold(&mut self, entry: &HoldEntry) -> Result<()> {
        let line = serde_json::to_string(&Request::Hold(entry.clone()))?;
        self.request(&line)
            .with_context(|| format!("guardian hold of {}", entry.describe()))
    }

    /// Tells the guardian that `pid`'s client `h_client` is resumed (or gone).
    pub fn release(&mut self, pid: u32, h_client: u32) -> Result<()> {
        let line = serde_json::to_string(&Request::Release { pid, h_client })?;
        self.request(&line)
            .with_context(|| format!("guardian release of pid {pid} client {h_client:#x}"))
    }

    /// Closes its stdin (it resumes anything still held) and waits for it to exit.
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().context("waiting for the guardian")? {
                if st.success() {
                    return Ok(());
                }
                bail!("the guardian ended with {st} (its stderr says what it could not resume)");
            }
            if Instant::now() >= deadline {
                bail!("the guardian is still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn request(&mut self, line: &str) -> Result<()> {
        if let Some(b) = &self.broken {
            bail!("the guardian is unusable: {b}");
        }
        let r = self.round_trip(line);
        let reply = match r {
            Ok(r) => r,
            Err(e) => {
                self.broken = Some(one_line(&e));
                return Err(e);
            }
        };
        if reply == "ok" {
            Ok(())
        } else if let Some(why) = reply.strip_prefix("err ") {
            Err(anyhow!("{why}"))
        } else {
            self.broken = Some(format!("unexpected reply {reply:?}"));
            bail!("unexpected reply from the guardian: {reply:?}")
        }
    }

    fn round_trip(&mut self, line: &str) -> Result<String> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the guardian's stdin is closed")?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .map_err(|e| self.gone(e.into()))?;
        self.read_reply(self.timeout)
    }

    fn gone(&mut self, e: anyhow::Error) -> anyhow::Error {
        match self.child.try_wait() {
            Ok(Some(st)) => e.context(format!("the guardian exited ({st})")),
            _ => e.context("talking to the guardian"),
        }
    }

    fn read_reply(&mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line).trim().to_string());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the guardian did not answer within {timeout:?}");
            }
            let ms = left.as_millis().clamp(1, u16::MAX as u128) as u16;
            let mut fds = [PollFd::new(self.stdout.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(anyhow!("poll: {}", e.desc())),
                Ok(_) => {}
            }
            let mut chunk = [0u8; 512];
            match self.stdout.read(&mut chunk) {
                Ok(0) => {
                    let e = anyhow!("its stdout closed");
                    std::thread::sleep(Duration::from_millis(20));
                    return Err(self.gone(e));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.gone(e.into())),
            }
        }
    }
}

impl Drop for GuardianHandle {
    /// Closing its stdin is the "controller gone" signal: the guardian resumes what is still
    /// held and exits. It is not killed (that would defeat it).
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.try_wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{cell::RefCell, os::unix::fs::PermissionsExt as _, rc::Rc};

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gpreempt-nv-guardian-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entry(pid: u32, h_client: u32, channels: &[u32]) -> HoldEntry {
        HoldEntry {
            pid,
            fd: 5,
            h_client,
            h_subdevice: 0x5c00_0003,
            channels: channels.to_vec(),
        }
    }

    /// Records every enable; dups of pids in `bad` fail as "no ptrace rights", of `gone` as
    /// exited.
    #[derive(Clone, Default)]
    struct Fake {
        enabled: Rc<RefCell<Vec<HoldEntry>>>,
        bad: Vec<u32>,
        exited: Rc<RefCell<Vec<u32>>>,
    }

    impl Targets for Fake {
        type Dup = u32;
        fn dup(&mut self, pid: u32, fd: i32) -> Result<u32> {
            if self.bad.contains(&pid) {
                return Err(control::DupError {
                    errno: Errno::EPERM,
                    pid,
                    fd: Some(fd),
                }
                .into());
            }
            Ok(pid)
        }
        fn enable(&mut self, _: &u32, e: &HoldEntry) -> Result<()> {
            self.enabled.borrow_mut().push(e.clone());
            Ok(())
        }
        fn exited(&mut self, pid: &u32) -> bool {
            self.exited.borrow().contains(pid)
        }
    }

    fn hold_line(e: &HoldEntry) -> String {
        serde_json::to_string(&Request::Hold(e.clone())).unwrap()
    }

    #[test]
    fn request_wire_format() {
        let e = entry(7, 0xc1d0_0002, &[1, 2]);
        assert_eq!(
            hold_line(&e),
            r#"{"op":"hold","pid":7,"fd":5,"h_client":3251634178,"h_subdevice":1543503875,"channels":[1,2]}"#
        );
        let r = serde_json::to_string(&Request::Release {
            pid: 7,
            h_client: 9,
        })
        .unwrap();
        assert_eq!(r, r#"{"op":"release","pid":7,"h_client":9}"#);
    }

    #[test]
    fn journal_round_trip() {
        let d = tmpdir("journal");
        let j = Journal::new(&d.join("nv-journal"));
        assert!(j.read().unwrap().is_empty());
        let a = entry(1, 10, &[1, 2]);
        let b = entry(2, 20, &[3]);
        j.append(&a).unwrap();
        j.append(&b).unwrap();
        assert_eq!(j.read().unwrap(), vec![a.clone(), b.clone()]);
        // A later line for the same key replaces the earlier one, in place.
        let a2 = entry(1, 10, &[1, 2, 4]);
        j.append(&a2).unwrap();
        assert_eq!(j.read().unwrap(), vec![a2.clone(), b.clone()]);
        // A torn last line is skipped.
        OpenOptions::new()
            .append(true)
            .open(j.path())
            .unwrap()
            .write_all(b"{\"pid\":3,\"fd")
            .unwrap();
        assert_eq!(j.read().unwrap(), vec![a2.clone(), b.clone()]);
        j.rewrite(std::slice::from_ref(&b)).unwrap();
        assert_eq!(j.read().unwrap(), vec![b]);
        j.rewrite(&[]).unwrap();
        assert!(j.read().unwrap().is_empty());
        assert!(!d.join("nv-journal.tmp").exists());
        // One owner at a time.
        let l = j.lock().unwrap();
        assert!(j.lock().unwrap_err().to_string().contains("live guardian"));
        assert!(recover(j.path()).is_empty());
        drop(l);
        j.lock().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn hold_hold_release_then_eof_resumes_exactly_the_rest() {
        let d = tmpdir("serve");
        let j = Journal::new(&d.join("nv-journal"));
        let fake = Fake::default();
        let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
        let a = entry(100, 0xa, &[1, 2, 2]);
        let b = entry(200, 0xb, &[3]);
        let input = format!(
            "{}\n\n{}\n{}\n{{\"op\":\"release\",\"pid\":100,\"h_client\":10}}\nnonsense\n",
            hold_line(&a),
            hold_line(&b),
            hold_line(&entry(200, 0xb, &[3, 4])),
        );
        // Journal contents as seen by each reply: check state mid-way via a second guardian run.
        let mut out = Vec::new();
        assert!(serve(input.as_bytes(), &mut out, &mut g, None));
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[..4], &["ok", "ok", "ok", "ok"]);
        assert!(lines[4].starts_with("err unreadable request"), "{out}");
        assert_eq!(lines.len(), 5);
        let enabled = fake.enabled.borrow().clone();
        let b34 = entry(200, 0xb, &[3, 4]);
        assert_eq!(
            enabled,
            vec![
                entry(100, 0xa, &[1, 2]), // hold probe (deduplicated)
                b.clone(),                // hold probe
                entry(200, 0xb, &[4]),    // second hold: only the new channel is probed
                b34,                      // EOF: exactly the remaining entry
            ]
        );
        assert!(j.read().unwrap().is_empty());
        assert_eq!(std::fs::read_to_string(j.path()).unwrap(), "");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn journal_follows_holds_and_releases() {
        let d = tmpdir("follow");
        let j = Journal::new(&d.join("nv-journal"));
        let fake = Fake::default();
        let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
        let a = entry(100, 0xa, &[1]);
        let b = entry(200, 0xb, &[3]);
        assert_eq!(g.handle(&hold_line(&a)), "ok");
        assert_eq!(g.handle(&hold_line(&b)), "ok");
        assert_eq!(j.read().unwrap(), vec![a.clone(), b.clone()]);
        assert_eq!(
            g.handle(r#"{"op":"release","pid":100,"h_client":10}"#),
            "ok"
        );
        assert_eq!(j.read().unwrap(), vec![b.clone()]);
        // Releasing what is not held is fine.
        assert_eq!(g.handle(r#"{"op":"release","pid":9,"h_client":9}"#), "ok");
        // A target that exits is dropped (and not resumed at the end).
        fake.exited.borrow_mut().push(200);
        g.reap();
        assert!(j.read().unwrap().is_empty());
        assert_eq!(g.held().count(), 0);
        fake.enabled.borrow_mut().clear();
        assert!(g.shutdown());
        assert!(fake.enabled.borrow().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_hold_whose_dup_fails_is_refused_and_not_journaled() {
        let d = tmpdir("dupfail");
        let j = Journal::new(&d.join("nv-journal"));
        let fake = Fake {
            bad: vec![300],
            ..Default::default()
        };
        let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
        let input = format!("{}\n", hold_line(&entry(300, 0xc, &[1])));
        let mut out = Vec::new();
        assert!(serve(input.as_bytes(), &mut out, &mut g, None));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "err no ptrace rights over pid 300 (run as root; yama ptrace_scope)\n"
        );
        assert!(j.read().unwrap().is_empty());
        assert!(fake.enabled.borrow().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_unterminated_last_request_is_ignored() {
        let d = tmpdir("torn");
        let j = Journal::new(&d.join("nv-journal"));
        let fake = Fake::default();
        let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
        let input = hold_line(&entry(100, 0xa, &[1]));
        let mut out = Vec::new();
        assert!(serve(input.as_bytes(), &mut out, &mut g, None));
        assert!(out.is_empty());
        assert!(fake.enabled.borrow().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_new_guardian_resumes_leftovers_and_keeps_failures() {
        let d = tmpdir("leftover");
        let j = Journal::new(&d.join("nv-journal"));
        let ok = entry(100, 0xa, &[1]);
        let bad = entry(300, 0xc, &[2]);
        j.append(&ok).unwrap();
        j.append(&bad).unwrap();
        let fake = Fake {
            bad: vec![300],
            ..Default::default()
        };
        let mut g = Guardian::new(fake.clone(), j.clone()).unwrap();
        assert_eq!(*fake.enabled.borrow(), vec![ok.clone()]);
        assert_eq!(j.read().unwrap(), vec![bad.clone()]);
        // The stale entry stays journaled across our own rewrites, and is retried at the end.
        let c = entry(400, 0xd, &[5]);
        assert_eq!(g.handle(&hold_line(&c)), "ok");
        assert_eq!(
            g.handle(r#"{"op":"release","pid":400,"h_client":13}"#),
            "ok"
        );
        assert_eq!(j.read().unwrap(), vec![bad.clone()]);
        assert!(!g.shutdown());
        assert_eq!(j.read().unwrap(), vec![bad]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn recover_skips_gone_processes() {
        let d = tmpdir("recover");
        let j = Journal::new(&d.join("nv-journal"));
        // Beyond pid_max: gone.
        let e = entry(0x7fff_fff0, 0xa, &[1]);
        j.append(&e).unwrap();
        let r = recover(j.path());
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, e);
        assert!(r[0].1.is_ok());
        assert!(j.read().unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn script(d: &Path, body: &str) -> PathBuf {
        let p = d.join("fake-guardian");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn handle_round_trips_and_times_out() {
        let d = tmpdir("handle");
        let exe = script(
            &d,
            r#"echo ready
while read l; do case "$l" in *hold*) echo ok;; *) echo "err nope";; esac; done"#,
        );
        let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
        h.hold(&entry(1, 2, &[3])).unwrap();
        let e = h.release(1, 2).unwrap_err();
        assert!(format!("{e:#}").ends_with(": nope"), "{e:#}");
        h.hold(&entry(1, 2, &[3])).unwrap();
        h.shutdown(Duration::from_secs(5)).unwrap();

        let exe = script(&d, "echo ready; cat >/dev/null");
        let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
        h.timeout = Duration::from_millis(100);
        let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
        assert!(format!("{e:#}").contains("did not answer"), "{e:#}");
        let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
        assert!(format!("{e:#}").contains("unusable"), "{e:#}");
        h.shutdown(Duration::from_secs(5)).unwrap();

        let exe = script(&d, "echo 'err journal locked'; exit 1");
        let e = GuardianHandle::spawn(&exe, &d.join("j")).err().unwrap();
        assert_eq!(e.to_string(), "the guardian did not start: journal locked");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Lines at virtual times (ms from the start), then EOF. Each read records the virtual time,
    /// the wait asked for, how many enables so far, and the journal.
    struct Script {
        start: Instant,
        now: Instant,
        lines: std::collections::VecDeque<(u64, String)>,
        fake: Fake,
        journal: Journal,
        reads: Rc<RefCell<Vec<Seen>>>,
    }

    #[derive(Debug)]
    struct Seen {
        at: u64,
        wait: u64,
        enabled: usize,
        journal: Vec<HoldEntry>,
    }

    impl Source for Script {
        fn next(&mut self, wait: Duration) -> Event {
            self.reads.borrow_mut().push(Seen {
                at: (self.now - self.start).as_millis() as u64,
                wait: wait.as_millis() as u64,
                enabled: self.fake.enabled.borrow().len(),
                journal: self.journal.read().unwrap(),
            });
            let Some(&(at, _)) = self.lines.front() else {
                return Event::End;
            };
            let at = self.start + Duration::from_millis(at);
            if at <= self.now + wait {
                self.now = self.now.max(at);
                Event::Line(self.lines.pop_front().unwrap().1)
            } else {
                self.now += wait;
                Event::Idle
            }
        }

        fn now(&self) -> Instant {
            self.now
        }
    }

    struct Run {
        fake: Fake,
        journal: Journal,
        reads: Vec<Seen>,
        dir: PathBuf,
    }

    impl Run {
        /// (virtual ms, how many enables) for each event that enabled something.
        fn enables(&self) -> Vec<(u64, usize)> {
            self.reads
                .windows(2)
                .filter(|w| w[1].enabled > w[0].enabled)
                .map(|w| (w[1].at, w[1].enabled - w[0].enabled))
                .collect()
        }
    }

    fn run_script(name: &str, lease_ms: Option<u64>, lines: &[(u64, String)]) -> Run {
        let dir = tmpdir(name);
        let journal = Journal::new(&dir.join("nv-journal"));
        let fake = Fake::default();
        let mut g = Guardian::new(fake.clone(), journal.clone()).unwrap();
        let start = Instant::now();
        let reads = Rc::new(RefCell::new(Vec::new()));
        let script = Script {
            start,
            now: start,
            lines: lines.iter().cloned().collect(),
            fake: fake.clone(),
            journal: journal.clone(),
            reads: reads.clone(),
        };
        let mut out = Vec::new();
        assert!(serve(
            script,
            &mut out,
            &mut g,
            lease_ms.map(Duration::from_millis)
        ));
        assert!(String::from_utf8(out).unwrap().lines().all(|l| l == "ok"));
        let reads = reads.take();
        Run {
            fake,
            journal,
            reads,
            dir,
        }
    }

    #[test]
    fn lease_expiry_resumes_held_once_and_keeps_them() {
        let a = entry(100, 0xa, &[1, 2]);
        let r = run_script(
            "lease-once",
            Some(1500),
            &[(0, hold_line(&a)), (5000, String::new())],
        );
        // The hold's probe at 0; the lease runs out at exactly 1500, once; the heartbeat at 5000
        // re-arms it; EOF right after.
        assert_eq!(r.enables(), vec![(0, 1), (1500, 1)]);
        let waits: Vec<(u64, u64)> = r.reads.iter().map(|x| (x.at, x.wait)).collect();
        assert_eq!(
            waits,
            vec![
                (0, 1000),
                (0, 1000),
                (1000, 500), // up to the due time
                (1500, 1000),
                (2500, 1000),
                (3500, 1000),
                (4500, 1000),
                (5000, 1000),
            ]
        );
        // Still held and journaled after the expiry: EOF resumes it again and empties the journal.
        assert!(r.reads[1..].iter().all(|x| x.journal == vec![a.clone()]));
        assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a.clone(), a]);
        assert!(r.journal.read().unwrap().is_empty());
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn a_heartbeat_before_expiry_prevents_it() {
        let a = entry(100, 0xa, &[1]);
        let r = run_script(
            "lease-beat",
            Some(1000),
            &[
                (0, hold_line(&a)),
                (999, String::new()),
                (1998, String::new()),
                (2997, String::new()),
            ],
        );
        assert_eq!(r.enables(), vec![(0, 1)]);
        assert!(r.reads[1..].iter().all(|x| x.journal == vec![a.clone()]));
        assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a]); // probe, EOF
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn a_line_after_expiry_rearms_the_lease() {
        let a = entry(100, 0xa, &[1]);
        let b = entry(200, 0xb, &[2]);
        let r = run_script(
            "lease-rearm",
            Some(300),
            &[
                (0, hold_line(&a)),
                (1000, String::new()), // a heartbeat re-arms it
                (2000, hold_line(&b)), // and so does a request
                (3000, String::new()),
            ],
        );
        assert_eq!(
            r.enables(),
            vec![(0, 1), (300, 1), (1300, 1), (2000, 1), (2300, 2)]
        );
        // Short leases are polled for on time, not at the next tick.
        assert!(r.reads.iter().any(|x| x.at == 2000 && x.wait == 300));
        assert_eq!(r.reads.last().unwrap().journal, vec![a.clone(), b.clone()]);
        assert_eq!(
            *r.fake.enabled.borrow(),
            vec![
                a.clone(),
                a.clone(),
                a.clone(),
                b.clone(),
                a.clone(),
                b.clone(),
                a,
                b
            ]
        );
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn without_a_lease_silence_resumes_nothing() {
        let a = entry(100, 0xa, &[1]);
        let r = run_script(
            "lease-none",
            None,
            &[(0, hold_line(&a)), (60_000, String::new())],
        );
        assert_eq!(r.enables(), vec![(0, 1)]);
        // Idle ticks (reaps) every second all the same.
        assert!(r.reads.iter().all(|x| x.wait == 1000));
        assert_eq!(r.reads.len(), 62);
        assert_eq!(*r.fake.enabled.borrow(), vec![a.clone(), a]); // probe, EOF
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn a_silence_with_nothing_held_resumes_nothing() {
        let a = entry(100, 0xa, &[1]);
        let release = r#"{"op":"release","pid":100,"h_client":10}"#.to_string();
        let r = run_script(
            "lease-empty",
            Some(200),
            &[(0, hold_line(&a)), (100, release), (5000, String::new())],
        );
        assert_eq!(r.enables(), vec![(0, 1)]);
        assert_eq!(*r.fake.enabled.borrow(), vec![a]);
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn input_tells_lines_from_silence() {
        let (rd, wr) = nix::unistd::pipe().unwrap();
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGTERM);
        // Not blocked here, so never readable: only its fd is needed.
        let sigterm = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).unwrap();
        let mut input = Input::new(sigterm, rd);
        let mut wr = File::from(wr);
        wr.write_all(b"a\n\nb").unwrap();
        // Already sent: a line even with no time left to wait.
        assert_eq!(input.next(Duration::ZERO), Event::Line("a".into()));
        assert_eq!(input.next(Duration::ZERO), Event::Line(String::new()));
        let t = Instant::now();
        assert_eq!(input.next(Duration::from_millis(20)), Event::Idle);
        assert!(t.elapsed() >= Duration::from_millis(20));
        wr.write_all(b"\nc").unwrap();
        assert_eq!(input.next(Duration::ZERO), Event::Line("b".into()));
        drop(wr);
        // EOF mid-line: the end.
        assert_eq!(input.next(Duration::from_secs(5)), Event::End);
    }

    #[test]
    fn handle_passes_the_lease_and_beats() {
        let d = tmpdir("handle-lease");
        let exe = script(
            &d,
            r#"echo "$@" > "$(dirname "$0")/args"; echo ready
while read l; do case "$l" in "") echo beat >> "$(dirname "$0")/beats";; *hold*) echo ok;; *) echo "err nope";; esac; done"#,
        );
        let lease = Some(Duration::from_micros(1_500_500));
        let mut h = GuardianHandle::spawn_with_lease(&exe, &d.join("j"), lease).unwrap();
        assert_eq!(h.lease(), Some(Duration::from_millis(1501)));
        h.beat().unwrap();
        h.beat().unwrap();
        // The beats had no replies to get in the way.
        h.hold(&entry(1, 2, &[3])).unwrap();
        h.shutdown(Duration::from_secs(5)).unwrap();
        let args = std::fs::read_to_string(d.join("args")).unwrap();
        assert_eq!(
            args.trim(),
            format!(
                "nv-guardian --journal {} --lease-ms 1501",
                d.join("j").display()
            )
        );
        assert_eq!(
            std::fs::read_to_string(d.join("beats")).unwrap(),
            "beat\nbeat\n"
        );

        for lease in [None, Some(Duration::ZERO)] {
            let h = GuardianHandle::spawn_with_lease(&exe, &d.join("j"), lease).unwrap();
            assert_eq!(h.lease(), None);
            h.shutdown(Duration::from_secs(5)).unwrap();
            let args = std::fs::read_to_string(d.join("args")).unwrap();
            assert!(!args.contains("--lease-ms"), "{args}");
        }

        // A guardian that is gone: the beat fails, and so does everything after it.
        let exe = script(&d, "echo ready");
        let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
        h.child.wait().unwrap();
        assert!(h.beat().is_err());
        let e = h.beat().unwrap_err();
        assert!(format!("{e:#}").contains("unusable"), "{e:#}");
        let e = h.hold(&entry(1, 2, &[3])).unwrap_err();
        assert!(format!("{e:#}").contains("unusable"), "{e:#}");

        // One that stopped reading: beats fail once its pipe is full, without blocking.
        let exe = script(&d, "echo ready; exec sleep 30");
        let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
        let e = (0..1 << 20).find_map(|_| h.beat().err()).unwrap();
        assert!(format!("{e:#}").contains("pipe is full"), "{e:#}");
        h.child.kill().unwrap();
        h.child.wait().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
