//! Issues KFD-encoded ioctls on any file, for the kernel tests and the benchmark.
//!
//! The ioctls fail with ENOTTY on a file that is not /dev/kfd; the syscall tracepoints still see
//! them, which is all the tracer tests need.
//!
//! Usage: kfd-poke PATH script   issue the scripted sequence (see `script`), after a line on stdin
//!        kfd-poke PATH script-x the same with type byte 'X' instead of 'K' (the kernel dispatches
//!                               KFD calls by nr alone: a caller hiding from a type-byte filter)
//!        kfd-poke PATH nv       NVIDIA RM escapes (see `script_nv`), after a line on stdin
//!        kfd-poke PATH diff     the differential sequence (see `differential`): one line per step
//!        kfd-poke PATH intrude PID  a second debugger: PTRACE_SEIZE and DBG_TRAP ENABLE on PID
//!        kfd-poke PATH flood N  issue N CREATE_QUEUE ioctls as fast as possible, after a line on stdin
//!        kfd-poke PATH bench N KIND  time N ioctls of KIND (kfd | other | k_out_of_range), print ns/op
//!        kfd-poke PATH escape   an offline workload (resnet50_b1024, emulated GPU 0) on a second
//!                               thread; each stdin line is a DBG_TRAP call on its own pid:
//!                               resume | disable | takeover | loop MS (see `escape`);
//!                               prints `kernels N` (dispatches it completed) at the end; EOF ends it
//! Each mode prints "ready" when the file is open, waits for one line on stdin, runs, prints
//! "done", then waits for stdin to close before exiting (so the fd stays checkable).

use std::{
    fs::OpenOptions,
    io::{BufRead, Write},
    os::fd::AsRawFd,
    time::Instant,
};

use gpreempt_common::kfd;

fn ioctl<T>(fd: i32, cmd: u32, arg: &mut T) -> i64 {
    // SAFETY: `arg` is a live, exclusively borrowed struct of the size encoded in `cmd`; the
    // kernel (or a stand-in file's driver) only accesses that many bytes.
    unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) as i64 }
}

/// An AQL queue on a GPU id no kernel or emulator has (0x1234): CREATE_QUEUE is EINVAL.
fn unknown_gpu_queue() -> kfd::CreateQueueArgs {
    kfd::CreateQueueArgs {
        ring_base_address: 0x7f00_0000_1000,
        write_pointer_address: 0x7f00_0000_2038,
        read_pointer_address: 0x7f00_0000_2080,
        ring_size: 65536,
        gpu_id: 0x1234,
        queue_type: kfd::queue_type::COMPUTE_AQL,
        queue_percentage: 100,
        queue_priority: 7,
        ..Default::default()
    }
}

/// DBG_TRAP ENABLE of `pid` with runtime info into `rinfo` and events to `ev`.
fn enable_args(pid: u32, rinfo: &mut kfd::RuntimeInfo, ev: i32) -> kfd::DbgTrapArgs {
    kfd::DbgTrapArgs::new(
        pid,
        kfd::DbgTrapEnableArgs {
            exception_mask: 0,
            rinfo_ptr: rinfo as *mut _ as u64,
            rinfo_size: std::mem::size_of::<kfd::RuntimeInfo>() as u32,
            dbg_fd: ev as u32,
        },
    )
}

