//! Classification: which class a process is in, by the first of the policy's rules that
//! matches its `/proc` facts (the policy's default when none does).

use super::{Class, Policy, Rule};
use crate::observe::procinfo::ProcInfo;

impl Rule {
    /// Whether the process passes every matcher the rule has.
    pub fn matches(&self, info: &ProcInfo, pid: u32) -> bool {
        self.pid.is_none_or(|p| p == pid)
            && self.uid.is_none_or(|u| info.uid == Some(u))
            && self.comm.as_ref().is_none_or(|g| g.matches(&info.comm))
            && self.cgroup.as_ref().is_none_or(|g| g.matches(&info.cgroup))
            && self
                .container
                .as_ref()
                .is_none_or(|g| info.container.as_deref().is_some_and(|c| g.matches(c)))
            && self
                .cmdline
                .as_ref()
                .is_none_or(|r| r.is_match(&info.cmdline))
    }
}

impl Policy {
    /// The class of a process and the index of the rule that decided it (None: the default).
    pub fn classify(&self, info: &ProcInfo, pid: u32) -> (Class, Option<usize>) {
        self.rules
            .iter()
            .position(|r| r.matches(info, pid))
            .map_or((self.default_class, None), |i| {
                (self.rules[i].class, Some(i))
            })
    }
}
