//! The NVIDIA start-up self-test: before the controller pauses anyone else's GPU work, it proves
//! that pause / resume works here, on a process it starts itself.
//!
//! Two halves:
//!
//! * the target, `gpreempt-ebpf nv-selftest-target` (hidden; [`target_main`]): loads the NVIDIA
//!   user-space driver (`libcuda.so.1`) at run time, creates a context on a device and keeps the
//!   GPU busy with `cuMemsetD32_v2` + `cuCtxSynchronize` over a buffer, counting completed
//!   memsets. While its channels are disabled the memsets, and so the counter, stop.
//! * the controller side: [`Target`] spawns and talks to it, [`verify`] checks that a pause stops
//!   the counter and a resume restarts it. `verify` knows nothing of NVIDIA (the counter, pause
//!   and resume are closures), so it is tested with fakes.
//!
//! # Protocol (one line each way, over the target's stdin / stdout)
//!
//! | target → controller | meaning |
//! |---|---|
//! | `ready <pid>` | the first memset completed; the GPU work is running |
//! | `<n>` (decimal) | reply to `count`: memsets completed so far |
//! | `err <reason>` | a failure; the target exits non-zero (or, for an unknown command, goes on) |
//!
//! | controller → target | meaning |
//! |---|---|
//! | `count` | asks for the counter (answered by a thread that does not touch the GPU, so it is answered while paused too) |
//! | EOF (stdin closed) | the target exits at once: it never outlives its parent's pipe |

use std::{
    collections::VecDeque,
    convert::Infallible,
    ffi::{c_char, c_int, c_uint, c_void, CStr, CString},
    fmt,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, Command, ExitCode, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

/// The hidden subcommand that runs [`target_main`].
pub const TARGET_SUBCOMMAND: &str = "nv-selftest-target";

/// How long [`Target::count`] waits for a reply (the target answers from a thread that does not
/// touch the GPU, so this holds while it is paused too).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// The target process.
// ---------------------------------------------------------------------------------------------

/// `gpreempt-ebpf nv-selftest-target`: the self-test's GPU workload (started by the controller).
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// Size of the GPU buffer each memset covers, in bytes (a multiple of 4).
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(4..))]
    pub bytes: u64,
    /// CUDA device ordinal to run on.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub device: i32,
}

/// The self-test target: GPU work that stops while the process's channels are disabled.
///
/// Prints `ready <pid>` after the first completed memset, answers `count` lines on stdin with the
/// number of completed memsets, exits at once when stdin closes. A failure is printed as one
/// `err <reason>` line, then the exit status is 1.
pub fn target_main(args: &TargetArgs) -> Result<ExitCode> {
    let counter = Arc::new(AtomicU64::new(0));
    // Started first: if the parent goes away while the driver initialises (which can take
    // seconds), we go too.
    {
        let counter = Arc::clone(&counter);
        thread::Builder::new()
            .name("selftest-stdin".into())
            .spawn(move || serve_stdin(&counter))
            .context("starting the stdin thread")?;
    }
    let Err(e) = run_target(args, &counter);
    let reason = format!("{e:#}").replace('\n', "; ");
    // If even this cannot be written the parent is gone; the exit status still says it failed.
    let _ = say(&format!("err {reason}"));
    Ok(ExitCode::FAILURE)
}

/// Writes one line to stdout and flushes it (one lock, so lines of the two threads never mix).
fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// Ends the process at once, without running exit handlers.
///
/// Not `std::process::exit`: that runs libcuda's exit handlers while the main thread may be
/// inside `cuCtxSynchronize` (possibly on a paused GPU), which can tear down or wait on a
/// context in use. `_exit` leaves the cleanup to the kernel closing our fds, which frees the
/// driver's objects whatever state they are in.
fn exit_now(code: c_int) -> ! {
    let _ = std::io::stdout().lock().flush();
    // SAFETY: `_exit` only terminates the process; it touches no Rust-owned state, and nothing
    // after it runs, so no invariant can be observed broken.
    unsafe { libc::_exit(code) }
}

/// The stdin thread: answers `count`, exits the process on EOF (or if stdin / stdout break).
fn serve_stdin(counter: &AtomicU64) -> ! {
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) | Err(_) => exit_now(0),
            Ok(_) => {}
        }
        let reply = match line.trim() {
            "count" => counter.load(Ordering::Relaxed).to_string(),
            other => format!("err unknown command {other:?} (expected `count`)"),
        };
        if say(&reply).is_err() {
            exit_now(0);
        }
    }
}

