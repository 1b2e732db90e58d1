//! Classification: which class a process is in, by the first of the policy's rules that
//! matches its `/proc` facts (the policy's default when none does).

use super::{Class, Matcher, Policy, Rule};
use crate::observe::procinfo::ProcInfo;

impl Rule {
    /// Whether the process passes every matcher the rule has (policy/explain.rs says why).
    pub fn matches(&self, info: &ProcInfo, pid: u32) -> bool {
        Matcher::ALL
            .into_iter()
            .all(|m| self.check(m, info, pid) != Some(false))
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

impl Rule {
    /// Whether the rule pins something the process cannot choose for itself: its uid or group
    /// (set by root at login), its cgroup, container, pod or pod's QoS class (set by root, the
    /// runtime or kubelet), or a pid (the operator's, bound at load to the process that had it: a pid
    /// alone anyone can get once it is freed). `comm` and `cmdline` a process sets itself
    /// (prctl, argv).
    pub fn pins_identity(&self) -> bool {
        self.uid.is_some()
            || self.gid.is_some()
            || self.cgroup.is_some()
            || self.container.is_some()
            || self.k8s_namespace.is_some()
            || self.pod.is_some()
            || self.qos.is_some()
            || self.pid.is_some()
    }
}

/// What a [`Lint`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LintKind {
    /// No process can be both online and offline work: the controller never suspends anything.
    NeverActs,
    /// A rule on `comm`/`cmdline` alone: a process can claim or dodge it by renaming itself.
    Spoofable,
    /// A rule on `pid`: it names one process instance, and the pid is reused once that exits.
    Pid,
}

/// Something valid but probably wrong in a policy: the file parses, the controller would run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lint {
    pub kind: LintKind,
    /// The line it is about (a rule's `[[rule]]` header; 1 for the file as a whole).
    pub line: usize,
    /// The rule it is about (1-based), if any.
    pub rule: Option<usize>,
    /// What is wrong, without the file, line or rule number.
    pub text: String,
}

impl Lint {
    /// `file:LINE: warning: ...`, as `policy check` prints it.
    pub fn located(&self, source: &str) -> String {
        match self.rule {
            Some(n) => format!("{source}:{}: warning: rule {n} {}", self.line, self.text),
            None => format!("{source}:{}: warning: {}", self.line, self.text),
        }
    }
}

impl Policy {
    /// Everything [`Policy::trust_warnings`] names, and rules on `pid`, with their lines.
    pub fn lints(&self) -> Vec<Lint> {
        let mut out = Vec::new();
        // Nothing to act on: an empty file (or one without rules) is most likely a mistake.
        let classes: Vec<Class> = self
            .rules
            .iter()
            .map(|r| r.class)
            .chain([self.default_class])
            .collect();
        if !(classes.contains(&Class::Online) && classes.contains(&Class::Offline)) {
            out.push(Lint {
                kind: LintKind::NeverActs,
                line: 1,
                rule: None,
                text: format!(
                    "{} rule(s) and default {}: no process can be both online and offline work \
                     here, so the controller will never suspend anything",
                    self.rules.len(),
                    self.default_class.label()
                ),
            });
        }
        for (i, r) in self.rules.iter().enumerate() {
            if let Some(pid) = r.pid {
                out.push(Lint {
                    kind: LintKind::Pid,
                    line: r.line,
                    rule: Some(i + 1),
                    text: format!(
                        "matches pid {pid}: the controller binds it, at each load, to the process \
                         that has the pid then; after a restart or reload it names whoever has \
                         the pid, classed {} (pids are the host's, not a container's); pin uid, \
                         gid, cgroup or pod instead",
                        r.class.label()
                    ),
                });
            }
            if r.pins_identity() {
                continue;
            }
            let what = match r.class {
                Class::Online | Class::Ignore => format!(
                    "any local user can name a process to match it and be classed {}",
                    r.class.label()
                ),
                Class::Offline if self.default_class != Class::Offline => format!(
                    "an offline job can rename itself out of it and be classed {} (the default)",
                    self.default_class.label()
                ),
                Class::Offline => continue,
            };
            out.push(Lint {
                kind: LintKind::Spoofable,
                line: r.line,
                rule: Some(i + 1),
                text: format!(
                    "matches only on comm/cmdline, which a process sets itself: {what}; add uid, \
                     gid or cgroup"
                ),
            });
        }
        out
    }

