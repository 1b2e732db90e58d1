//! Helpers for the kernel tests: run the built `gpreempt-ebpf` and `kfd-poke` binaries as real
//! processes. Kernel tests run as root and fail loudly when they cannot run; they never skip.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

/// A binary built by `cargo build --bins` (the README's test command builds them first).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run the tests with `cargo xtask test` (it builds the binaries first)",
        p.display()
    );
    p
}

/// Kernel tests need root; say so instead of skipping.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "kernel tests load eBPF programs and must run as root (sudo -E cargo xtask test)"
    );
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("gpreempt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        // Whatever the umask: a run directory inside must not be refused for an open parent,
        // and a test's non-root peer must be able to reach in.
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod temp dir");
        Self(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `gpreempt-ebpf trace --json --output FILE`.
pub struct Tracer {
    child: Child,
    output: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Tracer {
    /// Starts the tracer and waits until its programs are attached.
    pub fn start(output: &Path, kfd_device: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(bin("gpreempt-ebpf"))
            .arg("trace")
            .arg("--json")
            .arg("--output")
            .arg(output)
            .arg("--kfd-device")
            .arg(kfd_device)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning gpreempt-ebpf trace");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = stderr.clone();
        let pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains("tracing KFD ioctls") {
                    let _ = tx.send(());
                }
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!(
                "the tracer did not attach within 60 s; stderr:\n{}",
                stderr.lock().unwrap()
            );
        }
        Self {
            child,
            output: output.to_path_buf(),
            stderr,
        }
    }

    /// The JSON events written so far.
    pub fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        text.lines()
            .filter(|l| l.ends_with('}'))
            .map(|l| serde_json::from_str(l).expect("valid JSON line"))
            .collect()
    }

    /// Waits until `pred` holds for the events written so far.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let t = Instant::now();
        loop {
            let ev = self.events();
            if pred(&ev) {
                return ev;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}; events so far: {ev:#?}\nstderr:\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the tracer printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGINT, then the events and the summary line.
    pub fn stop(mut self) -> (Vec<Value>, Summary) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("waiting for the tracer");
        let err = self.stderr.lock().unwrap().clone();
        assert!(status.success(), "tracer failed: {status}\n{err}");
        // The stderr thread may lag the exit slightly.
        let t = Instant::now();
        while !self.stderr.lock().unwrap().contains("summary:")
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let err = self.stderr.lock().unwrap().clone();
        let summary = Summary::parse(&err).unwrap_or_else(|| panic!("no summary line in:\n{err}"));
        (self.events(), summary)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tracer's closing `summary:` line.
#[derive(Debug, Default)]
pub struct Summary {
    pub fields: std::collections::HashMap<String, u64>,
    /// The tracer's whole stderr, up to the summary line.
    pub stderr: String,
}

impl Summary {
    fn parse(stderr: &str) -> Option<Self> {
        let line = stderr.lines().find(|l| l.contains("summary:"))?;
        let fields = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect();
        Some(Self {
            fields,
            stderr: stderr.to_string(),
        })
    }
    pub fn get(&self, k: &str) -> u64 {
        *self
            .fields
            .get(k)
            .unwrap_or_else(|| panic!("summary lacks {k}: {:?}", self.fields))
    }
}

/// A running `kfd-poke`, waiting for "go" on stdin.
pub struct Poke {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Poke {
    pub fn spawn(file: &Path, args: &[&str]) -> Self {
        let mut c = Command::new(bin("kfd-poke"));
        c.arg(file).args(args);
        Self::from_command(c)
    }

    /// `kfd-poke /dev/nvidiactl ARGS` in a private mount namespace where /dev is a tmpfs and
    /// the regular file `stand_in` is bound at /dev/nvidiactl: ioctls fail (ENOTTY), the fd
    /// reads as an NVIDIA node, and the tracer knows the file by `--nvidia-device stand_in`.
    pub fn spawn_as_nvidiactl(stand_in: &Path, args: &[&str]) -> Self {
        std::fs::write(stand_in, b"").expect("creating the nvidiactl stand-in");
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount -t tmpfs none /dev && : > /dev/nvidiactl && mount --bind \"$0\" /dev/nvidiactl \
                 && p=\"$1\" && shift && exec \"$p\" /dev/nvidiactl \"$@\"",
            )
            .arg(stand_in)
            .arg(bin("kfd-poke"))
            .args(args);
        Self::from_command(c)
    }

    fn from_command(mut c: Command) -> Self {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning kfd-poke");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("kfd-poke output");
        assert_eq!(line.trim(), "ready", "kfd-poke did not start");
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs the ioctls; returns kfd-poke's output lines up to "done".
    pub fn go(&mut self) -> Vec<String> {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("writing to kfd-poke");
        stdin.flush().expect("flush");
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("kfd-poke output");
            assert!(n > 0, "kfd-poke exited before done");
            if line.trim() == "done" {
                return lines;
            }
            lines.push(line.trim().to_string());
        }
    }

    /// Closes stdin and waits for the exit.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("waiting for kfd-poke");
        assert!(status.success(), "kfd-poke failed: {status}");
    }
}

impl Drop for Poke {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sim at a time (per test binary): each test also checks that no sim left anything behind.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What earlier runs (a killed test binary, a crashed sim) may have left on this machine, taken
/// when this binary first asks for the lock: tests judge only what they themselves leave.
static BASELINE: std::sync::OnceLock<Leftovers> = std::sync::OnceLock::new();

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    BASELINE.get_or_init(Leftovers::now);
    guard
}

/// Where the cgroup v2 hierarchy is mounted (its paths are what /proc/PID/cgroup's `0::` shows).
pub fn cgroup2_root() -> Option<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))
}

