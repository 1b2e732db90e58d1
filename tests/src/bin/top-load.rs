//! The `top` model + render loop under a synthetic load, for `cargo xtask bench`: what `top`
//! costs (CPU, memory) on a host with many KFD processes and queues.
//!
//! Usage: top-load [--procs N] [--queues-per-proc M] [--seconds S] [--hz H] [--gpus G]
//!                 [--churn PCT]
//!
//! The state is built only through `State::apply`, from what the watcher would hand it: the
//! topology, `/proc` facts of each process and a CREATE_QUEUE event per queue. Then, at `--hz`,
//! each tick does what the watcher and `top` do on their default intervals:
//!
//! - churn: PCT % of the queues per second are destroyed and new ones created (ioctl events);
//! - every 500 ms (the sampler's default): the dispatch ids of every live AQL queue;
//! - every 1 s (the hqds and reconcile defaults): `hqds` with every GPU's 32 slots holding
//!   register images of some of its queues, a sysfs snapshot of all processes, and a Tick;
//! - one frame, as `top` draws it (`tui::frame`: page size, selection, screen), through a crossterm
//!   backend writing to a sink on a fixed 160x48 viewport, so the escape sequences are produced.
//!
//! It sleeps to absolute deadlines between ticks and prints one JSON line: CPU (user + sys over
//! wall) as % of one core, time per tick (model, render, and the synthetic driver itself), peak
//! RSS and RSS after building the state. Numbers are not judged here: `cargo xtask bench` does.

use std::{
    collections::VecDeque,
    io,
    time::{Duration, Instant},
};

use gpreempt_common::kfd::{self, cmd, gfx9_hqd as reg, queue_type, DOORBELL_PROCESS_SLICE_BYTES};
use gpreempt_user::{
    clock::monotonic_ns,
    observe::events::{Event, IoctlEvent, KfdCall, Origin},
    observe::kfd::{
        debugfs::{HqdNode, HqdSlot, Regs},
        sysfs::{GpuNode, ProcSnapshot, SysProc, SysQueue},
    },
    observe::model::{SampleRead, State, Update},
    observe::procinfo::ProcInfo,
    tui::app::App,
};
use ratatui::{backend::CrosstermBackend, layout::Rect, Terminal, TerminalOptions, Viewport};
use serde_json::json;

const WIDTH: u16 = 160;
const HEIGHT: u16 = 48;
/// Compute HQD slots per GPU (one XCC, 4 pipes x 8 queues).
const SLOTS: u32 = 32;
const RING_SIZE: u32 = 0x1_0000;
/// KFD hands out queue ids below this per process.
const MAX_QID: u32 = kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS;

struct Args {
    procs: u32,
    queues_per_proc: u32,
    seconds: f64,
    hz: f64,
    gpus: u32,
    /// Queues replaced per second, % of all queues.
    churn: f64,
}

fn usage() -> ! {
    eprintln!(
        "usage: top-load [--procs N] [--queues-per-proc M] [--seconds S] [--hz H] [--gpus G] \
         [--churn PCT-PER-SECOND]"
    );
    std::process::exit(2)
}

fn value<T: std::str::FromStr>(flag: &str, v: &str) -> T {
    v.parse().unwrap_or_else(|_| {
        eprintln!("top-load: bad value {v:?} for {flag}");
        usage()
    })
}

fn parse_args() -> Args {
    let mut a = Args {
        procs: 1000,
        queues_per_proc: 10,
        seconds: 10.0,
        hz: 10.0,
        gpus: 8,
        churn: 1.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(v) = it.next() else { usage() };
        match flag.as_str() {
            "--procs" => a.procs = value(&flag, &v),
            "--queues-per-proc" => a.queues_per_proc = value(&flag, &v),
            "--seconds" => a.seconds = value(&flag, &v),
            "--hz" => a.hz = value(&flag, &v),
            "--gpus" => a.gpus = value(&flag, &v),
            "--churn" => a.churn = value(&flag, &v),
            _ => usage(),
        }
    }
    if a.gpus == 0 || a.hz <= 0.0 || a.seconds <= 0.0 || a.queues_per_proc >= MAX_QID / 2 {
        usage()
    }
    a
}

fn gpu_id(g: u32) -> u32 {
    0x1000 + g * 0x111
}

