//! The footer (key hints, or a status message while it is fresh) and the `?` help popup.

use ratatui::{
    layout::Rect,
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Clear, Paragraph},
    Frame,
};

use super::style::{bold, dim, STATUS_TTL};
use crate::tui::app::App;

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

pub(super) fn draw_footer(f: &mut Frame, area: Rect, app: &App) {
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

pub(super) fn draw_help(f: &mut Frame, area: Rect) {
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
