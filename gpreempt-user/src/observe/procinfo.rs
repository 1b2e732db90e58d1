//! `procinfo`: facts about a process read from procfs (comm, cmdline, uid, namespaced pid,
//! cgroup, container id, start time), so the queue monitor can label each queue's owner and
//! notice when a pid has been reused (same pid, different start time).
//!
//! Everything is read under a caller-given proc root so tests can use a fake tree.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What the monitor shows about one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcInfo {
    /// `/proc/P/comm` without the trailing newline.
    pub comm: String,
    /// `/proc/P/cmdline` with NUL separators turned into spaces; empty for kernel threads and zombies.
    pub cmdline: String,
    /// Real uid (first number of the `Uid:` line of `/proc/P/status`).
    pub uid: Option<u32>,
    /// Real gid (first number of `Gid:`) and the supplementary groups (`Groups:`): set by root
    /// at login, a process can drop them but not add any.
    #[serde(skip)]
    pub gid: Option<u32>,
    #[serde(skip)]
    pub groups: Vec<u32>,
    /// Pid in the innermost pid namespace, only when the process is in a child namespace.
    pub ns_pid: Option<u32>,
    /// The cgroup v2 path (`0::` line), else the first line's path.
    pub cgroup: String,
    /// Container id (first 12 hex chars) derived from the cgroup file.
    pub container: Option<String>,
    /// The Kubernetes pod, when the cgroup is under kubelet's `kubepods` hierarchy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::observe::k8s::Pod>,
    /// `starttime` (field 22 of `/proc/P/stat`), clock ticks since boot.
    pub start_time: u64,
}

/// Reads everything about `pid`. Fails only when `/proc/P/stat` cannot be read (the process is
/// gone: `NotFound`) or is malformed (`InvalidData`); other files that are missing or unreadable
/// (e.g. permissions, a process exiting mid-read) leave their field at its default.
pub fn read(proc_root: &Path, pid: u32) -> io::Result<ProcInfo> {
    let dir = pid_dir(proc_root, pid);
    let start_time = read_start_time(&dir)?;
    let comm = read_lossy(&dir.join("comm"))
        .map(|s| s.strip_suffix('\n').unwrap_or(&s).to_owned())
        .unwrap_or_default();
    let cmdline = fs::read(dir.join("cmdline"))
        .map(|b| parse_cmdline(&b))
        .unwrap_or_default();
    let Status {
        uid,
        gid,
        groups,
        ns_pid,
    } = read_lossy(&dir.join("status"))
        .map(|s| parse_status(&s))
        .unwrap_or_default();
    let (cgroup, container) = read_lossy(&dir.join("cgroup"))
        .map(|s| (cgroup_path(&s), container_id(&s)))
        .unwrap_or_default();
    let pod = crate::observe::k8s::attribute(&cgroup, container.as_deref());
    Ok(ProcInfo {
        comm,
        cmdline,
        uid,
        gid,
        groups,
        ns_pid,
        cgroup,
        container,
        pod,
        start_time,
    })
}

impl ProcInfo {
    /// Where it runs, for one column: `namespace/pod` in Kubernetes (the uid's head while
    /// kubelet has not named it), else the container id.
    pub fn place(&self) -> Option<String> {
        match &self.pod {
            Some(p) => Some(match (&p.namespace, &p.name) {
                (Some(ns), Some(name)) => format!("{ns}/{name}"),
                _ => format!("pod {}", &p.uid[..8.min(p.uid.len())]),
            }),
            None => self.container.clone(),
        }
    }
}

/// Only the start time (cheap pid-reuse check).
pub fn start_time(proc_root: &Path, pid: u32) -> io::Result<u64> {
    read_start_time(&pid_dir(proc_root, pid))
}

