//! `btf`: a small reader for kernel BTF, so the kernel-internal kprobes read struct members at the
//! offsets of the running kernel rather than ones baked in at build time (amdkfd layouts drift
//! between versions and DKMS builds: docs/kfd.md).
//!
//! [`Btf`] parses raw BTF (`/sys/kernel/btf/vmlinux`, a module's split BTF such as
//! `/sys/kernel/btf/amdgpu`, or the `.BTF` section of an ELF object) and answers the few questions
//! the probes need: a member's offset and size, a parameter's position, an enumerator's value.
//! [`resolve`] turns every [`FIELDS`] entry into the `OFFSETS` map value, with a reason for each
//! field it could not find.
//!
//! The input is untrusted: every record is bounds-checked and every type id and string offset is
//! validated at parse time, and lookups stop on type cycles, so malformed input gives an error
//! (or a failed lookup), never a panic. Why not the btf-rs crate: docs/architecture.md, "BTF parser:
//! why our own".

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context as _};
use gpreempt_common::kprobe::{FieldSource, KernelOffsets, FIELDS};
use object::{Object as _, ObjectSection as _};

const MAGIC: u16 = 0xeb9f;
/// Length of the fixed header (`struct btf_header`).
const HEADER_LEN: usize = 24;

// BTF kinds (include/uapi/linux/btf.h).
const INT: u32 = 1;
const PTR: u32 = 2;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const FWD: u32 = 7;
const TYPEDEF: u32 = 8;
const VOLATILE: u32 = 9;
const CONST: u32 = 10;
const RESTRICT: u32 = 11;
const FUNC: u32 = 12;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const FLOAT: u32 = 16;
const DECL_TAG: u32 = 17;
const TYPE_TAG: u32 = 18;
const ENUM64: u32 = 19;

/// Most typedef/qualifier hops, and most nested anonymous members, followed before a lookup gives
/// up: real kernels need a handful; corrupt input may contain cycles.
const MAX_DEPTH: u32 = 64;
/// Most members one member lookup examines: corrupt input can make anonymous members fan out
/// exponentially (a struct whose anonymous members are all itself); real ones need hundreds.
const MAX_VISITS: u32 = 1 << 20;

fn kind_name(kind: u32) -> &'static str {
    match kind {
        INT => "INT",
        PTR => "PTR",
        ARRAY => "ARRAY",
        STRUCT => "STRUCT",
        UNION => "UNION",
        ENUM => "ENUM",
        FWD => "FWD",
        TYPEDEF => "TYPEDEF",
        VOLATILE => "VOLATILE",
        CONST => "CONST",
        RESTRICT => "RESTRICT",
        FUNC => "FUNC",
        FUNC_PROTO => "FUNC_PROTO",
        VAR => "VAR",
        DATASEC => "DATASEC",
        FLOAT => "FLOAT",
        DECL_TAG => "DECL_TAG",
        TYPE_TAG => "TYPE_TAG",
        ENUM64 => "ENUM64",
        _ => "unknown",
    }
}

/// One type record: its three header words and where its trailing data starts in `Part::words`.
#[derive(Clone, Copy, Debug)]
struct TypeRec {
    name_off: u32,
    info: u32,
    /// `size` or `type`, depending on the kind.
    size_type: u32,
    /// Index of the first trailing word in `Part::words`.
    extra: u32,
}

impl TypeRec {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> u32 {
        self.info & 0xffff
    }
    fn kind_flag(&self) -> bool {
        self.info & (1 << 31) != 0
    }
}

/// Trailing words after the header for a kind, or `None` for a kind this reader does not know.
fn trailing_words(kind: u32, vlen: u32) -> Option<u32> {
    Some(match kind {
        INT | VAR | DECL_TAG => 1,
        PTR | FWD | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | FLOAT | TYPE_TAG => 0,
        ARRAY => 3,
        STRUCT | UNION | DATASEC | ENUM64 => 3 * vlen,
        ENUM | FUNC_PROTO => 2 * vlen,
        _ => return None,
    })
}

