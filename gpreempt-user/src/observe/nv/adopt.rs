//! Adoption: a restarted controller takes back the CUDA processes that were already running.
//!
//! The observer learns a process's RM objects (client, device, subdevice, TSG, channel) from
//! their allocations only, so a controller killed and restarted mid-workload would see none of
//! them. `run` therefore journals the allocations that matter ([`ObjectLog`], written to
//! `<run dir>/nv-objects.json`, mode 0600), and a new `run` replays them ([`adopt`]) after
//! proving each one through the driver: the process is the same (pid and start time), its fd is
//! an NVIDIA device, and `NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO`, asked through a duplicate of
//! that fd (`pidfd_getfd`: the RM only answers for clients made on that file), names the same
//! class and parent for every handle. Nothing the process could have written is trusted: the
//! journal is root's file, and each entry is checked against the driver before it is used.
//!
//! A process holding `/dev/nvidiactl` that neither events nor the journal explain opened the
//! driver before any controller watched it ([`unexplained`]): it is shown as unmanaged, with why.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::Path,
};

use anyhow::{Context as _, Result};
use gpreempt_common::nv::{self, class, handle_info as hi};
use serde::{Deserialize, Serialize};

use crate::observe::{
    events::{NvCall, NvEvent, Origin},
    procinfo::ProcId,
};

/// The journal's file name in the run directory.
pub const FILE: &str = "nv-objects.json";
/// At most this many objects per process and processes are journaled (a process allocating
/// more is journaled in part: the TSGs past the cap are not adopted after a restart).
pub const MAX_PER_PROC: usize = 1024;
pub const MAX_PROCS: usize = 4096;
/// A journal file larger than this is refused (its own bound: 4096 x 1024 entries is more).
const MAX_FILE: u64 = 64 << 20;

/// One allocation as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rec {
    pub fd: i32,
    pub h_root: u32,
    pub parent: u32,
    pub new: u32,
    pub class: u32,
    pub nvos64: bool,
    pub params_size: u32,
    /// The alloc params' head, hex (channels: the ring's placement; TSGs: the engine type;
    /// devices: the device index).
    #[serde(default)]
    pub params: Option<String>,
    #[serde(default)]
    pub params_len: usize,
}

/// A process's journaled allocations, with its start time (field 22 of /proc/PID/stat).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecs {
    pub start_time: u64,
    pub recs: Vec<Rec>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    version: u32,
    procs: BTreeMap<u32, ProcRecs>,
}

const VERSION: u32 = 1;

fn kept(c: u32) -> bool {
    class::is_client(c)
        || class::is_channel(c)
        || matches!(
            c,
            class::NV01_DEVICE_0 | class::NV20_SUBDEVICE_0 | class::KEPLER_CHANNEL_GROUP_A
        )
}

/// The allocations of live processes that adoption needs, kept from the events.
#[derive(Debug, Default)]
pub struct ObjectLog {
    procs: BTreeMap<u32, Vec<Rec>>,
    dirty: bool,
    /// Allocations not journaled because a cap was reached.
    pub dropped: u64,
}

