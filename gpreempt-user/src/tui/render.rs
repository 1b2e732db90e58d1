//! Draws `top`: a title line, one line per GPU, the HQD source line, the process -> queue table,
//! the detail pane (Enter), the event log and the footer; `?` adds a help popup.
//!
//! Readable on dark and light terminals: modifiers (BOLD, REVERSED, DIM) and the basic
//! Red / Yellow / Green only, never a white or black foreground or background.

use std::{collections::BTreeMap, time::Duration};

use ratatui::{
    layout::{Constraint, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Clear, HighlightSpacing, Paragraph, Row, Table, TableState},
    Frame,
};

use super::app::{self, App, SortColumn, TreeRow};
use crate::model::{LogKind, Process, Queue, QueueState, SampleStatus, Source, State};

/// Below this the screen shows only a "terminal too small" line.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 10;
/// Header row + 3 rows: the least the table keeps when panes compete for height.
const TABLE_MIN: u16 = 4;
/// How long a status message stays in the footer.
const STATUS_TTL: Duration = Duration::from_secs(10);
/// Width of the key column of the detail pane.
const KEY_W: usize = 12;

fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

fn dim() -> Style {
    Style::new().add_modifier(Modifier::DIM)
}

fn state_style(s: QueueState) -> Style {
    match s {
        QueueState::Active => Style::new(),
        QueueState::Suspended => Style::new().fg(Color::Yellow),
        QueueState::Evicted => Style::new().fg(Color::Red),
        QueueState::Destroyed => dim(),
    }
}

fn log_style(k: LogKind) -> Style {
    match k {
        LogKind::Suspend => Style::new().fg(Color::Yellow),
        LogKind::Evict | LogKind::Error => Style::new().fg(Color::Red),
        LogKind::Resume | LogKind::Restore => Style::new().fg(Color::Green),
        LogKind::Destroy | LogKind::Exit | LogKind::Gone => dim(),
        LogKind::Create | LogKind::Found | LogKind::Debug => Style::new(),
    }
}

/// `3s`, `5m`, `2h`, `3d`.
pub fn fmt_age(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m", s / 60),
        3_600..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Dispatches per second, compact: `-`, `0`, `2.5`, `350`, `1.2k`, `3.4M`.
pub fn fmt_rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r <= 0.0 => "0".into(),
        Some(r) if r < 10.0 => format!("{r:.1}"),
        Some(r) if r < 1e3 => format!("{r:.0}"),
        Some(r) if r < 1e6 => format!("{:.1}k", r / 1e3),
        Some(r) => format!("{:.1}M", r / 1e6),
    }
}

fn hex(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:#x}"))
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn ago(now: u64, ts: u64) -> String {
    format!("{} ago", fmt_age(app::age_ns(now, ts)))
}

fn source_label(s: Source) -> &'static str {
    match s {
        Source::Event => "event",
        Source::Sysfs => "sysfs",
    }
}

// ---- columns ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Col {
    Id,
    Comm,
    Class,
    Nq,
    Gpu,
    Kind,
    Prio,
    Hqd,
    State,
    Rate,
    Backlog,
    Age,
    Container,
    Cmdline,
}

struct ColSpec {
    col: Col,
    title: &'static str,
    /// Width (the minimum for COMM and CMDLINE, which take what is left).
    width: u16,
    /// Columns with the highest rank are dropped first when the terminal is narrow.
    drop_rank: u8,
}

/// In display order.
const COLS: [ColSpec; 14] = [
    ColSpec {
        col: Col::Id,
        title: "PID",
        width: 7,
        drop_rank: 0,
    },
    ColSpec {
        col: Col::Comm,
        title: "COMM",
        width: 8,
        drop_rank: 1,
    },
    ColSpec {
        col: Col::Class,
        title: "CLASS",
        width: 8,
        drop_rank: 9,
    },
    ColSpec {
        col: Col::Nq,
        title: "Q",
        width: 3,
        drop_rank: 6,
    },
    ColSpec {
        col: Col::Gpu,
        title: "GPU",
        width: 5,
        drop_rank: 4,
    },
    ColSpec {
        col: Col::Kind,
        title: "TYPE",
        width: 7,
        drop_rank: 7,
    },
    ColSpec {
        col: Col::Prio,
        title: "PRIO",
        width: 4,
        drop_rank: 8,
    },
    ColSpec {
        col: Col::Hqd,
        title: "HQD",
        width: 7,
        drop_rank: 2,
    },
    ColSpec {
        col: Col::State,
        title: "STATE",
        width: 9,
        drop_rank: 3,
    },
    ColSpec {
        col: Col::Rate,
        title: "DISP/S",
        width: 7,
        drop_rank: 5,
    },
    ColSpec {
        col: Col::Backlog,
        title: "BKLG",
        width: 5,
        drop_rank: 10,
    },
    ColSpec {
        col: Col::Age,
        title: "AGE",
        width: 4,
        drop_rank: 11,
    },
    ColSpec {
        col: Col::Container,
        title: "CONTAINER",
        width: 12,
        drop_rank: 12,
    },
    ColSpec {
        col: Col::Cmdline,
        title: "CMDLINE",
        width: 10,
        drop_rank: 13,
    },
];

