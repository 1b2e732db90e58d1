//! Kernel names for AQL dispatch packets. A packet's `kernel_object` is the address of the
//! kernel's descriptor; ROCr's loader lists the code objects it loaded, for debuggers, in
//! `_amdgpu_r_debug` (a glibc `r_debug` exported by libhsa-runtime64.so), and each code object
//! is an AMDGPU ELF whose `<kernel>.kd` symbols are the descriptors: runtime address =
//! `l_addr + st_value` (docs/kfd.md, "Kernel names"). This finds the symbol in the files the
//! process maps, walks the list with `process_vm_readv` and reads each code object's symbol
//! table (only the headers and tables, never the code) from the process's memory or its file.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use nix::sys::uio::RemoteIoVec;
use object::elf;
use object::read::{ReadCache, ReadRef as _};

use crate::observe::kfd::sampler::{read_remote, u32_at as le32};
use crate::observe::launch::{
    self, is_gone_io, load_bias, mapped_files, process_gone, FileKey, MappedFile, ProcessGone,
};
use crate::observe::target_file;

/// The kernels of one process: descriptor address (a dispatch packet's `kernel_object`) to
/// name, demangled when it is an Itanium C++ name. Held as the process's code objects, each
/// with its load address and the names of that object, which processes share (a library's
/// code objects are read once and named once for all the processes that load it): the
/// process's own part is one small entry per code object.
#[derive(Clone, Default)]
pub struct KernelNames {
    /// Sorted by `start`.
    objects: Vec<Loaded>,
    /// Code objects whose symbols were read (entries that failed are logged and left out).
    pub code_objects: usize,
}

/// One code object as one process loaded it.
#[derive(Clone)]
struct Loaded {
    /// Its lowest and highest descriptor address there.
    start: u64,
    end: u64,
    l_addr: u64,
    names: Arc<ObjectNames>,
}

impl KernelNames {
    /// The name of the kernel whose descriptor is at `object`.
    pub fn get(&self, object: u64) -> Option<&str> {
        let i = self.objects.partition_point(|o| o.start <= object);
        // Code objects do not overlap in a process; a few candidates back cover one that does.
        self.objects[..i]
            .iter()
            .rev()
            .take(8)
            .filter(|o| object <= o.end)
            .find_map(|o| o.names.get(object.wrapping_sub(o.l_addr)))
    }

