//! The document's top level: its tables found, `[policy]`, `[timeslice]` and `[control]` read,
//! the other tables handed to their readers, and the relations between values checked last,
//! each problem pointing at the key (or at its table where the value was defaulted).

use toml::de::{DeTable, DeValue};

use super::super::{
    fmt_ns, off_ns, Budget, NoDebugApi, OnEscape, Policy, Strategy, StrategyKind,
    DEFAULT_BUDGET_RATIO, DEFAULT_PERIOD_NS, DEFAULT_SHARE,
};
use super::{Parser, Val};

/// The document's top-level tables, each with where its header is.
#[derive(Default)]
struct Sections<'a, 'i> {
    policy: Option<(&'a DeTable<'i>, usize)>,
    timeslice: Option<(&'a DeTable<'i>, usize)>,
    adaptive: Option<(&'a DeTable<'i>, usize)>,
    /// `[nvidia]`: the levers' table, named after the backend that offers a choice of them.
    levers: Option<&'a DeTable<'i>>,
    control: Option<&'a DeTable<'i>>,
    rules: Option<&'a Val<'i>>,
}

/// `[timeslice]`'s values (defaults where absent) and where each was set.
struct Slice {
    period: u64,
    share: f64,
    period_at: Option<usize>,
    share_at: Option<usize>,
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

impl Parser<'_> {
    pub(super) fn document(&mut self, source: &str) -> Option<Policy> {
        let (doc, errors) = DeTable::parse_recoverable(self.text);
        if !errors.is_empty() {
            self.syntax_errors(errors);
            return None;
        }
        let mut policy = Policy {
            source: source.to_owned(),
            ..Policy::default()
        };
        let s = self.sections(doc.get_ref());
        // Where relation errors about defaulted keys point.
        let policy_at = s.policy.map_or(0, |(_, at)| at);
        let (named, at) = match s.policy {
            Some((t, _)) => self.policy_keys(t, &mut policy),
            None => (StrategyKind::default(), Ats::default()),
        };
        let slice = self.timeslice(s.timeslice, named);
        self.adaptive_table(s.adaptive, named, &mut policy);
        if let Some(t) = s.levers {
            self.lever_table(t, &mut policy.levers);
        }
        if let Some(t) = s.control {
            self.control(t, &mut policy);
        }
        if let Some(v) = s.rules {
            self.rules(v, &mut policy.rules);
        }
        self.relations(&policy, &at, policy_at);
        if named == StrategyKind::Timeslice {
            let ts_at = s.timeslice.map_or(policy_at, |(_, h)| h);
            self.timeslice_relations(
                &mut policy,
                &slice,
                at.max_suspend.unwrap_or(policy_at),
                ts_at,
            );
        }
        Some(policy)
    }

    /// The parser recovers and goes on; a second error on the same line is mostly its
    /// consequence.
    fn syntax_errors(&mut self, errors: Vec<toml::de::Error>) {
        for e in errors {
            let line = self.line(e.span().map_or(0, |s| s.start));
            if !self.problems.iter().any(|(l, _)| *l == line) {
                let msg = format!("TOML syntax error: {}", e.message());
                self.problems.push((line, msg));
            }
        }
    }

    fn sections<'a, 'i>(&mut self, doc: &'a DeTable<'i>) -> Sections<'a, 'i> {
        let mut s = Sections::default();
        for (k, v) in doc.iter() {
            match k.get_ref().as_ref() {
                "policy" => s.policy = self.table(v, "[policy]").map(|t| (t, v.span().start)),
                "timeslice" => {
                    s.timeslice = self.table(v, "[timeslice]").map(|t| (t, v.span().start))
                }
                "adaptive" => s.adaptive = self.table(v, "[adaptive]").map(|t| (t, v.span().start)),
                "nvidia" => s.levers = self.table(v, "[nvidia]"),
                "control" => s.control = self.table(v, "[control]"),
                "rule" => s.rules = Some(v),
                other => self.err(
                    k.span().start,
                    format!(
                        "unknown key {other:?} (expected [policy], [timeslice], [adaptive], \
                         [nvidia], [control] or [[rule]])"
                    ),
                ),
            }
        }
        s
    }