fn pid_of(i: u32) -> u32 {
    10_000 + i
}

/// A queue as the driver (the synthetic kernel) knows it.
#[derive(Clone, Copy)]
struct DrvQueue {
    pid: u32,
    qid: u32,
    gpu: u32,
    ring: u64,
    rptr: u64,
    wptr: u64,
    /// Absolute doorbell dword index (what the HQD's DOORBELL_CONTROL holds).
    doorbell_dw: u32,
}

impl DrvQueue {
    fn new(proc_index: u32, qid: u32, gpus: u32) -> Self {
        let pid = pid_of(proc_index);
        let gpu = (proc_index + qid) % gpus;
        // Distinct per queue (ids < 1024 fit in 10 bits).
        let ring = 0x7000_0000_0000 + (u64::from(proc_index) << 28) + (u64::from(qid) << 16);
        let ptrs = 0x7e00_0000_0000 + (u64::from(proc_index) << 24) + (u64::from(qid) << 12);
        let slice = u64::from(proc_index) * DOORBELL_PROCESS_SLICE_BYTES;
        Self {
            pid,
            qid,
            gpu,
            ring,
            rptr: ptrs + 0x80,
            wptr: ptrs + 0x38,
            doorbell_dw: ((slice + u64::from(qid) * 8) / 4) as u32,
        }
    }

    fn doorbell_offset(&self) -> u64 {
        let in_slice = (u64::from(self.doorbell_dw) * 4) & (DOORBELL_PROCESS_SLICE_BYTES - 1);
        kfd::doorbell_mmap_offset(gpu_id(self.gpu), in_slice)
    }

    /// The HQD register image of this queue mapped in a slot.
    fn regs(&self, wptr_packets: u64) -> Regs {
        let mut r = Regs::mapped(
            self.ring,
            self.rptr,
            self.wptr,
            self.doorbell_dw,
            u64::from(RING_SIZE),
        );
        r.0[reg::VMID] = 8;
        r.0[reg::QUEUE_PRIORITY] = 7;
        let wptr_dw = wptr_packets * 16;
        r.0[reg::PQ_WPTR_LO] = wptr_dw as u32;
        r.0[reg::PQ_WPTR_HI] = (wptr_dw >> 32) as u32;
        r
    }
}

fn origin(ts_ns: u64, pid: u32) -> Origin {
    Origin {
        ts_ns,
        pid,
        tid: pid,
        comm: "python3".into(),
    }
}

fn create_event(q: &DrvQueue, ts_ns: u64) -> Update {
    let args = kfd::CreateQueueArgs {
        ring_base_address: q.ring,
        write_pointer_address: q.wptr,
        read_pointer_address: q.rptr,
        doorbell_offset: q.doorbell_offset(),
        ring_size: RING_SIZE,
        gpu_id: gpu_id(q.gpu),
        queue_type: queue_type::COMPUTE_AQL,
        queue_percentage: 100,
        queue_priority: 7,
        queue_id: q.qid,
        eop_buffer_address: q.ring + 0x8000,
        eop_buffer_size: 4096,
        ctx_save_restore_address: q.ring + 0xa000,
        ctx_save_restore_size: 0x2000,
        ctl_stack_size: 0x1000,
        ..Default::default()
    };
    Update::Event(Event::Ioctl(IoctlEvent {
        origin: origin(ts_ns, q.pid),
        fd: 5,
        cmd: cmd::CREATE_QUEUE,
        ret: 0,
        duration_ns: 40_000,
        call: KfdCall::CreateQueue {
            args,
            args_size: std::mem::size_of::<kfd::CreateQueueArgs>() as u32,
        },
        verified: true,
    }))
}

fn destroy_event(q: &DrvQueue, ts_ns: u64) -> Update {
    Update::Event(Event::Ioctl(IoctlEvent {
        origin: origin(ts_ns, q.pid),
        fd: 5,
        cmd: cmd::DESTROY_QUEUE,
        ret: 0,
        duration_ns: 20_000,
        call: KfdCall::DestroyQueue(kfd::DestroyQueueArgs {
            queue_id: q.qid,
            pad: 0,
        }),
        verified: true,
    }))
}

