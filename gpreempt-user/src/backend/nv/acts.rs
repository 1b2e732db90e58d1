//! The NVIDIA levers' driver calls on a target's own RM client: pausing its channels
//! (`FIFO_DISABLE_CHANNELS`) and setting a TSG's hardware timeslice. They go through a duplicate
//! of the target's nvidiactl fd ([`dup_fd`](crate::observe::nv::rm::dup_fd)); the call itself is
//! the observer's ([`rm_control`]).

use std::{
    os::fd::BorrowedFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use gpreempt_common::nv::{self, disable_channels as dc};

use crate::observe::nv::rm::{rm_control, rm_control_ok, NvStatusError};

/// Channels (or TSG handles) of ONE RM client, all owned by the target process, and the
/// subdevice they run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels {
    pub h_client: u32,
    pub h_subdevice: u32,
    pub channels: Vec<u32>,
}

/// FIFO_DISABLE_CHANNELS parameters for `channels`, one 536-byte block per call (64 pairs
/// each). Only the documented fields are set: bOnlyDisableScheduling = `schedule_only` (0: a
/// running kernel is preempted too; 1: it finishes, only what follows waits), bRewindGpPut = 0,
/// pRunlistPreemptEvent = 0 (required: only kernel callers may pass an event).
pub fn disable_params(
    h_client: u32,
    channels: &[u32],
    disable: bool,
    schedule_only: bool,
) -> Vec<[u8; dc::SIZE]> {
    channels
        .chunks(dc::MAX_CHANNELS)
        .map(|chunk| {
            let mut p = [0u8; dc::SIZE];
            p[dc::B_DISABLE] = disable as u8;
            p[dc::B_ONLY_DISABLE_SCHEDULING] = (disable && schedule_only) as u8;
            p[dc::NUM_CHANNELS..dc::NUM_CHANNELS + 4]
                .copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            for (i, &h) in chunk.iter().enumerate() {
                let c = dc::H_CLIENT_LIST + 4 * i;
                p[c..c + 4].copy_from_slice(&h_client.to_le_bytes());
                let c = dc::H_CHANNEL_LIST + 4 * i;
                p[c..c + 4].copy_from_slice(&h.to_le_bytes());
            }
            p
        })
        .collect()
}

/// Disables (pauses) or enables (resumes) `ch` through `fd`, a duplicate of the target's
/// nvidiactl fd holding `ch.h_client`; returns the time the calls took. A refusal is an
/// [`NvStatusError`] (in the anyhow chain). When a later batch of a disable fails, the batches
/// already disabled are enabled again (best effort), so a failed pause leaves nothing paused.
pub fn set_disabled(fd: BorrowedFd, ch: &Channels, disable: bool) -> Result<Duration> {
    set_disabled_mode(fd, ch, disable, false)
}

/// [`set_disabled`], with `schedule_only` (bOnlyDisableScheduling) for a disable.
pub fn set_disabled_mode(
    fd: BorrowedFd,
    ch: &Channels,
    disable: bool,
    schedule_only: bool,
) -> Result<Duration> {
    if ch.channels.is_empty() {
        return Ok(Duration::ZERO);
    }
    let t0 = Instant::now();
    let blocks = disable_params(ch.h_client, &ch.channels, disable, schedule_only);
    for (i, mut p) in blocks.into_iter().enumerate() {
        let r = rm_control(
            fd,
            ch.h_client,
            ch.h_subdevice,
            nv::CTRL_FIFO_DISABLE_CHANNELS,
            &mut p,
        )
        .and_then(|status| match status {
            nv::status::OK => Ok(()),
            status => Err(NvStatusError {
                cmd: nv::CTRL_FIFO_DISABLE_CHANNELS,
                status,
            }
            .into()),
        });
        if let Err(e) = r {
            if disable && i > 0 {
                let done = &ch.channels[..i * dc::MAX_CHANNELS];
                for mut p in disable_params(ch.h_client, done, false, false) {
                    let _ = rm_control(
                        fd,
                        ch.h_client,
                        ch.h_subdevice,
                        nv::CTRL_FIFO_DISABLE_CHANNELS,
                        &mut p,
                    );
                }
            }
            return Err(e).with_context(|| {
                format!(
                    "{} {} channel(s) of client {:#x} (subdevice {:#x})",
                    if disable { "pausing" } else { "resuming" },
                    ch.channels.len(),
                    ch.h_client,
                    ch.h_subdevice
                )
            });
        }
    }
    Ok(t0.elapsed())
}

