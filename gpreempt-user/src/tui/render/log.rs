//! The event log pane: the latest host-model events, newest last.

use ratatui::{
    layout::Rect,
    style::{Color, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph},
    Frame,
};

use super::style::{bold, dim, fmt_age};
use crate::observe::model::{LogKind, State};
use crate::tui::app::{self};

fn log_style(k: LogKind) -> Style {
    match k {
        LogKind::Suspend => Style::new().fg(Color::Yellow),
        LogKind::Evict | LogKind::Error => Style::new().fg(Color::Red),
        LogKind::Resume | LogKind::Restore => Style::new().fg(Color::Green),
        LogKind::Destroy | LogKind::Exit | LogKind::Gone => dim(),
        LogKind::Create | LogKind::Found | LogKind::Debug => Style::new(),
    }
}

pub(super) fn draw_log(f: &mut Frame, area: Rect, state: &State) {
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
