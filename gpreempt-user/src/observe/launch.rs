//! `launch`: where to put the launch uprobes of one process.
//!
//! Uprobes attach to a file (inode) at a file offset, not to a process's address. For a pid, this
//! finds the ELF files the process has mapped executable (`/proc/P/maps`), the launch symbols
//! (`gpreempt_common::kprobe::launch::POINTS`) each one defines, and the file offset of each.
//! Files are opened inside the process's root (`/proc/P/root`), so a container's files resolve in
//! its own mount namespace (perf uprobes accept that path too), and with its credentials, a
//! regular file only ([`crate::observe::target_file`]): the path is the process's to choose. Parsed files are cached by identity in a
//! [`LaunchResolver`]: the hundreds of processes sharing one `libamdhip64.so` parse it once.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use gpreempt_common::kprobe::launch::{self, POINTS};
use object::elf;
use object::read::elf::{FileHeader, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, ReadRef};
use object::Endianness;

/// One uprobe to attach: the point's program on `symbol` of the file at `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchTarget {
    /// Launch point id (`gpreempt_common::kprobe::launch::*`).
    pub point: u32,
    /// The eBPF program that handles the point.
    pub program: &'static str,
    /// The symbol found (base name, without an ELF symbol version).
    pub symbol: String,
    /// The file to attach to, as `/proc/P/root/<mapped path>`.
    pub path: PathBuf,
    /// Where the function's first instruction is in the file.
    pub file_offset: u64,
}

pub use super::target_file::ProcessGone;
use super::target_file::{log_failure, WarnGate};

/// Whether `err` (from [`resolve`] or [`LaunchResolver::resolve`]) says the process exited.
pub fn is_gone(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<ProcessGone>())
}

/// Launch targets of `pid`, with a cache that lives only for this call.
pub fn resolve(pid: u32) -> Result<Vec<LaunchTarget>> {
    LaunchResolver::new().resolve(pid)
}

/// [`resolve`] under another proc root (tests use a fake tree).
pub fn resolve_in(proc_root: &Path, pid: u32) -> Result<Vec<LaunchTarget>> {
    LaunchResolver::new().resolve_in(proc_root, pid)
}

/// A launch symbol defined in one file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileSymbol {
    point: u32,
    program: &'static str,
    symbol: String,
    file_offset: u64,
}

/// A file's identity as the cache sees it: an updated file (new mtime) is parsed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FileKey {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileKey {
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// Entries past this are dropped all at once (files are few; this only bounds a long-running
/// daemon's cache as libraries get updated).
pub(crate) const CACHE_MAX: usize = 4096;

/// Resolves launch targets of processes, parsing each distinct file once.
#[derive(Debug, Default)]
pub struct LaunchResolver {
    cache: HashMap<FileKey, Arc<[FileSymbol]>>,
    parsed: u64,
}