fn proc_info(i: u32) -> ProcInfo {
    let container = format!("{:012x}", 0x5eed_0000_0000u64 + u64::from(i / 8));
    ProcInfo {
        comm: ["python3", "pt_main_thread", "vllm", "llama-server"][(i % 4) as usize].into(),
        cmdline: format!(
            "python3 -m torch.distributed.run --nproc-per-node 8 train.py --rank {} \
             --model llama-3-70b --data /data/shard-{:04}",
            i % 8,
            i
        ),
        uid: Some(1000 + i % 16),
        gid: Some(1000),
        groups: Vec::new(),
        ns_pid: Some(1 + i % 64),
        cgroup: format!("/system.slice/docker-{container}0123456789abcdef.scope"),
        container: Some(container),
        pod: None,
        start_time: 1_000_000 + u64::from(i),
    }
}

/// The synthetic host: processes, their live queues (oldest first), and the queue id each
/// process hands out next.
struct Host {
    gpus: u32,
    procs: Vec<(VecDeque<DrvQueue>, u32)>,
    /// Next process whose oldest queue is replaced.
    churn_cursor: usize,
    /// Where each GPU's `hqds` window starts (it moves on every read).
    hqd_cursor: usize,
    /// Fraction of a queue to replace carried over to the next tick.
    churn_carry: f64,
}

impl Host {
    fn new(procs: u32, per_proc: u32, gpus: u32) -> Self {
        let procs = (0..procs)
            .map(|i| {
                let qs = (0..per_proc).map(|q| DrvQueue::new(i, q, gpus)).collect();
                (qs, per_proc)
            })
            .collect();
        Self {
            gpus,
            procs,
            churn_cursor: 0,
            hqd_cursor: 0,
            churn_carry: 0.0,
        }
    }

    fn queues(&self) -> impl Iterator<Item = &DrvQueue> {
        self.procs.iter().flat_map(|(qs, _)| qs.iter())
    }

    fn total(&self) -> usize {
        self.procs.iter().map(|(qs, _)| qs.len()).sum()
    }

    /// Replaces `n` queues (each process's oldest, processes in turn) with new ones.
    fn churn(&mut self, n: usize, ts_ns: u64, out: &mut Vec<Update>) {
        for _ in 0..n {
            if self.procs.is_empty() {
                return;
            }
            let i = self.churn_cursor % self.procs.len();
            self.churn_cursor = (i + 1) % self.procs.len();
            let (qs, next) = &mut self.procs[i];
            let Some(old) = qs.pop_front() else { continue };
            out.push(destroy_event(&old, ts_ns));
            // Lowest ids are handed out first by KFD; a fresh id keeps the destroyed row
            // lingering next to the new one, as a short-lived queue would.
            let mut id = *next;
            while qs.iter().any(|q| q.qid == id) || id == old.qid {
                id = (id + 1) % MAX_QID;
            }
            *next = (id + 1) % MAX_QID;
            let q = DrvQueue::new(i as u32, id, self.gpus);
            out.push(create_event(&q, ts_ns + 50_000));
            qs.push_back(q);
        }
    }

    fn samples(&self, tick: u64, ts_ns: u64) -> Update {
        let samples = self
            .queues()
            .map(|q| {
                let read = tick * 37 + u64::from(q.qid) * 3;
                let write = read + u64::from(q.qid % 4);
                (
                    q.pid,
                    q.qid,
                    SampleRead::Ids {
                        read,
                        write,
                        packets: Vec::new(),
                    },
                )
            })
            .collect();
        Update::Samples { ts_ns, samples }
    }

    fn hqds(&mut self, tick: u64, taken_ns: u64) -> Update {
        let mut per_gpu: Vec<Vec<&DrvQueue>> = vec![Vec::new(); self.gpus as usize];
        for q in self.queues() {
            per_gpu[q.gpu as usize].push(q);
        }
        let start = self.hqd_cursor;
        let nodes = per_gpu
            .iter()
            .enumerate()
            .map(|(g, qs)| {
                let slots = (0..SLOTS)
                    .map(|s| {
                        let regs = if qs.is_empty() || s as usize >= qs.len() {
                            Regs(vec![0; reg::HQD_N_REGS])
                        } else {
                            qs[(start + s as usize) % qs.len()].regs(tick * 5)
                        };
                        HqdSlot {
                            inst: 0,
                            pipe: s / 8,
                            queue: s % 8,
                            regs,
                        }
                    })
                    .collect();
                HqdNode {
                    node: g as u32 + 1,
                    gpu_id: gpu_id(g as u32),
                    stopped: false,
                    slots,
                }
            })
            .collect();
        self.hqd_cursor += 7;
        Update::Hqds { taken_ns, nodes }
    }

