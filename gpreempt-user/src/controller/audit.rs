//! The audit log (`run --audit FILE`): one JSON line per [`AuditRecord`], whole or not at all.
//!
//! A write that fails part-way (a full file system) is cut back to the last whole line, the lines
//! lost are counted, and every later record tries again: auditing resumes by itself when space
//! comes back, and status.json says it is failing meanwhile.
//!
//! Bounded two ways (docs/service.md, "The audit log's bound"): SIGHUP reopens the file by its
//! name (logrotate renamed it: the next lines go to a new file), and `--audit-max-size` rotates
//! it to `FILE.1` (one kept) before a line would take it past the size.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

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

/// The smallest `--audit-max-size`: below it nearly every record would rotate the file.
pub const MIN_MAX_SIZE: u64 = 4096;

/// `--audit-max-size`: bytes, with an optional binary unit (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`),
/// at least [`MIN_MAX_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("{s:?}: a size is a whole number with an optional unit, e.g. 64MiB")
    })?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?}; use B, KiB, MiB or GiB (binary: 1 MiB = 1048576 bytes)"
            ))
        }
    };
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?}: too large"))?;
    if bytes < MIN_MAX_SIZE {
        return Err(format!(
            "{s:?}: at least {MIN_MAX_SIZE} bytes (4KiB), or the file would rotate at nearly every record"
        ));
    }
    Ok(bytes)
}

/// Where the lines go: the audit file ([`LogFile`]), or a fake in tests.
pub trait Sink {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()>;
    /// Its length now.
    fn size(&mut self) -> std::io::Result<u64>;
    /// Cuts it back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
    /// Opens the file by its name again (it may have been renamed away).
    fn reopen(&mut self) -> anyhow::Result<()>;
    /// Sets what was written so far aside (as `FILE.1`) and starts an empty file.
    fn rotate(&mut self) -> anyhow::Result<()>;
}

/// The audit file by name and the open file behind it.
pub struct LogFile {
    path: PathBuf,
    file: std::fs::File,
}

impl LogFile {
    /// Opens `path` as [`open_file`] does, remembering its absolute name for reopening.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let path = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
        let file = open_file(&path)?;
        Ok(Self { path, file })
    }

    /// Where a rotation moves the file: `FILE.1` beside it.
    pub fn rotated(&self) -> PathBuf {
        let mut name = OsString::from(self.path.as_os_str());
        name.push(".1");
        PathBuf::from(name)
    }
}

impl Sink for LogFile {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        Write::write_all(&mut self.file, b)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn reopen(&mut self) -> anyhow::Result<()> {
        // Replaced only once the new one is accepted: a refused name keeps the old file.
        self.file = open_file(&self.path)?;
        Ok(())
    }
    fn rotate(&mut self) -> anyhow::Result<()> {
        let ours = self.file.metadata()?;
        // Moved only while the name is still ours: a file renamed away already (logrotate, before
        // its SIGHUP) belongs to whoever moved it, and what has the name now is not ours to move.
        // rename() replaces FILE.1 itself, never what a link there points to.
        let still_ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino());
        if still_ours {
            let to = self.rotated();
            std::fs::rename(&self.path, &to)
                .with_context(|| format!("rotating {} to {}", self.path.display(), to.display()))?;
        }
        self.reopen()
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
    /// `--audit-max-size`: the file is rotated before a line would take it past this.
    max_size: Option<u64>,
}

impl<S: Sink> Audit<S> {
    pub fn new(sink: S) -> Self {
        Self {
            sink,
            failing: None,
            max_size: None,
        }
    }

    /// Rotates the file before it would grow past `max` bytes (None: never).
    #[must_use]
    pub fn with_max_size(mut self, max: Option<u64>) -> Self {
        self.max_size = max;
        self
    }

    /// SIGHUP: the next records go to the file that has the name now (created if none). Err
    /// (the name is refused): records keep going to the file open before.
    pub fn reopen(&mut self) -> anyhow::Result<()> {
        self.sink.reopen()
    }

