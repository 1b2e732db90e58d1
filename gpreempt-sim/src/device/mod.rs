//! The FUSE filesystem: the device file (`dev/kfd`), the render nodes, and the sysfs / debugfs
//! trees, all backed by one [`Kfd`] model, plus the engine thread that runs the GPU and finishes
//! blocked ioctls.
//!
//! Layout of the mount (bind-mounted to the real paths by `sim`): `kfd` -> /dev/kfd,
//! `dri/renderD<minor>` -> /dev/dri/renderD<minor>, `sysfs-kfd/kfd/` ->
//! /sys/devices/virtual/kfd/kfd (/sys/class/kfd/kfd links there, as on a real host),
//! `debug-kfd/` -> /sys/kernel/debug/kfd, `modules` -> /proc/modules (where the kernel has one).
//!
//! mmap: the device file and the render nodes are opened with FUSE passthrough (Linux 6.9+) to a
//! sparse memfd each, so a process's doorbell and buffer-object mappings are plain shared memory
//! that the emulator reaches with process_vm_readv/writev and no FUSE request (docs/sim.md).
//!
//! Locking: the model's lock is never held across process_vm_readv/writev of a client's memory
//! outside the ioctl being served (the engine reads ahead, then writes after unlocking).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use crate::host::{self, RealHost};
use crate::model::{Caller, Host, Kfd, Outcome, Wait};

/// A call sleeping in the emulated kernel.
struct Blocked {
    wait: Wait,
    tid: u32,
    out_size: usize,
    reply: ReplyIoctl,
}

/// The memfds behind the passthrough mappings: one for /dev/kfd, one per render node.
struct Backing {
    kfd: OwnedFd,
    render: Vec<OwnedFd>,
}

fn memfd(name: &str) -> Option<OwnedFd> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: memfd_create with a NUL-terminated name returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created and is owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Sparse: pages exist only where a process touched them.
    // SAFETY: ftruncate on an fd we own.
    (unsafe { libc::ftruncate(fd.as_raw_fd(), crate::mmap::BACKING_SIZE as libc::off_t) } == 0)
        .then_some(fd)
}

/// State shared by the FUSE session and the engine.
pub struct Shared {
    pub kfd: Mutex<Kfd>,
    backing: Option<Backing>,
    /// Backing ids by inode: one per inode for as long as the session lives (the kernel wants the
    /// same backing file for every open of an inode).
    backing_ids: Mutex<HashMap<u64, BackingId>>,
    /// The kernel granted FUSE_PASSTHROUGH at init.
    passthrough: AtomicBool,
    /// /proc/modules as the host had it, plus the emulated amdgpu.
    modules: Mutex<String>,
    blocked: Mutex<Vec<Blocked>>,
    inodes: Mutex<Inodes>,
    /// fh -> the tgid that opened the device, or the snapshot of an opened text file.
    files: Mutex<HashMap<u64, Open>>,
    next_fh: AtomicU64,
    epoch: Instant,
    pub stop: AtomicBool,
    /// tgid -> its start time when its KFD process was made: the kernel keys a KFD process on
    /// its mm, so a new process under a reused pid gets a fresh one (never the old one's state).
    starts: Mutex<HashMap<u32, u64>>,
}

enum Open {
    Device { owner: u32 },
    Render { gi: usize },
    Text(Vec<u8>),
    Write(String),
}

#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    by_ino: HashMap<u64, String>,
}

impl Inodes {
    fn ino(&mut self, path: &str) -> u64 {
        if path.is_empty() {
            return 1;
        }
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        let i = self.by_path.len() as u64 + 2;
        self.by_path.insert(path.to_string(), i);
        self.by_ino.insert(i, path.to_string());
        i
    }
    fn path(&self, ino: u64) -> Option<String> {
        if ino == 1 {
            return Some(String::new());
        }
        self.by_ino.get(&ino).cloned()
    }
}

mod paths;
use paths::{resolve, Node};
pub use paths::{DEBUGFS_DIR, DEVICE, DRI_DIR, MODULES, SYSFS_DIR};

const TTL: Duration = Duration::from_millis(0);