    /// `[policy]`: into `policy`; the strategy it names and where the relation-checked keys are.
    fn policy_keys(&mut self, t: &DeTable, policy: &mut Policy) -> (StrategyKind, Ats) {
        let mut named = StrategyKind::default();
        let mut at = Ats::default();
        for (k, v) in t.iter() {
            let key = k.get_ref().as_ref();
            let span = v.span().start;
            match key {
                "strategy" => {
                    if let Some(s) = self.string(v, key) {
                        match StrategyKind::parse(s) {
                            Some(k) => named = k,
                            None => self.err(
                                span,
                                format!(
                                    "strategy: unknown strategy {s:?} (use {})",
                                    one_of(&StrategyKind::ALL.map(StrategyKind::label))
                                ),
                            ),
                        }
                    }
                }
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
                "no_debug_api" => match self.string(v, key) {
                    Some("refuse") => policy.no_debug_api = NoDebugApi::Refuse,
                    Some("freeze") => policy.no_debug_api = NoDebugApi::Freeze,
                    Some(other) => self.err(
                        span,
                        format!(
                            "no_debug_api: unknown value {other:?} (use \"refuse\" or \
                             \"freeze\")"
                        ),
                    ),
                    None => {}
                },
                "escape" => match self.string(v, key) {
                    Some("hold") => policy.escape = OnEscape::Hold,
                    Some("freeze") => policy.escape = OnEscape::Freeze,
                    Some(other) => self.err(
                        span,
                        format!("escape: unknown value {other:?} (use \"hold\" or \"freeze\")"),
                    ),
                    None => {}
                },
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
                         default, launch_hints, no_debug_api or escape)"
                    ),
                ),
            }
        }
        (named, at)
    }

    /// `[timeslice]` (header at `.1`), read whatever the strategy, said to be unused unless it
    /// is `timeslice`.
    fn timeslice(&mut self, table: Option<(&DeTable, usize)>, named: StrategyKind) -> Slice {
        let mut slice = Slice {
            period: DEFAULT_PERIOD_NS,
            share: DEFAULT_SHARE,
            period_at: None,
            share_at: None,
        };
        let Some((t, header)) = table else {
            return slice;
        };
        if named != StrategyKind::Timeslice {
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
                        slice.period = ns;
                        slice.period_at = Some(v.span().start);
                    }
                }
                "share" => {
                    if let Some(s) = self.float(v, key) {
                        slice.share = s;
                        slice.share_at = Some(v.span().start);
                    }
                }
                other => self.err(
                    k.span().start,
                    format!("[timeslice]: unknown key {other:?} (expected period or share)"),
                ),
            }
        }
        slice
    }

    /// `[adaptive]` (header at `.1`): the strategy's goal; the default goal where the strategy
    /// is `adaptive` without the table.
    fn adaptive_table(
        &mut self,
        table: Option<(&DeTable, usize)>,
        named: StrategyKind,
        policy: &mut Policy,
    ) {
        if let Some((t, header)) = table {
            if named != StrategyKind::Adaptive {
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
        } else if named == StrategyKind::Adaptive {
            policy.strategy = Strategy::Adaptive {
                budget: Budget::Ratio(DEFAULT_BUDGET_RATIO),
            };
        }
    }

    /// `[control]`: the group allowed on the control socket.
    fn control(&mut self, t: &DeTable, policy: &mut Policy) {
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

    /// Relations between the `[policy]` values, pointing at the key (or `[policy]` when
    /// defaulted, at `policy_at`).
    fn relations(&mut self, policy: &Policy, at: &Ats, policy_at: usize) {
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
    }

    /// The timeslice strategy's values checked (against `max_suspend`, set at
    /// `max_suspend_at`) and set; problems of defaulted values point at `ts_at`.
    fn timeslice_relations(
        &mut self,
        policy: &mut Policy,
        slice: &Slice,
        max_suspend_at: usize,
        ts_at: usize,
    ) {
        let (period, share) = (slice.period, slice.share);
        if period == 0 {
            self.err(
                slice.period_at.unwrap_or(ts_at),
                "period: must be more than 0".into(),
            );
        }
        if !(share > 0.0 && share < 1.0) {
            self.err(
                slice.share_at.unwrap_or(ts_at),
                format!("share: {share} is out of range (0 < share < 1)"),
            );
        } else if period > 0 {
            let off = off_ns(period, share);
            if policy.max_suspend_ns < off {
                self.err(
                    max_suspend_at,
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
}

/// `"a", "b" or "c"`.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
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
