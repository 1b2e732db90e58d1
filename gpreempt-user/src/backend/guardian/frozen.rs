//! Cgroups frozen by the controller's fallback (`backend::freezer`): nothing in the kernel thaws
//! them when the controller goes, so the guardian journals each one (`<journal>-frozen`, one
//! JSON line per cgroup, fsynced) before the controller freezes it, and thaws them on EOF,
//! SIGTERM, lease expiry, and from a journal a dead guardian left.

use std::{
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Component, Path, PathBuf},
};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::say::say;

/// One frozen cgroup: its directory under the cgroup v2 mount, and whom it was frozen for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenEntry {
    pub cgroup: PathBuf,
    pub pid: u32,
}

/// Writes `cgroup.freeze` of `cg`, never through a link.
pub fn set_frozen(cg: &Path, frozen: bool) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(cg.join("cgroup.freeze"))?;
    f.write_all(if frozen { b"1" } else { b"0" })
}

/// The frozen cgroups the guardian answers for, and their journal.
pub struct Frozen {
    path: PathBuf,
    held: Vec<FrozenEntry>,
    /// Left by a dead guardian and not thawed yet: kept in the journal.
    stale: Vec<FrozenEntry>,
}

impl Frozen {
    /// Takes over the journal at `path` (under the guardian's lock): leftovers are thawed first.
    pub fn open(path: PathBuf) -> Self {
        let mut f = Self {
            held: Vec::new(),
            stale: read(&path),
            path,
        };
        if !f.stale.is_empty() {
            f.thaw_stale("left by a dead guardian");
        }
        f
    }

    pub fn held(&self) -> &[FrozenEntry] {
        &self.held
    }

    /// The controller is about to freeze `e.cgroup`: journal it first. Refused for anything
    /// that is not a cgroup directory with a freeze file (the guardian writes there as root).
    pub fn hold(&mut self, e: FrozenEntry) -> Result<()> {
        let plain = e.cgroup.is_absolute()
            && e.cgroup
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain || !e.cgroup.join("cgroup.freeze").is_file() {
            bail!("{} is not a cgroup v2 directory", e.cgroup.display());
        }
        if !self.held.contains(&e) {
            self.held.push(e);
        }
        self.rewrite()
    }

    /// The controller thawed `cgroup` itself.
    pub fn release(&mut self, cgroup: &Path) -> Result<()> {
        let before = self.held.len();
        self.held.retain(|e| e.cgroup != cgroup);
        if self.held.len() != before {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Thaws everything held (and the leftovers). `keep`: the controller may carry on (a lease
    /// ran out), so the entries stay journaled; otherwise the thawed ones go. True when every
    /// cgroup was thawed (or is gone).
    pub fn thaw_all(&mut self, why: &str, keep: bool) -> bool {
        let mut failed = Vec::new();
        for e in &self.held {
            if !thaw(why, e) {
                failed.push(e.clone());
            }
        }
        let stale_ok = self.thaw_stale(why);
        if !keep {
            self.held = failed.clone();
            if let Err(e) = self.rewrite() {
                say(&format!("{e:#}"));
                return false;
            }
        }
        failed.is_empty() && stale_ok
    }

    fn thaw_stale(&mut self, why: &str) -> bool {
        self.stale.retain(|e| !thaw(why, e));
        if let Err(e) = self.rewrite() {
            say(&format!("{e:#}"));
        }
        self.stale.is_empty()
    }

    fn rewrite(&self) -> Result<()> {
        let mut text = Vec::new();
        for e in self.stale.iter().chain(&self.held) {
            serde_json::to_writer(&mut text, e)?;
            text.push(b'\n');
        }
        crate::rundir::write_atomic(&self.path, &text, crate::rundir::PRIVATE_MODE)
    }
}

/// Thaws one cgroup; a cgroup that no longer exists has nothing left to thaw.
fn thaw(why: &str, e: &FrozenEntry) -> bool {
    match set_frozen(&e.cgroup, false) {
        Ok(()) => {
            say(&format!(
                "{why}: thawed {} (frozen for pid {})",
                e.cgroup.display(),
                e.pid
            ));
            true
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => true,
        Err(err) => {
            say(&format!(
                "{why}: could not thaw {}: {err}",
                e.cgroup.display()
            ));
            false
        }
    }
}

/// The entries of a journal (none when it does not exist; torn lines skipped).
fn read(path: &Path) -> Vec<FrozenEntry> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<FrozenEntry>(l).ok())
        .collect()
}
