//! The `[[rule]]` tables, and the limits that keep a rule's regex from costing more than a line
//! of policy should (per rule, and for all rules together).

use regex::Regex;
use toml::de::DeValue;

use super::super::{Class, Glob, PidBound, Rule};
use super::{Parser, Val};

impl Parser<'_> {
    pub(super) fn rules(&mut self, v: &Val, out: &mut Vec<Rule>) {
        let DeValue::Array(a) = v.get_ref() else {
            self.err(v.span().start, "rule: rules are [[rule]] tables".into());
            return;
        };
        for (i, r) in a.iter().enumerate() {
            let n = i + 1;
            let header = r.span().start;
            let Some(t) = self.table(r, &format!("rule {n}")) else {
                continue;
            };
            let mut rule = Rule {
                class: Class::Ignore,
                line: self.line(header),
                comm: None,
                cmdline: None,
                uid: None,
                gid: None,
                cgroup: None,
                container: None,
                k8s_namespace: None,
                pod: None,
                qos: None,
                pid: None,
                pid_bound: PidBound::NotYet,
                slo_p99_ns: None,
            };
            let mut class = None;
            let mut matchers = 0;
            let mut bad = false;
            for (k, v) in t.iter() {
                let key = k.get_ref().as_ref();
                let ok = self.rule_key(n, key, k.span().start, v, &mut rule, &mut class);
                bad |= !ok;
                if ok && key != "class" && key != "slo_p99" {
                    matchers += 1;
                }
            }
            if class.is_none() && !t.iter().any(|(k, _)| k.get_ref().as_ref() == "class") {
                self.err(
                    header,
                    format!(
                        "rule {n}: no class (add class = \"online\", \"offline\" or \"ignore\")"
                    ),
                );
            }
            // A rule whose only matchers are invalid was already reported.
            if matchers == 0 && !bad {
                self.err(
                    header,
                    format!(
                        "rule {n}: no matcher: it would match every process (add comm, cmdline, \
                         uid, gid, cgroup, container, k8s_namespace, pod, qos or pid; use \
                         `default` for everything else)"
                    ),
                );
            }
            if let Some(c) = class {
                rule.class = c;
            }
            if rule.slo_p99_ns.is_some() && class.is_some_and(|c| c != Class::Online) {
                self.err(
                    header,
                    format!(
                        "rule {n}: slo_p99 is an online service's goal: it needs \
                         class = \"online\""
                    ),
                );
            }
            out.push(rule);
        }
    }

    /// One key of rule `n`, into `rule` (or `class`); false when it is wrong (already said).
    fn rule_key(
        &mut self,
        n: usize,
        key: &str,
        key_at: usize,
        v: &Val,
        rule: &mut Rule,
        class: &mut Option<Class>,
    ) -> bool {
        let ctx = format!("rule {n}: {key}");
        let at = v.span().start;
        match key {
            "class" => {
                *class = self.class(v, &ctx);
                class.is_some()
            }
            "comm" | "cgroup" | "container" | "k8s_namespace" | "pod" => {
                let g = self.string(v, &ctx).map(|s| (s, Glob::new(s)));
                match g {
                    Some((_, Ok(g))) => {
                        *match key {
                            "comm" => &mut rule.comm,
                            "cgroup" => &mut rule.cgroup,
                            "k8s_namespace" => &mut rule.k8s_namespace,
                            "pod" => &mut rule.pod,
                            _ => &mut rule.container,
                        } = Some(g);
                        true
                    }
                    Some((s, Err(e))) => {
                        self.err(at, format!("{ctx}: invalid glob {s:?}: {e}"));
                        false
                    }
                    None => false,
                }
            }
            "cmdline" => match self.string(v, &ctx) {
                Some(s) => match rule_regex(s, REGEX_BUDGET - self.regex_used) {
                    Ok((re, cost)) => {
                        self.regex_used += cost;
                        rule.cmdline = Some(re);
                        true
                    }
                    Err(why) => {
                        self.err(at, format!("{ctx}: {why}"));
                        false
                    }
                },
                None => false,
            },
            "qos" => match self.string(v, &ctx) {
                Some(s) => match crate::observe::k8s::Qos::parse(s) {
                    Some(q) => {
                        rule.qos = Some(q);
                        true
                    }
                    None => {
                        self.err(
                            at,
                            format!(
                                "{ctx}: {s:?} is not a Kubernetes QoS class (expected \
                                 \"BestEffort\", \"Burstable\" or \"Guaranteed\", spelled as \
                                 Kubernetes spells them)"
                            ),
                        );
                        false
                    }
                },
                None => false,
            },
            "uid" => {
                rule.uid = self.integer(v, &ctx).map(|n| n as u32);
                rule.uid.is_some()
            }
            "gid" => {
                rule.gid = self.integer(v, &ctx).map(|n| n as u32);
                rule.gid.is_some()
            }
            "pid" => {
                rule.pid = self.integer(v, &ctx).map(|n| n as u32);
                rule.pid.is_some()
            }
            "slo_p99" => match self.duration(v, &ctx) {
                Some(0) => {
                    self.err(at, format!("{ctx}: must be more than 0"));
                    false
                }
                Some(ns) => {
                    rule.slo_p99_ns = Some(ns);
                    true
                }
                None => false,
            },
            other => {
                self.err(
                    key_at,
                    format!(
                        "rule {n}: unknown key {other:?} (expected class, comm, cmdline, \
                         uid, gid, cgroup, container, k8s_namespace, pod, qos, pid or \
                         slo_p99)"
                    ),
                );
                false
            }
        }
    }
}

