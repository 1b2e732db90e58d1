//! fentry/fexit programs against a kernel module's BTF.
//!
//! A BTF-typed tracing program is verified against its target function's prototype, named by a
//! type id in some kernel BTF object. `kfd_ioctl` is in the amdgpu module's BTF, and the program
//! must then be loaded with that object's fd (`attach_btf_obj_fd`, Linux 5.11); aya 0.14 only
//! loads tracing programs against vmlinux. So these programs are loaded here: the same object
//! file parsed again with aya-obj, its map references pointed at the maps aya already created
//! (the programs share the ring buffer, configuration and counters with every other program),
//! then `BPF_PROG_LOAD` and `BPF_RAW_TRACEPOINT_OPEN` (a tracing program's link; closing it
//! detaches). While attached, the module cannot be unloaded (the kernel holds a reference).

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{maps::Map, Ebpf};
use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_btf_info, bpf_cmd, bpf_insn, bpf_prog_type,
};

/// Entry or exit of the target function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Entry,
    Exit,
}

impl Hook {
    fn attach_type(self) -> bpf_attach_type {
        match self {
            Hook::Entry => bpf_attach_type::BPF_TRACE_FENTRY,
            Hook::Exit => bpf_attach_type::BPF_TRACE_FEXIT,
        }
    }
}

/// The function a program attaches to: its type id in a kernel BTF object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub function: String,
    /// "vmlinux" or the module's name, as /sys/kernel/btf names it.
    pub btf_object: String,
    pub type_id: u32,
}

/// Fds of the maps aya created, by name, taken before anything takes a map out of [`Ebpf`].
pub struct MapFds(HashMap<String, OwnedFd>);

impl MapFds {
    pub fn of(ebpf: &Ebpf) -> Result<Self> {
        let mut out = HashMap::new();
        for (name, map) in ebpf.maps() {
            let fd = map_fd(map)
                .try_clone_to_owned()
                .with_context(|| format!("duplicating the fd of map {name}"))?;
            out.insert(name.to_string(), fd);
        }
        Ok(Self(out))
    }
}

fn map_fd(map: &Map) -> BorrowedFd<'_> {
    use Map::*;
    let data = match map {
        Array(m)
        | ArrayOfMaps(m)
        | BloomFilter(m)
        | CgroupArray(m)
        | CgroupStorage(m)
        | CgrpStorage(m)
        | CpuMap(m)
        | DevMap(m)
        | DevMapHash(m)
        | HashMap(m)
        | HashOfMaps(m)
        | InodeStorage(m)
        | LpmTrie(m)
        | LruHashMap(m)
        | PerCpuArray(m)
        | PerCpuCgroupStorage(m)
        | PerCpuHashMap(m)
        | PerCpuLruHashMap(m)
        | PerfEventArray(m)
        | ProgramArray(m)
        | Queue(m)
        | ReusePortSockArray(m)
        | RingBuf(m)
        | SockHash(m)
        | SockMap(m)
        | SkStorage(m)
        | Stack(m)
        | StackTraceMap(m)
        | Unsupported(m)
        | XskMap(m) => m,
    };
    data.fd().as_fd()
}

/// A loaded and attached program. Dropping it detaches and unloads.
#[derive(Debug)]
pub struct Attached {
    pub program: String,
    pub hook: Hook,
    _link: OwnedFd,
    _prog: OwnedFd,
}

/// The object's programs with their map references resolved to `maps`, ready to load. The
/// instructions carry the fd numbers: the fds stay open as long as this does.
pub struct Programs {
    obj: aya_obj::Object,
    _maps: MapFds,
}

impl Programs {
    /// [`Programs::relocate`] onto the maps `ebpf` created: call it before anything takes a
    /// map out of `ebpf`.
    pub fn of(ebpf: &Ebpf, object: &[u8]) -> Result<Self> {
        Self::relocate(object, MapFds::of(ebpf)?)
    }

