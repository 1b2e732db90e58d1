//! The preemption policy: a TOML file that classifies processes as online, offline or ignored,
//! and the engine that turns the host model into SUSPEND/RESUME decisions once per tick.
//!
//! This file holds the policy's vocabulary (classes, strategies, rules, the parsed policy, the
//! engine's decisions); the work is done by its parts, in the order data flows through them:
//! `file` parses the TOML text (with `glob` patterns) into a [`Policy`], `classify` puts a
//! process in a [`Class`] by its rules, and `engine` turns the host model into [`Decision`]s.

mod adaptive;
mod classify;
mod engine;
mod explain;
mod file;
mod glob;
mod levers;
mod running;

use std::fmt;

use regex::Regex;
use serde::Serialize;

pub use crate::lever::{Lever, LeverSet};
pub use adaptive::{Phase as AdaptivePhase, View as AdaptiveView};
pub use classify::{Lint, LintKind};
pub use engine::Engine;
pub use explain::{Explanation, Matcher, RuleTrial};
pub use file::{parse_duration, read_policy_file, PolicyError};
pub use glob::Glob;
pub use levers::{LeverChange, LeverTuner, LeverView};
pub use running::{running, Running};

const MS: u64 = 1_000_000;

/// What a process is to the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Latency-sensitive: its activity makes offline queues yield.
    Online,
    /// Best-effort: suspended while online work runs.
    Offline,
    /// Left alone.
    Ignore,
}

impl Class {
    pub fn label(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Ignore => "ignore",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "online" => Some(Self::Online),
            "offline" => Some(Self::Offline),
            "ignore" => Some(Self::Ignore),
            _ => None,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// Offline is suspended for as long as online is busy.
    Priority,
    /// While online is busy, offline runs `share` of every `period` and is suspended the rest.
    Timeslice { period_ns: u64, share: f64 },
    /// The least intervention that keeps online service times within `budget`, measured
    /// (policy/adaptive.rs).
    Adaptive { budget: Budget },
}

impl Strategy {
    pub fn kind(&self) -> StrategyKind {
        match self {
            Self::Priority => StrategyKind::Priority,
            Self::Timeslice { .. } => StrategyKind::Timeslice,
            Self::Adaptive { .. } => StrategyKind::Adaptive,
        }
    }
}

/// A [`Strategy`] without its values: what `strategy = "..."` names (priority where the file
/// names none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StrategyKind {
    #[default]
    Priority,
    Timeslice,
    Adaptive,
}

impl StrategyKind {
    pub const ALL: [Self; 3] = [Self::Priority, Self::Timeslice, Self::Adaptive];

    /// As the policy file names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::Timeslice => "timeslice",
            Self::Adaptive => "adaptive",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.label() == s)
    }
}

/// The adaptive strategy's online goal (`[adaptive]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// `online_p99_budget`: a ratio to the online work's own undisturbed service time.
    Ratio(f64),
    /// `online_latency`: an absolute service time (ns).
    Absolute(u64),
}

pub const DEFAULT_BUDGET_RATIO: f64 = 1.1;

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ratio(r) => write!(f, "{r:.2}x undisturbed"),
            Self::Absolute(ns) => write!(f, "{}", fmt_ns(*ns)),
        }
    }
}

/// How offline processes yield where their backend offers a choice of levers (the file's
/// `[nvidia]` table, the backend that offers one today). A backend that does not offer `lever`
/// acts by its own default ([`crate::lever::Offers::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeverPolicy {
    pub lever: Lever,
    /// The short timeslice the timeslice levers give an offline process's queues (microseconds).
    pub offline_timeslice_us: u64,
    /// With `Both`: how long an online episode lasts before offline is paused as well.
    pub pause_after_ns: u64,
    /// `pause = "schedule"`: a pause only takes the queues off the runlist; work already
    /// running finishes its timeslice. The default, `"preempt"`, preempts it as well.
    pub pause_schedule_only: bool,
    /// `levers`: the candidates the adaptive strategy's lever tuner measures (policy/levers.rs),
    /// of those the GPU's backend offers.
    pub candidates: LeverSet,
}

/// 200 us: on an H100 it brought the seeds' online p99 from 9.5 to 5.2 ms with offline at
/// 0.98x of its co-located throughput (docs/nvidia.md).
pub const DEFAULT_OFFLINE_TIMESLICE_US: u64 = 200;
pub const DEFAULT_PAUSE_AFTER_NS: u64 = 5 * MS;

impl Default for LeverPolicy {
    fn default() -> Self {
        Self {
            lever: Lever::Timeslice,
            offline_timeslice_us: DEFAULT_OFFLINE_TIMESLICE_US,
            pause_after_ns: DEFAULT_PAUSE_AFTER_NS,
            pause_schedule_only: false,
            candidates: LeverSet::DEFAULT,
        }
    }
}