/// A rule's regex may compile to at most this (the regex crate's `size_limit`; its default is
/// 10 MiB, which lets one line of policy cost that much).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Each regex's lazy DFA cache, at most (`dfa_size_limit`): grown only as matching needs it.
pub const REGEX_DFA_LIMIT: usize = 256 << 10;
/// What all the rules' compiled regexes may use together (their `memory_usage`).
pub const REGEX_BUDGET: usize = 32 << 20;

/// A pattern for a message: at most 60 characters.
fn short(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}

/// Compiles one rule's regex within the per-rule limits and what is `left` of the budget; the
/// regex and what it costs, or the reason (what to do included).
/// A rule's pattern may be at most this long: parsing one allocates many times its length
/// before the compiled-size limit can refuse it (a 15 MiB literal peaked at 1.5 GB).
pub const MAX_PATTERN_BYTES: usize = 4096;

fn rule_regex(s: &str, left: usize) -> Result<(Regex, usize), String> {
    if s.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "regex {} is {} bytes: longer than the {MAX_PATTERN_BYTES} a rule's pattern may be",
            short(s),
            s.len()
        ));
    }
    let too_big = |what: String| {
        format!(
            "regex {} {what}; simplify it: fewer or smaller counted repetitions ({{n}}), ASCII \
             classes such as [0-9A-Za-z_] or (?-u:\\w) instead of Unicode \\w",
            short(s)
        )
    };
    let re = regex::RegexBuilder::new(s)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => too_big(format!(
                "compiles to more than {} KiB, the limit of one rule",
                limit >> 10
            )),
            e => format!("invalid regex {}: {}", short(s), regex_msg(&e)),
        })?;
    // The same engine with the same limits, for its size (`regex::Regex` does not tell it).
    let cost = regex_automata::meta::Regex::builder()
        .configure(
            regex_automata::meta::Config::new()
                .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                .hybrid_cache_capacity(REGEX_DFA_LIMIT),
        )
        .build(s)
        .map_or(REGEX_SIZE_LIMIT, |m| m.memory_usage());
    if cost > left {
        return Err(too_big(format!(
            "needs {} KiB, more than the {} KiB left of the {} MiB all rules' regexes may use \
             together",
            cost.div_ceil(1024),
            left >> 10,
            REGEX_BUDGET >> 20
        )));
    }
    Ok((re, cost))
}

/// The regex crate's message on one line: its last `error: ...` line.
fn regex_msg(e: &regex::Error) -> String {
    let s = e.to_string();
    s.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map_or_else(
            || s.split_whitespace().collect::<Vec<_>>().join(" "),
            str::to_owned,
        )
}