/// Traces of sims on this machine: scratch directories, cgroups and workload processes.
#[derive(Default)]
struct Leftovers {
    dirs: std::collections::BTreeSet<String>,
    cgroups: std::collections::BTreeSet<String>,
    procs: std::collections::BTreeSet<u32>,
}

/// The variable `cargo xtask test` sets to the lane a test binary runs in: binaries of two
/// lanes run at the same time, so a leftover counts only where it is this lane's.
pub const LANE_VAR: &str = "GPREEMPT_TEST_LANE";

/// Whether `pid` was started under this test lane (its environment carries our lane), or, for
/// a sim's scratch name, whether its sim is gone (a dead sim's leftover is a leak whoever ran
/// it). Without a lane (a plain `cargo test`) everything is ours.
fn ours(pid: u32, dead_is_ours: bool) -> bool {
    let Some(lane) = std::env::var_os(LANE_VAR) else {
        return true;
    };
    let mut mark = std::ffi::OsString::from(format!("{LANE_VAR}="));
    mark.push(lane);
    let mark = mark.into_encoded_bytes();
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|&b| b == 0).any(|v| v == mark.as_slice()),
        Err(_) => dead_is_ours,
    }
}

impl Leftovers {
    fn now() -> Self {
        let sim_name = |n: &String| {
            n.strip_prefix("gpreempt-sim.")
                .is_some_and(|pid| pid.parse().map_or(true, |pid| ours(pid, true)))
        };
        let dirs = std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(sim_name)
            .collect();
        let cgroups = cgroup2_root()
            .into_iter()
            .flat_map(|root| std::fs::read_dir(root).into_iter().flatten())
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(sim_name)
            .collect();
        let procs = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let e = e.ok()?;
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let c = std::fs::read_to_string(e.path().join("cmdline")).ok()?;
                ((c.contains("sim\0workload") || c.starts_with("kfd-client")) && ours(pid, false))
                    .then_some(pid)
            })
            .collect();
        Self {
            dirs,
            cgroups,
            procs,
        }
    }

    /// What is here now and was not when the baseline was taken.
    fn new_since(&self, base: &Self) -> Self {
        Self {
            dirs: self.dirs.difference(&base.dirs).cloned().collect(),
            cgroups: self.cgroups.difference(&base.cgroups).cloned().collect(),
            procs: self.procs.difference(&base.procs).copied().collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.cgroups.is_empty() && self.procs.is_empty()
    }
}

