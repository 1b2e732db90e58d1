//! The ring buffer read as it becomes readable (epoll through tokio): records decoded, events on
//! other files dropped, and what user space dropped counted.

use super::{decode, Event, FdCheck, FdVerdict};

/// Counters of what user space dropped or could not decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStats {
    /// GPU driver calls on some other file (a 'K' ioctl in the KFD nr range not on /dev/kfd, an
    /// RM escape not on an NVIDIA node): dropped. `trace`'s summary says `not_kfd`, the name
    /// scripts already read.
    pub not_device: u64,
    /// Delivered although the fd could not be checked (process already gone).
    pub unverified: u64,
    /// Malformed records.
    pub malformed: u64,
}

/// Reads the ring buffer as it becomes readable (epoll through tokio), yielding checked events.
pub struct EventSource {
    ring: tokio::io::unix::AsyncFd<aya::maps::RingBuf<aya::maps::MapData>>,
    fds: FdCheck,
    pub stats: UserStats,
}

impl EventSource {
    pub fn new(
        ring: aya::maps::RingBuf<aya::maps::MapData>,
        fds: FdCheck,
    ) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd; it stays open and unchanged until the AsyncFd (which
        // owns the RingBuf) is dropped.
        let ring = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
        }?;
        Ok(Self {
            ring,
            fds,
            stats: UserStats::default(),
        })
    }

    /// Waits until records are available, then replaces `out` with every available event.
    pub async fn next_batch(&mut self, out: &mut Vec<Event>) -> std::io::Result<()> {
        out.clear();
        let mut guard = self.ring.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(ev) => out.push(ev),
                Err(e) => {
                    self.stats.malformed += 1;
                    log::warn!("dropping a malformed record: {e}");
                }
            }
        }
        guard.clear_ready();
        self.check_fds(out);
        Ok(())
    }

    /// Keeps only driver calls on the GPU devices; forgets exited processes.
    fn check_fds(&mut self, out: &mut Vec<Event>) {
        check_fds_with(&mut self.fds, &mut self.stats, out);
    }
}

/// [`EventSource::check_fds`] on its parts (for tests).
pub(super) fn check_fds_with(fds: &mut FdCheck, stats: &mut UserStats, out: &mut Vec<Event>) {
    // Keeps the event unless its fd is another file; marks it verified when confirmed.
    let mut keep = |verdict: FdVerdict, verified: &mut bool| match verdict {
        FdVerdict::Device => {
            *verified = true;
            true
        }
        FdVerdict::Unknown => {
            stats.unverified += 1;
            true
        }
        FdVerdict::Other => {
            stats.not_device += 1;
            false
        }
    };
    // Records the kernel matched by file need no look in /proc.
    out.retain_mut(|ev| match ev {
        Event::Ioctl(i) if i.verified => true,
        Event::Nv(n) if n.verified => true,
        Event::Ioctl(i) => keep(fds.check(i.origin.pid, i.fd), &mut i.verified),
        Event::Nv(n) => keep(fds.check_nv(n.origin.pid, n.fd), &mut n.verified),
        Event::ProcessExit(p) => {
            fds.forget(p.origin.pid);
            true
        }
        Event::Kernel(_) | Event::Launch(_) => true,
    });
}
