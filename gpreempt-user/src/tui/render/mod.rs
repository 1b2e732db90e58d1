//! Draws `top`: a title line, one line per GPU, the HQD source line, the process -> queue table,
//! the detail pane (Enter), the event log and the footer; `?` adds a help popup.
//!
//! Readable on dark and light terminals: modifiers (BOLD, REVERSED, DIM) and the basic
//! Red / Yellow / Green only, never a white or black foreground or background.

use ratatui::{
    layout::Rect,
    text::Span,
    widgets::{Block, Borders, Paragraph},
    Frame,
};

use super::app::{self, App, TreeRow};
use crate::observe::model::State;

mod detail;
mod footer;
mod header;
mod log;
mod style;
mod table;

pub use self::style::{fmt_age, fmt_rate};
use self::{
    detail::detail,
    footer::{draw_footer, draw_help},
    header::{draw_gpus, draw_hqd_line, draw_title, gpu_counts},
    log::draw_log,
    style::bold,
    table::draw_table,
};

/// Below this the screen shows only a "terminal too small" line.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 10;
/// Header row + 3 rows: the least the table keeps when panes compete for height.
const TABLE_MIN: u16 = 4;
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
    let n = u16::try_from(header::gpu_line_count(state))
        .unwrap_or(u16::MAX)
        .max(1);
    n.min((height / 4).max(1))
}

fn split(area: Rect, app: &App, state: &State, detail_lines: u16) -> Areas {
    let g = gpu_lines(state, area.height);
    let h = u16::from(header::hqd_line_shown(state));
    let rest = area.height.saturating_sub(2 + h + g);
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
    let hqd = take(h);
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
    no_controls(f.buffer_mut());
    if app.no_color {
        no_colors(f.buffer_mut());
    }
}

/// `NO_COLOR`: every cell in the terminal's default colours; modifiers (the selection's
/// reverse, bold headers) stay, so nothing is marked by colour alone.
fn no_colors(buf: &mut ratatui::buffer::Buffer) {
    for cell in buf.content.iter_mut() {
        cell.fg = ratatui::style::Color::Reset;
        cell.bg = ratatui::style::Color::Reset;
    }
}

/// The last line of defence for what processes and code objects name themselves (the table
/// shows them [`crate::term::clean`]ed): no control character reaches the terminal from any
/// cell. One that took a cell of its own shows as `?`; one appended to a cell's text (a
/// zero-width one) is dropped, which keeps the columns aligned.
fn no_controls(buf: &mut ratatui::buffer::Buffer) {
    for cell in buf.content.iter_mut() {
        let sym = cell.symbol();
        if sym.chars().any(char::is_control) {
            let kept: String = sym.chars().filter(|c| !c.is_control()).collect();
            cell.set_symbol(if kept.is_empty() { "?" } else { &kept });
        }
    }
}

#[cfg(test)]
mod tests;
