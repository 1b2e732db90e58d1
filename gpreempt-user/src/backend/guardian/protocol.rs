//! What the controller and the guardian say to each other: one JSON [`Request`] a line (a hold,
//! its release, a cgroup frozen or thawed), answered with one line.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::frozen::FrozenEntry;
use crate::backend::nv::acts::Channels;

/// Channels of one client of one target that the controller is about to pause, and TSGs of it
/// whose timeslice it is about to change: where to find the target's nvidiactl file (`pid`,
/// `fd`) and what to resume and restore through it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldEntry {
    pub pid: u32,
    /// The target's start time (`/proc/PID/stat` field 22): a duplicate is only ever taken of
    /// the process that had it, never of one that got the pid later. Absent (0, journals of
    /// older versions): no process matches, so nothing is restored into a reused pid.
    #[serde(default)]
    pub start_time: u64,
    pub fd: i32,
    pub h_client: u32,
    pub h_subdevice: u32,
    pub channels: Vec<u32>,
    /// TSGs (of `h_client`) and their timeslices before the controller changed them.
    /// Absent from the JSON when empty: a channels-only hold reads as it always did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeslices: Vec<TsgTimeslice>,
}

/// A TSG's timeslice before the controller changed it: what the guardian puts back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsgTimeslice {
    pub h_tsg: u32,
    pub original_us: u64,
}

impl HoldEntry {
    /// The target process.
    pub fn id(&self) -> crate::observe::procinfo::ProcId {
        crate::observe::procinfo::ProcId {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    pub(super) fn key(&self) -> (u32, u32, u32) {
        (self.pid, self.h_client, self.h_subdevice)
    }

    pub fn to_channels(&self) -> Channels {
        Channels {
            h_client: self.h_client,
            h_subdevice: self.h_subdevice,
            channels: self.channels.clone(),
        }
    }

    pub(super) fn whose(&self) -> String {
        format!(
            "of pid {} (fd {}, client {:#x}, subdevice {:#x})",
            self.pid, self.fd, self.h_client, self.h_subdevice
        )
    }

    /// The TSGs and their original timeslices, `0x.. (N us), ..`.
    pub(super) fn tsgs(&self) -> String {
        let t: Vec<String> = self
            .timeslices
            .iter()
            .map(|t| format!("{:#x} ({} us)", t.h_tsg, t.original_us))
            .collect();
        t.join(", ")
    }

    /// What is held, e.g. `2 channel(s) and the timeslice(s) of TSG(s) 0x.. (N us) of pid ..`.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.channels.is_empty() || self.timeslices.is_empty() {
            parts.push(format!("{} channel(s)", self.channels.len()));
        }
        if !self.timeslices.is_empty() {
            parts.push(format!("the timeslice(s) of TSG(s) {}", self.tsgs()));
        }
        format!("{} {}", parts.join(" and "), self.whose())
    }

    /// What undoing it did, e.g. `resumed 2 channel(s) and restored the timeslice(s) of ..`.
    pub(super) fn undone(&self) -> String {
        let mut parts = Vec::new();
        if !self.channels.is_empty() || self.timeslices.is_empty() {
            parts.push(format!("resumed {} channel(s)", self.channels.len()));
        }
        if !self.timeslices.is_empty() {
            parts.push(format!(
                "restored the timeslice(s) of TSG(s) {}",
                self.tsgs()
            ));
        }
        format!("{} {}", parts.join(" and "), self.whose())
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(super) enum Request {
    Hold(HoldEntry),
    Release {
        pid: u32,
        h_client: u32,
    },
    /// The controller is about to freeze this cgroup (the KFD path's fallback).
    Freeze(FrozenEntry),
    /// The controller thawed it.
    Thaw {
        cgroup: PathBuf,
    },
}

/// One line, for a reply.
pub(super) fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace(['\n', '\r'], " ")
}
