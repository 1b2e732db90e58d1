//! The preemption policy: a TOML file that classifies processes as online, offline or ignored,
//! and the engine that turns the host model into SUSPEND/RESUME decisions once per tick.
//!
//! The engine is a pure function of (host state, its own memory, `now`): no clock, no I/O. The
//! controller acts on its [`Decision`]s and reports back through [`Engine::confirm`], so the
//! engine only believes a queue is suspended once the kernel said so.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use regex::Regex;
use serde::Serialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::model::{Process, QueueState, SampleStatus, State};
use crate::observe::procinfo::ProcInfo;

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

    fn parse(s: &str) -> Option<Self> {
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
}

/// A shell-style glob: `*` (any run of characters, `/` included), `?` (one character),
/// `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]`, and `\` to quote the next character. Matches the whole
/// string.
#[derive(Clone, Debug)]
pub struct Glob {
    pattern: String,
    toks: Vec<Tok>,
}

#[derive(Clone, Debug)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class {
        negate: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Self, String> {
        let mut toks = Vec::new();
        let mut it = pattern.chars().peekable();
        while let Some(c) = it.next() {
            toks.push(match c {
                '*' => {
                    // `**` means the same as `*`.
                    if matches!(toks.last(), Some(Tok::Star)) {
                        continue;
                    }
                    Tok::Star
                }
                '?' => Tok::Any,
                '\\' => Tok::Lit(it.next().ok_or("dangling '\\' at the end")?),
                '[' => {
                    let negate = it.next_if(|&c| c == '!' || c == '^').is_some();
                    let mut ranges = Vec::new();
                    let mut closed = false;
                    let mut first = true;
                    while let Some(c) = it.next() {
                        // A `]` first in the set is a literal (POSIX).
                        if c == ']' && !first {
                            closed = true;
                            break;
                        }
                        first = false;
                        let lo = if c == '\\' {
                            it.next().ok_or("dangling '\\' in a [...] set")?
                        } else {
                            c
                        };
                        let mut hi = lo;
                        if it.peek() == Some(&'-') {
                            let mut ahead = it.clone();
                            ahead.next();
                            match ahead.peek() {
                                Some(&']') | None => {}
                                Some(_) => {
                                    it.next();
                                    let h = it.next().ok_or("unclosed '['")?;
                                    hi = if h == '\\' {
                                        it.next().ok_or("dangling '\\' in a [...] set")?
                                    } else {
                                        h
                                    };
                                    if hi < lo {
                                        return Err(format!("range '{lo}-{hi}' is reversed"));
                                    }
                                }
                            }
                        }
                        ranges.push((lo, hi));
                    }
                    if !closed {
                        return Err("unclosed '['".into());
                    }
                    Tok::Class { negate, ranges }
                }
                c => Tok::Lit(c),
            });
        }
        Ok(Self {
            pattern: pattern.to_owned(),
            toks,
        })
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn matches(&self, s: &str) -> bool {
        // Iterative matching with one backtrack point (the last `*`): linear in practice,
        // O(pattern x text) at worst, never exponential.
        let text: Vec<char> = s.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            let step = match self.toks.get(p) {
                Some(Tok::Star) => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                Some(Tok::Lit(c)) => *c == text[t],
                Some(Tok::Any) => true,
                Some(Tok::Class { negate, ranges }) => {
                    let c = text[t];
                    ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negate
                }
                None => false,
            };
            if step {
                p += 1;
                t += 1;
            } else if let Some((sp, st)) = star {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            } else {
                return false;
            }
        }
        self.toks[p..].iter().all(|t| matches!(t, Tok::Star))
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
    pub cgroup: Option<Glob>,
    pub container: Option<Glob>,
    pub pid: Option<u32>,
}

impl Rule {
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
}

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
        }
    }
}

/// Everything wrong with a policy file, one problem per line, each `source:LINE: ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub source: String,
    /// (1-based line, message), in line order.
    pub problems: Vec<(usize, String)>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (line, msg)) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}:{line}: {msg}", self.source)?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyError {}

impl Policy {
    /// Parses and validates a policy file's text; `source` names it in messages.
    pub fn parse(text: &str, source: &str) -> Result<Policy, PolicyError> {
        let mut p = Parser {
            text,
            problems: Vec::new(),
        };
        let policy = p.document(source);
        if p.problems.is_empty() {
            if let Some(policy) = policy {
                return Ok(policy);
            }
        }
        let mut problems = p.problems;
        // Stable: problems on one line keep the order they were found in.
        problems.sort_by_key(|(line, _)| *line);
        problems.dedup();
        Err(PolicyError {
            source: source.to_owned(),
            problems,
        })
    }

