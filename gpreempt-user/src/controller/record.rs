//! One line of the audit log (`run --audit FILE`, docs/controller.md's "Audit log"): what the
//! controller writes, what the metrics and the tests read back.
//!
//! The `action` key says what a line is. Fields are declared in alphabetical order and the
//! optional ones are left out when unset: a line is byte for byte what a sorted JSON map of the
//! same keys gives, so tools that parse the file see one format whatever wrote it.

use serde::{Deserialize, Serialize};

/// One audit record, tagged by its `action`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum AuditRecord {
    Suspend(Act),
    Resume(Act),
    /// A queue's hardware timeslice set or put back.
    Timeslice(TimesliceSet),
    /// The adaptive strategy's tuner concluded.
    Adapt(AdaptNote),
    /// The lever tuner switched a GPU's lever.
    Lever(LeverSwitch),
    /// A held process got out of its hold, and what the controller did about it.
    Escape(EscapeNote),
    /// A process's class was set or changed, and the rule that set it.
    Class(ClassNote),
}

impl AuditRecord {
    /// A suspend (`suspend`) or a resume of `act`.
    pub fn act(suspend: bool, act: impl Into<Act>) -> Self {
        if suspend {
            Self::Suspend(act.into())
        } else {
            Self::Resume(act.into())
        }
    }

    /// The suspend (true) or resume (false) this is, if it is one.
    pub fn as_act(&self) -> Option<(bool, &Act)> {
        match self {
            Self::Suspend(a) => Some((true, a)),
            Self::Resume(a) => Some((false, a)),
            _ => None,
        }
    }

    /// The process it is about (none for a GPU's records: `adapt`, `lever`).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Suspend(a) | Self::Resume(a) => Some(a.pid()),
            Self::Timeslice(t) => Some(t.pid),
            Self::Escape(e) => Some(e.pid),
            Self::Class(c) => Some(c.pid),
            Self::Adapt(_) | Self::Lever(_) => None,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Self::Suspend(a) | Self::Resume(a) => a.reason(),
            Self::Timeslice(t) => &t.reason,
            Self::Adapt(n) => &n.reason,
            Self::Lever(l) => &l.reason,
            Self::Escape(e) => &e.reason,
            Self::Class(c) => &c.reason,
        }
    }
}

/// A suspend or resume: the policy's decision, or an act nobody's policy decided (`by`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Act {
    /// Tried first when reading: only these lines have `by`.
    Direct(DirectAct),
    Decision(Box<DecisionAct>),
}

impl From<DecisionAct> for Act {
    fn from(d: DecisionAct) -> Self {
        Self::Decision(Box::new(d))
    }
}

impl From<DirectAct> for Act {
    fn from(d: DirectAct) -> Self {
        Self::Direct(d)
    }
}

impl Act {
    pub fn pid(&self) -> u32 {
        match self {
            Self::Direct(a) => a.pid,
            Self::Decision(d) => d.pid,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Self::Direct(a) => &a.reason,
            Self::Decision(d) => &d.reason,
        }
    }

    /// The queues whose state changed (none before the act, or when it failed).
    pub fn done(&self) -> &[u32] {
        match self {
            Self::Direct(a) => &a.done,
            Self::Decision(d) => d.done.as_deref().unwrap_or_default(),
        }
    }

    /// The decision behind it, if the policy decided it.
    pub fn decision(&self) -> Option<&DecisionAct> {
        match self {
            Self::Decision(d) => Some(d.as_ref()),
            Self::Direct(_) => None,
        }
    }
}

/// Who acted without a policy decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The control thread, on its own: the watchdog, new queues of a held process, a fence.
    Control,
    /// An operator's request (`suspend` / `resume` / `top`).
    Operator,
}