    /// Rules any local user can satisfy or dodge by renaming a process, and a policy that can
    /// never act: one line each, for `run` to print at start. An online or ignore rule on
    /// `comm`/`cmdline` alone lets any process claim that class; an offline one lets an offline
    /// job leave it for the default.
    pub fn trust_warnings(&self) -> Vec<String> {
        let notes = self.pid_notes.iter().cloned();
        notes
            .chain(
                self.lints()
                    .into_iter()
                    .filter_map(|l| match (l.kind, l.rule) {
                        (LintKind::NeverActs, _) => Some(format!("{}: {}", self.source, l.text)),
                        (LintKind::Spoofable, Some(n)) => Some(format!(
                            "{}: rule {n} (line {}) {}",
                            self.source, l.line, l.text
                        )),
                        _ => None,
                    }),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(comm: &str, uid: u32, gid: u32, groups: &[u32]) -> ProcInfo {
        ProcInfo {
            comm: comm.into(),
            uid: Some(uid),
            gid: Some(gid),
            groups: groups.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn gid_matches_the_primary_or_a_supplementary_group() {
        let p = Policy::parse("[[rule]]\nclass = \"online\"\ngid = 990\n", "p.toml").unwrap();
        assert_eq!(p.classify(&info("svc", 5, 990, &[]), 1).0, Class::Online);
        assert_eq!(
            p.classify(&info("svc", 5, 100, &[4, 990]), 1).0,
            Class::Online
        );
        assert_eq!(p.classify(&info("svc", 5, 100, &[4]), 1).0, p.default_class);
    }

    /// A pid is not an identity: a `pid` rule is bound at load to the process that has the pid
    /// then, and a process that gets the pid later (another start time) falls to the default;
    /// a rule for a pid nobody has matches nothing. Each binding is said.
    #[test]
    fn pid_rules_are_bound_to_the_process_that_had_the_pid_at_load() {
        let root = std::env::temp_dir().join(format!("gpreempt-pidrule-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("4242")).unwrap();
        let stat = |start: u64| {
            format!(
                "4242 (job) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 4 0 {start} 1 1\n"
            )
        };
        std::fs::write(root.join("4242/stat"), stat(1000)).unwrap();
        let text =
            "[policy]\ndefault = \"ignore\"\n\n[[rule]]\nclass = \"offline\"\npid = 4242\n\n\
                    [[rule]]\nclass = \"online\"\npid = 4343\n";
        let mut p = Policy::parse(text, "p.toml").unwrap();
        p.bind_pids(&root);
        let at = |start_time| ProcInfo {
            start_time,
            ..info("job", 1000, 1000, &[])
        };
        assert_eq!(p.classify(&at(1000), 4242), (Class::Offline, Some(0)));
        assert_eq!(p.classify(&at(1001), 4242), (Class::Ignore, None));
        assert_eq!(p.classify(&at(1000), 4343), (Class::Ignore, None));
        let w = p.trust_warnings();
        assert!(
            w.iter().any(|l| l.starts_with(
                "p.toml: rule 1 (line 4): pid 4242 is bound to the \
                 process that has it now (started at tick 1000)"
            )),
            "{w:#?}"
        );
        assert!(
            w.iter().any(|l| l.starts_with(
                "p.toml: rule 2 (line 8): no process has pid 4343: \
                 the rule matches nothing"
            )),
            "{w:#?}"
        );
        // A reload binds again: the pid's owner now.
        std::fs::write(root.join("4242/stat"), stat(1001)).unwrap();
        p.bind_pids(&root);
        assert_eq!(p.classify(&at(1001), 4242), (Class::Offline, Some(0)));
        assert_eq!(p.classify(&at(1000), 4242), (Class::Ignore, None));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_policy_that_can_never_act_is_named() {
        let w = Policy::parse("", "empty.toml").unwrap().trust_warnings();
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with("empty.toml: 0 rule(s) and default ignore: no process can be both")
                && w[0].ends_with("never suspend anything"),
            "{}",
            w[0]
        );
        let p = Policy::parse(
            "[[rule]]\nclass = \"online\"\nuid = 5\n",
            "online-only.toml",
        )
        .unwrap();
        assert_eq!(p.trust_warnings().len(), 1);
    }

    #[test]
    fn rules_a_process_can_satisfy_by_renaming_itself_are_named() {
        let p = Policy::parse(
            "[[rule]]\nclass = \"online\"\ncomm = \"triton*\"\n\n\
             [[rule]]\nclass = \"online\"\ncomm = \"vllm\"\nuid = 990\n\n\
             [[rule]]\nclass = \"ignore\"\ncmdline = 'bash'\n\n\
             [[rule]]\nclass = \"offline\"\ncomm = \"train\"\n\n\
             [[rule]]\nclass = \"online\"\ncomm = \"svc\"\ncgroup = \"/system.slice/svc.service\"\n",
            "p.toml",
        )
        .unwrap();
        let w = p.trust_warnings();
        assert_eq!(w.len(), 3, "{w:#?}");
        assert!(
            w[0].starts_with("p.toml: rule 1 (line 1) matches only on comm/cmdline")
                && w[0].contains("classed online"),
            "{}",
            w[0]
        );
        assert!(
            w[1].starts_with("p.toml: rule 3 ") && w[1].contains("classed ignore"),
            "{}",
            w[1]
        );
        // With an online default, an offline rule on comm alone can be dodged.
        let p = Policy::parse(
            "[policy]\ndefault = \"online\"\n\n[[rule]]\nclass = \"offline\"\ncomm = \"train\"\n",
            "q.toml",
        )
        .unwrap();
        let w = p.trust_warnings();
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].contains("rename itself out of it and be classed online"),
            "{}",
            w[0]
        );
    }

    #[test]
    fn the_control_group_is_parsed_and_checked() {
        let p = Policy::parse("[control]\ngroup = \"gpu-admins\"\n", "p.toml").unwrap();
        assert_eq!(p.control_group.as_deref(), Some("gpu-admins"));
        assert_eq!(p.control_group_line, Some(2));
        assert_eq!(Policy::parse("", "p.toml").unwrap().control_group, None);
        let e = Policy::parse("[control]\ngroup = \"a b\"\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a group name"), "{e}");
        let e = Policy::parse("[control]\nowner = \"x\"\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[control]: unknown key \"owner\""), "{e}");
    }
}