impl ObjectLog {
    /// Takes note of one RM escape (successful allocations and frees of the kept classes).
    pub fn note(&mut self, n: &NvEvent) {
        if !n.ok() {
            return;
        }
        let pid = n.origin.pid;
        match &n.call {
            NvCall::Alloc {
                h_root,
                h_object_parent,
                h_object_new,
                h_class,
                params_size,
                nvos64,
                alloc_params,
                alloc_params_len,
                ..
            } if kept(*h_class) => {
                if !self.procs.contains_key(&pid) && self.procs.len() >= MAX_PROCS {
                    self.dropped += 1;
                    return;
                }
                let recs = self.procs.entry(pid).or_default();
                if recs.len() >= MAX_PER_PROC {
                    self.dropped += 1;
                    return;
                }
                let client = class::is_client(*h_class);
                recs.push(Rec {
                    fd: n.fd,
                    h_root: if client { *h_object_new } else { *h_root },
                    parent: *h_object_parent,
                    new: *h_object_new,
                    class: *h_class,
                    nvos64: *nvos64,
                    params_size: *params_size,
                    params: alloc_params.map(|p| hex(&p)),
                    params_len: *alloc_params_len,
                });
                self.dirty = true;
            }
            NvCall::Free {
                h_root,
                h_object_old,
                ..
            } => {
                let Some(recs) = self.procs.get_mut(&pid) else {
                    return;
                };
                let before = recs.len();
                if h_object_old == h_root {
                    recs.retain(|r| r.h_root != *h_root);
                } else {
                    // The RM frees an object's children with it.
                    let mut gone = BTreeSet::from([*h_object_old]);
                    loop {
                        let n0 = gone.len();
                        for r in recs.iter() {
                            if r.h_root == *h_root && gone.contains(&r.parent) {
                                gone.insert(r.new);
                            }
                        }
                        if gone.len() == n0 {
                            break;
                        }
                    }
                    recs.retain(|r| r.h_root != *h_root || !gone.contains(&r.new));
                }
                self.dirty |= recs.len() != before;
            }
            _ => {}
        }
    }

    /// The process exited: its objects went with it.
    pub fn exited(&mut self, pid: u32) {
        self.dirty |= self.procs.remove(&pid).is_some();
    }

    /// Starts from what adoption proved (so that a second restart adopts them again).
    pub fn adopted(&mut self, procs: &BTreeMap<u32, Vec<Rec>>) {
        for (pid, recs) in procs {
            self.procs
                .entry(*pid)
                .or_default()
                .extend(recs.iter().cloned());
        }
        self.dirty = true;
    }

    /// Writes the journal if it changed; `start_time` gives each process's (None: it is gone,
    /// and is forgotten).
    pub fn save(&mut self, dir: &Path, start_time: impl Fn(u32) -> Option<u64>) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let mut f = File {
            version: VERSION,
            procs: BTreeMap::new(),
        };
        let mut gone = Vec::new();
        for (pid, recs) in &self.procs {
            match start_time(*pid) {
                Some(t) => {
                    f.procs.insert(
                        *pid,
                        ProcRecs {
                            start_time: t,
                            recs: recs.clone(),
                        },
                    );
                }
                None => gone.push(*pid),
            }
        }
        for pid in gone {
            self.procs.remove(&pid);
        }
        crate::rundir::write_atomic(
            &dir.join(FILE),
            &serde_json::to_vec(&f)?,
            crate::rundir::PRIVATE_MODE,
        )?;
        self.dirty = false;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.procs.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

/// The journal a previous controller left, if any (a missing file is an empty journal).
pub fn load(dir: &Path) -> Result<BTreeMap<u32, ProcRecs>> {
    use std::io::Read as _;
    let path = dir.join(FILE);
    let f = match crate::rundir::open_read(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let mut text = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        text.len() as u64 <= MAX_FILE,
        "{} is over {} MiB: not read",
        path.display(),
        MAX_FILE >> 20
    );
    let f: File = serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a journal this version writes", path.display()))?;
    anyhow::ensure!(
        f.version == VERSION,
        "{}: journal version {} (this controller writes {VERSION})",
        path.display(),
        f.version
    );
    Ok(f.procs)
}

/// What adoption asks of the host (a fake in tests).
pub trait Host {
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// A duplicate of `fd` of the process `id` names (never another owner of its pid), checked
    /// to be an NVIDIA device file.
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd>;
    fn handle_info(
        &mut self,
        fd: BorrowedFd,
        h_client: u32,
        h_object: u32,
        index: u32,
    ) -> Result<u64>;
    /// The device instance of the GPU behind a subdevice (a device's alloc `deviceId`).
    fn device_instance(&mut self, fd: BorrowedFd, h_client: u32, h_subdevice: u32) -> Result<u32>;
}

/// The real host: /proc, `pidfd_getfd`, the RM.
pub struct RealHost<'a> {
    pub proc_root: &'a Path,
}

