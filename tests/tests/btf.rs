//! Run-time BTF resolution against real compiler output and the running kernel.
//!
//! `tests/btf/kfd-6.14.c` and `kfd-6.18.c` model the amdkfd structs and prototypes of two kernel
//! versions whose fields moved (docs/kfd.md). Each is compiled with `clang -g -target bpf`
//! for its BTF, and with the host `cc` into `truth.c`, which prints `offsetof`/`sizeof` for every
//! field: `resolve` must agree with the compiler exactly. Then the real `/sys/kernel/btf/vmlinux`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use gpreempt_common::kprobe::{field, FieldSource, FIELDS};
use gpreempt_user::observe::btf::{self, Btf, Resolution};
use tests::TempDir;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("btf")
}

/// clang that can target BPF: `cargo xtask setup` installs clang-22 (the LLVM of the eBPF
/// toolchain). Missing clang is a failure, not a skip.
fn clang() -> PathBuf {
    for c in ["clang-22", "/usr/lib/llvm-22/bin/clang", "clang"] {
        let ok = Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return PathBuf::from(c);
        }
    }
    panic!("no clang found (clang-22, /usr/lib/llvm-22/bin/clang, clang): run `cargo xtask setup`");
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// What the compiler says: `"owner.member" -> (offset or index, size)`, for members and params.
type Truth = HashMap<String, (u32, u32)>;

/// One model compiled both ways.
struct Version {
    name: &'static str,
    /// The `.o` file's raw bytes.
    object: Vec<u8>,
    btf: Btf,
    truth: Truth,
    res: Resolution,
}

fn build(tmp: &TempDir, name: &'static str) -> Version {
    let src = src_dir().join(format!("kfd-{name}.c"));
    let obj = tmp.path(&format!("kfd-{name}.o"));
    run(Command::new(clang())
        .args([
            "-g",
            "-O2",
            "-target",
            "bpf",
            "-std=gnu11",
            "-Wall",
            "-Werror",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&obj));
    let exe = tmp.path(&format!("truth-{name}"));
    run(Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror"])
        .arg(format!("-DKFD_SRC=\"kfd-{name}.c\""))
        .arg("-I")
        .arg(src_dir())
        .arg(src_dir().join("truth.c"))
        .arg("-o")
        .arg(&exe));
    let out = String::from_utf8(run(&mut Command::new(&exe))).expect("truth output");
    let mut truth = Truth::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.len(), 4, "truth line {line:?}");
        let num = |s: &str| s.parse::<u32>().expect(line);
        truth.insert(format!("{} {}", w[0], w[1]), (num(w[2]), num(w[3])));
    }
    let object = std::fs::read(&obj).expect("object");
    let btf = Btf::from_elf(&object).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let res = btf::resolve(&btf, None);
    Version {
        name,
        object,
        btf,
        truth,
        res,
    }
}

fn reason(res: &Resolution, id: usize) -> Option<&str> {
    res.missing
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, r)| r.as_str())
}

/// Every field agrees with the compiler: found exactly where `offsetof` put it with its `sizeof`
/// (aggregates: 0), or absent from both.
fn check_against_truth(v: &Version) {
    for f in FIELDS.iter() {
        let key = match f.source {
            FieldSource::Member => format!("member {}.{}", f.owner, f.member),
            FieldSource::Param => format!("param {}.{}", f.owner, f.member),
        };
        match v.truth.get(&key) {
            Some(&(off, size)) => {
                let size = if f.id == field::QUEUE_PROPERTIES {
                    assert!(size > 8, "{}: properties is the embedded struct", v.name);
                    0
                } else {
                    size
                };
                assert_eq!(
                    v.res.offsets.get(f.id),
                    Some((off, size as u8)),
                    "{}: {key} ({:?})",
                    v.name,
                    reason(&v.res, f.id)
                );
            }
            None => {
                let r = reason(&v.res, f.id)
                    .unwrap_or_else(|| panic!("{}: {key} absent but resolved", v.name));
                assert!(r.contains(f.owner), "{}: {key}: {r}", v.name);
            }
        }
    }
    assert_eq!(
        v.res.missing.len() + v.res.offsets.known.count_ones() as usize,
        field::COUNT
    );
}

