//! The policy file: TOML text to a validated [`Policy`], every problem reported at once as
//! `file:LINE: key: message`, and the duration syntax (`20ms`, `1.5s`) its values use.

use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use regex::Regex;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::{
    fmt_ns, off_ns, Budget, Class, Glob, LeverSet, NvLever, NvPolicy, Policy, Rule, Strategy,
    DEFAULT_BUDGET_RATIO, DEFAULT_PERIOD_NS, DEFAULT_SHARE,
};

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
        let mut p = Parser::new(text);
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

    /// Reads and parses a policy file: a regular file of at most [`MAX_POLICY_BYTES`], opened
    /// without blocking (a FIFO or a device would hang the controller, even against SIGTERM).
    /// Reads, parses and validates `path`, and binds its `pid` rules to the processes that
    /// have those pids now ([`Self::bind_pids`]).
    pub fn load(path: &Path) -> anyhow::Result<Policy> {
        let text = read_policy_file(path)?;
        let mut p = Self::parse(&text, &path.display().to_string())?;
        p.bind_pids(Path::new("/proc"));
        Ok(p)
    }

    /// A pid is not an identity: whoever gets a freed pid first owns it next. So each `pid`
    /// rule is bound to the process that has the pid now (its start time, under `proc_root`),
    /// and a process that gets the pid later does not match it; a pid nobody has matches
    /// nothing. Each binding is said in [`Self::pid_notes`]; a reload binds again.
    pub fn bind_pids(&mut self, proc_root: &Path) {
        let source = self.source.clone();
        let mut notes = Vec::new();
        for (i, r) in self.rules.iter_mut().enumerate() {
            let Some(pid) = r.pid else { continue };
            let at = format!("{source}: rule {} (line {})", i + 1, r.line);
            match crate::observe::procinfo::start_time(proc_root, pid) {
                Ok(t) => {
                    r.pid_bound = super::PidBound::Started(t);
                    notes.push(format!(
                        "{at}: pid {pid} is bound to the process that has it now (started at \
                         tick {t}); a process that gets pid {pid} later does not match (a \
                         reload binds again)"
                    ));
                }
                Err(_) => {
                    r.pid_bound = super::PidBound::NoProcess;
                    notes.push(format!(
                        "{at}: no process has pid {pid}: the rule matches nothing (pid rules \
                         name processes that run when the policy is loaded; reload once it runs)"
                    ));
                }
            }
        }
        self.pid_notes = notes;
    }
}

/// A POSIX-ish group name (what `groupadd` accepts).
fn is_group_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Largest policy file accepted (a policy is a few KiB; 100,000 rules fit).
pub const MAX_POLICY_BYTES: u64 = 16 << 20;