    /// Writes one record as a line. Returns what to log when auditing starts failing or
    /// resumes (once each).
    pub fn record(&mut self, rec: &AuditRecord) -> Option<String> {
        let line = serde_json::to_string(rec).map(|mut l| {
            l.push('\n');
            l
        });
        let mut before = self.sink.size();
        // Past the cap this line starts a new file. A failed rotation loses the record (the
        // disk's bound comes first), counted like a failed write, and the next one tries again.
        if let (Ok(len), Ok(line), Some(max)) = (&before, &line, self.max_size) {
            if *len > 0 && len.saturating_add(line.len() as u64) > max {
                before = match self.sink.rotate() {
                    Ok(()) => self.sink.size(),
                    Err(e) => Err(std::io::Error::other(format!("{e:#}"))),
                };
            }
        }
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
            f.write_all(b"one\n").unwrap();
            drop(f);
            open_file(&file).unwrap().write_all(b"two\n").unwrap();
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
        /// What rotations set aside, oldest first.
        rotated: Vec<Vec<u8>>,
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
        fn reopen(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
        fn rotate(&mut self) -> anyhow::Result<()> {
            self.rotated.push(std::mem::take(&mut self.data));
            Ok(())
        }
    }

    fn adapt(n: u64) -> AuditRecord {
        AuditRecord::Adapt(crate::controller::record::AdaptNote {
            emulated: false,
            gpu_id: 1,
            reason: format!("calibrated {n:06}"),
            ts_ns: n,
        })
    }

    /// Under `--audit-max-size` the file never grows past it: the line that would take it past
    /// starts a new one, and the full one is set aside whole.
    #[test]
    fn the_cap_rotates_before_a_line_would_pass_it() {
        let line = serde_json::to_string(&adapt(0)).unwrap().len() + 1;
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: usize::MAX,
            rotated: Vec::new(),
        })
        .with_max_size(Some((3 * line + line / 2) as u64));
        for n in 0..10 {
            assert_eq!(a.record(&adapt(n)), None);
        }
        let lines = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap().lines().count();
        // 3 lines fit, the 4th rotates: 3 + 3 + 3 set aside, 1 in the file.
        assert_eq!(a.sink.rotated.len(), 3);
        assert!(a.sink.rotated.iter().all(|r| lines(r) == 3));
        assert_eq!(lines(&a.sink.data), 1);
        assert!(String::from_utf8_lossy(&a.sink.data).contains("calibrated 000009"));
        // No cap, no rotation.
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: usize::MAX,
            rotated: Vec::new(),
        });
        for n in 0..10 {
            a.record(&adapt(n));
        }
        assert!(a.sink.rotated.is_empty());
        assert_eq!(lines(&a.sink.data), 10);
        // A line bigger than the cap still goes to an empty file, alone.
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: usize::MAX,
            rotated: Vec::new(),
        })
        .with_max_size(Some(10));
        a.record(&adapt(1));
        a.record(&adapt(2));
        assert_eq!(a.sink.rotated.len(), 1);
        assert_eq!((lines(&a.sink.rotated[0]), lines(&a.sink.data)), (1, 1));
    }

    #[test]
    fn sizes_parse_in_binary_units_and_bad_ones_say_why() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8KiB"), Ok(8192));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("64MB")
            .unwrap_err()
            .contains("use B, KiB, MiB or GiB"));
        assert!(parse_size("1KiB")
            .unwrap_err()
            .contains("at least 4096 bytes"));
        assert!(parse_size("MiB").unwrap_err().contains("e.g. 64MiB"));
        assert!(parse_size("99999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// What logrotate does: the file is renamed away; until SIGHUP lines still reach it (the
    /// open file), after the reopen they land in a new file with the fixed mode, whatever the
    /// umask.
    #[test]
    fn sighup_reopens_the_file_by_name_after_it_was_renamed_away() {
        let s = Scratch::new("audit-reopen");
        let file = s.0.join("log/audit.jsonl");
        let mut a = Audit::new(LogFile::open(&file).unwrap());
        a.record(&adapt(1));
        let old = s.0.join("log/audit.jsonl-20261129");
        std::fs::rename(&file, &old).unwrap();
        a.record(&adapt(2));
        assert!(!file.exists());
        // SAFETY: umask has no preconditions; restored below.
        let umask = unsafe { libc::umask(0) };
        let r = a.reopen();
        // SAFETY: as above.
        unsafe { libc::umask(umask) };
        r.unwrap();
        a.record(&adapt(3));
        assert_eq!(read(&old).lines().count(), 2);
        assert!(read(&file).contains("calibrated 000003"));
        assert_eq!(read(&file).lines().count(), 1);
        assert_eq!(mode(&file), FILE_MODE);
        // Nothing renamed: the reopen appends to the same file.
        a.reopen().unwrap();
        a.record(&adapt(4));
        assert_eq!(read(&file).lines().count(), 2);
        // The name is a link now: refused, and the records keep going to the file open before.
        let victim = s.0.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        let e = format!("{:#}", a.reopen().unwrap_err());
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(a.record(&adapt(5)), None);
        assert_eq!(read(&victim), "precious");
    }

    /// The real file under the cap: at most `max` bytes each in FILE and FILE.1 (made with the
    /// fixed mode), only whole lines, the newest in FILE; a link at FILE.1 is replaced, never
    /// followed; a file renamed away before the cap is not moved again.
    #[test]
    fn the_cap_keeps_one_rotated_file_beside_it() {
        let s = Scratch::new("audit-cap");
        let file = s.0.join("audit.jsonl");
        let victim = s.0.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let lf = LogFile::open(&file).unwrap();
        let one = lf.rotated();
        assert_eq!(one, s.0.join("audit.jsonl.1"));
        std::os::unix::fs::symlink(&victim, &one).unwrap();
        let max = MIN_MAX_SIZE;
        let mut a = Audit::new(lf).with_max_size(Some(max));
        let n = 200;
        for i in 0..n {
            assert_eq!(a.record(&adapt(i)), None);
        }
        let (cur, prev) = (read(&file), read(&one));
        assert!(cur.len() as u64 <= max && prev.len() as u64 <= max);
        assert!(
            prev.len() as u64 > max - 100,
            "FILE.1 was full: {}",
            prev.len()
        );
        assert_eq!(read(&victim), "precious");
        assert_eq!((mode(&file), mode(&one)), (FILE_MODE, FILE_MODE));
        let last = |t: &str| -> u64 {
            let l = t.lines().last().unwrap();
            serde_json::from_str::<serde_json::Value>(l).unwrap()["ts_ns"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(last(&cur), n - 1);
        // FILE.1 ends where FILE begins: nothing lost between them.
        let first: serde_json::Value = serde_json::from_str(cur.lines().next().unwrap()).unwrap();
        assert_eq!(last(&prev) + 1, first["ts_ns"].as_u64().unwrap());
        // Renamed away (logrotate), no SIGHUP yet: the next rotation leaves that file alone and
        // moves nothing else.
        let away = s.0.join("audit.jsonl-away");
        std::fs::rename(&file, &away).unwrap();
        let before = read(&one);
        let mut i = n;
        while !file.exists() {
            a.record(&adapt(i));
            i += 1;
        }
        assert_eq!(read(&one), before);
        assert!(read(&away).len() as u64 <= max);
        assert_eq!(read(&file).lines().count(), 1);
    }

    #[test]
    fn a_full_disk_loses_whole_lines_counts_them_and_recovers() {
        let rec = adapt(1);
        let line = serde_json::to_string(&rec).unwrap().len() + 1;
        // Room for one line and a bit of the next.
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: line + 2,
            rotated: Vec::new(),
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