    fn relocate(object: &[u8], maps: MapFds) -> Result<Self> {
        let mut obj = aya_obj::Object::parse(object).context("parsing the eBPF object")?;
        let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        let mut entries = Vec::new();
        for (name, m) in &obj.maps {
            let fd = maps
                .0
                .get(name)
                .ok_or_else(|| anyhow!("map {name} was not created by the loader"))?;
            entries.push((name.clone(), fd.as_raw_fd(), m.clone()));
        }
        obj.relocate_maps(
            entries
                .iter()
                .map(|(n, fd, m)| (n.as_str(), *fd as RawFd, m)),
            &text,
        )
        .context("resolving the programs' map references")?;
        obj.relocate_calls(&text)
            .context("linking the programs' function calls")?;
        Ok(Self { obj, _maps: maps })
    }

    fn instructions(&self, program: &str) -> Result<(&[bpf_insn], &std::ffi::CStr)> {
        let p = self
            .obj
            .programs
            .get(program)
            .ok_or_else(|| anyhow!("program {program} missing from the eBPF object"))?;
        let f = self
            .obj
            .functions
            .get(&p.function_key())
            .ok_or_else(|| anyhow!("program {program} has no code"))?;
        Ok((&f.instructions, &p.license))
    }

    /// Loads `program` against `target` (its BTF object found by name) and attaches it.
    pub fn attach(&self, program: &str, hook: Hook, target: &Target) -> Result<Attached> {
        let btf = kernel_btf(&target.btf_object)?;
        let prog = self
            .load(program, hook, btf.as_fd(), target)
            .map_err(|(io, log)| {
                anyhow!(
                    "the kernel refused {program} ({} of {} in {} BTF, type id {}): {io}{}{log}",
                    hook_name(hook),
                    target.function,
                    target.btf_object,
                    target.type_id,
                    if log.is_empty() { "" } else { ":\n" },
                )
            })?;
        // SAFETY: bpf_attr is plain data; zero is every field's "unset".
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // Name 0: the program's own attach target (a tracing program's).
        attr.raw_tracepoint.name = 0;
        attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
        let link = sys_bpf_fd(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr).map_err(|e| {
            anyhow!(
                "attaching {program} to {} ({}): {e}{}",
                target.function,
                hook_name(hook),
                attach_hint(&e)
            )
        })?;
        Ok(Attached {
            program: program.to_string(),
            hook,
            _link: link,
            _prog: prog,
        })
    }

    /// Loads `program` against `target` and unloads it: the verifier's verdict only, as
    /// "errno text: verifier log" (the log empty where the kernel refused before verifying).
    pub fn verify(&self, program: &str, hook: Hook, target: &Target) -> Result<(), String> {
        let btf = kernel_btf(&target.btf_object).map_err(|e| format!("{e:#}"))?;
        self.load(program, hook, btf.as_fd(), target)
            .map(drop)
            .map_err(|(io, log)| format!("{io}: {log}"))
    }

    /// `BPF_PROG_LOAD` of a tracing program; on a refusal, again for the verifier's log (the
    /// error, and the log's last lines: its conclusion).
    fn load(
        &self,
        program: &str,
        hook: Hook,
        btf: BorrowedFd<'_>,
        target: &Target,
    ) -> Result<OwnedFd, (std::io::Error, String)> {
        let (insns, license) = self
            .instructions(program)
            .map_err(|e| (std::io::Error::other(format!("{e:#}")), String::new()))?;
        let name: Vec<u8> = program.bytes().filter(|&b| b != 0).take(15).collect();
        let attempt = |log: &mut [u8]| -> std::io::Result<OwnedFd> {
            // SAFETY: bpf_attr is plain data; zero is every field's "unset".
            let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
            // SAFETY: the anonymous member that BPF_PROG_LOAD reads; every pointer stored in it
            // (instructions, license, log) outlives the syscall below.
            let u = unsafe { &mut attr.__bindgen_anon_3 };
            u.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
            u.expected_attach_type = hook.attach_type() as u32;
            u.insns = insns.as_ptr() as u64;
            u.insn_cnt = insns.len() as u32;
            u.license = license.as_ptr() as u64;
            for (d, s) in u.prog_name.iter_mut().zip(&name) {
                *d = *s as std::ffi::c_char;
            }
            u.attach_btf_id = target.type_id;
            u.__bindgen_anon_1.attach_btf_obj_fd = btf.as_raw_fd() as u32;
            if !log.is_empty() {
                u.log_level = 1;
                u.log_buf = log.as_mut_ptr() as u64;
                u.log_size = log.len() as u32;
            }
            sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr)
        };
        let first = match attempt(&mut []) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        let mut log = vec![0u8; 1 << 20];
        let text = match attempt(&mut log) {
            Ok(_) => String::new(), // passed the second time: report the first error alone
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let t = String::from_utf8_lossy(&log[..end]);
                let tail: Vec<&str> = t.lines().rev().take(8).collect();
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            }
        };
        Err((first, text))
    }
}

fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Entry => "fentry",
        Hook::Exit => "fexit",
    }
}

/// What an attach errno means for a user.
fn attach_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        // ENOTSUPP (524): no BPF trampoline (the architecture or build lacks direct calls).
        Some(524) | Some(libc::EOPNOTSUPP) => {
            ": this kernel has no BPF trampolines (CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS); the kprobe pair or the tracepoints stand in"
        }
        Some(libc::EPERM) => ": kernel lockdown (integrity) forbids fentry; the kprobe pair or the tracepoints stand in",
        Some(libc::EBUSY) => ": another trampoline user holds the function (e.g. a live-patch)",
        _ => "",
    }
}

/// An fd for the kernel BTF object named `name` ("vmlinux", or a module such as "amdgpu").
pub fn kernel_btf(name: &str) -> Result<OwnedFd> {
    let mut id = 0u32;
    loop {
        // SAFETY: bpf_attr is plain data; zero is every field's "unset".
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        attr.__bindgen_anon_6.__bindgen_anon_1.start_id = id;
        if let Err(e) = sys_bpf(bpf_cmd::BPF_BTF_GET_NEXT_ID, &mut attr) {
            if e.raw_os_error() == Some(libc::ENOENT) {
                bail!("no kernel BTF object named {name} (is the module loaded, with BTF?)");
            }
            return Err(e).context("listing kernel BTF objects (BPF_BTF_GET_NEXT_ID)");
        }
        // SAFETY: the kernel wrote next_id into this union member.
        id = unsafe { attr.__bindgen_anon_6.next_id };
        // SAFETY: as above, for BPF_BTF_GET_FD_BY_ID.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        attr.__bindgen_anon_6.__bindgen_anon_1.btf_id = id;
        let fd = match sys_bpf_fd(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr) {
            Ok(fd) => fd,
            // Gone between the two calls (a module unloaded, a program's BTF freed).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e).with_context(|| format!("opening BTF object {id}")),
        };
        let mut buf = [0u8; 64];
        // SAFETY: bpf_btf_info is plain data.
        let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
        info.name = buf.as_mut_ptr() as u64;
        info.name_len = buf.len() as u32;
        // SAFETY: as above, for BPF_OBJ_GET_INFO_BY_FD.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // `info` and `buf` outlive the call that writes them.
        attr.info.bpf_fd = fd.as_raw_fd() as u32;
        attr.info.info = &mut info as *mut bpf_btf_info as u64;
        attr.info.info_len = std::mem::size_of::<bpf_btf_info>() as u32;
        sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)
            .with_context(|| format!("reading BTF object {id}'s info"))?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if info.kernel_btf != 0 && &buf[..end] == name.as_bytes() {
            return Ok(fd);
        }
    }
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<i64> {
    // SAFETY: bpf(2) reads and writes at most size_of::<bpf_attr>() bytes of `attr`, a live,
    // exclusively borrowed value; the pointers the caller stored in it are valid for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_int,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr)?;
    let fd = RawFd::try_from(fd).map_err(|_| std::io::Error::other("bpf(2) returned no fd"))?;
    // SAFETY: these commands return a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vmlinux's BTF object is found by name; a name nothing has is an error that says so.
    #[test]
    fn finds_vmlinux_btf_by_name() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (bpf(2) BTF object listing)");
        }
        let fd = kernel_btf("vmlinux").expect("vmlinux BTF object");
        assert!(fd.as_raw_fd() >= 0);
        let e = kernel_btf("no-such-module").unwrap_err();
        assert!(format!("{e:#}").contains("no kernel BTF object named no-such-module"));
    }
}
