//! The vendor-neutral result of one suspend / resume: what happened to each queue, and when.

use serde::{Deserialize, Serialize};

/// What happened to one queue of a SUSPEND / RESUME (the kernel's per-entry status bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOutcome {
    /// Suspended / resumed (or already so).
    Done,
    /// Not acted on: no such queue, a new queue whose QUEUE_NEW is not cleared yet, or a queue
    /// being destroyed.
    Invalid,
    /// The preemption failed: the GPU may be in trouble.
    Error,
    /// Not attempted: its GPU is fenced after an earlier error.
    Fenced,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueResult {
    pub queue_id: u32,
    pub gpu_id: Option<u32>,
    pub outcome: QueueOutcome,
}

/// The result of one SUSPEND / RESUME call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    pub pid: u32,
    /// The ioctl's return value (queues counted by the kernel), or None when no call was needed.
    pub ret: Option<i32>,
    pub queues: Vec<QueueResult>,
    /// CLOCK_MONOTONIC when the ioctl was issued and when it returned.
    pub issued_ns: u64,
    pub returned_ns: u64,
    /// What the lever did to the queues (paused or resumed unless it says otherwise).
    #[serde(default, skip_serializing_if = "Effect::is_paused")]
    pub effect: Effect,
}

/// What an act did to the queues it names, by the lever it went through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Paused or resumed: the model's queue states follow.
    #[default]
    Paused,
    /// A per-episode timeslice lever: nothing was paused or resumed; the queues' hardware
    /// timeslice was set to this (us), or put back to their own (0). The model's queue states
    /// stay.
    Timeslice(u64),
    /// The freeze lever: the queues could not be paused; this cgroup was frozen (or thawed)
    /// instead. The model's queue states stay.
    Frozen(String),
}

impl Effect {
    pub fn is_paused(&self) -> bool {
        *self == Self::Paused
    }

    /// The timeslice a timeslice lever set (0: put back).
    pub fn timeslice_us(&self) -> Option<u64> {
        match self {
            Self::Timeslice(us) => Some(*us),
            _ => None,
        }
    }
}

impl OpReport {
    /// The queue ids that changed state.
    pub fn done(&self) -> Vec<u32> {
        self.queues
            .iter()
            .filter(|q| q.outcome == QueueOutcome::Done)
            .map(|q| q.queue_id)
            .collect()
    }

    /// One line per outcome for a person: what happened to which queues.
    pub fn describe(&self, suspend: bool) -> String {
        let verb = match &self.effect {
            // Nothing paused, the timeslice changed.
            Effect::Timeslice(0) => "put back the timeslice of".to_string(),
            Effect::Timeslice(us) => format!("set a {us} us timeslice on"),
            // The process stopped submitting, its queues still run.
            Effect::Frozen(cg) if suspend => format!("froze cgroup {cg} (no new work) of"),
            Effect::Frozen(cg) => format!("thawed cgroup {cg} of"),
            Effect::Paused if suspend => "suspended".to_string(),
            Effect::Paused => "resumed".to_string(),
        };
        let list = |o: QueueOutcome| {
            self.queues
                .iter()
                .filter(|q| q.outcome == o)
                .map(|q| q.queue_id.to_string())
                .collect::<Vec<_>>()
        };
        let mut parts = Vec::new();
        let done = list(QueueOutcome::Done);
        if !done.is_empty() {
            parts.push(format!("{verb} queue(s) {}", done.join(", ")));
        }
        let invalid = list(QueueOutcome::Invalid);
        if !invalid.is_empty() {
            parts.push(format!(
                "not {verb}: {} (no such queue, or being created/destroyed)",
                invalid.join(", ")
            ));
        }
        let error = list(QueueOutcome::Error);
        if !error.is_empty() {
            parts.push(format!(
                "FAILED: {} (the GPU reported an error)",
                error.join(", ")
            ));
        }
        let fenced = list(QueueOutcome::Fenced);
        if !fenced.is_empty() {
            parts.push(format!(
                "skipped: {} (GPU fenced after an error)",
                fenced.join(", ")
            ));
        }
        if parts.is_empty() {
            parts.push(match self.ret {
                Some(n) => format!("{verb} all queues (kernel count {n})"),
                None => "no queues".into(),
            });
        }
        format!("pid {}: {}", self.pid, parts.join("; "))
    }
}

