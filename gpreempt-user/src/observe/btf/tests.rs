//! BTF reader tests, on small hand-built BTF blobs.

use super::*;
use gpreempt_common::kprobe::field;

/// A tiny BTF writer: types are numbered in the order they are added.
struct W {
    strs: Vec<u8>,
    str_start: u32,
    words: Vec<u32>,
    next_id: u32,
}

impl W {
    fn new() -> W {
        W {
            strs: vec![0],
            str_start: 0,
            words: Vec::new(),
            next_id: 1,
        }
    }
    /// A writer for split BTF on top of what `base` wrote.
    fn split(base: &W) -> W {
        W {
            strs: Vec::new(),
            str_start: base.str_start + base.strs.len() as u32,
            words: Vec::new(),
            next_id: base.next_id,
        }
    }
    fn s(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let off = self.str_start + self.strs.len() as u32;
        self.strs.extend_from_slice(name.as_bytes());
        self.strs.push(0);
        off
    }
    fn t(&mut self, name: &str, kind: u32, kflag: bool, st: u32, extra: &[u32]) -> u32 {
        let vlen = match kind {
            STRUCT | UNION | DATASEC | ENUM64 => extra.len() / 3,
            ENUM | FUNC_PROTO => extra.len() / 2,
            _ => 0,
        } as u32;
        self.t_vlen(name, kind, kflag, vlen, st, extra)
    }
    fn t_vlen(
        &mut self,
        name: &str,
        kind: u32,
        kflag: bool,
        vlen: u32,
        st: u32,
        extra: &[u32],
    ) -> u32 {
        let n = self.s(name);
        let info = (kind << 24) | vlen | if kflag { 1 << 31 } else { 0 };
        self.words.extend_from_slice(&[n, info, st]);
        self.words.extend_from_slice(extra);
        self.next_id += 1;
        self.next_id - 1
    }
    fn int(&mut self, name: &str, size: u32) -> u32 {
        self.t(name, INT, false, size, &[(size * 8) | (1 << 24)])
    }
    /// STRUCT (or UNION) with `(name, type, bit offset)` members.
    fn comp(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
        let mut extra = Vec::new();
        for &(n, ty, off) in members {
            extra.extend_from_slice(&[self.s(n), ty, off]);
        }
        self.t(name, kind, false, size, &extra)
    }
    fn bytes_with_header(&self, hdr_len: u32) -> Vec<u8> {
        let type_len = self.words.len() as u32 * 4;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [hdr_len, 0, type_len, type_len, self.strs.len() as u32] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.resize(hdr_len as usize, 0);
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.strs);
        out
    }
    fn bytes(&self) -> Vec<u8> {
        self.bytes_with_header(HEADER_LEN as u32)
    }
}

/// One type of every kind, then a struct that uses several of them.
fn every_kind() -> W {
    let mut w = W::new();
    let int = w.int("int", 4); // 1
    let ptr = w.t("", PTR, false, int, &[]); // 2
    let arr = w.t("", ARRAY, false, 0, &[int, int, 4]); // 3
    let s = w.comp(STRUCT, "s", 8, &[("a", int, 0), ("b", int, 32)]); // 4
    w.comp(UNION, "u", 4, &[("x", int, 0)]); // 5
    let (a, b) = (w.s("A"), w.s("B"));
    w.t("e", ENUM, true, 4, &[a, 1, b, (-2i32) as u32]); // 6
    w.t("f", FWD, false, 0, &[]); // 7
    let td = w.t("t", TYPEDEF, false, int, &[]); // 8
    w.t("", VOLATILE, false, int, &[]); // 9
    w.t("", CONST, false, int, &[]); // 10
    w.t("", RESTRICT, false, ptr, &[]); // 11
    let (p0, p1) = (w.s("p0"), w.s("p1"));
    let proto = w.t("", FUNC_PROTO, false, int, &[p0, int, p1, ptr]); // 12
    w.t_vlen("fn", FUNC, false, 1, proto, &[]); // 13
    let var = w.t("v", VAR, false, int, &[1]); // 14
    w.t(".data", DATASEC, false, 4, &[var, 0, 4]); // 15
    w.t("double", FLOAT, false, 8, &[]); // 16
    w.t("tag", DECL_TAG, false, s, &[u32::MAX]); // 17
    let tagged = w.t("user", TYPE_TAG, false, ptr, &[]); // 18
    let (big, neg) = (w.s("BIG"), w.s("NEG"));
    w.t(
        "e64",
        ENUM64,
        true,
        8,
        &[big, 0, 1, neg, u32::MAX, u32::MAX],
    ); // 19
    w.comp(
        STRUCT,
        "after",
        40,
        &[
            ("m", td, 0),
            ("q", ptr, 64),
            ("r", arr, 128),
            ("tt", tagged, 256),
        ],
    ); // 20
    w
}

