//! Tracer overhead: the tracers compared (none, `gpreempt-ebpf trace`, bpftrace, strace), starting and
//! stopping one, and `kfd-poke bench` timing ioctls under it.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::release_bin;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Tracer {
    None,
    Gpreempt,
    Bpftrace,
    Strace,
}

impl Tracer {
    pub(super) fn label(self) -> &'static str {
        match self {
            Tracer::None => "no tracer",
            Tracer::Gpreempt => "gpreempt-ebpf trace",
            Tracer::Bpftrace => "bpftrace one-liner",
            Tracer::Strace => "strace -e trace=ioctl",
        }
    }
}

pub(super) const KINDS: [&str; 4] = ["kfd", "other", "k_out_of_range", "kfd_on_null"];

/// A type-byte filter (what gpreempt-ebpf falls back to without BTF): type 'K', KFD nr ranges;
/// duration at exit. gpreempt-ebpf itself matches the file behind the fd.
const BPFTRACE_PROG: &str = r#"
tracepoint:syscalls:sys_enter_ioctl
/ ((args->cmd >> 8) & 0xff) == 0x4b &&
  (((args->cmd & 0xff) >= 0x01 && (args->cmd & 0xff) < 0x29) ||
   ((args->cmd & 0xff) >= 0x80 && (args->cmd & 0xff) < 0x87)) /
{ @start[tid] = nsecs; @cmd[tid] = args->cmd; }
tracepoint:syscalls:sys_exit_ioctl
/ @start[tid] /
{ printf("%d %d %x %d %d\n", pid, tid, @cmd[tid], args->ret, nsecs - @start[tid]);
  delete(@start[tid]); delete(@cmd[tid]); }
"#;

/// A tracer process running in the background, ready.
pub(super) struct Running {
    pub(super) child: Option<Child>,
    pub(super) stderr: Option<mpsc::Receiver<String>>,
}

/// Starts `tracer`; its output goes to `out` (a file for both eBPF tracers, for a fair comparison).
pub(super) fn start(tracer: Tracer, dev: &Path, out: &Path) -> Result<Running> {
    match tracer {
        Tracer::None | Tracer::Strace => Ok(Running {
            child: None,
            stderr: None,
        }),
        Tracer::Gpreempt => {
            let mut child = Command::new(release_bin("gpreempt-ebpf"))
                .args(["trace", "--json", "--output"])
                .arg(out)
                .arg("--kfd-device")
                .arg(dev)
                .stderr(Stdio::piped())
                .spawn()
                .context("starting gpreempt-ebpf trace")?;
            let rx = lines(child.stderr.take().context("stderr")?);
            wait_line(&rx, "tracing KFD ioctls")?;
            Ok(Running {
                child: Some(child),
                stderr: Some(rx),
            })
        }
        Tracer::Bpftrace => {
            let _ = std::fs::remove_file(out);
            let mut child = Command::new("bpftrace")
                .arg("-o")
                .arg(out)
                .args(["-e", BPFTRACE_PROG])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting bpftrace")?;
            // bpftrace writes "Attaching N probes..." to its output once attached.
            let t = Instant::now();
            while !std::fs::read_to_string(out)
                .unwrap_or_default()
                .contains("Attaching")
            {
                if t.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("bpftrace did not attach within 60 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(200));
            Ok(Running {
                child: Some(child),
                stderr: None,
            })
        }
    }
}

/// A tracer left running would skew every later measurement: kill it on any early return.
impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Stops a tracer; returns its remaining output lines.
pub(super) fn stop(mut r: Running) -> Result<Vec<String>> {
    let Some(mut child) = r.child.take() else {
        return Ok(Vec::new());
    };
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait()?;
    let mut out = Vec::new();
    if let Some(rx) = r.stderr.take() {
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
            out.push(l);
        }
    }
    Ok(out)
}

pub(super) fn lines(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

pub(super) fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(l) if l.contains(needle) => return Ok(()),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("tracer exited before '{needle}'"),
        }
    }
    bail!("tracer did not print '{needle}' within 60 s")
}

/// Runs `kfd-poke DEV bench N KIND` (under strace if asked); returns ns per ioctl.
pub(super) fn poke(tracer: Tracer, dev: &Path, n: u64, kind: &str) -> Result<f64> {
    let mut cmd = if tracer == Tracer::Strace {
        let mut c = Command::new("strace");
        c.args(["-f", "-qq", "-e", "trace=ioctl", "-o", "/dev/null"])
            .arg(release_bin("kfd-poke"));
        c
    } else {
        Command::new(release_bin("kfd-poke"))
    };
    let mut child = cmd
        .arg(dev)
        .args(["bench", &n.to_string(), kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting kfd-poke")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let out = BufReader::new(child.stdout.take().context("stdout")?);
    stdin.write_all(b"go\n")?;
    stdin.flush()?;
    let mut ns = None;
    for l in out.lines() {
        let l = l?;
        if let Some(v) = l.strip_prefix("ns_per_op ") {
            ns = Some(v.trim().parse::<f64>()?);
        }
        if l == "done" {
            break;
        }
    }
    drop(stdin);
    child.wait()?;
    ns.context("kfd-poke printed no ns_per_op")
}
