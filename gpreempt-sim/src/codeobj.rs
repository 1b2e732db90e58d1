//! Emulated GPU code objects, published the way ROCr's loader publishes them for debuggers.
//!
//! ROCr exports `_amdgpu_r_debug` (a glibc `struct r_debug`) whose `r_map` lists the loaded
//! code objects as `struct link_map` entries: `l_addr` the load delta, `l_name` a URI such as
//! `memory://PID#offset=0xADDR&size=N` (docs/kfd.md, "Kernel names"). A dispatch packet's
//! `kernel_object` is the address of a kernel descriptor, the `<kernel>.kd` symbol's
//! `l_addr + st_value`. Workloads load one AMDGPU-style ELF per profile here, so the packets the
//! emulated GPU runs carry real descriptor addresses and tools can name the kernels. The ELF and
//! its layout are this emulator's convention (docs/sim.md); the list protocol is ROCr's.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Mutex;

use anyhow::{Context as _, Result};

/// glibc's `struct r_debug` on a 64-bit target (`<link.h>`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RDebug {
    pub r_version: i32,
    /// `struct link_map *`: the first entry, 0 when none.
    pub r_map: u64,
    /// Address of the function the loader calls around every change (debuggers break there).
    pub r_brk: u64,
    /// RT_CONSISTENT (0), RT_ADD (1), RT_DELETE (2).
    pub r_state: i32,
    pub r_ldbase: u64,
}

/// The debugger-visible head of glibc's `struct link_map` (`<link.h>`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkMap {
    /// Load delta: runtime address minus the ELF's own address.
    pub l_addr: u64,
    /// `char *`: the code object's URI, NUL-terminated.
    pub l_name: u64,
    pub l_ld: u64,
    pub l_next: u64,
    pub l_prev: u64,
}

const _: () = assert!(std::mem::size_of::<RDebug>() == 40);
const _: () = assert!(std::mem::size_of::<LinkMap>() == 40);

pub const RT_CONSISTENT: i32 = 0;
pub const RT_ADD: i32 = 1;
pub const RT_DELETE: i32 = 2;

/// The list head other processes read; only [`LIST`]'s holder writes it.
pub struct Published(UnsafeCell<RDebug>);

// SAFETY: every write happens under `LIST`; readers in this process only take its address.
unsafe impl Sync for Published {}

/// ROCr's symbol name, so a tool finds it in this binary's symbol table as it finds it in
/// libhsa-runtime64.so. All zero (r_version 0) until the first code object is published.
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static _amdgpu_r_debug: Published = Published(UnsafeCell::new(RDebug {
    r_version: 0,
    r_map: 0,
    r_brk: 0,
    r_state: RT_CONSISTENT,
    r_ldbase: 0,
}));

/// Serialises list changes (the role of ROCr's loader lock).
static LIST: Mutex<()> = Mutex::new(());

/// The protocol version published: 1, the initial r_debug protocol (ROCr's own number also
/// versions its trap handler ABI, which the emulator has none of).
pub const R_VERSION: i32 = 1;

/// The address of `_amdgpu_r_debug` (what ROCr passes to RUNTIME_ENABLE).
pub fn r_debug_address() -> u64 {
    _amdgpu_r_debug.0.get() as u64
}

/// Where debuggers put a breakpoint to see list changes; it must not be optimised away.
#[inline(never)]
extern "C" fn loader_debug_state() {
    std::hint::black_box(());
}

// ---------------------------------------------------------------------------------------------
// The code object ELF.

/// ELF constants (System V gABI; the AMDGPU ones from LLVM's AMDGPUUsage).
mod elf {
    pub const ELFCLASS64: u8 = 2;
    pub const ELFDATA2LSB: u8 = 1;
    pub const ELFOSABI_AMDGPU_HSA: u8 = 64;
    /// Code object V5.
    pub const ELFABIVERSION_AMDGPU_HSA_V5: u8 = 3;
    pub const ET_DYN: u16 = 3;
    pub const EM_AMDGPU: u16 = 224;
    /// gfx90a (MI210), the emulator's default model.
    pub const EF_AMDGPU_MACH_AMDGCN_GFX90A: u32 = 0x3f;
    pub const PT_LOAD: u32 = 1;
    pub const PF_R: u32 = 4;
    pub const SHT_PROGBITS: u32 = 1;
    pub const SHT_SYMTAB: u32 = 2;
    pub const SHT_STRTAB: u32 = 3;
    pub const SHF_ALLOC: u64 = 2;
    pub const STB_GLOBAL: u8 = 1;
    pub const STT_OBJECT: u8 = 1;
    pub const STV_PROTECTED: u8 = 3;
    pub const EHDR: usize = 64;
    pub const PHDR: usize = 56;
    pub const SHDR: usize = 64;
    pub const SYM: usize = 24;
}

