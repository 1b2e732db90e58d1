//! `sim`: mount the emulated driver at the real paths in a private mount namespace, run commands
//! there, and leave nothing behind.
//!
//! Cleanup does not depend on this process exiting cleanly: every mount lives only in its own
//! mount namespace (gone with its last process), every child is in a cgroup, and a guardian
//! process (outside the cgroup, in its own session) kills that cgroup and removes it and the
//! mountpoint directory as soon as this process is gone, however it ended.

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use crate::device::{Shared, SimFs, DEBUGFS_DIR, DEVICE, DRI_DIR, MODULES, SYSFS_DIR};
use crate::model::Kfd;
use crate::spec::{Costs, Model, Spec};

pub struct SimOptions {
    pub gpus: u32,
    pub model: Model,
    pub seed: u64,
    /// Mount in the caller's mount namespace instead of a private one, so that processes
    /// started elsewhere later (a systemd unit) see the emulated driver too. The mounts then
    /// outlive `sim`: for a machine or container that is thrown away after.
    pub shared_mounts: bool,
}

/// A process to start inside.
pub struct ChildSpec {
    pub argv: Vec<String>,
    /// `sim` ends when the foreground child does; the others are stopped then.
    pub foreground: bool,
    /// Started this long after `sim` (e.g. once a tracer in the foreground is attached).
    pub delay: Duration,
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

fn mount_flags(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    mount(src, dst, fstype, flags, data).with_context(|| {
        format!(
            "mounting {} on {}",
            src.map_or("-".into(), |s| s.display().to_string()),
            dst.display()
        )
    })
}

fn bind(src: &Path, dst: &Path) -> Result<()> {
    mount_flags(
        Some(src),
        dst,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )
}

/// Mount points directly below `dir` (from /proc/self/mountinfo).
fn submounts(dir: &str) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let mut v: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&prefix) && !m[prefix.len()..].contains('/'))
        .map(PathBuf::from)
        .collect();
    v.sort();
    v.dedup();
    v
}

fn fstype_at(path: &str) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f.get(4) == Some(&path)).then(|| f.get(sep + 1).map(|s| s.to_string()))?
    })
}

/// Make `entry` (a file or directory name) appear inside `dir` by stacking an overlay on `dir`
/// (upper layer on our private tmpfs); what was mounted below `dir`, and the `keep` entries that
/// an overlay cannot show (sysfs network classes), are put back on top.
fn overlay_with(
    dir: &str,
    entry: &str,
    is_dir: bool,
    work: &Path,
    keep: &[&str],
) -> Result<PathBuf> {
    let target = Path::new(dir).join(entry);
    if target.exists() {
        return Ok(target);
    }
    let tag = dir.trim_matches('/').replace('/', "-");
    let (upper, wdir, saved) = (
        work.join(format!("{tag}.u")),
        work.join(format!("{tag}.w")),
        work.join(format!("{tag}.keep")),
    );
    for d in [&upper, &wdir, &saved] {
        fs::create_dir_all(d)?;
    }
    let mut moved = Vec::new();
    let mut keep_paths: Vec<PathBuf> = submounts(dir);
    keep_paths.extend(
        keep.iter()
            .map(|k| Path::new(dir).join(k))
            .filter(|p| p.exists()),
    );
    for (i, m) in keep_paths.iter().enumerate() {
        let hold = saved.join(i.to_string());
        // A container's /dev has files bound in (nspawn's /dev/console, a --bind=/dev/fuse):
        // a bind mount's target is of its source's kind.
        if m.is_dir() {
            fs::create_dir_all(&hold)?;
        } else {
            fs::File::create(&hold)?;
        }
        bind(m, &hold)?;
        moved.push((hold, m.clone()));
    }
    let opts = format!(
        "lowerdir={dir},upperdir={},workdir={}",
        upper.display(),
        wdir.display()
    );
    mount_flags(
        Some(Path::new("overlay")),
        Path::new(dir),
        Some("overlay"),
        MsFlags::empty(),
        Some(&opts),
    )?;
    for (hold, m) in moved {
        if let Err(e) = bind(&hold, &m) {
            // overlayfs refuses automount points of its lower layer (EREMOTE): debugfs's
            // `tracing`, where the kernel mounts tracefs once anyone looks, stays hidden here
            // (/sys/kernel/tracing is the tracefs everything in sim uses).
            if e.downcast_ref::<nix::Error>() == Some(&nix::Error::EREMOTE) {
                eprintln!(
                    "sim: {} is an automount point the overlay cannot show: hidden inside sim",
                    m.display()
                );
                continue;
            }
            return Err(e);
        }
    }
    if is_dir {
        fs::create_dir_all(&target)?;
    } else {
        fs::File::create(&target)?;
    }
    Ok(target)
}