impl LaunchResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many files were parsed so far (cache misses).
    pub fn files_parsed(&self) -> u64 {
        self.parsed
    }

    /// Launch targets of `pid`: one per (file, point, offset), in maps order. Errors only when
    /// the process's maps cannot be read; [`is_gone`] is true when the process exited.
    pub fn resolve(&mut self, pid: u32) -> Result<Vec<LaunchTarget>> {
        self.resolve_in(Path::new("/proc"), pid)
    }

    /// [`LaunchResolver::resolve`] under another proc root.
    pub fn resolve_in(&mut self, proc_root: &Path, pid: u32) -> Result<Vec<LaunchTarget>> {
        let dir = proc_root.join(pid.to_string());
        let maps = match std::fs::read_to_string(dir.join("maps")) {
            Ok(m) => m,
            Err(e) if is_gone_io(&e) => return Err(ProcessGone { pid }.into()),
            Err(e) => {
                return Err(e).with_context(|| format!("reading {}", dir.join("maps").display()))
            }
        };
        let files = mapped_files(&maps);
        if files.is_empty() && process_gone(proc_root, pid) {
            // A process that exits between open and read leaves an empty maps file.
            return Err(ProcessGone { pid }.into());
        }
        let root = dir.join("root");
        // A chrooted process's maps name its files as we see them (under its root); inside its
        // root they are the rest of the path.
        let chroot = std::fs::read_link(&root)
            .ok()
            .filter(|r| r.is_absolute() && r != Path::new("/"));
        let mut out = Vec::new();
        for f in files.iter().filter(|f| f.executable) {
            if f.deleted {
                log::debug!("pid {pid}: skipping deleted mapped file {}", f.path);
                continue;
            }
            let inside = in_root(chroot.as_deref(), &f.path);
            let path = root.join(inside.trim_start_matches('/'));
            let Some(symbols) = self.file_symbols(proc_root, pid, Path::new(inside)) else {
                continue;
            };
            out.extend(symbols.iter().map(|s| LaunchTarget {
                point: s.point,
                program: s.program,
                symbol: s.symbol.clone(),
                path: path.clone(),
                file_offset: s.file_offset,
            }));
        }
        // Files that failed to open may have failed because the process exited meanwhile:
        // a partial answer must not pass for a complete one.
        if process_gone(proc_root, pid) {
            return Err(ProcessGone { pid }.into());
        }
        Ok(out)
    }

    /// The launch symbols of the file at `path`, from the cache or parsed; `None` (logged) when
    /// it cannot be opened or is not a usable ELF file.
    fn file_symbols(
        &mut self,
        proc_root: &Path,
        pid: u32,
        path: &Path,
    ) -> Option<Arc<[FileSymbol]>> {
        // Opened as the process would (its root, its credentials, a regular file only): the
        // name is the process's to choose.
        let file = match crate::observe::target_file::open(proc_root, pid, path) {
            Ok(f) => f,
            Err(e) => {
                static GATE: WarnGate = WarnGate::new();
                let name = path.display().to_string();
                log_failure(&GATE, "launch hints", pid, &name, &e);
                return None;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                log::debug!("launch: cannot stat {}: {e}", path.display());
                return None;
            }
        };
        let key = FileKey::of(&meta);
        if let Some(hit) = self.cache.get(&key) {
            return Some(hit.clone());
        }
        self.parsed += 1;
        // Not an ELF file or a malformed one: cached as "nothing here" all the same.
        let symbols: Arc<[FileSymbol]> = match elf_launch_symbols(file) {
            Ok(s) => s.into(),
            Err(e) => {
                log::debug!("launch: skipping {}: {e}", path.display());
                Arc::from(Vec::new())
            }
        };
        if self.cache.len() >= CACHE_MAX {
            self.cache.clear();
        }
        self.cache.insert(key, symbols.clone());
        Some(symbols)
    }
}

pub(crate) fn is_gone_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether the process is gone: no `/proc/P/stat`, or a zombie / dead state.
/// `path` (a mapped file's, as `/proc/P/maps` shows it to us) inside the process's root
/// `chroot` (as `/proc/P/root` reads to us; None: the same as ours, or out of our sight).
fn in_root<'a>(chroot: Option<&Path>, path: &'a str) -> &'a str {
    let Some(r) = chroot.and_then(|r| r.to_str()) else {
        return path;
    };
    match path.strip_prefix(r.trim_end_matches('/')) {
        Some(rest) if rest.starts_with('/') => rest,
        _ => path,
    }
}

pub(crate) fn process_gone(proc_root: &Path, pid: u32) -> bool {
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X' | 'x')),
        Err(e) => is_gone_io(&e),
    }
}

/// One file of `/proc/P/maps`, with all of its mappings merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MappedFile {
    /// `major:minor` as maps prints it (hex), and the inode: the file's identity.
    dev: String,
    inode: u64,
    /// The path as the process sees it, without a " (deleted)" suffix.
    pub(crate) path: String,
    /// Some mapping of it is executable (only those can hold the code uprobes hit).
    pub(crate) executable: bool,
    pub(crate) deleted: bool,
    /// Start address and file offset of its first (lowest) mapping: with the ELF's first
    /// loadable segment they give the load bias ([`load_bias`]).
    pub(crate) start: u64,
    pub(crate) offset: u64,
}

