//! What a running controller shares with the host: one lock (one controller at a time), the
//! list of processes it controls (so the next instance can resume anything left behind), a
//! status file `top` reads, and a control socket through which `suspend`, `resume` and `top`'s
//! keys reach it. Everything lives in `/run/gpreempt-ebpf` (`GPREEMPT_RUN_DIR` overrides it),
//! a directory only root can write (`rundir`); the socket itself is in `controller::socket`.

use std::{
    fs::File,
    io::{Read as _, Seek as _, Write as _},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub use super::socket::{ask, serve, Access, Incoming};
pub use crate::observe::status::{lock_held, read_status, Status};
use crate::{
    outcome::OpReport,
    rundir::{self, PRIVATE_MODE, PUBLIC_MODE},
};

/// An exclusive flock on `<dir>/controller.lock`, holding our pid. Released when dropped or
/// when the process dies in any way (the kernel drops flocks with the last fd).
pub struct Lock {
    _file: File,
    dir: PathBuf,
}

impl Lock {
    pub fn acquire(dir: &Path) -> Result<Self> {
        rundir::prepare(dir)?;
        let path = dir.join("controller.lock");
        // A controller that exits cleanly unlinks the lock file while holding it: a lock taken
        // on a file that is no longer at `path` guards nothing, so try again on the new one.
        let mut f = loop {
            let f = rundir::open_private(&path, PRIVATE_MODE)?;
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let mut s = String::new();
                let _ = (&f).read_to_string(&mut s);
                let who = s.trim();
                anyhow::bail!(
                    "another gpreempt-ebpf controller is running (pid {}); stop it first, or send \
                     it requests: `gpreempt-ebpf suspend|resume` talk to it",
                    if who.is_empty() { "?" } else { who }
                );
            }
            if same_file(&f, &path) {
                break f;
            }
        };
        f.set_len(0)?;
        f.rewind()?;
        writeln!(f, "{}", std::process::id())?;
        // What a dead predecessor published is no longer true (the kernel resumed its queues).
        let _ = std::fs::remove_file(dir.join("status.json"));
        Ok(Self {
            _file: f,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether the open file `f` is the one at `path` now.
fn same_file(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A clean exit leaves nothing a later command could mistake for a live controller: the socket,
/// the status and the lock go (the lock file last, while still locked). The targets record
/// stays only if it still names a process: then a later controller resumes it.
impl Drop for Lock {
    fn drop(&mut self) {
        for f in [
            "control.sock",
            "control.sock.new",
            "status.json",
            "status.tmp",
            "targets.tmp",
        ] {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
        if crate::rundir::read_targets(&self.dir).is_empty() {
            let _ = std::fs::remove_file(self.dir.join("targets.json"));
        }
        let _ = std::fs::remove_file(self.dir.join("controller.lock"));
    }
}

/// The systemd service this process runs in: the `.service` component of its cgroup path.
pub fn own_unit() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = crate::observe::procinfo::cgroup_path(&text);
    path.rsplit('/')
        .find(|c| c.ends_with(".service"))
        .map(str::to_owned)
}

pub fn write_status(dir: &Path, s: &Status) -> Result<()> {
    // Everyone may read it: `top` and `queues` show what the controller holds without root.
    rundir::write_atomic(
        &dir.join("status.json"),
        &serde_json::to_vec(s)?,
        PUBLIC_MODE,
    )
}

// ---------------------------------------------------------------------------------------------
// The control socket's messages: one JSON request line, one JSON response line.

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Suspend {
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    },
    Resume {
        pid: u32,
        queues: Option<Vec<u32>>,
    },
    Status,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    pub error: Option<String>,
    pub report: Option<OpReport>,
    pub status: Option<Status>,
}

impl Response {
    pub fn err(e: impl std::fmt::Display) -> Self {
        Self {
            ok: false,
            error: Some(e.to_string()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::{read_targets, write_targets, Controlled};

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("gp-daemon-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            Self(p)
        }
        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.0)
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_clean_exit_leaves_an_empty_run_dir() {
        let d = Dir::new("clean");
        let lock = Lock::acquire(&d.0).unwrap();
        assert!(lock_held(&d.0));
        write_status(&d.0, &Status::default()).unwrap();
        write_targets(&d.0, &[]).unwrap();
        std::fs::write(d.0.join("control.sock"), "").unwrap();
        drop(lock);
        assert!(d.names().is_empty(), "{:?}", d.names());
        assert!(!lock_held(&d.0));
        assert_eq!(read_status(&d.0), None);
    }

    #[test]
    fn targets_still_named_survive_for_the_next_controller() {
        let d = Dir::new("targets");
        let lock = Lock::acquire(&d.0).unwrap();
        let t = [Controlled {
            pid: 4242,
            start_time: 7,
        }];
        write_targets(&d.0, &t).unwrap();
        drop(lock);
        assert_eq!(d.names(), ["targets.json"]);
        assert_eq!(read_targets(&d.0), t);
    }

    #[test]
    fn stale_files_of_a_dead_controller_do_not_count() {
        let d = Dir::new("stale");
        std::fs::create_dir_all(&d.0).unwrap();
        // What a controller killed with SIGKILL leaves: an unlocked lock file naming it, a
        // socket path nobody listens on, its last status.
        std::fs::write(d.0.join("controller.lock"), "999999\n").unwrap();
        std::fs::write(d.0.join("control.sock"), "").unwrap();
        write_status(
            &d.0,
            &Status {
                controller_pid: 999_999,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!lock_held(&d.0));
        assert_eq!(read_status(&d.0), None, "no lock held: no controller");
        let lock = Lock::acquire(&d.0).unwrap();
        let pid = std::fs::read_to_string(d.0.join("controller.lock")).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        assert!(!d.0.join("status.json").exists(), "the dead one's status");
        drop(lock);
    }

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid() {
        let d = Dir::new("second");
        let _lock = Lock::acquire(&d.0).unwrap();
        let e = Lock::acquire(&d.0).err().expect("refused").to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
    }

    #[test]
    fn a_planted_lock_link_is_refused_and_its_target_untouched() {
        use std::os::unix::fs::MetadataExt as _;
        let d = Dir::new("locklink");
        std::fs::create_dir_all(&d.0).unwrap();
        let victim = d.0.with_extension("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.0.join("controller.lock")).unwrap();
        let e = format!("{:#}", Lock::acquire(&d.0).err().expect("refused"));
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let _ = std::fs::remove_file(&victim);
        // Without the link: the lock is root's alone, the status everyone's.
        std::fs::remove_file(d.0.join("controller.lock")).unwrap();
        let lock = Lock::acquire(&d.0).unwrap();
        write_status(&d.0, &Status::default()).unwrap();
        let mode = |f: &str| std::fs::metadata(d.0.join(f)).unwrap().mode() & 0o777;
        assert_eq!(mode("controller.lock"), 0o600);
        assert_eq!(mode("status.json"), 0o644);
        drop(lock);
    }

    #[test]
    fn a_lock_on_an_unlinked_file_is_not_taken() {
        let d = Dir::new("unlinked");
        let lock = Lock::acquire(&d.0).unwrap();
        // Someone opened the old lock file just before the holder's clean exit unlinked it.
        let old = File::open(d.0.join("controller.lock")).unwrap();
        drop(lock);
        // SAFETY: flock on an fd we own.
        let r = unsafe { libc::flock(old.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0);
        assert!(!same_file(&old, &d.0.join("controller.lock")));
        // A new controller locks the file at the path, not the unlinked one.
        let new = Lock::acquire(&d.0).unwrap();
        assert!(lock_held(&d.0));
        drop(new);
    }
}
