//! The workloads' profiles (kernel timelines measured on an H100), options and report.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The measured timelines (../shared/workloads/h100-kernel-timelines.json).
const TIMELINES: &str = include_str!("../../data/h100-kernel-timelines.json");

#[derive(Deserialize, Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub start_us: f64,
    pub dur_us: f64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

#[derive(Deserialize, Debug, Clone)]
pub struct Profile {
    pub workload: String,
    pub device: String,
    pub kernels: Vec<Kernel>,
    pub gpu_busy_us_per_iteration: f64,
}

/// Every profile in the data file.
pub fn profiles() -> Result<std::collections::BTreeMap<String, Profile>> {
    serde_json::from_str(TIMELINES).context("parsing the embedded kernel timelines")
}

pub fn profile(name: &str) -> Result<Profile> {
    let mut all = profiles()?;
    let names: Vec<String> = all.keys().cloned().collect();
    all.remove(name)
        .with_context(|| format!("unknown profile {name:?}; known: {}", names.join(", ")))
}

/// Items per iteration, from the profile's name (`..._b1024` -> 1024).
pub(super) fn batch_of(name: &str) -> u64 {
    name.split('_')
        .find_map(|p| p.strip_prefix('b').and_then(|n| n.parse().ok()))
        .unwrap_or(1)
}

#[derive(Debug, Clone)]
pub enum Mode {
    Online { rate: f64 },
    Offline,
}

#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub profile: String,
    pub mode: Mode,
    pub duration: Duration,
    /// KFD queue priority (0..15; ROCr's NORMAL is 7).
    pub priority: u32,
    /// Which GPU (topology order, 0-based).
    pub gpu: usize,
    /// Create a second (idle) queue this long after the start, as a runtime adding a stream.
    pub second_queue_after: Option<Duration>,
    /// Idle queues made at the start beside the working one (streams a runtime made and left
    /// idle; many of them make a busy host for the controller to start into).
    pub idle_queues: u32,
    /// Run this long first, unmeasured (a controller's start-up), then `duration` measured: the
    /// same process throughout, as a controller sees one service.
    pub warmup: Duration,
    /// Enable the KFD debug API at start (RUNTIME_ENABLE) as ROCm 5.7 and later do; false: as
    /// earlier runtimes (Debian 12's ROCm 5.2), whose queues the debug API cannot suspend.
    pub debug_api: bool,
}

#[derive(Serialize, Debug)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub emulated: bool,
    pub profile: String,
    pub mode: String,
    pub pid: u32,
    pub gpu_id: u32,
    pub queue_id: u32,
    pub queue_priority: u32,
    pub ring_base_address: u64,
    pub read_pointer_address: u64,
    pub write_pointer_address: u64,
    pub doorbell_offset: u64,
    pub duration_s: f64,
    pub requests: u64,
    pub iterations: u64,
    pub latency: Option<Latency>,
    pub iterations_per_s: f64,
    pub items_per_s: f64,
    pub kernels: u64,
}