#[test]
fn every_kind_parses_and_is_skipped() {
    let btf = Btf::parse(&every_kind().bytes()).unwrap();
    assert_eq!(btf.type_count(), 20);
    assert_eq!(btf.member("after", "m"), Some((0, 4)));
    assert_eq!(btf.member("after", "q"), Some((8, 8)));
    assert_eq!(btf.member("after", "r"), Some((16, 16)));
    assert_eq!(btf.member("after", "tt"), Some((32, 8)));
    assert_eq!(btf.member("after", "nope"), None);
    assert_eq!(btf.member("s", "b"), Some((4, 4)));
    assert_eq!(btf.struct_size("s"), Some(8));
    assert_eq!(btf.member("u", "x"), Some((0, 4)));
    assert_eq!(btf.member("f", "x"), None, "FWD is not a struct");
    assert_eq!(btf.param("fn", "p0"), Some((0, 4)));
    assert_eq!(btf.param("fn", "p1"), Some((1, 8)));
    assert_eq!(btf.param("fn", "p2"), None);
    assert!(btf.has_function("fn"));
    assert!(!btf.has_function("s"));
    assert_eq!(btf.enum_value("e", "A"), Some(1));
    assert_eq!(btf.enum_value("e", "B"), Some(-2));
    assert_eq!(btf.enum_value("e", "C"), None);
    assert_eq!(btf.enum_value("e64", "BIG"), Some(1 << 32));
    assert_eq!(btf.enum_value("e64", "NEG"), Some(-1));
    // A longer header (newer kernels may append fields) is skipped by hdr_len.
    let btf = Btf::parse(&every_kind().bytes_with_header(32)).unwrap();
    assert_eq!(btf.member("after", "r"), Some((16, 16)));
}

