//! A client's memory as one ioctl sees it: the arrays the call reads are copied in before the
//! model's lock is taken, and what it writes is applied after the lock is dropped.
//!
//! Why: touching a client's memory can fault, and a fault in a private mapping of a file the
//! emulator serves is a FUSE read that the emulator itself must answer. Done under the model's
//! lock (or on the only FUSE thread) that is a deadlock the client chooses; done before the lock,
//! it costs at most the calling request's own thread while another one serves the read.

use gpreempt_common::kfd::{
    dbg_op, ioc_nr, nr, DbgTrapArgs, DbgTrapResumeQueuesArgs, DbgTrapSuspendQueuesArgs, EventData,
    MapMemoryToGpuArgs, SetCuMaskArgs, WaitEventsArgs,
};

use super::{Errno, Host};

/// The most one call copies in: `memdup_user` is a kmalloc, which fails above
/// `KMALLOC_MAX_SIZE` (4 MiB with 4 KiB pages) with ENOMEM.
pub const MAX_COPY: usize = 4 << 20;

/// The ranges of the caller's memory (address, length) a /dev/kfd ioctl reads, from its
/// argument block alone (what the kernel's `copy_from_user` calls of that ioctl would touch).
pub fn user_reads(cmd: u32, input: &[u8]) -> Vec<(u64, usize)> {
    let n = ioc_nr(cmd);
    match n {
        nr::MAP_MEMORY_TO_GPU | nr::UNMAP_MEMORY_FROM_GPU => {
            // Both argument blocks have one layout.
            let a = MapMemoryToGpuArgs::from_bytes(input);
            vec![(a.device_ids_array_ptr, a.n_devices as usize * 4)]
        }
        nr::WAIT_EVENTS => {
            let a = WaitEventsArgs::from_bytes(input);
            let size = std::mem::size_of::<EventData>();
            vec![(a.events_ptr, a.num_events as usize * size)]
        }
        nr::SET_CU_MASK => {
            let a = SetCuMaskArgs::from_bytes(input);
            vec![(a.cu_mask_ptr, (a.num_cu_mask.min(1024) / 8) as usize)]
        }
        nr::DBG_TRAP => {
            let a = DbgTrapArgs::from_bytes(input);
            match a.op {
                dbg_op::SUSPEND_QUEUES => {
                    let s: DbgTrapSuspendQueuesArgs = a.payload();
                    vec![(s.queue_array_ptr, s.num_queues as usize * 4)]
                }
                dbg_op::RESUME_QUEUES => {
                    let r: DbgTrapResumeQueuesArgs = a.payload();
                    vec![(r.queue_array_ptr, r.num_queues as usize * 4)]
                }
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
    .into_iter()
    .filter(|&(addr, len)| addr != 0 && len != 0)
    .collect()
}

/// The host an ioctl sees under the model's lock: reads come from the copies made before it
/// (anything else is EFAULT), writes are kept for after it; the rest goes to the real host.
pub struct Staged<'a> {
    host: &'a mut dyn Host,
    pid: u32,
    copies: Vec<(u64, Result<Vec<u8>, Errno>)>,
    /// Writes to apply, in order, once the lock is dropped.
    pub writes: Vec<(u32, u64, Vec<u8>)>,
}

impl<'a> Staged<'a> {
    /// Copies `ranges` of `pid`'s memory now: call it before taking the model's lock.
    pub fn new(host: &'a mut dyn Host, pid: u32, ranges: &[(u64, usize)]) -> Self {
        let copies = ranges
            .iter()
            .map(|&(addr, len)| {
                if len > MAX_COPY {
                    return (addr, Err(libc::ENOMEM));
                }
                let mut b = vec![0u8; len];
                (addr, host.read_mem(pid, addr, &mut b).map(|()| b))
            })
            .collect();
        Staged {
            host,
            pid,
            copies,
            writes: Vec::new(),
        }
    }
}

impl Host for Staged<'_> {
    fn read_mem(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        if pid != self.pid {
            return Err(libc::EFAULT);
        }
        for (at, copy) in &self.copies {
            let Some(off) = addr.checked_sub(*at) else {
                continue;
            };
            let off = usize::try_from(off).unwrap_or(usize::MAX);
            match copy {
                Ok(c) if off <= c.len() && buf.len() <= c.len() - off => {
                    buf.copy_from_slice(&c[off..off + buf.len()]);
                    return Ok(());
                }
                Err(e) if off == 0 => return Err(*e),
                _ => {}
            }
        }
        // Not copied in beforehand: never read under the lock.
        Err(libc::EFAULT)
    }

    fn write_mem(&mut self, pid: u32, addr: u64, data: &[u8]) -> Result<(), Errno> {
        self.writes.push((pid, addr, data.to_vec()));
        Ok(())
    }

    fn tracer(&mut self, pid: u32) -> Option<u32> {
        self.host.tracer(pid)
    }

    fn take_fd(&mut self, pid: u32, fd: u32) -> Result<std::os::fd::OwnedFd, Errno> {
        self.host.take_fd(pid, fd)
    }

    fn fd_exists(&mut self, pid: u32, fd: u32) -> bool {
        self.host.fd_exists(pid, fd)
    }

    fn process_exists(&mut self, pid: u32) -> bool {
        self.host.process_exists(pid)
    }
}