/// The columns that fit `width` (one space between columns), with their widths: the most
/// important first (pid, comm, HQD, state), then by rank until one does not fit; COMM and
/// CMDLINE share what is left.
fn columns(width: u16) -> Vec<(&'static ColSpec, u16)> {
    let mut by_rank: Vec<&ColSpec> = COLS.iter().collect();
    by_rank.sort_by_key(|c| c.drop_rank);
    let mut used = 0u16;
    let mut keep = Vec::new();
    for c in by_rank {
        let need = c.width + u16::from(!keep.is_empty());
        if used + need > width {
            break;
        }
        used += need;
        keep.push(c.col);
    }
    let mut extra = width - used;
    let mut out: Vec<(&ColSpec, u16)> = COLS
        .iter()
        .filter(|c| keep.contains(&c.col))
        .map(|c| (c, c.width))
        .collect();
    let has_cmdline = keep.contains(&Col::Cmdline);
    for (c, w) in &mut out {
        if c.col == Col::Comm {
            let grow = if has_cmdline { extra.min(8) } else { extra };
            *w += grow;
            extra -= grow;
        }
    }
    for (c, w) in &mut out {
        if c.col == Col::Cmdline {
            *w += extra;
        }
    }
    out
}

fn sort_col(s: SortColumn) -> Col {
    match s {
        SortColumn::Pid => Col::Id,
        SortColumn::Comm => Col::Comm,
        SortColumn::Class => Col::Class,
        SortColumn::Queues => Col::Nq,
        SortColumn::Rate => Col::Rate,
        SortColumn::State => Col::State,
        SortColumn::Age => Col::Age,
    }
}

fn process_cell(c: Col, p: &Process, now: u64) -> Cell<'static> {
    let info = p.info.as_ref();
    match c {
        Col::Id => Cell::from(p.pid.to_string()),
        Col::Comm => Cell::from(p.comm().to_string()),
        Col::Class => Cell::from(p.class.clone().unwrap_or_else(|| "-".into())),
        Col::Nq => Cell::from(app::live_count(p).to_string()),
        Col::State => {
            let style = match (p.exited_ns, app::proc_queue_state(p)) {
                (None, Some(s)) => state_style(s),
                _ => Style::new(),
            };
            Cell::from(app::proc_state_label(p)).style(style)
        }
        Col::Rate => Cell::from(fmt_rate(app::proc_rate(p))),
        Col::Age => Cell::from(fmt_age(app::age_ns(now, p.seen_ns))),
        Col::Container => Cell::from(
            info.and_then(|i| i.container.clone())
                .unwrap_or_else(|| "-".into()),
        ),
        Col::Cmdline => Cell::from(info.map(|i| i.cmdline.clone()).unwrap_or_default()),
        Col::Gpu | Col::Kind | Col::Prio | Col::Hqd | Col::Backlog => Cell::from(""),
    }
}

fn queue_cell(c: Col, q: &Queue, last: bool, hqds_known: bool, now: u64) -> Cell<'static> {
    match c {
        Col::Id => Cell::from(format!(" {}─ {}", if last { '└' } else { '├' }, q.queue_id)),
        Col::Gpu => Cell::from(q.gpu_id.to_string()),
        Col::Kind => Cell::from(q.kind.label()),
        Col::Prio => Cell::from(opt(q.priority)),
        // An NVIDIA TSG has no HQD slot: its hardware side is its channels.
        Col::Hqd => Cell::from(match (&q.nv, q.hqd) {
            (Some(t), _) => format!("{}ch", t.channels.len()),
            (None, Some(h)) => h.to_string(),
            (None, None) if hqds_known || !q.alive() => "-".into(),
            (None, None) => "?".into(),
        }),
        Col::State => Cell::from(q.state.label()).style(state_style(q.state)),
        Col::Rate => Cell::from(fmt_rate(q.activity.dispatches_per_s)),
        Col::Backlog => Cell::from(opt(q.activity.backlog)),
        Col::Age => Cell::from(fmt_age(app::age_ns(now, app::queue_start_ns(q)))),
        Col::Comm | Col::Class | Col::Nq | Col::Container | Col::Cmdline => Cell::from(""),
    }
}

fn table_row(r: &TreeRow, cols: &[(&ColSpec, u16)], state: &State) -> Row<'static> {
    let now = state.now_ns;
    let Some(p) = state.procs.get(&r.pid) else {
        return Row::new(Vec::<Cell>::new());
    };
    match r.queue {
        None => {
            let style = if p.exited_ns.is_some() { dim() } else { bold() };
            Row::new(cols.iter().map(|(c, _)| process_cell(c.col, p, now))).style(style)
        }
        Some(qid) => {
            let Some(q) = p.queues.get(&qid) else {
                return Row::new(Vec::<Cell>::new());
            };
            let known = state.hqds_ns.is_some();
            let style = if q.alive() { Style::new() } else { dim() };
            Row::new(
                cols.iter()
                    .map(|(c, _)| queue_cell(c.col, q, r.last, known, now)),
            )
            .style(style)
        }
    }
}

// ---- layout ----

struct Areas {
    title: Rect,
    gpus: Rect,
    hqd: Rect,
    table: Rect,
    detail: Option<Rect>,
    log: Option<Rect>,
    footer: Rect,
}

/// GPU lines shown: every GPU while they take at most a quarter of the height.
fn gpu_lines(state: &State, height: u16) -> u16 {
    let n = u16::try_from(state.gpus.len()).unwrap_or(u16::MAX).max(1);
    n.min((height / 4).max(1))
}