#[test]
fn split_btf_continues_ids_and_strings() {
    let mut b = W::new();
    let int = b.int("int", 4);
    let u32_ = b.t("u32", TYPEDEF, false, int, &[]);
    let pid_name = b.s("pid");
    let task = b.comp(
        STRUCT,
        "task_struct",
        8,
        &[("pid", int, 0), ("tgid", int, 32)],
    );
    // A declaration only in the base, defined by the module.
    b.comp(STRUCT, "queue", 0, &[]);
    let base = Btf::parse(&b.bytes()).unwrap();
    assert_eq!(base.type_count(), 4);

    let mut m = W::split(&b);
    let ptr = m.t("", PTR, false, task, &[]);
    assert_eq!(ptr, 5, "ids continue after the base");
    let (n_lead, n_id) = (m.s("lead"), m.s("id"));
    assert_eq!(
        n_lead as usize,
        b.strs.len(),
        "own strings follow the base's"
    );
    // Member "pid" names a base string.
    let members = [n_lead, ptr, 0, n_id, u32_, 64, pid_name, int, 96];
    assert_eq!(m.t("queue", STRUCT, false, 16, &members), 6);
    let proto = m.t("", FUNC_PROTO, false, int, &[]);
    assert_eq!(m.t_vlen("kfd_ioctl", FUNC, false, 0, proto, &[]), 8);
    let module = Btf::parse_split(&m.bytes(), &base).unwrap();
    assert_eq!(module.type_count(), 8);
    // The kernel numbers a module's types after vmlinux's: that id is the attach target.
    assert_eq!(module.function_id("kfd_ioctl"), Some(8));
    assert_eq!(base.function_id("kfd_ioctl"), None);
    assert_eq!(module.member("queue", "lead"), Some((0, 8)));
    assert_eq!(module.member("queue", "id"), Some((8, 4)), "base typedef");
    assert_eq!(module.member("queue", "pid"), Some((12, 4)), "base string");
    assert_eq!(
        module.member("task_struct", "tgid"),
        Some((4, 4)),
        "base struct"
    );
    assert_eq!(
        base.member("queue", "id"),
        None,
        "the base alone has no definition"
    );
    // Resolution sees both: queue fields from the module, task_struct.tgid from the base.
    let res = resolve(&base, Some(&module));
    assert_eq!(res.offsets.get(field::TASK_TGID), Some((4, 4)));
    let reason = |id| {
        res.missing
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r.as_str())
    };
    assert_eq!(
        reason(field::QUEUE_PROCESS),
        Some("struct queue has no member process")
    );
    assert_eq!(
        reason(field::ARG_UNMAP_FILTER),
        Some("function pm_send_unmap_queue not found in BTF (searched vmlinux and amdgpu BTF)")
    );

    // A name offset past the module's strings is rejected.
    let mut bad = W::split(&b);
    bad.t("x", PTR, false, task, &[]);
    bad.words[0] = bad.str_start + 1000;
    let err = Btf::parse_split(&bad.bytes(), &base)
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the string section"), "{err}");
    // A type id past the module's last one is rejected.
    let mut bad = W::split(&b);
    bad.t("x", PTR, false, 7, &[]);
    let err = Btf::parse_split(&bad.bytes(), &base)
        .unwrap_err()
        .to_string();
    assert!(err.contains("refers to type 7"), "{err}");
}

#[test]
fn anonymous_members_are_searched() {
    let mut w = W::new();
    let int = w.int("int", 4);
    let ch = w.int("char", 1);
    let long = w.int("long", 8);
    let inner = w.comp(STRUCT, "", 16, &[("c", ch, 0), ("d", long, 64)]);
    let un = w.comp(UNION, "", 16, &[("b", int, 0), ("", inner, 0)]);
    let cun = w.t("", CONST, false, un, &[]);
    w.comp(
        STRUCT,
        "outer",
        40,
        &[("a", int, 0), ("", un, 64), ("", cun, 192)],
    );
    let btf = Btf::parse(&w.bytes()).unwrap();
    assert_eq!(btf.member("outer", "a"), Some((0, 4)));
    assert_eq!(btf.member("outer", "b"), Some((8, 4)));
    assert_eq!(btf.member("outer", "c"), Some((8, 1)));
    assert_eq!(btf.member("outer", "d"), Some((16, 8)));
    assert_eq!(btf.member("outer", ""), None);
    assert_eq!(btf.member("outer", "e"), None);
}