/// One BTF blob (vmlinux, or a module's split BTF on top of it).
struct Part {
    /// Type id of `types[0]` (1 for a base blob).
    first_id: u32,
    /// Global string offset of `strings[0]` (the base blobs' string lengths, 0 for a base).
    str_start: u32,
    strings: Vec<u8>,
    /// The type section as little-endian words (every record is a whole number of words).
    words: Vec<u32>,
    types: Vec<TypeRec>,
    /// Name → id of the STRUCT or UNION with that name (one with members preferred).
    composites: HashMap<Box<[u8]>, u32>,
    /// Name → id of the FUNC with that name.
    funcs: HashMap<Box<[u8]>, u32>,
    /// Name → id of the ENUM or ENUM64 with that name.
    enums: HashMap<Box<[u8]>, u32>,
}

impl Part {
    fn str_end(&self) -> u32 {
        // Fits: the string section length was checked against u32 offsets at parse time.
        self.str_start
            .saturating_add(u32::try_from(self.strings.len()).unwrap_or(u32::MAX))
    }
    fn last_id(&self) -> u32 {
        self.first_id
            .saturating_add(u32::try_from(self.types.len()).unwrap_or(u32::MAX))
            .saturating_sub(1)
    }
    fn trailing(&self, t: &TypeRec, words: u32) -> &[u32] {
        let start = t.extra as usize;
        self.words
            .get(start..start.saturating_add(words as usize))
            .unwrap_or(&[])
    }
}

/// Parsed BTF: a base blob, or a split blob together with the base it extends. Cheap to clone.
#[derive(Clone)]
pub struct Btf {
    /// Base first, this blob last.
    parts: Vec<Arc<Part>>,
}

impl fmt::Debug for Btf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Btf")
            .field("blobs", &self.parts.len())
            .field("types", &self.type_count())
            .finish()
    }
}

/// Why a member or parameter lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Miss {
    /// No STRUCT/UNION (or FUNC) with that name.
    NoOwner,
    /// The owner exists but has no such member or parameter.
    NoMember,
    /// The member is a bitfield: no byte offset to read.
    Bitfield,
    /// The member's or parameter's type has no size (void, function, cycle).
    NoSize,
}

/// A found member or parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Found {
    /// Byte offset of a member, index of a parameter.
    off: u32,
    /// Byte size of its type.
    size: u32,
    /// Integer, enum, pointer or float: a value the probes can read whole.
    scalar: bool,
}

impl Btf {
    /// Parses a base BTF blob (e.g. `/sys/kernel/btf/vmlinux`).
    pub fn parse(data: &[u8]) -> anyhow::Result<Btf> {
        let part = parse_part(data, &[])?;
        Ok(Btf {
            parts: vec![Arc::new(part)],
        })
    }

    /// Parses split BTF (a kernel module's, e.g. `/sys/kernel/btf/amdgpu`) on top of `base`: its
    /// type ids continue after the base's, and its string offsets continue after the base's string
    /// section. Lookups on the result see the base's types too.
    pub fn parse_split(data: &[u8], base: &Btf) -> anyhow::Result<Btf> {
        let part = parse_part(data, &base.parts)?;
        let mut parts = base.parts.clone();
        parts.push(Arc::new(part));
        Ok(Btf { parts })
    }

    /// Parses the `.BTF` section of an ELF object (e.g. `clang -g -target bpf` output).
    pub fn from_elf(bytes: &[u8]) -> anyhow::Result<Btf> {
        Btf::parse(elf_btf_section(bytes)?).context("parsing the .BTF section")
    }

    /// Number of type ids, base included (ids are `1..=type_count()`; 0 is void).
    pub fn type_count(&self) -> u32 {
        self.parts.last().map_or(0, |p| p.last_id())
    }

    /// `(byte offset, byte size)` of `struct_name.member` (a STRUCT or UNION with members),
    /// looking into anonymous struct/union members. `None` when absent or a bitfield.
    pub fn member(&self, struct_name: &str, member: &str) -> Option<(u32, u32)> {
        self.find_member(struct_name, member)
            .ok()
            .map(|f| (f.off, f.size))
    }

    /// Byte size of the STRUCT or UNION named `name` (one with members preferred).
    pub fn struct_size(&self, name: &str) -> Option<u32> {
        self.lookup(name, |p| &p.composites)
            .map(|(_, t)| t.size_type)
    }

