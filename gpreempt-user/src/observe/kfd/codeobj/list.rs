//! Finding ROCr's loader list in a process and walking it: `_amdgpu_r_debug`, its entries and
//! their code-object URIs, read with bounds a hostile process cannot stretch.

use super::*;

/// ROCr's list head (`runtime/hsa-runtime/loader/executable.cpp`).
pub const R_DEBUG_SYMBOL: &str = "_amdgpu_r_debug";

/// glibc `struct r_debug` / `struct link_map` on 64-bit targets (`<link.h>`): field offsets.
pub(super) mod layout {
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
pub(super) struct FileRDebug {
    pub(super) value: u64,
    pub(super) first_load: Option<(u64, u64)>,
}

/// Per-file answers, by identity: processes share libhsa-runtime64.so, and a file without the
/// symbol is not scanned again.
pub(super) fn r_debug_cache() -> &'static Mutex<HashMap<FileKey, Option<FileRDebug>>> {
    static CACHE: OnceLock<Mutex<HashMap<FileKey, Option<FileRDebug>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

pub(super) fn r_debug_in_file(proc_root: &Path, pid: u32, path: &Path) -> Option<FileRDebug> {
    let file = target_file::open(proc_root, pid, path)
        .map_err(|e| {
            static GATE: target_file::WarnGate = target_file::WarnGate::new();
            let name = path.display().to_string();
            target_file::log_failure(&GATE, "kernel names", pid, &name, &e);
        })
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
                static GATE: target_file::WarnGate = target_file::WarnGate::new();
                target_file::log_failure(&GATE, "kernel names", pid, uri, &e);
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
pub(super) fn read_exact_remote(pid: u32, addr: u64, buf: &mut [u8], what: &str) -> Result<()> {
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

pub(super) fn le64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(super) fn read_r_debug(pid: u32, r_debug: u64) -> Result<[u8; layout::R_DEBUG_SIZE]> {
    let mut b = [0u8; layout::R_DEBUG_SIZE];
    read_exact_remote(pid, r_debug, &mut b, R_DEBUG_SYMBOL)?;
    Ok(b)
}

/// The list's entries as (l_addr, URI), bounded and cycle-safe.
pub(super) fn read_list(pid: u32, r_debug: u64) -> Result<Vec<(u64, String)>> {
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
pub(super) fn read_c_string(pid: u32, addr: u64) -> Result<String> {
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