    /// Reads and parses a policy file.
    pub fn load(path: &Path) -> anyhow::Result<Policy> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read policy file {}", path.display()))?;
        Ok(Self::parse(&text, &path.display().to_string())?)
    }

    /// The class of a process and the index of the rule that decided it (None: the default).
    pub fn classify(&self, info: &ProcInfo, pid: u32) -> (Class, Option<usize>) {
        self.rules
            .iter()
            .position(|r| r.matches(info, pid))
            .map_or((self.default_class, None), |i| {
                (self.rules[i].class, Some(i))
            })
    }

    pub fn manages(&self, gpu_id: u32) -> bool {
        self.gpus
            .as_ref()
            .is_none_or(|g| g.binary_search(&gpu_id).is_ok())
    }

    /// One line for logs: the strategy and its timings.
    pub fn summary(&self) -> String {
        let strategy = match self.strategy {
            Strategy::Priority => "priority".to_owned(),
            Strategy::Timeslice { period_ns, share } => {
                format!("timeslice period {} share {share}", fmt_ns(period_ns))
            }
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
             min_interval {}, gpus {gpus}, {} rule(s), default {}, launch hints {}",
            self.source,
            fmt_ns(self.window_ns),
            fmt_ns(self.resume_after_ns),
            fmt_ns(self.max_suspend_ns),
            fmt_ns(self.min_run_ns),
            fmt_ns(self.min_interval_ns),
            self.rules.len(),
            self.default_class,
            if self.launch_hints { "on" } else { "off" }
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

/// Parses `20ms`, `1.5s`, `500us`, `100ns` into nanoseconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    const HINT: &str = "(use e.g. 500us, 20ms, 1.5s)";
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("negative duration {s:?} {HINT}"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u128 = match unit.trim_start() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" => return Err(format!("duration {s:?} has no unit {HINT}")),
        _ => return Err(format!("invalid duration {s:?} {HINT}")),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("invalid duration {s:?} {HINT}"));
    }
    let digits = |d: &str| -> Result<u128, String> {
        if d.is_empty() {
            return Ok(0);
        }
        d.parse::<u128>()
            .map_err(|_| format!("duration {s:?} is too large"))
    };
    let mut ns = digits(int)?
        .checked_mul(scale)
        .ok_or_else(|| format!("duration {s:?} is too large"))?;
    // Fractional digits beyond nanoseconds are dropped.
    let frac = &frac[..frac.len().min(12)];
    if !frac.is_empty() {
        ns += digits(frac)? * scale / 10u128.pow(frac.len() as u32);
    }
    u64::try_from(ns).map_err(|_| format!("duration {s:?} is too large"))
}

type Val<'i> = Spanned<DeValue<'i>>;

/// Walks the parsed document, collecting every problem with its line.
struct Parser<'t> {
    text: &'t str,
    problems: Vec<(usize, String)>,
}

