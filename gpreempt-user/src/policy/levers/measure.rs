//! What the lever tuner measures and how it decides: online requests per service, pooled per
//! lever over a measurement; each service's target (absolute, or a ratio to its p99 alone, from
//! quiet windows); offline progress as a rate; and the rule that picks the lever.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::super::{Budget, Lever};

/// The pseudo-service of GPU bursts (online work from first evidence to drained), measured where
/// no service's requests are: the engine's own estimate from launch hints and channel samples.
pub const BURSTS: u32 = u32::MAX;

/// Alone samples kept per service (the newest), across measurements.
const ALONE_KEEP: usize = 256;
/// Alone samples a service needs before its ratio target is measured, not assumed.
pub const MIN_ALONE: usize = 3;
/// Levers whose worst service ratios are this close are tied (offline progress decides).
const TIE: f64 = 1.02;

/// The `pct`-th nearest-rank percentile of unsorted `v` (None when empty).
pub fn pct(v: &[u64], p: u64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    Some(crate::observe::requests::nearest_rank(&v, p))
}

/// The tail the tuner compares: the nearest-rank p99, but never the single largest of fewer
/// than 100 requests (the second largest then). At 1 request/s a measurement has a few dozen
/// per lever; one stray request (a host hiccup) must not decide, two slow ones do.
pub fn tail(v: &[u64]) -> Option<u64> {
    if v.len() < 2 {
        return v.first().copied();
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    let n = v.len();
    let rank = (99 * n).div_ceil(100).min(n - 1);
    Some(v[rank - 1])
}

fn median_f(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One epoch's figures: its lever (None: a quiet window, offline held throughout), each
/// service's request durations, and the offline rate.
#[derive(Clone, Debug)]
pub(super) struct Stat {
    pub(super) lever: Option<Lever>,
    pub(super) samples: BTreeMap<u32, Vec<u64>>,
    /// Offline units per second; None: no progress reported.
    pub(super) rate: Option<f64>,
}

/// The service alone: request durations from quiet windows, kept across measurements (a
/// window costs offline its whole length, so few are made: the history is what they bought).
#[derive(Clone, Debug, Default)]
pub(super) struct Alone {
    per: BTreeMap<u32, VecDeque<u64>>,
}

impl Alone {
    pub(super) fn add(&mut self, svc: u32, durs: &[u64]) {
        let v = self.per.entry(svc).or_default();
        for &d in durs {
            if v.len() == ALONE_KEEP {
                v.pop_front();
            }
            v.push_back(d);
        }
    }

    /// The service's p99 alone, once [`MIN_ALONE`] requests were seen alone.
    pub(super) fn p99(&self, svc: u32) -> Option<u64> {
        let v = self.per.get(&svc).filter(|v| v.len() >= MIN_ALONE)?;
        tail(&v.iter().copied().collect::<Vec<_>>())
    }
}

/// One service's figures under one lever over a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceFig {
    /// The service's pid ([`BURSTS`]: the GPU's bursts).
    pub svc: u32,
    pub requests: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Its target p99 (ns).
    pub target_ns: u64,
}

impl ServiceFig {
    pub fn ratio(&self) -> f64 {
        self.p99_ns as f64 / self.target_ns.max(1) as f64
    }
}

/// A lever's figures over a measurement: each service's requests pooled over the lever's epochs,
/// the worst service's ratio of p99 to target, and the median offline rate of its epochs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub lever: Lever,
    pub services: Vec<ServiceFig>,
    /// max over services of p99 / target: at most 1.0 meets every service's target.
    pub worst: f64,
    pub rate: Option<f64>,
    pub epochs: usize,
}

impl Summary {
    /// The worst service's figures.
    pub fn worst_service(&self) -> Option<&ServiceFig> {
        self.services
            .iter()
            .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
    }
}