    /// `(0-based index, byte size)` of the parameter named `param_name` of function `func_name`.
    pub fn param(&self, func_name: &str, param_name: &str) -> Option<(u32, u32)> {
        self.find_param(func_name, param_name)
            .ok()
            .map(|f| (f.off, f.size))
    }

    /// Whether a FUNC named `name` exists.
    pub fn has_function(&self, name: &str) -> bool {
        self.lookup(name, |p| &p.funcs).is_some()
    }

    /// The type id of the FUNC named `name` (split BTF: its ids continue after the base's, as
    /// the kernel numbers them, so the id is what `attach_btf_id` wants).
    pub fn function_id(&self, name: &str) -> Option<u32> {
        self.parts
            .iter()
            .rev()
            .find_map(|p| p.funcs.get(name.as_bytes()).copied())
    }

    /// Value of `enumerator` in the ENUM or ENUM64 named `enum_name` (unsigned 64-bit values above
    /// `i64::MAX` wrap).
    pub fn enum_value(&self, enum_name: &str, enumerator: &str) -> Option<i64> {
        let (part, t) = self.lookup(enum_name, |p| &p.enums)?;
        let signed = t.kind_flag();
        match t.kind() {
            ENUM => part
                .trailing(t, 2 * t.vlen())
                .chunks_exact(2)
                .find(|e| self.str_at(e[0]) == Some(enumerator.as_bytes()))
                .map(|e| {
                    if signed {
                        i64::from(e[1] as i32)
                    } else {
                        i64::from(e[1])
                    }
                }),
            ENUM64 => part
                .trailing(t, 3 * t.vlen())
                .chunks_exact(3)
                .find(|e| self.str_at(e[0]) == Some(enumerator.as_bytes()))
                .map(|e| ((u64::from(e[2]) << 32) | u64::from(e[1])) as i64),
            _ => None,
        }
    }

    /// The part holding type `id`, and its record (`None` for void and ids out of range).
    fn get(&self, id: u32) -> Option<(&Part, &TypeRec)> {
        let part = self.parts.iter().rev().find(|p| id >= p.first_id)?;
        let t = part.types.get((id - part.first_id) as usize)?;
        Some((part, t))
    }