#[test]
fn resolve_matches_the_compiler_across_versions() {
    let tmp = TempDir::new("btf-models");
    let old = build(&tmp, "6.14");
    let new = build(&tmp, "6.18");
    check_against_truth(&old);
    check_against_truth(&new);

    // pasid moved from kfd_process to kfd_process_device.
    let missing = |v: &Version| v.res.missing.iter().map(|(i, _)| *i).collect::<Vec<_>>();
    assert_eq!(missing(&old), [field::PDD_PASID], "{:?}", old.res.missing);
    assert_eq!(
        missing(&new),
        [field::PROCESS_PASID],
        "{:?}",
        new.res.missing
    );
    assert_eq!(
        reason(&new.res, field::PROCESS_PASID),
        Some("struct kfd_process has no member pasid")
    );
    assert_eq!(
        reason(&old.res, field::PDD_PASID),
        Some("struct kfd_process_device has no member pasid")
    );

    // Members that moved between the models resolve to different offsets.
    for id in [
        field::QUEUE_PROCESS,
        field::QUEUE_DEVICE,
        field::QUEUE_PIPE,
        field::QUEUE_QUEUE,
        field::PROPS_PRIORITY,
        field::PROPS_DOORBELL_OFF,
        field::PROCESS_LEAD_THREAD,
        field::NODE_ID,
        field::DQM_DEV,
        field::MES_ADD_DOORBELL,
    ] {
        let (a, b) = (old.res.offsets.get(id), new.res.offsets.get(id));
        assert!(
            a.is_some() && a != b,
            "{}: {a:?} vs {b:?}",
            FIELDS[id].member
        );
    }
    // Parameters found by name where the prototypes put them.
    let args = |v: &Version| {
        [
            field::ARG_UNMAP_FILTER,
            field::ARG_UNMAP_PARAM,
            field::ARG_EVICT_TRIGGER,
        ]
        .map(|id| v.res.offsets.get(id))
    };
    assert_eq!(args(&old), [Some((2, 4)), Some((3, 4)), Some((2, 4))]);
    assert_eq!(args(&new), [Some((1, 4)), Some((2, 4)), Some((1, 4))]);

    // The renumbered enum, a 64-bit enum, functions, a bitfield, an anonymous union, a type tag.
    let xgmi = |v: &Version| {
        v.btf
            .enum_value("kfd_queue_type", "KFD_QUEUE_TYPE_SDMA_XGMI")
    };
    assert_eq!((xgmi(&old), xgmi(&new)), (Some(4), Some(3)));
    assert_eq!(
        new.btf
            .enum_value("kfd_smi_mask64", "KFD_SMI_EVENT_ALL_PROCESS"),
        Some(1 << 40)
    );
    assert!(old.btf.has_function("mes_v11_0_add_hw_queue"));
    assert!(!old.btf.has_function("mes_v12_0_add_hw_queue"));
    assert!(new.btf.has_function("kfd_ioctl"));
    assert_eq!(new.btf.param("kfd_ioctl", "filep"), Some((0, 8)));
    for v in [&old, &new] {
        assert_eq!(v.btf.member("kobject", "state_in_sysfs"), None, "bitfield");
        assert_eq!(
            v.btf.member("file", "f_pipe"),
            Some((0, 8)),
            "anonymous union"
        );
        assert_eq!(
            v.btf.member("queue_properties", "read_ptr").map(|m| m.1),
            Some(8)
        );
    }
    assert_eq!(new.btf.member("queue_properties", "ring"), Some((16, 16)));
}

/// Lookups a corrupt blob might send astray.
fn exercise(btf: &Btf) {
    let _ = btf::resolve(btf, None);
    let _ = btf.member("file", "f_pipe");
    let _ = btf.member("kobject", "state_in_sysfs");
    let _ = btf.enum_value("kfd_queue_type", "KFD_QUEUE_TYPE_SDMA_XGMI");
    let _ = btf.param("kfd_ioctl", "arg");
}