/// Render minors for the emulated GPUs: from 128 (the first render minor), past the host's own
/// render nodes so that none is hidden.
fn free_render_minors(n: usize) -> Vec<u32> {
    let highest = fs::read_dir("/dev/dri")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("renderD")?
                .parse::<u32>()
                .ok()
        })
        .max();
    let first = highest.map_or(128, |h| (h + 1).max(128));
    (first..).take(n).collect()
}

/// Size /proc/modules shows for the emulated amdgpu (that of a 6.12 amdgpu.ko, emulated).
const AMDGPU_MODULE_SIZE: u64 = 19_398_656;

/// /proc/modules as the host has it, plus the emulated amdgpu; None when the kernel has no module
/// support (no /proc/modules).
fn modules_text() -> Option<String> {
    let host = fs::read_to_string("/proc/modules").ok()?;
    let mut s: String = host
        .lines()
        .filter(|l| !l.starts_with("amdgpu "))
        .map(|l| format!("{l}\n"))
        .collect();
    s.push_str(&format!(
        "amdgpu {AMDGPU_MODULE_SIZE} 0 - Live 0x0000000000000000\n"
    ));
    Some(s)
}

/// Where the kernel has no /proc/modules (built without module support), `lsmod` (kmod) cannot
/// list anything; `sim` puts an `lsmod` first on its commands' PATH that prints what kmod's would
/// for the emulated amdgpu (ROCm 5.2's rocminfo runs `lsmod | grep amdgpu` before anything else).
fn lsmod_shim(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    fs::create_dir_all(&bin)?;
    let lsmod = bin.join("lsmod");
    fs::write(
        &lsmod,
        format!(
            "#!/bin/sh\n# gpreempt-ebpf sim: this kernel has no /proc/modules; the emulated amdgpu is loaded.\n\
             printf '%-19s %s\\n' Module 'Size  Used by'\nprintf '%-19s %8u  %d\\n' amdgpu {AMDGPU_MODULE_SIZE} 0\n"
        ),
    )?;
    fs::set_permissions(&lsmod, fs::Permissions::from_mode(0o755))?;
    Ok(bin)
}

/// The emulated amdgpu as a loaded module in sysfs: `/sys/module/amdgpu/initstate` reads `live`
/// (`show_initstate`, kernel/module/main.c, for a module in MODULE_STATE_LIVE); ROCm 6's
/// `rocminfo` reads it instead of running `lsmod`. No `version`: upstream's amdgpu declares no
/// MODULE_VERSION (only AMD's DKMS build does).
fn module_sysfs(ov: &mut Overlays<'_>) -> Result<()> {
    if fs::read_to_string("/sys/module/amdgpu/initstate").is_ok_and(|s| s == "live\n") {
        return Ok(());
    }
    ov.add("/sys/module", "amdgpu", true, &[])?;
    let state = ov.add("/sys/module/amdgpu", "initstate", false, &[])?;
    fs::write(&state, "live\n").with_context(|| format!("writing {}", state.display()))
}

/// Overlays stacked by `sim`, so a directory is overlaid once and further entries are made in
/// its (private, writable) upper layer.
struct Overlays<'a> {
    work: &'a Path,
    made: Vec<String>,
}

impl Overlays<'_> {
    fn add(&mut self, dir: &str, entry: &str, is_dir: bool, keep: &[&str]) -> Result<PathBuf> {
        let target = Path::new(dir).join(entry);
        // Inside an overlay of ours (the directory or an ancestor), entries go to its upper layer.
        let ours = self
            .made
            .iter()
            .any(|d| Path::new(dir).starts_with(Path::new(d)));
        if ours && !target.exists() {
            if is_dir {
                fs::create_dir_all(&target)?;
            } else {
                fs::File::create(&target)?;
            }
            return Ok(target);
        }
        let existed = target.exists();
        let t = overlay_with(dir, entry, is_dir, self.work, keep)?;
        if !existed {
            self.made.push(dir.to_string());
        }
        Ok(t)
    }
}

/// The cgroup v2 hierarchy's mount point.
fn cgroup2_root() -> Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let sep = f.iter().position(|x| *x == "-")?;
            (f.get(sep + 1) == Some(&"cgroup2")).then(|| PathBuf::from(f[4]))
        })
        .context("no cgroup v2 hierarchy is mounted (sim keeps its processes in one to clean up after itself)")
}