/// One `[[rule]]`: every matcher given must match.
#[derive(Clone, Debug)]
pub struct Rule {
    pub class: Class,
    /// Line of its `[[rule]]` header.
    pub line: usize,
    pub comm: Option<Glob>,
    pub cmdline: Option<Regex>,
    pub uid: Option<u32>,
    /// The process's real gid or one of its supplementary groups.
    pub gid: Option<u32>,
    pub cgroup: Option<Glob>,
    pub container: Option<Glob>,
    /// Kubernetes namespace and pod name of the process's pod (observe::k8s).
    pub k8s_namespace: Option<Glob>,
    pub pod: Option<Glob>,
    /// The pod's Kubernetes QoS class, from its cgroup path (set by kubelet).
    pub qos: Option<crate::observe::k8s::Qos>,
    pub pid: Option<u32>,
    /// The process `pid` named when the policy was loaded: only it matches (whoever gets a
    /// freed pid first owns it next).
    pub pid_bound: PidBound,
    /// `slo_p99`: the request p99 an online service's users need (the adaptive strategy's
    /// target for the processes this rule makes online, in place of `[adaptive]`'s).
    pub slo_p99_ns: Option<u64>,
}

/// What a rule's `pid` was bound to when the policy was loaded ([`Policy::bind_pids`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PidBound {
    /// Parsed, not loaded (unit tests of the file format): the pid alone.
    #[default]
    NotYet,
    /// The process that had the pid then: its start time.
    Started(u64),
    /// No process had the pid: the rule matches nothing until a reload finds one.
    NoProcess,
}

/// A parsed, validated policy file.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Where it came from (file name), for messages.
    pub source: String,
    pub strategy: Strategy,
    pub window_ns: u64,
    pub resume_after_ns: u64,
    pub max_suspend_ns: u64,
    pub min_run_ns: u64,
    pub min_interval_ns: u64,
    /// SUSPEND grace period (kernel units, 1K GPU clocks); None: the kernel's default.
    pub grace: Option<u32>,
    /// GPUs managed (sorted, deduplicated); None: all.
    pub gpus: Option<Vec<u32>>,
    pub default_class: Class,
    pub rules: Vec<Rule>,
    /// Online processes' launch hints (uprobes on HIP/HSA launch entry points) count as online
    /// work, so offline queues are suspended before the online kernel reaches the GPU.
    pub launch_hints: bool,
    /// How offline processes yield where their backend offers a choice.
    pub levers: LeverPolicy,
    /// What to do with an offline AMD process whose runtime never enabled the KFD debug API.
    pub no_debug_api: NoDebugApi,
    /// What to do with a held process that keeps escaping its hold.
    pub escape: OnEscape,
    /// `[control] group`: members of this group may send requests too (root always may).
    pub control_group: Option<String>,
    /// The line of `[control] group`, for messages about it.
    pub control_group_line: Option<usize>,
    /// What `pid` rules were bound to at load, one line each (said with the trust warnings).
    pub pid_notes: Vec<String>,
}

/// `[policy] no_debug_api`: an offline process whose GPU runtime never enabled the KFD debug API
/// (ROCm before 5.7) cannot have its queues suspended (docs/controller.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoDebugApi {
    /// Say so once and leave it running.
    #[default]
    Refuse,
    /// Freeze its cgroup (cgroup v2 `cgroup.freeze`) while it would be suspended: it submits no
    /// new work, but what it queued already runs to completion.
    Freeze,
}

/// `[policy] escape`: a held process that gets out of its hold (it resumed its own queues,
/// disabled or took over the debug session, thawed its frozen cgroup) is always held again;
/// this says what happens once it has escaped [`ESCALATE_AFTER`] times (docs/controller.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnEscape {
    /// Hold it again each time, and report it.
    #[default]
    Hold,
    /// Also freeze its cgroup (where that stops nobody else) for as long as it is held.
    Freeze,
}

/// Escapes of one process after which `escape = "freeze"` freezes it.
pub const ESCALATE_AFTER: u64 = 3;

pub const DEFAULT_WINDOW_NS: u64 = 20 * MS;
pub const DEFAULT_RESUME_AFTER_NS: u64 = 5 * MS;
pub const DEFAULT_MAX_SUSPEND_NS: u64 = 2_000 * MS;
pub const DEFAULT_MIN_RUN_NS: u64 = 200 * MS;
pub const DEFAULT_MIN_INTERVAL_NS: u64 = 10 * MS;
pub const DEFAULT_PERIOD_NS: u64 = 100 * MS;
pub const DEFAULT_SHARE: f64 = 0.25;