impl Host for RealHost<'_> {
    fn start_time(&self, pid: u32) -> Option<u64> {
        crate::observe::procinfo::start_time(self.proc_root, pid).ok()
    }

    fn dup(&mut self, id: ProcId, fd: i32) -> Result<OwnedFd> {
        let d = super::rm::dup_fd(id, fd)?;
        anyhow::ensure!(
            is_nvidia_device(d.as_fd()),
            "pid {} fd {fd} is no longer an NVIDIA device file",
            id.pid
        );
        Ok(d)
    }

    fn handle_info(
        &mut self,
        fd: BorrowedFd,
        h_client: u32,
        h_object: u32,
        index: u32,
    ) -> Result<u64> {
        super::rm::handle_info(fd, h_client, h_object, index)
    }

    fn device_instance(&mut self, fd: BorrowedFd, h_client: u32, h_subdevice: u32) -> Result<u32> {
        super::rm::device_instance(fd, h_client, h_subdevice)
    }
}

/// Whether `fd` is an NVIDIA character device, from cached attributes only
/// (`AT_STATX_DONT_SYNC`: a file on a FUSE mount is not asked, so its server cannot hold us).
fn is_nvidia_device(fd: BorrowedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    // SAFETY: statx only writes the zeroed struct we pass; an all-zero `statx` is valid.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a live fd for the call; the path is an empty C string with AT_EMPTY_PATH;
    // `st` is a valid, exclusively borrowed statx buffer.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut st,
        )
    };
    r == 0
        && u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFCHR
        && st.stx_rdev_major == nv::NV_MAJOR_DEVICE_NUMBER
}

/// What adoption made of a journal.
#[derive(Debug, Default)]
pub struct Adoption {
    /// The proven allocations, as events to replay through the model (in journal order).
    pub events: Vec<NvEvent>,
    /// The same, by pid, for the next journal.
    pub kept: BTreeMap<u32, Vec<Rec>>,
    /// Processes (or parts) not adopted, and why.
    pub refused: Vec<(u32, String)>,
}

impl Adoption {
    pub fn tsgs(&self) -> usize {
        self.kept
            .values()
            .flatten()
            .filter(|r| r.class == class::KEPLER_CHANNEL_GROUP_A)
            .count()
    }
}