    fn snapshot(&self, taken_ns: u64) -> Update {
        let procs = self
            .procs
            .iter()
            .filter(|(qs, _)| !qs.is_empty())
            .map(|(qs, _)| SysProc {
                pid: qs[0].pid,
                queues: qs
                    .iter()
                    .map(|q| SysQueue {
                        queue_id: q.qid,
                        gpu_id: gpu_id(q.gpu),
                        kind: 0,
                        size: u64::from(RING_SIZE),
                    })
                    .collect(),
            })
            .collect();
        Update::Procs(ProcSnapshot { taken_ns, procs })
    }
}

/// The update kinds timed separately.
const KINDS: [&str; 6] = ["event", "samples", "hqds", "procs", "tick", "other"];

fn kind_index(u: &Update) -> usize {
    match u {
        Update::Event(_) => 0,
        Update::Samples { .. } => 1,
        Update::Hqds { .. } => 2,
        Update::Procs(_) => 3,
        Update::Tick { .. } => 4,
        _ => 5,
    }
}

fn topology(gpus: u32) -> Update {
    Update::Topology(
        (0..gpus)
            .map(|g| GpuNode {
                node: g + 1,
                gpu_id: gpu_id(g),
                name: "ip discovery".into(),
                gfx_target_version: 90402,
                device_id: 0x74a1,
                cu_count: 304,
                hqd_slots: SLOTS,
                num_xcc: 1,
                drm_render_minor: 128 + g,
            })
            .collect(),
    )
}

/// `VmRSS` / `VmHWM` of this process, in kB.
fn status_kb(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
}