impl Default for Policy {
    /// No rules, everything ignored: a policy that never acts.
    fn default() -> Self {
        Self {
            source: "<default>".into(),
            strategy: Strategy::Priority,
            window_ns: DEFAULT_WINDOW_NS,
            resume_after_ns: DEFAULT_RESUME_AFTER_NS,
            max_suspend_ns: DEFAULT_MAX_SUSPEND_NS,
            min_run_ns: DEFAULT_MIN_RUN_NS,
            min_interval_ns: DEFAULT_MIN_INTERVAL_NS,
            grace: None,
            gpus: None,
            default_class: Class::Ignore,
            rules: Vec::new(),
            launch_hints: true,
            levers: LeverPolicy::default(),
            no_debug_api: NoDebugApi::Refuse,
            escape: OnEscape::Hold,
            control_group: None,
            control_group_line: None,
            pid_notes: Vec::new(),
        }
    }
}

impl Policy {
    pub fn manages(&self, gpu_id: u32) -> bool {
        self.gpus
            .as_ref()
            .is_none_or(|g| g.binary_search(&gpu_id).is_ok())
    }

    /// One line for logs: the strategy and its timings.
    pub fn summary(&self) -> String {
        let name = self.strategy.kind().label();
        let strategy = match self.strategy {
            Strategy::Priority => name.to_owned(),
            Strategy::Timeslice { period_ns, share } => {
                format!("{name} period {} share {share}", fmt_ns(period_ns))
            }
            Strategy::Adaptive { budget } => format!("{name} (budget {budget})"),
        };
        let gpus = match &self.gpus {
            None => "all".to_owned(),
            Some(g) => g
                .iter()
                .map(|id| format!("{id:#x}"))
                .collect::<Vec<_>>()
                .join(","),
        };
        format!(
            "{}: {strategy}, window {}, resume_after {}, max_suspend {}, min_run {}, \
             min_interval {}, gpus {gpus}, {} rule(s), default {}, launch hints {}, \
             lever {}{}{}",
            self.source,
            fmt_ns(self.window_ns),
            fmt_ns(self.resume_after_ns),
            fmt_ns(self.max_suspend_ns),
            fmt_ns(self.min_run_ns),
            fmt_ns(self.min_interval_ns),
            self.rules.len(),
            self.default_class,
            if self.launch_hints { "on" } else { "off" },
            self.levers.lever.label(),
            match self.levers.lever {
                Lever::Pause | Lever::None | Lever::Freeze | Lever::Defer => String::new(),
                Lever::Timeslice | Lever::Dynamic => {
                    format!(" ({} us)", self.levers.offline_timeslice_us)
                }
                Lever::Both => format!(
                    " ({} us, pause after {})",
                    self.levers.offline_timeslice_us,
                    fmt_ns(self.levers.pause_after_ns)
                ),
            },
            if self.levers.pause_schedule_only
                && matches!(self.levers.lever, Lever::Pause | Lever::Both)
            {
                ", schedule-only pauses"
            } else {
                ""
            }
        )
    }
}

/// A duration for messages, in the largest unit it reaches ("2s", "20ms", "2.5ms", "500us").
pub fn fmt_ns(ns: u64) -> String {
    for (unit, name) in [(1_000_000_000, "s"), (MS, "ms"), (1_000, "us")] {
        if ns >= unit {
            let v = format!("{:.3}", ns as f64 / unit as f64);
            return format!("{}{name}", v.trim_end_matches('0').trim_end_matches('.'));
        }
    }
    format!("{ns}ns")
}

/// A measured duration for reasons: always in ms with one decimal ("5.0ms", "1200.0ms").
fn fmt_ms(ns: u64) -> String {
    format!("{:.1}ms", ns as f64 / 1e6)
}

/// The suspended part of a timeslice period.
fn off_ns(period_ns: u64, share: f64) -> u64 {
    ((1.0 - share) * period_ns as f64).round() as u64
}

/// What a decision asks of its queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Suspend,
    Resume,
}

/// One SUSPEND or RESUME for the queues of one process on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    pub ts_ns: u64,
    pub gpu_id: u32,
    pub pid: u32,
    pub action: Action,
    /// Queue ids, ascending.
    pub queues: Vec<u32>,
    /// SUSPEND grace period; None for RESUME or the kernel's default.
    pub grace: Option<u32>,
    pub reason: String,
    /// When the evidence behind a Suspend was observed (the sample that showed online work):
    /// the start of the decision latency.
    pub trigger_ns: Option<u64>,
}

#[cfg(test)]
mod tests;