fn split(area: Rect, app: &App, state: &State, detail_lines: u16) -> Areas {
    let g = gpu_lines(state, area.height);
    let rest = area.height.saturating_sub(3 + g);
    let mut detail_h = 0;
    if app.detail && detail_lines > 0 {
        let cap = rest.saturating_sub(TABLE_MIN).min((rest / 2).max(3));
        detail_h = (detail_lines + 1).min(cap);
        if detail_h < 2 {
            detail_h = 0;
        }
    }
    let rest2 = rest - detail_h;
    let log_h = match rest2 {
        18.. => 7,
        12..18 => 5,
        9..12 => 3,
        _ => 0,
    };
    let table_h = rest2 - log_h;
    let mut y = area.y;
    let mut take = |h: u16| {
        let r = Rect::new(area.x, y, area.width, h);
        y += h;
        r
    };
    let title = take(1);
    let gpus = take(g);
    let hqd = take(1);
    let table = take(table_h);
    let detail = (detail_h > 0).then(|| take(detail_h));
    let log = (log_h > 0).then(|| take(log_h));
    let footer = take(1);
    Areas {
        title,
        gpus,
        hqd,
        table,
        detail,
        log,
        footer,
    }
}

fn too_small(area: Rect) -> bool {
    area.width < MIN_WIDTH || area.height < MIN_HEIGHT
}

/// Table rows that fit on a screen of `area` (what PageUp / PageDown move).
pub fn table_page(area: Rect, app: &App, state: &State) -> usize {
    if too_small(area) {
        return 1;
    }
    // The rows matter only for the detail pane's height.
    let n = if app.detail {
        let rows = app::rows(app, state);
        detail(app, state, &rows, area.width).map_or(0, |d| d.lines.len())
    } else {
        0
    };
    let a = split(area, app, state, u16::try_from(n).unwrap_or(u16::MAX));
    usize::from(a.table.height.saturating_sub(1)).max(1)
}

// ---- drawing ----

/// Draws the whole screen.
pub fn draw(f: &mut Frame, app: &App, state: &State) {
    let rows = if too_small(f.area()) {
        Vec::new()
    } else {
        app::rows(app, state)
    };
    draw_rows(f, app, state, &rows);
}

/// [`draw`] with the table's rows already computed: [`app::rows`] of `app` and `state`.
pub fn draw_rows(f: &mut Frame, app: &App, state: &State, rows: &[TreeRow]) {
    let area = f.area();
    if too_small(area) {
        let msg = format!(
            "terminal too small: {}x{}, need {MIN_WIDTH}x{MIN_HEIGHT}",
            area.width, area.height
        );
        f.render_widget(Paragraph::new(msg), area);
        return;
    }
    let detail = detail(app, state, rows, area.width);
    let n = detail.as_ref().map_or(0, |d| d.lines.len());
    let a = split(area, app, state, u16::try_from(n).unwrap_or(u16::MAX));
    // One pass over the queues for the title and the GPU lines.
    let counts = gpu_counts(state);
    let queues = counts.values().map(|c| c.live).sum();
    draw_title(f, a.title, app, state, queues);
    draw_gpus(f, a.gpus, state, &counts);
    draw_hqd_line(f, a.hqd, state);
    draw_table(f, a.table, app, state, rows);
    if let (Some(r), Some(d)) = (a.detail, detail) {
        let block = Block::new()
            .borders(Borders::TOP)
            .title(Span::styled(d.title, bold()));
        f.render_widget(Paragraph::new(d.lines).block(block), r);
    }
    if let Some(r) = a.log {
        draw_log(f, r, state);
    }
    draw_footer(f, a.footer, app);
    if app.show_help {
        draw_help(f, area);
    }
}

/// `queues`: live queues in all.
fn draw_title(f: &mut Frame, area: Rect, app: &App, state: &State, queues: usize) {
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
        spans.push(Span::raw(format!("  {c}")));
    }
    if let Some(s) = &state.sources {
        spans.push(Span::raw(format!("  {s}")));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Live, suspended and busy queues of a GPU.
#[derive(Clone, Copy, Default)]
struct GpuCounts {
    live: usize,
    suspended: usize,
    busy: usize,
}

/// [`GpuCounts`] of every GPU queues are on, in one pass over the queues.
fn gpu_counts(state: &State) -> BTreeMap<u32, GpuCounts> {
    let mut m: BTreeMap<u32, GpuCounts> = BTreeMap::new();
    for q in state.procs.values().flat_map(|p| p.live_queues()) {
        let c = m.entry(q.gpu_id).or_default();
        c.live += 1;
        c.suspended += usize::from(q.state == QueueState::Suspended);
        c.busy += usize::from(q.activity.busy == Some(true));
    }
    m
}

fn gpu_line(g: &crate::model::Gpu, counts: GpuCounts) -> Line<'static> {
    let id = g.node.gpu_id;
    let GpuCounts {
        live,
        suspended,
        busy,
    } = counts;
    let used = opt(g.hqds_used).replace('-', "?");
    let mut spans = vec![
        Span::styled(format!("GPU {id}"), bold()),
        Span::raw(format!(
            " {} {}CU  HQD {used}/{}  queues {}  ",
            g.gfx_target, g.node.cu_count, g.hqds_total, live
        )),
        Span::styled(
            format!("suspended {suspended}"),
            if suspended > 0 {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            },
        ),
        Span::raw(format!("  busy {busy}")),
    ];
    if g.stopped {
        spans.push(Span::styled("  STOPPED", Style::new().fg(Color::Red)));
    }
    Line::from(spans)
}