/// Each service's target p99: absolute, or its budget times its p99 alone; where the alone
/// figure is missing (no quiet window possible or still too few), the best p99 any lever gave
/// it stands in (then the reference is a lever's, which the note says).
pub(super) fn targets(
    pooled: &BTreeMap<Lever, BTreeMap<u32, Vec<u64>>>,
    budgets: &BTreeMap<u32, Budget>,
    default: Budget,
    alone: &Alone,
) -> BTreeMap<u32, (u64, &'static str)> {
    let mut svcs: Vec<u32> = pooled.values().flat_map(|m| m.keys().copied()).collect();
    svcs.sort_unstable();
    svcs.dedup();
    svcs.into_iter()
        .filter_map(|s| {
            let t = match budgets.get(&s).copied().unwrap_or(default) {
                Budget::Absolute(ns) => (ns, "slo"),
                Budget::Ratio(r) => match alone.p99(s) {
                    Some(a) => ((a as f64 * r) as u64, "alone"),
                    None => {
                        let best = pooled
                            .values()
                            .filter_map(|m| m.get(&s).and_then(|v| tail(v)))
                            .min()?;
                        ((best as f64 * r) as u64, "best lever")
                    }
                },
            };
            Some((s, t))
        })
        .collect()
}

/// The levers' summaries (in the order they first appear) from a measurement's epochs.
pub(super) fn summarize(
    stats: &[Stat],
    budgets: &BTreeMap<u32, Budget>,
    default: Budget,
    alone: &Alone,
) -> (Vec<Summary>, BTreeMap<u32, (u64, &'static str)>) {
    let mut order: Vec<Lever> = Vec::new();
    let mut pooled: BTreeMap<Lever, BTreeMap<u32, Vec<u64>>> = BTreeMap::new();
    for s in stats {
        let Some(l) = s.lever else { continue };
        if !order.contains(&l) {
            order.push(l);
        }
        let m = pooled.entry(l).or_default();
        for (&svc, d) in &s.samples {
            m.entry(svc).or_default().extend_from_slice(d);
        }
    }
    // Requests, where any service has them, make the GPU's bursts moot.
    let has_requests = pooled.values().any(|m| m.keys().any(|&s| s != BURSTS));
    if has_requests {
        for m in pooled.values_mut() {
            m.remove(&BURSTS);
        }
    }
    let targets = targets(&pooled, budgets, default, alone);
    let sums = order
        .into_iter()
        .filter_map(|l| {
            let services: Vec<ServiceFig> = pooled[&l]
                .iter()
                .filter_map(|(&svc, d)| {
                    Some(ServiceFig {
                        svc,
                        requests: d.len(),
                        p50_ns: pct(d, 50)?,
                        p99_ns: tail(d)?,
                        target_ns: targets.get(&svc)?.0,
                    })
                })
                .collect();
            if services.is_empty() {
                return None;
            }
            let worst = services.iter().map(ServiceFig::ratio).fold(0.0, f64::max);
            let mine = stats.iter().filter(|s| s.lever == Some(l));
            Some(Summary {
                lever: l,
                worst,
                rate: median_f(mine.clone().filter_map(|s| s.rate).collect()),
                epochs: mine.count(),
                services,
            })
        })
        .collect();
    (sums, targets)
}

/// A decision over measured levers.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub lever: Lever,
    pub runner_up: Option<Lever>,
    pub reason: String,
}