impl Parser<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn err(&mut self, offset: usize, msg: String) {
        let line = self.line(offset);
        self.problems.push((line, msg));
    }

    fn document(&mut self, source: &str) -> Option<Policy> {
        let (doc, errors) = DeTable::parse_recoverable(self.text);
        if !errors.is_empty() {
            // The parser recovers and goes on; a second error on the same line is mostly its
            // consequence.
            for e in errors {
                let line = self.line(e.span().map_or(0, |s| s.start));
                if !self.problems.iter().any(|(l, _)| *l == line) {
                    let msg = format!("TOML syntax error: {}", e.message());
                    self.problems.push((line, msg));
                }
            }
            return None;
        }
        let mut policy = Policy {
            source: source.to_owned(),
            ..Policy::default()
        };
        let mut policy_table: Option<(&DeTable, usize)> = None;
        let mut timeslice: Option<(&DeTable, usize)> = None;
        let mut rules: Option<&Val> = None;
        for (k, v) in doc.get_ref().iter() {
            match k.get_ref().as_ref() {
                "policy" => policy_table = self.table(v, "[policy]").map(|t| (t, v.span().start)),
                "timeslice" => {
                    timeslice = self.table(v, "[timeslice]").map(|t| (t, v.span().start))
                }
                "rule" => rules = Some(v),
                other => self.err(
                    k.span().start,
                    format!("unknown key {other:?} (expected [policy], [timeslice] or [[rule]])"),
                ),
            }
        }
        // Where relation errors about defaulted keys point.
        let policy_at = policy_table.map_or(0, |(_, at)| at);
        let mut strategy_timeslice = false;
        let mut at = Ats::default();
        if let Some((t, _)) = policy_table {
            for (k, v) in t.iter() {
                let key = k.get_ref().as_ref();
                let span = v.span().start;
                match key {
                    "strategy" => match self.string(v, key) {
                        Some("priority") => strategy_timeslice = false,
                        Some("timeslice") => strategy_timeslice = true,
                        Some(other) => self.err(
                            span,
                            format!(
                                "strategy: unknown strategy {other:?} \
                                 (use \"priority\" or \"timeslice\")"
                            ),
                        ),
                        None => {}
                    },
                    "window" | "resume_after" | "max_suspend" | "min_run" | "min_interval" => {
                        let Some(ns) = self.duration(v, key) else {
                            continue;
                        };
                        let (slot, slot_at) = match key {
                            "window" => (&mut policy.window_ns, &mut at.window),
                            "resume_after" => (&mut policy.resume_after_ns, &mut at.resume_after),
                            "max_suspend" => (&mut policy.max_suspend_ns, &mut at.max_suspend),
                            "min_run" => (&mut policy.min_run_ns, &mut at.min_run),
                            _ => (&mut policy.min_interval_ns, &mut at.min_interval),
                        };
                        *slot = ns;
                        *slot_at = Some(span);
                    }
                    "grace" => policy.grace = self.integer(v, key).map(|g| g as u32),
                    "launch_hints" => match v.get_ref() {
                        DeValue::Boolean(b) => policy.launch_hints = *b,
                        other => self.err(
                            span,
                            format!(
                                "launch_hints: expected true or false, found {}",
                                other.type_str()
                            ),
                        ),
                    },
                    "gpus" => policy.gpus = self.gpus(v),
                    "default" => {
                        if let Some(c) = self.class(v, key) {
                            policy.default_class = c;
                        }
                    }
                    other => self.err(
                        k.span().start,
                        format!(
                            "[policy]: unknown key {other:?} (expected strategy, window, \
                             resume_after, max_suspend, min_run, min_interval, grace, gpus, \
                             default or launch_hints)"
                        ),
                    ),
                }
            }
        }
        let mut period = DEFAULT_PERIOD_NS;
        let mut share = DEFAULT_SHARE;
        let mut period_at = None;
        let mut share_at = None;
        if let Some((t, header)) = timeslice {
            if !strategy_timeslice {
                self.err(
                    header,
                    "[timeslice] is used only with strategy = \"timeslice\" \
                     (set it in [policy], or remove this table)"
                        .into(),
                );
            }
            for (k, v) in t.iter() {
                let key = k.get_ref().as_ref();
                match key {
                    "period" => {
                        if let Some(ns) = self.duration(v, key) {
                            period = ns;
                            period_at = Some(v.span().start);
                        }
                    }
                    "share" => {
                        if let Some(s) = self.float(v, key) {
                            share = s;
                            share_at = Some(v.span().start);
                        }
                    }
                    other => self.err(
                        k.span().start,
                        format!("[timeslice]: unknown key {other:?} (expected period or share)"),
                    ),
                }
            }
        }
        if let Some(v) = rules {
            self.rules(v, &mut policy.rules);
        }

        // Relations between values, pointing at the key (or its table when defaulted).
        let here = |a: Option<usize>| a.unwrap_or(policy_at);
        if policy.window_ns == 0 {
            self.err(here(at.window), "window: must be more than 0".into());
        }
        if policy.min_run_ns == 0 {
            self.err(here(at.min_run), "min_run: must be more than 0".into());
        }
        if policy.max_suspend_ns < policy.window_ns {
            self.err(
                here(at.max_suspend.or(at.window)),
                format!(
                    "max_suspend: {} is shorter than window {} (the guard would fire before \
                     online work could be seen)",
                    fmt_ns(policy.max_suspend_ns),
                    fmt_ns(policy.window_ns)
                ),
            );
        }
        if strategy_timeslice {
            let ts_at = timeslice.map_or(policy_at, |(_, h)| h);
            if period == 0 {
                self.err(
                    period_at.unwrap_or(ts_at),
                    "period: must be more than 0".into(),
                );
            }
            if !(share > 0.0 && share < 1.0) {
                self.err(
                    share_at.unwrap_or(ts_at),
                    format!("share: {share} is out of range (0 < share < 1)"),
                );
            } else if period > 0 {
                let off = off_ns(period, share);
                if policy.max_suspend_ns < off {
                    self.err(
                        here(at.max_suspend),
                        format!(
                            "max_suspend: {} is shorter than the suspended part of a timeslice \
                             period ({}): the starvation guard would break every period",
                            fmt_ns(policy.max_suspend_ns),
                            fmt_ns(off)
                        ),
                    );
                }
            }
            policy.strategy = Strategy::Timeslice {
                period_ns: period,
                share,
            };
        }
        Some(policy)
    }

    fn table<'a, 'i>(&mut self, v: &'a Val<'i>, what: &str) -> Option<&'a DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.err(
                    v.span().start,
                    format!("{what} must be a table, not {}", other.type_str()),
                );
                None
            }
        }
    }

    fn string<'a>(&mut self, v: &'a Val, key: &str) -> Option<&'a str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.err(
                    v.span().start,
                    format!("{key}: expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    fn duration(&mut self, v: &Val, key: &str) -> Option<u64> {
        if let DeValue::Integer(_) | DeValue::Float(_) = v.get_ref() {
            self.err(
                v.span().start,
                format!(
                    "{key}: a duration needs a unit and quotes, e.g. \"{}ms\"",
                    self.text.get(v.span()).unwrap_or("20")
                ),
            );
            return None;
        }
        let s = self.string(v, key)?;
        match parse_duration(s) {
            Ok(ns) => Some(ns),
            Err(e) => {
                self.err(v.span().start, format!("{key}: {e}"));
                None
            }
        }
    }

    /// A non-negative integer that fits a u32.
    fn integer(&mut self, v: &Val, key: &str) -> Option<u64> {
        let DeValue::Integer(i) = v.get_ref() else {
            self.err(
                v.span().start,
                format!(
                    "{key}: expected an integer, found {}",
                    v.get_ref().type_str()
                ),
            );
            return None;
        };
        match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if (0..=i128::from(u32::MAX)).contains(&n) => Some(n as u64),
            _ => {
                self.err(
                    v.span().start,
                    format!("{key}: {} is out of range (0 to {})", i, u32::MAX),
                );
                None
            }
        }
    }

    fn float(&mut self, v: &Val, key: &str) -> Option<f64> {
        let parsed = match v.get_ref() {
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n as f64),
            _ => None,
        };
        if parsed.is_none() {
            self.err(
                v.span().start,
                format!("{key}: expected a number, found {}", v.get_ref().type_str()),
            );
        }
        parsed
    }

    fn class(&mut self, v: &Val, key: &str) -> Option<Class> {
        let s = self.string(v, key)?;
        let c = Class::parse(s);
        if c.is_none() {
            self.err(
                v.span().start,
                format!("{key}: unknown class {s:?} (use \"online\", \"offline\" or \"ignore\")"),
            );
        }
        c
    }

    fn gpus(&mut self, v: &Val) -> Option<Vec<u32>> {
        match v.get_ref() {
            DeValue::String(s) if s.as_ref() == "all" => None,
            DeValue::Array(a) if !a.is_empty() => {
                let mut ids: Vec<u32> = a
                    .iter()
                    .filter_map(|e| self.integer(e, "gpus").map(|n| n as u32))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                Some(ids)
            }
            _ => {
                self.err(
                    v.span().start,
                    "gpus: use \"all\" or a non-empty list of KFD gpu_ids, e.g. [0x1234]".into(),
                );
                None
            }
        }
    }

    fn rules(&mut self, v: &Val, out: &mut Vec<Rule>) {
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
                cgroup: None,
                container: None,
                pid: None,
            };
            let mut class = None;
            let mut matchers = 0;
            let mut bad = false;
            for (k, v) in t.iter() {
                let key = k.get_ref().as_ref();
                let ctx = format!("rule {n}: {key}");
                let at = v.span().start;
                let ok = match key {
                    "class" => {
                        class = self.class(v, &ctx);
                        class.is_some()
                    }
                    "comm" | "cgroup" | "container" => {
                        let g = self.string(v, &ctx).map(|s| (s, Glob::new(s)));
                        match g {
                            Some((_, Ok(g))) => {
                                *match key {
                                    "comm" => &mut rule.comm,
                                    "cgroup" => &mut rule.cgroup,
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
                    "cmdline" => match self.string(v, &ctx).map(|s| (s, Regex::new(s))) {
                        Some((_, Ok(re))) => {
                            rule.cmdline = Some(re);
                            true
                        }
                        Some((s, Err(e))) => {
                            self.err(at, format!("{ctx}: invalid regex {s:?}: {}", regex_msg(&e)));
                            false
                        }
                        None => false,
                    },
                    "uid" => {
                        rule.uid = self.integer(v, &ctx).map(|n| n as u32);
                        rule.uid.is_some()
                    }
                    "pid" => {
                        rule.pid = self.integer(v, &ctx).map(|n| n as u32);
                        rule.pid.is_some()
                    }
                    other => {
                        self.err(
                            k.span().start,
                            format!(
                                "rule {n}: unknown key {other:?} (expected class, comm, cmdline, \
                                 uid, cgroup, container or pid)"
                            ),
                        );
                        false
                    }
                };
                bad |= !ok;
                if ok && key != "class" {
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
                         uid, cgroup, container or pid; use `default` for everything else)"
                    ),
                );
            }
            if let Some(c) = class {
                rule.class = c;
            }
            out.push(rule);
        }
    }
}