    /// Every (descriptor address, name), by code object.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> {
        self.objects.iter().flat_map(|o| {
            o.names
                .kernels
                .iter()
                .map(move |(off, n)| (o.l_addr.wrapping_add(*off), &**n))
        })
    }

    /// How many kernels.
    pub fn len(&self) -> usize {
        self.objects.iter().map(|o| o.names.kernels.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// Names not read from a process (tests, fixed tables): one code object at address 0, charged
/// to no store.
impl From<BTreeMap<u64, String>> for KernelNames {
    fn from(m: BTreeMap<u64, String>) -> Self {
        let kernels: Vec<(u64, String)> = m.into_iter().collect();
        let Some(names) = ObjectNames::new(kernels, Arc::default()) else {
            return Self::default();
        };
        let (start, end) = names.range();
        KernelNames {
            objects: vec![Loaded {
                start,
                end,
                l_addr: 0,
                names: Arc::new(names),
            }],
            code_objects: 1,
        }
    }
}

impl PartialEq for KernelNames {
    fn eq(&self, other: &Self) -> bool {
        self.code_objects == other.code_objects && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for KernelNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The kernels of one code object: descriptor offset (`st_value`) to name, sorted by offset.
/// What it costs is counted in its store while it lives (wherever it is held).
pub struct ObjectNames {
    kernels: Box<[(u64, Box<str>)]>,
    bytes: usize,
    live: Arc<AtomicUsize>,
}

impl ObjectNames {
    /// What `kernels` cost held this way: the names, their index entries, the object itself.
    fn cost(kernels: &[(u64, String)]) -> usize {
        std::mem::size_of::<Self>()
            + kernels
                .iter()
                .map(|(_, n)| n.len() + std::mem::size_of::<(u64, Box<str>)>())
                .sum::<usize>()
    }

    /// None for no kernels. Charges `live` (uncharged on drop).
    fn new(mut kernels: Vec<(u64, String)>, live: Arc<AtomicUsize>) -> Option<Self> {
        if kernels.is_empty() {
            return None;
        }
        kernels.sort_by_key(|(off, _)| *off);
        // One name per descriptor: the first listed, as a loader would resolve it.
        kernels.dedup_by_key(|(off, _)| *off);
        let bytes = Self::cost(&kernels);
        live.fetch_add(bytes, Ordering::SeqCst);
        Some(ObjectNames {
            kernels: kernels
                .into_iter()
                .map(|(o, n)| (o, n.into_boxed_str()))
                .collect(),
            bytes,
            live,
        })
    }

    fn get(&self, offset: u64) -> Option<&str> {
        let i = self
            .kernels
            .binary_search_by_key(&offset, |(o, _)| *o)
            .ok()?;
        Some(&self.kernels[i].1)
    }

    /// Lowest and highest offset (there is at least one kernel).
    fn range(&self) -> (u64, u64) {
        let first = self.kernels.first().map_or(0, |k| k.0);
        let last = self.kernels.last().map_or(0, |k| k.0);
        (first, last)
    }
}

impl Drop for ObjectNames {
    fn drop(&mut self) {
        self.live.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// What all processes' kernel names may use together: every code object's names counted once,
/// however many processes hold them. Past it, least recently used code objects nobody holds are
/// dropped; what still does not fit stays unnamed (with that reason).
pub const NAMES_BUDGET: usize = 64 << 20;
/// File code objects whose names are kept for reuse, at most.
pub const CACHE_OBJECTS: usize = 4096;

/// A code object in a file, by the file's identity (a rewritten file is read again) and where
/// the object is in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ObjectKey {
    file: FileKey,
    size: u64,
    offset: u64,
    len: u64,
}

/// The names of code objects, shared across processes, within a memory budget.
pub struct NameStore {
    budget: usize,
    live: Arc<AtomicUsize>,
    /// Code objects in files, with when each was last used, and the clock of that.
    cache: Mutex<(Cached, u64)>,
}

type Cached = HashMap<ObjectKey, (Arc<ObjectNames>, u64)>;

impl NameStore {
    pub fn new(budget: usize) -> Self {
        NameStore {
            budget,
            live: Arc::default(),
            cache: Mutex::default(),
        }
    }

    /// The one every reader of this process uses ([`NAMES_BUDGET`]).
    pub fn global() -> &'static NameStore {
        static STORE: OnceLock<NameStore> = OnceLock::new();
        STORE.get_or_init(|| NameStore::new(NAMES_BUDGET))
    }

    /// Bytes of names alive now (held by the store or any process).
    pub fn live_bytes(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// File code objects kept for reuse.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    fn lookup(&self, key: &ObjectKey) -> Option<Arc<ObjectNames>> {
        let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (map, tick) = &mut *guard;
        *tick += 1;
        let hit = map.get_mut(key)?;
        hit.1 = *tick;
        Some(hit.0.clone())
    }

    /// Keeps `kernels` (None when there are none), making room by dropping least recently used
    /// code objects that only the store holds; Err when they do not fit even then.
    fn admit(
        &self,
        kernels: Vec<(u64, String)>,
        key: Option<ObjectKey>,
    ) -> Result<Option<Arc<ObjectNames>>> {
        let cost = ObjectNames::cost(&kernels);
        let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (map, tick) = &mut *guard;
        let must_drop = |map: &Cached| {
            self.live_bytes() + cost > self.budget || (key.is_some() && map.len() >= CACHE_OBJECTS)
        };
        if must_drop(map) {
            let mut idle: Vec<(u64, ObjectKey)> = map
                .iter()
                .filter(|(_, (names, _))| Arc::strong_count(names) == 1)
                .map(|(k, (_, used))| (*used, *k))
                .collect();
            idle.sort_unstable_by_key(|(used, _)| *used);
            for (_, k) in idle {
                if !must_drop(map) {
                    break;
                }
                map.remove(&k);
            }
        }
        if self.live_bytes() + cost > self.budget {
            bail!(
                "its {} kernels' names ({} KiB) do not fit in the {} MiB all processes' kernel \
                 names may use ({} KiB in use by names processes still hold); they stay unnamed",
                kernels.len(),
                cost.div_ceil(1024),
                self.budget >> 20,
                self.live_bytes() >> 10
            );
        }
        let Some(names) = ObjectNames::new(kernels, self.live.clone()).map(Arc::new) else {
            return Ok(None);
        };
        if let Some(key) = key {
            if map.len() < CACHE_OBJECTS {
                *tick += 1;
                map.insert(key, (names.clone(), *tick));
            }
        }
        Ok(Some(names))
    }
}

/// ROCr's list head (`runtime/hsa-runtime/loader/executable.cpp`).
pub const R_DEBUG_SYMBOL: &str = "_amdgpu_r_debug";

/// Bounds on what a (possibly hostile or half-updated) process can make us read.
const MAX_ENTRIES: usize = 4096;
const MAX_URI: usize = 4096;
/// Per code object, and for all the bytes one call reads.
const MAX_OBJECT_BYTES: u64 = 256 << 20;
const READ_BUDGET: u64 = 256 << 20;
/// Kernels named by one call, at most (past it the rest are left unnamed), and the length of one
/// name (a longer one is cut, ending in `…`): a hostile code object cannot make the names cost
/// more than about 64 MiB.
pub const MAX_KERNELS: usize = 65_536;
pub const MAX_NAME_BYTES: usize = 1024;
/// How long one call may spend reading code objects (checked at every read; an open has its
/// own bound, [`target_file::OPEN_TIMEOUT`]). What is left is skipped with this reason.
pub const READ_TIME: Duration = Duration::from_secs(2);

/// What one call may still spend.
struct Limits {
    bytes: Cell<u64>,
    kernels: Cell<usize>,
    /// The kernel bound cut a code object's names short (they are then not shared).
    cut: Cell<bool>,
    deadline: Instant,
}

impl Limits {
    fn new() -> Self {
        Limits {
            bytes: Cell::new(READ_BUDGET),
            kernels: Cell::new(MAX_KERNELS),
            cut: Cell::new(false),
            deadline: Instant::now() + READ_TIME,
        }
    }
}

/// glibc `struct r_debug` / `struct link_map` on 64-bit targets (`<link.h>`): field offsets.
mod layout {
    pub const R_DEBUG_SIZE: usize = 40;
    pub const R_VERSION: usize = 0;
    pub const R_MAP: usize = 8;
    pub const R_STATE: usize = 24;
    pub const LINK_MAP_SIZE: usize = 40;
    pub const L_ADDR: usize = 0;
    pub const L_NAME: usize = 8;
    pub const L_NEXT: usize = 24;
    /// `r_state`: no change in progress.
    pub const RT_CONSISTENT: u32 = 0;
}

/// Kernel names of `pid` from ROCr's loader list; Err with the reason (no `_amdgpu_r_debug` in
/// its mappings: not a ROCr process / the list is empty / unreadable memory / a code object that
/// is not ELF ...). [`launch::is_gone`] is true of the error when the process exited.
///
/// Cost: `/proc/PID/maps` and a stat per executable mapped file (their symbol lookups are cached
/// per file for the life of the process), then a few small remote reads per code object. When the
/// `r_debug` address is already known (RUNTIME_ENABLE's argument), [`read_kernel_names_at`]
/// skips the file part.
pub fn read_kernel_names(proc_root: &Path, pid: u32) -> Result<KernelNames> {
    let r_debug = find_r_debug(proc_root, pid)?;
    read_kernel_names_at(proc_root, pid, r_debug)
}

/// Where `_amdgpu_r_debug` is in `pid`'s address space: looked up in the symbol tables of the
/// ELF files it maps executable (libhsa-runtime first), opened through `/proc/PID/root` so a
/// container's files resolve.
pub fn find_r_debug(proc_root: &Path, pid: u32) -> Result<u64> {
    let dir = proc_root.join(pid.to_string());
    let maps = match std::fs::read_to_string(dir.join("maps")) {
        Ok(m) => m,
        Err(e) if is_gone_io(&e) => return Err(ProcessGone { pid }.into()),
        Err(e) => return Err(e).with_context(|| format!("reading {}/maps", dir.display())),
    };
    let mut files: Vec<MappedFile> = mapped_files(&maps)
        .into_iter()
        .filter(|f| f.executable && !f.deleted)
        .collect();
    if files.is_empty() && process_gone(proc_root, pid) {
        return Err(ProcessGone { pid }.into());
    }
    // ROCr's own library first: in a ROCr process the search usually ends there.
    files.sort_by_key(|f| !f.path.contains("libhsa-runtime"));
    for f in &files {
        let Some(found) = r_debug_in_file(proc_root, pid, Path::new(&f.path)) else {
            continue;
        };
        let bias = found
            .first_load
            .and_then(|first| load_bias(f, first))
            .with_context(|| {
                format!(
                    "pid {pid}: {} defines {R_DEBUG_SYMBOL} but its mapping at {:#x} does not \
                     match its first loadable segment",
                    f.path, f.start
                )
            })?;
        return Ok(bias.wrapping_add(found.value));
    }
    if process_gone(proc_root, pid) {
        return Err(ProcessGone { pid }.into());
    }
    bail!(
        "pid {pid}: none of its {} mapped executable files defines {R_DEBUG_SYMBOL}: not a ROCr \
         (HSA runtime) process, or libhsa-runtime64 is not loaded yet",
        files.len()
    )
}

/// `_amdgpu_r_debug` in one file: its link-time address and the first loadable segment.
#[derive(Clone, Copy, Debug)]
struct FileRDebug {
    value: u64,
    first_load: Option<(u64, u64)>,
}

/// Per-file answers, by identity: processes share libhsa-runtime64.so, and a file without the
/// symbol is not scanned again.
fn r_debug_cache() -> &'static Mutex<HashMap<FileKey, Option<FileRDebug>>> {
    static CACHE: OnceLock<Mutex<HashMap<FileKey, Option<FileRDebug>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn r_debug_in_file(proc_root: &Path, pid: u32, path: &Path) -> Option<FileRDebug> {
    let file = target_file::open(proc_root, pid, path)
        .map_err(|e| log::debug!("codeobj: pid {pid}: cannot open {}: {e:#}", path.display()))
        .ok()?;
    let key = FileKey::of(
        &file
            .metadata()
            .map_err(|e| log::debug!("codeobj: cannot stat {}: {e}", path.display()))
            .ok()?,
    );
    if let Some(hit) = r_debug_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return *hit;
    }
    let cache = ReadCache::new(file);
    let found = match launch::scan_symbols(&cache, &mut |name, st_type| {
        (st_type == elf::STT_OBJECT && name == R_DEBUG_SYMBOL.as_bytes()).then_some(())
    }) {
        Ok(scan) => scan.symbols.first().map(|s| FileRDebug {
            value: s.value,
            first_load: scan.first_load,
        }),
        Err(e) => {
            log::debug!("codeobj: skipping {}: {e}", path.display());
            None
        }
    };
    let mut cache = r_debug_cache().lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= launch::CACHE_MAX {
        cache.clear();
    }
    cache.insert(key, found);
    found
}

/// [`read_kernel_names`] with the `r_debug` address known.
pub fn read_kernel_names_at(proc_root: &Path, pid: u32, r_debug: u64) -> Result<KernelNames> {
    read_kernel_names_in(NameStore::global(), proc_root, pid, r_debug)
}

/// [`read_kernel_names_at`] with names kept in `store`.
pub fn read_kernel_names_in(
    store: &NameStore,
    proc_root: &Path,
    pid: u32,
    r_debug: u64,
) -> Result<KernelNames> {
    let entries = read_list(pid, r_debug)?;
    let limits = Limits::new();
    let mut names = KernelNames::default();
    let mut failures = Vec::new();
    for (i, (l_addr, uri)) in entries.iter().enumerate() {
        if Instant::now() > limits.deadline {
            log::debug!(
                "pid {pid}: {} code objects left unread: over the {} s time bound of one call",
                entries.len() - i,
                READ_TIME.as_secs()
            );
            failures.push(format!(
                "over the {} s time bound of one call",
                READ_TIME.as_secs()
            ));
            break;
        }
        match object_kernels(store, proc_root, pid, uri, &limits) {
            Ok(kernels) => {
                names.code_objects += 1;
                if let Some(k) = kernels {
                    let (first, last) = k.range();
                    names.objects.push(Loaded {
                        start: l_addr.wrapping_add(first),
                        end: l_addr.wrapping_add(last),
                        l_addr: *l_addr,
                        names: k,
                    });
                }
            }
            Err(e) => {
                log::debug!("pid {pid}: code object {uri}: {e:#}");
                failures.push(format!("{uri}: {e:#}"));
            }
        }
    }
    names.objects.sort_by_key(|o| o.start);
    if names.code_objects == 0 {
        let first = failures.first().map_or("", String::as_str);
        bail!(
            "pid {pid}: none of its {} code objects could be read; the first: {first}",
            entries.len()
        );
    }
    Ok(names)
}

/// Exactly `buf.len()` bytes of `pid`'s memory at `addr`.
fn read_exact_remote(pid: u32, addr: u64, buf: &mut [u8], what: &str) -> Result<()> {
    let remote = [RemoteIoVec {
        base: usize::try_from(addr).context("address beyond this machine's pointers")?,
        len: buf.len(),
    }];
    let n = read_remote(pid, &remote, buf)
        .map_err(|e| anyhow!("unreadable memory at {addr:#x} ({what}): {e}"))?;
    ensure!(
        n == buf.len(),
        "unreadable memory at {addr:#x} ({what}): {n} of {} bytes",
        buf.len()
    );
    Ok(())
}

fn le64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn read_r_debug(pid: u32, r_debug: u64) -> Result<[u8; layout::R_DEBUG_SIZE]> {
    let mut b = [0u8; layout::R_DEBUG_SIZE];
    read_exact_remote(pid, r_debug, &mut b, R_DEBUG_SYMBOL)?;
    Ok(b)
}

/// The list's entries as (l_addr, URI), bounded and cycle-safe.
fn read_list(pid: u32, r_debug: u64) -> Result<Vec<(u64, String)>> {
    let head = read_r_debug(pid, r_debug)?;
    let version = le32(&head, layout::R_VERSION);
    ensure!(
        version != 0,
        "pid {pid}: {R_DEBUG_SYMBOL}.r_version is 0: ROCr has not initialised its loader yet"
    );
    let state = le32(&head, layout::R_STATE);
    ensure!(
        state == layout::RT_CONSISTENT,
        "pid {pid}: ROCr is changing its code object list (r_state {state}); read it again later"
    );
    let mut node = le64(&head, layout::R_MAP);
    ensure!(
        node != 0,
        "pid {pid}: ROCr's code object list is empty (no code object loaded yet)"
    );
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while node != 0 {
        ensure!(
            seen.insert(node),
            "pid {pid}: the code object list loops back to its entry at {node:#x} after {} \
             entries",
            out.len()
        );
        ensure!(
            out.len() < MAX_ENTRIES,
            "pid {pid}: the code object list has more than {MAX_ENTRIES} entries"
        );
        let mut entry = [0u8; layout::LINK_MAP_SIZE];
        read_exact_remote(pid, node, &mut entry, "link_map entry")?;
        let uri = read_c_string(pid, le64(&entry, layout::L_NAME))?;
        out.push((le64(&entry, layout::L_ADDR), uri));
        node = le64(&entry, layout::L_NEXT);
    }
    // A loader that started a change while we walked may have handed us a torn list.
    let after = le32(&read_r_debug(pid, r_debug)?, layout::R_STATE);
    ensure!(
        after == layout::RT_CONSISTENT,
        "pid {pid}: ROCr changed its code object list while it was read (r_state {after}); read \
         it again later"
    );
    Ok(out)
}

/// A NUL-terminated string of at most [`MAX_URI`] bytes, read a page at a time so a string that
/// ends just before an unmapped page is still read.
fn read_c_string(pid: u32, addr: u64) -> Result<String> {
    ensure!(
        addr != 0,
        "a link_map entry without a name (l_name is NULL)"
    );
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < MAX_URI {
        let to_page_end = 4096 - (at % 4096) as usize;
        let mut chunk = vec![0u8; to_page_end.min(MAX_URI - out.len())];
        read_exact_remote(pid, at, &mut chunk, "code object URI")?;
        if let Some(end) = chunk.iter().position(|&c| c == 0) {
            out.extend_from_slice(&chunk[..end]);
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&chunk);
        at = at
            .checked_add(chunk.len() as u64)
            .context("a code object URI at the top of the address space")?;
    }
    bail!("the code object URI at {addr:#x} is longer than {MAX_URI} bytes")
}

/// Where a code object's bytes are, from its URI.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Location {
    /// `memory://PID#offset=ADDR&size=N`: in the process's memory. The PID is the one in the
    /// process's own pid namespace, so it is not compared with ours.
    Memory { address: u64, size: u64 },
    /// `file://PATH[#offset=N&size=M]`: in a file, as the process sees it; no size: to the end.
    File {
        path: PathBuf,
        offset: u64,
        size: Option<u64>,
    },
}

/// Parses ROCr's code object URIs (`amd_hsa_loader.cpp`; rocgdb's `solib-rocm.c` reads them the
/// same way): scheme (any case) `://` path, then `#` or `?` and `&`-separated `key=value`
/// parameters. File paths are percent-encoded; numbers are decimal or `0x` hex.
fn parse_uri(uri: &str) -> Result<Location> {
    let (scheme, rest) = uri
        .split_once("://")
        .with_context(|| format!("not a code object URI (no scheme): {uri:?}"))?;
    let (path, query) = match rest.find(['#', '?']) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let mut offset = None;
    let mut size = None;
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let slot = match key {
            "offset" => &mut offset,
            "size" => &mut size,
            _ => continue,
        };
        *slot =
            Some(parse_number(value).with_context(|| format!("bad {key} {value:?} in {uri:?}"))?);
    }
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => {
            ensure!(
                !path.is_empty() && path.bytes().all(|b| b.is_ascii_digit()),
                "no pid in {uri:?}"
            );
            let address = offset.with_context(|| format!("no offset in {uri:?}"))?;
            let size = size
                .filter(|&s| s > 0)
                .with_context(|| format!("no size in {uri:?}"))?;
            Ok(Location::Memory { address, size })
        }
        "file" => {
            let path = PathBuf::from(OsString::from_vec(percent_decode(path)));
            ensure!(path.is_absolute(), "not an absolute path in {uri:?}");
            Ok(Location::File {
                path,
                offset: offset.unwrap_or(0),
                size: size.filter(|&s| s > 0),
            })
        }
        other => bail!("unsupported code object URI scheme {other:?} in {uri:?}"),
    }
}

