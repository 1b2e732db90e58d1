//! The `[adaptive]` table (the online goal) and the `[nvidia]` table (the lever and its
//! parameters, the adaptive tuner's candidate levers).

use toml::de::{DeTable, DeValue};

use super::super::{fmt_ns, Budget, Lever, LeverPolicy, LeverSet, DEFAULT_BUDGET_RATIO};
use super::{Parser, Val};

impl Parser<'_> {
    /// `[adaptive]`: the online goal, `online_p99_budget` (a ratio) or `online_latency`.
    pub(super) fn adaptive(&mut self, t: &DeTable, header: usize) -> Option<Budget> {
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
    pub(super) fn lever_table(&mut self, t: &DeTable, lp: &mut LeverPolicy) {
        for (k, v) in t.iter() {
            let key = k.get_ref().as_ref();
            let span = v.span().start;
            match key {
                "lever" => match self.string(v, key).and_then(|s| self.lever(span, key, s)) {
                    Some(Lever::Defer) => self.err(
                        span,
                        "lever: \"defer\" is a deferral the adaptive strategy tunes: list it \
                             in `levers` with strategy = \"adaptive\""
                            .into(),
                    ),
                    Some(l) => lp.lever = l,
                    None => {}
                },
                "levers" => self.levers(v, span, lp),
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
                            lp.offline_timeslice_us = us;
                        }
                    }
                }
                "pause_after" => {
                    if let Some(ns) = self.duration(v, key) {
                        lp.pause_after_ns = ns;
                    }
                }
                "pause" => match self.string(v, key) {
                    Some("preempt") => lp.pause_schedule_only = false,
                    Some("schedule") => lp.pause_schedule_only = true,
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

    fn lever(&mut self, span: usize, key: &str, s: &str) -> Option<Lever> {
        // `freeze` is the no_debug_api fallback's, not a lever this table chooses.
        let l = Lever::parse(s).filter(|l| *l != Lever::Freeze);
        if l.is_none() {
            self.err(
                span,
                format!(
                    "{key}: unknown lever {s:?} (use \"none\", \"dynamic\", \"timeslice\", \
                     \"pause\", \"both\" or, in levers, \"defer\")"
                ),
            );
        }
        l
    }

    /// `levers = ["none", "dynamic", ...]`: the adaptive tuner's candidates, at least one.
    fn levers(&mut self, v: &Val, span: usize, lp: &mut LeverPolicy) {
        let DeValue::Array(a) = v.get_ref() else {
            self.err(
                span,
                "levers: expected a list of levers, e.g. [\"none\", \"dynamic\"]".into(),
            );
            return;
        };
        let mut set = LeverSet::EMPTY;
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
        lp.candidates = set;
    }
}
