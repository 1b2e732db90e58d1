//! The process -> queue table: which columns fit, their cells, and the rows a screen shows.

use ratatui::{
    layout::{Constraint, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Cell, HighlightSpacing, Paragraph, Row, Table, TableState},
    Frame,
};

use super::style::{bold, dim, fmt_age, fmt_rate, opt, state_style};
use crate::observe::model::{Process, Queue, State};
use crate::tui::app::{self, App, SortColumn, TreeRow};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Col {
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
    /// Request latency p50/p99 (online processes, whose launches and waits are watched).
    Req,
    Backlog,
    Age,
    Container,
    Cmdline,
}

pub(super) struct ColSpec {
    pub(super) col: Col,
    pub(super) title: &'static str,
    /// Width (the minimum for COMM and CMDLINE, which take what is left).
    pub(super) width: u16,
    /// Columns with the highest rank are dropped first when the terminal is narrow.
    pub(super) drop_rank: u8,
}

/// In display order.
pub(super) const COLS: [ColSpec; 15] = [
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
        col: Col::Req,
        title: "REQ50/99",
        width: 11,
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

/// [`columns_for`] with the PID column at its own width.
#[cfg(test)]
pub(super) fn columns(width: u16) -> Vec<(&'static ColSpec, u16)> {
    columns_for(width, 0)
}

/// The columns that fit `width` (one space between columns), with their widths: the most
/// important first (pid, comm, HQD, state), then by rank until one does not fit; COMM and
/// CMDLINE share what is left. The PID column is at least `id_width` wide: a queue row's id
/// after its tree mark, whole (an NVIDIA TSG's is a 10-digit RM handle).
pub(super) fn columns_for(width: u16, id_width: u16) -> Vec<(&'static ColSpec, u16)> {
    let w = |c: &ColSpec| {
        if c.col == Col::Id {
            c.width.max(id_width)
        } else {
            c.width
        }
    };
    let mut by_rank: Vec<&ColSpec> = COLS.iter().collect();
    by_rank.sort_by_key(|c| c.drop_rank);
    let mut used = 0u16;
    let mut keep = Vec::new();
    for c in by_rank {
        let need = w(c) + u16::from(!keep.is_empty());
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
        .map(|c| (c, w(c)))
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

/// `p50/p99` in ms, two significant figures or so: `4.1/5.2`, `55/61`.
fn fmt_requests(s: &crate::observe::requests::RequestStats) -> String {
    let ms = |ns: u64| {
        let v = ns as f64 / 1e6;
        if v < 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        }
    };
    format!("{}/{}", ms(s.p50_ns), ms(s.p99_ns))
}

fn process_cell(c: Col, p: &Process, state: &State) -> Cell<'static> {
    let now = state.now_ns;
    let info = p.info.as_ref();
    match c {
        Col::Req => Cell::from(
            state
                .request_stats(p, now)
                .filter(|s| s.count > 0)
                .map_or_else(|| "-".into(), |s| fmt_requests(&s)),
        ),
        Col::Id => Cell::from(p.pid.to_string()),
        Col::Comm => Cell::from(crate::term::clean(p.comm()).into_owned()),
        Col::Class => match (&p.uncontrollable, &p.escaped) {
            // `!`: the controller cannot act on it (the detail pane says why).
            (Some(_), _) => Cell::from(format!("{}!", p.class.as_deref().unwrap_or("-")))
                .style(Style::new().fg(ratatui::style::Color::Red)),
            // `^`: it got out of a hold (and was held again): the detail pane says how.
            (None, Some(_)) => Cell::from(format!("{}^", p.class.as_deref().unwrap_or("-")))
                .style(Style::new().fg(ratatui::style::Color::Yellow)),
            (None, None) => Cell::from(p.class.clone().unwrap_or_else(|| "-".into())),
        },
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
            crate::term::clean(&info.and_then(|i| i.place()).unwrap_or_else(|| "-".into()))
                .into_owned(),
        ),
        Col::Cmdline => Cell::from(
            crate::term::clean(&info.map(|i| i.cmdline.clone()).unwrap_or_default()).into_owned(),
        ),
        Col::Gpu | Col::Kind | Col::Prio | Col::Hqd | Col::Backlog => Cell::from(""),
    }
}

/// The width of the PID column's text in `rows`: a pid, or a queue id after ` ├─ `.
pub(super) fn id_width(rows: &[TreeRow]) -> u16 {
    let digits = |n: u32| n.checked_ilog10().unwrap_or(0) as u16 + 1;
    rows.iter()
        .map(|r| r.queue.map_or(digits(r.pid), |q| 4 + digits(q)))
        .max()
        .unwrap_or(0)
}

/// A queue's GPU as `top` names it: an NVIDIA TSG's GPU by its index (nvidia-smi's), once the
/// RM said which GPU its device instance is; a KFD queue's by its gpu_id.
fn gpu_label(q: &Queue, state: &State) -> String {
    match q.nv.as_ref().and_then(|_| state.nv_gpu(q.gpu_id)) {
        Some(g) => g.index.to_string(),
        None => q.gpu_id.to_string(),
    }
}

fn queue_cell(c: Col, q: &Queue, last: bool, state: &State) -> Cell<'static> {
    let hqds_known = state.hqds_ns.is_some();
    let now = state.now_ns;
    match c {
        Col::Id => Cell::from(format!(" {}─ {}", if last { '└' } else { '├' }, q.queue_id)),
        Col::Gpu => Cell::from(gpu_label(q, state)),
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
        Col::Comm | Col::Class | Col::Nq | Col::Req | Col::Container | Col::Cmdline => {
            Cell::from("")
        }
    }
}

fn table_row(r: &TreeRow, cols: &[(&ColSpec, u16)], state: &State) -> Row<'static> {
    let Some(p) = state.procs.get(&r.pid) else {
        return Row::new(Vec::<Cell>::new());
    };
    match r.queue {
        None => {
            let style = if p.exited_ns.is_some() { dim() } else { bold() };
            Row::new(cols.iter().map(|(c, _)| process_cell(c.col, p, state))).style(style)
        }
        Some(qid) => {
            let Some(q) = p.queues.get(&qid) else {
                return Row::new(Vec::<Cell>::new());
            };
            let style = if q.alive() { Style::new() } else { dim() };
            Row::new(
                cols.iter()
                    .map(|(c, _)| queue_cell(c.col, q, r.last, state)),
            )
            .style(style)
        }
    }
}

pub(super) fn draw_table(f: &mut Frame, area: Rect, app: &App, state: &State, rows: &[TreeRow]) {
    let cols = columns_for(area.width, id_width(rows));
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
            if state.nv_gpus.is_empty() {
                "no KFD processes (no process has /dev/kfd open)".to_string()
            } else {
                "no GPU processes (none has /dev/kfd or an NVIDIA device open)".to_string()
            }
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
pub(super) fn row_bounds(
    len: usize,
    selected: Option<usize>,
    offset: usize,
    height: usize,
) -> (usize, usize) {
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