fn parse_number(v: &str) -> Result<u64> {
    Ok(
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16)?,
            None => v.parse()?,
        },
    )
}

/// `%XX` to the byte; anything else as it is (as rocgdb does with a stray `%`).
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// A code object's bytes, read on demand (the ELF reader asks only for the ranges it parses),
/// within the call's byte budget.
struct Source<'a> {
    from: Origin,
    base: u64,
    len: u64,
    pos: u64,
    limits: &'a Limits,
}

enum Origin {
    Memory(u32),
    File(File),
}

impl Read for Source<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.len.saturating_sub(self.pos));
        if want == 0 {
            return Ok(0);
        }
        let left = self.limits.bytes.get();
        if left < want {
            return Err(io::Error::other(format!(
                "over the {} MiB read bound of one call",
                READ_BUDGET >> 20
            )));
        }
        if Instant::now() > self.limits.deadline {
            return Err(io::Error::other(format!(
                "over the {} s time bound of one call",
                READ_TIME.as_secs()
            )));
        }
        let at = self
            .base
            .checked_add(self.pos)
            .ok_or_else(|| io::Error::other("offset overflows"))?;
        let buf = &mut buf[..want as usize];
        let got = match &self.from {
            Origin::Memory(pid) => {
                let base = usize::try_from(at).map_err(io::Error::other)?;
                read_remote(
                    *pid,
                    &[RemoteIoVec {
                        base,
                        len: buf.len(),
                    }],
                    buf,
                )
                .map_err(io::Error::from)?
            }
            Origin::File(f) => f.read_at(buf, at)?,
        };
        self.limits.bytes.set(left - got as u64);
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Source<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

