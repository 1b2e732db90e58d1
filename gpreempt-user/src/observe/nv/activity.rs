//! NVIDIA channel activity: each GPFIFO channel's GP_GET and GP_PUT, read from its USERD in the
//! owning process's memory, summed per TSG into the same read / write ids the AMD sampler gives
//! an AQL queue (docs/nvidia.md#channel-activity). So `top`'s DISP/S and BKLG, `queues --json`,
//! online bursts and "did offline run" work on NVIDIA as on AMD, counted in GPFIFO entries.
//!
//! Where the USERD is: a channel's allocation names the ring's GPU address (`gpFifoOffset`), the
//! memory object that holds its USERD (`hUserdMemory[0]`) and the offset in it. libcuda maps
//! that object at the ring's own address (unified addressing) with file offset 0 (the driver
//! refuses any other), so the USERD is at the start of the mapping that holds the ring plus
//! `userdOffset`. Everything is checked before a channel is read: the same memory object for
//! ring and USERD, a shared mapping of an NVIDIA device file (char major 195), the USERD inside
//! it, and GP_GET / GP_PUT below the ring's entry count on every read.
//!
//! How it is read: `/proc/PID/mem`. The mapping is device memory (VM_IO | VM_PFNMAP), which
//! `process_vm_readv` cannot read; the driver's `access` operation serves ptrace-style reads
//! (kernel-open/nvidia/nv-mmap.c `nvidia_vma_access`). Each read is 8 bytes at a fixed offset of
//! a page the checks above placed: nothing the process writes there can make the reader read
//! more, elsewhere, or for longer.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{BufRead, BufReader},
    os::unix::fs::{FileExt, FileTypeExt, MetadataExt},
};

use gpreempt_common::nv::{userd, NV_MAJOR_DEVICE_NUMBER, NV_MODESET_MINOR};

use crate::{
    observe::events::ChannelRing,
    observe::model::{SampleRead, State},
};

/// How often a channel whose USERD could not be placed is tried again (its mapping may appear
/// after the allocation: libcuda maps the memory once the channel exists).
const RELOCATE_NS: u64 = 500_000_000;
/// A read costs about 7 us on an H100 (the driver maps the page uncached for each access), so
/// only the channels that carry work are read every tick: those of compute (GR) TSGs that have
/// shown activity. Copy-engine TSGs and channels never used yet are read every this many ticks.
const SLOW_EVERY: u64 = 16;

/// One mapping of a process (a line of /proc/PID/maps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub shared: bool,
    pub pgoff: u64,
    pub path: String,
}

/// Decides whether a mapping is an NVIDIA device file's: `Err(why not)`. Production checks the
/// mapped file itself (`/proc/PID/map_files/`); tests put a USERD in a file of their own.
pub type DeviceCheck = fn(pid: u32, vma: &Vma) -> Result<(), String>;

/// The production [`DeviceCheck`]: a shared mapping of a character device of the NVIDIA major
/// (not nvidia-modeset), judged by the file itself, not by its name.
pub fn nvidia_device(pid: u32, vma: &Vma) -> Result<(), String> {
    if !vma.shared {
        return Err("a private mapping".into());
    }
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", vma.start, vma.end);
    let md = std::fs::metadata(&link).map_err(|e| format!("{link}: {e}"))?;
    let rdev = md.rdev();
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    if !md.file_type().is_char_device()
        || major != u64::from(NV_MAJOR_DEVICE_NUMBER)
        || minor == u64::from(NV_MODESET_MINOR)
    {
        return Err(format!(
            "{} is not an NVIDIA device file ({major}:{minor})",
            vma.path
        ));
    }
    Ok(())
}

/// Where a channel's USERD is in its process, or why it cannot be placed.
pub fn locate(
    pid: u32,
    ring: &ChannelRing,
    maps: &[Vma],
    check: DeviceCheck,
) -> Result<u64, String> {
    if ring.entries == 0 {
        return Err("the allocation gave no ring size".into());
    }
    if ring.h_userd == 0 {
        return Err("USERD in the driver's own pool (mapped through the channel): not read".into());
    }
    if ring.h_userd != ring.h_buffer {
        return Err(format!(
            "USERD in memory {:#x}, the ring in {:#x}: not placed",
            ring.h_userd, ring.h_buffer
        ));
    }
    let v = maps
        .iter()
        .find(|v| v.start <= ring.gpfifo_va && ring.gpfifo_va < v.end)
        .ok_or_else(|| format!("ring {:#x} is not mapped in the process", ring.gpfifo_va))?;
    check(pid, v)?;
    if v.pgoff != 0 {
        return Err(format!(
            "mapping at {:#x} has file offset {:#x}",
            v.start, v.pgoff
        ));
    }
    let at = v
        .start
        .checked_add(ring.userd_offset)
        .filter(|&a| a.saturating_add(userd::SIZE as u64) <= v.end)
        .ok_or_else(|| {
            format!(
                "USERD offset {:#x} is past the mapping at {:#x} ({} bytes)",
                ring.userd_offset,
                v.start,
                v.end - v.start
            )
        })?;
    Ok(at)
}

