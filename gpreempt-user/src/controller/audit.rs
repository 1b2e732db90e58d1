//! The audit log (`run --audit FILE`): one JSON line per [`AuditRecord`], whole or not at all.
//!
//! A write that fails part-way (a full file system) is cut back to the last whole line, the lines
//! lost are counted, and every later record tries again: auditing resumes by itself when space
//! comes back, and status.json says it is failing meanwhile.

use std::io::Write;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use anyhow::{bail, Context as _};

use super::record::AuditRecord;

/// The audit file's mode when `run` creates it, whatever the umask: root writes, its group may
/// read (records name processes and users).
pub const FILE_MODE: u32 = 0o640;
/// Directories `run` creates on the way to it.
pub const DIR_MODE: u32 = 0o750;

/// Opens (creating it [`FILE_MODE`], and missing directories [`DIR_MODE`]) the audit file for
/// appending, never through a link: what is there must be a regular file of root's (or ours)
/// with one name, that nobody else may write (they could forge records). Err: why, and what to
/// do.
pub fn open_file(path: &Path) -> anyhow::Result<std::fs::File> {
    let path = &std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    let refuse = |why: String| -> anyhow::Result<std::fs::File> {
        bail!("refusing the audit file {}: {why}", path.display())
    };
    if let Some(parent) = path.parent() {
        crate::rundir::create_dirs(parent, DIR_MODE)?;
    }
    // Judged before the open too: opening a FIFO or a device could wait or act.
    let existed = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return refuse("it is a symbolic link; name the file itself".into())
        }
        Ok(m) if !m.is_file() => return refuse("it is not a regular file; remove it".into()),
        Ok(_) => true,
        Err(_) => false,
    };
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let f = match f {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return refuse("it is a symbolic link; name the file itself".into())
        }
        Err(e) => {
            return Err(e).with_context(|| format!("opening the audit file {}", path.display()))
        }
    };
    let m = f.metadata()?;
    if !m.is_file() {
        return refuse("it is not a regular file; remove it".into());
    }
    if !crate::rundir::trusted_owner(m.uid()) {
        return refuse(format!(
            "it is owned by uid {}, not root; remove it or `chown root:root` it",
            m.uid()
        ));
    }
    if m.nlink() != 1 {
        return refuse(format!(
            "it has {} names (hard links): records would land in another file too; remove it",
            m.nlink()
        ));
    }
    let mode = m.mode() & 0o7777;
    if !existed {
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .with_context(|| format!("chmod {}", path.display()))?;
    } else if mode & 0o022 != 0 {
        return refuse(format!(
            "mode {mode:04o} (group/other writable: records could be forged); `chmod {FILE_MODE:o}` it"
        ));
    }
    Ok(f)
}

/// Where the lines go: an append-only file, or a fake in tests.
pub trait Sink {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()>;
    /// Its length now.
    fn size(&mut self) -> std::io::Result<u64>;
    /// Cuts it back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl Sink for std::fs::File {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        Write::write_all(self, b)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

/// Failing since: the error, lines lost so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failing {
    pub error: String,
    pub lost: u64,
}

pub struct Audit<S: Sink> {
    sink: S,
    failing: Option<Failing>,
}

impl<S: Sink> Audit<S> {
    pub fn new(sink: S) -> Self {
        Self {
            sink,
            failing: None,
        }
    }

    /// Writes one record as a line. Returns what to log when auditing starts failing or
    /// resumes (once each).
    pub fn record(&mut self, rec: &AuditRecord) -> Option<String> {
        let line = serde_json::to_string(rec).map(|mut l| {
            l.push('\n');
            l
        });
        let before = self.sink.size();
        let r = match (&before, line) {
            (Ok(_), Ok(line)) => self.sink.write_all(line.as_bytes()),
            (Err(e), _) => Err(std::io::Error::new(e.kind(), e.to_string())),
            (_, Err(e)) => Err(e.into()),
        };
        match (r, &mut self.failing) {
            (Ok(()), None) => None,
            (Ok(()), Some(f)) => {
                let lost = f.lost;
                self.failing = None;
                Some(format!(
                    "audit file: writing again after {lost} lost record(s)"
                ))
            }
            (Err(e), failing) => {
                // Never leave half a line: cut back to where this one began.
                if let Ok(len) = before {
                    let _ = self.sink.truncate(len);
                }
                match failing {
                    Some(f) => {
                        f.lost += 1;
                        f.error = e.to_string();
                        None
                    }
                    None => {
                        self.failing = Some(Failing {
                            error: e.to_string(),
                            lost: 1,
                        });
                        Some(format!(
                            "audit file: {e}; records are lost (counted in status.json) until a \
                             write succeeds again"
                        ))
                    }
                }
            }
        }
    }

