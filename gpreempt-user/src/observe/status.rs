//! The status file: what a running controller publishes in the run directory (`run`,
//! `suspend` and `top` write it through `controller::daemon`) and `top`, `queues` and the
//! watcher read back. Typed here, below everything that writes or shows it; formatted only in
//! `tui/`.

use std::{collections::BTreeMap, os::fd::AsRawFd, path::Path};

use serde::{Deserialize, Serialize};

use crate::rundir;

/// What a controller publishes for `top` and `gpreempt-ebpf resume`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub controller_pid: u32,
    /// `run`, `suspend`, `top` or `kfd-cycles`.
    pub mode: String,
    pub policy: Option<String>,
    pub dry_run: bool,
    /// Policy class per pid.
    pub classes: BTreeMap<u32, String>,
    /// Queues held suspended: (pid, queue, gpu).
    pub held: Vec<(u32, u32, Option<u32>)>,
    /// GPUs no longer preempted, and why.
    pub fenced: Vec<(u32, String)>,
    /// Processes that cannot be controlled, and why.
    pub refused: BTreeMap<u32, String>,
    /// Processes held by the freeze fallback (`no_debug_api = "freeze"`), with their cgroups.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub frozen: BTreeMap<u32, String>,
    /// The same, with a short kind each (`traced`: under a tracer of its own, ...).
    #[serde(default)]
    pub uncontrollable: BTreeMap<u32, Uncontrollable>,
    /// Live processes that got out of a hold (each held again or frozen), by pid.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub escaped: BTreeMap<u32, Escape>,
    /// The latest decisions, newest last (audit records).
    pub decisions: Vec<serde_json::Value>,
    /// How the event pipeline is doing (records seen, applied, dropped, lost): proves that a
    /// process's events reach the model.
    #[serde(default)]
    pub events: BTreeMap<String, u64>,
    /// Set while event records are being lost in the kernel: the map leans on sampling.
    #[serde(default)]
    pub events_degraded: Option<String>,
    /// Set while audit records cannot be written (e.g. a full file system), with the count lost.
    #[serde(default)]
    pub audit_failing: Option<String>,
    /// NVIDIA TSG timeslices changed by the controller: (pid, TSG, original us, current us).
    #[serde(default)]
    pub timeslices: Vec<(u32, u32, u64, u64)>,
    /// Per GPU under the adaptive strategy: the online goal and what the tuner measured.
    #[serde(default)]
    pub adaptive: Vec<AdaptiveView>,
    /// Per GPU with a lever tuner (adaptive strategy): the tuner's state.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "nv_levers")]
    pub gpu_levers: Vec<LeverView>,
    /// Where the metrics are served (`run --metrics`).
    #[serde(default)]
    pub metrics: Option<String>,
    /// The systemd unit the controller runs in, when it does (from its cgroup).
    #[serde(default)]
    pub unit: Option<String>,
    /// Request latency of each process whose launches and waits it watches (online ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<u32, crate::observe::requests::RequestStats>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
/// The adaptive tuner's phase on one GPU.
pub enum AdaptivePhase {
    /// Bursts alternate: offline held from the start (clean samples), left alone (free ones).
    Calibrate,
    Tuned,
}

/// What `top` and the status file show per GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveView {
    pub gpu_id: u32,
    pub phase: AdaptivePhase,
    /// The online goal (ns): budget x clean p90, or the absolute budget.
    pub target_ns: Option<u64>,
    pub budget: String,
    /// Undisturbed (clean) and disturbed (free) service time p90s, and the last feedback
    /// step's p90 under control.
    pub clean_p90_ns: Option<u64>,
    pub free_p90_ns: Option<u64>,
    pub achieved_p90_ns: Option<u64>,
    /// The current defer (ns); None: never suspend.
    pub defer_ns: Option<u64>,
    /// Fraction of the time offline was not held on this GPU.
    pub offline_kept: f64,
    pub bursts: u64,
}