    /// The NUL-terminated string at global offset `off`, without its NUL.
    fn str_at(&self, off: u32) -> Option<&[u8]> {
        let part = self
            .parts
            .iter()
            .rev()
            .find(|p| off >= p.str_start && off < p.str_end())?;
        let s = part.strings.get((off - part.str_start) as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        s.get(..end)
    }

    /// The type named `name` in one of the name indexes, this blob's first, then its bases'.
    fn lookup(
        &self,
        name: &str,
        index: impl Fn(&Part) -> &HashMap<Box<[u8]>, u32>,
    ) -> Option<(&Part, &TypeRec)> {
        let mut fallback = None;
        for part in self.parts.iter().rev() {
            if let Some(&id) = index(part).get(name.as_bytes()) {
                let found = self.get(id)?;
                // An empty STRUCT or ENUM is a stand-in; a later blob may define it fully.
                if found.1.vlen() > 0 {
                    return Some(found);
                }
                fallback.get_or_insert(found);
            }
        }
        fallback
    }

    fn find_member(&self, struct_name: &str, member: &str) -> Result<Found, Miss> {
        let (part, t) = self
            .lookup(struct_name, |p| &p.composites)
            .ok_or(Miss::NoOwner)?;
        if member.is_empty() {
            return Err(Miss::NoMember);
        }
        let mut budget = MAX_VISITS;
        let (bits, found) = self
            .member_bits(part, t, member.as_bytes(), 0, &mut budget)
            .ok_or(Miss::NoMember)??;
        if bits % 8 != 0 {
            return Err(Miss::Bitfield);
        }
        let off = u32::try_from(bits / 8).map_err(|_| Miss::NoSize)?;
        Ok(Found { off, ..found })
    }

    /// Bit offset and type size of `member` in the STRUCT/UNION `t`, descending into anonymous
    /// members. `None`: not there (or `budget` members examined); `Some(Err)`: there, but not
    /// readable.
    fn member_bits(
        &self,
        part: &Part,
        t: &TypeRec,
        member: &[u8],
        depth: u32,
        budget: &mut u32,
    ) -> Option<Result<(u64, Found), Miss>> {
        if depth > MAX_DEPTH || !matches!(t.kind(), STRUCT | UNION) {
            return None;
        }
        for m in part.trailing(t, 3 * t.vlen()).chunks_exact(3) {
            *budget = budget.checked_sub(1)?;
            let (name_off, type_id, raw) = (m[0], m[1], m[2]);
            let (bit_off, bitfield_size) = if t.kind_flag() {
                (raw & 0x00ff_ffff, raw >> 24)
            } else {
                (raw, 0)
            };
            let name = self.str_at(name_off).unwrap_or_default();
            if name == member {
                if bitfield_size != 0 || bit_off % 8 != 0 || self.is_legacy_bitfield(type_id) {
                    return Some(Err(Miss::Bitfield));
                }
                return Some(match self.size_of(type_id, 0) {
                    Some((size, scalar)) => Ok((
                        u64::from(bit_off),
                        Found {
                            off: 0,
                            size,
                            scalar,
                        },
                    )),
                    None => Err(Miss::NoSize),
                });
            }
            if name.is_empty() {
                let Some((inner_part, inner)) = self.strip(type_id, 0) else {
                    continue;
                };
                if let Some(found) = self.member_bits(inner_part, inner, member, depth + 1, budget)
                {
                    return Some(found.map(|(b, f)| (b + u64::from(bit_off), f)));
                }
            }
        }
        None
    }

    /// Without `kind_flag`, a bitfield member's type is an INT whose encoding has fewer bits than
    /// its size or a bit offset.
    fn is_legacy_bitfield(&self, type_id: u32) -> bool {
        let Some((part, t)) = self.strip(type_id, 0) else {
            return false;
        };
        if t.kind() != INT {
            return false;
        }
        let enc = part.trailing(t, 1).first().copied().unwrap_or(0);
        let nr_bits = enc & 0xff;
        let int_off = (enc >> 16) & 0xff;
        int_off != 0 || u64::from(nr_bits) != u64::from(t.size_type) * 8
    }

    /// The type `id` refers to after TYPEDEF, CONST, VOLATILE, RESTRICT and TYPE_TAG.
    fn strip(&self, mut id: u32, depth: u32) -> Option<(&Part, &TypeRec)> {
        for _ in depth..=MAX_DEPTH {
            let (part, t) = self.get(id)?;
            match t.kind() {
                TYPEDEF | CONST | VOLATILE | RESTRICT | TYPE_TAG => id = t.size_type,
                _ => return Some((part, t)),
            }
        }
        None
    }

    /// Byte size of type `id`, and whether it is a scalar.
    fn size_of(&self, id: u32, depth: u32) -> Option<(u32, bool)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let (part, t) = self.strip(id, depth)?;
        match t.kind() {
            INT | ENUM | ENUM64 | FLOAT => Some((t.size_type, true)),
            PTR => Some((8, true)),
            STRUCT | UNION => Some((t.size_type, false)),
            ARRAY => {
                let a = part.trailing(t, 3);
                let (elem, nelems) = (*a.first()?, *a.get(2)?);
                let (elem_size, _) = self.size_of(elem, depth + 1)?;
                Some((elem_size.checked_mul(nelems)?, false))
            }
            _ => None,
        }
    }

    fn find_param(&self, func_name: &str, param: &str) -> Result<Found, Miss> {
        let (_, func) = self.lookup(func_name, |p| &p.funcs).ok_or(Miss::NoOwner)?;
        let (part, proto) = self.get(func.size_type).ok_or(Miss::NoOwner)?;
        if proto.kind() != FUNC_PROTO {
            return Err(Miss::NoOwner);
        }
        let (index, p) = part
            .trailing(proto, 2 * proto.vlen())
            .chunks_exact(2)
            .enumerate()
            .find(|(_, p)| self.str_at(p[0]) == Some(param.as_bytes()))
            .ok_or(Miss::NoMember)?;
        let (size, scalar) = self.size_of(p[1], 0).ok_or(Miss::NoSize)?;
        Ok(Found {
            off: u32::try_from(index).map_err(|_| Miss::NoMember)?,
            size,
            scalar,
        })
    }
}