/// A process, not a pid: whoever gets a freed pid first owns it next, so everything the
/// controller acts on or remembers is named by the pid *and* the start time it had when the
/// process was first seen (field 22 of `/proc/PID/stat`). Before every act the start time is
/// read again ([`ProcId::check`]); where the act can pin the pid first (a ptrace seize, a
/// pidfd) it is read again after that, so the check and the act name the same process.
///
/// The start time counts clock ticks (10 ms at USER_HZ 100): two processes that got the same pid
/// within one tick of each other cannot be told apart by it. The process first seen must have
/// started, been classified and exited inside that tick, and the pid been recycled meanwhile.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ProcId {
    pub pid: u32,
    pub start_time: u64,
}

/// Why a [`ProcId`] no longer names the process that has its pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotThatProcess {
    /// No process has the pid (or its stat cannot be read: nothing is done to it either way).
    Gone,
    /// Another process has the pid now; its start time.
    Reused { start_time: u64 },
}

impl ProcId {
    /// The process that has `pid` now (first sight).
    pub fn now(proc_root: &Path, pid: u32) -> io::Result<Self> {
        Ok(Self {
            pid,
            start_time: start_time(proc_root, pid)?,
        })
    }

    /// Whether `pid` still names this process.
    pub fn check(&self, proc_root: &Path) -> Result<(), NotThatProcess> {
        match start_time(proc_root, self.pid) {
            Ok(t) if t == self.start_time => Ok(()),
            Ok(t) => Err(NotThatProcess::Reused { start_time: t }),
            Err(_) => Err(NotThatProcess::Gone),
        }
    }
}

impl std::fmt::Display for ProcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} (started at tick {})", self.pid, self.start_time)
    }
}

/// Container id from cgroup file text: the first 12 hex chars of a 64-hex-char id found in a
/// path component (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`, or a plain `<id>` under a docker/kubepods/containerd/lxc ancestor).
/// The deepest match wins, so nested containers report the innermost one.
pub fn container_id(cgroup_text: &str) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for line in cgroup_text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let mut under_runtime = false;
        for (depth, comp) in path.split('/').enumerate() {
            if let Some(id) = component_id(comp, under_runtime) {
                // `>=` so a later match at equal depth wins ("last"); deeper always wins.
                if best.is_none_or(|(d, _)| depth >= d) {
                    best = Some((depth, id));
                }
            }
            under_runtime |= matches!(comp, "docker" | "kubepods" | "containerd" | "lxc");
        }
    }
    best.map(|(_, id)| id[..12].to_ascii_lowercase())
}

/// The id carried by one cgroup path component, if any.
fn component_id(comp: &str, under_runtime: bool) -> Option<&str> {
    // conmon is podman's/CRI-O's monitor process, not the container itself.
    if comp.starts_with("libpod-conmon-") || comp.starts_with("crio-conmon-") {
        return None;
    }
    let base = comp.strip_suffix(".scope").unwrap_or(comp);
    for prefix in ["docker-", "cri-containerd-", "crio-", "libpod-"] {
        if let Some(id) = base.strip_prefix(prefix) {
            return is_hex64(id, false).then_some(id);
        }
    }
    // cgroupfs-driver layouts name the directory by the bare id.
    is_hex64(comp, !under_runtime).then_some(comp)
}

fn is_hex64(s: &str, lowercase_only: bool) -> bool {
    s.len() == 64
        && s.bytes().all(|b| {
            b.is_ascii_digit()
                || (b'a'..=b'f').contains(&b)
                || (!lowercase_only && (b'A'..=b'F').contains(&b))
        })
}

fn pid_dir(proc_root: &Path, pid: u32) -> PathBuf {
    proc_root.join(pid.to_string())
}

/// Reads a file as text; procfs text (comm, cgroup names) is not guaranteed UTF-8.
fn read_lossy(path: &Path) -> io::Result<String> {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn read_start_time(dir: &Path) -> io::Result<u64> {
    let path = dir.join("stat");
    let bytes = fs::read(&path).map_err(|e| {
        // Reading a task that exits mid-read yields ESRCH; to callers that is also "gone".
        if e.raw_os_error() == Some(libc::ESRCH) {
            io::Error::new(io::ErrorKind::NotFound, e)
        } else {
            e
        }
    })?;
    parse_stat_start_time(&String::from_utf8_lossy(&bytes)).map_err(|msg| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {msg}", path.display()),
        )
    })
}

