//! Kernel names for AQL dispatch packets. A packet's `kernel_object` is the address of the
//! kernel's descriptor; ROCr's loader lists the code objects it loaded, for debuggers, in
//! `_amdgpu_r_debug` (a glibc `r_debug` exported by libhsa-runtime64.so), and each code object
//! is an AMDGPU ELF whose `<kernel>.kd` symbols are the descriptors: runtime address =
//! `l_addr + st_value` (docs/kfd.md, "Kernel names"). This finds the symbol in the files the
//! process maps, walks the list with `process_vm_readv` and reads each code object's symbol
//! table (only the headers and tables, never the code) from the process's memory or its file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use nix::sys::uio::RemoteIoVec;
use object::elf;
use object::read::{ReadCache, ReadRef as _};

use crate::observe::kfd::remote::{read_remote, u32_at as le32};
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

mod bounds;
mod list;
mod symbols;
mod uri;

pub use bounds::*;
pub use list::*;
use symbols::*;
use uri::*;

#[cfg(test)]
mod tests;
