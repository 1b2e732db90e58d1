//! The run directory (`/run/gpreempt-ebpf`, or `GPREEMPT_RUN_DIR`): where a controller keeps
//! what other processes read (lock, status, socket: see `controller::daemon`), how those files
//! are written (replaced whole, so a reader never sees half a file), and the targets record a
//! later controller recovers from.
//!
//! Whoever can write in this directory can steer the controller (its socket) and make it write
//! where they like (a planted link), so it is ours alone: created 0755 whatever the umask,
//! refused when anyone else could write in it, and no file in it is opened through a link.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{
        DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
    },
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

/// The directory: everyone may read the status in it, only its owner may change anything.
pub const DIR_MODE: u32 = 0o755;
/// The status file (`top` and `queues` read it without root).
pub const PUBLIC_MODE: u32 = 0o644;
/// The lock and the targets record: a reader's shared flock on the lock would block the next
/// controller, so nobody else may open it.
pub const PRIVATE_MODE: u32 = 0o600;

pub fn run_dir() -> PathBuf {
    std::env::var_os("GPREEMPT_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/gpreempt-ebpf"))
}

/// Who may own the directory: us, or root (a root controller after a root-owned one).
pub(crate) fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Creates the run directory (0755 whatever the umask) or checks the one that is there: a
/// directory, not a link, owned by us or root, writable by nobody else; no directory above it
/// may let anyone else rename it (or any directory on the way) away either, and missing ones
/// are created 0755. Err: why not, and what to do.
pub fn prepare(dir: &Path) -> Result<()> {
    let dir = &std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
    if let Some(parent) = dir.parent() {
        // What is there first: nothing is created under a directory someone else controls.
        if let Some(existing) = parent.ancestors().find(|a| a.exists()) {
            check_ancestors(existing)?;
        }
        create_dirs(parent, DIR_MODE)?;
        check_ancestors(parent)?;
    }
    // The mode passed to mkdir can only lose bits to the umask: never more open than 0755.
    match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {
            let f = open_dir(dir)?;
            f.set_permissions(std::fs::Permissions::from_mode(DIR_MODE))
                .with_context(|| format!("chmod {}", dir.display()))?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    check(dir)
}

/// The run directory as it is: Err with the reason when it is not safe to use.
pub fn check(dir: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    let refuse = |why: String, fix: &str| -> Result<()> {
        bail!(
            "refusing {}: {why}; remove it (the next controller creates it, mode \
             {DIR_MODE:o}){fix}",
            dir.display()
        )
    };
    if m.file_type().is_symlink() {
        return refuse("it is a symbolic link".into(), "");
    }
    if !m.is_dir() {
        return refuse("it is not a directory".into(), "");
    }
    if !trusted_owner(m.uid()) {
        return refuse(
            format!("it is owned by uid {}, not root", m.uid()),
            " or `chown root:root` it",
        );
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(
            format!("mode {mode:04o} (group/other writable)"),
            " or `chmod 755` it",
        );
    }
    Ok(())
}

/// Creates `dir` and whatever is missing above it, each with `mode` whatever the umask (`mkdir`
/// with the mode, then an explicit `chmod` of the ones it created, never of one that was there).
pub fn create_dirs(dir: &Path, mode: u32) -> Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err())
        .collect();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => open_dir(d)?
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", d.display()))?,
            // Made meanwhile by someone else: judged by the checks like any other.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", d.display())),
        }
    }
    Ok(())
}

/// Whoever may write in a directory above ours can swap our directory (or one on the way) for
/// theirs, so every one is checked, up to `/`, as spelled and as resolved (a link on the way
/// lives in one directory and leads to others): owned by root or us, not group/other writable
/// unless sticky (like /tmp: others cannot rename what is ours).
pub fn check_ancestors(parent: &Path) -> Result<()> {
    let resolved =
        std::fs::canonicalize(parent).with_context(|| format!("{}", parent.display()))?;
    for a in parent.ancestors().chain(resolved.ancestors()) {
        if a.as_os_str().is_empty() {
            continue;
        }
        let m = std::fs::metadata(a).with_context(|| format!("{}", a.display()))?;
        let mode = m.mode() & 0o7777;
        let sticky = mode & 0o1000 != 0;
        if !trusted_owner(m.uid()) || (mode & 0o022 != 0 && !sticky) {
            bail!(
                "refusing {}: a user other than root can replace what is in it (owner uid {}, \
                 mode {mode:04o}), and it is on the way to {}; point GPREEMPT_RUN_DIR (or the \
                 file) into a directory only root can write, all the way up",
                a.display(),
                m.uid(),
                parent.display()
            );
        }
    }
    Ok(())
}

fn open_dir(dir: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .with_context(|| format!("opening {}", dir.display()))
}

/// Opens a file of the run directory for reading, never through a link.
pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Opens (creating it `mode`) a file of the run directory for reading and writing, never through
/// a link; an existing file must be a regular file we own, and gets `mode` whatever it had.
pub fn open_private(path: &Path, mode: u32) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| link_error(path, e))?;
    let m = f.metadata()?;
    if !m.is_file() || !trusted_owner(m.uid()) {
        bail!(
            "refusing {}: not a regular file of ours (uid {}); remove it",
            path.display(),
            m.uid()
        );
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))?;
    Ok(f)
}

fn link_error(path: &Path, e: io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        anyhow::anyhow!(
            "refusing {}: it is a symbolic link (planted by someone?); remove it",
            path.display()
        )
    } else {
        anyhow::Error::new(e).context(format!("opening {}", path.display()))
    }
}

/// Writes `data` to a fresh temporary sibling (`mode`, whatever the umask), then renames it over
/// `path`. Whatever was at the temporary name (a link someone planted) is unlinked, not followed.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", tmp.display())),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| link_error(&tmp, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.write_all(data)
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// A process a controller attached to, with its start time (a reused pid is not touched).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controlled {
    pub pid: u32,
    pub start_time: u64,
}

/// Records the controlled processes (written on every change; atomically replaced).
pub fn write_targets(dir: &Path, targets: &[Controlled]) -> Result<()> {
    write_atomic(
        &dir.join("targets.json"),
        &serde_json::to_vec(targets)?,
        PRIVATE_MODE,
    )
}

/// What an earlier controller recorded (empty when none or unreadable).
pub fn read_targets(dir: &Path) -> Vec<Controlled> {
    open_read(&dir.join("targets.json"))
        .ok()
        .and_then(|f| serde_json::from_reader(io::BufReader::new(f)).ok())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests;