/// The scripted sequence; tests/tests/trace.rs asserts exactly these values. `ty`: another
/// type byte for the KFD commands.
pub fn script(fd: i32, ty: Option<u8>) {
    let c = |cmd: u32| ty.map_or(cmd, |t| (cmd & !0xff00) | u32::from(t) << 8);
    let mut cq = kfd::CreateQueueArgs {
        eop_buffer_address: 0x7f00_0000_3000,
        eop_buffer_size: 4096,
        ctx_save_restore_address: 0x7f00_0000_4000,
        ctx_save_restore_size: 0x20_0000,
        ctl_stack_size: 0x1000,
        ..unknown_gpu_queue()
    };
    ioctl(fd, c(kfd::cmd::CREATE_QUEUE), &mut cq);
    // The pre-1.17 88-byte form (the kernel accepts both).
    cq.queue_priority = 15;
    ioctl(fd, c(kfd::cmd::CREATE_QUEUE_V1), &mut cq);
    let mut dq = kfd::DestroyQueueArgs {
        queue_id: 3,
        ..Default::default()
    };
    ioctl(fd, c(kfd::cmd::DESTROY_QUEUE), &mut dq);
    let mut queues = [1u32, 2, 5];
    let mut dbg = kfd::DbgTrapArgs::new(
        4242,
        kfd::DbgTrapSuspendQueuesArgs {
            exception_mask: kfd::ec_mask(kfd::ec::QUEUE_NEW),
            queue_array_ptr: queues.as_mut_ptr() as u64,
            num_queues: 3,
            grace_period: 100,
        },
    );
    ioctl(fd, c(kfd::cmd::DBG_TRAP), &mut dbg);
    // Not KFD: a terminal ioctl, and a 'K' ioctl outside the KFD ranges. Neither may be reported.
    let mut n: libc::c_int = 0;
    ioctl(fd, libc::FIONREAD as u32, &mut n);
    let mut junk = [0u8; 8];
    ioctl(fd, kfd::iowr(0x50, 8), &mut junk);
    let mut rt = kfd::RuntimeEnableArgs {
        r_debug: 0xdead_b000,
        mode_mask: 1,
        capabilities_mask: 0,
    };
    ioctl(fd, c(kfd::cmd::RUNTIME_ENABLE), &mut rt);
}

/// NVIDIA RM escapes with known handles; tests/tests/trace.rs asserts exactly these values.
pub fn script_nv(fd: i32) {
    use gpreempt_common::nv;
    let put = |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    // A compute TSG (engineType 1), NVOS64 as libcuda 13 does.
    let mut tsg = [0u8; 32];
    put(&mut tsg, nv::TSG_ENGINE_TYPE_AT, nv::ENGINE_TYPE_GRAPHICS);
    let mut a64 = [0u8; 48];
    put(&mut a64, nv::alloc::H_ROOT, 0xc1d0_0001);
    put(&mut a64, nv::alloc::H_OBJECT_PARENT, 0x5c00_0002);
    put(&mut a64, nv::alloc::H_OBJECT_NEW, 0x5c00_0010);
    put(
        &mut a64,
        nv::alloc::H_CLASS,
        nv::class::KEPLER_CHANNEL_GROUP_A,
    );
    put64(&mut a64, nv::alloc::P_ALLOC_PARMS, tsg.as_ptr() as u64);
    put(&mut a64, nv::alloc::NVOS64_PARAMS_SIZE, 32);
    ioctl(fd, nv::iowr(nv::nr::RM_ALLOC, 48), &mut a64);
    // A channel in it, NVOS21.
    let chan = [0u8; 32];
    let mut a21 = [0u8; 32];
    put(&mut a21, nv::alloc::H_ROOT, 0xc1d0_0001);
    put(&mut a21, nv::alloc::H_OBJECT_PARENT, 0x5c00_0010);
    put(&mut a21, nv::alloc::H_OBJECT_NEW, 0x5c00_0011);
    put(
        &mut a21,
        nv::alloc::H_CLASS,
        nv::class::HOPPER_CHANNEL_GPFIFO_A,
    );
    put64(&mut a21, nv::alloc::P_ALLOC_PARMS, chan.as_ptr() as u64);
    put(&mut a21, nv::alloc::NVOS21_PARAMS_SIZE, 32);
    ioctl(fd, nv::iowr(nv::nr::RM_ALLOC, 32), &mut a21);
    // A control on the subdevice: pause 2 channels, schedule-only.
    let mut params = [0u8; nv::disable_channels::SIZE];
    params[nv::disable_channels::B_DISABLE] = 1;
    put(&mut params, nv::disable_channels::NUM_CHANNELS, 2);
    params[nv::disable_channels::B_ONLY_DISABLE_SCHEDULING] = 1;
    let mut c = [0u8; 32];
    put(&mut c, nv::control::H_CLIENT, 0xc1d0_0001);
    put(&mut c, nv::control::H_OBJECT, 0x5c00_0003);
    put(&mut c, nv::control::CMD, nv::CTRL_FIFO_DISABLE_CHANNELS);
    put64(&mut c, nv::control::PARAMS, params.as_ptr() as u64);
    put(
        &mut c,
        nv::control::PARAMS_SIZE,
        nv::disable_channels::SIZE as u32,
    );
    ioctl(fd, nv::iowr(nv::nr::RM_CONTROL, 32), &mut c);
    // SET_TIMESLICE 200 us on the TSG (an 8-byte buffer: no more is read).
    let ts = 200u64.to_le_bytes();
    let mut c = [0u8; 32];
    put(&mut c, nv::control::H_CLIENT, 0xc1d0_0001);
    put(&mut c, nv::control::H_OBJECT, 0x5c00_0010);
    put(&mut c, nv::control::CMD, nv::CTRL_TSG_SET_TIMESLICE);
    put64(&mut c, nv::control::PARAMS, ts.as_ptr() as u64);
    put(&mut c, nv::control::PARAMS_SIZE, ts.len() as u32);
    ioctl(fd, nv::iowr(nv::nr::RM_CONTROL, 32), &mut c);
    // The channel freed.
    let mut f = [0u8; 16];
    put(&mut f, nv::free::H_ROOT, 0xc1d0_0001);
    put(&mut f, nv::free::H_OBJECT_PARENT, 0x5c00_0010);
    put(&mut f, nv::free::H_OBJECT_OLD, 0x5c00_0011);
    ioctl(fd, nv::iowr(nv::nr::RM_FREE, 16), &mut f);
    // An 'F' escape that is not RM alloc/free/control (NV_ESC_CARD_INFO 0xC8): not reported.
    let mut junk = [0u8; 8];
    ioctl(fd, nv::iowr(0xC8, 8), &mut junk);
}