/// User + system CPU time of this process, in seconds.
fn cpu_s() -> f64 {
    // SAFETY: rusage is plain integers and timevals, for which all-zero bytes are valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass; RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[derive(Default)]
struct Phase {
    total: Duration,
    max: Duration,
}

impl Phase {
    fn add(&mut self, d: Duration) {
        self.total += d;
        self.max = self.max.max(d);
    }
    fn mean_ms(&self, n: u64) -> f64 {
        self.total.as_secs_f64() * 1e3 / n.max(1) as f64
    }
    fn max_ms(&self) -> f64 {
        self.max.as_secs_f64() * 1e3
    }
}

fn main() {
    let args = parse_args();
    let t_build = Instant::now();
    let mut host = Host::new(args.procs, args.queues_per_proc, args.gpus);
    let mut state = State::new();
    state.apply(topology(args.gpus));
    let now = monotonic_ns();
    for i in 0..args.procs {
        for q in &host.procs[i as usize].0 {
            state.apply(create_event(q, now));
        }
        // The watcher reads /proc of a process once its first event is in.
        state.apply(Update::ProcInfo {
            pid: pid_of(i),
            info: proc_info(i),
        });
    }
    let queues_built = state
        .procs
        .values()
        .map(|p| p.live_queues().count())
        .sum::<usize>();
    assert_eq!(queues_built, host.total(), "the model lost queues");
    let build_ms = t_build.elapsed().as_secs_f64() * 1e3;

    let backend = CrosstermBackend::new(io::sink());
    let area = Rect::new(0, 0, WIDTH, HEIGHT);
    let mut terminal = Terminal::with_options(
        backend,
        TerminalOptions {
            viewport: Viewport::Fixed(area),
        },
    )
    .expect("a terminal on a sink");
    let period = Duration::from_secs_f64(1.0 / args.hz);
    let mut app = App::new(gpreempt_user::tui::interval_label(period));
    let rss_after_build_kb = status_kb("VmRSS:");

    let ticks = (args.seconds * args.hz).round().max(1.0) as u64;
    // Sampler every 500 ms, hqds / reconcile / tick every 1 s, in ticks.
    let sample_every = ((args.hz * 0.5).round() as u64).max(1);
    let second_every = (args.hz.round() as u64).max(1);
    let churn_per_tick = host.total() as f64 * args.churn / 100.0 / args.hz;

    let (mut model, mut render_t, mut driver, mut whole) = (
        Phase::default(),
        Phase::default(),
        Phase::default(),
        Phase::default(),
    );
    let mut late = 0u64;
    let mut by_kind: [Phase; KINDS.len()] = Default::default();
    let mut counts = [0u64; KINDS.len()];
    let mut updates = Vec::new();
    let cpu0 = cpu_s();
    let start = Instant::now();
    for tick in 0..ticks {
        let t0 = Instant::now();
        let ts = monotonic_ns();
        // The driver: what the kernel and the watcher's readers would produce.
        updates.clear();
        host.churn_carry += churn_per_tick;
        let n = host.churn_carry.floor();
        host.churn_carry -= n;
        host.churn(n as usize, ts, &mut updates);
        if tick % sample_every == 0 {
            updates.push(host.samples(tick, ts));
        }
        if tick % second_every == 0 {
            updates.push(host.hqds(tick, ts));
            updates.push(host.snapshot(ts));
            updates.push(Update::Tick { now_ns: ts });
        }
        let t1 = Instant::now();
        for u in updates.drain(..) {
            let k = kind_index(&u);
            let t = Instant::now();
            state.apply(u);
            by_kind[k].add(t.elapsed());
            counts[k] += 1;
        }
        let t2 = Instant::now();
        // One frame, as top's loop draws it.
        gpreempt_user::tui::frame(&mut terminal, &mut app, &state, area)
            .expect("drawing to a sink");
        let t3 = Instant::now();
        driver.add(t1 - t0);
        model.add(t2 - t1);
        render_t.add(t3 - t2);
        whole.add(t3 - t0);
        let deadline = start + Duration::from_secs_f64((tick + 1) as f64 / args.hz);
        let now = Instant::now();
        if now < deadline {
            std::thread::sleep(deadline - now);
        } else {
            late += 1;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    let peak_rss_kb = status_kb("VmHWM:");
    let rss_end_kb = status_kb("VmRSS:");
    let live: usize = state.procs.values().map(|p| p.live_queues().count()).sum();
    let listed: usize = state.procs.values().map(|p| p.queues.len()).sum();
    let mapped = state
        .procs
        .values()
        .flat_map(|p| p.live_queues())
        .filter(|q| q.hqd.is_some())
        .count();
    // Per update of each kind, and per step of a frame: mean and max ms.
    let by_update: serde_json::Map<String, serde_json::Value> = KINDS
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let v = json!({
                "count": counts[i],
                "mean_ms": by_kind[i].mean_ms(counts[i]),
                "max_ms": by_kind[i].max_ms(),
            });
            (k.to_string(), v)
        })
        .collect();
    let out = json!({
        "synthetic": true,
        "procs": args.procs,
        "queues_per_proc": args.queues_per_proc,
        "queues": u64::from(args.procs) * u64::from(args.queues_per_proc),
        "gpus": args.gpus,
        "hz": args.hz,
        "ticks": ticks,
        "late_ticks": late,
        "churn_pct_per_s": args.churn,
        "viewport": format!("{WIDTH}x{HEIGHT}"),
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_pct_one_core": cpu / wall * 100.0,
        "tick_ms_mean": whole.mean_ms(ticks),
        "tick_ms_max": whole.max_ms(),
        "model_ms_mean": model.mean_ms(ticks),
        "model_ms_max": model.max_ms(),
        "model_by_update": by_update,
        "render_ms_mean": render_t.mean_ms(ticks),
        "render_ms_max": render_t.max_ms(),
        "driver_ms_mean": driver.mean_ms(ticks),
        "driver_ms_max": driver.max_ms(),
        "build_ms": build_ms,
        "rss_after_build_kb": rss_after_build_kb,
        "rss_end_kb": rss_end_kb,
        "peak_rss_kb": peak_rss_kb,
        "model_live_queues": live,
        "model_listed_queues": listed,
        "model_mapped_queues": mapped,
        "log_entries": state.log.len(),
        "hqd_ambiguous": state.corrections.hqd_ambiguous,
        "queues_found": state.corrections.queues_found,
        "queues_vanished": state.corrections.queues_vanished,
    });
    println!("{out}");
}