/// Field 22 (`starttime`) of a stat line. Parsed after the last ')' because comm (field 2)
/// may itself contain spaces and ')'.
fn parse_stat_start_time(stat: &str) -> Result<u64, String> {
    let (_, rest) = stat
        .rsplit_once(')')
        .ok_or_else(|| "no ')' closing the comm field".to_owned())?;
    // `rest` starts at field 3 (state), so field 22 is the 20th token.
    let field = rest
        .split_whitespace()
        .nth(22 - 3)
        .ok_or_else(|| "fewer than 22 fields".to_owned())?;
    field
        .parse()
        .map_err(|e| format!("starttime {field:?} is not a number: {e}"))
}

fn parse_cmdline(bytes: &[u8]) -> String {
    // Arguments end in NUL; programs that rewrite their argv may leave several.
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let joined: Vec<u8> = bytes[..end]
        .iter()
        .map(|&b| if b == 0 { b' ' } else { b })
        .collect();
    String::from_utf8_lossy(&joined).into_owned()
}

/// The value of `key` in a `/proc/P/status` text (`TracerPid`, `Name`, ...), trimmed.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// (real uid, innermost namespaced pid) from `/proc/P/status`.
/// The identity lines of `/proc/P/status`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Status {
    uid: Option<u32>,
    gid: Option<u32>,
    groups: Vec<u32>,
    ns_pid: Option<u32>,
}

fn parse_status(status: &str) -> Status {
    let mut s = Status::default();
    let first = |v: &str| v.split_whitespace().next().and_then(|n| n.parse().ok());
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            s.uid = first(v);
        } else if let Some(v) = line.strip_prefix("Gid:") {
            s.gid = first(v);
        } else if let Some(v) = line.strip_prefix("Groups:") {
            s.groups = v
                .split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect();
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            let pids: Vec<&str> = v.split_whitespace().collect();
            // A single value means the process lives in the reader's namespace: nothing to add.
            if pids.len() > 1 {
                s.ns_pid = pids.last().and_then(|n| n.parse().ok());
            }
        }
    }
    s
}