/// Sets the TSG's timeslice (`NVA06C_CTRL_CMD_SET_TIMESLICE`): the scheduler switches it out
/// after `us` only when another TSG of its runlist is runnable, so a short one costs an offline
/// TSG little while online work is idle. Returns the time the call took.
pub fn set_timeslice(fd: BorrowedFd, h_client: u32, h_tsg: u32, us: u64) -> Result<Duration> {
    let t0 = Instant::now();
    let mut p = us.to_le_bytes();
    rm_control_ok(fd, h_client, h_tsg, nv::CTRL_TSG_SET_TIMESLICE, &mut p).with_context(|| {
        format!("setting the timeslice of TSG {h_tsg:#x} (client {h_client:#x}) to {us} us")
    })?;
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::nv::rm::nv_status;
    use std::{fs::File, os::fd::AsFd as _};

    fn u32s(p: &[u8], at: usize, n: usize) -> Vec<u32> {
        (0..n).map(|i| nv::u32_at(p, at + 4 * i)).collect()
    }

    #[test]
    fn params_for_two_channels_are_byte_exact() {
        let blocks = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], true, false);
        assert_eq!(blocks.len(), 1);
        let mut want = [0u8; 536];
        want[0] = 1;
        want[4] = 2;
        want[24..28].copy_from_slice(&0xc1d0_0001u32.to_le_bytes());
        want[28..32].copy_from_slice(&0xc1d0_0001u32.to_le_bytes());
        want[280..284].copy_from_slice(&0x5c00_0010u32.to_le_bytes());
        want[284..288].copy_from_slice(&0x5c00_0020u32.to_le_bytes());
        assert_eq!(blocks[0], want);
        let enable = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], false, false);
        want[0] = 0;
        assert_eq!(enable[0], want);
        // Schedule-only pauses set bOnlyDisableScheduling; an enable never does.
        let sched = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], true, true);
        want[0] = 1;
        want[8] = 1;
        assert_eq!(sched[0], want);
        let enable = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], false, true);
        assert_eq!((enable[0][0], enable[0][8]), (0, 0));
    }

    #[test]
    fn params_for_65_channels_split_64_and_1() {
        let chans: Vec<u32> = (0..65).map(|i| 0x1000 + i).collect();
        let blocks = disable_params(7, &chans, true, false);
        assert_eq!(blocks.len(), 2);
        let first = &blocks[0];
        assert_eq!((first[0], nv::u32_at(first, 4)), (1, 64));
        assert_eq!((first[8], first[9]), (0, 0));
        assert_eq!(nv::u64_at(first, 16), 0);
        assert_eq!(u32s(first, 24, 64), vec![7; 64]);
        assert_eq!(u32s(first, 280, 64), chans[..64].to_vec());
        let mut want = [0u8; 536];
        want[0] = 1;
        want[4] = 1;
        want[24..28].copy_from_slice(&7u32.to_le_bytes());
        want[280..284].copy_from_slice(&(0x1000u32 + 64).to_le_bytes());
        assert_eq!(blocks[1], want);
        assert!(disable_params(7, &[], true, false).is_empty());
    }

    #[test]
    fn rm_control_on_a_non_nvidia_file_is_a_clean_error() {
        let f = File::open("/dev/null").unwrap();
        let mut params = [0u8; 536];
        let e =
            rm_control(f.as_fd(), 1, 2, nv::CTRL_FIFO_DISABLE_CHANNELS, &mut params).unwrap_err();
        let msg = format!("{e:#}");
        assert_eq!(
            msg,
            "RM_CONTROL ioctl (0x2080110b): ENOTTY (not an NVIDIA RM file: /dev/nvidiactl)"
        );
        let ch = Channels {
            h_client: 1,
            h_subdevice: 2,
            channels: (0..70).collect(),
        };
        let e = set_disabled(f.as_fd(), &ch, true).unwrap_err();
        assert!(format!("{e:#}").starts_with("pausing 70 channel(s) of client 0x1"));
        assert_eq!(nv_status(&e), None);
        assert_eq!(
            set_disabled(
                f.as_fd(),
                &Channels {
                    channels: vec![],
                    ..ch
                },
                true
            )
            .unwrap(),
            Duration::ZERO
        );
    }
}
