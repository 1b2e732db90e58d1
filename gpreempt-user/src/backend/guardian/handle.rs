//! The controller's side of a guardian ([`GuardianHandle`]): spawn it, hold/release entries
//! over its stdin, beat the lease, shut it down. A [`Beater`] beats from another thread (the
//! controller's loop) while the handle's owner (the NVIDIA worker) waits on the driver or on a
//! reply.

use std::{
    io::{self, Read, Write},
    os::{fd::AsFd, unix::process::CommandExt as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::{Arc, Mutex, MutexGuard, TryLockError},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use nix::{
    errno::Errno,
    poll::{poll, PollFd, PollFlags, PollTimeout},
};

use super::protocol::{one_line, HoldEntry, Request};

/// The guardian's stdin, shared by its handle and its [`Beater`]s: every line is written whole
/// under the lock, so a beat never lands inside a request. None once closed.
type Pipe = Arc<Mutex<Option<ChildStdin>>>;

fn lock(p: &Pipe) -> MutexGuard<'_, Option<ChildStdin>> {
    // A writer that panicked left at worst a partial line; the guardian rejects it.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// An empty line, written only if the pipe can take it now: a guardian that stopped reading
/// never blocks the writer.
fn write_beat(stdin: &mut Option<ChildStdin>) -> Result<()> {
    let stdin = stdin.as_mut().context("the guardian's stdin is closed")?;
    loop {
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Err(Errno::EINTR) => continue,
            Err(e) => bail!("poll: {}", e.desc()),
            Ok(0) => bail!("the guardian stopped reading its stdin (the pipe is full)"),
            Ok(_) => break,
        }
    }
    stdin.write_all(b"\n").and_then(|_| stdin.flush())?;
    Ok(())
}

/// Beats a guardian's lease from a thread other than its handle's owner.
#[derive(Clone)]
pub struct Beater {
    stdin: Pipe,
}

impl Beater {
    /// A heartbeat that never waits: while the handle is writing a request, that line renews
    /// the lease and the beat is skipped.
    pub fn beat(&self) -> Result<()> {
        let mut g = match self.stdin.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return Ok(()),
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        write_beat(&mut g).context("guardian heartbeat")
    }

    /// Closes the guardian's stdin, as a controller's exit would: it undoes everything it holds
    /// and exits. Never waits; false when the handle was writing at that moment.
    pub fn close(&self) -> bool {
        match self.stdin.try_lock() {
            Ok(mut g) => {
                drop(g.take());
                true
            }
            Err(TryLockError::WouldBlock) => false,
            Err(TryLockError::Poisoned(e)) => {
                drop(e.into_inner().take());
                true
            }
        }
    }
}

/// The controller's side of a guardian.
pub struct GuardianHandle {
    pub(super) child: Child,
    stdin: Pipe,
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
        Self::spawn_inner(exe, journal, lease, false)
    }

    /// [`Self::spawn_with_lease`] for the KFD path: when the lease runs out the guardian also
    /// SIGKILLs this process, so that the kernel resumes what it suspended.
    pub fn spawn_killing(exe: &Path, journal: &Path, lease: Duration) -> Result<Self> {
        Self::spawn_inner(exe, journal, Some(lease), true)
    }

    fn spawn_inner(
        exe: &Path,
        journal: &Path,
        lease: Option<Duration>,
        kill: bool,
    ) -> Result<Self> {
        let lease_ms = lease.map_or(0, |l| {
            u64::try_from(l.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        let mut cmd = Command::new(exe);
        cmd.arg("nv-guardian").arg("--journal").arg(journal);
        if lease_ms > 0 {
            cmd.arg("--lease-ms").arg(lease_ms.to_string());
        }
        if kill {
            cmd.arg("--kill-on-expiry")
                .arg(std::process::id().to_string());
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting the guardian ({})", exe.display()))?;
        let stdin = Arc::new(Mutex::new(child.stdin.take()));
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

    /// A heartbeat sender for another thread.
    pub fn beater(&self) -> Beater {
        Beater {
            stdin: self.stdin.clone(),
        }
    }

    /// A heartbeat: an empty line, which renews the lease and has no reply. It never waits on the
    /// guardian: a pipe too full to take it (a guardian that stopped reading) is an error, and
    /// like a write error it makes the handle unusable.
    pub fn beat(&mut self) -> Result<()> {
        if let Some(b) = &self.broken {
            bail!("the guardian is unusable: {b}");
        }
        let r = write_beat(&mut lock(&self.stdin));
        let r = match r {
            Err(e) if e.downcast_ref::<io::Error>().is_some() => Err(self.gone(e)),
            r => r,
        };
        if let Err(e) = &r {
            self.broken = Some(one_line(e));
        }
        r.context("guardian heartbeat")
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

    /// Asks the guardian to answer for `entry`'s cgroup; freeze only after this returns Ok.
    pub fn freeze(&mut self, entry: &super::FrozenEntry) -> Result<()> {
        let line = serde_json::to_string(&Request::Freeze(entry.clone()))?;
        self.request(&line)
            .with_context(|| format!("guardian hold of frozen {}", entry.cgroup.display()))
    }

    /// Tells the guardian that `cgroup` is thawed.
    pub fn thaw(&mut self, cgroup: &std::path::Path) -> Result<()> {
        let line = serde_json::to_string(&Request::Thaw {
            cgroup: cgroup.to_path_buf(),
        })?;
        self.request(&line)
            .with_context(|| format!("guardian release of frozen {}", cgroup.display()))
    }

    /// Closes its stdin (it resumes anything still held) and waits for it to exit.
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        drop(lock(&self.stdin).take());
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
        // The lock is held for the write only: beats may go while we wait for the reply.
        let written = {
            let mut g = lock(&self.stdin);
            let stdin = g.as_mut().context("the guardian's stdin is closed")?;
            stdin
                .write_all(format!("{line}\n").as_bytes())
                .and_then(|_| stdin.flush())
        };
        written.map_err(|e| self.gone(e.into()))?;
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
        drop(lock(&self.stdin).take());
        let _ = self.child.try_wait();
    }
}
