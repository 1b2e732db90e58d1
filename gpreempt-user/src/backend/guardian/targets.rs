//! The way back through a target's own fd: the system seam ([`Targets`], the real [`Rm`]),
//! resuming an entry's channels and restoring its timeslices ([`undo`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::Result;
use gpreempt_common::nv;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::protocol::HoldEntry;
use crate::backend::nv::acts::{self as act, Channels};
use crate::observe::nv::rm as control;
use crate::observe::procinfo::ProcId;

/// What the guardian needs from the system, injectable for tests.
pub trait Targets {
    /// The guardian's own hold on a target's fd.
    type Dup;
    /// Duplicates fd `fd` of the process `id` names ([`control::dup_fd`]); never of another
    /// process that got its pid (an error that [`control::is_gone`] recognizes).
    fn dup(&mut self, id: ProcId, fd: i32) -> Result<Self::Dup>;
    /// Resumes `e`'s channels through `dup`.
    fn enable(&mut self, dup: &Self::Dup, e: &HoldEntry) -> Result<()>;
    /// Sets the timeslice of TSG `h_tsg` (of client `h_client`) to `us` through `dup`
    /// ([`act::set_timeslice`]); the real one reads it back and fails on a mismatch.
    fn set_timeslice(&mut self, dup: &Self::Dup, h_client: u32, h_tsg: u32, us: u64) -> Result<()>;
    /// Whether the target behind `dup` has exited.
    fn exited(&mut self, dup: &Self::Dup) -> bool;
}

/// The real system: pidfds and RM controls.
pub struct Rm;

/// A target's pidfd (to see it exit; it never names another process) and our duplicate of its
/// nvidiactl fd.
pub struct TargetFd {
    pub pidfd: OwnedFd,
    pub fd: OwnedFd,
}

impl Targets for Rm {
    type Dup = TargetFd;

    fn dup(&mut self, id: ProcId, fd: i32) -> Result<TargetFd> {
        let pidfd = control::pidfd_of(id)?;
        let fd = control::getfd(pidfd.as_fd(), id.pid, fd)?;
        Ok(TargetFd { pidfd, fd })
    }

    fn enable(&mut self, dup: &TargetFd, e: &HoldEntry) -> Result<()> {
        enable_entry(dup.fd.as_fd(), e)
    }

    fn set_timeslice(&mut self, dup: &TargetFd, h_client: u32, h_tsg: u32, us: u64) -> Result<()> {
        // A restore is the last word on a process we will not see again: read it back.
        act::set_timeslice(dup.fd.as_fd(), h_client, h_tsg, us)?;
        let got = control::get_timeslice(dup.fd.as_fd(), h_client, h_tsg)?;
        if got != us {
            anyhow::bail!("TSG {h_tsg:#x}: timeslice set to {us} us reads back {got} us");
        }
        Ok(())
    }

    fn exited(&mut self, dup: &TargetFd) -> bool {
        let mut fds = [PollFd::new(dup.pidfd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }
}

/// Resumes `e`'s channels. One handle the target has freed since makes the whole call fail, so
/// on failure the channels are retried one by one; a freed one (INVALID_CHANNEL) is not a
/// failure.
pub fn enable_entry(fd: BorrowedFd, e: &HoldEntry) -> Result<()> {
    let all = e.to_channels();
    let first = match act::set_disabled(fd, &all, false) {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let whole_client = matches!(
        control::nv_status(&first),
        None | Some(nv::status::INVALID_CLIENT | nv::status::NOT_SUPPORTED)
    );
    if all.channels.len() <= 1 || whole_client {
        return Err(first);
    }
    let failed: Vec<u32> = all
        .channels
        .iter()
        .copied()
        .filter(|&c| {
            let one = Channels {
                channels: vec![c],
                ..all.clone()
            };
            match act::set_disabled(fd, &one, false) {
                Ok(_) => false,
                Err(e) => control::nv_status(&e) != Some(nv::status::INVALID_CHANNEL),
            }
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(first.context(format!("channel(s) {failed:#x?} not resumed")))
    }
}

fn status_is(e: &anyhow::Error, statuses: &[u32]) -> bool {
    control::nv_status(e).is_some_and(|s| statuses.contains(&s))
}

/// Undoes what the controller may have done to `e`'s target, through `dup`: resumes its
/// channels (none: nothing to resume) and puts back each TSG's original timeslice, one TSG at a
/// time (a failure does not stop the others; a TSG the target freed is not one). A client that
/// is gone (INVALID_CLIENT) is returned as such at once: nothing of it is left to undo.
pub fn undo<T: Targets>(t: &mut T, dup: &T::Dup, e: &HoldEntry) -> Result<()> {
    let mut first = None;
    if !e.channels.is_empty() {
        match t.enable(dup, e) {
            Ok(()) => {}
            Err(err) if status_is(&err, &[nv::status::INVALID_CLIENT]) => return Err(err),
            Err(err) => first = Some(err),
        }
    }
    let mut failed = Vec::new();
    for ts in &e.timeslices {
        match t.set_timeslice(dup, e.h_client, ts.h_tsg, ts.original_us) {
            Ok(()) => {}
            Err(err) if status_is(&err, &[nv::status::INVALID_CLIENT]) => return Err(err),
            Err(err)
                if status_is(
                    &err,
                    &[
                        nv::status::INVALID_OBJECT_HANDLE,
                        nv::status::OBJECT_NOT_FOUND,
                    ],
                ) => {}
            Err(err) => {
                failed.push(ts.h_tsg);
                first.get_or_insert(err);
            }
        }
    }
    match first {
        None => Ok(()),
        Some(err) if failed.is_empty() => Err(err),
        Some(err) => Err(err.context(format!("timeslice(s) of TSG(s) {failed:#x?} not restored"))),
    }
}
