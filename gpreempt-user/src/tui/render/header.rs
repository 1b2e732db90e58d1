//! The lines above the table: the title, one line per GPU, the HQD source line.

use std::collections::BTreeMap;

use ratatui::{
    layout::Rect,
    style::{Color, Style},
    text::{Line, Span},
    widgets::Paragraph,
    Frame,
};

use super::style::{ago, bold, dim, opt};
use crate::observe::model::{QueueState, State};
use crate::observe::status::LeverView;
use crate::tui::app::App;

/// `queues`: live queues in all.
pub(super) fn draw_title(f: &mut Frame, area: Rect, app: &App, state: &State, queues: usize) {
    let procs = state
        .procs
        .values()
        .filter(|p| p.exited_ns.is_none())
        .count();
    let mut spans = vec![
        Span::styled("gpreempt-ebpf top", bold()),
        Span::raw(format!(
            "  {procs} processes  {queues} queues  sort {}{}",
            app.sort.label(),
            app.dir.arrow()
        )),
    ];
    if !app.filter.is_empty() && !app.filter_open {
        spans.push(Span::raw("  filter "));
        spans.push(Span::styled(format!("{:?}", app.filter), bold()));
    }
    if !app.interval.is_empty() {
        spans.push(Span::raw(format!("  every {}", app.interval)));
    }
    if let Some(l) = &app.label {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(format!("[{l}]"), bold()));
    }
    if let Some(c) = &state.controller {
        spans.push(Span::raw(format!("  {}", controller_line(c))));
    }
    if let Some(s) = &state.sources {
        spans.push(Span::raw(format!("  {s}")));
    }
    if let Some(d) = &state.events_degraded {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(format!("EVENTS LOST: {d}"), bold()));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Live, suspended and busy queues of a GPU.
#[derive(Clone, Copy, Default)]
pub(super) struct GpuCounts {
    pub(super) live: usize,
    pub(super) suspended: usize,
    pub(super) busy: usize,
}

/// Which GPU a queue is on: a KFD `gpu_id`, or an NVIDIA TSG's RM device instance (the two
/// number spaces overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct GpuKey {
    pub(super) nvidia: bool,
    pub(super) id: u32,
}

/// [`GpuCounts`] of every GPU queues are on, in one pass over the queues.
pub(super) fn gpu_counts(state: &State) -> BTreeMap<GpuKey, GpuCounts> {
    let mut m: BTreeMap<GpuKey, GpuCounts> = BTreeMap::new();
    for q in state.procs.values().flat_map(|p| p.live_queues()) {
        let key = GpuKey {
            nvidia: q.nv.is_some(),
            id: q.gpu_id,
        };
        let c = m.entry(key).or_default();
        c.live += 1;
        c.suspended += usize::from(q.state == QueueState::Suspended);
        c.busy += usize::from(q.activity.busy == Some(true));
    }
    m
}

/// The lever tuner of a GPU: its lever and phase, and how the last decision went.
pub(super) fn lever_text(v: &LeverView) -> String {
    let phase = match (v.epoch, v.quiet) {
        (Some((i, n)), true) => format!("{} {i}/{n}, quiet window", v.phase),
        (Some((i, n)), false) => format!("{} {i}/{n}", v.phase),
        _ => v.phase.clone(),
    };
    let last = v
        .summaries
        .iter()
        .find(|s| s.lever == v.chosen)
        .map_or(String::new(), |s| {
            format!(
                "; worst service p99 {:.2}x its target, {} req",
                s.worst, s.requests
            )
        });
    let chosen = if v.chosen == v.lever {
        String::new()
    } else {
        format!(", chosen {}", v.chosen)
    };
    format!("lever {} ({phase}{chosen}{last})", v.lever)
}

/// Lever tuners of GPUs with no line of their own (an NVIDIA device instance no listed GPU
/// has: the RM could not be asked which GPU it is).
fn other_levers(state: &State) -> Vec<&LeverView> {
    state.controller.as_ref().map_or(Vec::new(), |c| {
        c.gpu_levers
            .iter()
            .filter(|v| {
                !state.gpus.iter().any(|g| g.node.gpu_id == v.gpu_id)
                    && state.nv_gpu(v.gpu_id).is_none()
            })
            .collect()
    })
}