/// A shell line that unmounts every mount of these filesystem types in the current mount
/// namespace, deepest first (debugfs carries an automount of tracefs at its `tracing`); a mount
/// that cannot be unmounted (hidden under another) is left. Only for a private mount namespace
/// (`unshare -m`, or inside `sim`).
pub fn unmount_script(fstypes: &[&str]) -> String {
    let cond = fstypes
        .iter()
        .map(|t| format!("$(i+1)==\"{t}\""))
        .collect::<Vec<_>>()
        .join("||");
    format!(
        "awk '{{for(i=7;i<=NF;i++) if($i==\"-\"){{if({cond}) print $5; break}}}}' /proc/self/mountinfo \
         | sort -r | while read -r m; do umount -l \"$m\" 2>/dev/null || true; done"
    )
}

/// `COMMAND` in a private mount namespace where tracefs and debugfs start unmounted, whatever
/// this machine has mounted; with `mount_tracefs`, tracefs is then mounted where the tool
/// expects it. Nothing done in there reaches the host's mounts.
pub fn in_fresh_mounts(mount_tracefs: bool, program: &Path, args: &[&str]) -> Command {
    let mut script = format!("set -e; {}; ", unmount_script(&["tracefs", "debugfs"]));
    if mount_tracefs {
        script.push_str("mount -t tracefs tracefs /sys/kernel/tracing; ");
    }
    script.push_str("exec \"$0\" \"$@\"");
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(program)
        .args(args);
    c
}

/// `gpreempt-ebpf sim -- sh -c SCRIPT` with $GP set to the binary; killed after `limit`.
pub fn sim(script: &str, limit: Duration) -> Output {
    require_root();
    let gp = bin("gpreempt-ebpf");
    let mut child = Command::new(&gp)
        .args(["sim", "--seed", "3", "--", "sh", "-c", script])
        .env("GP", &gp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting sim");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "sim did not finish in {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        out.status.success(),
        "sim failed ({:?}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// No mount namespace, cgroup, directory or process of any sim is left (beyond what was here
/// before this test binary started).
pub fn assert_nothing_left() {
    let base = BASELINE.get_or_init(Leftovers::default);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = Leftovers::now().new_since(base);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: dirs {:?}, cgroups {:?}, processes {:?}",
            left.dirs,
            left.cgroups,
            left.procs
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The records of an audit log's text (`run --audit`), each line read through the controller's
/// own type: a line it cannot read fails the test.
pub fn audit_records(text: &str) -> Vec<gpreempt_user::controller::record::AuditRecord> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line: {e}: {l}")))
        .collect()
}

/// The records of the audit log at `p`; none when there is no file.
pub fn audit_log(p: &Path) -> Vec<gpreempt_user::controller::record::AuditRecord> {
    audit_records(&std::fs::read_to_string(p).unwrap_or_default())
}

/// The links of a markdown text outside fenced blocks: (1-based line, target) for every
/// `](target)` whose target is not a URL (`scheme:`); same-page anchors (`#x`) included.
pub fn md_links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = &tail[..end];
            let scheme = target
                .split_once(':')
                .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()));
            if !target.is_empty() && !scheme {
                out.push((i + 1, target.to_string()));
            }
            rest = &tail[end..];
        }
    }
    out
}

/// The anchors GitHub makes for a markdown text's headings (outside fenced blocks): lower case,
/// punctuation but `-` and `_` dropped, spaces to `-`, repeats numbered `-1`, `-2`, ...
pub fn md_anchors(text: &str) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        if fenced || !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut name = slug.clone();
        let mut n = 0;
        while out.contains(&name) {
            n += 1;
            name = format!("{slug}-{n}");
        }
        out.insert(name);
    }
    out
}

/// `base` joined with a relative `link` path, `.` and `..` resolved lexically (the target need
/// not exist).
pub fn join_lexically(base: &Path, link: &str) -> PathBuf {
    let mut out = base.to_path_buf();
    for part in link.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out
}

/// The package `cargo xtask package` left in target/debian.
pub fn deb() -> std::path::PathBuf {
    let dir = bin("gpreempt-ebpf").parent().unwrap().join("../debian");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: build it with `cargo xtask package`",
                dir.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}: `cargo xtask package`", dir.display()))
}