fn kill_cgroup(cg: &Path) {
    let _ = fs::write(cg.join("cgroup.kill"), "1");
    // `cgroup.procs` empties before the killed tasks are gone (zombies not yet reaped, a daemon
    // reparented to init): the cgroup is empty only when `cgroup.events` says so.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match fs::read_to_string(cg.join("cgroup.events")) {
            Ok(s) if s.lines().any(|l| l.trim() == "populated 0") => break,
            Err(_) => break,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Removes the (killed) cgroup, retrying while the kernel still counts a dying task in it.
fn remove_cgroup(cg: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::remove_dir(cg).is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The guardian: waits for the pipe to close (sim gone, however), then cleans up.
fn guardian(read_fd: std::os::fd::OwnedFd, cg: &Path, dir: &Path) -> ! {
    // SAFETY: setsid and signal dispositions in a freshly forked single-threaded child.
    unsafe {
        libc::setsid();
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(s, libc::SIG_IGN);
        }
    }
    let mut f = fs::File::from(read_fd);
    let mut b = [0u8; 1];
    while matches!(f.read(&mut b), Ok(n) if n > 0) {}
    kill_cgroup(cg);
    remove_cgroup(cg);
    let _ = fs::remove_dir(dir);
    // SAFETY: leaving the forked child without running the parent's destructors.
    unsafe { libc::_exit(0) }
}

/// Run `children` against an emulated KFD mounted at the real paths; returns the foreground
/// child's exit status.
pub fn run(opts: &SimOptions, children: Vec<ChildSpec>) -> Result<i32> {
    if !nix::unistd::geteuid().is_root() {
        bail!("sim needs root (it mounts /dev/kfd and the KFD sysfs/debugfs trees in a private mount namespace): run it with sudo");
    }
    anyhow::ensure!(
        (1..=8).contains(&opts.gpus),
        "--gpus must be between 1 and 8"
    );
    let me = std::process::id();
    let cg = cgroup2_root()?.join(format!("gpreempt-sim.{me}"));
    fs::create_dir_all(&cg).with_context(|| format!("creating cgroup {}", cg.display()))?;
    let dir = std::env::temp_dir().join(format!("gpreempt-sim.{me}"));
    fs::create_dir_all(&dir)?;

    // The guardian, forked before any thread exists.
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: no other thread runs yet; the child only calls async-signal-safe functions and
    // plain file operations before _exit.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            drop(wr);
            guardian(rd, &cg, &dir);
        }
        nix::unistd::ForkResult::Parent { .. } => drop(rd),
    }
    let _guardian_pipe = wr; // closes when we are gone

    if !opts.shared_mounts {
        unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
        mount_flags(
            None,
            Path::new("/"),
            None,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None,
        )?;
    }
    mount_flags(
        Some(Path::new("tmpfs")),
        &dir,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755"),
    )?;
    let fuse_dir = dir.join("fs");
    let work = dir.join("work");
    fs::create_dir_all(&fuse_dir)?;
    fs::create_dir_all(&work)?;

    let spec = Spec::new(opts.model);
    let mut kfd = Kfd::new(&spec, opts.gpus, opts.seed, Costs::default());
    kfd.host_cpu = crate::cpu::HostCpu::probe();
    for (g, minor) in kfd
        .gpus
        .iter_mut()
        .zip(free_render_minors(opts.gpus as usize))
    {
        g.render_minor = minor;
    }
    let minors: Vec<u32> = kfd.gpus.iter().map(|g| g.render_minor).collect();
    let shared = Shared::new(kfd);
    let modules = modules_text();
    if let Some(m) = &modules {
        shared.set_modules(m.clone());
    }
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("gpreempt-sim".into()),
        fuser::MountOption::Subtype("kfd".into()),
    ];
    config.acl = fuser::SessionACL::All;
    let session = fuser::spawn_mount(SimFs(Arc::clone(&shared)), &fuse_dir, &config)
        .context("mounting the emulated KFD (FUSE)")?;

    // The first request waits for FUSE_INIT, where passthrough is negotiated.
    let _ = fs::metadata(fuse_dir.join(DEVICE));
    if !shared.passthrough() {
        eprintln!(
            "gpreempt-sim: this kernel refused FUSE passthrough (Linux 6.9+ has it): mmap of /dev/kfd \
             and the render nodes fails, so real ROCm runtimes cannot run here (the emulator's \
             own workloads can)"
        );
    }
    let shim = mount_views(&fuse_dir, &work, &dir, &minors, modules.as_deref())?;

    let engine = {
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("gpu".into())
            .spawn(move || s.run_engine())?
    };

    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    eprintln!(
        "gpreempt-sim: emulated {} x{} (seed {}) at /dev/kfd, /dev/dri, /sys/class/kfd, /sys/kernel/debug/kfd; all figures are emulated",
        spec.name(),
        opts.gpus,
        opts.seed
    );
    let status = run_children(&cg, children, shim.as_deref());
    kill_cgroup(&cg);
    shared.stop.store(true, Ordering::Relaxed);
    let _ = engine.join();
    drop(session);
    status
}