/// Parses /proc/PID/maps, keeping only shared mappings whose file name looks like an NVIDIA
/// device node (the [`DeviceCheck`] still judges the file itself). Bounded: one line at a time.
pub fn parse_maps(r: impl BufRead, keep: impl Fn(&str) -> bool) -> Vec<Vma> {
    let mut out = Vec::new();
    for line in r.lines().map_while(Result::ok) {
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (_dev, _ino) = (f.next(), f.next());
        let path = f.next().map(str::trim).unwrap_or("");
        if !keep(path) {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(pgoff)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        out.push(Vma {
            start,
            end,
            shared: perms.as_bytes().get(3) == Some(&b's'),
            pgoff,
            path: path.to_string(),
        });
    }
    out
}

/// An NVIDIA device node's name, wherever a container mounts it: nvidiactl or nvidiaN.
pub fn nvidia_node_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name == "nvidiactl"
        || name
            .strip_prefix("nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One channel's cursor: its last GP_GET / GP_PUT and what was consumed and submitted since
/// it was first read (unwrapped modulo the ring).
#[derive(Debug)]
struct Cursor {
    tsg: u32,
    userd: Result<u64, String>,
    tried_ns: u64,
    entries: u32,
    last: Option<(u32, u32)>,
    consumed: u64,
    submitted: u64,
    /// GP_GET or GP_PUT has ever been seen non-zero or moving.
    used: bool,
}

/// Per TSG: what its freed channels had counted, so the TSG's ids never go back.
#[derive(Debug, Default)]
struct Retired {
    consumed: u64,
    submitted: u64,
}

struct ProcReader {
    mem: Result<File, String>,
    maps: Option<Vec<Vma>>,
    channels: HashMap<u32, Cursor>,
    retired: HashMap<u32, Retired>,
}

/// Reads every located channel of every live NVIDIA process in the model.
pub struct ChannelSampler {
    procs: HashMap<u32, ProcReader>,
    check: DeviceCheck,
    /// Reads made and their total time (what sampling costs, for the log and metrics).
    pub reads: u64,
    pub read_ns: u64,
    ticks: u64,
}

impl Default for ChannelSampler {
    fn default() -> Self {
        Self::new(nvidia_device)
    }
}

/// Reads one channel's GP_GET / GP_PUT from its USERD at `at` and advances its cursor; Err with
/// why the channel could not be read this time. `stats`: read time (ns) and reads, counted.
fn read_gp(
    mem: &File,
    at: u64,
    c: &mut Cursor,
    now_ns: u64,
    stats: (&mut u64, &mut u64),
) -> Result<(), String> {
    let mut b = [0u8; 8];
    let t0 = crate::clock::monotonic_ns();
    let got = mem.read_at(&mut b, at + userd::GP_GET as u64);
    *stats.0 += crate::clock::monotonic_ns().saturating_sub(t0);
    *stats.1 += 1;
    match got {
        Ok(8) => {}
        Ok(_) => return Err("short read of USERD".into()),
        Err(e) => return Err(format!("USERD at {at:#x}: {e}")),
    }
    let get = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let put = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    if get >= c.entries || put >= c.entries {
        // Not a USERD (or no longer): never read this address again.
        c.userd = Err(format!(
            "GP_GET {get} / GP_PUT {put} out of a {}-entry ring at {at:#x}",
            c.entries
        ));
        c.tried_ns = now_ns.max(1);
        return Err(c.userd.clone().err().unwrap_or_default());
    }
    let n = u64::from(c.entries);
    let step = |a: u32, b: u32| (u64::from(b) + n - u64::from(a)) % n;
    match c.last {
        Some((g0, p0)) => {
            c.consumed += step(g0, get);
            c.submitted += step(p0, put);
        }
        // First read: what is pending now counts as submitted.
        None => c.submitted = step(get, put),
    }
    c.used |= get != 0 || put != 0 || c.last.is_some_and(|l| l != (get, put));
    c.last = Some((get, put));
    Ok(())
}

impl ChannelSampler {
    pub fn new(check: DeviceCheck) -> Self {
        Self {
            procs: HashMap::new(),
            check,
            reads: 0,
            read_ns: 0,
            ticks: 0,
        }
    }

    /// One sample of every NVIDIA TSG with rings: (pid, TSG handle, ids in GPFIFO entries).
    pub fn sample(&mut self, state: &State, now_ns: u64) -> Vec<(u32, u32, SampleRead)> {
        let mut out = Vec::new();
        let mut live = HashSet::new();
        self.ticks += 1;
        let slow_tick = self.ticks % SLOW_EVERY == 1;
        for p in state.procs.values().filter(|p| p.exited_ns.is_none()) {
            let tsgs: Vec<_> = p
                .queues
                .values()
                .filter(|q| q.destroyed_ns.is_none())
                .filter_map(|q| q.nv.as_ref().map(|t| (q.queue_id, t)))
                .filter(|(_, t)| !t.rings.is_empty())
                .collect();
            if tsgs.is_empty() {
                continue;
            }
            live.insert(p.pid);
            let r = self.procs.entry(p.pid).or_insert_with(|| ProcReader {
                mem: File::open(format!("/proc/{}/mem", p.pid))
                    .map_err(|e| format!("/proc/{}/mem: {e}", p.pid)),
                maps: None,
                channels: HashMap::new(),
                retired: HashMap::new(),
            });
            let mut alive = HashSet::new();
            for (tsg, t) in tsgs {
                let gr = t.engine_type == gpreempt_common::nv::ENGINE_TYPE_GRAPHICS;
                let (mut read, mut write, mut ok, mut why) = (0u64, 0u64, 0usize, None);
                if let Some(ret) = r.retired.get(&tsg) {
                    read += ret.consumed;
                    write += ret.submitted;
                }
                for ring in &t.rings {
                    alive.insert(ring.h_channel);
                    let c = r.channels.entry(ring.h_channel).or_insert_with(|| Cursor {
                        tsg,
                        userd: Err("not placed yet".into()),
                        tried_ns: 0,
                        entries: ring.entries,
                        last: None,
                        consumed: 0,
                        submitted: 0,
                        used: false,
                    });
                    if c.userd.is_err()
                        && (c.tried_ns == 0 || now_ns.saturating_sub(c.tried_ns) >= RELOCATE_NS)
                    {
                        if c.tried_ns != 0 {
                            r.maps = None; // a retry: the mappings may have changed
                        }
                        c.tried_ns = now_ns.max(1);
                        let maps = r.maps.get_or_insert_with(|| read_maps(p.pid));
                        c.userd = locate(p.pid, ring, maps, self.check);
                    }
                    let at = match &c.userd {
                        Ok(at) => *at,
                        Err(e) => {
                            why.get_or_insert_with(|| e.clone());
                            continue;
                        }
                    };
                    if c.last.is_some() && !slow_tick && !(gr && c.used) {
                        // Not due this tick: its last counts stand.
                        read += c.consumed;
                        write += c.submitted;
                        ok += 1;
                        continue;
                    }
                    let mem = match &r.mem {
                        Ok(f) => f,
                        Err(e) => {
                            why.get_or_insert_with(|| e.clone());
                            continue;
                        }
                    };
                    if let Err(e) =
                        read_gp(mem, at, c, now_ns, (&mut self.read_ns, &mut self.reads))
                    {
                        why.get_or_insert(e);
                        continue;
                    }
                    read += c.consumed;
                    write += c.submitted;
                    ok += 1;
                }
                out.push((
                    p.pid,
                    tsg,
                    match (ok, why) {
                        (0, Some(w)) => SampleRead::Unreadable(w),
                        (0, None) => SampleRead::Unreadable("no channel placed".into()),
                        _ => SampleRead::Ids {
                            read,
                            write,
                            packets: Vec::new(),
                        },
                    },
                ));
            }
            let freed: Vec<u32> = r
                .channels
                .keys()
                .copied()
                .filter(|h| !alive.contains(h))
                .collect();
            // A freed channel's counts stay with its TSG, whose ids so never go back.
            for h in freed {
                if let Some(c) = r.channels.remove(&h) {
                    let e = r.retired.entry(c.tsg).or_default();
                    e.consumed += c.consumed;
                    e.submitted += c.consumed;
                }
            }
        }
        self.procs.retain(|pid, _| live.contains(pid));
        out
    }
}

fn read_maps(pid: u32) -> Vec<Vma> {
    match File::open(format!("/proc/{pid}/maps")) {
        Ok(f) => parse_maps(BufReader::new(f), nvidia_node_name),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write, os::fd::AsFd};

    use gpreempt_common::nv::class;
    use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

    use super::*;
    use crate::observe::model::{tests::nvidia::rm_alloc, tests::nvidia::rm_channel, SampleStatus};

    const MEM: u32 = 0x5c00_0017;
    const ENTRIES: u32 = 1024;

    /// A fake channel block as libcuda lays it out (ring 8 KiB, then its USERD page), in a shared
    /// mapping of a file named like a device node, in this test process.
    struct FakeChannels {
        base: *mut u8,
        len: usize,
        dir: std::path::PathBuf,
    }

    impl FakeChannels {
        fn new(channels: usize) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("gp-userd-{}-{n}", std::process::id()));
            std::fs::create_dir(&dir).unwrap();
            let path = dir.join("nvidia0");
            let len = 0x3000 * channels;
            let mut f = std::fs::File::create_new(&path).unwrap();
            f.write_all(&vec![0u8; len]).unwrap();
            // SAFETY: a fresh shared mapping of a file this test owns, unmapped in Drop.
            let base = unsafe {
                mmap(
                    None,
                    std::num::NonZeroUsize::new(len).unwrap(),
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                    f.as_fd(),
                    0,
                )
            }
            .unwrap();
            Self {
                base: base.as_ptr().cast(),
                len,
                dir,
            }
        }

        fn va(&self) -> u64 {
            self.base as u64
        }

        /// Channel `i`'s GP_GET / GP_PUT, as the GPU and the client write them.
        fn set(&self, i: usize, get: u32, put: u32) {
            let at = 0x3000 * i + 0x2000 + userd::GP_GET;
            // SAFETY: inside the mapping (len covers every channel block).
            unsafe {
                std::ptr::write_volatile(self.base.add(at).cast::<u32>(), get);
                std::ptr::write_volatile(self.base.add(at + 4).cast::<u32>(), put);
            }
        }
    }

    impl Drop for FakeChannels {
        fn drop(&mut self) {
            // SAFETY: the mapping made in new(), not used after this.
            let _ = unsafe { munmap(std::ptr::NonNull::new(self.base.cast()).unwrap(), self.len) };
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The test's own file stands in for the device: shared, named like one.
    fn fake_device(_pid: u32, v: &Vma) -> Result<(), String> {
        if v.shared && nvidia_node_name(&v.path) {
            Ok(())
        } else {
            Err(format!("{} refused", v.path))
        }
    }

    /// This process, with a compute TSG 0x20 whose channels sit in `fake`.
    fn host(fake: &FakeChannels, channels: usize) -> State {
        let pid = std::process::id();
        let mut s = State::new();
        for (parent, new, cl, head) in [
            (0, 0xc1, class::NV01_ROOT_CLIENT, 0),
            (0xc1, 0x10, class::NV01_DEVICE_0, 0),
            (0x10, 0x11, class::NV20_SUBDEVICE_0, 0),
            (0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1),
        ] {
            s.apply(rm_alloc(1, pid, 0xc1, parent, new, cl, head));
        }
        for i in 0..channels {
            let ring = fake.va() + 0x3000 * i as u64;
            s.apply(rm_channel(
                1,
                pid,
                0xc1,
                0x20,
                0x21 + i as u32,
                (ring, ENTRIES, MEM, 0x3000 * i as u64 + 0x2000),
            ));
        }
        s
    }

    fn ids(r: &[(u32, u32, SampleRead)]) -> (u64, u64) {
        match r {
            [(_, 0x20, SampleRead::Ids { read, write, .. })] => (*read, *write),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_fake_channels_put_and_get_become_the_tsgs_ids() {
        let fake = FakeChannels::new(2);
        let mut s = host(&fake, 2);
        let mut sm = ChannelSampler::new(fake_device);
        fake.set(0, 10, 14); // 4 pending
        fake.set(1, 3, 3);
        let r = sm.sample(&s, 1_000);
        assert_eq!(ids(&r), (0, 4), "{r:?}");
        // The GPU consumed 3, the client submitted 5 more on channel 1 and wrapped channel 0.
        fake.set(0, 13, 14);
        fake.set(1, 3, 8);
        let r = sm.sample(&s, 2_000);
        assert_eq!(ids(&r), (3, 9));
        fake.set(0, 1020, 2); // get +1007, put +1012 (past the ring's end)
        fake.set(1, 8, 8);
        let r = sm.sample(&s, 3_000);
        assert_eq!(ids(&r), (3 + 1007 + 5, 9 + 1012));
        assert_eq!(sm.reads, 6);
        // Through the model: DISP/S and BKLG of the TSG, as for an AQL queue.
        s.apply(crate::observe::model::Update::Samples {
            ts_ns: 3_000,
            samples: r,
        });
        let q = &s.procs[&std::process::id()].queues[&0x20];
        assert_eq!(q.activity.status, SampleStatus::Valid);
        assert_eq!(q.activity.backlog, Some(6)); // 1020 -> 2 on a 1024-entry ring
    }

    #[test]
    fn a_channel_never_used_is_read_only_every_sixteenth_tick() {
        let fake = FakeChannels::new(2);
        let s = host(&fake, 2);
        let mut sm = ChannelSampler::new(fake_device);
        fake.set(0, 1, 1);
        let r = sm.sample(&s, 1);
        assert_eq!(ids(&r), (0, 0));
        fake.set(1, 0, 5); // channel 1 starts now
        for t in 2..=SLOW_EVERY {
            let r = sm.sample(&s, t);
            assert_eq!(ids(&r), (0, 0), "tick {t}");
        }
        let r = sm.sample(&s, SLOW_EVERY + 1);
        assert_eq!(ids(&r), (0, 5));
        // 2 reads on the first tick, channel 0 on every later one, channel 1 once more.
        assert_eq!(sm.reads, 2 + SLOW_EVERY + 1);
        // Once used, it is read every tick.
        fake.set(1, 5, 6);
        assert_eq!(ids(&sm.sample(&s, SLOW_EVERY + 2)), (5, 6));
    }

    #[test]
    fn values_out_of_the_ring_stop_the_reads_with_the_reason() {
        let fake = FakeChannels::new(1);
        let s = host(&fake, 1);
        let mut sm = ChannelSampler::new(fake_device);
        fake.set(0, 2000, 3);
        let r = sm.sample(&s, 1_000);
        assert!(
            matches!(&r[0].2, SampleRead::Unreadable(w) if w.contains("out of a 1024-entry ring")),
            "{r:?}"
        );
        fake.set(0, 1, 1);
        // Not read again before the retry delay, however plausible the page looks now.
        sm.sample(&s, 2_000);
        assert_eq!(sm.reads, 1);
    }

    #[test]
    fn a_userd_that_cannot_be_placed_is_reported_and_not_read() {
        let fake = FakeChannels::new(1);
        let pid = std::process::id();
        let mut s = host(&fake, 0);
        // USERD in another memory object than the ring.
        let mut ev = rm_channel(1, pid, 0xc1, 0x20, 0x21, (fake.va(), ENTRIES, MEM, 0x2000));
        if let crate::observe::model::Update::Event(crate::observe::events::Event::Nv(n)) = &mut ev
        {
            if let crate::observe::events::NvCall::Alloc {
                alloc_params: Some(p),
                ..
            } = &mut n.call
            {
                p[gpreempt_common::nv::channel::H_USERD_MEMORY..][..4]
                    .copy_from_slice(&0x99u32.to_le_bytes());
            }
        }
        s.apply(ev);
        let mut sm = ChannelSampler::new(fake_device);
        let r = sm.sample(&s, 1);
        assert!(
            matches!(&r[0].2, SampleRead::Unreadable(w) if w.contains("USERD in memory 0x99")),
            "{r:?}"
        );
        assert_eq!(sm.reads, 0);
    }

    #[test]
    fn the_production_check_refuses_a_regular_file_named_like_a_device() {
        let fake = FakeChannels::new(1);
        let maps = read_maps(std::process::id());
        let v = maps
            .iter()
            .find(|v| v.start == fake.va())
            .expect("the fake mapping is listed");
        let e = nvidia_device(std::process::id(), v).unwrap_err();
        assert!(e.contains("not an NVIDIA device file"), "{e}");
    }

    #[test]
    fn maps_lines_parse_and_only_device_names_are_kept() {
        let text = "\
200600000-200800000 rw-s 00000000 00:05 1062 /dev/nvidia0
200800000-204000000 rw-s 00000000 00:05 1061 /dev/nvidiactl
7f00-8000 r--p 00000000 08:01 12 /usr/lib/libcuda.so.1
9000-a000 rw-s 00000000 00:05 9 /usr/local/nvidia/dev/nvidia12
b000-c000 rw-p 00000000 00:00 0 
d000-e000 rw-s 00000000 00:05 9 /dev/nvidia-uvm
";
        let v = parse_maps(text.as_bytes(), nvidia_node_name);
        let starts: Vec<u64> = v.iter().map(|v| v.start).collect();
        assert_eq!(starts, vec![0x2_0060_0000, 0x2_0080_0000, 0x9000]);
        assert!(v.iter().all(|v| v.shared));
        assert!(!nvidia_node_name("/dev/nvidia-modeset") && !nvidia_node_name("nvidia"));
    }
}
