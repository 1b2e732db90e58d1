//! Why a process is in its class: each rule tried, in order, with every matcher it has and
//! whether the process's facts pass it (`policy explain`, `queues --json`, top's detail pane).
//! [`Rule::matches`] is the same checks, so what is explained is what classifies.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Class, PidBound, Policy, Rule};
use crate::observe::{k8s, procinfo::ProcInfo};

/// One kind of matcher a rule can have, in the order a rule checks them (cheap ones first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Matcher {
    Pid,
    Uid,
    Gid,
    Comm,
    Cgroup,
    Qos,
    Container,
    Cmdline,
    K8sNamespace,
    Pod,
}

impl Matcher {
    pub const ALL: [Self; 10] = [
        Self::Pid,
        Self::Uid,
        Self::Gid,
        Self::Comm,
        Self::Cgroup,
        Self::Qos,
        Self::Container,
        Self::Cmdline,
        Self::K8sNamespace,
        Self::Pod,
    ];
}

/// One matcher of a rule against one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub matcher: Matcher,
    pub ok: bool,
    /// The process's value against the rule's, e.g. `uid 1000 is not 0`.
    pub text: String,
}

/// One rule tried against a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleTrial {
    /// 1-based, as `policy check` numbers rules.
    pub rule: usize,
    /// `file:line` of its `[[rule]]` header.
    pub at: String,
    pub class: Class,
    pub matched: bool,
    pub checks: Vec<Check>,
}

/// Why a process got its class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub pid: u32,
    pub comm: String,
    pub policy: String,
    pub class: Class,
    /// The rule that matched (1-based); None: the policy's default.
    pub rule: Option<usize>,
    /// `file:line` of that rule.
    pub rule_line: Option<String>,
    /// The rules tried, in order: every one up to the one that matched (all of them when none
    /// did).
    pub rules: Vec<RuleTrial>,
}

impl Rule {
    /// Whether the process passes `m`; None when the rule has no such matcher.
    pub fn check(&self, m: Matcher, info: &ProcInfo, pid: u32) -> Option<bool> {
        let pod = info.pod.as_ref();
        Some(match m {
            Matcher::Pid => {
                let p = self.pid?;
                p == pid
                    && match self.pid_bound {
                        PidBound::NotYet => true,
                        PidBound::Started(t) => info.start_time == t,
                        PidBound::NoProcess => false,
                    }
            }
            Matcher::Uid => info.uid == Some(self.uid?),
            Matcher::Gid => {
                let g = self.gid?;
                info.gid == Some(g) || info.groups.contains(&g)
            }
            Matcher::Comm => self.comm.as_ref()?.matches(&info.comm),
            Matcher::Cgroup => self.cgroup.as_ref()?.matches(&info.cgroup),
            Matcher::Qos => k8s::qos_class(&info.cgroup) == Some(self.qos?),
            Matcher::Container => {
                let g = self.container.as_ref()?;
                info.container.as_deref().is_some_and(|c| g.matches(c))
            }
            Matcher::Cmdline => self.cmdline.as_ref()?.is_match(&info.cmdline),
            Matcher::K8sNamespace => {
                let g = self.k8s_namespace.as_ref()?;
                pod.and_then(|p| p.namespace.as_deref())
                    .is_some_and(|n| g.matches(n))
            }
            Matcher::Pod => {
                let g = self.pod.as_ref()?;
                pod.and_then(|p| p.name.as_deref())
                    .is_some_and(|n| g.matches(n))
            }
        })
    }

    /// Every matcher the rule has, checked, with the process's value in words.
    pub fn checks(&self, info: &ProcInfo, pid: u32) -> Vec<Check> {
        Matcher::ALL
            .into_iter()
            .filter_map(|m| {
                let ok = self.check(m, info, pid)?;
                Some(Check {
                    matcher: m,
                    ok,
                    text: self.say(m, ok, info, pid),
                })
            })
            .collect()
    }

