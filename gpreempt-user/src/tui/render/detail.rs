//! The detail pane (Enter): every field of the selected process or queue, in columns that fit.

use ratatui::text::{Line, Span};

use super::style::{ago, bold, fmt_rate, hex, opt, source_label, KEY_W};
use crate::observe::model::dispatch::{pow2_label, DispatchMix};
use crate::observe::model::{Process, Queue, SampleStatus, State};
use crate::tui::app::{self, App, TreeRow};

pub(super) struct Detail {
    pub(super) title: String,
    pub(super) lines: Vec<Line<'static>>,
}

type Pairs = Vec<(&'static str, String)>;

pub(super) fn detail(app: &App, state: &State, rows: &[TreeRow], width: u16) -> Option<Detail> {
    if !app.detail {
        return None;
    }
    let row = app.resolve(rows).and_then(|i| rows.get(i))?;
    let p = state.procs.get(&row.pid)?;
    let (title, pairs, wide) = match row.queue {
        Some(qid) => {
            let q = p.queues.get(&qid)?;
            let (pairs, wide) = queue_pairs(q, state);
            (
                format!(" queue {qid} of pid {} ({}) ", p.pid, p.comm()),
                pairs,
                wide,
            )
        }
        None => {
            let (pairs, mut wide) = process_pairs(p, state.now_ns);
            if let (Some(policy), Some(info)) = (&app.policy, &p.info) {
                wide.splice(0..0, why_pairs(&policy.explain(info, p.pid)));
            }
            (format!(" pid {} ({}) ", p.pid, p.comm()), pairs, wide)
        }
    };
    Some(Detail {
        title,
        lines: pair_lines(&pairs, &wide, width),
    })
}

fn sample_label(s: &SampleStatus) -> String {
    match s {
        SampleStatus::None => "none".into(),
        SampleStatus::Valid => "valid".into(),
        SampleStatus::Invalid(why) => format!("invalid: {why}"),
        SampleStatus::Unreadable(why) => format!("unreadable: {why}"),
    }
}

/// Every field of a queue, the most useful first; long values get a line of their own.
fn queue_pairs(q: &Queue, state: &State) -> (Pairs, Pairs) {
    let now = state.now_ns;
    // An NVIDIA TSG's gpu_id is its RM device instance: the GPU by the ids nvidia-smi uses.
    let gpu = match (&q.nv, state.gpu(q.gpu_id), state.nv_gpu(q.gpu_id)) {
        (Some(_), _, Some(g)) => format!(
            "{} (RM device instance {})",
            crate::term::clean(&g.describe()),
            q.gpu_id
        ),
        (Some(_), _, None) => format!("RM device instance {}", q.gpu_id),
        (None, Some(g), _) => format!("{} {}", q.gpu_id, g.gfx_target),
        (None, None, _) => q.gpu_id.to_string(),
    };
    let hqd = match q.hqd {
        Some(h) => h.to_string(),
        None if q.nv.is_some() => "- (a TSG: see its channels)".into(),
        None if state.hqds_ns.is_none() && q.alive() => "unknown (no debugfs)".into(),
        None => "- (not mapped)".into(),
    };
    let a = &q.activity;
    let busy = a.busy.map_or("-", |b| if b { "yes" } else { "no" });
    let created = match q.created_ns {
        Some(t) => ago(now, t),
        None => format!("before start (seen {})", ago(now, q.seen_ns)),
    };
    let pairs = vec![
        ("queue", q.queue_id.to_string()),
        ("state", q.state.label().to_string()),
        ("hqd", hqd),
        ("gpu", gpu),
        ("type", q.kind.label().to_string()),
        ("suspended by", opt(q.suspended_by)),
        ("priority", opt(q.priority)),
        ("percentage", opt(q.percentage)),
        (
            "ring",
            format!("{} ({} B)", hex(q.ring_base_address), q.ring_size),
        ),
        ("rptr", hex(q.read_pointer_address)),
        ("wptr", hex(q.write_pointer_address)),
        ("doorbell", hex(q.doorbell_offset)),
        ("dispatch/s", fmt_rate(a.dispatches_per_s)),
        ("backlog", opt(a.backlog)),
        ("busy", busy.to_string()),
        ("read id", opt(a.read_dispatch_id)),
        ("write id", opt(a.write_dispatch_id)),
        ("source", source_label(q.source).to_string()),
        (
            "pointers",
            if q.pointers_from_mqds {
                "mqds (by order)".to_string()
            } else if q.ring_base_address.is_some() {
                "create_queue".to_string()
            } else {
                "-".to_string()
            },
        ),
        ("created", created),
        (
            "destroyed",
            q.destroyed_ns.map_or("-".into(), |t| ago(now, t)),
        ),
    ];
    let mut pairs = pairs;
    // The mix first: a short pane cuts from the bottom.
    let mut wide = mix_pairs(&a.dispatches);
    wide.push(("sample", sample_label(&a.status)));
    if let Some(t) = &q.nv {
        // The RM objects a pause goes through, in place of the AMD ring and pointers.
        pairs.retain(|(k, _)| !matches!(*k, "ring" | "rptr" | "wptr" | "doorbell" | "pointers"));
        // Its activity counts GPFIFO entries over its channels (GP_GET / GP_PUT in USERD).
        for (k, _) in pairs.iter_mut() {
            *k = match *k {
                "dispatch/s" => "gpfifo entries/s",
                "backlog" => "entries pending",
                "read id" => "gp_get total",
                "write id" => "gp_put total",
                other => other,
            };
        }
        pairs.extend([
            ("rm client", format!("{:#x} (fd {})", t.h_client, t.fd)),
            ("subdevice", hex(t.h_subdevice.map(u64::from))),
            ("engine", format!("{:#x}", t.engine_type)),
            (
                "timeslice",
                match t.timeslice_us {
                    Some((original, now)) => {
                        format!("{now} us (controller; was {original} us)")
                    }
                    None => "driver's".into(),
                },
            ),
        ]);
        let list: Vec<String> = t.channels.iter().map(|c| format!("{c:#x}")).collect();
        wide.push(("channels", format!("{}: {}", list.len(), list.join(" "))));
        if !t.rings.is_empty() {
            let r = &t.rings[0];
            wide.push((
                "rings",
                format!(
                    "{} with USERD known, first at {:#x} ({} entries), USERD {:#x}+{:#x}",
                    t.rings.len(),
                    r.gpfifo_va,
                    r.entries,
                    r.h_userd,
                    r.userd_offset
                ),
            ));
        }
    }
    (pairs, wide)
}

/// The queue's dispatch mix: coverage, grid sizes, work-group sizes, the most dispatched
/// kernels (by name where the code objects gave one).
fn mix_pairs(m: &DispatchMix) -> Pairs {
    if m.decoded == 0 {
        return Vec::new();
    }
    let cov = m
        .coverage()
        .map(|c| format!(" ({:.0}%)", c * 100.0))
        .unwrap_or_default();
    let mut out = vec![(
        "dispatches",
        format!(
            "{} decoded of {} consumed{cov}: {} kernels, {} barriers, {} other",
            m.decoded, m.consumed, m.kernel_dispatches, m.barriers, m.other_packets
        ),
    )];
    if m.kernel_dispatches == 0 {
        return out;
    }
    let pct = |n: u64| n as f64 * 100.0 / m.kernel_dispatches as f64;
    let grids: Vec<String> = m
        .grid_log2
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(b, &n)| format!("{}+ {:.0}%", pow2_label(b), pct(n)))
        .collect();
    out.push(("grid items", grids.join("  ")));
    let mut groups: Vec<(&u64, &u64)> = m.group_sizes.iter().collect();
    groups.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut groups: Vec<String> = groups
        .iter()
        .take(6)
        .map(|(size, n)| format!("{size} {:.0}%", pct(**n)))
        .collect();
    if m.other_group_sizes > 0 {
        groups.push(format!("other {:.0}%", pct(m.other_group_sizes)));
    }
    out.push(("group size", groups.join("  ")));
    for (object, k) in m.top_kernels(5) {
        let g = |v: [u32; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
        let w = k.workgroup.map(u32::from);
        out.push((
            "kernel",
            format!(
                "{:>4.1}%  grid {} wg {}  {}",
                pct(k.count),
                g(k.grid),
                g(w),
                k.name.clone().unwrap_or_else(|| format!("{object:#x}")),
            ),
        ));
    }
    out
}

/// By which rule of the running controller's policy the process has its class, and why each
/// earlier rule did not match (policy/explain.rs).
fn why_pairs(e: &crate::policy::Explanation) -> Pairs {
    let mut out = vec![("class by", e.headline())];
    out.extend(
        e.rules
            .iter()
            .filter(|t| !t.matched)
            .map(|t| ("not by", t.line())),
    );
    out
}

fn process_pairs(p: &Process, now: u64) -> (Pairs, Pairs) {
    let info = p.info.as_ref();
    let total = p.queues.len();
    let mut pairs = vec![
        ("pid", p.pid.to_string()),
        ("comm", p.comm().to_string()),
        ("class", p.class.clone().unwrap_or_else(|| "-".into())),
        (
            "queues",
            format!("{} live, {total} listed", app::live_count(p)),
        ),
        ("dispatch/s", fmt_rate(app::proc_rate(p))),
        (
            "managed",
            p.unmanaged
                .as_ref()
                .map_or_else(|| "yes".into(), |why| format!("no: {why}")),
        ),
        (
            "suspendable",
            p.debug_api.as_ref().map_or_else(
                || "-".into(),
                |d| format!("{}: {}", if d.enabled { "yes" } else { "no" }, d.why),
            ),
        ),
        ("ns pid", opt(info.and_then(|i| i.ns_pid))),
        ("uid", opt(info.and_then(|i| i.uid))),
        (
            "container",
            info.and_then(|i| i.container.clone())
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "pod",
            info.and_then(|i| i.pod.as_ref()).map_or("-".into(), |p| {
                format!(
                    "{}/{} container {} (uid {})",
                    p.namespace.as_deref().unwrap_or("?"),
                    p.name.as_deref().unwrap_or("?"),
                    p.container.as_deref().unwrap_or("?"),
                    p.uid
                )
            }),
        ),
        ("debugger", opt(p.debugger)),
        ("source", source_label(p.source).to_string()),
        ("seen", ago(now, p.seen_ns)),
        ("exited", p.exited_ns.map_or("-".into(), |t| ago(now, t))),
    ];
    let mut wide = match info {
        Some(i) => vec![("cgroup", i.cgroup.clone()), ("cmdline", i.cmdline.clone())],
        None => {
            pairs.push(("info", "/proc not read yet".into()));
            vec![]
        }
    };
    if let Some(e) = &p.escaped {
        wide.insert(
            0,
            (
                "escaped",
                format!(
                    "ESCAPED {} time(s), latest {}: {}: {}",
                    e.count, e.kind, e.reason, e.answer
                ),
            ),
        );
    }
    if let Some(u) = &p.uncontrollable {
        wide.insert(
            0,
            (
                "control",
                format!("UNCONTROLLABLE ({}): {}", u.kind, u.reason),
            ),
        );
    }
    (pairs, wide)
}

/// `key value` pairs in as many columns as fit (filled row by row, so a short pane shows the
/// first pairs), then one line per wide pair.
fn pair_lines(pairs: &[(&str, String)], wide: &[(&str, String)], width: u16) -> Vec<Line<'static>> {
    let val_w = pairs
        .iter()
        .map(|(_, v)| v.chars().count())
        .max()
        .unwrap_or(0);
    let cell_w = KEY_W + 1 + val_w + 2;
    let ncols = (usize::from(width) / cell_w).max(1);
    let nrows = pairs.len().div_ceil(ncols);
    let mut lines = Vec::with_capacity(nrows + wide.len());
    for r in 0..nrows {
        let mut spans = Vec::new();
        for c in 0..ncols {
            if let Some((k, v)) = pairs.get(r * ncols + c) {
                spans.push(Span::styled(format!("{k:<KEY_W$} "), bold()));
                spans.push(Span::raw(format!("{v:<w$}", w = val_w + 2)));
            }
        }
        lines.push(Line::from(spans));
    }
    for (k, v) in wide {
        lines.push(Line::from(vec![
            Span::styled(format!("{k:<KEY_W$} "), bold()),
            Span::raw(v.clone()),
        ]));
    }
    lines
}