/// A kernel descriptor's size and alignment (AMDGPU `kernel_descriptor_t`).
pub const KD_BYTES: usize = 64;
/// Where `.rodata` (the descriptors) starts, in the file and in the ELF's address space.
const RODATA: usize = 0x100;

/// An emulated code object: the ELF image and where each kernel's descriptor is in it.
#[derive(Debug, Clone)]
pub struct CodeObjectImage {
    pub elf: Vec<u8>,
    /// Per kernel (input order, duplicates dropped): its name and its `.kd` symbol's st_value.
    pub kernels: Vec<(String, u64)>,
    /// Bytes of the one loadable segment (headers and descriptors), from address 0.
    pub load_size: usize,
}

/// The symbol of a kernel: `<name>.kd`. An ELF symbol name is any NUL-free byte string, so the
/// (demangled, spaced) timeline names serve as they are; an empty name or one with a NUL gets
/// `kernel_<i>` instead.
fn symbol_of(index: usize, name: &str) -> String {
    if name.is_empty() || name.contains('\0') {
        format!("kernel_{index}.kd")
    } else {
        format!("{name}.kd")
    }
}

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn align(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// One section header's fields (Elf64_Shdr).
#[derive(Default)]
struct Shdr {
    name: u32,
    kind: u32,
    flags: u64,
    addr: u64,
    off: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

fn put_shdr(b: &mut [u8], h: usize, s: &Shdr) {
    put32(b, h, s.name);
    put32(b, h + 4, s.kind);
    put64(b, h + 8, s.flags);
    put64(b, h + 16, s.addr);
    put64(b, h + 24, s.off);
    put64(b, h + 32, s.size);
    put32(b, h + 40, s.link);
    put32(b, h + 44, s.info);
    put64(b, h + 48, s.align);
    put64(b, h + 56, s.entsize);
}

/// The ELF header (AMDGPU, HSA OS ABI, code object V5, gfx90a) and the one loadable segment:
/// file offset 0 at address 0.
fn put_headers(b: &mut [u8], shoff: usize, shnum: usize, load_size: usize) {
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = elf::ELFCLASS64;
    b[5] = elf::ELFDATA2LSB;
    b[6] = 1; // EV_CURRENT
    b[7] = elf::ELFOSABI_AMDGPU_HSA;
    b[8] = elf::ELFABIVERSION_AMDGPU_HSA_V5;
    put16(b, 16, elf::ET_DYN);
    put16(b, 18, elf::EM_AMDGPU);
    put32(b, 20, 1);
    put64(b, 32, elf::EHDR as u64); // e_phoff
    put64(b, 40, shoff as u64);
    put32(b, 48, elf::EF_AMDGPU_MACH_AMDGCN_GFX90A);
    put16(b, 52, elf::EHDR as u16);
    put16(b, 54, elf::PHDR as u16);
    put16(b, 56, 1);
    put16(b, 58, elf::SHDR as u16);
    put16(b, 60, shnum as u16);
    put16(b, 62, 4); // e_shstrndx
    let ph = elf::EHDR;
    put32(b, ph, elf::PT_LOAD);
    put32(b, ph + 4, elf::PF_R);
    put64(b, ph + 32, load_size as u64); // p_filesz
    put64(b, ph + 40, load_size as u64); // p_memsz
    put64(b, ph + 48, 0x1000); // p_align
}

/// Builds a minimal AMDGPU code object (ELF64 LE, HSA OS ABI, code object V5, gfx90a): one
/// read-only PT_LOAD holding the headers and `.rodata` with one zeroed 64-byte descriptor per
/// kernel, and `.symtab` with one global STT_OBJECT `<name>.kd` per kernel, as LLVM emits them.
/// Names are distinct in the result: a repeated one keeps its first descriptor.
pub fn build_image<S: AsRef<str>>(names: &[S]) -> CodeObjectImage {
    let mut kernels: Vec<(String, u64)> = Vec::new();
    let mut symbols: Vec<String> = Vec::new();
    for name in names.iter().map(AsRef::as_ref) {
        if kernels.iter().any(|(n, _)| n == name) {
            continue;
        }
        let value = (RODATA + kernels.len() * KD_BYTES) as u64;
        symbols.push(symbol_of(kernels.len(), name));
        kernels.push((name.to_string(), value));
    }
    let rodata_size = kernels.len() * KD_BYTES;
    let load_size = RODATA + rodata_size;

    let mut strtab = vec![0u8];
    let mut name_offsets = Vec::new();
    for s in &symbols {
        name_offsets.push(strtab.len() as u32);
        strtab.extend_from_slice(s.as_bytes());
        strtab.push(0);
    }
    let shstrtab = b"\0.rodata\0.symtab\0.strtab\0.shstrtab\0";
    let sh_name = |s: &str| -> u32 {
        let needle = format!("\0{s}\0");
        shstrtab
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
            .map_or(0, |p| p as u32 + 1)
    };

    let symtab_off = align(load_size, 8);
    let symtab_size = (symbols.len() + 1) * elf::SYM;
    let strtab_off = symtab_off + symtab_size;
    let shstrtab_off = strtab_off + strtab.len();
    let shoff = align(shstrtab_off + shstrtab.len(), 8);
    let shnum = 5usize;
    let mut b = vec![0u8; shoff + shnum * elf::SHDR];

    put_headers(&mut b, shoff, shnum, load_size);

    // Symbols: the null one, then one per kernel.
    for (i, ((_, value), name_off)) in kernels.iter().zip(&name_offsets).enumerate() {
        let s = symtab_off + (i + 1) * elf::SYM;
        put32(&mut b, s, *name_off);
        b[s + 4] = (elf::STB_GLOBAL << 4) | elf::STT_OBJECT;
        b[s + 5] = elf::STV_PROTECTED;
        put16(&mut b, s + 6, 1); // .rodata
        put64(&mut b, s + 8, *value);
        put64(&mut b, s + 16, KD_BYTES as u64);
    }
    b[strtab_off..strtab_off + strtab.len()].copy_from_slice(&strtab);
    b[shstrtab_off..shstrtab_off + shstrtab.len()].copy_from_slice(shstrtab);

    // Section headers: null, .rodata, .symtab, .strtab, .shstrtab.
    let r = RODATA as u64;
    let headers = [
        Shdr {
            name: sh_name(".rodata"),
            kind: elf::SHT_PROGBITS,
            flags: elf::SHF_ALLOC,
            addr: r,
            off: r,
            size: rodata_size as u64,
            align: KD_BYTES as u64,
            ..Shdr::default()
        },
        Shdr {
            name: sh_name(".symtab"),
            kind: elf::SHT_SYMTAB,
            off: symtab_off as u64,
            size: symtab_size as u64,
            link: 3,
            info: 1, // index of the first non-local symbol
            align: 8,
            entsize: elf::SYM as u64,
            ..Shdr::default()
        },
        Shdr {
            name: sh_name(".strtab"),
            kind: elf::SHT_STRTAB,
            off: strtab_off as u64,
            size: strtab.len() as u64,
            align: 1,
            ..Shdr::default()
        },
        Shdr {
            name: sh_name(".shstrtab"),
            kind: elf::SHT_STRTAB,
            off: shstrtab_off as u64,
            size: shstrtab.len() as u64,
            align: 1,
            ..Shdr::default()
        },
    ];
    for (i, h) in headers.iter().enumerate() {
        put_shdr(&mut b, shoff + (i + 1) * elf::SHDR, h);
    }
    CodeObjectImage {
        elf: b,
        kernels,
        load_size,
    }
}

// ---------------------------------------------------------------------------------------------
// Loading and publishing.

/// One 64-byte, 64-aligned unit of loaded segment memory (descriptors need that alignment).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Block([u8; KD_BYTES]);

/// A code object loaded into this process and listed in `_amdgpu_r_debug` until dropped.
pub struct LoadedCodeObject {
    /// The ELF image the URI points at (kept: readers copy it from here).
    elf: Box<[u8]>,
    /// The loaded segment: what the descriptors' addresses point into.
    segment: Box<[Block]>,
    uri: CString,
    /// This object's list entry (boxed: other entries and readers hold its address).
    node: Box<UnsafeCell<LinkMap>>,
    by_name: HashMap<String, u64>,
}

impl LoadedCodeObject {
    /// Builds the code object of `names` ([`build_image`]), "loads" its segment into memory and
    /// publishes it with a `memory://` URI, as ROCr does for a code object loaded from memory.
    pub fn load<S: AsRef<str>>(names: &[S]) -> Result<Self> {
        let image = build_image(names);
        let blocks = image.load_size.div_ceil(KD_BYTES);
        let mut segment = vec![Block([0; KD_BYTES]); blocks].into_boxed_slice();
        for (block, chunk) in segment
            .iter_mut()
            .zip(image.elf[..image.load_size].chunks(KD_BYTES))
        {
            block.0[..chunk.len()].copy_from_slice(chunk);
        }
        let elf = image.elf.into_boxed_slice();
        // The segment's ELF address is 0, so the load delta is where it landed.
        let l_addr = segment.as_ptr() as u64;
        let uri = CString::new(format!(
            "memory://{}#offset={:#x}&size={}",
            std::process::id(),
            elf.as_ptr() as u64,
            elf.len()
        ))
        .context("code object URI")?;
        let by_name = image
            .kernels
            .iter()
            .map(|(name, value)| (name.clone(), l_addr + value))
            .collect();
        let node = Box::new(UnsafeCell::new(LinkMap {
            l_addr,
            l_name: uri.as_ptr() as u64,
            ..LinkMap::default()
        }));
        let object = LoadedCodeObject {
            elf,
            segment,
            uri,
            node,
            by_name,
        };
        object.publish();
        Ok(object)
    }

    /// A kernel's descriptor address: what its dispatch packets carry as `kernel_object`.
    pub fn kernel_object(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    pub fn uri(&self) -> &str {
        self.uri.to_str().unwrap_or_default()
    }

    pub fn elf(&self) -> &[u8] {
        &self.elf
    }

    /// The load delta (`l_addr`).
    pub fn load_address(&self) -> u64 {
        self.segment.as_ptr() as u64
    }

    /// The address of this object's `link_map` entry.
    pub fn link_map_address(&self) -> u64 {
        self.node.get() as u64
    }

    /// Appends the entry at the list's tail, inside RT_ADD / RT_CONSISTENT as ROCr's loader does.
    fn publish(&self) {
        let _guard = LIST.lock().unwrap_or_else(|e| e.into_inner());
        let head = _amdgpu_r_debug.0.get();
        let me = self.node.get();
        // SAFETY: `head` is the static list head and every node on it belongs to a live
        // LoadedCodeObject (dropping one unlinks it under this lock, which we hold); `me` is
        // ours and not yet linked.
        unsafe {
            (*head).r_version = R_VERSION;
            (*head).r_brk = loader_debug_state as *const () as u64;
            (*head).r_state = RT_ADD;
            loader_debug_state();
            let mut tail = (*head).r_map as *mut LinkMap;
            if tail.is_null() {
                (*head).r_map = me as u64;
            } else {
                while (*tail).l_next != 0 {
                    tail = (*tail).l_next as *mut LinkMap;
                }
                (*tail).l_next = me as u64;
                (*me).l_prev = tail as u64;
            }
            (*head).r_state = RT_CONSISTENT;
            loader_debug_state();
        }
    }

    fn unpublish(&self) {
        let _guard = LIST.lock().unwrap_or_else(|e| e.into_inner());
        let head = _amdgpu_r_debug.0.get();
        let me = self.node.get();
        // SAFETY: as in `publish`; `me` is on the list (published in `load`).
        unsafe {
            (*head).r_state = RT_DELETE;
            loader_debug_state();
            let (prev, next) = ((*me).l_prev as *mut LinkMap, (*me).l_next as *mut LinkMap);
            if prev.is_null() {
                (*head).r_map = next as u64;
            } else {
                (*prev).l_next = next as u64;
            }
            if !next.is_null() {
                (*next).l_prev = prev as u64;
            }
            (*me).l_next = 0;
            (*me).l_prev = 0;
            (*head).r_state = RT_CONSISTENT;
            loader_debug_state();
        }
    }
}

impl Drop for LoadedCodeObject {
    fn drop(&mut self) {
        self.unpublish();
    }
}

/// The list as this process sees it: (l_addr, URI) per entry.
pub fn published() -> Vec<(u64, String)> {
    let _guard = LIST.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    // SAFETY: under the lock every node on the list belongs to a live LoadedCodeObject whose
    // l_name is its own live CString.
    unsafe {
        let mut node = (*_amdgpu_r_debug.0.get()).r_map as *const LinkMap;
        while !node.is_null() {
            let name = std::ffi::CStr::from_ptr((*node).l_name as *const std::ffi::c_char);
            out.push(((*node).l_addr, name.to_string_lossy().into_owned()));
            node = (*node).l_next as *const LinkMap;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes([b[o], b[o + 1]])
    }
    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    /// (name, st_value, st_info) of every symbol, read back through the section headers.
    fn symbols(b: &[u8]) -> Vec<(String, u64, u8)> {
        let shoff = u64_at(b, 40) as usize;
        let sh = |i: usize| shoff + i * elf::SHDR;
        let symtab = (1..u16_at(b, 60) as usize)
            .find(|&i| u32_at(b, sh(i) + 4) == elf::SHT_SYMTAB)
            .unwrap();
        let (off, size) = (u64_at(b, sh(symtab) + 24), u64_at(b, sh(symtab) + 32));
        let strtab = sh(u32_at(b, sh(symtab) + 40) as usize);
        let str_off = u64_at(b, strtab + 24) as usize;
        (1..(size as usize / elf::SYM))
            .map(|i| {
                let s = off as usize + i * elf::SYM;
                let n = str_off + u32_at(b, s) as usize;
                let end = n + b[n..].iter().position(|&c| c == 0).unwrap();
                (
                    String::from_utf8(b[n..end].to_vec()).unwrap(),
                    u64_at(b, s + 8),
                    b[s + 4],
                )
            })
            .collect()
    }

    #[test]
    fn image_layout() {
        let names = [
            "void at::native::elementwise_kernel<128, 4>(int, float)",
            "k2",
            "k2",
            "",
        ];
        let img = build_image(&names);
        let b = &img.elf;
        assert_eq!(&b[..4], b"\x7fELF");
        assert_eq!((b[4], b[5], b[7]), (2, 1, 64));
        assert_eq!(u16_at(b, 18), elf::EM_AMDGPU);
        assert_eq!(img.kernels.len(), 3, "duplicates dropped");
        let syms = symbols(b);
        assert_eq!(
            syms,
            [
                (format!("{}.kd", names[0]), 0x100, 0x11),
                ("k2.kd".to_string(), 0x140, 0x11),
                ("kernel_2.kd".to_string(), 0x180, 0x11),
            ]
        );
        assert_eq!(img.load_size, 0x1c0);
        assert_eq!(build_image::<&str>(&[]).kernels, []);
    }

    #[test]
    fn published_and_unpublished() {
        let a = LoadedCodeObject::load(&["alpha", "beta"]).unwrap();
        let b = LoadedCodeObject::load(&["gamma"]).unwrap();
        // SAFETY: reading plain integers of the static head.
        let head = unsafe { *_amdgpu_r_debug.0.get() };
        assert_eq!((head.r_version, head.r_state), (R_VERSION, RT_CONSISTENT));
        assert_eq!(r_debug_address(), &_amdgpu_r_debug as *const _ as u64);
        let list = published();
        let mine = |o: &LoadedCodeObject| (o.load_address(), o.uri().to_string());
        assert!(
            list.contains(&mine(&a)) && list.contains(&mine(&b)),
            "{list:?}"
        );
        let uri = a.uri();
        let expect = format!(
            "memory://{}#offset={:#x}&size={}",
            std::process::id(),
            a.elf().as_ptr() as u64,
            a.elf().len()
        );
        assert_eq!(uri, expect);
        assert_eq!(a.kernel_object("alpha"), Some(a.load_address() + 0x100));
        assert_eq!(a.kernel_object("beta"), Some(a.load_address() + 0x140));
        assert_eq!(a.kernel_object("gamma"), None);
        assert_eq!(a.kernel_object("beta").unwrap() % KD_BYTES as u64, 0);
        let (a_entry, b_entry) = (mine(&a), mine(&b));
        drop(a);
        let list = published();
        assert!(!list.contains(&a_entry) && list.contains(&b_entry));
        drop(b);
        assert!(!published().contains(&b_entry));
    }
}