/// `ioctl` with the kernel's answer as one number: the value, or -errno.
fn call<T>(fd: i32, cmd: u32, arg: &mut T) -> i64 {
    let r = ioctl(fd, cmd, arg);
    if r < 0 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        r
    }
}

/// One line of the differential sequence: the step, the answer, the outputs that matter.
/// GPU nodes of the KFD topology (a node whose gpu_id is not 0).
fn topology_gpus() -> u32 {
    let Ok(nodes) = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes") else {
        return 0;
    };
    nodes
        .flatten()
        .filter(|n| {
            std::fs::read_to_string(n.path().join("gpu_id"))
                .is_ok_and(|id| id.trim().parse::<u32>().is_ok_and(|id| id != 0))
        })
        .count() as u32
}

fn say(step: &str, ret: i64, outs: &[u64]) {
    let outs: Vec<String> = outs.iter().map(|v| format!("{v:#x}")).collect();
    println!("{step} {ret} {}", outs.join(" "));
}

/// The differential sequence (tests/tests/vm.rs runs it on the real 6.12 kernel and, on the
/// host, in `sim`, and compares the lines): every path a kernel without a GPU takes. A child opens
/// `path` (a KFD process of its own) and enables its runtime; this process then probes the
/// argument checks, the debug-trap permission rules, and a debugger's life cycle on the child.
pub fn differential(path: &str, fd: i32) {
    use kfd::{cmd, dbg_op, DbgTrapArgs};
    let mut ready = [0i32; 2];
    let mut hold = [0i32; 2];
    // SAFETY: pipe(2) fills the two-element arrays.
    unsafe {
        libc::pipe(ready.as_mut_ptr());
        libc::pipe(hold.as_mut_ptr());
    }
    let _ = std::io::stdout().flush();
    // SAFETY: single-threaded here; the child only makes system calls and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let f = OpenOptions::new().read(true).write(true).open(path);
        let cfd = f.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
        let mut rt = kfd::RuntimeEnableArgs {
            r_debug: 0x1000,
            mode_mask: kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK,
            capabilities_mask: 0,
        };
        let r1 = call(cfd, cmd::RUNTIME_ENABLE, &mut rt);
        let r2 = call(cfd, cmd::RUNTIME_ENABLE, &mut rt);
        let msg = [r1 as u8, r2 as u8];
        let mut b = [0u8; 1];
        // SAFETY: plain reads and writes of live buffers on the pipes.
        unsafe {
            libc::close(hold[1]);
            libc::write(ready[1], msg.as_ptr().cast(), 2);
            // Until the parent exits: the pipe's write end closes then.
            while libc::read(hold[0], b.as_mut_ptr().cast(), 1) > 0 {}
            libc::_exit(0);
        }
    }
    let mut msg = [0u8; 2];
    // SAFETY: reading into a live 2-byte buffer.
    unsafe {
        libc::close(ready[1]);
        libc::close(hold[0]);
        libc::read(ready[0], msg.as_mut_ptr().cast(), 2);
    }
    say("child_runtime_enable", i64::from(msg[0] as i8), &[]);
    say("child_runtime_enable_again", i64::from(msg[1] as i8), &[]);
    let c = child as u32;

    let mut v = kfd::GetVersionArgs::default();
    let r = call(fd, cmd::GET_VERSION, &mut v);
    say("get_version", r, &[u64::from(v.major_version)]);
    // TCGETS: nr 1 with no size: dispatched as GET_VERSION, nothing copied.
    let mut t = [0u8; 64];
    say("tcgets", call(fd, libc::TCGETS as u32, &mut t), &[]);
    let mut junk = [0u8; 8];
    say(
        "k_out_of_range",
        call(fd, kfd::iowr(0x50, 8), &mut junk),
        &[],
    );
    let mut cq = unknown_gpu_queue();
    say(
        "create_queue_unknown_gpu",
        call(fd, cmd::CREATE_QUEUE, &mut cq),
        &[],
    );
    let mut dq = kfd::DestroyQueueArgs {
        queue_id: 3,
        ..Default::default()
    };
    say(
        "destroy_queue_missing",
        call(fd, cmd::DESTROY_QUEUE, &mut dq),
        &[],
    );
    let mut uq = kfd::UpdateQueueArgs {
        queue_id: 3,
        ring_size: 65536,
        queue_percentage: 100,
        queue_priority: 7,
        ring_base_address: 0x7f00_0000_1000,
    };
    say(
        "update_queue_missing",
        call(fd, cmd::UPDATE_QUEUE, &mut uq),
        &[],
    );
    let mut ap = kfd::GetProcessAperturesNewArgs::default();
    let r = call(fd, cmd::GET_PROCESS_APERTURES_NEW, &mut ap);
    // The count is the process's devices, every GPU of the topology: 1 when it agrees (the VM
    // tier's kernel has no GPU, the emulator one).
    let agrees = ap.num_of_nodes == topology_gpus();
    say("apertures_count", r, &[u64::from(agrees)]);
    let mut rt = kfd::RuntimeEnableArgs {
        r_debug: 0,
        mode_mask: 0,
        capabilities_mask: 0,
    };
    say(
        "runtime_disable_never_enabled",
        call(fd, cmd::RUNTIME_ENABLE, &mut rt),
        &[],
    );

    let dbg = |a: &mut DbgTrapArgs| call(fd, cmd::DBG_TRAP, a);
    let enable = |ev: i32, rinfo: &mut kfd::RuntimeInfo, pid: u32| enable_args(pid, rinfo, ev);
    // SAFETY: eventfd(2) with no preconditions.
    let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    let mut rinfo = kfd::RuntimeInfo::default();
    let gone = 0x3fff_fff0u32;
    say(
        "enable_no_such_pid",
        dbg(&mut enable(ev, &mut rinfo, gone)),
        &[],
    );
    say(
        "enable_pid1_no_kfd",
        dbg(&mut enable(ev, &mut rinfo, 1)),
        &[],
    );
    say(
        "enable_not_traced",
        dbg(&mut enable(ev, &mut rinfo, c)),
        &[],
    );
    say(
        "disable_not_traced",
        dbg(&mut DbgTrapArgs::bare(c, dbg_op::DISABLE)),
        &[],
    );
    // SAFETY: PTRACE_SEIZE of our own child; no memory is passed.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, child, 0, 0) };
    say("ptrace_seize", seized, &[]);
    let mut q = [0u32; 1];
    let suspend = |n: u32, q: &mut [u32; 1]| {
        DbgTrapArgs::new(
            c,
            kfd::DbgTrapSuspendQueuesArgs {
                exception_mask: 0,
                queue_array_ptr: q.as_mut_ptr() as u64,
                num_queues: n,
                grace_period: 0,
            },
        )
    };
    say("suspend_before_enable", dbg(&mut suspend(0, &mut q)), &[]);
    let r = dbg(&mut enable(ev, &mut rinfo, c));
    say(
        "enable_traced",
        r,
        &[rinfo.r_debug, u64::from(rinfo.runtime_state)],
    );
    say("enable_again", dbg(&mut enable(ev, &mut rinfo, c)), &[]);
    let mut snap = [0u8; 64];
    let mut a = DbgTrapArgs::new(
        c,
        kfd::DbgTrapQueueSnapshotArgs {
            exception_mask: 0,
            snapshot_buf_ptr: snap.as_mut_ptr() as u64,
            num_queues: 0,
            entry_size: 0,
        },
    );
    let r = dbg(&mut a);
    let s: kfd::DbgTrapQueueSnapshotArgs = a.payload();
    say("queue_snapshot", r, &[u64::from(s.num_queues)]);
    say("suspend_zero_queues", dbg(&mut suspend(0, &mut q)), &[]);
    let mut a = DbgTrapArgs::new(
        c,
        kfd::DbgTrapResumeQueuesArgs {
            queue_array_ptr: q.as_mut_ptr() as u64,
            num_queues: 0,
            pad: 0,
        },
    );
    say("resume_zero_queues", dbg(&mut a), &[]);
    let mut a = DbgTrapArgs::new(
        c,
        kfd::DbgTrapSetExceptionsEnabledArgs { exception_mask: 0 },
    );
    say("set_exceptions_enabled", dbg(&mut a), &[]);
    let mut a = DbgTrapArgs::new(c, kfd::DbgTrapQueryDebugEventArgs::default());
    say("query_debug_event_none", dbg(&mut a), &[]);
    say(
        "disable",
        dbg(&mut DbgTrapArgs::bare(c, dbg_op::DISABLE)),
        &[],
    );
    say(
        "disable_again",
        dbg(&mut DbgTrapArgs::bare(c, dbg_op::DISABLE)),
        &[],
    );
    say(
        "enable_after_disable",
        dbg(&mut enable(ev, &mut rinfo, c)),
        &[],
    );
    // Detaching needs a ptrace-stop: interrupt, wait for it, detach.
    // SAFETY: ptrace requests on our own seized child, waitpid on it; no memory is passed.
    let r = unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, child, 0, 0);
        libc::waitpid(child, std::ptr::null_mut(), libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, child, 0, 0)
    };
    say("ptrace_detach", r, &[]);
    // Detached while enabled: the debugger is no longer its ptrace parent.
    let mut a = DbgTrapArgs::new(
        c,
        kfd::DbgTrapSetExceptionsEnabledArgs { exception_mask: 0 },
    );
    say("op_after_detach", dbg(&mut a), &[]);
    say(
        "disable_after_detach",
        dbg(&mut DbgTrapArgs::bare(c, dbg_op::DISABLE)),
        &[],
    );
    // SAFETY: closing our end of the pipe lets the child exit; then reap it.
    unsafe {
        libc::close(hold[1]);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
}