/// Loads the driver, starts the GPU work, and runs it until the process is ended (by the stdin
/// thread); returns only on failure.
fn run_target(args: &TargetArgs, counter: &AtomicU64) -> Result<Infallible> {
    if !args.bytes.is_multiple_of(4) {
        bail!("--bytes {} is not a multiple of 4", args.bytes);
    }
    let bytes = usize::try_from(args.bytes)
        .with_context(|| format!("--bytes {} does not fit this machine's usize", args.bytes))?;
    let words = bytes / 4;
    let cuda = load("libcuda.so.1")?;
    let ptr = cuda.start(args.device, bytes)?;
    let mut first = true;
    loop {
        cuda.fill(ptr, words, counter.load(Ordering::Relaxed) as u32)?;
        counter.fetch_add(1, Ordering::Relaxed);
        if first {
            first = false;
            say(&format!("ready {}", std::process::id()))
                .context("writing `ready` to stdout (is the parent gone?)")?;
        }
    }
}

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
/// `CUdeviceptr` (`unsigned long long` on 64-bit builds, which is all CUDA supports on Linux).
type CuDevicePtr = u64;

/// `CUresult cuInit(unsigned int Flags)`
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`
type DeviceGetFn = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
/// `CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)`
type CtxCreateFn = unsafe extern "C" fn(*mut CuContext, c_uint, CuDevice) -> CuResult;
/// `CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`
type MemAllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
/// `CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)` (N: 32-bit words)
type MemsetD32Fn = unsafe extern "C" fn(CuDevicePtr, c_uint, usize) -> CuResult;
/// `CUresult cuCtxSynchronize(void)`
type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;
/// `CUresult cuGetErrorName(CUresult error, const char **pStr)` and `cuGetErrorString` (same
/// prototype).
type ErrorTextFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

const CUDA_SUCCESS: CuResult = 0;
/// `CU_CTX_SCHED_BLOCKING_SYNC`: `cuCtxSynchronize` sleeps instead of spinning, so a paused
/// target does not burn a CPU core.
const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x04;

/// The driver API entry points the target uses. The library is never unloaded (its handle is
/// deliberately leaked once loaded), so these stay valid for the life of the process.
struct Cuda {
    init: InitFn,
    device_get: DeviceGetFn,
    ctx_create: CtxCreateFn,
    mem_alloc: MemAllocFn,
    memset_d32: MemsetD32Fn,
    ctx_synchronize: CtxSynchronizeFn,
    get_error_name: Option<ErrorTextFn>,
    get_error_string: Option<ErrorTextFn>,
}

/// The text of the last `dl*` error of this thread.
fn dl_error() -> String {
    // SAFETY: `dlerror` returns NULL or a NUL-terminated string owned by the loader that stays
    // valid until the next `dl*` call on this thread; it is copied out before any such call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "no error text".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Looks `name` up in the library `handle`, or None.
fn sym(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is a live handle returned by `dlopen` (never closed while symbols are in
    // use) and `name` is NUL-terminated; `dlsym` only reads them.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Opens the NVIDIA driver's user-space library `lib` and resolves what the target needs.
fn load(lib: &str) -> Result<Cuda> {
    let c_lib = CString::new(lib).with_context(|| format!("library name {lib:?} contains NUL"))?;
    // SAFETY: `c_lib` is NUL-terminated and outlives the call. Loading runs the library's
    // initialisers, which is what loading the NVIDIA driver library is meant to do.
    let handle = unsafe { libc::dlopen(c_lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        let why = dl_error();
        if why.contains("No such file") || why.contains("cannot open shared object") {
            bail!(
                "{lib} not found (dlopen: {why}): the NVIDIA driver's user-space library is not \
                 installed (or not on the loader's path)"
            );
        }
        bail!(
            "{lib} could not be loaded (dlopen: {why}): the NVIDIA driver's user-space library is \
             unusable here"
        );
    }
    let required = |name: &CStr| {
        sym(handle, name).ok_or_else(|| {
            anyhow!(
                "{lib} has no {} (dlsym: {}): it is not NVIDIA's driver library, or too old",
                name.to_string_lossy(),
                dl_error()
            )
        })
    };
    let resolved = (|| {
        // SAFETY: every transmute below: each pointer is the address of the named function in
        // the CUDA driver library, and the target type is that function's C prototype as
        // documented in cuda.h (see the type aliases). Function and data pointers have the same
        // size and representation on every platform Linux and CUDA support.
        unsafe {
            Ok::<_, anyhow::Error>(Cuda {
                init: std::mem::transmute::<*mut c_void, InitFn>(required(c"cuInit")?),
                device_get: std::mem::transmute::<*mut c_void, DeviceGetFn>(required(
                    c"cuDeviceGet",
                )?),
                ctx_create: std::mem::transmute::<*mut c_void, CtxCreateFn>(required(
                    c"cuCtxCreate_v2",
                )?),
                mem_alloc: std::mem::transmute::<*mut c_void, MemAllocFn>(required(
                    c"cuMemAlloc_v2",
                )?),
                memset_d32: std::mem::transmute::<*mut c_void, MemsetD32Fn>(required(
                    c"cuMemsetD32_v2",
                )?),
                ctx_synchronize: std::mem::transmute::<*mut c_void, CtxSynchronizeFn>(required(
                    c"cuCtxSynchronize",
                )?),
                get_error_name: sym(handle, c"cuGetErrorName")
                    .map(|p| std::mem::transmute::<*mut c_void, ErrorTextFn>(p)),
                get_error_string: sym(handle, c"cuGetErrorString")
                    .map(|p| std::mem::transmute::<*mut c_void, ErrorTextFn>(p)),
            })
        }
    })();
    if resolved.is_err() {
        // SAFETY: `handle` came from `dlopen` above, and nothing resolved from it is kept (the
        // error path drops every pointer), so closing it leaves nothing dangling.
        unsafe { libc::dlclose(handle) };
    }
    resolved
}

impl Cuda {
    /// One of the driver's error texts for `r`, if it has one.
    fn error_text(f: Option<ErrorTextFn>, r: CuResult) -> Option<String> {
        let f = f?;
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `f` is cuGetErrorName / cuGetErrorString, which write a pointer to a static
        // NUL-terminated string (or leave it NULL / fail for an unknown code) into `s`, a valid
        // out-pointer; the string is only read if the call succeeded and set it.
        unsafe {
            if f(r, &mut s) != CUDA_SUCCESS || s.is_null() {
                return None;
            }
            Some(CStr::from_ptr(s).to_string_lossy().into_owned())
        }
    }

    /// `CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected`, as far as the driver can
    /// name it, plus a hint for the common cases.
    fn describe(&self, r: CuResult) -> String {
        let name = Self::error_text(self.get_error_name, r);
        let text = Self::error_text(self.get_error_string, r);
        let mut s = match (name, text) {
            (Some(n), Some(t)) => format!("{n} ({r}): {t}"),
            (Some(n), None) => format!("{n} ({r})"),
            (None, Some(t)) => format!("CUDA error {r}: {t}"),
            (None, None) => format!("CUDA error {r}"),
        };
        let hint = match r {
            2 => " (not enough free GPU memory: try a smaller --bytes)",
            46 => " (the device is in use or its compute mode forbids another process: see `nvidia-smi -q -d COMPUTE`)",
            100 => " (no usable NVIDIA GPU: check CUDA_VISIBLE_DEVICES and access to /dev/nvidia*)",
            101 => " (no such device ordinal: check --device and CUDA_VISIBLE_DEVICES)",
            803 => " (libcuda does not match the loaded kernel module: reinstall the driver or reboot)",
            _ => "",
        };
        s.push_str(hint);
        s
    }

    fn check(&self, what: &str, r: CuResult) -> Result<()> {
        if r == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(anyhow!("{what} failed: {}", self.describe(r)))
        }
    }

    /// Initialises the driver, creates a context on `device` (current on this thread) and
    /// allocates `bytes` of device memory.
    fn start(&self, device: c_int, bytes: usize) -> Result<CuDevicePtr> {
        // SAFETY: cuInit takes flags by value (0 is the only valid value).
        self.check("cuInit", unsafe { (self.init)(0) })?;
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is a valid out-pointer for the duration of the call.
        self.check(&format!("cuDeviceGet({device})"), unsafe {
            (self.device_get)(&mut dev, device)
        })?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; the flags are a valid scheduling flag; `dev`
        // came from cuDeviceGet. The context is never destroyed: it lives as long as the process.
        self.check(&format!("cuCtxCreate_v2 on device {device}"), unsafe {
            (self.ctx_create)(&mut ctx, CU_CTX_SCHED_BLOCKING_SYNC, dev)
        })?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context created above is current on this
        // thread, which is the one that calls this.
        self.check(&format!("cuMemAlloc_v2 of {bytes} bytes"), unsafe {
            (self.mem_alloc)(&mut ptr, bytes)
        })?;
        Ok(ptr)
    }

    /// One unit of GPU work: fills `words` 32-bit words at `ptr` with `value` and waits for it.
    fn fill(&self, ptr: CuDevicePtr, words: usize, value: u32) -> Result<()> {
        // SAFETY: `ptr` is an allocation of at least `words * 4` bytes made by `start` in the
        // context current on this thread (the same thread runs `start` and every `fill`); the
        // memset writes device memory only.
        self.check("cuMemsetD32_v2", unsafe {
            (self.memset_d32)(ptr, value, words)
        })?;
        // SAFETY: takes no arguments; waits for the current context's work.
        self.check("cuCtxSynchronize", unsafe { (self.ctx_synchronize)() })
    }
}

// ---------------------------------------------------------------------------------------------
// The controller side: the spawned target.
// ---------------------------------------------------------------------------------------------

/// A line from the target.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// `ready <pid>`
    Ready(u32),
    /// `<n>`: the counter, in reply to `count`.
    Count(u64),
    /// `err <reason>`
    Err(String),
}

/// Parses one line from the target; None for anything else (stray output is skipped).
fn parse_reply(line: &str) -> Option<Reply> {
    let line = line.trim();
    if line == "err" {
        return Some(Reply::Err("(no reason given)".into()));
    }
    if let Some(reason) = line.strip_prefix("err ") {
        let reason = reason.trim();
        return Some(Reply::Err(if reason.is_empty() {
            "(no reason given)".into()
        } else {
            reason.into()
        }));
    }
    if let Some(pid) = line.strip_prefix("ready ") {
        let pid = pid.trim();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return pid.parse().ok().filter(|&p| p > 0).map(Reply::Ready);
    }
    if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) {
        return line.parse().ok().map(Reply::Count);
    }
    None
}

/// How many stderr lines of the target are kept for error messages.
const STDERR_KEEP: usize = 8;

/// The spawned self-test target (`<exe> nv-selftest-target`). Dropping it closes its stdin, kills
/// and reaps it: it is never left behind.
pub struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines of its stdout, from a reader thread; disconnected at EOF.
    lines: Receiver<String>,
    /// The last lines of its stderr (also logged at debug level).
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    pid: u32,
    /// `count` requests whose replies have not been read (a late reply to one that timed out
    /// must not be taken for the reply to the next).
    outstanding: usize,
    reply_timeout: Duration,
}

impl Target {
    /// Spawns `exe nv-selftest-target`, waits (up to `timeout`) for `ready <pid>`; returns it
    /// running. Blocking: call it off an async runtime's worker threads.
    pub fn spawn(exe: &Path, timeout: Duration) -> Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.arg(TARGET_SUBCOMMAND);
        Self::spawn_command(cmd, timeout).with_context(|| {
            format!(
                "NVIDIA self-test target `{} {TARGET_SUBCOMMAND}`",
                exe.display()
            )
        })
    }

    fn spawn_command(mut cmd: Command, timeout: Duration) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting it")?;
        let pid = child.id();
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (tx, lines) = mpsc::channel();
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        // From here on, `target`'s Drop cleans up whatever fails.
        let mut target = Target {
            child,
            stdin,
            lines,
            stderr: Arc::clone(&tail),
            stderr_thread: None,
            pid,
            outstanding: 0,
            reply_timeout: REPLY_TIMEOUT,
        };
        let stdout = stdout.context("its stdout pipe is missing")?;
        thread::Builder::new()
            .name("selftest-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("starting its stdout reader thread")?;
        if let Some(stderr) = stderr {
            target.stderr_thread = Some(
                thread::Builder::new()
                    .name("selftest-err".into())
                    .spawn(move || {
                        for line in BufReader::new(stderr).lines() {
                            let Ok(line) = line else { break };
                            log::debug!("nv-selftest-target[{pid}]: {line}");
                            let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                            if t.len() == STDERR_KEEP {
                                t.pop_front();
                            }
                            t.push_back(line);
                        }
                    })
                    .context("starting its stderr reader thread")?,
            );
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match target.lines.recv_timeout(left) {
                Ok(line) => match parse_reply(&line) {
                    Some(Reply::Ready(p)) if p == pid => return Ok(target),
                    Some(Reply::Ready(p)) => bail!(
                        "it reported `ready {p}`, but its pid is {pid}: is the executable really \
                         gpreempt-ebpf?"
                    ),
                    Some(Reply::Err(reason)) => {
                        bail!("it failed: {reason}{}", target.stderr_note())
                    }
                    Some(Reply::Count(_)) | None => {
                        log::debug!("nv-selftest-target[{pid}] (before ready): {line}");
                    }
                },
                Err(RecvTimeoutError::Timeout) => bail!(
                    "it did not report `ready` within {timeout:?} (the driver may be slow to \
                     initialise, or the first GPU work never completed){}",
                    target.stderr_note()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "it {} before it was ready{}",
                        target.exit_note(),
                        target.stderr_note()
                    )
                }
            }
        }
    }

    /// The target's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Asks the target for its counter (completed memsets); the reply comes within
    /// [`REPLY_TIMEOUT`], paused or not. Blocking.
    pub fn count(&mut self) -> Result<u64> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the self-test target's stdin is closed")?;
        if let Err(e) = stdin.write_all(b"count\n").and_then(|()| stdin.flush()) {
            bail!(
                "asking the self-test target for its counter: {e} (it {}){}",
                self.exit_note(),
                self.stderr_note()
            );
        }
        self.outstanding += 1;
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => match parse_reply(&line) {
                    Some(Reply::Count(n)) => {
                        self.outstanding -= 1;
                        if self.outstanding == 0 {
                            return Ok(n);
                        }
                    }
                    Some(Reply::Err(reason)) => {
                        bail!(
                            "the self-test target failed: {reason}{}",
                            self.stderr_note()
                        )
                    }
                    Some(Reply::Ready(_)) | None => {
                        log::debug!("nv-selftest-target[{}]: {line}", self.pid);
                    }
                },
                Err(RecvTimeoutError::Timeout) => bail!(
                    "the self-test target did not answer `count` within {:?}",
                    self.reply_timeout
                ),
                Err(RecvTimeoutError::Disconnected) => bail!(
                    "the self-test target {} instead of answering `count`{}",
                    self.exit_note(),
                    self.stderr_note()
                ),
            }
        }
    }

    /// "exited with exit status: 1", waiting a little for it to go (its stdout just closed).
    fn exit_note(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return format!("exited ({status})"),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => return "closed its stdout (still running)".into(),
                Err(e) => return format!("is in an unknown state (waiting for it: {e})"),
            }
        }
    }

    /// "; its stderr: ..." with the last lines it wrote there, or nothing.
    fn stderr_note(&mut self) -> String {
        // A failing target exits right after its `err` line: give it a moment to, and its
        // stderr reader to take in the last lines (a live one costs this wait once, on an error).
        if let Some(t) = &self.stderr_thread {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !matches!(self.child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
            while !t.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
        }
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = t.iter().map(String::as_str).collect();
            format!("; its stderr: {}", lines.join(" | "))
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // Closing stdin alone makes it exit; the kill covers a target stuck anywhere.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The check itself.
// ---------------------------------------------------------------------------------------------

/// What [`verify`] observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// How long `pause` took.
    pub pause: Duration,
    /// How long `resume` took.
    pub resume: Duration,
    /// Progress in the window before pausing.
    pub before: u64,
    /// Progress between `pause` returning and the first read while paused (a short settle time
    /// later): at most the work that was in flight. Reported, not judged.
    pub in_flight: u64,
    /// Progress across the window while paused (must be 0).
    pub while_paused: u64,
    /// Progress in the window after resuming (must be > 0).
    pub after: u64,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pause took {:?}, resume {:?}; progress: {} before, {} in flight, {} while paused, {} after",
            self.pause, self.resume, self.before, self.in_flight, self.while_paused, self.after
        )
    }
}

/// The wait after `pause` returns before the counter is taken as the paused baseline: lets an
/// iteration that completed on the GPU just before the pause be counted by the target.
fn settle_time(window: Duration) -> Duration {
    (window / 4).min(Duration::from_millis(100))
}

/// `to - from`, or an error if the counter went backwards.
fn progress(from: u64, to: u64, when: &str) -> Result<u64> {
    to.checked_sub(from)
        .ok_or_else(|| anyhow!("the counter went backwards {when} (from {from} to {to})"))
}

/// Checks that `pause` stops the counter and `resume` restarts it:
///
/// 1. progress in a `window` before pausing (else the work is not running and nothing can be
///    judged; neither `pause` nor `resume` is called);
/// 2. `pause`; after a settle time (`min(window / 4, 100 ms)`, for an iteration that was in
///    flight at the moment of pausing) the counter is read, and again after `window`: it must
///    not have moved;
/// 3. `resume`; the counter must move within `window`.
///
/// `resume` is called whenever `pause` was, exactly once, whatever failed in between. That
/// includes a `pause` that returned an error: it may have disabled some channels before failing,
/// so nothing is known *not* to be paused, and resuming what is not paused is harmless.
///
/// Blocking (it sleeps about `3 * window`): call it off an async runtime's worker threads.
/// Errors say which step failed and what was observed.
pub fn verify(
    counter: &mut dyn FnMut() -> Result<u64>,
    pause: &mut dyn FnMut() -> Result<()>,
    resume: &mut dyn FnMut() -> Result<()>,
    window: Duration,
) -> Result<Verdict> {
    let settle = settle_time(window);

    let c0 = counter().context("reading the counter before pausing")?;
    thread::sleep(window);
    let c1 = counter().context("reading the counter before pausing")?;
    let before = progress(c0, c1, "before pausing")?;
    if before == 0 {
        bail!(
            "the target made no progress in {window:?} before pausing (counter stayed at {c1}): its \
             GPU work is not running, so pausing cannot be checked (pause was not attempted)"
        );
    }

    let t = Instant::now();
    let paused = pause();
    let pause_time = t.elapsed();
    if let Err(e) = paused {
        return Err(match resume() {
            Ok(()) => anyhow!(
                "pause failed: {e:#} (resume was called anyway, in case part of it took effect, \
                 and succeeded)"
            ),
            Err(r) => anyhow!(
                "pause failed: {e:#}; the resume called anyway, in case part of it took effect, \
                 failed too: {r:#} (the target may be partly paused)"
            ),
        });
    }

    // Step 2; whatever it finds, resume comes next.
    let mut observe = || -> Result<(u64, u64, u64)> {
        thread::sleep(settle);
        let p0 = counter().context("reading the counter while paused")?;
        let in_flight = progress(c1, p0, "across the pause")?;
        thread::sleep(window);
        let p1 = counter().context("reading the counter while paused")?;
        let while_paused = progress(p0, p1, "while paused")?;
        if while_paused > 0 {
            bail!(
                "pause did not stop the GPU work: the counter advanced by {while_paused} (from {p0} \
                 to {p1}) in {window:?} while paused (pause returned after {pause_time:?}; the first \
                 read was {settle:?} later, {in_flight} completed in between)"
            );
        }
        Ok((in_flight, while_paused, p1))
    };
    let observed = observe();

    let t = Instant::now();
    let resumed = resume();
    let resume_time = t.elapsed();
    let (in_flight, while_paused, p1) = match (observed, resumed) {
        (Ok(o), Ok(())) => o,
        (Err(e), Ok(())) => return Err(e.context("while paused (the target was resumed)")),
        (Err(e), Err(r)) => {
            return Err(anyhow!(
                "{e:#}; and then resume failed: {r:#} (the target may still be paused)"
            ))
        }
        (Ok((_, _, p1)), Err(r)) => {
            return Err(anyhow!(
                "resume failed: {r:#} (pause worked: the counter stayed at {p1} for {window:?}; \
                 the target may still be paused)"
            ))
        }
    };

    thread::sleep(window);
    let r1 = counter().context("reading the counter after resuming")?;
    let after = progress(p1, r1, "after resuming")?;
    if after == 0 {
        bail!(
            "resume did not restart the GPU work: the counter stayed at {r1} for {window:?} after \
             resume returned (resume took {resume_time:?}; pause had stopped it as expected)"
        );
    }
    Ok(Verdict {
        pause: pause_time,
        resume: resume_time,
        before,
        in_flight,
        while_paused,
        after,
    })
}

#[cfg(test)]
mod tests;