/// The cgroup v2 path (`0::<path>`), else the first line's path (cgroup v1 / hybrid).
pub fn cgroup_path(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| text.lines().next().and_then(|l| l.splitn(3, ':').nth(2)))
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c8a2b9d3e7f60112233445566778899aabbccddeeff00112233445566aabb";

    /// A fake proc root under the temp dir, removed on drop.
    struct FakeProc {
        root: PathBuf,
    }

    impl FakeProc {
        fn new(test: &str) -> Self {
            let root = std::env::temp_dir()
                .join(format!("gpreempt-procinfo-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).expect("create fake proc root");
            FakeProc { root }
        }

        /// Writes `files` (name, contents) for `pid`.
        fn add(&self, pid: u32, files: &[(&str, &[u8])]) {
            let dir = pid_dir(&self.root, pid);
            fs::create_dir_all(&dir).expect("create pid dir");
            for (name, data) in files {
                fs::write(dir.join(name), data).expect("write proc file");
            }
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn stat_line(pid: u32, comm: &str, start: u64) -> String {
        format!(
            "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 4 0 {start} \
             123456789 1000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0\n"
        )
    }

    fn status(uid: u32, nspid: &str) -> String {
        format!(
            "Name:\tworker\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\n\
             Pid:\t4242\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n\
             FDSize:\t64\nGroups:\t27 44 \nNStgid:\t{nspid}\nNSpid:\t{nspid}\nThreads:\t4\n"
        )
    }

    #[test]
    fn reads_full_process_with_odd_comm() {
        let fake = FakeProc::new("reads_full_process_with_odd_comm");
        let comm = "my (odd) proc) x";
        fake.add(
            4242,
            &[
                ("stat", stat_line(4242, comm, 987654).as_bytes()),
                ("comm", format!("{comm}\n").as_bytes()),
                ("cmdline", b"python3\0train.py\0--lr\0\0"),
                ("status", status(1000, "4242\t7").as_bytes()),
                (
                    "cgroup",
                    format!("0::/system.slice/docker-{ID}.scope\n").as_bytes(),
                ),
            ],
        );
        let info = read(&fake.root, 4242).expect("read");
        assert_eq!(
            info,
            ProcInfo {
                comm: comm.to_owned(),
                cmdline: "python3 train.py --lr".to_owned(),
                uid: Some(1000),
                gid: Some(100),
                groups: vec![27, 44],
                ns_pid: Some(7),
                cgroup: format!("/system.slice/docker-{ID}.scope"),
                container: Some("4f1c8a2b9d3e".to_owned()),
                pod: None,
                start_time: 987654,
            }
        );
        assert_eq!(start_time(&fake.root, 4242).expect("start_time"), 987654);
    }

    /// The identity check: the same start time is the same process; another start time under
    /// the pid is a reuse (never acted on as the old one); no stat is gone.
    #[test]
    fn a_proc_id_names_one_process_not_its_pid() {
        let fake = FakeProc::new("a_proc_id_names_one_process_not_its_pid");
        fake.add(4242, &[("stat", stat_line(4242, "train", 1000).as_bytes())]);
        let first = ProcId::now(&fake.root, 4242).expect("first sight");
        assert_eq!(
            first,
            ProcId {
                pid: 4242,
                start_time: 1000
            }
        );
        assert_eq!(first.check(&fake.root), Ok(()));
        // The process exits and another one takes the pid, whatever it calls itself.
        fake.add(4242, &[("stat", stat_line(4242, "train", 1001).as_bytes())]);
        assert_eq!(
            first.check(&fake.root),
            Err(NotThatProcess::Reused { start_time: 1001 })
        );
        let second = ProcId::now(&fake.root, 4242).expect("the new owner");
        assert_ne!(first, second);
        assert_eq!(second.check(&fake.root), Ok(()));
        fs::remove_dir_all(pid_dir(&fake.root, 4242)).expect("exit");
        assert_eq!(second.check(&fake.root), Err(NotThatProcess::Gone));
        // A stat that cannot be parsed is not taken for the process either.
        fake.add(4242, &[("stat", b"4242 (x".as_slice())]);
        assert_eq!(second.check(&fake.root), Err(NotThatProcess::Gone));
    }

    /// Against the real /proc: our own identity holds, a pid nobody has is gone.
    #[test]
    fn a_proc_id_of_this_process_checks_out() {
        let me = ProcId::now(Path::new("/proc"), std::process::id()).expect("own stat");
        assert_eq!(me.check(Path::new("/proc")), Ok(()));
        let other = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(
            other.check(Path::new("/proc")),
            Err(NotThatProcess::Reused {
                start_time: me.start_time
            })
        );
    }

    #[test]
    fn single_nspid_is_none_and_host_cgroup_has_no_container() {
        let fake = FakeProc::new("single_nspid_is_none_and_host_cgroup_has_no_container");
        fake.add(
            77,
            &[
                ("stat", stat_line(77, "bash", 5).as_bytes()),
                ("comm", b"bash\n"),
                ("cmdline", b"-bash\0"),
                ("status", status(0, "77").as_bytes()),
                ("cgroup", b"0::/user.slice/user-0.slice/session-1.scope\n"),
            ],
        );
        let info = read(&fake.root, 77).expect("read");
        assert_eq!(info.comm, "bash");
        assert_eq!(info.cmdline, "-bash");
        assert_eq!(info.uid, Some(0));
        assert_eq!(info.ns_pid, None);
        assert_eq!(info.cgroup, "/user.slice/user-0.slice/session-1.scope");
        assert_eq!(info.container, None);
        assert_eq!(info.start_time, 5);
    }

    #[test]
    fn missing_optional_files_leave_defaults() {
        let fake = FakeProc::new("missing_optional_files_leave_defaults");
        // Kernel thread: empty cmdline; no cgroup or status file at all.
        fake.add(
            2,
            &[
                ("stat", stat_line(2, "kthreadd", 3).as_bytes()),
                ("comm", b"kthreadd\n"),
                ("cmdline", b""),
            ],
        );
        let info = read(&fake.root, 2).expect("read");
        assert_eq!(
            info,
            ProcInfo {
                comm: "kthreadd".to_owned(),
                start_time: 3,
                ..ProcInfo::default()
            }
        );
    }

    #[test]
    fn missing_process_is_not_found() {
        let fake = FakeProc::new("missing_process_is_not_found");
        let err = read(&fake.root, 31337).expect_err("no such pid");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let err = start_time(&fake.root, 31337).expect_err("no such pid");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn malformed_stat_is_invalid_data() {
        let fake = FakeProc::new("malformed_stat_is_invalid_data");
        fake.add(10, &[("stat", b"10 (no close paren S 1 2 3")]);
        fake.add(11, &[("stat", b"11 (short) S 1 2 3\n")]);
        fake.add(
            12,
            &[(
                "stat",
                stat_line(12, "x", 0)
                    .replace(" 0 123456789", " zz 123456789")
                    .as_bytes(),
            )],
        );
        for pid in [10, 11, 12] {
            let err = read(&fake.root, pid).expect_err("malformed");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "pid {pid}: {err}");
        }
    }

    #[test]
    fn container_id_docker() {
        assert_eq!(
            container_id(&format!("0::/system.slice/docker-{ID}.scope\n")),
            Some("4f1c8a2b9d3e".to_owned())
        );
        // cgroupfs driver, cgroup v1 style.
        assert_eq!(
            container_id(&format!("12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n")),
            Some("4f1c8a2b9d3e".to_owned())
        );
    }

    #[test]
    fn container_id_cri_containerd_kubepods() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_112233445566.slice/\
             cri-containerd-{ID}.scope\n"
        );
        assert_eq!(container_id(&text), Some("4f1c8a2b9d3e".to_owned()));
        // cgroupfs driver: bare id under the pod directory.
        let text = format!("0::/kubepods/besteffort/pod1a2b3c4d-5e6f/{ID}\n");
        assert_eq!(container_id(&text), Some("4f1c8a2b9d3e".to_owned()));
    }

    #[test]
    fn container_id_podman_libpod_ignores_conmon() {
        let conmon = "aa".repeat(32);
        let text = format!(
            "0::/machine.slice/libpod-{ID}.scope/container\n1:name=systemd:/machine.slice/libpod-conmon-{conmon}.scope\n"
        );
        assert_eq!(container_id(&text), Some("4f1c8a2b9d3e".to_owned()));
        let only_conmon = format!("0::/machine.slice/libpod-conmon-{conmon}.scope\n");
        assert_eq!(container_id(&only_conmon), None);
    }

    #[test]
    fn container_id_prefers_deepest_and_rejects_non_ids() {
        let inner = "0123456789abcdef".repeat(4);
        assert_eq!(
            container_id(&format!("0::/docker/{ID}/docker/{inner}\n")),
            Some("0123456789ab".to_owned())
        );
        assert_eq!(
            container_id("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
        assert_eq!(container_id("0::/docker-abc.scope\n"), None);
        assert_eq!(container_id("0::/lxc/mycontainer\n"), None);
        assert_eq!(container_id(""), None);
    }

    #[test]
    fn reads_real_self() {
        let pid = std::process::id();
        let info = read(Path::new("/proc"), pid).expect("read /proc/self");
        assert!(!info.comm.is_empty());
        assert!(info.start_time > 0);
        // SAFETY: getuid has no preconditions and cannot fail.
        assert_eq!(info.uid, Some(unsafe { libc::getuid() }));
        assert_eq!(
            start_time(Path::new("/proc"), pid).expect("start_time"),
            info.start_time
        );
    }
}
