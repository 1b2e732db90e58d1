//! The run directory (`/run/gpreempt-ebpf`, or `GPREEMPT_RUN_DIR`): where a controller keeps
//! what other processes read (lock, status, socket: see `controller::daemon`), how those files
//! are written (replaced whole, so a reader never sees half a file), and the targets record a
//! later controller recovers from.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

pub fn run_dir() -> PathBuf {
    std::env::var_os("GPREEMPT_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/gpreempt-ebpf"))
}

/// Writes `data` to a temporary sibling, then renames it over `path`.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// A process a controller attached to, with its start time (a reused pid is not touched).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controlled {
    pub pid: u32,
    pub start_time: u64,
}

/// Records the controlled processes (written on every change; atomically replaced).
pub fn write_targets(dir: &Path, targets: &[Controlled]) -> Result<()> {
    write_atomic(&dir.join("targets.json"), &serde_json::to_vec(targets)?)
}

/// What an earlier controller recorded (empty when none or unreadable).
pub fn read_targets(dir: &Path) -> Vec<Controlled> {
    std::fs::read(dir.join("targets.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}