    fn say(&self, m: Matcher, ok: bool, info: &ProcInfo, pid: u32) -> String {
        let (is, matches) = if ok {
            ("is", "matches")
        } else {
            ("is not", "does not match")
        };
        let glob = |what: &str, value: Option<&str>, g: &Option<super::Glob>| {
            let want = g.as_ref().map_or("", |g| g.pattern());
            match value {
                Some(v) => format!("{what} {v:?} {matches} {want:?}"),
                None => format!("{what}: none (the rule wants {want:?})"),
            }
        };
        let pod = info.pod.as_ref();
        match m {
            Matcher::Pid => {
                let want = self.pid.unwrap_or_default();
                match self.pid_bound {
                    _ if pid != want => format!("pid {pid} is not {want}"),
                    PidBound::NoProcess => format!(
                        "no process had pid {want} when the policy was loaded: the rule \
                         matches nothing"
                    ),
                    PidBound::Started(t) if !ok => format!(
                        "pid {pid} is another process than the rule was bound to (started at \
                         tick {}, not {t})",
                        info.start_time
                    ),
                    _ => format!("pid {pid} is {want}"),
                }
            }
            Matcher::Uid => {
                let want = self.uid.unwrap_or_default();
                match info.uid {
                    Some(u) => format!("uid {u} {is} {want}"),
                    None => format!("uid unknown (/proc/{pid}/status unreadable) is not {want}"),
                }
            }
            Matcher::Gid => {
                let want = self.gid.unwrap_or_default();
                let gid = info.gid.map_or("unknown".into(), |g| g.to_string());
                let verb = if ok { "include" } else { "do not include" };
                format!("gid {gid} and groups {:?} {verb} {want}", info.groups)
            }
            Matcher::Comm => glob("comm", Some(&info.comm), &self.comm),
            Matcher::Cgroup => glob("cgroup", Some(&info.cgroup), &self.cgroup),
            Matcher::Qos => {
                let want = self.qos.map_or("", |q| q.label());
                match k8s::qos_class(&info.cgroup) {
                    Some(q) => format!("qos {q} {is} {want}"),
                    None => format!("qos: not in a Kubernetes pod (the rule wants {want})"),
                }
            }
            Matcher::Container => glob("container", info.container.as_deref(), &self.container),
            Matcher::Cmdline => {
                let want = self.cmdline.as_ref().map_or("", |r| r.as_str());
                format!("cmdline {:?} {matches} /{want}/", info.cmdline)
            }
            Matcher::K8sNamespace => glob(
                "k8s_namespace",
                pod.and_then(|p| p.namespace.as_deref()),
                &self.k8s_namespace,
            ),
            Matcher::Pod => glob("pod", pod.and_then(|p| p.name.as_deref()), &self.pod),
        }
    }
}

impl Policy {
    /// `file:line` of rule `i` (0-based).
    pub fn rule_line(&self, i: usize) -> Option<String> {
        self.rules
            .get(i)
            .map(|r| format!("{}:{}", self.source, r.line))
    }

    /// A class and the rule (0-based) that gave it, in words: `offline, by rule 2 (p.toml:9)`.
    pub fn verdict(&self, class: Class, rule: Option<usize>) -> String {
        match rule.and_then(|i| self.rule_line(i)) {
            Some(at) => format!("{class}, by rule {} ({at})", rule.unwrap_or_default() + 1),
            None => format!("{class}, the default (no rule matched)"),
        }
    }

    /// Why `pid` (with these `/proc` facts) is in its class: the same answer as
    /// [`Policy::classify`], with each rule tried.
    pub fn explain(&self, info: &ProcInfo, pid: u32) -> Explanation {
        let mut rules = Vec::new();
        let mut hit = None;
        for (i, r) in self.rules.iter().enumerate() {
            let checks = r.checks(info, pid);
            let matched = checks.iter().all(|c| c.ok);
            rules.push(RuleTrial {
                rule: i + 1,
                at: format!("{}:{}", self.source, r.line),
                class: r.class,
                matched,
                checks,
            });
            if matched {
                hit = Some(i);
                break;
            }
        }
        Explanation {
            pid,
            comm: info.comm.clone(),
            policy: self.source.clone(),
            class: hit.map_or(self.default_class, |i| self.rules[i].class),
            rule: hit.map(|i| i + 1),
            rule_line: hit.and_then(|i| self.rule_line(i)),
            rules,
        }
    }
}

impl Explanation {
    /// One line: the class and what gave it.
    pub fn headline(&self) -> String {
        match (self.rule, &self.rule_line) {
            (Some(n), Some(at)) => format!("{}, by rule {n} ({at})", self.class),
            _ => format!("{}, the default (no rule matched)", self.class),
        }
    }

    /// What `policy explain` prints: the headline, then one line per rule tried (its failed
    /// matchers; for the one that matched, what matched).
    pub fn text(&self) -> String {
        let mut out = format!(
            "pid {} ({}): {} [policy {}]\n",
            self.pid,
            self.comm,
            self.headline(),
            self.policy
        );
        for t in &self.rules {
            let _ = writeln!(out, "  {}", t.line());
        }
        if self.rules.is_empty() {
            out.push_str("  (the policy has no rules)\n");
        }
        out
    }
}

impl RuleTrial {
    /// `rule 2 (p.toml:9, online): did not match: uid 1000 is not 0`.
    pub fn line(&self) -> String {
        let (verdict, ok) = if self.matched {
            ("matched", true)
        } else {
            ("did not match", false)
        };
        let why: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.ok == ok)
            .map(|c| c.text.as_str())
            .collect();
        format!(
            "rule {} ({}, {}): {verdict}: {}",
            self.rule,
            self.at,
            self.class,
            why.join("; ")
        )
    }
}

#[cfg(test)]
mod tests;