#[test]
fn corrupt_compiler_btf_never_panics() {
    let tmp = TempDir::new("btf-corrupt");
    let v = build(&tmp, "6.18");
    let blob = btf::elf_btf_section(&v.object).expect(".BTF");
    let base = Btf::parse(blob).expect("whole blob");
    for len in (0..blob.len()).step_by(3) {
        assert!(Btf::parse(&blob[..len]).is_err(), "truncated to {len}");
    }
    let (mut ok, mut err) = (0, 0);
    for i in (0..blob.len()).step_by(5) {
        for x in [0xff, 0x80, 0x01] {
            let mut d = blob.to_vec();
            d[i] ^= x;
            match Btf::parse(&d) {
                Ok(btf) => {
                    ok += 1;
                    exercise(&btf);
                }
                Err(e) => {
                    err += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
            if let Ok(split) = Btf::parse_split(&d, &base) {
                exercise(&split);
            }
        }
    }
    println!(
        "{} bytes of BTF: {ok} corruptions parsed, {err} rejected",
        blob.len()
    );
    assert!(ok > 0 && err > 0);
}

#[test]
fn this_kernel_vmlinux_btf() {
    let t = Instant::now();
    let (vmlinux, module) = btf::load_system(Path::new("/")).expect("reading /sys/kernel/btf");
    println!(
        "parsed /sys/kernel/btf/vmlinux ({} types) in {:?} (this build's profile)",
        vmlinux.type_count(),
        t.elapsed()
    );
    let res = btf::resolve(&vmlinux, module.as_ref());
    let (tgid_off, tgid_size) = res.offsets.get(field::TASK_TGID).expect("task_struct.tgid");
    assert_eq!(tgid_size, 4);
    let task_size = vmlinux
        .struct_size("task_struct")
        .expect("task_struct size");
    assert!(
        tgid_off > 0 && tgid_off + 4 <= task_size,
        "{tgid_off} in {task_size}"
    );
    assert_eq!(
        vmlinux.member("task_struct", "pid").map(|m| m.0 + 4),
        Some(tgid_off),
        "tgid follows pid"
    );
    let (pd_off, pd_size) = res
        .offsets
        .get(field::FILE_PRIVATE_DATA)
        .expect("file.private_data");
    assert_eq!(pd_size, 8);
    let file_size = vmlinux.struct_size("file").expect("file size");
    assert!(
        pd_off % 8 == 0 && pd_off + 8 <= file_size,
        "{pd_off} in {file_size}"
    );
    match module {
        None => {
            // No amdgpu here: every amdkfd field is missing, saying why; the vmlinux ones (tgid,
            // private_data, the fd -> inode chain of the ioctl filter) resolve.
            let vmlinux_fields = |id: usize| {
                [field::TASK_TGID, field::FILE_PRIVATE_DATA].contains(&id)
                    || field::FILE_CHAIN & (1 << id) != 0
            };
            for f in FIELDS.iter() {
                if vmlinux_fields(f.id) {
                    assert!(
                        res.offsets.is_known(f.id),
                        "{f:?}: {:?}",
                        reason(&res, f.id)
                    );
                    continue;
                }
                let r = reason(&res, f.id).unwrap_or_else(|| panic!("{f:?} resolved"));
                assert!(r.contains("no amdgpu module BTF"), "{f:?}: {r}");
            }
            assert_eq!(res.missing.len(), field::COUNT - 11);
            // The sizes the filter's reads assume.
            for (id, size) in [
                (field::TASK_FILES, 8),
                (field::FILES_FDT, 8),
                (field::FDT_MAX_FDS, 4),
                (field::FDT_FD, 8),
                (field::FILE_INODE, 8),
                (field::INODE_RDEV, 4),
                (field::INODE_INO, 8),
                (field::INODE_SB, 8),
                (field::SB_DEV, 4),
            ] {
                assert_eq!(
                    res.offsets.get(id).map(|(_, s)| s),
                    Some(size),
                    "{:?}",
                    FIELDS[id]
                );
            }
        }
        Some(amdgpu) => {
            // amdgpu loaded with BTF: the queue identity fields must resolve.
            assert!(amdgpu.type_count() > vmlinux.type_count());
            assert!(
                res.offsets.is_known(field::QUEUE_PROPERTIES),
                "{:?}",
                res.missing
            );
            assert!(res.offsets.is_known(field::NODE_ID), "{:?}", res.missing);
        }
    }
}