/// Where each relation-checked key was set.
#[derive(Default)]
struct Ats {
    window: Option<usize>,
    resume_after: Option<usize>,
    max_suspend: Option<usize>,
    min_run: Option<usize>,
    min_interval: Option<usize>,
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

/// The suspended part of a timeslice period.
fn off_ns(period_ns: u64, share: f64) -> u64 {
    ((1.0 - share) * period_ns as f64).round() as u64
}

// ---------------------------------------------------------------------------------------------
// The engine

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

/// A process's class, cached per (pid, start time) and policy generation.
struct ClassEntry {
    start_time: u64,
    gen: u64,
    class: Class,
    rule: Option<usize>,
    /// What `classify` last returned for it.
    reported: Option<Class>,
    /// Tick of the last visit: entries not visited in a full pass are dropped.
    stamp: u64,
}

/// What the engine remembers of an online queue's write pointer.
struct Launches {
    start_time: u64,
    write: Option<u64>,
    sample_ns: u64,
    /// Sample time of the last change of `write`.
    changed_ns: Option<u64>,
    stamp: u64,
}

/// A queue the engine suspended.
#[derive(Clone, Copy, Debug)]
struct Held {
    gpu_id: u32,
    since_ns: u64,
    start_time: u64,
    /// When its RESUME was last decided (retried after `min_interval` if not confirmed).
    resume_sent_ns: Option<u64>,
}

/// Why online work counts as busy on a GPU (the first evidence, by pid then queue).
#[derive(Clone, Copy, Debug)]
struct Evidence {
    pid: u32,
    qid: u32,
    what: BusyBy,
    /// The sample time of the evidence.
    at_ns: u64,
}

#[derive(Clone, Copy, Debug)]
enum BusyBy {
    Backlog(u64),
    Launched {
        ago_ns: u64,
    },
    Busy,
    /// A launch hint (uprobe) newer than the last sample.
    LaunchHint {
        ago_ns: u64,
    },
}

/// Why the held queues of a GPU (or of one process) are resumed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Release {
    Idle { idle_ns: Option<u64> },
    MaxSuspend,
    Share,
    Fenced,
    Unmanaged,
    NotOffline(Class),
}