/// File-backed mappings of `/proc/P/maps` text, one per (dev, inode), in first-seen order
/// (maps lists mappings by address, so the first seen is the lowest).
pub(crate) fn mapped_files(maps: &str) -> Vec<MappedFile> {
    let mut out: Vec<MappedFile> = Vec::new();
    let mut index: HashMap<(String, u64), usize> = HashMap::new();
    for line in maps.lines() {
        let mut rest = line;
        let mut fields = [""; 5];
        for f in &mut fields {
            rest = rest.trim_start_matches(' ');
            let end = rest.find(' ').unwrap_or(rest.len());
            *f = &rest[..end];
            rest = &rest[end..];
        }
        let [range, perms, offset, dev, inode] = fields;
        let path = rest.trim_start_matches(' ');
        let Ok(inode) = inode.parse::<u64>() else {
            continue;
        };
        let start = range
            .split('-')
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok());
        let (Some(start), Ok(offset)) = (start, u64::from_str_radix(offset, 16)) else {
            continue;
        };
        if inode == 0 || !path.starts_with('/') {
            continue; // anonymous, [heap], [vdso], ...
        }
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        let executable = perms.as_bytes().get(2) == Some(&b'x');
        match index.get(&(dev.to_string(), inode)) {
            Some(&i) => out[i].executable |= executable,
            None => {
                index.insert((dev.to_string(), inode), out.len());
                out.push(MappedFile {
                    dev: dev.to_string(),
                    inode,
                    path: path.to_string(),
                    executable,
                    deleted,
                    start,
                    offset,
                });
            }
        }
    }
    out
}

/// `e_ident[EI_CLASS]`: 32- or 64-bit.
pub(crate) const EI_CLASS: usize = 4;
/// `e_ident[EI_DATA]`: byte order.
pub(crate) const EI_DATA: usize = 5;

/// The launch symbols an ELF file defines, with their file offsets. Reads only the headers,
/// the symbol tables and their string tables, not the whole (possibly GiB-sized) file.
fn elf_launch_symbols(file: File) -> Result<Vec<FileSymbol>> {
    let cache = ReadCache::new(file);
    let scan = scan_symbols(&cache, &mut |name, st_type| {
        if st_type != elf::STT_FUNC {
            return None;
        }
        // `hipLaunchKernel@@hip_4.2` in tables that carry versions in the name.
        let base = name.split(|&b| b == b'@').next().unwrap_or(name);
        POINTS.iter().find_map(|(point, program, syms)| {
            syms.iter()
                .find(|s| s.as_bytes() == base)
                .map(|s| (*point, *program, *s))
        })
    })?;
    let mut out: Vec<FileSymbol> = Vec::new();
    for found in scan.symbols {
        let (point, program, symbol) = found.pick;
        let Some(file_offset) = found.file_offset else {
            log::debug!(
                "launch: {symbol} at {:#x} is in no section or segment",
                found.value
            );
            continue;
        };
        // The same function in .dynsym and .symtab, or aliases of one point at one address
        // (two probes there would count every launch twice): keep the first.
        if out
            .iter()
            .any(|s| s.point == point && s.file_offset == file_offset)
        {
            continue;
        }
        out.push(FileSymbol {
            point,
            program,
            symbol: symbol.to_string(),
            file_offset,
        });
        // A wait is probed at its entry and its return, at the same address.
        if point == launch::WAIT_ENTER {
            out.push(FileSymbol {
                point: launch::WAIT_RETURN,
                program: program_of(launch::WAIT_RETURN),
                symbol: symbol.to_string(),
                file_offset,
            });
        }
    }
    Ok(out)
}

/// The program of a point in [`POINTS`].
fn program_of(point: u32) -> &'static str {
    POINTS
        .iter()
        .find(|(p, _, _)| *p == point)
        .map_or("", |(_, program, _)| *program)
}

/// A defined symbol that [`scan_symbols`]' selector picked.
pub(crate) struct PickedSymbol<T> {
    /// What the selector returned for it.
    pub(crate) pick: T,
    /// `st_value`: its address in the file's own (link-time) address space.
    pub(crate) value: u64,
    /// Where its bytes are in the file; `None` when no section or segment holds file data for
    /// it (`.bss`, absolute symbols).
    pub(crate) file_offset: Option<u64>,
}

/// What [`scan_symbols`] found in one ELF file.
pub(crate) struct SymbolScan<T> {
    /// In table order: `.dynsym` first, then `.symtab` (a symbol in both comes twice).
    pub(crate) symbols: Vec<PickedSymbol<T>>,
    /// `p_vaddr` and `p_offset` of the first loadable segment (ELF sorts them by address).
    pub(crate) first_load: Option<(u64, u64)>,
}

