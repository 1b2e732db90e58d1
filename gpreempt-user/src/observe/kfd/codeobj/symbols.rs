//! One code object's `.kd` symbols, read from its ELF headers and symbol table only (never the
//! code), on demand and within the call's budget.

use super::*;

/// A code object's bytes, read on demand (the ELF reader asks only for the ranges it parses),
/// within the call's byte budget.
pub(super) struct Source<'a> {
    pub(super) from: Origin,
    pub(super) base: u64,
    pub(super) len: u64,
    pub(super) pos: u64,
    pub(super) limits: &'a Limits,
}

pub(super) enum Origin {
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
pub(super) fn object_kernels(
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
pub(super) fn check_header(cache: &ReadCache<Source<'_>>, len: u64) -> Result<()> {
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
pub(super) fn display_name(symbol: &[u8]) -> String {
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
pub(super) struct Bounded {
    pub(super) text: String,
    pub(super) cut: bool,
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
