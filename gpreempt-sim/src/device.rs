//! The FUSE filesystem: the device file (`dev/kfd`) and the sysfs / debugfs trees, all backed by
//! one [`Kfd`] model, plus the engine thread that runs the GPU and finishes blocked ioctls.
//!
//! Layout of the mount (bind-mounted to the real paths by `sim`):
//! `kfd` -> /dev/kfd, `sys-class-kfd/` -> /sys/class/kfd, `debug-kfd/` -> /sys/kernel/debug/kfd.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use crate::host::{self, RealHost};
use crate::model::{Caller, Kfd, Outcome, Wait};
use crate::views;

/// Names inside the mount.
pub const DEVICE: &str = "kfd";
pub const SYSFS_DIR: &str = "sys-class-kfd";
pub const DEBUGFS_DIR: &str = "debug-kfd";

/// A call sleeping in the emulated kernel.
struct Blocked {
    wait: Wait,
    tid: u32,
    out_size: usize,
    reply: ReplyIoctl,
}

/// State shared by the FUSE session and the engine.
pub struct Shared {
    pub kfd: Mutex<Kfd>,
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

/// What a path in the mount is.
enum Node {
    Dir(Vec<(String, bool)>),
    Text(String),
    Device,
    /// debugfs `hang_hws` (write-only).
    HangHws,
}

fn dir(entries: impl IntoIterator<Item = (String, bool)>) -> Node {
    Node::Dir(entries.into_iter().collect())
}

/// Resolve a path against the model (None: no such file).
fn resolve(kfd: &Kfd, path: &str) -> Option<Node> {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let d = |n: &str| (n.to_string(), true);
    let f = |n: &str| (n.to_string(), false);
    Some(match parts.as_slice() {
        [] => dir([f(DEVICE), d(SYSFS_DIR), d(DEBUGFS_DIR)]),
        [DEVICE] => Node::Device,
        [SYSFS_DIR] => dir([d("kfd")]),
        [SYSFS_DIR, "kfd"] => dir([d("topology"), d("proc")]),
        [SYSFS_DIR, "kfd", "topology"] => {
            dir([f("generation_id"), f("system_properties"), d("nodes")])
        }
        [SYSFS_DIR, "kfd", "topology", "generation_id"] => Node::Text("1\n".into()),
        [SYSFS_DIR, "kfd", "topology", "system_properties"] => {
            Node::Text("platform_oem 0\nplatform_id 0\nplatform_rev 0\n".into())
        }
        [SYSFS_DIR, "kfd", "topology", "nodes"] => {
            dir((0..=kfd.gpus.len()).map(|n| d(&n.to_string())))
        }
        [SYSFS_DIR, "kfd", "topology", "nodes", n] => {
            let n: u32 = n.parse().ok()?;
            views::node_gpu_id(kfd, n)?;
            dir([f("gpu_id"), f("name"), f("properties")])
        }
        [SYSFS_DIR, "kfd", "topology", "nodes", n, file] => {
            let n: u32 = n.parse().ok()?;
            Node::Text(match *file {
                "gpu_id" => views::node_gpu_id(kfd, n)?,
                "name" => views::node_name(kfd, n)?,
                "properties" => views::node_properties(kfd, n)?,
                _ => return None,
            })
        }
        [SYSFS_DIR, "kfd", "proc"] => dir(kfd.procs.keys().map(|p| d(&p.to_string()))),
        [SYSFS_DIR, "kfd", "proc", pid, rest @ ..] => {
            let p = kfd.procs.get(&pid.parse().ok()?)?;
            match rest {
                [] => {
                    let mut e = vec![f("pasid"), d("queues")];
                    for g in p.pdds.keys() {
                        e.extend([
                            f(&format!("vram_{g}")),
                            f(&format!("sdma_{g}")),
                            d(&format!("stats_{g}")),
                        ]);
                    }
                    Node::Dir(e)
                }
                ["pasid"] => Node::Text(views::proc_pasid()),
                ["queues"] => dir(p.queues.keys().map(|q| d(&q.to_string()))),
                ["queues", q] => {
                    p.queues.get(&q.parse().ok()?)?;
                    dir([f("size"), f("type"), f("gpuid")])
                }
                ["queues", q, file] => {
                    let q = p.queues.get(&q.parse().ok()?)?;
                    Node::Text(match *file {
                        "size" => views::queue_size(q),
                        "type" => views::queue_type(q),
                        "gpuid" => views::queue_gpuid(q),
                        _ => return None,
                    })
                }
                [name] => {
                    let (kind, g) = name.split_once('_')?;
                    let g: u32 = g.parse().ok()?;
                    match kind {
                        "vram" => Node::Text(views::vram(p, g)?),
                        "sdma" => Node::Text(views::sdma(p, g)?),
                        "stats" => {
                            p.pdds.get(&g)?;
                            dir([f("evicted_ms"), f("cu_occupancy")])
                        }
                        _ => return None,
                    }
                }
                [stats, file] => {
                    let g: u32 = stats.strip_prefix("stats_")?.parse().ok()?;
                    Node::Text(match *file {
                        "evicted_ms" => views::evicted_ms(p, g)?,
                        "cu_occupancy" => views::cu_occupancy(kfd, p, g)?,
                        _ => return None,
                    })
                }
                _ => return None,
            }
        }
        [DEBUGFS_DIR] => dir([f("mqds"), f("hqds"), f("rls"), f("hang_hws")]),
        [DEBUGFS_DIR, "mqds"] => Node::Text(views::mqds(kfd)),
        [DEBUGFS_DIR, "hqds"] => Node::Text(views::hqds(kfd)),
        [DEBUGFS_DIR, "rls"] => Node::Text(views::rls(kfd)),
        [DEBUGFS_DIR, "hang_hws"] => Node::HangHws,
        _ => return None,
    })
}

const TTL: Duration = Duration::from_millis(0);

fn attr(ino: u64, node: &Node) -> FileAttr {
    let (kind, perm, size, nlink) = match node {
        Node::Dir(_) => (FileType::Directory, 0o555, 0, 2),
        Node::Text(_) => (FileType::RegularFile, 0o444, 4096, 1),
        Node::Device => (FileType::RegularFile, 0o666, 0, 1),
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
        Arc::new(Shared {
            kfd: Mutex::new(kfd),
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

    /// The engine: run the GPU, finish blocked calls, notice processes that are gone.
    pub fn run_engine(&self) {
        let mut host = RealHost;
        let mut last_reap = 0;
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.now();
            let sleep = {
                let mut kfd = self.lock();
                crate::gpu::advance(&mut kfd, &mut host, now);
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
                let busy = kfd.gpus.iter().any(|g| g.slots.iter().any(Option::is_some));
                let poll: u64 = if busy { 200_000 } else { 2_000_000 };
                let next = crate::gpu::next_deadline(&kfd).unwrap_or(u64::MAX);
                next.saturating_sub(now).clamp(20_000, poll)
            };
            std::thread::sleep(Duration::from_nanos(sleep));
        }
    }
}

/// The FUSE filesystem over [`Shared`].
pub struct SimFs(pub Arc<Shared>);

impl SimFs {
    fn lookup_node(&self, path: &str) -> Option<Node> {
        resolve(&self.0.lock(), path)
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
                Open::Device { owner: tgid }
            }
            Node::Text(t) => Open::Text(t.into_bytes()),
            Node::HangHws => Open::Write(String::new()),
            Node::Dir(_) => return reply.error(Errno::EISDIR),
        };
        let fh = self.0.next_fh.fetch_add(1, Ordering::Relaxed);
        self.0.files().insert(fh, open);
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
            Some(Open::Device { .. }) => reply.error(Errno::EINVAL),
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
        let mut kfd = self.0.lock();
        let mut host = RealHost;
        let outcome = kfd.ioctl(Caller { tgid, tid }, owner, cmd, in_data, &mut host, now);
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
        self.0.settle(&mut kfd, now);
    }
}