/// Scans the defined symbols of an ELF file (32- or 64-bit, either byte order) in `.dynsym`
/// and `.symtab`; `select(name, st_type)` picks the ones to return. Reads only the headers, the
/// symbol tables and their string tables.
pub(crate) fn scan_symbols<'data, R: ReadRef<'data>, T>(
    data: R,
    select: &mut dyn FnMut(&[u8], u8) -> Option<T>,
) -> Result<SymbolScan<T>> {
    let ident = data
        .read_bytes_at(0, 16)
        .map_err(|()| anyhow::anyhow!("too short for an ELF file"))?;
    anyhow::ensure!(ident[..4] == elf::ELFMAG, "not an ELF file");
    match ident[EI_CLASS] {
        elf::ELFCLASS64 => symbols_of::<elf::FileHeader64<Endianness>, _, _>(data, select),
        elf::ELFCLASS32 => symbols_of::<elf::FileHeader32<Endianness>, _, _>(data, select),
        c => anyhow::bail!("unknown ELF class {c}"),
    }
}

fn symbols_of<'data, Elf, R, T>(
    data: R,
    select: &mut dyn FnMut(&[u8], u8) -> Option<T>,
) -> Result<SymbolScan<T>>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let segments = header.program_headers(endian, data)?;
    let first_load = segments
        .iter()
        .find(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| (p.p_vaddr(endian).into(), p.p_offset(endian).into()));
    let mut out = Vec::new();
    for table in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        let symbols = sections.symbols(endian, data, table)?;
        if symbols.is_empty() {
            continue;
        }
        // The whole string table at once: one read, where per-name reads would be one each.
        let strings = sections
            .section(symbols.string_section())?
            .data(endian, data)?;
        for (index, sym) in symbols.enumerate() {
            if sym.st_shndx(endian) == elf::SHN_UNDEF {
                continue;
            }
            let Some(name) = c_str_at(strings, sym.st_name(endian)) else {
                continue;
            };
            let Some(pick) = select(name, sym.st_type()) else {
                continue;
            };
            let value: u64 = sym.st_value(endian).into();
            let section = symbols
                .symbol_section(endian, sym, index)?
                .and_then(|i| sections.section(i).ok());
            let in_section = section.and_then(|s| {
                let (addr, size): (u64, u64) = (s.sh_addr(endian).into(), s.sh_size(endian).into());
                (s.sh_type(endian) != elf::SHT_NOBITS
                    && value >= addr
                    && value - addr < size.max(1))
                .then(|| value - addr + Into::<u64>::into(s.sh_offset(endian)))
            });
            // Else through the loaded segment that holds the address (same answer when both
            // exist; this one also covers unusual section layouts).
            let file_offset = in_section.or_else(|| {
                segments.iter().find_map(|p| {
                    let (vaddr, filesz): (u64, u64) =
                        (p.p_vaddr(endian).into(), p.p_filesz(endian).into());
                    (p.p_type(endian) == elf::PT_LOAD && value >= vaddr && value - vaddr < filesz)
                        .then(|| value - vaddr + Into::<u64>::into(p.p_offset(endian)))
                })
            });
            out.push(PickedSymbol {
                pick,
                value,
                file_offset,
            });
        }
    }
    Ok(SymbolScan {
        symbols: out,
        first_load,
    })
}

/// Load bias of a mapped ELF file (runtime address = bias + link-time address), from its first
/// mapping (`start`, file `offset`) and its first loadable segment (`p_vaddr`, `p_offset`):
/// the loader maps that segment's page holding `p_offset` there, and ELF keeps `p_vaddr` and
/// `p_offset` congruent modulo the page size, so no page size is needed. `None` when they do
/// not fit together (not the mapping of that segment).
pub(crate) fn load_bias(file: &MappedFile, first_load: (u64, u64)) -> Option<u64> {
    let (p_vaddr, p_offset) = first_load;
    let in_page = p_offset.checked_sub(file.offset)?;
    Some(file.start.wrapping_add(in_page).wrapping_sub(p_vaddr))
}