/// What the policy decided, and once acted on, what came of it. `ts_ns` to `emulated` are set
/// when it is decided; the rest once acted on (none under `--dry-run`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionAct {
    /// The freeze fallback's cgroup (`lever: freeze`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// From `trigger_ns` to `issued_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_latency_ns: Option<u64>,
    /// Queue ids by the kernel's per-queue status bits: changed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<Vec<u32>>,
    pub dry_run: bool,
    /// The GPU is `sim`'s (which sets `GPREEMPT_LABEL`).
    pub emulated: bool,
    /// Queue ids the kernel marked in error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Vec<u32>>,
    /// Why it could not act (then no outcome fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    pub gpu_id: u32,
    /// The SUSPEND grace period passed; null for RESUME or the kernel's default.
    pub grace: Option<u32>,
    /// Queue ids the kernel found invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<Vec<u32>>,
    /// When the ioctl or RM call was issued and returned (CLOCK_MONOTONIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_ns: Option<u64>,
    /// How it was acted on when not by suspending queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lever: Option<ActLever>,
    pub pid: u32,
    pub queues: Vec<u32>,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_ns: Option<u64>,
    /// The timeslice the `dynamic` lever set (0: put back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice_us: Option<u64>,
    /// The sample that showed online work; null when nothing triggered it.
    pub trigger_ns: Option<u64>,
    /// When it was decided.
    pub ts_ns: u64,
}

/// How a decision was carried out other than by suspending queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActLever {
    /// The queues kept running with a short timeslice (`timeslice_us`).
    Dynamic,
    /// The process's cgroup was frozen or thawed (`cgroup`).
    Freeze,
}

/// A suspend or resume done by the control thread or for an operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirectAct {
    pub by: By,
    pub done: Vec<u32>,
    pub pid: u32,
    pub reason: String,
    pub ts_ns: u64,
}

/// A queue's timeslice changed (levers `timeslice`, `dynamic`, `both`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimesliceSet {
    pub by: By,
    pub from_us: u64,
    pub issued_ns: u64,
    /// What it was before the controller first changed it.
    pub original_us: u64,
    pub pid: u32,
    pub reason: String,
    pub returned_ns: u64,
    pub to_us: u64,
    pub ts_ns: u64,
    /// The queue's id in the model (the key is the first driver's word for the scheduled unit:
    /// an NVIDIA TSG); last, as the key sorts.
    #[serde(rename = "tsg")]
    pub queue_id: u32,
}

/// A conclusion of the adaptive tuner (a calibration, a rung or lever choice).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptNote {
    pub emulated: bool,
    pub gpu_id: u32,
    /// Its figures.
    pub reason: String,
    pub ts_ns: u64,
}

/// A GPU's lever switched, levers named as the policy file names them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeverSwitch {
    pub dry_run: bool,
    pub from: String,
    /// The GPU's id.
    pub gpu: u32,
    pub reason: String,
    pub to: String,
    pub ts_ns: u64,
}

/// A held process escaped its hold (docs/controller.md, "Escapes").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EscapeNote {
    /// What the controller did: held it again, froze it, or why it could not.
    pub answer: String,
    /// Its escapes so far, this one included.
    pub count: u64,
    /// `resumed`, `trap_disabled`, `trap_taken`, `thawed`, `moved` or `progress`.
    pub kind: String,
    pub pid: u32,
    pub reason: String,
    pub ts_ns: u64,
}

/// A process classed (first sight, or a class change after a reload): by which rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassNote {
    pub class: String,
    pub pid: u32,
    /// The explanation's headline (`offline, by rule 2 (p.toml:9)`).
    pub reason: String,
    /// The rule (1-based), or `"default"` when none matched.
    pub rule: RuleRef,
    /// `file:line` of the rule; absent for the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_line: Option<String>,
    pub ts_ns: u64,
}

/// A rule by its 1-based index, or the policy's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RuleRef {
    Rule(usize),
    Default(DefaultRule),
}

/// The word `"default"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultRule {
    Default,
}