/// The `.kd` symbols of one code object: descriptor offset (`st_value`) to name, from the store
/// when a process read that file's object before (None: it has no kernels).
fn object_kernels(
    store: &NameStore,
    proc_root: &Path,
    pid: u32,
    uri: &str,
    limits: &Limits,
) -> Result<Option<Arc<ObjectNames>>> {
    let (from, base, len, key) = match parse_uri(uri)? {
        Location::Memory { address, size } => (Origin::Memory(pid), address, size, None),
        Location::File { path, offset, size } => {
            // Opened even when its names are known: that this process may read it is checked
            // each time, and the file's identity says whether they are still its names.
            let file = target_file::open(proc_root, pid, &path)?;
            let meta = file.metadata()?;
            let file_len = meta.len();
            let rest = file_len.checked_sub(offset).with_context(|| {
                format!(
                    "offset {offset} is past the end of {} ({file_len} bytes)",
                    path.display()
                )
            })?;
            let len = size.unwrap_or(rest).min(rest);
            let key = ObjectKey {
                file: FileKey::of(&meta),
                size: file_len,
                offset,
                len,
            };
            if let Some(hit) = store.lookup(&key) {
                return Ok(Some(hit));
            }
            (Origin::File(file), offset, len, Some(key))
        }
    };
    ensure!(
        len <= MAX_OBJECT_BYTES,
        "skipped: {len} bytes is over the {} MiB bound per code object",
        MAX_OBJECT_BYTES >> 20
    );
    let cache = ReadCache::new(Source {
        from,
        base,
        len,
        pos: 0,
        limits,
    });
    check_header(&cache, len)?;
    let scan = launch::scan_symbols(&cache, &mut |name, st_type| {
        if st_type != elf::STT_OBJECT {
            return None;
        }
        let name = name.strip_suffix(b".kd")?;
        let left = limits.kernels.get();
        if left == 0 {
            limits.cut.set(true);
            return None;
        }
        limits.kernels.set(left - 1);
        Some(display_name(name))
    })
    .context("reading its symbol table")?;
    let kernels = scan
        .symbols
        .into_iter()
        .map(|s| (s.value, s.pick))
        .collect();
    // Names cut short by this call's bound are this process's alone.
    store.admit(kernels, key.filter(|_| !limits.cut.get()))
}