/// The NUL-terminated string at `offset` of a string table.
pub(crate) fn c_str_at(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let s = strings.get(usize::try_from(offset).ok()?..)?;
    Some(&s[..s.iter().position(|&b| b == 0)?])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chrooted_processs_files_are_found_inside_its_root() {
        use super::in_root;
        use std::path::Path;
        let r = Some(Path::new("/srv/rocm-trixie"));
        assert_eq!(
            in_root(r, "/srv/rocm-trixie/usr/lib/libamdhip64.so.5"),
            "/usr/lib/libamdhip64.so.5"
        );
        // Not under it (a file mapped before the chroot), a prefix that is not a directory, no
        // root of its own: unchanged.
        assert_eq!(in_root(r, "/usr/bin/chroot"), "/usr/bin/chroot");
        assert_eq!(
            in_root(r, "/srv/rocm-trixie2/lib.so"),
            "/srv/rocm-trixie2/lib.so"
        );
        assert_eq!(in_root(None, "/usr/lib/x.so"), "/usr/lib/x.so");
    }

    use super::*;
    use gpreempt_common::kprobe::launch::HIP_GRAPH_LAUNCH;
    use std::io::{Read as _, Seek as _, SeekFrom};

    /// A launch entry point defined in this test binary, for the resolver to find.
    #[no_mangle]
    #[inline(never)]
    pub extern "C" fn hipGraphLaunch(graph: *mut libc::c_void, stream: *mut libc::c_void) -> i32 {
        std::hint::black_box((graph, stream));
        if graph.is_null() {
            1
        } else {
            0
        }
    }

    /// 16 bytes of `hipGraphLaunch`'s code as mapped in memory.
    fn code_bytes() -> [u8; 16] {
        let f: extern "C" fn(*mut libc::c_void, *mut libc::c_void) -> i32 = hipGraphLaunch;
        assert_eq!(f(std::ptr::null_mut(), std::ptr::null_mut()), 1);
        let mut out = [0u8; 16];
        // SAFETY: `f` points to the function's code in this process's executable text segment,
        // mapped readable; the 16 bytes from there are text of the same segment (the function is
        // not the last thing in it: the test harness's code follows).
        unsafe { std::ptr::copy_nonoverlapping(f as *const u8, out.as_mut_ptr(), out.len()) };
        out
    }

    fn file_bytes(path: &Path, offset: u64) -> [u8; 16] {
        let mut f = File::open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        let mut out = [0u8; 16];
        f.read_exact(&mut out).unwrap();
        out
    }

    fn graph_target(targets: &[LaunchTarget]) -> &LaunchTarget {
        let found: Vec<_> = targets
            .iter()
            .filter(|t| t.symbol == "hipGraphLaunch")
            .collect();
        assert_eq!(found.len(), 1, "{targets:#?}");
        found[0]
    }

    #[test]
    fn maps_text() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /usr/bin/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /usr/bin/app
55d0c0c00000-55d0c0c21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 r--p 00000000 fd:01 99                         /opt/rocm/lib/lib amd hip.so
7f0000001000-7f0000002000 r-xp 00001000 fd:01 99                         /opt/rocm/lib/lib amd hip.so
7f0000003000-7f0000004000 r--p 00000000 fd:01 100                        /usr/share/locale/x.mo
7f0000004000-7f0000005000 r-xp 00000000 fd:01 101                        /usr/lib/old.so (deleted)
7f0000005000-7f0000006000 rw-s 00000000 00:01 7                          /memfd:ring (deleted)
7f0000006000-7f0000007000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0                          [vdso]
";
        let files = mapped_files(maps);
        let summary: Vec<_> = files
            .iter()
            .map(|f| {
                (
                    f.dev.as_str(),
                    f.inode,
                    f.path.as_str(),
                    f.executable,
                    f.deleted,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("fd:01", 1234, "/usr/bin/app", true, false),
                ("fd:01", 99, "/opt/rocm/lib/lib amd hip.so", true, false),
                ("fd:01", 100, "/usr/share/locale/x.mo", false, false),
                ("fd:01", 101, "/usr/lib/old.so", true, true),
                ("00:01", 7, "/memfd:ring", false, true),
            ]
        );
        let firsts: Vec<_> = files.iter().map(|f| (f.start, f.offset)).collect();
        assert_eq!(firsts[0], (0x55d0c0a00000, 0));
        assert_eq!(firsts[1], (0x7f0000000000, 0));
        assert!(mapped_files("").is_empty());
        assert!(mapped_files("garbage\n\n7f-8f r-xp 0 fd:01 x /a\n").is_empty());
        assert!(mapped_files("zz-8f r-xp 0 fd:01 1 /a\n").is_empty());
    }

    #[test]
    fn load_bias_from_first_mapping() {
        let mut f = mapped_files("7f0000000000-7f0000001000 r--p 00000000 fd:01 9 /l.so\n")
            .pop()
            .unwrap();
        // A shared object linked at 0: the bias is where it was mapped.
        assert_eq!(load_bias(&f, (0, 0)), Some(0x7f0000000000));
        // A non-PIE executable linked at 0x400000 and mapped there: no bias.
        f.start = 0x400000;
        assert_eq!(load_bias(&f, (0x400000, 0)), Some(0));
        // A first segment that starts inside its page (p_vaddr and p_offset congruent).
        f.start = 0x7f0000010000;
        f.offset = 0x1000;
        assert_eq!(
            load_bias(&f, (0x201234, 0x1234)),
            Some(0x7f0000010000 - 0x201000)
        );
        // A mapping that starts past the segment: not that segment's.
        assert_eq!(load_bias(&f, (0, 0)), None);
    }

    #[test]
    fn resolves_this_process_with_correct_offset() {
        let pid = std::process::id();
        let mut r = LaunchResolver::new();
        let targets = r.resolve(pid).unwrap();
        let t = graph_target(&targets);
        assert_eq!(t.point, HIP_GRAPH_LAUNCH);
        assert_eq!(t.program, "up_hip_graph_launch");
        assert!(t.path.starts_with(format!("/proc/{pid}/root/").as_str()));
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        let found = std::fs::metadata(&t.path).unwrap();
        assert_eq!((found.dev(), found.ino()), (exe.dev(), exe.ino()));
        // The bytes at the file offset are the function's code: the offset is right.
        assert_eq!(file_bytes(&t.path, t.file_offset), code_bytes());

        // A second process (here: the same one again) reuses the parsed files.
        let parsed = r.files_parsed();
        assert!(parsed > 0);
        assert_eq!(r.resolve(pid).unwrap(), targets);
        assert_eq!(r.files_parsed(), parsed);
    }

    #[test]
    fn fake_proc_tree() {
        // Next to the test binary, so that it can be hard-linked into the fake root (a link
        // out of it would not resolve: files are opened inside the process's root).
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let root = exe
            .parent()
            .unwrap()
            .join(format!("gpreempt-launch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pid = 4242;
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("root/app/bin")).unwrap();
        std::fs::create_dir_all(dir.join("root/lib")).unwrap();
        std::fs::hard_link(&exe, dir.join("root/app/bin/test exe")).unwrap();
        std::fs::write(
            dir.join("status"),
            crate::observe::target_file::own_status(),
        )
        .unwrap();
        std::fs::write(dir.join("root/lib/notelf.so"), b"#!/bin/sh\nexit 0\n").unwrap();
        std::fs::write(dir.join("root/lib/short.so"), b"\x7fEL").unwrap();
        std::fs::write(dir.join("stat"), "4242 (app) S 1 4242 4242 0 -1\n").unwrap();
        std::fs::write(
            dir.join("maps"),
            "\
1000-2000 r-xp 00000000 fd:01 1 /app/bin/test exe
3000-4000 r-xp 00000000 fd:01 2 /lib/notelf.so
4000-5000 r-xp 00000000 fd:01 3 /lib/short.so
5000-6000 r-xp 00000000 fd:01 4 /lib/missing.so
6000-7000 r-xp 00000000 fd:01 5 /lib/gone.so (deleted)
",
        )
        .unwrap();

        let targets = resolve_in(&root, pid).unwrap();
        let t = graph_target(&targets);
        assert_eq!(t.path, dir.join("root/app/bin/test exe"));
        assert_eq!(file_bytes(&t.path, t.file_offset), code_bytes());
        let own = resolve(std::process::id()).unwrap();
        assert_eq!(t.file_offset, graph_target(&own).file_offset);

        // No maps: the process exited.
        let err = resolve_in(&root, 4243).unwrap_err();
        assert!(is_gone(&err), "{err:#}");
        assert_eq!(err.to_string(), "process 4243 exited");
        // A zombie: empty maps.
        std::fs::write(dir.join("maps"), "").unwrap();
        std::fs::write(dir.join("stat"), "4242 (a) b) Z 1 4242\n").unwrap();
        assert!(is_gone(&resolve_in(&root, pid).unwrap_err()));
        // Alive with nothing mapped (a kernel thread): no targets, not gone.
        std::fs::write(dir.join("stat"), "4242 (kthread) S 2 0\n").unwrap();
        assert_eq!(resolve_in(&root, pid).unwrap(), []);
        // Other errors are not "gone".
        assert!(!is_gone(&anyhow::anyhow!("permission denied")));

        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn string_table_lookup() {
        let t = b"\0abc\0hipLaunchKernel@@hip_4.2\0";
        assert_eq!(c_str_at(t, 1), Some(&b"abc"[..]));
        assert_eq!(c_str_at(t, 0), Some(&b""[..]));
        assert_eq!(c_str_at(t, 2), Some(&b"bc"[..]));
        assert_eq!(c_str_at(t, 100), None);
        assert_eq!(c_str_at(b"abc", 0), None);
    }
}