/// The rule, pure: `current` is the incumbent, which meets its targets up to `slack` over them.
///
/// - Levers within every service's target: `none` whenever it is within (there is nothing to
///   remove); else, of those whose offline progress is within `margin` of the most, the one
///   with the most headroom (the lowest worst ratio). The incumbent keeps its place among them
///   while its worst ratio is within `slack` of that one's.
/// - None within: the best worst-service ratio, ties by offline progress, then the lesser
///   intrusion. That lever is never worse than `none` on the online side, and `none` gives the
///   most offline progress, so the pick is never worse than no control on both.
pub fn decide(sums: &[Summary], current: Lever, slack: f64, margin: f64) -> Decision {
    if sums.is_empty() {
        return Decision {
            lever: current,
            runner_up: None,
            reason: "nothing measured".into(),
        };
    }
    let rate = |s: &Summary| s.rate.unwrap_or(0.0);
    let cost = |s: &Summary| s.lever.intrusion();
    let meets = |s: &Summary| s.worst <= if s.lever == current { slack } else { 1.0 };
    let head = sums.iter().map(describe).collect::<Vec<_>>().join("; ");
    let mut within: Vec<&Summary> = sums.iter().filter(|s| meets(s)).collect();
    within.sort_by(|a, b| rate(b).total_cmp(&rate(a)).then(cost(a).cmp(&cost(b))));
    if let Some(none) = within.iter().find(|s| s.lever == Lever::None) {
        return Decision {
            lever: Lever::None,
            runner_up: runner_up(&within, sums, Lever::None),
            reason: format!(
                "{head}: none is within every target ({:.2}x): nothing to remove",
                none.worst
            ),
        };
    }
    if let Some(&most) = within.first() {
        // Offline progress within `margin` of the most is a tie at the noise of a few epochs;
        // among those the most headroom wins: the tail of a few dozen requests reads low as
        // often as high. Without progress reports the intrusion order decides: it has no
        // noise to damp.
        let near: Vec<&Summary> = match most.rate {
            Some(r) => within
                .iter()
                .copied()
                .filter(|s| rate(s) * margin >= r)
                .collect(),
            None => vec![most],
        };
        let best = near
            .iter()
            .copied()
            .min_by(|a, b| a.worst.total_cmp(&b.worst).then(cost(a).cmp(&cost(b))))
            .unwrap_or(most);
        // The incumbent stays among the near ones unless the best leaves it clearly behind on
        // the targets too: a lever with as much offline progress and more headroom is taken.
        let keep = near
            .iter()
            .find(|s| s.lever == current)
            .filter(|c| c.worst <= best.worst * slack);
        let pick = keep.copied().unwrap_or(best);
        return Decision {
            lever: pick.lever,
            runner_up: runner_up(&within, sums, pick.lever),
            reason: format!(
                "{head}: {} is within every target with the most offline progress{}",
                pick.lever,
                if pick.lever != most.lever {
                    format!(
                        " and the most headroom (within {margin}x of {}'s progress)",
                        most.lever
                    )
                } else {
                    String::new()
                }
            ),
        };
    }
    let mut close: Vec<&Summary> = sums.iter().collect();
    close.sort_by(|a, b| a.worst.total_cmp(&b.worst));
    let best = close[0].worst;
    let mut tied: Vec<&Summary> = close
        .iter()
        .copied()
        .filter(|s| s.worst <= best * TIE)
        .collect();
    tied.sort_by(|a, b| rate(b).total_cmp(&rate(a)).then(cost(a).cmp(&cost(b))));
    let pick = tied[0];
    Decision {
        lever: pick.lever,
        runner_up: close
            .iter()
            .find(|s| s.lever != pick.lever)
            .map(|s| s.lever),
        reason: format!(
            "{head}: no lever meets every target; {} is the closest ({:.2}x)",
            pick.lever, pick.worst
        ),
    }
}

/// The next best after `pick`: the next within every target, else the closest of the others
/// (what a confirmation measures the choice against).
fn runner_up(within: &[&Summary], sums: &[Summary], pick: Lever) -> Option<Lever> {
    within
        .iter()
        .map(|s| s.lever)
        .find(|&l| l != pick)
        .or_else(|| {
            sums.iter()
                .filter(|s| s.lever != pick)
                .min_by(|a, b| a.worst.total_cmp(&b.worst))
                .map(|s| s.lever)
        })
}

/// "pause: worst 1.04x (pid 42 p99 12.10ms / 11.00ms, 14 req), offline 850/s".
fn describe(s: &Summary) -> String {
    let w = s.worst_service().map_or(String::new(), |f| {
        format!(
            " ({} p99 {} / {}, {} req)",
            svc_name(f.svc),
            fmt_ms(f.p99_ns),
            fmt_ms(f.target_ns),
            f.requests
        )
    });
    format!(
        "{}: worst {:.2}x{w}{}",
        s.lever,
        s.worst,
        s.rate
            .map_or(String::new(), |r| format!(", offline {r:.0}/s"))
    )
}

pub fn svc_name(svc: u32) -> String {
    if svc == BURSTS {
        "bursts".into()
    } else {
        format!("pid {svc}")
    }
}

pub fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}