/// Clear reasons for the common ways a code object is not one: unreadable, short, not ELF, not
/// 64-bit little-endian, not AMDGPU.
fn check_header(cache: &ReadCache<Source<'_>>, len: u64) -> Result<()> {
    const EHDR: u64 = 64;
    ensure!(
        len >= EHDR,
        "{len} bytes is too short for an ELF header (truncated)"
    );
    let h = cache.read_bytes_at(0, EHDR).map_err(|()| {
        anyhow!("its first {EHDR} bytes are unreadable (freed or unmapped memory?)")
    })?;
    ensure!(
        h[..4] == elf::ELFMAG,
        "not an ELF file (starts with {:02x?})",
        &h[..4]
    );
    ensure!(
        h[launch::EI_CLASS] == elf::ELFCLASS64 && h[launch::EI_DATA] == elf::ELFDATA2LSB,
        "not a 64-bit little-endian ELF file"
    );
    let machine = u16::from_le_bytes([h[18], h[19]]);
    ensure!(
        machine == elf::EM_AMDGPU,
        "not an AMDGPU code object (e_machine {machine})"
    );
    Ok(())
}

/// A kernel's name: Itanium C++ names (`_Z...`, what HIP emits) demangled, others as they are;
/// at most [`MAX_NAME_BYTES`] (demangling can make a short symbol's name very long, so the
/// output is cut as it is written, never built whole first).
fn display_name(symbol: &[u8]) -> String {
    if symbol.starts_with(b"_Z") && symbol.len() <= MAX_NAME_BYTES {
        if let Ok(parsed) = cpp_demangle::Symbol::new(symbol) {
            let mut out = Bounded::default();
            let r = parsed.structured_demangle(&mut out, &Default::default());
            if out.cut {
                out.text.push('…');
                return out.text;
            }
            if r.is_ok() {
                return out.text;
            }
        }
    }
    let mut s = String::from_utf8_lossy(symbol).into_owned();
    if s.len() > MAX_NAME_BYTES {
        let mut end = MAX_NAME_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// A writer that keeps [`MAX_NAME_BYTES`] and then fails (which ends the demangler's walk).
#[derive(Default)]
struct Bounded {
    text: String,
    cut: bool,
}

impl std::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = MAX_NAME_BYTES.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        self.cut = true;
        Err(std::fmt::Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpreempt_sim::codeobj::{build_image, LinkMap, LoadedCodeObject, RDebug, RT_ADD};
    use std::ffi::CString;

    /// Tests that publish in this process's `_amdgpu_r_debug` take turns: a publish in progress
    /// (r_state RT_ADD) would fail another test's read.
    static GLOBAL_LIST: Mutex<()> = Mutex::new(());

    fn me() -> u32 {
        std::process::id()
    }

    fn proc_root() -> &'static Path {
        Path::new("/proc")
    }

    fn memory_uri(bytes: &[u8]) -> String {
        format!(
            "memory://{}#offset={:#x}&size={}",
            me(),
            bytes.as_ptr() as u64,
            bytes.len()
        )
    }

    /// ROCr's `EncodePathname`, for the tests' file URIs.
    fn file_uri(path: &Path) -> String {
        let mut out = String::from("file://");
        for &c in path.as_os_str().as_encoded_bytes() {
            if c.is_ascii_alphanumeric() || b"/-_.~".contains(&c) {
                out.push(c as char);
            } else {
                out.push_str(&format!("%{c:02X}"));
            }
        }
        out
    }

    /// A loader list in this process's memory (not the exported one), linked in order. The
    /// node vector is never grown after linking, so the addresses stay put.
    struct LocalList {
        head: Box<RDebug>,
        nodes: Vec<LinkMap>,
        _names: Vec<CString>,
    }

    impl LocalList {
        fn new(entries: &[(u64, &str)]) -> Self {
            let names: Vec<CString> = entries
                .iter()
                .map(|(_, uri)| CString::new(*uri).unwrap())
                .collect();
            let mut nodes: Vec<LinkMap> = entries
                .iter()
                .zip(&names)
                .map(|((l_addr, _), name)| LinkMap {
                    l_addr: *l_addr,
                    l_name: name.as_ptr() as u64,
                    ..LinkMap::default()
                })
                .collect();
            let addrs: Vec<u64> = nodes.iter().map(|n| n as *const LinkMap as u64).collect();
            for i in 1..nodes.len() {
                nodes[i].l_prev = addrs[i - 1];
                nodes[i - 1].l_next = addrs[i];
            }
            let head = Box::new(RDebug {
                r_version: 1,
                r_map: addrs.first().copied().unwrap_or(0),
                ..RDebug::default()
            });
            LocalList {
                head,
                nodes,
                _names: names,
            }
        }

        fn addr(&self) -> u64 {
            &*self.head as *const RDebug as u64
        }

        fn read(&self) -> Result<KernelNames> {
            read_kernel_names_at(proc_root(), me(), self.addr())
        }
    }

    fn err_of(r: Result<KernelNames>) -> String {
        format!("{:#}", r.expect_err("an error"))
    }

    #[test]
    fn resolves_this_process_through_the_exported_symbol() {
        let _turn = GLOBAL_LIST.lock().unwrap_or_else(|e| e.into_inner());
        let co = LoadedCodeObject::load(&["_Z6squarePfi", "void gemm<float, 64>(float const*)"])
            .unwrap();
        assert_eq!(
            find_r_debug(proc_root(), me()).unwrap(),
            gpreempt_sim::codeobj::r_debug_address()
        );
        let names = read_kernel_names(proc_root(), me()).unwrap();
        assert!(names.code_objects >= 1);
        let name_of = |k: &str| names.get(co.kernel_object(k).unwrap()).map(str::to_owned);
        assert_eq!(
            name_of("_Z6squarePfi").as_deref(),
            Some("square(float*, int)")
        );
        assert_eq!(
            name_of("void gemm<float, 64>(float const*)").as_deref(),
            Some("void gemm<float, 64>(float const*)")
        );
        // The answer for the test binary is cached: a second lookup finds the same address.
        assert_eq!(
            find_r_debug(proc_root(), me()).unwrap(),
            gpreempt_sim::codeobj::r_debug_address()
        );
    }

    /// The emulator's workloads: every dispatch's kernel_object names its timeline entry.
    #[test]
    fn workload_profiles_resolve_to_their_timeline_names() {
        let _turn = GLOBAL_LIST.lock().unwrap_or_else(|e| e.into_inner());
        for (profile, p) in gpreempt_sim::workload::profiles().unwrap() {
            let loaded = gpreempt_sim::workload::load_kernels(&p).unwrap();
            let names = read_kernel_names(proc_root(), me()).unwrap();
            for (k, object) in p.kernels.iter().zip(&loaded.objects) {
                assert_eq!(names.get(*object), Some(k.name.as_str()), "{profile}");
            }
            let distinct: HashSet<&str> = p.kernels.iter().map(|k| k.name.as_str()).collect();
            let mine: HashSet<u64> = loaded.objects.iter().copied().collect();
            assert_eq!(
                mine.len(),
                distinct.len(),
                "{profile}: one descriptor per kernel"
            );
        }
    }

    #[test]
    fn finds_the_symbol_through_a_fake_proc_tree_with_the_right_bias() {
        // Next to the test binary, so that it can be hard-linked into the fake root (a link
        // out of it would not resolve: files are opened inside the process's root).
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let root = exe
            .parent()
            .unwrap()
            .join(format!("gpreempt-codeobj-{}", me()));
        let _ = std::fs::remove_dir_all(&root);
        let pid = 4242;
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("root/app")).unwrap();
        std::fs::create_dir_all(dir.join("root/lib")).unwrap();
        std::fs::hard_link(&exe, dir.join("root/app/exe")).unwrap();
        std::fs::write(
            dir.join("status"),
            crate::observe::target_file::own_status(),
        )
        .unwrap();
        std::fs::write(dir.join("root/lib/notelf.so"), b"#!/bin/sh\n").unwrap();
        std::fs::write(dir.join("root/lib/co.so"), build_image(&["k"]).elf).unwrap();
        std::fs::write(dir.join("stat"), "4242 (app) S 1 4242 4242 0 -1\n").unwrap();

        // Not a ROCr process: nothing it maps defines the symbol.
        std::fs::write(
            dir.join("maps"),
            "1000-2000 r-xp 00000000 fd:01 2 /lib/notelf.so\n\
             3000-4000 r-xp 00000000 fd:01 3 /lib/co.so\n\
             5000-6000 r--p 00000000 fd:01 4 /app/exe\n",
        )
        .unwrap();
        let err = format!("{:#}", find_r_debug(&root, pid).unwrap_err());
        assert!(
            err.contains("none of its 2 mapped executable files"),
            "{err}"
        );
        assert!(err.contains("not a ROCr"), "{err}");

        // The test binary mapped somewhere else: same symbol, shifted by the difference.
        let real_maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let real = mapped_files(&real_maps)
            .into_iter()
            .find(|f| Path::new(&f.path) == exe)
            .unwrap();
        let fake_start = 0x5500_0000_0000u64;
        std::fs::write(
            dir.join("maps"),
            format!(
                "1000-2000 r-xp 00000000 fd:01 2 /lib/notelf.so\n\
                 {fake_start:x}-{:x} r-xp {:08x} fd:01 4 /app/exe\n",
                fake_start + 0x1000,
                real.offset
            ),
        )
        .unwrap();
        let fake = find_r_debug(&root, pid).unwrap();
        let own = find_r_debug(proc_root(), me()).unwrap();
        assert_eq!(fake - fake_start, own - real.start);

        // Gone: no maps.
        assert!(launch::is_gone(&find_r_debug(&root, 4243).unwrap_err()));
        assert!(launch::is_gone(
            &read_kernel_names(&root, 4243).unwrap_err()
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn file_uris_with_offsets_percent_encoding_and_whole_files() {
        let dir = std::env::temp_dir().join(format!("gpreempt-codeobj-files-{}", me()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("fat binaries")).unwrap();
        // Embedded at an offset, as in a HIP fat binary, under a name that needs encoding.
        let embedded = build_image(&["_Z3fooi", "bar"]);
        let fat = dir.join("fat binaries/lib x%1.so");
        let mut bytes = vec![0xAAu8; 100];
        bytes.extend_from_slice(&embedded.elf);
        bytes.extend_from_slice(&[0x55; 50]);
        std::fs::write(&fat, &bytes).unwrap();
        let whole = build_image(&["baz"]);
        let whole_path = dir.join("whole.co");
        std::fs::write(&whole_path, &whole.elf).unwrap();

        let uri = format!("{}#offset=100&size={}", file_uri(&fat), embedded.elf.len());
        assert!(uri.contains("fat%20binaries/lib%20x%251.so"), "{uri}");
        let list = LocalList::new(&[(0x7000_0000, &uri), (0x7100_0000, &file_uri(&whole_path))]);
        let names = list.read().unwrap();
        assert_eq!(names.code_objects, 2);
        let expect: BTreeMap<u64, String> = [
            (0x7000_0100, "foo(int)"),
            (0x7000_0140, "bar"),
            (0x7100_0100, "baz"),
        ]
        .into_iter()
        .map(|(a, n)| (a, n.to_string()))
        .collect();
        let got: BTreeMap<u64, String> = names.iter().map(|(a, n)| (a, n.to_owned())).collect();
        assert_eq!(got, expect);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn list_errors_are_clear() {
        let image = build_image(&["k"]);
        let uri = memory_uri(&image.elf);

        let mut list = LocalList::new(&[(0, &uri)]);
        assert_eq!(list.read().unwrap().len(), 1);

        list.head.r_version = 0;
        assert!(err_of(list.read()).contains("r_version is 0"));
        list.head.r_version = 1;
        list.head.r_state = RT_ADD;
        assert!(err_of(list.read()).contains("changing its code object list"));
        list.head.r_state = 0;

        let empty = LocalList::new(&[]);
        assert!(err_of(empty.read()).contains("list is empty"));

        let mut cycle = LocalList::new(&[(0, &uri), (0, &uri)]);
        let first = &cycle.nodes[0] as *const LinkMap as u64;
        cycle.nodes[1].l_next = first;
        let e = err_of(cycle.read());
        assert!(
            e.contains("loops back") && e.contains("after 2 entries"),
            "{e}"
        );

        let mut nameless = LocalList::new(&[(0, &uri)]);
        nameless.nodes[0].l_name = 0;
        assert!(err_of(nameless.read()).contains("without a name"));

        let long = CString::new(vec![b'a'; MAX_URI + 10]).unwrap();
        let mut unterminated = LocalList::new(&[(0, &uri)]);
        unterminated.nodes[0].l_name = long.as_ptr() as u64;
        assert!(err_of(unterminated.read()).contains("longer than 4096 bytes"));

        let e = err_of(read_kernel_names_at(proc_root(), me(), 8));
        assert!(e.contains("unreadable memory at 0x8"), "{e}");
        let mut dangling = LocalList::new(&[(0, &uri)]);
        dangling.nodes[0].l_next = 0x18;
        assert!(err_of(dangling.read()).contains("unreadable memory at 0x18"));
    }

    #[test]
    fn code_object_errors_are_clear() {
        let image = build_image(&["k"]).elf;
        let one = |uri: &str| err_of(LocalList::new(&[(0, uri)]).read());

        let e = one(&format!(
            "memory://{}#offset={:#x}&size=100",
            me(),
            image.as_ptr() as u64
        ));
        assert!(e.contains("none of its 1 code objects"), "{e}");
        assert!(e.contains("reading its symbol table"), "{e}");
        let e = one(&format!(
            "memory://{}#offset={:#x}&size=20",
            me(),
            image.as_ptr() as u64
        ));
        assert!(e.contains("too short for an ELF header"), "{e}");

        let text = vec![b'x'; 256];
        assert!(one(&memory_uri(&text)).contains("not an ELF file"));
        let mut elf32 = image.clone();
        elf32[4] = 1;
        assert!(one(&memory_uri(&elf32)).contains("64-bit little-endian"));
        let mut x86 = image.clone();
        x86[18] = 62;
        assert!(one(&memory_uri(&x86)).contains("not an AMDGPU code object (e_machine 62)"));
        // Symbol table offsets past the end: the ELF reader's own error, with our context.
        let mut bad_shoff = image.clone();
        bad_shoff[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(one(&memory_uri(&bad_shoff)).contains("reading its symbol table"));

        assert!(one("memory://1#offset=0x10&size=4096").contains("unreadable"));
        assert!(one("memory://1#offset=0x10&size=1073741824").contains("over the 256 MiB bound"));
        assert!(one("file:///nonexistent/gpreempt/x.co").contains("opening"));

        for (uri, reason) in [
            ("nonsense", "no scheme"),
            (
                "http://host/x.co",
                "unsupported code object URI scheme \"http\"",
            ),
            ("memory://1#offset=zz&size=1", "bad offset \"zz\""),
            ("memory://1#offset=0x10", "no size"),
            ("memory://#offset=0x10&size=1", "no pid"),
            ("file://relative/x.co", "not an absolute path"),
        ] {
            let e = one(uri);
            assert!(e.contains(reason), "{uri}: {e}");
        }

        // One bad object among good ones costs only itself.
        let list = LocalList::new(&[(0x1000, "nonsense"), (0x2000, &memory_uri(&image))]);
        let names = list.read().unwrap();
        assert_eq!(names.code_objects, 1);
        assert_eq!(names.get(0x2100), Some("k"));
    }

    /// A code object URI naming a FIFO nobody writes: refused at once (the reader used to wait
    /// for a writer forever, and `queues` with it).
    #[test]
    fn a_fifo_uri_is_refused_without_waiting() {
        let dir = std::env::temp_dir().join(format!("gpreempt-codeobj-fifo-{}", me()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("co.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let uri = file_uri(&fifo);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(err_of(LocalList::new(&[(0x1000, &uri)]).read()));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(5)) {
            Ok(e) => assert!(e.contains("not a regular file (a FIFO)"), "{e}"),
            Err(_) => {
                // Let the stuck reader go before failing.
                let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
                panic!("reading a FIFO's code object blocked for 5 s");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A code object URI naming a pty, read by a session leader without a controlling terminal
    /// (as a daemon is): refused, and the pty does not become the reader's terminal. Runs this
    /// test again in a new session (setsid), which does the work.
    #[test]
    fn a_pty_uri_never_becomes_the_controlling_terminal() {
        const NAME: &str =
            "observe::kfd::codeobj::tests::a_pty_uri_never_becomes_the_controlling_terminal";
        let tty_nr = || {
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
            let after = &stat[stat.rfind(')').unwrap() + 1..];
            // state ppid pgrp session tty_nr
            after
                .split_whitespace()
                .nth(4)
                .unwrap()
                .parse::<i64>()
                .unwrap()
        };
        if std::env::var_os("GPREEMPT_TEST_NEW_SESSION").is_none() {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([NAME, "--exact", "--nocapture", "--test-threads=1"])
                .env("GPREEMPT_TEST_NEW_SESSION", "1");
            // SAFETY: setsid is async-signal-safe and touches nothing of the parent.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    if libc::setsid() < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "{text}");
            assert!(
                text.contains("1 passed"),
                "the child did not run the test: {text}"
            );
            return;
        }
        assert_eq!(tty_nr(), 0, "setsid left a controlling terminal");
        let (_master, pty) = crate::observe::target_file::new_pty();
        let e = err_of(LocalList::new(&[(0x1000, &file_uri(&pty))]).read());
        assert_eq!(
            tty_nr(),
            0,
            "reading {} made it our controlling terminal",
            pty.display()
        );
        assert!(e.contains("not a regular file (a character device)"), "{e}");
    }

    /// Names are bounded: a long symbol is cut, and so is a short one that demangles long.
    #[test]
    fn names_are_bounded() {
        let long = vec![b'k'; MAX_NAME_BYTES * 3];
        let name = display_name(&long);
        assert_eq!(name.len(), MAX_NAME_BYTES + '…'.len_utf8());
        assert!(name.ends_with('…'));
        // Each S_ repeats the whole first parameter's type: output grows much faster than input.
        let mut sym = String::from("_Z1fIN1a1b1c1d1e1f1g1h1i1j1k1l1m1n1o1p1q1r1s1t1u1v1wEE");
        sym.push_str("vT_");
        for _ in 0..200 {
            sym.push_str("S_");
        }
        let name = display_name(sym.as_bytes());
        assert!(
            name.len() <= MAX_NAME_BYTES + '…'.len_utf8(),
            "{}",
            name.len()
        );
    }

    /// Kernel names stay within their store's budget: a file's code object is read once and
    /// shared by every process that loads it (counted once), least recently used ones no process
    /// holds are dropped to make room, and what does not fit stays unnamed with the reason.
    #[test]
    fn kernel_names_are_shared_and_stay_within_the_budget() {
        let dir = std::env::temp_dir().join(format!("gpreempt-codeobj-budget-{}", me()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 40 code objects of 50 kernels, names of one length: each costs the same.
        let names = |o: usize| -> Vec<String> {
            (0..50)
                .map(|k| format!("k{o:02}_{k:02}_{}", "x".repeat(200)))
                .collect()
        };
        let uris: Vec<String> = (0..40)
            .map(|o| {
                let path = dir.join(format!("co{o}.co"));
                std::fs::write(&path, build_image(&names(o)).elf).unwrap();
                file_uri(&path)
            })
            .collect();
        let one = ObjectNames::cost(&names(0).into_iter().map(|n| (0, n)).collect::<Vec<_>>());
        let store = NameStore::new(10 * one);
        let read = |objects: std::ops::Range<usize>, base: u64| {
            let entries: Vec<(u64, &str)> = objects
                .map(|o| (base + 0x100_0000 * o as u64, uris[o].as_str()))
                .collect();
            let list = LocalList::new(&entries);
            read_kernel_names_in(&store, proc_root(), me(), list.addr())
        };

        let a = read(0..8, 0x1000_0000).unwrap();
        assert_eq!((a.len(), a.code_objects), (400, 8));
        assert_eq!(store.live_bytes(), 8 * one);
        // Another process loading the same files elsewhere shares their names.
        let b = read(0..8, 0x9000_0000).unwrap();
        assert_eq!(b.len(), 400);
        assert_eq!(store.live_bytes(), 8 * one, "shared, not copied");
        assert!(Arc::ptr_eq(&a.objects[3].names, &b.objects[3].names));
        let kd0 = a.objects[3].names.kernels[0].0;
        assert_eq!(
            a.get(0x1000_0000 + 0x300_0000 + kd0),
            b.get(0x9000_0000 + 0x300_0000 + kd0)
        );
        assert!(b
            .get(0x9000_0000 + 0x300_0000 + kd0)
            .unwrap()
            .starts_with("k03_00_"));

        // While those are held, only 2 of 32 more fit; the rest stay unnamed.
        let c = read(8..40, 0x2_0000_0000).unwrap();
        assert_eq!(c.len(), 100);
        assert_eq!(store.live_bytes(), 10 * one);

        // Once the first processes are gone, their idle objects make room, oldest first.
        drop((a, b, c));
        let c = read(8..40, 0x2_0000_0000).unwrap();
        assert_eq!(c.len(), 500);
        assert!(store.live_bytes() <= 10 * one);
        assert!(store.cached() <= 10);
        let err = read(20..21, 0x3_0000_0000).unwrap_err();
        assert!(format!("{err:#}").contains("do not fit in the"), "{err:#}");
        drop(c);
        assert_eq!(
            store.live_bytes(),
            store.cached() * one,
            "the store holds only its cache"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn uri_grammar() {
        assert_eq!(
            parse_uri("memory://1234#offset=0x7f00dead0000&size=5616").unwrap(),
            Location::Memory {
                address: 0x7f00_dead_0000,
                size: 5616
            }
        );
        assert_eq!(
            parse_uri("file:///opt/rocm/lib/lib%20a%25b.so#offset=4096&size=1234").unwrap(),
            Location::File {
                path: "/opt/rocm/lib/lib a%b.so".into(),
                offset: 4096,
                size: Some(1234)
            }
        );
        assert_eq!(
            parse_uri("FILE:///a.co").unwrap(),
            Location::File {
                path: "/a.co".into(),
                offset: 0,
                size: None
            }
        );
        assert_eq!(
            parse_uri("file:///a?offset=0X10&size=16&other=x&flag").unwrap(),
            Location::File {
                path: "/a".into(),
                offset: 16,
                size: Some(16)
            }
        );
        assert_eq!(percent_decode("%zz%4"), b"%zz%4");
        assert_eq!(percent_decode("a%2fb%C3%A9"), "a/bé".as_bytes());
    }

    #[test]
    fn kernel_names_are_demangled() {
        assert_eq!(display_name(b"_Z6squarePfi"), "square(float*, int)");
        assert_eq!(display_name(b"plain_kernel"), "plain_kernel");
        assert_eq!(display_name(b"_Z_not_mangled"), "_Z_not_mangled");
    }
}
