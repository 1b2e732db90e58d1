//! Opening a file that a GPU process names: a code object's `file://` URI in ROCr's loader list,
//! or a file its `/proc/PID/maps` lists. The controller runs as root, and the name is the
//! process's to choose (a user can make it a pty, a FIFO, a link to a root-only file, or a mount
//! of their own in a user namespace), so root's privileges must never reach it:
//!
//! - the path is resolved inside the process's own root (`openat2` against `/proc/PID/root` with
//!   `RESOLVE_IN_ROOT`: `..` and absolute links stay in it) and through no magic link
//!   (`RESOLVE_NO_MAGICLINKS`: no `/proc/*/root` or `/proc/*/fd` hop out of it);
//! - by a short-lived thread that takes the process's file-system credentials (its fsuid, fsgid
//!   and supplementary groups, from `/proc/PID/status`) first, so the kernel checks every
//!   directory and the file against what the process itself may read (`setfsuid` away from 0
//!   drops `CAP_DAC_OVERRIDE` / `CAP_DAC_READ_SEARCH` from that thread); the thread ends with
//!   the open, so the credentials never leave it;
//! - first with `O_PATH | O_NOFOLLOW` (no driver's open runs, a link as the last component is
//!   refused), then only a regular file that is not on a FUSE file system is opened for reading,
//!   `O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC`: no controlling terminal, no FIFO wait;
//! - within [`OPEN_TIMEOUT`]: an open stuck in a file system is abandoned (at most
//!   [`MAX_STUCK_OPENS`] at once; past that, opens are refused until they return).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

/// How long one open may take before it is abandoned.
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(1);
/// Opens abandoned and not yet returned, at most (each holds a thread).
pub(crate) const MAX_STUCK_OPENS: usize = 4;
static OPENS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// A process's file-system credentials, as `/proc/PID/status` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Creds {
    pub fsuid: u32,
    pub fsgid: u32,
    pub groups: Vec<u32>,
}

/// The fsuid and fsgid (the fourth value of `Uid:` / `Gid:`) and `Groups:` of a status file.
pub(crate) fn parse_creds(status: &str) -> Option<Creds> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
    };
    let fs = |key: &str| -> Option<u32> { field(key)?.get(3)?.parse().ok() };
    let groups = field("Groups:")?
        .iter()
        .map(|g| g.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    Some(Creds {
        fsuid: fs("Uid:")?,
        fsgid: fs("Gid:")?,
        groups,
    })
}

fn cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .with_context(|| format!("{} has a NUL byte", p.display()))
}

