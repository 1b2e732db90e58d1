//! The look every part of the screen shares: its styles, and how times, rates and values are
//! written.

use std::time::Duration;

use ratatui::style::{Color, Modifier, Style};

use crate::observe::model::{QueueState, Source};
use crate::tui::app;

/// How long a status message stays in the footer.
pub(super) const STATUS_TTL: Duration = Duration::from_secs(10);
/// Width of the key column of the detail pane.
pub(super) const KEY_W: usize = 12;

pub(super) fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

pub(super) fn dim() -> Style {
    Style::new().add_modifier(Modifier::DIM)
}

pub(super) fn state_style(s: QueueState) -> Style {
    match s {
        QueueState::Active => Style::new(),
        QueueState::Suspended => Style::new().fg(Color::Yellow),
        QueueState::Evicted => Style::new().fg(Color::Red),
        QueueState::Destroyed => dim(),
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

pub(super) fn hex(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:#x}"))
}

pub(super) fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

pub(super) fn ago(now: u64, ts: u64) -> String {
    format!("{} ago", fmt_age(app::age_ns(now, ts)))
}

pub(super) fn source_label(s: Source) -> &'static str {
    match s {
        Source::Event => "event",
        Source::Sysfs => "sysfs",
    }
}