/// What the status file shows per GPU under the adaptive strategy where a lever tuner runs (the
/// `policy::LeverView`, levers named as the policy file names them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeverView {
    pub gpu_id: u32,
    /// Applied now (an epoch's lever while measuring).
    pub lever: String,
    pub chosen: String,
    /// `watching` (waiting for online requests), `calibrating`, `confirming` or `settled`.
    pub phase: String,
    /// While measuring: the epoch (1-based) and how many the measurement has.
    #[serde(default)]
    pub epoch: Option<(usize, usize)>,
    /// A quiet window is on: offline is held to measure the online services alone.
    #[serde(default)]
    pub quiet: bool,
    /// The last decision's figures per lever.
    pub summaries: Vec<LeverSummary>,
}

/// A lever's figures over a measurement: its worst online service's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeverSummary {
    pub lever: String,
    /// The worst service's request p99 over its target (at most 1.0: every target met).
    pub worst: f64,
    pub p99_ns: u64,
    /// Requests measured under it, all services.
    pub requests: usize,
    pub rate: Option<f64>,
    pub epochs: usize,
}

/// The status of the running controller, if there is one (the lock is held).
pub fn read_status(dir: &Path) -> Option<Status> {
    if !lock_held(dir) {
        return None;
    }
    status_file(dir)
}

fn status_file(dir: &Path) -> Option<Status> {
    rundir::open_read(&dir.join("status.json"))
        .ok()
        .and_then(|f| serde_json::from_reader(std::io::BufReader::new(f)).ok())
}

/// Whether some process holds the controller lock.
pub fn lock_held(dir: &Path) -> bool {
    let f = match rundir::open_read(&dir.join("controller.lock")) {
        Ok(f) => f,
        // Not root: the lock is root's alone (a reader's shared flock would block the next
        // controller), so believe the status while the controller it names lives.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return status_file(dir).is_some_and(|s| alive(s.controller_pid))
        }
        Err(_) => return false,
    };
    // SAFETY: flock on an fd we own; a shared lock fails only if an exclusive one is held.
    let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
    !free
}

/// Whether `pid` exists (EPERM: it does, and is not ours to signal).
fn alive(pid: u32) -> bool {
    use nix::{errno::Errno, sys::signal::kill, unistd::Pid};
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    raw > 0 && matches!(kill(Pid::from_raw(raw), None), Ok(()) | Err(Errno::EPERM))
}

/// A held process that got out of its hold: how (the latest way), how often, and what the
/// controller did. Kept while the process lives: a state, not an event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escape {
    /// `resumed` (its own RESUME_QUEUES), `trap_disabled` (the controller's debug session
    /// disabled under it), `trap_taken` (a debug session of its own), `thawed` (its frozen
    /// cgroup thawed), `moved` (a thread of it outside the frozen cgroup), `progress` (a held queue's
    /// dispatch ids moved): the latest.
    pub kind: String,
    /// How many times it escaped (calls within one controller turn count once).
    pub count: u64,
    /// The sentence the controller logged for the latest.
    pub reason: String,
    /// What the controller did about the latest: held it again, froze it, or why it could not.
    pub answer: String,
    /// CLOCK_MONOTONIC ns of the first and the latest escape.
    pub first_ns: u64,
    pub last_ns: u64,
}

/// Why the controller cannot act on a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uncontrollable {
    /// A short kind, for counting and alerting: `traced` (it runs under a tracer of its own:
    /// strace, gdb; the controller cannot seize it), `debugged` (another debugger holds its GPU
    /// debug trap), `not_permitted`, `no_debug_api` (its runtime never enabled the KFD debug
    /// API), `unsupported`, `fenced`, `rate_limited`, `gone`, `no_driver`, `backing_off`,
    /// `driver`, `other`.
    pub kind: String,
    /// The sentence the controller logged.
    pub reason: String,
}