/// The FUSE files over the real paths: /dev/kfd, the render nodes, the KFD sysfs tree (with the
/// class link), /proc/modules (or an lsmod shim where the kernel has none), the amdgpu module's
/// sysfs entry and debugfs. Returns the shim's directory, if one was made.
fn mount_views(
    fuse_dir: &Path,
    work: &Path,
    dir: &Path,
    minors: &[u32],
    modules: Option<&str>,
) -> Result<Option<PathBuf>> {
    let mut ov = Overlays {
        work,
        made: Vec::new(),
    };
    let dev = ov.add("/dev", "kfd", false, &[])?;
    bind(&fuse_dir.join(DEVICE), &dev)?;
    if !Path::new("/dev/dri").exists() {
        ov.add("/dev", "dri", true, &[])?;
    }
    for minor in minors {
        let name = format!("renderD{minor}");
        let node = ov.add("/dev/dri", &name, false, &[])?;
        bind(&fuse_dir.join(DRI_DIR).join(&name), &node)?;
    }
    // The kernel's kfd device lives at /sys/devices/virtual/kfd/kfd (the thunk reads its topology
    // there) and /sys/class/kfd/kfd is a link to it.
    let device = ov.add("/sys/devices/virtual", "kfd", true, &["net"])?;
    bind(&fuse_dir.join(SYSFS_DIR), &device)?;
    if !Path::new("/sys/class/kfd/kfd").exists() {
        let class = ov.add("/sys/class", "kfd", true, &["net"])?;
        std::os::unix::fs::symlink("../../devices/virtual/kfd/kfd", class.join("kfd"))
            .context("linking /sys/class/kfd/kfd")?;
    }
    let shim = match modules {
        Some(_) => {
            bind(&fuse_dir.join(MODULES), Path::new("/proc/modules"))?;
            None
        }
        None => Some(lsmod_shim(dir)?),
    };
    module_sysfs(&mut ov)?;
    let debug = if fstype_at("/sys/kernel/debug").is_some() {
        overlay_with("/sys/kernel/debug", "kfd", true, work, &[])?
    } else {
        mount_flags(
            Some(Path::new("tmpfs")),
            Path::new("/sys/kernel/debug"),
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0700"),
        )?;
        let d = PathBuf::from("/sys/kernel/debug/kfd");
        fs::create_dir_all(&d)?;
        d
    };
    bind(&fuse_dir.join(DEBUGFS_DIR), &debug)?;
    Ok(shim)
}

fn spawn(cg: &Path, argv: &[String], path_first: Option<&Path>) -> Result<Child> {
    let procs = CString::new(cg.join("cgroup.procs").to_string_lossy().as_bytes())?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if let Some(p) = path_first {
        let old = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
        cmd.env("PATH", format!("{}:{old}", p.display()));
    }
    // Tools that show figures (gpreempt-ebpf top's title) say they come from an emulated GPU.
    cmd.env("GPREEMPT_LABEL", "emulated GPU");
    // SAFETY: between fork and exec only async-signal-safe calls (open, write, close, prctl).
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", argv.join(" ")))
}

fn run_children(cg: &Path, children: Vec<ChildSpec>, path_first: Option<&Path>) -> Result<i32> {
    let start = Instant::now();
    let mut fg: Option<Child> = None;
    let mut bg = Vec::new();
    let mut pending: Vec<ChildSpec> = Vec::new();
    for c in children {
        if c.foreground {
            fg = Some(spawn(cg, &c.argv, path_first)?);
        } else {
            pending.push(c);
        }
    }
    let Some(mut fg) = fg else {
        bail!("nothing to run in the foreground");
    };
    let mut forwarded = false;
    loop {
        let mut i = 0;
        while i < pending.len() {
            if start.elapsed() >= pending[i].delay {
                bg.push(spawn(cg, &pending.remove(i).argv, path_first)?);
            } else {
                i += 1;
            }
        }
        if let Some(st) = fg.try_wait()? {
            stop_gently(&mut bg, Duration::from_secs(3));
            return Ok(st.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)
            }));
        }
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 && !forwarded {
            forwarded = true;
            // SAFETY: signalling our own child.
            unsafe { libc::kill(fg.id() as i32, libc::SIGTERM) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Background children get SIGTERM and a moment to end cleanly (a controller resumes what it
/// holds and removes its run files, a workload writes its report); SIGKILL for the rest.
fn stop_gently(bg: &mut [Child], grace: Duration) {
    for b in bg.iter() {
        // SAFETY: signalling our own child (not yet reaped, so its pid is still ours).
        unsafe { libc::kill(b.id() as i32, libc::SIGTERM) };
    }
    let end = Instant::now() + grace;
    for b in bg.iter_mut() {
        loop {
            if !matches!(b.try_wait(), Ok(None)) {
                break;
            }
            if Instant::now() >= end {
                let _ = b.kill();
                let _ = b.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