/// DBG_TRAP RESUME_QUEUES of its own queues (ids 0..4; ids it does not have come back
/// INVALID): the call's return.
fn resume_self(fd: i32, me: u32) -> i64 {
    let mut ids = [0u32, 1, 2, 3];
    let mut a = kfd::DbgTrapArgs::new(
        me,
        kfd::DbgTrapResumeQueuesArgs {
            queue_array_ptr: ids.as_mut_ptr() as u64,
            num_queues: ids.len() as u32,
            pad: 0,
        },
    );
    call(fd, kfd::cmd::DBG_TRAP, &mut a)
}

/// A held offline job getting out by itself (amdkfd lets a process debug-trap itself without
/// ptrace): the workload runs on a second thread (not the thread-group leader) while this one
/// answers stdin lines with DBG_TRAP calls on its own pid, printing `<op> <ret>` for each.
fn escape(path: &str) {
    use std::sync::{atomic::AtomicBool, Arc};
    let stop = Arc::new(AtomicBool::new(false));
    let opts = gpreempt_sim::workload::WorkloadOptions {
        profile: "resnet50_b1024".into(),
        mode: gpreempt_sim::workload::Mode::Offline,
        duration: std::time::Duration::from_secs(600),
        priority: 0,
        gpu: 0,
        second_queue_after: None,
        idle_queues: 0,
        warmup: std::time::Duration::ZERO,
        debug_api: true,
    };
    let (dev, flag) = (std::path::PathBuf::from(path), stop.clone());
    let work = std::thread::spawn(
        move || match gpreempt_sim::workload::run(&opts, &dev, &flag) {
            Ok(r) => println!("kernels {}", r.kernels),
            Err(e) => eprintln!("kfd-poke: workload: {e:#}"),
        },
    );
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kfd-poke: open {path}: {e}");
            std::process::exit(1);
        }
    };
    let fd = file.as_raw_fd();
    let me = std::process::id();
    println!("ready {me}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
        let op = line.trim().to_string();
        line.clear();
        let r = match op.as_str() {
            // Its own queues (ids 0..4; ids it does not have come back INVALID).
            "resume" => resume_self(fd, me),
            "disable" => {
                let mut a = kfd::DbgTrapArgs::bare(me, kfd::dbg_op::DISABLE);
                call(fd, kfd::cmd::DBG_TRAP, &mut a)
            }
            // DISABLE, then ENABLE a session of its own (again until it wins the race with a
            // debugger that takes the session back): the ENABLE's answer.
            "takeover" => {
                let mut r = 0;
                for _ in 0..50 {
                    let mut d = kfd::DbgTrapArgs::bare(me, kfd::dbg_op::DISABLE);
                    call(fd, kfd::cmd::DBG_TRAP, &mut d);
                    let mut rinfo = kfd::RuntimeInfo::default();
                    let mut p = [0i32; 2];
                    // SAFETY: pipe2 fills the two-int array it is given.
                    unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
                    let mut a = enable_args(me, &mut rinfo, p[1]);
                    r = call(fd, kfd::cmd::DBG_TRAP, &mut a);
                    if r == 0 {
                        break;
                    }
                }
                r
            }
            // RESUME_QUEUES on itself every 200 us for MS milliseconds: the number of calls.
            l if l.starts_with("loop ") => {
                let ms: u64 = l[5..].trim().parse().unwrap_or(0);
                let end = Instant::now() + std::time::Duration::from_millis(ms);
                let mut n = 0i64;
                while Instant::now() < end {
                    resume_self(fd, me);
                    n += 1;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                n
            }
            "" => continue,
            other => {
                eprintln!("kfd-poke: unknown escape op {other}");
                continue;
            }
        };
        println!("{op} {r}");
        let _ = std::io::stdout().flush();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = work.join();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: kfd-poke PATH (script | flood N | bench N KIND | escape)");
        std::process::exit(2);
    }
    if args[2] == "escape" {
        escape(&args[1]);
        return;
    }
    let file = match OpenOptions::new().read(true).write(true).open(&args[1]) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kfd-poke: open {}: {e}", args[1]);
            std::process::exit(1);
        }
    };
    let fd = file.as_raw_fd();
    let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("ready");
    let _ = std::io::stdout().flush();
    let _ = stdin.lock().read_line(&mut line);
    match args[2].as_str() {
        "script" => script(fd, None),
        "script-x" => script(fd, Some(b'X')),
        "nv" => script_nv(fd),
        "diff" => differential(&args[1], fd),
        "intrude" => {
            // A second debugger: ptrace, then the KFD ENABLE, on a target someone else debugs.
            let pid: i32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            // SAFETY: PTRACE_SEIZE names a pid only; no memory is passed.
            let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
            let r = if r < 0 {
                -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            } else {
                r
            };
            say("ptrace_seize", r, &[]);
            let mut rinfo = kfd::RuntimeInfo::default();
            // SAFETY: eventfd(2) with no preconditions.
            let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            let mut a = enable_args(pid as u32, &mut rinfo, ev);
            say("enable", call(fd, kfd::cmd::DBG_TRAP, &mut a), &[]);
        }
        "flood" => {
            let mut cq = kfd::CreateQueueArgs::default();
            for i in 0..n {
                cq.queue_priority = (i % 16) as u32;
                ioctl(fd, kfd::cmd::CREATE_QUEUE, &mut cq);
            }
        }
        "bench" => {
            let kind = args.get(4).map(String::as_str).unwrap_or("kfd");
            let mut cq = kfd::CreateQueueArgs::default();
            let mut n_int: libc::c_int = 0;
            let mut junk = [0u8; 8];
            let t = Instant::now();
            for _ in 0..n {
                match kind {
                    "kfd" => ioctl(fd, kfd::cmd::CREATE_QUEUE, &mut cq),
                    "k_out_of_range" => ioctl(fd, kfd::iowr(0x50, 8), &mut junk),
                    _ => ioctl(fd, libc::FIONREAD as u32, &mut n_int),
                };
            }
            let ns = t.elapsed().as_nanos() as f64 / n.max(1) as f64;
            println!("ns_per_op {ns:.1}");
        }
        other => {
            eprintln!("kfd-poke: unknown mode {other}");
            std::process::exit(2);
        }
    }
    println!("done");
    let _ = std::io::stdout().flush();
    // Stay alive (fd open) until the test closes stdin.
    let mut rest = String::new();
    while stdin
        .lock()
        .read_line(&mut rest)
        .map(|n| n > 0)
        .unwrap_or(false)
    {
        rest.clear();
    }
}