fn attr(ino: u64, node: &Node) -> FileAttr {
    let (kind, perm, size, nlink) = match node {
        Node::Dir(_) => (FileType::Directory, 0o555, 0, 2),
        Node::Text(_) => (FileType::RegularFile, 0o444, 4096, 1),
        Node::Device | Node::Render(_) => (FileType::RegularFile, 0o666, 0, 1),
        Node::HangHws => (FileType::RegularFile, 0o200, 0, 1),
    };
    let t = SystemTime::UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Shared {
    pub fn new(kfd: Kfd) -> Arc<Self> {
        let backing = memfd("gpreempt-sim-kfd").and_then(|kfd_fd| {
            let render = (0..kfd.gpus.len())
                .map(|i| memfd(&format!("gpreempt-sim-render{i}")))
                .collect::<Option<Vec<_>>>()?;
            Some(Backing {
                kfd: kfd_fd,
                render,
            })
        });
        Arc::new(Shared {
            kfd: Mutex::new(kfd),
            backing,
            backing_ids: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
            modules: Mutex::new(String::new()),
            blocked: Mutex::new(Vec::new()),
            inodes: Mutex::new(Inodes::default()),
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            starts: Mutex::new(HashMap::new()),
        })
    }

    fn starts(&self) -> MutexGuard<'_, HashMap<u32, u64>> {
        self.starts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the KFD process of `pid` belongs to a process that is gone: exited (no mm), or
    /// its pid now names another process (a different start time).
    fn kfd_process_gone(&self, pid: u32) -> bool {
        if !host::process_alive(pid) {
            return true;
        }
        let known = self.starts().get(&pid).copied();
        known.is_some_and(|k| host::start_time(pid).is_some_and(|now| now != k))
    }

    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn lock(&self) -> MutexGuard<'_, Kfd> {
        self.kfd.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn blocked(&self) -> MutexGuard<'_, Vec<Blocked>> {
        self.blocked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn files(&self) -> MutexGuard<'_, HashMap<u64, Open>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Finish blocked calls that can proceed, and interrupt those whose thread has a signal
    /// pending (FUSE cannot interrupt them itself: the caller would stay in D state).
    fn settle(&self, kfd: &mut Kfd, now: u64) {
        let mut blocked = self.blocked();
        let mut still = Vec::new();
        for b in blocked.drain(..) {
            let outcome = match kfd.retry(&b.wait, now) {
                Some(o) => Some(o),
                None if host::signal_pending(b.tid) => Some(kfd.interrupt(&b.wait)),
                None => None,
            };
            match outcome {
                Some(Outcome::Done { ret, out }) => {
                    b.reply.ioctl(ret, &out[..out.len().min(b.out_size)]);
                }
                Some(Outcome::Blocked(w)) => still.push(Blocked { wait: w, ..b }),
                None => still.push(b),
            }
        }
        *blocked = still;
    }

    /// Whether the kernel granted FUSE passthrough (known once the mount answered a request).
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// /proc/modules as `sim` shows it.
    pub fn set_modules(&self, text: String) {
        *self.modules.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    /// Writes an ioctl or the GPU made to processes' memory, and freed buffer-object ranges given
    /// back: done with the model unlocked.
    fn flush(&self, writes: Vec<(u32, u64, Vec<u8>)>, freed: Vec<(u32, u64, u64)>) {
        if writes.is_empty() && freed.is_empty() {
            return;
        }
        let mut host = RealHost;
        for (pid, addr, data) in writes {
            let _ = host.write_mem(pid, addr, &data);
        }
        let Some(b) = &self.backing else { return };
        let kfd = self.lock();
        let ranges: Vec<(usize, u64, u64)> = freed
            .into_iter()
            .filter_map(|(gpu_id, off, len)| {
                let gi = kfd.gpus.iter().position(|g| g.gpu_id == gpu_id)?;
                Some((gi, off, len))
            })
            .collect();
        drop(kfd);
        for (gi, off, len) in ranges {
            if let Some(fd) = b.render.get(gi) {
                // SAFETY: fallocate on an fd we own; punching a hole frees the range's pages.
                unsafe {
                    libc::fallocate(
                        fd.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        off as libc::off_t,
                        len as libc::off_t,
                    )
                };
            }
        }
    }

    /// The engine: run the GPU, finish blocked calls, notice processes that are gone. One tick
    /// reads ahead without the lock, runs the model with the lock, then writes without it; the
    /// events its completions raised are signaled at the start of the next tick, which follows at
    /// once (two lock holds a tick).
    pub fn run_engine(&self) {
        let mut host = RealHost;
        let mut last_reap = 0;
        let mut events: Vec<(u32, u32)> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.now();
            let plan = {
                let mut kfd = self.lock();
                for (pid, id) in events.drain(..) {
                    kfd.signal_event(pid, id);
                }
                if now - last_reap > 10_000_000 {
                    last_reap = now;
                    let gone: Vec<u32> = kfd
                        .procs
                        .keys()
                        .copied()
                        .filter(|p| self.kfd_process_gone(*p))
                        .collect();
                    for pid in gone {
                        kfd.process_exit(pid, now);
                        self.starts().remove(&pid);
                    }
                }
                self.settle(&mut kfd, now);
                crate::gpu::plan_reads(&kfd)
            };
            let mut pre = crate::gpu::prefetch(&plan, &mut host);
            let (completions, freed, sleep) = {
                let mut kfd = self.lock();
                crate::gpu::advance(&mut kfd, &mut pre, now);
                let busy = kfd.gpus.iter().any(|g| g.slots.iter().any(Option::is_some));
                let poll: u64 = if busy { 200_000 } else { 2_000_000 };
                let next = crate::gpu::next_deadline(&kfd).unwrap_or(u64::MAX);
                (
                    std::mem::take(&mut kfd.completions),
                    std::mem::take(&mut kfd.freed_bos),
                    next.saturating_sub(now).clamp(20_000, poll),
                )
            };
            self.flush(std::mem::take(&mut pre.writes), freed);
            events = crate::gpu::finish_completions(&completions, &mut host);
            if events.is_empty() {
                std::thread::sleep(Duration::from_nanos(sleep));
            }
        }
    }
}

/// The FUSE filesystem over [`Shared`].
pub struct SimFs(pub Arc<Shared>);

impl SimFs {
    fn lookup_node(&self, path: &str) -> Option<Node> {
        let modules = self
            .0
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        resolve(&self.0.lock(), &modules, path)
    }

    /// The passthrough backing of a device inode (`None`: plain FUSE, no mmap).
    fn backing(&self, reply: &ReplyOpen, ino: u64, fd: &OwnedFd) -> Option<()> {
        if !self.0.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let mut ids = self.0.backing_ids.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Vacant(e) = ids.entry(ino) {
            match reply.open_backing(fd) {
                Ok(id) => {
                    e.insert(id);
                }
                Err(e) => {
                    log::warn!(
                        "FUSE passthrough refused ({e}): mmap of the emulated devices will fail"
                    );
                    return None;
                }
            }
        }
        Some(())
    }
    fn path(&self, ino: INodeNo) -> Option<String> {
        self.0
            .inodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .path(ino.0)
    }
    fn ino(&self, path: &str) -> u64 {
        self.0
            .inodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ino(path)
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

impl Filesystem for SimFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Passthrough maps the devices' mmaps straight to memfds (Linux 6.9+); without it the
        // emulator still serves ioctls, and mmap fails as on any FUSE file opened direct-io.
        if self.0.backing.is_some()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.0.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (Some(pp), Some(name)) = (self.path(parent), name.to_str()) else {
            return reply.error(Errno::ENOENT);
        };
        let path = join(&pp, name);
        match self.lookup_node(&path) {
            Some(node) => {
                let ino = self.ino(&path);
                reply.entry(&TTL, &attr(ino, &node), Generation(0));
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).and_then(|p| self.lookup_node(&p)) {
            Some(node) => reply.attr(&TTL, &attr(ino.0, &node)),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.getattr(_req, ino, None, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(node) = self.path(ino).and_then(|p| self.lookup_node(&p)) else {
            return reply.error(Errno::ENOENT);
        };
        let mut backing_fd = None;
        let open = match node {
            Node::Device => {
                let tid = req.pid();
                let Some(tgid) = host::tgid_of(tid) else {
                    return reply.error(Errno::ESRCH);
                };
                let mut kfd = self.0.lock();
                // A pid reused before the engine's reap saw the old process go: the old
                // process's KFD state ends first.
                if kfd.procs.contains_key(&tgid) && self.0.kfd_process_gone(tgid) {
                    kfd.process_exit(tgid, self.0.now());
                    self.0.starts().remove(&tgid);
                }
                if !kfd.procs.contains_key(&tgid) {
                    if let Some(t) = host::start_time(tgid) {
                        self.0.starts().insert(tgid, t);
                    }
                }
                kfd.open(Caller { tgid, tid });
                backing_fd = self.0.backing.as_ref().map(|b| &b.kfd);
                Open::Device { owner: tgid }
            }
            Node::Render(gi) => {
                backing_fd = self.0.backing.as_ref().and_then(|b| b.render.get(gi));
                Open::Render { gi }
            }
            Node::Text(t) => Open::Text(t.into_bytes()),
            Node::HangHws => Open::Write(String::new()),
            Node::Dir(_) => return reply.error(Errno::EISDIR),
        };
        let fh = self.0.next_fh.fetch_add(1, Ordering::Relaxed);
        self.0.files().insert(fh, open);
        if let Some(fd) = backing_fd {
            if self.backing(&reply, ino.0, fd).is_some() {
                let ids = self.0.backing_ids.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(id) = ids.get(&ino.0) {
                    return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), id);
                }
            }
        }
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.0.files().get(&fh.0) {
            Some(Open::Text(t)) => {
                let start = (offset as usize).min(t.len());
                let end = (start + size as usize).min(t.len());
                reply.data(&t[start..end]);
            }
            Some(Open::Device { .. } | Open::Render { .. }) => reply.error(Errno::EINVAL),
            _ => reply.error(Errno::EBADF),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.0.files().get_mut(&fh.0) {
            Some(Open::Write(buf)) => {
                buf.push_str(&String::from_utf8_lossy(data));
                // kfd_debugfs_hang_hws: a decimal gpu_id.
                let Ok(gpu_id) = buf.trim().parse::<u32>() else {
                    return reply.error(Errno::EINVAL);
                };
                let mut kfd = self.0.lock();
                match kfd.gpus.iter_mut().find(|g| g.gpu_id == gpu_id) {
                    Some(g) => {
                        g.hws_hung = true;
                        reply.written(data.len() as u32);
                    }
                    None => reply.error(Errno::EINVAL),
                }
            }
            _ => reply.error(Errno::EBADF),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Closing /dev/kfd does not end the process's KFD state: mm teardown does (engine).
        self.0.files().remove(&fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(Node::Dir(entries)) = self.lookup_node(&path) else {
            return reply.error(Errno::ENOTDIR);
        };
        let mut all = vec![(".".to_string(), true, ino.0), ("..".to_string(), true, 1)];
        for (name, is_dir) in entries {
            let i = self.ino(&join(&path, &name));
            all.push((name, is_dir, i));
        }
        for (i, (name, is_dir, child)) in all.into_iter().enumerate().skip(offset as usize) {
            let kind = if is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let owner = match self.0.files().get(&fh.0) {
            Some(Open::Device { owner }) => *owner,
            Some(Open::Render { gi }) => {
                let gi = *gi;
                return self.render_ioctl(req, gi, cmd, in_data, out_size, reply);
            }
            _ => return reply.error(Errno::ENOTTY),
        };
        if flags.contains(IoctlFlags::FUSE_IOCTL_COMPAT) {
            // kfd_open refuses 32-bit processes.
            return reply.error(Errno::EPERM);
        }
        let tid = req.pid();
        let Some(tgid) = host::tgid_of(tid) else {
            return reply.error(Errno::ESRCH);
        };
        let now = self.0.now();
        let mut host = RealHost;
        let (outcome, writes, freed) = {
            let mut kfd = self.0.lock();
            let o = kfd.ioctl(Caller { tgid, tid }, owner, cmd, in_data, &mut host, now);
            (
                o,
                std::mem::take(&mut kfd.pending_writes),
                std::mem::take(&mut kfd.freed_bos),
            )
        };
        // Output the call wrote to the caller's memory lands before the call returns.
        self.0.flush(writes, freed);
        match outcome {
            Outcome::Done { ret, out } => {
                reply.ioctl(ret, &out[..out.len().min(out_size as usize)]);
            }
            Outcome::Blocked(wait) => self.0.blocked().push(Blocked {
                wait,
                tid,
                out_size: out_size as usize,
                reply,
            }),
        }
        // A state change may let sleeping calls proceed (resume wakes destroyers, ...).
        if !self.0.blocked().is_empty() {
            let mut kfd = self.0.lock();
            self.0.settle(&mut kfd, now);
        }
    }
}

impl SimFs {
    /// A render-node ioctl: the model's lock is taken only to copy the device's fixed facts.
    fn render_ioctl(
        &self,
        req: &Request,
        gi: usize,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let Some(tgid) = host::tgid_of(req.pid()) else {
            return reply.error(Errno::ESRCH);
        };
        let Some(spec) = self.0.lock().gpus.get(gi).map(|g| g.spec.clone()) else {
            return reply.error(Errno::ENODEV);
        };
        match crate::drm::ioctl(&spec, tgid, cmd, in_data, &mut RealHost) {
            Outcome::Done { ret, out } => {
                reply.ioctl(ret, &out[..out.len().min(out_size as usize)]);
            }
            Outcome::Blocked(_) => reply.error(Errno::EIO),
        }
    }
}