fn draw_gpus(f: &mut Frame, area: Rect, state: &State, counts: &BTreeMap<u32, GpuCounts>) {
    let lines: Vec<Line> = if state.gpus.is_empty() {
        vec![Line::styled(
            "no GPUs found (no GPU node in /sys/class/kfd/kfd/topology)",
            bold(),
        )]
    } else {
        let room = usize::from(area.height);
        let n = state.gpus.len();
        let shown = if n > room { room.saturating_sub(1) } else { n };
        let mut v: Vec<Line> = state.gpus[..shown]
            .iter()
            .map(|g| gpu_line(g, counts.get(&g.node.gpu_id).copied().unwrap_or_default()))
            .collect();
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

fn draw_hqd_line(f: &mut Frame, area: Rect, state: &State) {
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

fn draw_table(f: &mut Frame, area: Rect, app: &App, state: &State, rows: &[TreeRow]) {
    let cols = columns(area.width);
    let sorted = sort_col(app.sort);
    let header = Row::new(cols.iter().map(|(c, _)| {
        if c.col == sorted {
            Cell::from(format!("{}{}", c.title, app.dir.arrow()))
        } else {
            Cell::from(c.title)
        }
    }))
    .style(bold());
    let widths: Vec<Constraint> = cols.iter().map(|(_, w)| Constraint::Length(*w)).collect();
    let visible = usize::from(area.height.saturating_sub(1));
    let offset = app
        .scroll
        .get()
        .min(rows.len().saturating_sub(visible.max(1)));
    let selected = app.resolve(rows);
    // Only the rows on screen are built (building all of them costs tens of ms per frame with
    // 10,000 queues): the same window the table would pick from the whole list.
    let (start, end) = if area.is_empty() || rows.is_empty() {
        (offset, offset)
    } else {
        row_bounds(rows.len(), selected, offset, visible)
    };
    let body: Vec<Row> = rows
        .get(start..end)
        .unwrap_or_default()
        .iter()
        .map(|r| table_row(r, &cols, state))
        .collect();
    let table = Table::new(body, widths)
        .header(header)
        .column_spacing(1)
        .highlight_spacing(HighlightSpacing::Never)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut ts = TableState::default().with_selected(selected.map(|i| i.saturating_sub(start)));
    f.render_stateful_widget(table, area, &mut ts);
    app.scroll.set(start);
    if rows.is_empty() && area.height > 1 {
        let msg = if state.procs.is_empty() {
            "no KFD processes (no process has /dev/kfd open)".to_string()
        } else {
            format!("no process or queue matches the filter {:?}", app.filter)
        };
        let r = Rect::new(area.x, area.y + 1, area.width, 1);
        f.render_widget(Paragraph::new(Line::styled(msg, dim())), r);
    }
}

/// The rows `[start, end)` a [`Table`] shows of `len` one-line rows in a body `height` lines
/// high, from `offset` and with `selected` kept visible: ratatui's `Table::get_row_bounds` (0.29),
/// so that a table of just these rows draws the same screen.
fn row_bounds(len: usize, selected: Option<usize>, offset: usize, height: usize) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let offset = offset.min(len - 1);
    let mut start = offset;
    let mut end = offset + height.min(len - offset);
    let Some(selected) = selected else {
        return (start, end);
    };
    let selected = selected.min(len - 1);
    // Scroll down until the selected row is visible, then up.
    let mut h = end - start;
    while selected >= end {
        h += 1;
        end += 1;
        while h > height {
            h -= 1;
            start += 1;
        }
    }
    while selected < start {
        start -= 1;
        h += 1;
        while h > height {
            end -= 1;
            h -= 1;
        }
    }
    (start, end)
}

// ---- detail pane ----

struct Detail {
    title: String,
    lines: Vec<Line<'static>>,
}

type Pairs = Vec<(&'static str, String)>;

fn detail(app: &App, state: &State, rows: &[TreeRow], width: u16) -> Option<Detail> {
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
            let (pairs, wide) = process_pairs(p, state.now_ns);
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
    let gpu = match state.gpu(q.gpu_id) {
        Some(g) => format!("{} {}", q.gpu_id, g.gfx_target),
        None => q.gpu_id.to_string(),
    };
    let hqd = match q.hqd {
        Some(h) => h.to_string(),
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
    let mut wide = vec![("sample", sample_label(&a.status))];
    if let Some(t) = &q.nv {
        // The RM objects a pause goes through, in place of the AMD ring and pointers.
        pairs.retain(|(k, _)| !matches!(*k, "ring" | "rptr" | "wptr" | "doorbell" | "pointers"));
        pairs.extend([
            ("rm client", format!("{:#x} (fd {})", t.h_client, t.fd)),
            ("subdevice", hex(t.h_subdevice.map(u64::from))),
            ("engine", format!("{:#x}", t.engine_type)),
        ]);
        let list: Vec<String> = t.channels.iter().map(|c| format!("{c:#x}")).collect();
        wide.push(("channels", format!("{}: {}", list.len(), list.join(" "))));
    }
    (pairs, wide)
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
        ("ns pid", opt(info.and_then(|i| i.ns_pid))),
        ("uid", opt(info.and_then(|i| i.uid))),
        (
            "container",
            info.and_then(|i| i.container.clone())
                .unwrap_or_else(|| "-".into()),
        ),
        ("debugger", opt(p.debugger)),
        ("source", source_label(p.source).to_string()),
        ("seen", ago(now, p.seen_ns)),
        ("exited", p.exited_ns.map_or("-".into(), |t| ago(now, t))),
    ];
    let wide = match info {
        Some(i) => vec![("cgroup", i.cgroup.clone()), ("cmdline", i.cmdline.clone())],
        None => {
            pairs.push(("info", "/proc not read yet".into()));
            vec![]
        }
    };
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

// ---- log, footer, help ----

fn draw_log(f: &mut Frame, area: Rect, state: &State) {
    let n = usize::from(area.height.saturating_sub(1));
    let now = state.now_ns;
    let lines: Vec<Line> = if state.log.is_empty() {
        vec![Line::styled("no events yet", dim())]
    } else {
        let skip = state.log.len().saturating_sub(n);
        state
            .log
            .iter()
            .skip(skip)
            .map(|e| {
                let q = e.queue_id.map_or_else(String::new, |q| format!("q{q}"));
                Line::from(vec![
                    Span::styled(format!("{:>4} ", fmt_age(app::age_ns(now, e.ts_ns))), dim()),
                    Span::styled(format!("{:<8}", e.kind.label()), log_style(e.kind)),
                    Span::raw(format!(" {:>7} {q:<4} {}", e.pid, e.text)),
                ])
            })
            .collect()
    };
    let block = Block::new()
        .borders(Borders::TOP)
        .title(Span::styled(" events ", bold()));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

const HINTS: [(&str, &str); 8] = [
    ("q", "quit"),
    ("?", "help"),
    ("↑↓", "move"),
    ("⏎", "detail"),
    ("s", "suspend"),
    ("r", "resume"),
    ("/", "filter"),
    ("o", "sort"),
];

fn draw_footer(f: &mut Frame, area: Rect, app: &App) {
    if app.filter_open {
        let prompt = "filter: ";
        let line = Line::from(vec![
            Span::styled(prompt, bold()),
            Span::raw(app.filter.clone()),
            Span::styled("   Enter keep  Esc clear", dim()),
        ]);
        f.render_widget(Paragraph::new(line), area);
        let x = area.x + u16::try_from(prompt.len() + app.filter.chars().count()).unwrap_or(0);
        f.set_cursor_position((x.min(area.right().saturating_sub(1)), area.y));
        return;
    }
    let mut spans = Vec::new();
    if let Some(s) = app.status.as_ref().filter(|s| s.at.elapsed() < STATUS_TTL) {
        let style = if s.error {
            Style::new().fg(Color::Red)
        } else {
            bold()
        };
        spans.push(Span::styled(s.text.clone(), style));
        spans.push(Span::raw("  "));
    }
    for (k, d) in HINTS {
        spans.push(Span::styled(
            k,
            Style::new().add_modifier(Modifier::REVERSED),
        ));
        spans.push(Span::raw(format!(" {d} ")));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

const HELP: [(&str, &str); 12] = [
    ("↑ k  ↓ j", "move the selection"),
    ("PgUp PgDn", "a page up / down (also Ctrl-u Ctrl-d)"),
    ("Home g  End G", "first / last row"),
    ("Enter", "open / close the detail pane"),
    ("o >  <", "sort by the next / previous column"),
    ("O", "reverse the sort order"),
    ("/", "filter: pid comm container cmdline class state"),
    ("s", "suspend the selected process or queue"),
    ("r", "resume the selected process or queue"),
    ("Esc", "close help / detail, clear the filter"),
    ("?", "show / hide this help"),
    ("q  Ctrl-C", "quit"),
];

fn draw_help(f: &mut Frame, area: Rect) {
    let w = area.width.saturating_sub(2).min(64);
    let h = area.height.saturating_sub(2).min(HELP.len() as u16 + 2);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, d)| {
            Line::from(vec![
                Span::styled(format!(" {k:<14} "), bold()),
                Span::raw(*d),
            ])
        })
        .collect();
    let block = Block::bordered().title(Span::styled(" help: keys ", bold()));
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(lines).block(block), r);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Update;
    use crate::tui::app::{
        tests::{create, info, known_state, GPU_A},
        Action,
    };
    use ratatui::{backend::TestBackend, buffer::Buffer, Terminal};

    fn render(app: &App, state: &State, w: u16, h: u16) -> Buffer {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, app, state)).unwrap();
        t.backend().buffer().clone()
    }

    fn line(b: &Buffer, y: u16) -> String {
        (0..b.area.width)
            .map(|x| b[(x, y)].symbol().to_string())
            .collect()
    }

    fn lines(b: &Buffer) -> Vec<String> {
        (0..b.area.height).map(|y| line(b, y)).collect()
    }

    /// The line holding `needle`, or a panic that shows the screen.
    fn find(b: &Buffer, needle: &str) -> u16 {
        let all = lines(b);
        match all.iter().position(|l| l.contains(needle)) {
            Some(y) => y as u16,
            None => panic!("{needle:?} not on screen:\n{}", all.join("\n")),
        }
    }

    fn assert_absent(b: &Buffer, needle: &str) {
        let all = lines(b);
        assert!(
            all.iter().all(|l| !l.contains(needle)),
            "{needle:?} is on screen:\n{}",
            all.join("\n")
        );
    }

    /// The first line that starts with `prefix` (a pid, or ` ├─ Q` for a queue) and holds
    /// `also`.
    fn row_starting(b: &Buffer, prefix: &str, also: &str) -> String {
        let all = lines(b);
        match all
            .iter()
            .find(|l| l.starts_with(prefix) && l.contains(also))
        {
            Some(l) => l.clone(),
            None => panic!("no line {prefix:?}..{also:?}:\n{}", all.join("\n")),
        }
    }

    fn row_with(b: &Buffer, needle: &str) -> String {
        line(b, find(b, needle))
    }

    fn find_start(b: &Buffer, prefix: &str) -> u16 {
        let all = lines(b);
        match all.iter().position(|l| l.starts_with(prefix)) {
            Some(y) => y as u16,
            None => panic!("no line starts with {prefix:?}:\n{}", all.join("\n")),
        }
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn has(words: &[String], w: &str) -> bool {
        words.iter().any(|x| x == w)
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_age(3_200_000_000), "3s");
        assert_eq!(fmt_age(300_000_000_000), "5m");
        assert_eq!(fmt_age(7_300_000_000_000), "2h");
        assert_eq!(fmt_age(3 * 86_400_000_000_000), "3d");
        assert_eq!(fmt_rate(None), "-");
        assert_eq!(fmt_rate(Some(0.0)), "0");
        assert_eq!(fmt_rate(Some(2.54)), "2.5");
        assert_eq!(fmt_rate(Some(350.2)), "350");
        assert_eq!(fmt_rate(Some(1234.0)), "1.2k");
        assert_eq!(fmt_rate(Some(3.4e6)), "3.4M");
        assert_eq!(hex(Some(0x1000)), "0x1000");
        assert_eq!(hex(None), "-");
    }

    #[test]
    fn columns_degrade_with_width() {
        let names = |w: u16| -> Vec<Col> { columns(w).iter().map(|(c, _)| c.col).collect() };
        let total = |w: u16| -> u16 {
            let c = columns(w);
            c.iter().map(|(_, w)| *w).sum::<u16>() + c.len() as u16 - 1
        };
        for w in [40, 60, 80, 100, 120, 200] {
            assert_eq!(total(w), w, "columns fill {w}");
        }
        let wide = names(200);
        assert_eq!(wide.len(), COLS.len());
        let c80 = names(80);
        for c in [
            Col::Id,
            Col::Comm,
            Col::Hqd,
            Col::State,
            Col::Gpu,
            Col::Rate,
        ] {
            assert!(c80.contains(&c), "{c:?} at 80");
        }
        for c in [Col::Cmdline, Col::Container, Col::Age] {
            assert!(!c80.contains(&c), "{c:?} dropped at 80");
        }
        assert_eq!(
            names(40),
            vec![Col::Id, Col::Comm, Col::Gpu, Col::Hqd, Col::State]
        );
    }

    #[test]
    fn a_known_state() {
        let st = known_state();
        let app = App::new("100ms");
        let b = render(&app, &st, 140, 40);
        // Title and header.
        let y = find(&b, "gpreempt-ebpf top");
        assert_eq!(y, 0);
        assert!(line(&b, 0).contains("3 processes  5 queues  sort pid▲"));
        assert!(line(&b, 0).contains("every 100ms"));
        assert_eq!(
            words(&line(&b, 1)),
            words("GPU 1001 gfx90a 104CU  HQD 1/32  queues 3  suspended 1  busy 1")
        );
        assert_eq!(
            words(&line(&b, 2)),
            words("GPU 2002 gfx90a 104CU  HQD ?/24  queues 2  suspended 0  busy 0")
        );
        assert!(line(&b, 3).contains("HQD map from debugfs hqds, read 2s ago"));
        // Table header on line 4, then the tree.
        let header = words(&line(&b, 4));
        assert_eq!(
            header,
            words("PID▲ COMM CLASS Q GPU TYPE PRIO HQD STATE DISP/S BKLG AGE CONTAINER CMDLINE")
        );
        assert_eq!(
            words(&line(&b, 5)),
            words("100 python online 2 suspended 1.0k 5s abcdef123456 python serve.py --model resnet18")
        );
        assert_eq!(
            words(&line(&b, 6)),
            words("├─ 0 1001 aql 7 0.1.2 active 1.0k 4 5s")
        );
        assert_eq!(
            words(&line(&b, 7)),
            words("├─ 1 1001 aql 7 - suspended - - 5s")
        );
        assert_eq!(
            words(&line(&b, 8)),
            words("└─ 2 2002 aql 7 - destroyed - - 5s")
        );
        assert_eq!(
            words(&line(&b, 9)),
            words("200 train offline 2 evicted - 4s - torchrun train.py")
        );
        assert_eq!(
            words(&line(&b, 10)),
            words("├─ 0 2002 aql 7 - evicted - - 4s")
        );
        assert_eq!(
            words(&line(&b, 11)),
            words("└─ 1 2002 aql 7 - evicted - - 4s")
        );
        assert_eq!(
            words(&line(&b, 12)),
            words("300 bench - 1 active - 3s - ./bench -n 10")
        );
        assert_eq!(
            words(&line(&b, 13)),
            words("└─ 5 1001 aql 7 - active - - 3s")
        );
        // The first row is selected: reversed, not coloured.
        assert!(b[(0, 5)].modifier.contains(Modifier::REVERSED));
        assert!(!b[(0, 6)].modifier.contains(Modifier::REVERSED));
        // States: suspended yellow, evicted red, destroyed dim; never white or black.
        let x = line(&b, 7).find("suspended").unwrap();
        let x = line(&b, 7)[..x].chars().count() as u16;
        assert_eq!(b[(x, 7)].fg, Color::Yellow);
        let x = line(&b, 10)[..line(&b, 10).find("evicted").unwrap()]
            .chars()
            .count() as u16;
        assert_eq!(b[(x, 10)].fg, Color::Red);
        assert!(b[(3, 8)].modifier.contains(Modifier::DIM));
        for cell in b.content() {
            for c in [Color::White, Color::Black, Color::Gray, Color::DarkGray] {
                assert_ne!(cell.fg, c);
                assert_ne!(cell.bg, c);
            }
        }
        // The event log: newest last, with age, kind, pid, queue and text.
        let y = find(&b, "events");
        assert!(y > 13);
        let l = row_with(&b, "suspend  ");
        assert_eq!(words(&l), words("1s suspend 100 q1 suspended by pid 999"));
        let l = row_with(&b, "destroy  ");
        assert_eq!(words(&l), words("1s destroy 100 q2 destroyed"));
        let l = row_with(&b, "evict ");
        assert_eq!(words(&l), words("1s evict 200 2 queue(s) evicted"));
        // Footer: key hints.
        let last = line(&b, 39);
        assert!(last.contains("q quit"), "{last}");
        assert!(last.contains("s suspend"), "{last}");
    }

    #[test]
    fn hqds_unknown_says_so() {
        let mut st = State::new();
        st.apply(create(1_000_000_000, 42, 3, GPU_A));
        let b = render(&App::default(), &st, 80, 24);
        let y = find(&b, "HQD slots unknown");
        assert!(line(&b, y).contains("debugfs hqds not readable"));
        assert_eq!(y, 2, "right under the (single) GPU line");
        assert!(line(&b, 1).contains("no GPUs found"));
        // A live queue's slot is unknown: `?`, not `-`.
        let q = words(&row_starting(&b, " └─ 3", ""));
        assert!(has(&q, "?"), "{q:?}");
    }

    #[test]
    fn the_detail_pane_of_a_queue() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::Down, &st);
        app.handle(Action::ToggleDetail, &st);
        let b = render(&app, &st, 120, 40);
        let y = find(&b, " queue 0 of pid 100 (python) ");
        let pane: Vec<String> = lines(&b)[y as usize..].to_vec();
        let has = |k: &str, v: &str| {
            let want = format!("{k:<KEY_W$} {v}");
            assert!(
                pane.iter().any(|l| l.contains(&want)),
                "{want:?} not in\n{}",
                pane.join("\n")
            );
        };
        let rb = crate::tui::app::tests::ring(100, 0);
        has("hqd", "0.1.2");
        has("state", "active");
        has("gpu", "1001 gfx90a");
        has("type", "aql");
        has("priority", "7");
        has("ring", &format!("{rb:#x} (4096 B)"));
        has("rptr", &format!("{:#x}", rb + 0x800));
        has("wptr", &format!("{:#x}", rb + 0x7b8));
        has("doorbell", "0x");
        has("suspended by", "-");
        has("source", "event");
        has("pointers", "create_queue");
        has("sample", "valid");
        has("dispatch/s", "1.0k");
        has("backlog", "4");
        has("read id", "1010");
        has("write id", "1014");
        has("busy", "yes");
        has("created", "5s ago");
        // The selected queue row is highlighted.
        let row = find(&b, "├─ 0");
        assert!(b[(2, row)].modifier.contains(Modifier::REVERSED));

        // The suspended queue names its suspender.
        app.handle(Action::Down, &st);
        let b = render(&app, &st, 120, 40);
        find(&b, " queue 1 of pid 100 (python) ");
        let y = find(&b, "suspended by");
        assert!(line(&b, y).contains(&format!("{:<KEY_W$} 999", "suspended by")));
    }

    #[test]
    fn the_detail_pane_of_a_process() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::ToggleDetail, &st);
        let b = render(&app, &st, 120, 40);
        find(&b, " pid 100 (python) ");
        for (k, v) in [
            ("ns pid", "7"),
            ("uid", "1000"),
            ("container", "abcdef123456"),
            // Learnt from its suspend of queue 1.
            ("debugger", "999"),
            ("class", "online"),
            ("queues", "2 live, 3 listed"),
            ("cgroup", "/system.slice/x.scope"),
            ("cmdline", "python serve.py --model resnet18"),
        ] {
            find(&b, &format!("{k:<KEY_W$} {v}"));
        }
    }

    #[test]
    fn the_detail_pane_fits_80x24() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::Down, &st);
        app.handle(Action::ToggleDetail, &st);
        let b = render(&app, &st, 80, 24);
        find(&b, " queue 0 of pid 100 (python) ");
        find(&b, &format!("{:<KEY_W$} 0.1.2", "hqd"));
        find(&b, &format!("{:<KEY_W$} active", "state"));
        // The table still shows the selection.
        let y = find(&b, "├─ 0");
        assert!(b[(2, y)].modifier.contains(Modifier::REVERSED));
        assert!(line(&b, 23).contains("q quit"));
    }

    #[test]
    fn the_help_popup_lists_keys() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::Help, &st);
        let b = render(&app, &st, 80, 24);
        find(&b, "help: keys");
        for k in [
            "move the selection",
            "open / close the detail pane",
            "suspend the selected process or queue",
            "resume the selected process or queue",
            "reverse the sort order",
            "quit",
        ] {
            find(&b, k);
        }
        // At the minimum size the popup is clipped, not a panic.
        render(&app, &st, MIN_WIDTH, MIN_HEIGHT);
    }

    #[test]
    fn everything_essential_fits_80x24() {
        let st = known_state();
        let app = App::default();
        let b = render(&app, &st, 80, 24);
        find(&b, "GPU 1001 gfx90a 104CU  HQD 1/32");
        find(&b, "GPU 2002");
        let head = words(&row_with(&b, "PID▲"));
        for h in ["PID▲", "COMM", "GPU", "HQD", "STATE", "DISP/S"] {
            assert!(has(&head, h), "{h} in {head:?}");
        }
        for h in ["CMDLINE", "CONTAINER", "AGE"] {
            assert!(!has(&head, h), "{h} dropped: {head:?}");
        }
        let p = words(&row_starting(&b, "100 ", ""));
        assert_eq!(&p[..2], &["100", "python"]);
        assert!(has(&p, "suspended"));
        let q = words(&row_starting(&b, " ├─ 0", "1001"));
        assert!(has(&q, "0.1.2") && has(&q, "active"), "{q:?}");
        for (id, also, state) in [
            (" ├─ 1", "1001", "suspended"),
            (" └─ 2", "2002", "destroyed"),
            (" ├─ 0", "2002", "evicted"),
            (" └─ 1", "2002", "evicted"),
            (" └─ 5", "1001", "active"),
        ] {
            let r = words(&row_starting(&b, id, also));
            assert!(has(&r, state), "{id}: {r:?}");
        }
        row_starting(&b, "200 ", "train");
        row_starting(&b, "300 ", "bench");
        find(&b, "train");
        find(&b, "bench");
        find(&b, "events");
        assert!(line(&b, 23).contains("q quit"));
    }

    #[test]
    fn very_small_terminals_get_a_message() {
        let st = known_state();
        let mut app = App::default();
        app.detail = true;
        app.show_help = true;
        let b = render(&app, &st, 30, 8);
        assert!(
            line(&b, 0).starts_with("terminal too small"),
            "{}",
            line(&b, 0)
        );
        for (w, h) in [(39, 24), (80, 9), (1, 1), (18, 3)] {
            let b = render(&app, &st, w, h);
            let want = &"terminal too small"[..usize::from(w.min(18))];
            assert!(line(&b, 0).starts_with(want), "{w}x{h}: {}", line(&b, 0));
        }
        // Just big enough: the full screen, no panic, with every pane open.
        for (w, h) in [(40, 10), (41, 11), (45, 14), (60, 17)] {
            let b = render(&app, &st, w, h);
            find(&b, "gpreempt-ebpf");
        }
    }

    #[test]
    fn an_empty_host() {
        let st = State::new();
        let app = App::default();
        let b = render(&app, &st, 80, 24);
        find(&b, "no GPUs found");
        find(&b, "no KFD processes");
        find(&b, "no events yet");
        find(&b, "0 processes  0 queues");
        // Keys on an empty table do nothing harmful.
        let mut app = app;
        for a in [
            Action::Down,
            Action::End,
            Action::ToggleDetail,
            Action::Suspend,
        ] {
            app.handle(a, &st);
        }
        let b = render(&app, &st, 80, 24);
        find(&b, "no KFD processes");
        find(&b, "nothing to suspend");
    }

    #[test]
    fn a_filter_with_no_match_says_so() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::StartFilter, &st);
        for c in "zzz".chars() {
            app.handle(Action::FilterChar(c), &st);
        }
        let b = render(&app, &st, 80, 24);
        find(&b, "no process or queue matches the filter \"zzz\"");
        assert!(line(&b, 23).starts_with("filter: zzz"));
        app.handle(Action::FilterDone, &st);
        let b = render(&app, &st, 80, 24);
        find(&b, "filter \"zzz\"");
        assert_absent(&b, "python");
    }

    #[test]
    fn many_gpus_are_summarised() {
        let mut st = State::new();
        let nodes = (0..8)
            .map(|i| crate::kfd::sysfs::GpuNode {
                node: i + 1,
                gpu_id: 100 + i,
                gfx_target_version: 90402,
                cu_count: 80,
                hqd_slots: 24,
                num_xcc: 4,
                ..Default::default()
            })
            .collect();
        st.apply(Update::Topology(nodes));
        st.apply(create(1, 9, 0, 100));
        st.apply(Update::ProcInfo {
            pid: 9,
            info: info("x", "x", None),
        });
        let b = render(&App::default(), &st, 80, 24);
        find(&b, "GPU 100 gfx942 80CU  HQD ?/96");
        find(&b, "... and 3 more GPUs");
        find(&b, "└─ 0");
    }

    #[test]
    fn scrolling_keeps_the_selection_visible() {
        let mut st = State::new();
        for pid in 1..=30 {
            st.apply(create(1, pid, 0, GPU_A));
        }
        let mut app = App::default();
        app.page = 5;
        for _ in 0..44 {
            app.handle(Action::Down, &st);
        }
        let b = render(&app, &st, 80, 24);
        let y = find_start(&b, "23 ");
        assert!(
            b[(0, y)].modifier.contains(Modifier::REVERSED),
            "pid 23 selected"
        );
        // Going up a little does not move the view.
        let first = app.scroll.get();
        app.handle(Action::Up, &st);
        render(&app, &st, 80, 24);
        assert_eq!(app.scroll.get(), first);
    }

    /// `row_bounds` picks the rows ratatui's `Table` shows, so a table of just those rows draws
    /// the same screen and keeps the same offset.
    #[test]
    fn the_row_window_is_the_tables_own() {
        let full = |len: usize, sel: Option<usize>, off: usize, h: u16| {
            let rows = (0..len).map(|i| Row::new([i.to_string()]));
            let t = Table::new(rows, [Constraint::Length(6)]).header(Row::new(["H"]));
            let mut ts = TableState::default().with_offset(off).with_selected(sel);
            let mut b = Buffer::empty(Rect::new(0, 0, 6, h));
            ratatui::widgets::StatefulWidget::render(t, b.area, &mut b, &mut ts);
            (ts.offset(), b)
        };
        for len in [1usize, 2, 5, 9, 30] {
            for h in [1u16, 2, 4, 7, 12] {
                let body = usize::from(h - 1);
                for off in 0..len + 2 {
                    for sel in (0..len + 1).map(Some).chain([None]) {
                        let (offset, want) = full(len, sel, off, h);
                        let (start, end) = row_bounds(len, sel, off, body);
                        assert_eq!(start, offset, "len {len} h {h} off {off} sel {sel:?}");
                        let rows = (start..end).map(|i| Row::new([i.to_string()]));
                        let t = Table::new(rows, [Constraint::Length(6)]).header(Row::new(["H"]));
                        let mut ts = TableState::default()
                            .with_selected(sel.map(|s| s.min(len - 1).saturating_sub(start)));
                        let mut got = Buffer::empty(Rect::new(0, 0, 6, h));
                        ratatui::widgets::StatefulWidget::render(t, got.area, &mut got, &mut ts);
                        assert_eq!(got, want, "len {len} h {h} off {off} sel {sel:?}");
                    }
                }
            }
        }
    }
}