/// `open(2)` relative to `dir` (or the working directory), as an owned fd.
fn openat(dir: Option<&OwnedFd>, path: &CString, flags: i32) -> io::Result<OwnedFd> {
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `path` is a NUL-terminated string that outlives the call; the returned fd, when
    // not negative, is a new descriptor nobody else owns.
    let fd = unsafe { libc::openat(dirfd, path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` (absolute, as process `pid` under `proc_root` names it) for reading, as that
/// process could itself; a regular file only (see the module's documentation). The error says
/// why not, e.g. `not a regular file (a FIFO)`.
pub(crate) fn open(proc_root: &Path, pid: u32, path: &Path) -> Result<File> {
    let rel = path
        .strip_prefix("/")
        .with_context(|| format!("{} is not an absolute path", path.display()))?;
    if rel.as_os_str().is_empty() {
        bail!("{} names no file", path.display());
    }
    let rel = cstring(rel)?;
    // The process's directory pins it: "status" and "root" are then the same process's, even
    // if its pid is reused meanwhile (reads of a dead process's directory fail with ESRCH).
    let pid_dir = openat(
        None,
        &cstring(&proc_root.join(pid.to_string()))?,
        libc::O_PATH | libc::O_DIRECTORY,
    )
    .map_err(|e| gone_or(e, pid, "opening its /proc directory"))?;
    let status = openat(Some(&pid_dir), &CString::from(c"status"), libc::O_RDONLY)
        .map_err(|e| gone_or(e, pid, "opening its status"))?;
    let status = io::read_to_string(File::from(status))
        .map_err(|e| gone_or(e, pid, "reading its status"))?;
    let creds = parse_creds(&status)
        .with_context(|| format!("pid {pid}: no Uid/Gid/Groups lines in its status"))?;
    let root = openat(
        Some(&pid_dir),
        &CString::from(c"root"),
        libc::O_PATH | libc::O_DIRECTORY,
    )
    .map_err(|e| gone_or(e, pid, "opening its root directory"))?;

    if OPENS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst) >= MAX_STUCK_OPENS {
        OPENS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        bail!(
            "{MAX_STUCK_OPENS} earlier opens of files named by processes are still stuck (a hung \
             FUSE or network file system?); not opening {} until they return",
            path.display()
        );
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("open-as-target".into())
        .spawn(move || {
            let r = open_as(&creds, &root, &rel);
            OPENS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            // The caller may have given up waiting: the file is then closed here.
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        OPENS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        bail!("cannot start a thread to open {}: {e}", path.display());
    }
    match rx.recv_timeout(OPEN_TIMEOUT) {
        Ok(r) => r.with_context(|| format!("opening {} as pid {pid}", path.display())),
        Err(_) => bail!(
            "opening {} took longer than {} ms (a hung FUSE or network file system?); skipped",
            path.display(),
            OPEN_TIMEOUT.as_millis()
        ),
    }
}

fn gone_or(e: io::Error, pid: u32, what: &str) -> anyhow::Error {
    if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) {
        ProcessGone { pid }.into()
    } else {
        anyhow::Error::new(e).context(format!("pid {pid}: {what}"))
    }
}

/// Takes `creds` as this thread's file-system credentials. The raw system calls act on the
/// calling thread alone (glibc's `setgroups` would change every thread of the controller).
fn become_(creds: &Creds) -> io::Result<()> {
    // SAFETY: setgroups reads `len` gids from a live slice; it changes only this thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            creds.groups.len(),
            creds.groups.as_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take plain integers and change only this thread. They report
    // no error, so each is read back: an invalid id (-1) changes nothing and returns the
    // current one.
    let (gid, uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, creds.fsgid);
        libc::syscall(libc::SYS_setfsuid, creds.fsuid);
        (
            libc::syscall(libc::SYS_setfsgid, u32::MAX),
            libc::syscall(libc::SYS_setfsuid, u32::MAX),
        )
    };
    if gid != i64::from(creds.fsgid) || uid != i64::from(creds.fsuid) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFSOCK => "a socket",
        _ => "not a plain file",
    }
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// The kernel's `struct open_how` (`<linux/openat2.h>`; libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The open itself, on the short-lived thread.
fn open_as(creds: &Creds, root: &OwnedFd, rel: &CString) -> Result<File> {
    // SAFETY: geteuid has no preconditions.
    let privileged = unsafe { libc::geteuid() } == 0;
    if let Err(e) = become_(creds) {
        // Without root the kernel holds this reader to its own rights already, which lend the
        // process nothing it could not do: go on as we are. Root must not.
        if privileged {
            return Err(e).context(format!(
                "cannot take its credentials (fsuid {}, fsgid {}): the controller needs \
                 CAP_SETUID and CAP_SETGID (a systemd unit's CapabilityBoundingSet= must keep them)",
                creds.fsuid, creds.fsgid
            ));
        }
    }
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `root` is an open directory, `rel` a NUL-terminated path and `how` an open_how
    // whose size is passed; a non-negative result is a new descriptor nobody else owns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Err(e).context(
                "no openat2 here (Linux 5.6 or later is needed to open it safely; a seccomp \
                 filter may refuse it: systemd's RestrictSUIDSGID= does, and containers' may)",
            );
        }
        if e.raw_os_error() == Some(libc::EXDEV) || e.raw_os_error() == Some(libc::ELOOP) {
            return Err(e).context("its path goes through a /proc magic link or out of its root");
        }
        return Err(e.into());
    }
    // SAFETY: `fd` was just returned by openat2 and is owned by nothing else.
    let path_fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let st = fstat(&path_fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        bail!("not a regular file ({})", kind_of(st.st_mode));
    }
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path_fd` is open (O_PATH fds may be fstatfs'd) and `fs` is writable.
    if unsafe { libc::fstatfs(path_fd.as_raw_fd(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    // A FUSE server can make any read wait forever.
    if fs.f_type == libc::FUSE_SUPER_MAGIC {
        bail!("on a FUSE file system (its server could make the read wait forever); not read");
    }
    // Now open it for reading: through our own fd link, which reaches this very file (no
    // second path walk) and checks read permission with the credentials taken above.
    let reopen = CString::new(format!("/proc/self/fd/{}", path_fd.as_raw_fd()))?;
    let fd = openat(
        None,
        &reopen,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
    )?;
    let again = fstat(&fd)?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        bail!("the file changed while it was opened");
    }
    Ok(File::from(fd))
}

/// Whether opening failed for want of a permission or a system call (EPERM, EACCES, ENOSYS
/// anywhere in the chain): the controller's own sandbox, capabilities or seccomp filter (a
/// container's refuses what it does not know, openat2 among them), or the file's modes. Worth a
/// warning, unlike a process that exited or a file that is not there.
pub(crate) fn permission_problem(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            .is_some_and(|n| [libc::EPERM, libc::EACCES, libc::ENOSYS].contains(&n))
    })
}

/// At most one warning a minute from one place: the names that fail are the processes' to
/// choose, so they could otherwise flood the journal. The rest go to debug.
pub(crate) struct WarnGate {
    last: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long a [`WarnGate`] stays shut after a warning.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

impl WarnGate {
    pub(crate) const fn new() -> Self {
        Self {
            last: std::sync::Mutex::new(None),
        }
    }

    /// Whether a failure is worth a warning at `now`: one for want of a permission (`denied`),
    /// through the gate; anything else stays at its usual level.
    pub(crate) fn warn(&self, denied: bool, now: std::time::Instant) -> bool {
        denied && self.open(now)
    }

    /// Whether a warning may go out at `now` (it then counts as given).
    pub(crate) fn open(&self, now: std::time::Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match *last {
            Some(t) if now.saturating_duration_since(t) < WARN_EVERY => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

/// Logs a failed open of a file `pid` names: a permission problem as a warning (through
/// `gate`), anything else at debug level.
pub(crate) fn log_failure(gate: &WarnGate, what: &str, pid: u32, name: &str, e: &anyhow::Error) {
    if gate.warn(permission_problem(e), std::time::Instant::now()) {
        log::warn!(
            "{what}: pid {pid}: cannot read {name}: {e:#} (permission problems of this kind are \
             logged once a minute, the rest at debug level)"
        );
    } else {
        log::debug!("{what}: pid {pid}: {name}: {e:#}");
    }
}

/// A status file with this process's credentials, for fake `/proc` trees in tests.
/// The process is gone (exited, or a zombie with no address space left): not a failure of the
/// caller's, so `launch::is_gone` lets it tell this apart from real errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGone {
    pub pid: u32,
}

impl std::fmt::Display for ProcessGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} exited", self.pid)
    }
}

impl std::error::Error for ProcessGone {}

#[cfg(test)]
pub(crate) fn own_status() -> String {
    // SAFETY: getuid/getgid have no preconditions.
    let (u, g) = unsafe { (libc::getuid(), libc::getgid()) };
    format!("Name:\ttest\nUid:\t{u}\t{u}\t{u}\t{u}\nGid:\t{g}\t{g}\t{g}\t{g}\nGroups:\t\n")
}

/// A new pseudo-terminal: its master (kept open by the caller) and the slave's path.
#[cfg(test)]
pub(crate) fn new_pty() -> (OwnedFd, std::path::PathBuf) {
    // SAFETY: posix_openpt returns a new fd or -1; O_NOCTTY keeps it from becoming our terminal.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "posix_openpt: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `master` is a pty master; `name` is a writable buffer of the length passed.
    unsafe {
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0
        );
    }
    // SAFETY: ptsname_r wrote a NUL-terminated string into `name`.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    (master, std::ffi::OsStr::from_bytes(path.to_bytes()).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    use std::time::Instant;

    fn err(r: Result<File>) -> String {
        format!("{:#}", r.expect_err("an error"))
    }

    fn me() -> u32 {
        std::process::id()
    }

    /// Named by a process running as nobody, files it could not read itself are refused, and
    /// files it could are read; the same names opened for root (this test) all open.
    #[test]
    fn opens_with_the_processs_own_rights() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test needs root (it runs a process as nobody)"
        );
        let dir = std::env::temp_dir().join(format!("gpreempt-target-file-{}", me()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("private")).unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&dir, 0o755);
        mode(&dir.join("private"), 0o700);
        std::fs::write(dir.join("public.co"), b"public").unwrap();
        mode(&dir.join("public.co"), 0o644);
        std::fs::write(dir.join("secret"), b"root's").unwrap();
        mode(&dir.join("secret"), 0o600);
        std::fs::write(dir.join("private/inner.co"), b"inner").unwrap();
        mode(&dir.join("private/inner.co"), 0o644);
        std::os::unix::fs::symlink(dir.join("secret"), dir.join("link")).unwrap();

        let mut nobody = std::process::Command::new("sleep")
            .arg("60")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let pid = nobody.id();
        let proc = Path::new("/proc");
        let read = |f: File| io::read_to_string(f).unwrap();

        assert_eq!(
            read(open(proc, pid, &dir.join("public.co")).unwrap()),
            "public"
        );
        let e = err(open(proc, pid, &dir.join("secret")));
        assert!(e.contains("Permission denied"), "{e}");
        let e = err(open(proc, pid, &dir.join("private/inner.co")));
        assert!(e.contains("Permission denied"), "{e}");
        let e = err(open(proc, pid, &dir.join("link")));
        assert!(e.contains("not a regular file (a symbolic link)"), "{e}");
        // A hop through a magic link (here into our own root) is refused.
        let via_magic = Path::new("/proc")
            .join(me().to_string())
            .join("root")
            .join(dir.join("public.co").strip_prefix("/").unwrap());
        let e = err(open(proc, pid, &via_magic));
        assert!(e.contains("magic link"), "{e}");

        // Root's own names: root may read them.
        assert_eq!(
            read(open(proc, me(), &dir.join("secret")).unwrap()),
            "root's"
        );
        assert_eq!(
            read(open(proc, me(), &dir.join("private/inner.co")).unwrap()),
            "inner"
        );
        // Our own credentials are untouched by the opens' threads.
        // SAFETY: setfsuid(-1) changes nothing and returns the current fsuid.
        assert_eq!(unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) }, 0);

        nobody.kill().unwrap();
        nobody.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO, a pty, a device and a directory are refused at once (none is opened for
    /// reading: no wait for a writer, no controlling terminal).
    #[test]
    fn only_regular_files_are_opened() {
        let dir = std::env::temp_dir().join(format!("gpreempt-target-kinds-{}", me()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("co.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let (_master, pty) = new_pty();
        let proc = Path::new("/proc");
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (pty.as_path(), "a character device"),
            (Path::new("/dev/null"), "a character device"),
            (dir.as_path(), "a directory"),
        ] {
            let t = Instant::now();
            // On a thread of its own, so that an open that blocks fails the test, not hang it.
            let (tx, rx) = std::sync::mpsc::channel();
            let p = path.to_path_buf();
            std::thread::spawn(move || {
                let _ = tx.send(err(open(Path::new("/proc"), me(), &p)));
            });
            let e = rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("opening {} blocked", path.display()));
            assert!(e.contains(&format!("not a regular file ({kind})")), "{e}");
            assert!(
                t.elapsed() < OPEN_TIMEOUT,
                "{}: {:?}",
                path.display(),
                t.elapsed()
            );
        }
        let e = err(open(proc, me(), Path::new("relative/x")));
        assert!(e.contains("not an absolute path"), "{e}");
        let gone = open(proc, 1 << 30, Path::new("/x")).unwrap_err();
        assert!(crate::observe::launch::is_gone(&gone), "{gone:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Refusals for want of a permission are told apart from the rest, however deep in the
    /// chain; the gate lets one warning a minute through.
    #[test]
    fn permission_problems_warn_once_a_minute() {
        let eperm = anyhow::Error::new(io::Error::from_raw_os_error(libc::EPERM))
            .context("cannot take its credentials")
            .context("opening /x as pid 3");
        assert!(permission_problem(&eperm));
        let eacces: anyhow::Error = io::Error::from_raw_os_error(libc::EACCES).into();
        assert!(permission_problem(&eacces));
        let seccomp =
            anyhow::Error::new(io::Error::from_raw_os_error(libc::ENOSYS)).context("no openat2");
        assert!(permission_problem(&seccomp));
        for other in [
            anyhow::Error::new(io::Error::from_raw_os_error(libc::ENOENT)),
            anyhow::anyhow!("not a regular file (a FIFO)"),
            ProcessGone { pid: 3 }.into(),
        ] {
            assert!(!permission_problem(&other), "{other:#}");
        }
        let gate = WarnGate::new();
        let t0 = Instant::now();
        assert!(gate.open(t0));
        assert!(!gate.open(t0 + Duration::from_secs(59)));
        assert!(gate.open(t0 + WARN_EVERY));
        assert!(!gate.open(t0 + WARN_EVERY + Duration::from_secs(1)));
        // Only refusals for want of a permission go through it.
        let gate = WarnGate::new();
        assert!(!gate.warn(false, t0));
        assert!(gate.warn(true, t0));
        assert!(!gate.warn(true, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn status_credentials() {
        let s = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t20\t21\t22\t23\nGroups:\t4 27 \n";
        assert_eq!(
            parse_creds(s),
            Some(Creds {
                fsuid: 1003,
                fsgid: 23,
                groups: vec![4, 27]
            })
        );
        let none = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n";
        assert_eq!(parse_creds(none).map(|c| c.groups), Some(vec![]));
        assert_eq!(
            parse_creds("Uid:\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\n"),
            None
        );
        assert_eq!(parse_creds("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"), None);
    }
}
