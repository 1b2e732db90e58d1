//! The record of processes a controller attached to (`targets.json` in the run directory), so
//! that the next controller can resume whatever a dead one left suspended.

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// A process a controller attached to, with its start time (a reused pid is not touched).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controlled {
    pub pid: u32,
    pub start_time: u64,
}

/// Records the controlled processes (written on every change; atomically replaced).
pub fn write_targets(dir: &Path, targets: &[Controlled]) -> Result<()> {
    crate::fsutil::write_atomic(&dir.join("targets.json"), &serde_json::to_vec(targets)?)
}

/// What an earlier controller recorded (empty when none or unreadable).
pub fn read_targets(dir: &Path) -> Vec<Controlled> {
    std::fs::read(dir.join("targets.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}
