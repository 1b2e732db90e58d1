//! A hostile client of the emulator's /dev/kfd (tests/tests/security.rs runs it as root and as
//! uid 65534 inside `sim`). One line of output per step: `STEP RET` (RET: 0, or -errno).
//!
//! Usage: kfd-hostile fault-map FILE   MAP_MEMORY_TO_GPU whose device array lies in an untouched
//!                                     MAP_PRIVATE mapping of FILE; prints `map_memory RET MS`
//!        kfd-hostile alloc SIZE        one VRAM ALLOC of SIZE bytes on the first GPU; a small one
//!                                     (<= 64 MiB) is then mapped and written: `touched`
//!        kfd-hostile fill CHUNK [hold] VRAM ALLOCs of CHUNK bytes until one fails; prints
//!                                     `filled N RET`; `hold`: then waits for stdin to close

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, Write},
    os::fd::AsRawFd,
    time::Instant,
};

use gpreempt_common::kfd;

fn call<T>(fd: i32, cmd: u32, arg: &mut T) -> i64 {
    // SAFETY: `arg` is a live, exclusively borrowed struct of the size encoded in `cmd`.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) };
    if r < 0 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        i64::from(r)
    }
}

fn open_rw(path: &str) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| {
            eprintln!("kfd-hostile: open {path}: {e}");
            std::process::exit(1)
        })
}

/// The first GPU node's (gpu_id, render minor) from the topology.
fn first_gpu() -> (u32, u32) {
    let nodes = "/sys/class/kfd/kfd/topology/nodes";
    for n in 0..8 {
        let id: u32 = std::fs::read_to_string(format!("{nodes}/{n}/gpu_id"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if id == 0 {
            continue;
        }
        let props = std::fs::read_to_string(format!("{nodes}/{n}/properties")).unwrap_or_default();
        let minor = props
            .lines()
            .find_map(|l| l.strip_prefix("drm_render_minor "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(128);
        return (id, minor);
    }
    eprintln!("kfd-hostile: no GPU node in {nodes}");
    std::process::exit(1)
}

/// /dev/kfd with a VM acquired on the first GPU: (kfd, render node, gpu_id).
fn with_vm() -> (File, File, u32) {
    let kfd_file = open_rw("/dev/kfd");
    let (gpu_id, minor) = first_gpu();
    let render = open_rw(&format!("/dev/dri/renderD{minor}"));
    let mut vm = kfd::AcquireVmArgs {
        drm_fd: render.as_raw_fd() as u32,
        gpu_id,
    };
    let r = call(kfd_file.as_raw_fd(), kfd::cmd::ACQUIRE_VM, &mut vm);
    println!("acquire_vm {r}");
    (kfd_file, render, gpu_id)
}

/// One VRAM ALLOC: (RET, mmap_offset).
fn alloc(fd: i32, gpu_id: u32, size: u64, va: u64) -> (i64, u64) {
    let mut a = kfd::AllocMemoryOfGpuArgs {
        va_addr: va,
        size,
        gpu_id,
        flags: kfd::alloc_mem_flags::VRAM,
        ..Default::default()
    };
    let r = call(fd, kfd::cmd::ALLOC_MEMORY_OF_GPU, &mut a);
    (r, a.mmap_offset)
}

/// Maps a new BO through the render node and writes every page of it (a SIGBUS ends the
/// process, so `touched` is printed only when all of it is backed).
fn touch(render: &File, offset: u64, size: u64) {
    // SAFETY: a fresh shared mapping of `size` bytes of the render node at the BO's offset;
    // only this function writes it, within its length.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            render.as_raw_fd(),
            offset as libc::off_t,
        );
        if p == libc::MAP_FAILED {
            println!(
                "mmap -{}",
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
            );
            return;
        }
        for at in (0..size as usize).step_by(4096) {
            p.cast::<u8>().add(at).write_volatile(0x5a);
        }
        libc::munmap(p, size as usize);
    }
    println!("touched");
}

fn fault_map(file: &str) {
    let kfd_file = open_rw("/dev/kfd");
    let target = File::open(file).unwrap_or_else(|e| {
        eprintln!("kfd-hostile: open {file}: {e}");
        std::process::exit(1)
    });
    // SAFETY: a fresh private read-only mapping of one page of an open file; never dereferenced
    // here (only the emulator reads it, through the kernel).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            target.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        eprintln!(
            "kfd-hostile: mmap {file}: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(1);
    }
    let mut a = kfd::MapMemoryToGpuArgs {
        handle: 0,
        device_ids_array_ptr: p as u64,
        n_devices: 1,
        n_success: 0,
    };
    let t = Instant::now();
    let r = call(kfd_file.as_raw_fd(), kfd::cmd::MAP_MEMORY_TO_GPU, &mut a);
    println!("map_memory {r} {}", t.elapsed().as_millis());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize| -> u64 {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("kfd-hostile: argument {i} must be a number");
            std::process::exit(2)
        })
    };
    match args.get(1).map(String::as_str) {
        Some("fault-map") => fault_map(args.get(2).map_or("/dev/null", String::as_str)),
        Some("alloc") => {
            let (k, render, gpu) = with_vm();
            let size = num(2);
            let (r, offset) = alloc(k.as_raw_fd(), gpu, size, 0x7000_0000_0000);
            println!("alloc {r}");
            if r == 0 && size <= 64 << 20 {
                let _ = std::io::stdout().flush();
                touch(&render, offset, size);
            }
        }
        Some("fill") => {
            let (k, _r, gpu) = with_vm();
            let chunk = num(2);
            let mut n = 0u64;
            let ret = loop {
                let (r, _) = alloc(k.as_raw_fd(), gpu, chunk, 0x7000_0000_0000 + n * chunk);
                if r != 0 || n >= 100_000 {
                    break r;
                }
                n += 1;
            };
            println!("filled {n} {ret}");
            let _ = std::io::stdout().flush();
            if args.get(3).map(String::as_str) == Some("hold") {
                let mut line = String::new();
                let stdin = std::io::stdin();
                while stdin
                    .lock()
                    .read_line(&mut line)
                    .map(|n| n > 0)
                    .unwrap_or(false)
                {
                    line.clear();
                }
            }
        }
        _ => {
            eprintln!("usage: kfd-hostile (fault-map FILE | alloc SIZE | fill CHUNK [hold])");
            std::process::exit(2);
        }
    }
}