/// How many GPU lines there are to show.
pub(super) fn gpu_line_count(state: &State) -> usize {
    state.gpus.len() + state.nv_gpus.len() + other_levers(state).len()
}

fn lever_of(state: &State, id: u32) -> Option<&LeverView> {
    state
        .controller
        .as_ref()
        .and_then(|c| c.gpu_levers.iter().find(|v| v.gpu_id == id))
}

/// `queues N  suspended S  busy B` (suspended in yellow when any).
fn count_spans(counts: GpuCounts) -> Vec<Span<'static>> {
    let GpuCounts {
        live,
        suspended,
        busy,
    } = counts;
    vec![
        Span::raw(format!("queues {live}  ")),
        Span::styled(
            format!("suspended {suspended}"),
            if suspended > 0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            },
        ),
        Span::raw(format!("  busy {busy}")),
    ]
}

fn gpu_line(
    g: &crate::observe::model::Gpu,
    counts: GpuCounts,
    adaptive: Option<&crate::observe::status::AdaptiveView>,
    lever: Option<&LeverView>,
) -> Line<'static> {
    let id = g.node.gpu_id;
    let used = opt(g.hqds_used).replace('-', "?");
    let mut spans = vec![
        Span::styled(format!("GPU {id}"), bold()),
        Span::raw(format!(
            " {} {}CU  HQD {used}/{}  ",
            g.gfx_target, g.node.cu_count, g.hqds_total
        )),
    ];
    spans.extend(count_spans(counts));
    if g.stopped {
        spans.push(Span::styled("  STOPPED", Style::new().fg(Color::Red)));
    }
    if let Some(a) = adaptive {
        spans.push(Span::raw(format!("  adaptive: {a}")));
    }
    if let Some(v) = lever {
        spans.push(Span::raw(format!("  {}", lever_text(v))));
    }
    Line::from(spans)
}

/// An NVIDIA GPU: `GPU 0 NVIDIA H100 80GB HBM3  00000000:19:00.0  GPU-...  queues ...`, the ids
/// nvidia-smi and dcgm-exporter use.
fn nv_gpu_line(
    g: &crate::observe::nv::gpus::NvGpu,
    counts: GpuCounts,
    lever: Option<&LeverView>,
) -> Line<'static> {
    let mut spans = vec![
        Span::styled(format!("GPU {}", g.index), bold()),
        Span::raw(format!(
            " {}  {}  {}  ",
            crate::term::clean(&g.name),
            g.pci_bus_id,
            crate::term::clean(g.uuid.as_deref().unwrap_or("-"))
        )),
    ];
    spans.extend(count_spans(counts));
    if let Some(v) = lever {
        spans.push(Span::raw(format!("  {}", lever_text(v))));
    }
    Line::from(spans)
}

pub(super) fn draw_gpus(
    f: &mut Frame,
    area: Rect,
    state: &State,
    counts: &BTreeMap<GpuKey, GpuCounts>,
) {
    let others = other_levers(state);
    let lines: Vec<Line> = if state.gpus.is_empty() && state.nv_gpus.is_empty() && others.is_empty()
    {
        vec![Line::styled(
            "no GPUs found (no GPU node in /sys/class/kfd/kfd/topology)",
            bold(),
        )]
    } else {
        let room = usize::from(area.height);
        let count = |nvidia: bool, id: u32| {
            counts
                .get(&GpuKey { nvidia, id })
                .copied()
                .unwrap_or_default()
        };
        let mut all: Vec<Line> = state
            .gpus
            .iter()
            .map(|g| {
                let id = g.node.gpu_id;
                gpu_line(
                    g,
                    count(false, id),
                    state.adaptive.get(&id),
                    lever_of(state, id),
                )
            })
            .collect();
        all.extend(state.nv_gpus.iter().map(|g| match g.device_instance {
            Some(i) => nv_gpu_line(g, count(true, i), lever_of(state, i)),
            None => nv_gpu_line(g, GpuCounts::default(), None),
        }));
        // Not the index of a listed GPU: said as what it is.
        all.extend(others.iter().map(|v| {
            Line::from(vec![
                Span::styled(format!("GPU (RM device instance {})", v.gpu_id), bold()),
                Span::raw(format!("  {}", lever_text(v))),
            ])
        }));
        let n = all.len();
        let shown = if n > room { room.saturating_sub(1) } else { n };
        all.truncate(shown);
        let mut v = all;
        if shown < n {
            v.push(Line::styled(
                format!("... and {} more GPUs", n - shown),
                dim(),
            ));
        }
        v
    };
    f.render_widget(Paragraph::new(lines), area);
}