impl RuleRef {
    /// From a 0-based rule index (None: the default).
    pub fn of(index: Option<usize>) -> Self {
        index.map_or(Self::Default(DefaultRule::Default), |i| Self::Rule(i + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decided() -> DecisionAct {
        DecisionAct {
            dry_run: false,
            emulated: true,
            gpu_id: 0x3e9,
            grace: Some(50),
            pid: 200,
            queues: vec![0, 1],
            reason: "online pid 100 queue 0 busy (backlog 3)".into(),
            trigger_ns: Some(900),
            ts_ns: 1_000,
            ..DecisionAct::default()
        }
    }

    /// One record of each kind and shape the controller writes.
    fn every_kind() -> Vec<AuditRecord> {
        let done = DecisionAct {
            decision_latency_ns: Some(120),
            done: Some(vec![0]),
            error: Some(vec![]),
            invalid: Some(vec![1]),
            issued_ns: Some(1_020),
            returned_ns: Some(1_090),
            ..decided()
        };
        let dynamic = DecisionAct {
            lever: Some(ActLever::Dynamic),
            timeslice_us: Some(0),
            ..done.clone()
        };
        let frozen = DecisionAct {
            cgroup: Some("/sys/fs/cgroup/offline".into()),
            lever: Some(ActLever::Freeze),
            ..done.clone()
        };
        let failed = DecisionAct {
            failed: Some("pid 200 was reused".into()),
            grace: None,
            trigger_ns: None,
            ..decided()
        };
        vec![
            AuditRecord::act(true, decided()),
            AuditRecord::act(true, done),
            AuditRecord::act(false, dynamic),
            AuditRecord::act(true, frozen),
            AuditRecord::act(false, failed),
            AuditRecord::act(
                false,
                DirectAct {
                    by: By::Control,
                    done: vec![2],
                    pid: 7,
                    reason: "max_suspend 1s reached".into(),
                    ts_ns: 5,
                },
            ),
            AuditRecord::act(
                true,
                DirectAct {
                    by: By::Operator,
                    done: vec![],
                    pid: 7,
                    reason: "manual request".into(),
                    ts_ns: 6,
                },
            ),
            AuditRecord::Timeslice(TimesliceSet {
                by: By::Control,
                from_us: 1024,
                issued_ns: 10,
                original_us: 1024,
                pid: 8,
                reason: "dynamic lever".into(),
                returned_ns: 20,
                to_us: 100,
                ts_ns: 30,
                queue_id: 0xa,
            }),
            AuditRecord::Adapt(AdaptNote {
                emulated: false,
                gpu_id: 1,
                reason: "calibrated: no suspends".into(),
                ts_ns: 40,
            }),
            AuditRecord::Lever(LeverSwitch {
                dry_run: true,
                from: "none".into(),
                gpu: 2,
                reason: "calibrating".into(),
                to: "pause".into(),
                ts_ns: 50,
            }),
            AuditRecord::Class(ClassNote {
                class: "offline".into(),
                pid: 9,
                reason: "offline, by rule 2 (p.toml:9)".into(),
                rule: RuleRef::of(Some(1)),
                rule_line: Some("p.toml:9".into()),
                ts_ns: 60,
            }),
            AuditRecord::Class(ClassNote {
                class: "ignore".into(),
                pid: 10,
                reason: "ignore, the default (no rule matched)".into(),
                rule: RuleRef::of(None),
                rule_line: None,
                ts_ns: 70,
            }),
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for rec in every_kind() {
            let line = serde_json::to_string(&rec).unwrap();
            let back: AuditRecord = serde_json::from_str(&line).unwrap();
            assert_eq!(back, rec, "{line}");
        }
    }

    /// A typed record is byte for byte the line the same facts made as a `serde_json::Value`
    /// (a sorted map), built key by key as the controller's writer built it before it was typed.
    #[test]
    fn each_line_is_what_the_untyped_writer_wrote() {
        let d = decided();
        let mut untyped = serde_json::json!({
            "ts_ns": d.ts_ns, "gpu_id": d.gpu_id, "pid": d.pid, "action": "suspend",
            "queues": d.queues, "grace": d.grace, "reason": d.reason,
            "trigger_ns": d.trigger_ns, "dry_run": false, "emulated": true,
        });
        let typed = AuditRecord::act(true, d.clone());
        assert_eq!(serde_json::to_string(&typed).unwrap(), untyped.to_string());
        // Once acted on, under the dynamic lever.
        untyped["lever"] = serde_json::json!("dynamic");
        untyped["timeslice_us"] = serde_json::json!(250);
        untyped["done"] = serde_json::json!([0, 1]);
        untyped["invalid"] = serde_json::json!([]);
        untyped["error"] = serde_json::json!([]);
        untyped["issued_ns"] = serde_json::json!(1_020);
        untyped["returned_ns"] = serde_json::json!(1_090);
        untyped["decision_latency_ns"] = serde_json::json!(120);
        let typed = AuditRecord::act(
            true,
            DecisionAct {
                lever: Some(ActLever::Dynamic),
                timeslice_us: Some(250),
                done: Some(vec![0, 1]),
                invalid: Some(vec![]),
                error: Some(vec![]),
                issued_ns: Some(1_020),
                returned_ns: Some(1_090),
                decision_latency_ns: Some(120),
                ..d
            },
        );
        assert_eq!(serde_json::to_string(&typed).unwrap(), untyped.to_string());
        // Every kind: its line read as a map and written again is the same line.
        for rec in every_kind() {
            let line = serde_json::to_string(&rec).unwrap();
            let map: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(map.to_string(), line);
        }
    }

    /// Lines as the controller writes them (docs/controller.md's table) parse into their kinds.
    #[test]
    fn lines_as_written_parse() {
        let lines = [
            r#"{"action":"suspend","decision_latency_ns":41210,"done":[0],"dry_run":false,"emulated":true,"error":[],"gpu_id":1001,"grace":null,"invalid":[],"issued_ns":5200041210,"pid":4242,"queues":[0],"reason":"online pid 4100 queue 0 busy (backlog 3)","returned_ns":5200093000,"trigger_ns":5200000000,"ts_ns":5200030000}"#,
            r#"{"action":"resume","dry_run":true,"emulated":false,"gpu_id":1001,"grace":null,"pid":4242,"queues":[0],"reason":"online idle for 3ms","trigger_ns":null,"ts_ns":6}"#,
            r#"{"action":"suspend","dry_run":false,"emulated":false,"failed":"pid 4242: already traced by pid 9 (strace)","gpu_id":1001,"grace":null,"pid":4242,"queues":[0],"reason":"r","trigger_ns":3,"ts_ns":4}"#,
            r#"{"action":"resume","by":"control","done":[0,1],"pid":4242,"reason":"max_suspend 1s reached","ts_ns":7}"#,
            r#"{"action":"suspend","by":"operator","done":[0],"pid":4242,"reason":"manual request","ts_ns":8}"#,
            r#"{"action":"timeslice","by":"control","from_us":1024,"issued_ns":1,"original_us":1024,"pid":4242,"reason":"lever timeslice","returned_ns":2,"to_us":100,"ts_ns":3,"tsg":10}"#,
            r#"{"action":"adapt","emulated":true,"gpu_id":1001,"reason":"calibrated: no suspends","ts_ns":9}"#,
            r#"{"action":"lever","dry_run":false,"from":"none","gpu":1001,"reason":"calibrating: pause","to":"pause","ts_ns":10}"#,
            r#"{"action":"class","class":"offline","pid":4242,"reason":"offline, by rule 2 (/etc/gpreempt/policy.toml:9)","rule":2,"rule_line":"/etc/gpreempt/policy.toml:9","ts_ns":11}"#,
            r#"{"action":"class","class":"ignore","pid":4243,"reason":"ignore, the default (no rule matched)","rule":"default","ts_ns":12}"#,
        ];
        let parsed: Vec<AuditRecord> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        for (line, rec) in lines.iter().zip(&parsed) {
            assert_eq!(&serde_json::to_string(rec).unwrap(), line);
        }
        let AuditRecord::Suspend(Act::Decision(d)) = &parsed[0] else {
            panic!("{:?}", parsed[0]);
        };
        assert_eq!(
            (d.decision_latency_ns, d.trigger_ns, d.grace),
            (Some(41210), Some(5_200_000_000), None)
        );
        assert!(
            matches!(&parsed[2], AuditRecord::Suspend(a) if a.decision().is_some_and(|d| d.failed.is_some()))
        );
        assert!(
            matches!(&parsed[3], AuditRecord::Resume(Act::Direct(a)) if a.by == By::Control && a.done == [0, 1])
        );
        assert!(matches!(&parsed[4], AuditRecord::Suspend(Act::Direct(a)) if a.by == By::Operator));
        assert!(matches!(&parsed[5], AuditRecord::Timeslice(t) if t.queue_id == 10));
        assert!(matches!(&parsed[6], AuditRecord::Adapt(_)));
        assert!(matches!(&parsed[7], AuditRecord::Lever(l) if l.gpu == 1001 && l.to == "pause"));
        assert!(
            matches!(&parsed[8], AuditRecord::Class(c) if c.rule == RuleRef::Rule(2) && c.pid == 4242)
        );
        assert!(
            matches!(&parsed[9], AuditRecord::Class(c) if c.rule == RuleRef::of(None) && c.rule_line.is_none())
        );
    }
}