#[test]
fn bitfields_are_not_readable() {
    let mut w = W::new();
    let int = w.int("int", 4);
    let three = w.t("int", INT, false, 4, &[3]); // legacy encoding: 3 bits
    let (x, y, z, p) = (w.s("x"), w.s("y"), w.s("z"), w.s("pipe"));
    let q = w.s("queue");
    // kind_flag: offset = bitfield size << 24 | bit offset.
    w.t(
        "flags",
        STRUCT,
        true,
        8,
        &[x, int, 3 << 24, y, int, 32, z, int, 36],
    );
    w.t("queue", STRUCT, true, 8, &[p, int, 3 << 24, q, three, 32]);
    let btf = Btf::parse(&w.bytes()).unwrap();
    assert_eq!(btf.member("flags", "x"), None);
    assert_eq!(btf.member("flags", "y"), Some((4, 4)));
    assert_eq!(btf.member("flags", "z"), None, "not byte aligned");
    assert_eq!(
        btf.find_member("queue", "queue"),
        Err(Miss::Bitfield),
        "legacy"
    );
    let res = resolve(&btf, None);
    let reason = |id| {
        res.missing
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, r)| r.as_str())
    };
    assert_eq!(reason(field::QUEUE_PIPE), Some("queue.pipe is a bitfield"));
    assert_eq!(
        reason(field::QUEUE_QUEUE),
        Some("queue.queue is a bitfield")
    );
    assert_eq!(
        reason(field::QUEUE_PROPERTIES),
        Some("struct queue has no member properties")
    );
    assert_eq!(
        reason(field::PROCESS_LEAD_THREAD),
        Some(
            "struct kfd_process not found in BTF (no amdgpu module BTF: \
             /sys/kernel/btf/amdgpu missing)"
        )
    );
    assert_eq!(res.offsets.known, 0);
    assert_eq!(res.missing.len(), field::COUNT);
}

#[test]
fn type_cycles_end_lookups() {
    let mut w = W::new();
    // typedef 1 -> 2 -> 1; an anonymous struct containing itself; an array of itself.
    w.t("a", TYPEDEF, false, 2, &[]);
    w.t("b", TYPEDEF, false, 1, &[]);
    w.comp(STRUCT, "", 4, &[("", 3, 0)]);
    w.t("", ARRAY, false, 0, &[4, 4, 2]);
    w.comp(STRUCT, "s", 8, &[("m", 1, 0), ("", 3, 0), ("arr", 4, 32)]);
    // An anonymous struct whose eight anonymous members are all itself: 8^64 paths.
    let wide = w.next_id;
    w.comp(STRUCT, "", 4, &[("", wide, 0); 8]);
    w.comp(STRUCT, "fan", 4, &[("", wide, 0)]);
    let btf = Btf::parse(&w.bytes()).unwrap();
    let t = std::time::Instant::now();
    assert_eq!(btf.find_member("fan", "zz"), Err(Miss::NoMember));
    assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
    assert_eq!(btf.find_member("s", "m"), Err(Miss::NoSize));
    assert_eq!(btf.find_member("s", "arr"), Err(Miss::NoSize));
    assert_eq!(btf.find_member("s", "zz"), Err(Miss::NoMember));
}

#[test]
fn bad_headers_and_kinds_are_clear_errors() {
    let good = every_kind().bytes();
    let err = |data: &[u8]| Btf::parse(data).unwrap_err().to_string();
    assert!(err(&[]).contains("truncated"));
    let mut d = good.clone();
    d[0] = 0;
    assert!(err(&d).contains("not BTF"), "{}", err(&d));
    d[..2].copy_from_slice(&MAGIC.to_be_bytes());
    assert!(err(&d).contains("big-endian"));
    let mut d = good.clone();
    d[2] = 2;
    assert!(err(&d).contains("version 2"));
    let mut d = good.clone();
    d[4] = 8;
    assert!(err(&d).contains("header length"));
    // Type 1's info word: kind 25.
    let mut d = good.clone();
    d[HEADER_LEN + 7] = 25;
    let e = err(&d);
    assert!(e.contains("BTF type 1: unknown kind 25"), "{e}");
    // A struct whose vlen runs past the section.
    let mut w = W::new();
    w.t_vlen("s", STRUCT, false, 100, 4, &[]);
    assert!(err(&w.bytes()).contains("runs past the end of the type section"));
    assert!(Btf::from_elf(&good).is_err(), "raw BTF is not ELF");
}