/// The raw `.BTF` section of an ELF object.
pub fn elf_btf_section(bytes: &[u8]) -> anyhow::Result<&[u8]> {
    let file = object::File::parse(bytes).context("not a readable ELF object")?;
    let section = file
        .section_by_name(".BTF")
        .ok_or_else(|| anyhow!("the ELF object has no .BTF section (compile with -g)"))?;
    section.data().context("reading the .BTF section")
}

/// Parses one blob whose type ids and string offsets continue after `base`.
fn parse_part(data: &[u8], base: &[Arc<Part>]) -> anyhow::Result<Part> {
    let word = |at: usize| -> anyhow::Result<u32> {
        let b = data
            .get(at..at + 4)
            .ok_or_else(|| anyhow!("BTF header truncated ({} bytes)", data.len()))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let head = data
        .get(..4)
        .ok_or_else(|| anyhow!("BTF header truncated ({} bytes)", data.len()))?;
    let magic = u16::from_le_bytes([head[0], head[1]]);
    if magic == MAGIC.swap_bytes() {
        bail!("big-endian BTF is not supported");
    }
    if magic != MAGIC {
        bail!("not BTF: magic {magic:#06x}, expected {MAGIC:#06x}");
    }
    if head[2] != 1 {
        bail!("unsupported BTF version {} (expected 1)", head[2]);
    }
    let hdr_len = word(4)? as usize;
    if hdr_len < HEADER_LEN {
        bail!("BTF header length {hdr_len} is shorter than {HEADER_LEN}");
    }
    let (type_off, type_len) = (word(8)? as usize, word(12)? as usize);
    let (str_off, str_len) = (word(16)? as usize, word(20)? as usize);
    let section = |what: &str, off: usize, len: usize| -> anyhow::Result<&[u8]> {
        hdr_len
            .checked_add(off)
            .and_then(|start| data.get(start..start.checked_add(len)?))
            .ok_or_else(|| {
                anyhow!(
                    "BTF {what} section ({len} bytes at {off} after the header) runs past the end \
                     of the data ({} bytes)",
                    data.len()
                )
            })
    };
    let type_sec = section("type", type_off, type_len)?;
    let strings = section("string", str_off, str_len)?.to_vec();
    if type_off % 4 != 0 || type_len % 4 != 0 {
        bail!("BTF type section is not word aligned (offset {type_off}, length {type_len})");
    }

    let (first_id, str_start) = match base.last() {
        Some(b) => (b.last_id().saturating_add(1), b.str_end()),
        None => (1, 0),
    };
    if base.is_empty() && strings.first() != Some(&0) {
        bail!("BTF string section does not start with the empty string");
    }
    if !strings.is_empty() && strings.last() != Some(&0) {
        bail!("BTF string section is not NUL-terminated");
    }
    let str_end = u32::try_from(strings.len())
        .ok()
        .and_then(|n| str_start.checked_add(n))
        .ok_or_else(|| anyhow!("BTF string sections are larger than 4 GiB"))?;

    let words: Vec<u32> = type_sec
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut types = Vec::new();
    let mut pos = 0usize;
    while pos < words.len() {
        let id = u64::from(first_id) + types.len() as u64;
        let rec = words
            .get(pos..pos + 3)
            .ok_or_else(|| anyhow!("BTF type {id}: record truncated at the end of the section"))?;
        let mut t = TypeRec {
            name_off: rec[0],
            info: rec[1],
            size_type: rec[2],
            extra: 0,
        };
        let extra = trailing_words(t.kind(), t.vlen()).ok_or_else(|| {
            anyhow!(
                "BTF type {id}: unknown kind {} (BTF from a newer kernel than this reader knows)",
                t.kind()
            )
        })? as usize;
        let end = pos + 3 + extra;
        if end > words.len() {
            bail!(
                "BTF type {id} ({}): record runs past the end of the type section",
                kind_name(t.kind())
            );
        }
        t.extra = u32::try_from(pos + 3).context("BTF type section too large")?;
        types.push(t);
        pos = end;
    }
    let last_id = u64::from(first_id) + types.len() as u64 - 1;
    if types.len() as u64 + u64::from(first_id) > u64::from(u32::MAX) {
        bail!("BTF has too many types");
    }

    let mut part = Part {
        first_id,
        str_start,
        strings,
        words,
        types,
        composites: HashMap::new(),
        funcs: HashMap::new(),
        enums: HashMap::new(),
    };
    validate(&part, str_end, last_id)?;
    index(&mut part, base);
    Ok(part)
}

/// Checks every string offset and type id of `part` so lookups can trust them.
fn validate(part: &Part, str_end: u32, last_id: u64) -> anyhow::Result<()> {
    for (i, t) in part.types.iter().enumerate() {
        let id = u64::from(part.first_id) + i as u64;
        let kind = t.kind();
        let what = || format!("BTF type {id} ({})", kind_name(kind));
        let name = |off: u32| -> anyhow::Result<()> {
            if off >= str_end {
                bail!(
                    "{}: name offset {off} is outside the string section",
                    what()
                );
            }
            Ok(())
        };
        let ty = |tid: u32| -> anyhow::Result<()> {
            if u64::from(tid) > last_id {
                bail!(
                    "{}: refers to type {tid}, past the last type {last_id}",
                    what()
                );
            }
            Ok(())
        };
        name(t.name_off)?;
        let vlen = t.vlen();
        let extra = part.trailing(t, trailing_words(kind, vlen).unwrap_or(0));
        match kind {
            PTR | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | VAR | DECL_TAG | TYPE_TAG => {
                ty(t.size_type)?
            }
            ARRAY => {
                for &tid in extra.iter().take(2) {
                    ty(tid)?;
                }
            }
            STRUCT | UNION => {
                for m in extra.chunks_exact(3) {
                    name(m[0])?;
                    ty(m[1])?;
                }
            }
            ENUM | ENUM64 => {
                for e in extra.chunks_exact(if kind == ENUM { 2 } else { 3 }) {
                    name(e[0])?;
                }
            }
            FUNC_PROTO => {
                ty(t.size_type)?;
                for p in extra.chunks_exact(2) {
                    name(p[0])?;
                    ty(p[1])?;
                }
            }
            DATASEC => {
                for v in extra.chunks_exact(3) {
                    ty(v[0])?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Fills the name indexes of `part` (names may live in the base's strings).
fn index(part: &mut Part, base: &[Arc<Part>]) {
    let name_of = |p: &Part, off: u32| -> Option<Box<[u8]>> {
        let (strings, start) = if off >= p.str_start {
            (&p.strings, p.str_start)
        } else {
            let b = base
                .iter()
                .rev()
                .find(|b| off >= b.str_start && off < b.str_end())?;
            (&b.strings, b.str_start)
        };
        let s = strings.get((off - start) as usize..)?;
        let s = s.get(..s.iter().position(|&b| b == 0)?)?;
        (!s.is_empty()).then(|| s.into())
    };
    let mut composites: HashMap<Box<[u8]>, u32> = HashMap::new();
    let mut funcs: HashMap<Box<[u8]>, u32> = HashMap::new();
    let mut enums: HashMap<Box<[u8]>, u32> = HashMap::new();
    for (i, t) in part.types.iter().enumerate() {
        let map = match t.kind() {
            STRUCT | UNION => &mut composites,
            FUNC => &mut funcs,
            ENUM | ENUM64 => &mut enums,
            _ => continue,
        };
        let Some(name) = name_of(part, t.name_off) else {
            continue;
        };
        let id = part.first_id + i as u32;
        let vlen = t.vlen();
        map.entry(name)
            .and_modify(|old| {
                // Keep the first definition with members; an empty one is only a stand-in.
                let old_empty = part
                    .types
                    .get((*old - part.first_id) as usize)
                    .is_some_and(|o| o.vlen() == 0);
                if old_empty && vlen > 0 {
                    *old = id;
                }
            })
            .or_insert(id);
    }
    part.composites = composites;
    part.funcs = funcs;
    part.enums = enums;
}

/// Every [`FIELDS`] entry resolved against the running kernel's BTF.
#[derive(Clone, Debug, Default)]
pub struct Resolution {
    /// The `OFFSETS` map value: found fields are marked known.
    pub offsets: KernelOffsets,
    /// `(field id, reason)` for every field not found, in id order.
    pub missing: Vec<(usize, String)>,
}

/// Resolves every field of [`FIELDS`]: struct members and function parameters are looked up in
/// `module` (amdgpu's split BTF, which sees vmlinux's types) when given, else in `vmlinux` (amdgpu
/// built in). Members of aggregate type (e.g. `queue.properties`) get size 0: only their offset
/// is used.
pub fn resolve(vmlinux: &Btf, module: Option<&Btf>) -> Resolution {
    let btf = module.unwrap_or(vmlinux);
    let where_ = if module.is_some() {
        " (searched vmlinux and amdgpu BTF)"
    } else {
        " (no amdgpu module BTF: /sys/kernel/btf/amdgpu missing)"
    };
    let mut res = Resolution::default();
    for f in FIELDS.iter() {
        let (owner, member) = (f.owner, f.member);
        let older = gpreempt_common::kprobe::OLDER_OWNERS
            .iter()
            .find(|(new, _)| *new == owner)
            .map(|(_, old)| *old);
        let found = match f.source {
            FieldSource::Member => match (btf.find_member(owner, member), older) {
                // A kernel from before the rename.
                (Err(Miss::NoOwner), Some(old)) => btf.find_member(old, member),
                (r, _) => r,
            }
            .map_err(|miss| match miss {
                Miss::NoOwner if older.is_some() => format!(
                    "struct {owner} (or {}) not found in BTF{where_}",
                    older.unwrap_or_default()
                ),
                Miss::NoOwner => format!("struct {owner} not found in BTF{where_}"),
                Miss::NoMember => format!("struct {owner} has no member {member}"),
                Miss::Bitfield => format!("{owner}.{member} is a bitfield"),
                Miss::NoSize => format!("{owner}.{member} has a type of unknown size"),
            }),
            FieldSource::Param => btf.find_param(owner, member).map_err(|miss| match miss {
                Miss::NoOwner => format!("function {owner} not found in BTF{where_}"),
                Miss::NoMember | Miss::Bitfield => {
                    format!("function {owner} has no parameter {member}")
                }
                Miss::NoSize => format!("parameter {member} of {owner} has a type of unknown size"),
            }),
        };
        match found {
            Ok(found) => {
                let size = if found.scalar {
                    u8::try_from(found.size).unwrap_or(0)
                } else {
                    0
                };
                res.offsets.set(f.id, found.off, size);
            }
            Err(reason) => res.missing.push((f.id, reason)),
        }
    }
    res
}

/// Reads `<root>/sys/kernel/btf/vmlinux` and, when present, `<root>/sys/kernel/btf/amdgpu` (split
/// on vmlinux; `None` when absent: amdgpu not loaded, built in, or built without BTF).
pub fn load_system(root: &Path) -> anyhow::Result<(Btf, Option<Btf>)> {
    let dir = root.join("sys/kernel/btf");
    let vpath = dir.join("vmlinux");
    let data = match std::fs::read(&vpath) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "{} is missing: this kernel was built without CONFIG_DEBUG_INFO_BTF, so kernel struct \
             offsets cannot be resolved",
            vpath.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("reading {}", vpath.display())),
    };
    let vmlinux = Btf::parse(&data).with_context(|| format!("parsing {}", vpath.display()))?;
    let module = load_module(root, &vmlinux, "amdgpu")?;
    Ok((vmlinux, module))
}

/// A loaded module's split BTF under `root` (/sys/kernel/btf/NAME), None where it has none.
pub fn load_module(root: &Path, vmlinux: &Btf, name: &str) -> anyhow::Result<Option<Btf>> {
    let mpath = root.join("sys/kernel/btf").join(name);
    match std::fs::read(&mpath) {
        Ok(d) => Ok(Some(
            Btf::parse_split(&d, vmlinux)
                .with_context(|| format!("parsing {}", mpath.display()))?,
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", mpath.display())),
    }
}

#[cfg(test)]
mod tests;