/// The HQD line is AMD's: a host whose only GPUs are NVIDIA's has none.
pub(super) fn hqd_line_shown(state: &State) -> bool {
    !state.nvidia_only()
}

pub(super) fn draw_hqd_line(f: &mut Frame, area: Rect, state: &State) {
    if area.height == 0 {
        return;
    }
    let line = match state.hqds_ns {
        None => Line::from(vec![
            Span::styled("HQD slots unknown", bold()),
            Span::raw(": debugfs hqds not readable (run as root, debugfs mounted)"),
        ]),
        Some(t) => Line::from(Span::styled(
            format!("HQD map from debugfs hqds, read {}", ago(state.now_ns, t)),
            dim(),
        )),
    };
    f.render_widget(Paragraph::new(line), area);
}

fn fmt_ms(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

/// One line for `top`: "goal 4.30ms (1.10x undisturbed): service p90 4.12ms, undisturbed
/// 3.91ms, defer 0.49ms, offline kept 93%".
use crate::observe::status::AdaptivePhase;

impl std::fmt::Display for crate::observe::status::AdaptiveView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<u64>| v.map_or("-".to_owned(), fmt_ms);
        let action = match (self.phase, self.defer_ns) {
            (AdaptivePhase::Tuned, None) => "no suspends".to_owned(),
            (AdaptivePhase::Tuned, Some(0)) => "suspend at once".to_owned(),
            (AdaptivePhase::Tuned, Some(d)) => format!("defer {}", fmt_ms(d)),
            _ => "calibrating".to_owned(),
        };
        write!(
            f,
            "goal {} ({}): service p90 {}, undisturbed {}, {action}, offline kept {:.0}%",
            ms(self.target_ns),
            self.budget,
            ms(self.achieved_p90_ns),
            ms(self.clean_p90_ns),
            self.offline_kept * 100.0
        )
    }
}

/// `top`'s title line for a running controller: mode, pid, the systemd unit it runs in, what it
/// holds, fences, and where its metrics are served.
pub fn controller_line(s: &crate::observe::status::Status) -> String {
    format!(
        "controller: {} pid {}{}{}, {} held{}{}",
        s.mode,
        s.controller_pid,
        s.unit
            .as_ref()
            .map(|u| format!(" (systemd {u})"))
            .unwrap_or_default(),
        if s.dry_run { " (dry run)" } else { "" },
        s.held.len(),
        if s.fenced.is_empty() {
            String::new()
        } else {
            format!(", {} GPU(s) fenced", s.fenced.len())
        },
        s.metrics
            .as_ref()
            .map(|m| format!(", metrics http://{m}/metrics"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod controller_line_tests {
    use super::controller_line;
    use crate::observe::status::Status;

    #[test]
    fn the_title_names_the_unit_and_the_metrics_endpoint() {
        let mut s = Status {
            controller_pid: 42,
            mode: "run".into(),
            held: vec![(7, 0, None)],
            ..Default::default()
        };
        assert_eq!(controller_line(&s), "controller: run pid 42, 1 held");
        s.unit = Some("gpreempt-ebpf.service".into());
        s.metrics = Some("127.0.0.1:9464".into());
        s.fenced = vec![(1, "error".into())];
        assert_eq!(
            controller_line(&s),
            "controller: run pid 42 (systemd gpreempt-ebpf.service), 1 held, 1 GPU(s) fenced, \
             metrics http://127.0.0.1:9464/metrics"
        );
    }
}
