//! The guardian's journal of held entries (one JSON line each, fsynced, lock-owned) and
//! recovery from a journal a dead guardian left behind.

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context as _, Result};
use gpreempt_common::nv;
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};

use super::{
    protocol::HoldEntry,
    say::say,
    targets::{undo, Rm, Targets},
};
use crate::observe::nv::rm::{self as control};

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

    /// The journal of frozen cgroups beside it (`<path>-frozen`).
    pub fn frozen_path(&self) -> PathBuf {
        self.sibling("-frozen")
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
        // Fixed mode whatever the umask, never through a planted link.
        let f = crate::rundir::open_private(&path, crate::rundir::PRIVATE_MODE)?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            Errno::EWOULDBLOCK => anyhow!(
                "a live guardian owns {} (it resumes what it holds when its controller goes)",
                self.path.display()
            ),
            e => anyhow!("locking {}: {}", path.display(), e.desc()),
        })
    }

    /// [`Self::lock`], waiting up to `wait` for a live owner to let go: a restarted controller's
    /// guardian starts while its predecessor's guardian may still be undoing what it held (its
    /// controller was killed). Waiting for it means the new controller reads each timeslice's
    /// original only after the old change is undone (no original recorded from a lowered value,
    /// so no lost restore), and finds the journal emptied or, if the old guardian died mid-way,
    /// the rest to recover (no double restore of a later change).
    pub fn lock_within(&self, wait: std::time::Duration) -> Result<Flock<File>> {
        let end = std::time::Instant::now() + wait;
        loop {
            match self.lock() {
                Ok(l) => return Ok(l),
                Err(e) if std::time::Instant::now() >= end => return Err(e),
                Err(e) if e.to_string().contains("live guardian") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
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
            .mode(crate::rundir::PRIVATE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        f.set_permissions(std::fs::Permissions::from_mode(crate::rundir::PRIVATE_MODE))?;
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
            // A fresh file at the temporary name (whatever was there, a link included, goes).
            match std::fs::remove_file(&tmp) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::rundir::PRIVATE_MODE)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(crate::rundir::PRIVATE_MODE))?;
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

/// Outcome of resuming one entry left in a journal: resumed, or nothing left to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovered {
    Resumed,
    Gone,
}

/// Undoes a journal entry ([`undo`]: resumes its channels, restores its timeslices) with a fresh
/// duplicate. A target that exited, closed the fd, or whose fd no longer holds the client (a
/// reused pid or fd) has nothing left paused that we could reach: `Gone`.
pub(super) fn recover_entry<T: Targets>(t: &mut T, e: &HoldEntry) -> Result<Recovered> {
    let dup = match t.dup(e.id(), e.fd) {
        Ok(d) => d,
        Err(err) if control::is_gone(&err) => return Ok(Recovered::Gone),
        Err(err) => return Err(err),
    };
    match undo(t, &dup, e) {
        Ok(()) => Ok(Recovered::Resumed),
        Err(err) if control::nv_status(&err) == Some(nv::status::INVALID_CLIENT) => {
            Ok(Recovered::Gone)
        }
        Err(err) => Err(err),
    }
}

/// Resumes every entry of an unlocked journal; keeps the entries that failed in it.
pub(super) fn recover_with<T: Targets>(j: &Journal, t: &mut T) -> Vec<(HoldEntry, Result<()>)> {
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
                say(&format!("left by a dead guardian, {}", e.undone()));
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
                    "left by a dead guardian: could not undo {}: {err:#}",
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