/// The policy file's text, refusing what is not a regular file of bounded size.
pub fn read_policy_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let shown = path.display();
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot read policy file {shown}"))?;
    let meta = f
        .metadata()
        .with_context(|| format!("cannot read policy file {shown}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        anyhow::bail!("policy file {shown} is {what}: give a regular file");
    }
    if meta.len() > MAX_POLICY_BYTES {
        anyhow::bail!(
            "policy file {shown} is {} bytes: larger than the {} MiB a policy may be",
            meta.len(),
            MAX_POLICY_BYTES >> 20
        );
    }
    let mut text = String::new();
    f.take(MAX_POLICY_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read policy file {shown} (is it UTF-8 text?)"))?;
    if text.len() as u64 > MAX_POLICY_BYTES {
        anyhow::bail!(
            "policy file {shown} grew past {} MiB while read",
            MAX_POLICY_BYTES >> 20
        );
    }
    Ok(text)
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
    /// Byte offsets of every '\n' in `text`.
    newlines: Vec<usize>,
    problems: Vec<(usize, String)>,
    /// Bytes the rules' compiled regexes use so far (against [`REGEX_BUDGET`]).
    regex_used: usize,
}

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Self {
        Self {
            text,
            newlines: text
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
            problems: Vec::new(),
            regex_used: 0,
        }
    }

    /// 1-based line of a byte offset: newlines before it, by binary search (a scan per rule
    /// made large policies quadratic: 40,000 rules took 8 s).
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.newlines.partition_point(|&n| n < end) + 1
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
        let mut adaptive: Option<(&DeTable, usize)> = None;
        let mut nvidia: Option<&DeTable> = None;
        let mut control: Option<&DeTable> = None;
        let mut rules: Option<&Val> = None;
        for (k, v) in doc.get_ref().iter() {
            match k.get_ref().as_ref() {
                "policy" => policy_table = self.table(v, "[policy]").map(|t| (t, v.span().start)),
                "timeslice" => {
                    timeslice = self.table(v, "[timeslice]").map(|t| (t, v.span().start))
                }
                "adaptive" => adaptive = self.table(v, "[adaptive]").map(|t| (t, v.span().start)),
                "nvidia" => nvidia = self.table(v, "[nvidia]"),
                "control" => control = self.table(v, "[control]"),
                "rule" => rules = Some(v),
                other => self.err(
                    k.span().start,
                    format!(
                        "unknown key {other:?} (expected [policy], [timeslice], [adaptive], \
                         [nvidia], [control] or [[rule]])"
                    ),
                ),
            }
        }
        // Where relation errors about defaulted keys point.
        let policy_at = policy_table.map_or(0, |(_, at)| at);
        let mut strategy_timeslice = false;
        let mut strategy_adaptive = false;
        let mut at = Ats::default();
        if let Some((t, _)) = policy_table {
            for (k, v) in t.iter() {
                let key = k.get_ref().as_ref();
                let span = v.span().start;
                match key {
                    "strategy" => match self.string(v, key) {
                        Some("priority") => {
                            (strategy_timeslice, strategy_adaptive) = (false, false)
                        }
                        Some("timeslice") => {
                            (strategy_timeslice, strategy_adaptive) = (true, false)
                        }
                        Some("adaptive") => (strategy_timeslice, strategy_adaptive) = (false, true),
                        Some(other) => self.err(
                            span,
                            format!(
                                "strategy: unknown strategy {other:?} \
                                 (use \"priority\", \"timeslice\" or \"adaptive\")"
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
        if let Some((t, header)) = adaptive {
            if !strategy_adaptive {
                self.err(
                    header,
                    "[adaptive] is used only with strategy = \"adaptive\" \
                     (set it in [policy], or remove this table)"
                        .into(),
                );
            }
            if let Some(budget) = self.adaptive(t, header) {
                policy.strategy = Strategy::Adaptive { budget };
            }
        } else if strategy_adaptive {
            policy.strategy = Strategy::Adaptive {
                budget: Budget::Ratio(DEFAULT_BUDGET_RATIO),
            };
        }
        if let Some(t) = nvidia {
            self.nvidia(t, &mut policy.nvidia);
        }
        if let Some(t) = control {
            for (k, v) in t.iter() {
                match k.get_ref().as_ref() {
                    "group" => match self.string(v, "group") {
                        Some(g) if is_group_name(g) => {
                            policy.control_group = Some(g.to_string());
                            policy.control_group_line = Some(self.line(v.span().start));
                        }
                        Some(g) => self.err(
                            v.span().start,
                            format!("group: {g:?} is not a group name (letters, digits, _ . -)"),
                        ),
                        None => {}
                    },
                    other => self.err(
                        k.span().start,
                        format!("[control]: unknown key {other:?} (expected group)"),
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

    /// `[adaptive]`: the online goal, `online_p99_budget` (a ratio) or `online_latency`.
    fn adaptive(&mut self, t: &DeTable, header: usize) -> Option<Budget> {
        let mut budget = None;
        for (k, v) in t.iter() {
            let key = k.get_ref().as_ref();
            let span = v.span().start;
            let b = match key {
                "online_p99_budget" => match self.float(v, key) {
                    Some(r) if (1.0..=100.0).contains(&r) => Some(Budget::Ratio(r)),
                    Some(r) => {
                        self.err(
                            span,
                            format!(
                                "online_p99_budget: {r} is out of range (a ratio to the \
                                 undisturbed service time, 1.0 to 100)"
                            ),
                        );
                        None
                    }
                    None => None,
                },
                "online_latency" => match self.duration(v, key) {
                    Some(0) => {
                        self.err(span, "online_latency: must be more than 0".into());
                        None
                    }
                    Some(ns) => Some(Budget::Absolute(ns)),
                    None => None,
                },
                other => {
                    self.err(
                        k.span().start,
                        format!(
                            "[adaptive]: unknown key {other:?} (expected online_p99_budget or \
                             online_latency)"
                        ),
                    );
                    None
                }
            };
            if let Some(b) = b {
                if budget.is_some() {
                    self.err(
                        header,
                        "[adaptive]: give online_p99_budget or online_latency, not both".into(),
                    );
                }
                budget = Some(b);
            }
        }
        Some(budget.unwrap_or(Budget::Ratio(DEFAULT_BUDGET_RATIO)))
    }

    /// `[nvidia]`: lever, offline_timeslice, pause_after, pause.
    fn nvidia(&mut self, t: &DeTable, nv: &mut NvPolicy) {
        for (k, v) in t.iter() {
            let key = k.get_ref().as_ref();
            let span = v.span().start;
            match key {
                "lever" => {
                    if let Some(l) = self.string(v, key).and_then(|s| self.lever(span, key, s)) {
                        nv.lever = l;
                    }
                }
                "levers" => self.levers(v, span, nv),
                "offline_timeslice" => {
                    if let Some(ns) = self.duration(v, key) {
                        let us = ns / 1_000;
                        if us == 0 || us > 1_000_000 {
                            self.err(
                                span,
                                format!(
                                    "offline_timeslice: {} is out of range (1us to 1s)",
                                    fmt_ns(ns)
                                ),
                            );
                        } else {
                            nv.offline_timeslice_us = us;
                        }
                    }
                }
                "pause_after" => {
                    if let Some(ns) = self.duration(v, key) {
                        nv.pause_after_ns = ns;
                    }
                }
                "pause" => match self.string(v, key) {
                    Some("preempt") => nv.pause_schedule_only = false,
                    Some("schedule") => nv.pause_schedule_only = true,
                    Some(other) => self.err(
                        span,
                        format!("pause: unknown mode {other:?} (use \"preempt\" or \"schedule\")"),
                    ),
                    None => {}
                },
                other => self.err(
                    k.span().start,
                    format!(
                        "[nvidia]: unknown key {other:?} (expected lever, levers, \
                         offline_timeslice, pause_after or pause)"
                    ),
                ),
            }
        }
    }

    fn lever(&mut self, span: usize, key: &str, s: &str) -> Option<NvLever> {
        let l = NvLever::parse(s);
        if l.is_none() {
            self.err(
                span,
                format!(
                    "{key}: unknown lever {s:?} (use \"none\", \"dynamic\", \"timeslice\", \
                     \"pause\" or \"both\")"
                ),
            );
        }
        l
    }

    /// `levers = ["none", "dynamic", ...]`: the adaptive tuner's candidates, at least one.
    fn levers(&mut self, v: &Val, span: usize, nv: &mut NvPolicy) {
        let DeValue::Array(a) = v.get_ref() else {
            self.err(
                span,
                "levers: expected a list of levers, e.g. [\"none\", \"dynamic\"]".into(),
            );
            return;
        };
        let mut set = LeverSet::of(&[]);
        let mut ok = true;
        for e in a.iter() {
            let at = e.span().start;
            match self.string(e, "levers") {
                Some(s) => match self.lever(at, "levers", s) {
                    Some(l) => set.insert(l),
                    None => ok = false,
                },
                None => ok = false,
            }
        }
        if !ok {
            return;
        }
        if set.is_empty() {
            self.err(
                span,
                "levers: the list is empty (name at least one lever)".into(),
            );
            return;
        }
        nv.levers = set;
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
                gid: None,
                cgroup: None,
                container: None,
                k8s_namespace: None,
                pod: None,
                pid: None,
                pid_bound: super::PidBound::NotYet,
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
                    other => {
                        self.err(
                            k.span().start,
                            format!(
                                "rule {n}: unknown key {other:?} (expected class, comm, cmdline, \
                                 uid, gid, cgroup, container, k8s_namespace, pod or pid)"
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
                         uid, gid, cgroup, container, k8s_namespace, pod or pid; use `default` \
                         for everything else)"
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
fn rule_regex(s: &str, left: usize) -> Result<(Regex, usize), String> {
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

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn line_numbers_by_search_match_counting() {
        let text = "a\n\nbc\nd\n\n\nef";
        let p = Parser::new(text);
        for off in 0..=text.len() + 3 {
            let end = off.min(text.len());
            let want = text.as_bytes()[..end]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            assert_eq!(p.line(off), want, "offset {off}");
        }
    }

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = std::env::temp_dir().join(format!("gpreempt-policy-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO with no writer: opening it blocking would hang.
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_policy_file(&fifo).unwrap_err().to_string();
        assert!(e.ends_with("is a FIFO: give a regular file"), "{e}");
        let e = read_policy_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a device"), "{e}");
        let e = read_policy_file(&dir).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let big = dir.join("big.toml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_POLICY_BYTES + 1).unwrap();
        let e = read_policy_file(&big).unwrap_err().to_string();
        assert!(e.contains("larger than the 16 MiB"), "{e}");
        let ok = dir.join("ok.toml");
        std::fs::write(&ok, "[policy]\n").unwrap();
        assert_eq!(read_policy_file(&ok).unwrap(), "[policy]\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