/// A hardware timeslice the controller changed on one queue (or put back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimesliceChange {
    pub pid: u32,
    /// Its id in the model (the wire name is the first driver's word for the scheduled unit).
    #[serde(rename = "tsg")]
    pub queue_id: u32,
    pub from_us: u64,
    pub to_us: u64,
    /// The value it had before the controller first changed it.
    pub original_us: u64,
    /// CLOCK_MONOTONIC when the driver call was issued and when it returned (0: not
    /// measured), so that its cost shows in the audit.
    #[serde(default)]
    pub issued_ns: u64,
    #[serde(default)]
    pub returned_ns: u64,
}

/// What a backend did on its own (not asked by a decision), or needs the controller to know.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// A controlled process exited (its queues went with it); its start time names which one
    /// (the pid may have a new owner by the time this is read).
    TargetGone { pid: u32, start_time: u64 },
    /// Queues the thread suspended or resumed without a request: new queues of a process held
    /// suspended as a whole, the watchdog, a fence.
    Acted {
        report: OpReport,
        suspend: bool,
        why: String,
    },
    /// After a per-queue ERROR the GPU is no longer preempted.
    Fenced { gpu_id: u32, why: String },
    /// A problem worth telling the operator about.
    Problem { pid: u32, text: String },
    /// A queue's hardware timeslice changed (set for an offline process, or put back).
    Timeslice {
        change: TimesliceChange,
        why: String,
    },
    /// The timeslice lever failed for this process; the policy pauses it instead.
    LeverFailed { pid: u32, text: String },
    /// A held process got out of its hold in a way the backend found itself (its frozen cgroup
    /// thawed, a thread outside it), and what was done about it.
    Escaped {
        pid: u32,
        kind: EscapeKind,
        text: String,
        answer: String,
    },
}

/// How a held process got out of its hold (docs/controller.md, "Escapes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapeKind {
    /// It resumed its own suspended queues (DBG_TRAP RESUME_QUEUES on itself).
    Resumed,
    /// Its debug session was disabled under the controller (its own DISABLE, or a third
    /// process's): the kernel resumed its queues.
    TrapDisabled,
    /// It enabled a debug session of its own, after ending the controller's.
    TrapTaken,
    /// Its frozen cgroup was thawed (`cgroup.freeze` written 0).
    Thawed,
    /// A thread of it runs outside the frozen cgroup (a threaded child of a cgroup other than
    /// the frozen one, or the process moved to another cgroup).
    Moved,
    /// A queue held suspended made progress (its read dispatch id moved) in a way no call
    /// seen explains.
    Progress,
}

impl EscapeKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::Resumed => "resumed",
            Self::TrapDisabled => "trap_disabled",
            Self::TrapTaken => "trap_taken",
            Self::Thawed => "thawed",
            Self::Moved => "moved",
            Self::Progress => "progress",
        }
    }

    /// What it did, for a sentence.
    pub fn what(self) -> &'static str {
        match self {
            Self::Resumed => "resumed its own suspended queues (DBG_TRAP RESUME_QUEUES on itself)",
            Self::TrapDisabled => "had the controller's debug session disabled (DBG_TRAP DISABLE)",
            Self::TrapTaken => "enabled a debug session of its own (DBG_TRAP ENABLE on itself)",
            Self::Thawed => "had its frozen cgroup thawed (cgroup.freeze written 0)",
            Self::Moved => "runs a thread outside its frozen cgroup",
            Self::Progress => "made GPU progress while held (its queue's dispatch ids moved)",
        }
    }
}