#[derive(Default)]
struct GpuMem {
    fenced: Option<String>,
    last_busy_ns: Option<u64>,
    /// Online demand is going on: from its first busy tick until `resume_after` of idleness.
    episode: bool,
    last_suspend_ns: Option<u64>,
    /// Starvation guard: no suspend before this.
    no_suspend_until: u64,
    /// Timeslice: start of the current cycle.
    slice_start_ns: Option<u64>,
    // Per tick:
    busy: Option<Evidence>,
    holding: u32,
    oldest_ns: u64,
    release: Option<Release>,
    suspend: bool,
}

/// The policy's memory between ticks.
pub struct Engine {
    policy: Policy,
    gen: u64,
    tick: u64,
    classes: HashMap<u32, ClassEntry>,
    launches: HashMap<(u32, u32), Launches>,
    held: BTreeMap<(u32, u32), Held>,
    gpus: BTreeMap<u32, GpuMem>,
}

impl Engine {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            gen: 0,
            tick: 0,
            classes: HashMap::new(),
            launches: HashMap::new(),
            held: BTreeMap::new(),
            gpus: BTreeMap::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A reloaded policy: what is held stays held (and is resumed by the next `decide` if its
    /// process is no longer offline, or its GPU no longer managed); every process is classified
    /// again; fences are lifted.
    pub fn set_policy(&mut self, p: Policy) {
        let cycle_changed = p.strategy != self.policy.strategy;
        self.policy = p;
        self.gen += 1;
        for g in self.gpus.values_mut() {
            g.fenced = None;
            if cycle_changed {
                g.slice_start_ns = None;
            }
        }
    }

    /// The cached class of `pid` and the rule that gave it, if it was classified.
    pub fn class_of(&self, pid: u32) -> Option<(Class, Option<usize>)> {
        self.classes.get(&pid).map(|e| (e.class, e.rule))
    }

    /// Classifies the live processes whose `/proc` facts are known; returns the (pid, class)
    /// pairs that changed since the last call (new processes included).
    pub fn classify(&mut self, state: &State) -> Vec<(u32, Class)> {
        self.tick += 1;
        let mut visited = 0;
        let mut changed = Vec::new();
        for p in state.procs.values() {
            let Some(e) = self.entry(p) else {
                continue;
            };
            visited += 1;
            if e.reported != Some(e.class) {
                e.reported = Some(e.class);
                changed.push((p.pid, e.class));
            }
        }
        self.sweep_classes(visited);
        changed
    }

    /// The class-cache entry of a live process with `/proc` facts, (re)classified if needed.
    fn entry(&mut self, p: &Process) -> Option<&mut ClassEntry> {
        if p.exited_ns.is_some() {
            return None;
        }
        let info = p.info.as_ref()?;
        let (policy, gen, tick) = (&self.policy, self.gen, self.tick);
        let e = self.classes.entry(p.pid).or_insert_with(|| ClassEntry {
            start_time: info.start_time,
            gen: gen.wrapping_sub(1),
            class: Class::Ignore,
            rule: None,
            reported: None,
            stamp: tick,
        });
        if e.start_time != info.start_time {
            // A new process under the pid: it has not been reported yet.
            e.start_time = info.start_time;
            e.reported = None;
            e.gen = gen.wrapping_sub(1);
        }
        if e.gen != gen {
            (e.class, e.rule) = policy.classify(info, p.pid);
            e.gen = gen;
        }
        e.stamp = tick;
        Some(e)
    }

    fn sweep_classes(&mut self, visited: usize) {
        if self.classes.len() > visited {
            let tick = self.tick;
            self.classes.retain(|_, e| e.stamp == tick);
        }
    }

    /// This tick's decisions, sorted by GPU, then pid (RESUME before SUSPEND).
    pub fn decide(&mut self, state: &State, now_ns: u64) -> Vec<Decision> {
        self.tick += 1;
        let now = now_ns;
        for g in self.gpus.values_mut() {
            g.busy = None;
            g.holding = 0;
            g.oldest_ns = u64::MAX;
            g.release = None;
            g.suspend = false;
        }

        // 1. Classes, and online activity per GPU.
        let mut visited = 0;
        let mut visited_launches = 0;
        let window = self.policy.window_ns;
        let mut any_offline = false;
        for p in state.procs.values() {
            let Some(e) = self.entry(p) else {
                continue;
            };
            visited += 1;
            let (class, start_time) = (e.class, e.start_time);
            any_offline |= class == Class::Offline;
            if class != Class::Online {
                continue;
            }
            for q in p.queues.values() {
                if !q.alive() || !q.kind.is_compute() || !self.policy.manages(q.gpu_id) {
                    continue;
                }
                visited_launches += 1;
                let a = &q.activity;
                let l = self
                    .launches
                    .entry((p.pid, q.queue_id))
                    .or_insert(Launches {
                        start_time,
                        write: a.write_dispatch_id,
                        sample_ns: a.sample_ns,
                        changed_ns: None,
                        stamp: 0,
                    });
                l.stamp = self.tick;
                if l.start_time != start_time {
                    // The pid was reused: first sighting of a different queue.
                    *l = Launches {
                        start_time,
                        write: a.write_dispatch_id,
                        sample_ns: a.sample_ns,
                        changed_ns: None,
                        stamp: self.tick,
                    };
                } else if a.sample_ns != l.sample_ns {
                    if let (Some(old), Some(new)) = (l.write, a.write_dispatch_id) {
                        if old != new {
                            l.changed_ns = Some(a.sample_ns);
                        }
                    }
                    if a.write_dispatch_id.is_some() {
                        l.write = a.write_dispatch_id;
                    }
                    l.sample_ns = a.sample_ns;
                }
                let recent = |t: u64| now.saturating_sub(t) < window;
                // A backlog counts only from a readable sample: a stale one (the queue's memory
                // gone unreadable, e.g. the process exiting) would pin offline suspended.
                let backlog = a
                    .backlog
                    .filter(|&n| n > 0 && a.status == SampleStatus::Valid);
                let hint = p
                    .last_launch_ns
                    .filter(|&t| self.policy.launch_hints && recent(t) && t > a.sample_ns);
                let what = if let Some(t) = hint {
                    Some((
                        BusyBy::LaunchHint {
                            ago_ns: now.saturating_sub(t),
                        },
                        t,
                    ))
                } else if let Some(n) = backlog {
                    Some((BusyBy::Backlog(n), a.sample_ns))
                } else if let Some(t) = l.changed_ns.filter(|&t| recent(t)) {
                    Some((
                        BusyBy::Launched {
                            ago_ns: now.saturating_sub(t),
                        },
                        t,
                    ))
                } else if a.busy == Some(true) && recent(a.sample_ns) {
                    Some((BusyBy::Busy, a.sample_ns))
                } else {
                    None
                };
                if let Some((what, at_ns)) = what {
                    let g = self.gpus.entry(q.gpu_id).or_default();
                    if g.busy.is_none() {
                        g.busy = Some(Evidence {
                            pid: p.pid,
                            qid: q.queue_id,
                            what,
                            at_ns,
                        });
                    }
                }
            }
        }
        self.sweep_classes(visited);
        if self.launches.len() > visited_launches {
            let tick = self.tick;
            self.launches.retain(|_, l| l.stamp == tick);
        }

        // 2. Held queues: forget the gone, release per process, count the rest per GPU.
        let mut out: Vec<Decision> = Vec::new();
        {
            let first = 0;
            let classes = &self.classes;
            let policy = &self.policy;
            let gpus = &mut self.gpus;
            let mut proc: Option<&Process> = None;
            self.held.retain(|&(pid, qid), h| {
                if proc.is_none_or(|p| p.pid != pid) {
                    proc = state.procs.get(&pid);
                }
                let Some(p) = proc else {
                    return false;
                };
                let same_process = p.exited_ns.is_none()
                    && p.info
                        .as_ref()
                        .is_some_and(|i| i.start_time == h.start_time);
                let same_queue = p.queues.get(&qid).is_some_and(|q| {
                    q.alive()
                        && q.gpu_id == h.gpu_id
                        && q.created_ns.is_none_or(|c| c <= h.since_ns)
                });
                if !same_process || !same_queue {
                    // Exited, destroyed, or the id now names another queue: nothing to resume.
                    return false;
                }
                let class = classes.get(&pid).map_or(Class::Ignore, |e| e.class);
                let g = gpus.entry(h.gpu_id).or_default();
                let per_process = if class != Class::Offline {
                    Some(Release::NotOffline(class))
                } else if !policy.manages(h.gpu_id) {
                    Some(Release::Unmanaged)
                } else if g.fenced.is_some() {
                    Some(Release::Fenced)
                } else {
                    None
                };
                match per_process {
                    Some(r) => push_resume(&mut out, first, policy, g, now, pid, qid, h, r),
                    None => {
                        g.holding += 1;
                        g.oldest_ns = g.oldest_ns.min(h.since_ns);
                    }
                }
                true
            });
        }

        // 3. Per GPU: release everything held, or suspend more.
        let p = &self.policy;
        for (&gpu_id, g) in self.gpus.iter_mut() {
            if g.fenced.is_some() || !p.manages(gpu_id) {
                g.episode = false;
                g.slice_start_ns = None;
                continue;
            }
            let busy = g.busy.is_some();
            if busy {
                g.last_busy_ns = Some(now);
            }
            let idle_ns = g.last_busy_ns.map(|t| now.saturating_sub(t));
            let recent = idle_ns.is_some_and(|i| i < p.resume_after_ns);
            g.episode = busy || (g.episode && recent);
            if g.holding > 0 && now.saturating_sub(g.oldest_ns) >= p.max_suspend_ns {
                g.release = Some(Release::MaxSuspend);
                g.no_suspend_until = now.saturating_add(p.min_run_ns);
                continue;
            }
            let want = match p.strategy {
                Strategy::Priority => g.episode,
                Strategy::Timeslice { period_ns, share } => {
                    if g.episode {
                        let start = *g.slice_start_ns.get_or_insert(now);
                        let phase = now.saturating_sub(start) % period_ns.max(1);
                        if phase < off_ns(period_ns, share) {
                            true
                        } else {
                            if g.holding > 0 {
                                g.release = Some(Release::Share);
                            }
                            false
                        }
                    } else {
                        g.slice_start_ns = None;
                        false
                    }
                }
            };
            if !g.episode && g.holding > 0 {
                g.release = Some(Release::Idle { idle_ns });
            }
            g.suspend = want
                && now >= g.no_suspend_until
                && g.last_suspend_ns
                    .is_none_or(|t| now.saturating_sub(t) >= p.min_interval_ns);
        }

        // 4. RESUMEs for GPU-wide releases.
        if self.gpus.values().any(|g| g.release.is_some()) {
            let first = out.len();
            let policy = &self.policy;
            let gpus = &mut self.gpus;
            for (&(pid, qid), h) in self.held.iter_mut() {
                let Some(g) = gpus.get_mut(&h.gpu_id) else {
                    continue;
                };
                if let Some(r) = g.release {
                    push_resume(&mut out, first, policy, g, now, pid, qid, h, r);
                }
            }
        }

        // 5. SUSPENDs: active offline queues on GPUs that want it, not held yet.
        if any_offline && self.gpus.values().any(|g| g.suspend) {
            let first = out.len();
            for p in state.procs.values() {
                // This process's decisions start here (one per GPU at most).
                let mine = out.len();
                let offline = p.exited_ns.is_none()
                    && p.info.is_some()
                    && self
                        .classes
                        .get(&p.pid)
                        .is_some_and(|e| e.class == Class::Offline);
                if !offline {
                    continue;
                }
                for q in p.queues.values() {
                    if q.state != QueueState::Active
                        || !q.kind.is_compute()
                        || self.held.contains_key(&(p.pid, q.queue_id))
                    {
                        continue;
                    }
                    let Some(g) = self.gpus.get(&q.gpu_id).filter(|g| g.suspend) else {
                        continue;
                    };
                    let d = match out[mine..].iter().position(|d| d.gpu_id == q.gpu_id) {
                        Some(i) => &mut out[mine + i],
                        None => {
                            out.push(Decision {
                                ts_ns: now,
                                gpu_id: q.gpu_id,
                                pid: p.pid,
                                action: Action::Suspend,
                                queues: Vec::new(),
                                grace: self.policy.grace,
                                reason: suspend_reason(&self.policy, g, now),
                                trigger_ns: g.busy.map(|e| e.at_ns),
                            });
                            let last = out.len() - 1;
                            &mut out[last]
                        }
                    };
                    d.queues.push(q.queue_id);
                }
            }
            for d in &out[first..] {
                if let Some(g) = self.gpus.get_mut(&d.gpu_id) {
                    g.last_suspend_ns = Some(now);
                }
            }
        }

        out.sort_by_key(|d| (d.gpu_id, d.pid, d.action == Action::Suspend));
        for d in &mut out {
            d.queues.sort_unstable();
        }
        out
    }

    /// What the controller did for a decision: `done` are the queue ids whose state changed.
    pub fn confirm(&mut self, d: &Decision, done: &[u32]) {
        match d.action {
            Action::Suspend => {
                let start_time = self.classes.get(&d.pid).map_or(0, |e| e.start_time);
                for &qid in done.iter().filter(|q| d.queues.contains(q)) {
                    self.held.insert(
                        (d.pid, qid),
                        Held {
                            gpu_id: d.gpu_id,
                            since_ns: d.ts_ns,
                            start_time,
                            resume_sent_ns: None,
                        },
                    );
                }
            }
            Action::Resume => {
                for qid in done {
                    self.held.remove(&(d.pid, *qid));
                }
            }
        }
    }

    /// Queues the engine holds suspended: (pid, queue id, gpu id, since).
    pub fn held(&self) -> Vec<(u32, u32, u32, u64)> {
        self.held
            .iter()
            .map(|(&(pid, qid), h)| (pid, qid, h.gpu_id, h.since_ns))
            .collect()
    }

    /// Something else resumed these queues (all of `pid`'s when `queues` is None): forget them.
    pub fn forget(&mut self, pid: u32, queues: Option<&[u32]>) {
        match queues {
            None => self.held.retain(|&(p, _), _| p != pid),
            Some(ids) => {
                for q in ids {
                    self.held.remove(&(pid, *q));
                }
            }
        }
    }

    /// Stops suspending on a GPU that reported a queue error (until `set_policy`); what is held
    /// there is resumed by the next `decide`.
    pub fn fence_gpu(&mut self, gpu_id: u32, why: &str) {
        self.gpus.entry(gpu_id).or_default().fenced = Some(why.to_owned());
    }

    /// Fenced GPUs and why.
    pub fn fenced(&self) -> Vec<(u32, String)> {
        self.gpus
            .iter()
            .filter_map(|(&id, g)| g.fenced.clone().map(|w| (id, w)))
            .collect()
    }
}

/// Adds a held queue to the RESUME of its (GPU, process), unless it is already in one this
/// tick, or one was sent within `min_interval` and not confirmed yet. `out[first..]` holds this
/// pass's RESUMEs, made in (pid, queue) order: a process's are at the end.
#[allow(clippy::too_many_arguments)]
fn push_resume(
    out: &mut Vec<Decision>,
    first: usize,
    policy: &Policy,
    g: &GpuMem,
    now: u64,
    pid: u32,
    qid: u32,
    h: &mut Held,
    r: Release,
) {
    if h.resume_sent_ns
        .is_some_and(|t| t == now || now.saturating_sub(t) < policy.min_interval_ns)
    {
        return;
    }
    h.resume_sent_ns = Some(now);
    match out[first..]
        .iter_mut()
        .rev()
        .take_while(|d| d.pid == pid)
        .find(|d| d.gpu_id == h.gpu_id)
    {
        Some(d) => d.queues.push(qid),
        None => out.push(Decision {
            ts_ns: now,
            gpu_id: h.gpu_id,
            pid,
            action: Action::Resume,
            queues: vec![qid],
            grace: None,
            reason: release_reason(policy, g, h.gpu_id, r),
            trigger_ns: None,
        }),
    }
}

fn release_reason(p: &Policy, g: &GpuMem, gpu_id: u32, r: Release) -> String {
    match r {
        Release::Idle { idle_ns: Some(i) } => format!("online idle {}", fmt_ms(i)),
        Release::Idle { idle_ns: None } => "online idle".into(),
        Release::MaxSuspend => format!("max_suspend {} reached", fmt_ns(p.max_suspend_ns)),
        Release::Share => "timeslice: offline share".into(),
        Release::Fenced => format!(
            "gpu {gpu_id:#x} fenced: {}",
            g.fenced.as_deref().unwrap_or("queue error")
        ),
        Release::Unmanaged => format!("gpu {gpu_id:#x} no longer managed"),
        Release::NotOffline(c) => format!("no longer offline (now {c})"),
    }
}

fn suspend_reason(p: &Policy, g: &GpuMem, now: u64) -> String {
    let why = match g.busy {
        Some(Evidence { pid, qid, what, .. }) => {
            let how = match what {
                BusyBy::Backlog(n) => format!("busy (backlog {n})"),
                BusyBy::Launched { ago_ns } => format!("launched {} ago", fmt_ms(ago_ns)),
                BusyBy::Busy => "busy".into(),
                BusyBy::LaunchHint { ago_ns } => {
                    format!("launch hint {} ago", fmt_ms(ago_ns))
                }
            };
            format!("online pid {pid} queue {qid} {how}")
        }
        None => match g.last_busy_ns {
            Some(t) => format!("online busy {} ago", fmt_ms(now.saturating_sub(t))),
            None => "online busy".into(),
        },
    };
    match p.strategy {
        Strategy::Priority => why,
        Strategy::Timeslice { .. } => format!("timeslice: online share; {why}"),
    }
}

#[cfg(test)]
mod tests;