/// Lookups a corrupt blob might send astray.
fn exercise(btf: &Btf) {
    for (s, m) in [
        ("after", "m"),
        ("after", "r"),
        ("s", "b"),
        ("u", "x"),
        ("", ""),
    ] {
        let _ = btf.member(s, m);
    }
    let _ = btf.param("fn", "p1");
    let _ = btf.has_function("fn");
    let _ = btf.enum_value("e", "B");
    let _ = btf.enum_value("e64", "NEG");
    let _ = resolve(btf, None);
    let _ = format!("{btf:?}");
}

#[test]
fn truncated_or_corrupt_input_never_panics() {
    let good = every_kind().bytes();
    for len in 0..good.len() {
        assert!(Btf::parse(&good[..len]).is_err(), "truncated to {len}");
    }
    let base = Btf::parse(&good).unwrap();
    let mut parsed = 0;
    for i in 0..good.len() {
        for v in [0x00, 0xff, 0x80, 0x01, 0x13, good[i] ^ 0x55] {
            let mut d = good.clone();
            d[i] = v;
            if let Ok(btf) = Btf::parse(&d) {
                parsed += 1;
                exercise(&btf);
            }
            if let Ok(btf) = Btf::parse_split(&d, &base) {
                exercise(&btf);
            }
        }
    }
    assert!(parsed > 0, "some corruptions (e.g. in names) still parse");
}

#[test]
fn load_system_reports_missing_btf() {
    let dir = std::env::temp_dir().join(format!("gpreempt-btf-unit-{}", std::process::id()));
    let btf_dir = dir.join("sys/kernel/btf");
    std::fs::create_dir_all(&btf_dir).unwrap();
    let err = format!("{:#}", load_system(&dir).unwrap_err());
    assert!(err.contains("CONFIG_DEBUG_INFO_BTF"), "{err}");
    std::fs::write(btf_dir.join("vmlinux"), every_kind().bytes()).unwrap();
    let (vmlinux, module) = load_system(&dir).unwrap();
    assert!(module.is_none());
    assert_eq!(vmlinux.member("s", "b"), Some((4, 4)));
    std::fs::write(btf_dir.join("amdgpu"), b"junk").unwrap();
    let err = format!("{:#}", load_system(&dir).unwrap_err());
    assert!(err.contains("amdgpu") && err.contains("not BTF"), "{err}");
    let mut m = W::split(&every_kind());
    m.comp(STRUCT, "kfd_node", 4, &[("id", 1, 0)]);
    std::fs::write(btf_dir.join("amdgpu"), m.bytes()).unwrap();
    let (_, module) = load_system(&dir).unwrap();
    assert_eq!(module.unwrap().member("kfd_node", "id"), Some((0, 4)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Before Linux 6.5 the gpu_id is `kfd_dev.id` (no `kfd_node`): the field resolves there, and a
/// kernel with neither names both.
#[test]
fn node_id_falls_back_to_kfd_dev_on_older_kernels() {
    let base = every_kind();
    let mut m = W::split(&base);
    let int = m.int("unsigned int", 4);
    m.comp(STRUCT, "kfd_dev", 16, &[("adev", int, 0), ("id", int, 64)]);
    let module = Btf::parse_split(&m.bytes(), &Btf::parse(&base.bytes()).unwrap()).unwrap();
    let vmlinux = Btf::parse(&base.bytes()).unwrap();
    let res = resolve(&vmlinux, Some(&module));
    assert!(
        res.offsets.known & (1 << field::NODE_ID) != 0,
        "{:?}",
        res.missing
    );
    assert_eq!(res.offsets.off[field::NODE_ID], 8);
    assert_eq!(res.offsets.size[field::NODE_ID], 4);
    let res = resolve(&vmlinux, None);
    let why = res
        .missing
        .iter()
        .find(|(i, _)| *i == field::NODE_ID)
        .map(|(_, r)| r.clone());
    assert!(
        why.as_deref()
            .is_some_and(|w| w.starts_with("struct kfd_node (or kfd_dev) not found in BTF")),
        "{why:?}"
    );
}