/// Proves each journaled process and object through the driver; what holds is replayed.
pub fn adopt(journal: BTreeMap<u32, ProcRecs>, host: &mut impl Host, now_ns: u64) -> Adoption {
    let mut out = Adoption::default();
    for (pid, pr) in journal {
        match host.start_time(pid) {
            Some(t) if t == pr.start_time => {}
            Some(_) => {
                out.refused.push((
                    pid,
                    "pid reused by another process since the journal".into(),
                ));
                continue;
            }
            None => continue, // exited: nothing to adopt, nothing to say
        }
        let mut fds: BTreeMap<i32, Option<OwnedFd>> = BTreeMap::new();
        // Client handles proven, per fd; objects proven (by client, handle).
        let mut clients: BTreeSet<(i32, u32)> = BTreeSet::new();
        let mut objects: BTreeSet<(u32, u32)> = BTreeSet::new();
        let mut kept = Vec::new();
        let mut why: Option<String> = None;
        for r in pr.recs {
            let fd = fds.entry(r.fd).or_insert_with(|| {
                match host.dup(
                    ProcId {
                        pid,
                        start_time: pr.start_time,
                    },
                    r.fd,
                ) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        why.get_or_insert_with(|| format!("{e:#}"));
                        None
                    }
                }
            });
            let Some(fd) = fd.as_ref() else { continue };
            let ok = if class::is_client(r.class) {
                // A client's class is asked of the client itself.
                let proven = host
                    .handle_info(fd.as_fd(), r.new, r.new, hi::INDEX_CLASSID)
                    .map(|c| c == u64::from(r.class));
                if matches!(proven, Ok(true)) {
                    clients.insert((r.fd, r.new));
                }
                proven
            } else if !clients.contains(&(r.fd, r.h_root))
                || (r.parent != r.h_root && !objects.contains(&(r.h_root, r.parent)))
            {
                // Its client or parent was not proven: nothing under it is.
                Ok(false)
            } else {
                let cls = host.handle_info(fd.as_fd(), r.h_root, r.new, hi::INDEX_CLASSID);
                let par = host.handle_info(fd.as_fd(), r.h_root, r.new, hi::INDEX_PARENT);
                cls.and_then(|c| par.map(|p| c == u64::from(r.class) && p == u64::from(r.parent)))
            };
            match ok {
                Ok(true) => {
                    if !class::is_client(r.class) {
                        objects.insert((r.h_root, r.new));
                    }
                    out.events.push(event(pid, &r, now_ns));
                    kept.push(r);
                }
                Ok(false) => {
                    why.get_or_insert_with(|| {
                        format!(
                            "handle {:#x} (class {:#x}) is no longer what the journal says",
                            r.new, r.class
                        )
                    });
                }
                Err(e) => {
                    why.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
        let has_tsg = kept
            .iter()
            .any(|r| r.class == class::KEPLER_CHANNEL_GROUP_A);
        if let Some(w) = why.filter(|_| !has_tsg) {
            out.refused.push((pid, w));
        }
        if !kept.is_empty() {
            out.kept.insert(pid, kept);
        }
    }
    out
}

/// Where [`discover`] looks for a process that no journal names.
#[derive(Clone, Debug)]
pub struct Scan {
    /// Client handle indices below this are tried, newest first (the RM's next index: clients
    /// of running processes are below it).
    pub client_top: u32,
    /// Object handle ranges by base (libcuda's own handles start at 0x5c000000 on driver 580,
    /// the RM's at 0xcaf00000): each is read from its base until [`QUICK_GAP`] handles in a
    /// row answer nothing, at most [`SPAN`] handles; again until [`GAP`] where that found
    /// objects but no compute TSG.
    pub bases: Vec<u32>,
    /// Driver calls allowed for one process (each is a few microseconds).
    pub max_calls: u64,
}

pub const DEFAULT_BASES: [u32; 2] = [0x5c00_0000, 0xcaf0_0000];
pub const GAP: u32 = 0x1000;
/// The first pass's gap ([`discover`]).
pub const QUICK_GAP: u32 = 0x100;
pub const SPAN: u32 = 0x1_0000;
/// About 2 s of driver calls at the H100's ~5 us each.
pub const MAX_CALLS: u64 = 400_000;

/// What [`discover`] found for one process.
#[derive(Debug, Default)]
pub struct Found {
    /// Allocations in an order the model can replay (clients, devices, subdevices, TSGs,
    /// channels), as a journal would hold them.
    pub recs: Vec<Rec>,
    pub calls: u64,
    /// Why something was not found (a budget, an fd), if so.
    pub why_not: Option<String>,
}

impl Found {
    pub fn tsgs(&self) -> usize {
        self.recs
            .iter()
            .filter(|r| r.class == class::KEPLER_CHANNEL_GROUP_A)
            .count()
    }
}

/// Finds a running process's RM objects from the driver itself, through duplicates of its
/// `fds` (its /dev/nvidiactl files): which clients each file holds (`GET_HANDLE_INFO` of
/// candidate client handles answers only for the file's own), then the class and parent of
/// every handle in the scanned ranges under each client. A TSG is a compute one when one of
/// its channels holds a compute engine object (`*_COMPUTE_*`); a device's index comes from its
/// subdevice's GPU id. Channel rings stay unknown (their placement is in the alloc params
/// only): such a process has no channel activity, but its TSGs can be paused and timesliced.
pub fn discover(id: ProcId, fds: &[i32], host: &mut impl Host, scan: &Scan) -> Found {
    let mut out = Found::default();
    let over = |calls: u64| calls >= scan.max_calls;
    for &fd in fds {
        let d = match host.dup(id, fd) {
            Ok(d) => d,
            Err(e) => {
                out.why_not.get_or_insert_with(|| format!("{e:#}"));
                continue;
            }
        };
        let mut clients = Vec::new();
        for idx in (0..scan.client_top.min(nv::CLIENT_HANDLE_MAX)).rev() {
            if over(out.calls) {
                break;
            }
            let h = nv::CLIENT_HANDLE_BASE + idx;
            out.calls += 1;
            let c = host
                .handle_info(d.as_fd(), h, h, hi::INDEX_CLASSID)
                .ok()
                .and_then(|c| u32::try_from(c).ok())
                .filter(|&c| class::is_client(c));
            if let Some(c) = c {
                clients.push((h, c));
            }
        }
        for (client, c) in clients {
            out.recs
                .push(found_rec(fd, client, client, client, c, None));
            // A short gap first: libcuda hands out handles in sequence and makes its device,
            // TSGs and channels with the context, so they sit among the first handles of a
            // client. Only a client where that finds objects but no compute TSG is read again
            // with the long gap (one with none in its first handles holds no context: libcuda's
            // second client per process is such).
            let mut objects =
                scan_objects(host, d.as_fd(), client, scan, QUICK_GAP, &mut out.calls);
            let compute = objects.iter().any(|o| class::is_compute(o.1));
            if !objects.is_empty() && !compute && !over(out.calls) {
                objects = scan_objects(host, d.as_fd(), client, scan, GAP, &mut out.calls);
            }
            let parent_of = |h: u32| objects.iter().find(|o| o.0 == h).map(|o| o.2);
            let compute_tsgs: BTreeSet<u32> = objects
                .iter()
                .filter(|o| class::is_compute(o.1))
                .filter_map(|o| parent_of(o.2))
                .collect();
            let rank = |c: u32| match c {
                class::NV01_DEVICE_0 => Some(0),
                class::NV20_SUBDEVICE_0 => Some(1),
                class::KEPLER_CHANNEL_GROUP_A => Some(2),
                c if class::is_channel(c) => Some(3),
                _ => None,
            };
            let mut kept: Vec<(u32, u32, u32)> = objects
                .iter()
                .copied()
                .filter(|o| rank(o.1).is_some())
                .collect();
            kept.sort_by_key(|o| (rank(o.1), o.0));
            for (h, cls, parent) in kept {
                let params = match cls {
                    class::NV01_DEVICE_0 => {
                        let sub = objects
                            .iter()
                            .find(|o| o.1 == class::NV20_SUBDEVICE_0 && o.2 == h)
                            .map(|o| o.0);
                        out.calls += 2;
                        let idx = sub
                            .and_then(|s| host.device_instance(d.as_fd(), client, s).ok())
                            .unwrap_or(0);
                        Some((0, idx))
                    }
                    class::KEPLER_CHANNEL_GROUP_A => {
                        let engine = if compute_tsgs.contains(&h) {
                            nv::ENGINE_TYPE_GRAPHICS
                        } else {
                            0
                        };
                        Some((nv::TSG_ENGINE_TYPE_AT, engine))
                    }
                    _ => None,
                };
                out.recs.push(found_rec(fd, client, parent, h, cls, params));
            }
        }
        if over(out.calls) {
            out.why_not.get_or_insert_with(|| {
                format!(
                    "the scan stopped at its budget of {} driver calls",
                    scan.max_calls
                )
            });
        }
    }
    out
}

/// Every handle of `client` in the scanned ranges, read from each base until `gap` handles in
/// a row answer nothing (at most [`SPAN`], within the budget): (handle, class, parent).
fn scan_objects(
    host: &mut impl Host,
    d: BorrowedFd,
    client: u32,
    scan: &Scan,
    gap: u32,
    calls: &mut u64,
) -> Vec<(u32, u32, u32)> {
    let mut objects = Vec::new();
    for &base in &scan.bases {
        let (mut h, mut miss) = (base, 0);
        while h < base.saturating_add(SPAN) && miss < gap && *calls < scan.max_calls {
            *calls += 1;
            match host.handle_info(d, client, h, hi::INDEX_CLASSID) {
                Ok(cls) => {
                    miss = 0;
                    *calls += 1;
                    let parent = host
                        .handle_info(d, client, h, hi::INDEX_PARENT)
                        .unwrap_or(0);
                    objects.push((h, cls as u32, parent as u32));
                }
                Err(_) => miss += 1,
            }
            h += 1;
        }
    }
    objects
}

/// A discovered object as a journal entry; `params`: one u32 of the alloc params (at, value).
fn found_rec(
    fd: i32,
    client: u32,
    parent: u32,
    new: u32,
    cls: u32,
    params: Option<(usize, u32)>,
) -> Rec {
    Rec {
        fd,
        h_root: client,
        parent,
        new,
        class: cls,
        nvos64: false,
        params_size: 0,
        params: params.map(|(at, v)| {
            let mut p = [0u8; nv::ALLOC_HEAD_LEN];
            p[at..at + 4].copy_from_slice(&v.to_le_bytes());
            hex(&p)
        }),
        // Short of a channel's head: no ring placement is claimed.
        params_len: nv::PARAMS_HEAD_LEN,
    }
}

/// The allocation event a journal entry stands for.
pub fn event(pid: u32, r: &Rec, now_ns: u64) -> NvEvent {
    let size = if r.nvos64 {
        nv::alloc::NVOS64_SIZE
    } else {
        nv::alloc::NVOS21_SIZE
    };
    NvEvent {
        origin: Origin {
            ts_ns: now_ns,
            pid,
            tid: pid,
            comm: String::new(),
        },
        fd: r.fd,
        cmd: nv::iowr(nv::nr::RM_ALLOC, size),
        ret: 0,
        duration_ns: 0,
        call: NvCall::Alloc {
            h_root: r.h_root,
            h_object_parent: r.parent,
            h_object_new: r.new,
            h_class: r.class,
            params_size: r.params_size,
            status: nv::status::OK,
            nvos64: r.nvos64,
            alloc_params: r.params.as_deref().and_then(unhex),
            alloc_params_len: r.params_len.min(nv::ALLOC_HEAD_LEN),
        },
        verified: true,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; nv::ALLOC_HEAD_LEN]> {
    let mut out = [0u8; nv::ALLOC_HEAD_LEN];
    if s.len() != 2 * nv::ALLOC_HEAD_LEN || !s.is_ascii() {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Processes holding `/dev/nvidiactl` that `known` does not explain: they opened the driver
/// before any observer watched and no journal names them. Each with why it is unmanaged.
pub fn unexplained(proc_root: &Path, known: &BTreeSet<u32>, me: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || known.contains(&pid) {
            continue;
        }
        // The controller, its guardian and its self-test run this binary: theirs are the
        // tool's own handles, not a workload's.
        if !nvidiactl_fds(proc_root, pid).is_empty() && !is_own_binary(&e.path().join("exe")) {
            out.push((
                pid,
                "opened the NVIDIA driver before the observer attached and no journal of a \
                 previous controller names its RM objects"
                    .into(),
            ));
        }
    }
    out.sort();
    out
}

/// Whether `exe` (a /proc/PID/exe) is the file this process runs, from cached attributes
/// (`AT_STATX_DONT_SYNC`: an executable on a FUSE mount is not asked).
fn is_own_binary(exe: &Path) -> bool {
    let id = |p: &Path| -> Option<(u32, u32, u64)> {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: an all-zero `statx` is valid; statx only writes into it.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string for the call; `st` is exclusively borrowed.
        let r = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_STATX_DONT_SYNC,
                libc::STATX_INO,
                &mut st,
            )
        };
        (r == 0).then_some((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
    };
    match (id(Path::new("/proc/self/exe")), id(exe)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The fds of a process that name /dev/nvidiactl, by the links' text: a stat would follow the
/// link, and a file on a FUSE mount of the process's own could hold root there. Listing one as
/// unmanaged rests on this alone (display); every act proves the fd by [`Host::dup`] first.
pub fn nvidiactl_fds(proc_root: &Path, pid: u32) -> Vec<i32> {
    let dir = proc_root.join(pid.to_string()).join("fd");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut fds: Vec<i32> = rd
        .flatten()
        .take(65_536)
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == nv::NVIDIACTL))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

#[cfg(test)]
mod tests;