    /// Set while records are being lost.
    pub fn failing(&self) -> Option<&Failing> {
        self.failing.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::tests::Scratch;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn refused(p: &Path) -> String {
        format!("{:#}", open_file(p).expect_err("refused"))
    }

    /// Created 0640 (and its missing directories 0750) whatever the umask, appended to after.
    #[test]
    fn the_audit_file_gets_fixed_modes_whatever_the_umask() {
        let s = Scratch::new("audit-modes");
        for umask in [0, 0o077] {
            let _ = std::fs::remove_dir_all(s.0.join("log"));
            let file = s.0.join("log/gpreempt/audit.jsonl");
            // SAFETY: umask has no preconditions; restored at once.
            let old = unsafe { libc::umask(umask) };
            let r = open_file(&file);
            // SAFETY: as above.
            unsafe { libc::umask(old) };
            let mut f = r.unwrap();
            assert_eq!(mode(&file), 0o640, "umask {umask:o}");
            assert_eq!(mode(&s.0.join("log")), 0o750, "umask {umask:o}");
            assert_eq!(mode(&s.0.join("log/gpreempt")), 0o750, "umask {umask:o}");
            Sink::write_all(&mut f, b"one\n").unwrap();
            drop(f);
            Sink::write_all(&mut open_file(&file).unwrap(), b"two\n").unwrap();
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "one\ntwo\n");
        }
    }

    /// A link, a FIFO, a second name of another file, a file others may write or own: refused,
    /// at once, and nothing behind them is touched.
    #[test]
    fn the_audit_file_is_never_reached_through_a_link_or_a_fifo() {
        let s = Scratch::new("audit-links");
        let victim = s.0.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = s.0.join("link.jsonl");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(refused(&link).contains("symbolic link"));
        let hard = s.0.join("hard.jsonl");
        std::fs::hard_link(&victim, &hard).unwrap();
        assert!(refused(&hard).contains("has 2 names"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

        let fifo = s.0.join("fifo.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(refused(&f));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("opening a FIFO as the audit file blocked");
        assert!(e.contains("not a regular file"), "{e}");

        let open = s.0.join("open.jsonl");
        std::fs::write(&open, "").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = refused(&open);
        assert!(
            e.contains("mode 0666") && e.contains("`chmod 640` it"),
            "{e}"
        );

        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test needs root (a file of another user)");
        let theirs = s.0.join("theirs.jsonl");
        std::fs::write(&theirs, "").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        assert!(refused(&theirs).contains("owned by uid 65534"));
    }

    /// Accepts at most `room` bytes in all; a write that does not fit writes what fits, then
    /// fails (as a full file system does).
    struct Disk {
        data: Vec<u8>,
        room: usize,
    }

    impl Sink for Disk {
        fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
            let fit = b.len().min(self.room.saturating_sub(self.data.len()));
            self.data.extend_from_slice(&b[..fit]);
            if fit < b.len() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            Ok(())
        }
        fn size(&mut self) -> std::io::Result<u64> {
            Ok(self.data.len() as u64)
        }
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_loses_whole_lines_counts_them_and_recovers() {
        let rec = AuditRecord::Adapt(crate::controller::record::AdaptNote {
            emulated: false,
            gpu_id: 1,
            reason: "calibrated".into(),
            ts_ns: 1,
        });
        let line = serde_json::to_string(&rec).unwrap().len() + 1;
        // Room for one line and a bit of the next.
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: line + 2,
        });
        assert_eq!(a.record(&rec), None);
        let w = a.record(&rec).unwrap();
        assert!(w.contains("No space left on device"), "{w}");
        assert_eq!(a.record(&rec), None, "said once");
        assert_eq!(a.failing().unwrap().lost, 2);
        // Only whole lines on disk.
        let text = String::from_utf8(a.sink.data.clone()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.ends_with('\n'));
        // Space comes back: auditing resumes by itself and says how much was lost.
        a.sink.room = 1000;
        let w = a.record(&rec).unwrap();
        assert_eq!(w, "audit file: writing again after 2 lost record(s)");
        assert!(a.failing().is_none());
        assert_eq!(
            String::from_utf8(a.sink.data.clone())
                .unwrap()
                .lines()
                .count(),
            2
        );
    }
}
