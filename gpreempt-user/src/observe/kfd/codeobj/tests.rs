//! Kernel names read from emulated loader lists and code objects.

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
    let co =
        LoadedCodeObject::load(&["_Z6squarePfi", "void gemm<float, 64>(float const*)"]).unwrap();
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

/// A code object URI naming a FIFO nobody writes: refused at once (opening it would wait for a
/// writer forever, and `queues` with it).
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
