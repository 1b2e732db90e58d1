//! `top`'s UI state, kept apart from rendering: the selection, sort order, filter, open panes and
//! the status line. Keys map to [`Action`]s ([`action_for`]); [`App::handle`] applies one and may
//! hand the run loop a [`Command`] to carry out. Everything here is pure.

use std::{cell::Cell, cmp::Ordering, time::Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::observe::model::{Process, Queue, QueueState, State};

/// A table row's identity: the process, and the queue for a queue row. Stable across refreshes
/// (row positions are not: sorting and new queues move rows).
pub type RowKey = (u32, Option<u32>);

/// What the process rows are ordered by (queues stay under their process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortColumn {
    Pid,
    Comm,
    Class,
    Queues,
    Rate,
    State,
    Age,
}

impl SortColumn {
    pub const ALL: [SortColumn; 7] = [
        Self::Pid,
        Self::Comm,
        Self::Class,
        Self::Queues,
        Self::Rate,
        Self::State,
        Self::Age,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Pid => "pid",
            Self::Comm => "comm",
            Self::Class => "class",
            Self::Queues => "queues",
            Self::Rate => "dispatch/s",
            Self::State => "state",
            Self::Age => "age",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0)
    }

    pub fn next(self) -> Self {
        Self::ALL[(self.index() + 1) % Self::ALL.len()]
    }

    pub fn prev(self) -> Self {
        Self::ALL[(self.index() + Self::ALL.len() - 1) % Self::ALL.len()]
    }

    /// The direction a column starts in: the interesting end first (most queues, busiest,
    /// suspended before active, newest).
    pub fn default_dir(self) -> SortDir {
        match self {
            Self::Queues | Self::Rate => SortDir::Desc,
            _ => SortDir::Asc,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortDir {
    Asc,
    Desc,
}

impl SortDir {
    pub fn reverse(self) -> Self {
        match self {
            Self::Asc => Self::Desc,
            Self::Desc => Self::Asc,
        }
    }
    pub fn arrow(self) -> &'static str {
        match self {
            Self::Asc => "▲",
            Self::Desc => "▼",
        }
    }
    fn apply(self, o: Ordering) -> Ordering {
        match self {
            Self::Asc => o,
            Self::Desc => o.reverse(),
        }
    }
}

/// What a key means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    /// Enter: open or close the detail pane.
    ToggleDetail,
    /// Sort by this column; the current column again reverses the direction.
    Sort(SortColumn),
    StartFilter,
    FilterChar(char),
    FilterBackspace,
    /// Enter in the prompt: keep the filter, close the prompt.
    FilterDone,
    /// Esc in the prompt: clear the filter, close the prompt.
    FilterCancel,
    Suspend,
    Resume,
    /// `?`: show or hide the key help.
    Help,
    /// Esc outside the prompt: close the help, else the detail pane, else clear the filter.
    Escape,
    Quit,
    None,
}

/// What the run loop must do for a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Suspend a whole process (`queue: None`) or one queue.
    Suspend {
        pid: u32,
        queue: Option<u32>,
    },
    Resume {
        pid: u32,
        queue: Option<u32>,
    },
    Quit,
}

/// The status line: the outcome of the last command.
#[derive(Clone, Debug)]
pub struct Status {
    pub text: String,
    pub error: bool,
    pub at: Instant,
}

/// One row of the process -> queue tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeRow {
    pub pid: u32,
    pub queue: Option<u32>,
    /// The last queue row under its process (drawn `└─`).
    pub last: bool,
}

impl TreeRow {
    pub fn key(&self) -> RowKey {
        (self.pid, self.queue)
    }
}

/// UI state.
#[derive(Clone, Debug)]
pub struct App {
    /// The selected row; None selects the first row.
    pub selected: Option<RowKey>,
    /// Position of the selection at the last sync: where the cursor stays when its row goes.
    sel_index: usize,
    pub sort: SortColumn,
    pub dir: SortDir,
    pub filter: String,
    pub filter_open: bool,
    pub show_help: bool,
    pub detail: bool,
    pub status: Option<Status>,
    /// The refresh interval, as shown in the title line.
    pub interval: String,
    /// Shown in the title line (e.g. that the GPU is emulated): `GPREEMPT_LABEL`.
    pub label: Option<String>,
    /// Rows a PageUp / PageDown moves (the run loop sets it to the table's height).
    pub page: usize,
    /// First table row shown: kept by the renderer between frames so the view does not jump.
    pub scroll: Cell<usize>,
    /// `NO_COLOR`: the screen in the terminal's own colours (bold and reverse still mark).
    pub no_color: bool,
    /// The running controller's policy: the detail pane says by which rule a process has its
    /// class.
    pub policy: Option<crate::policy::Policy>,
}

impl Default for App {
    fn default() -> Self {
        Self::new("")
    }
}

impl App {
    pub fn new(interval: impl Into<String>) -> Self {
        Self {
            selected: None,
            sel_index: 0,
            sort: SortColumn::Pid,
            dir: SortColumn::Pid.default_dir(),
            filter: String::new(),
            filter_open: false,
            show_help: false,
            detail: false,
            status: None,
            interval: interval.into(),
            label: None,
            page: 10,
            scroll: Cell::new(0),
            no_color: false,
            policy: None,
        }
    }

    pub fn set_status(&mut self, text: impl Into<String>, error: bool) {
        self.status = Some(Status {
            text: text.into(),
            error,
            at: Instant::now(),
        });
    }

    /// Index of the selected row in `rows`: the selected key; for a queue that is gone, its
    /// process; otherwise the same position as before (clamped). None only when there are no
    /// rows.
    pub fn resolve(&self, rows: &[TreeRow]) -> Option<usize> {
        if rows.is_empty() {
            return None;
        }
        if let Some(key) = self.selected {
            if let Some(i) = rows.iter().position(|r| r.key() == key) {
                return Some(i);
            }
            if key.1.is_some() {
                if let Some(i) = rows.iter().position(|r| r.key() == (key.0, None)) {
                    return Some(i);
                }
            }
        }
        Some(self.sel_index.min(rows.len() - 1))
    }

    /// Makes the selected key the row [`App::resolve`] finds (call when the rows change).
    pub fn sync(&mut self, state: &State) {
        let rows = rows(self, state);
        self.sync_rows(&rows);
    }

    /// [`App::sync`] with the rows already computed.
    pub fn sync_rows(&mut self, rows: &[TreeRow]) {
        match self.resolve(rows) {
            Some(i) => self.select(rows, i),
            None => self.selected = None,
        }
    }

    fn select(&mut self, rows: &[TreeRow], i: usize) {
        if let Some(r) = rows.get(i) {
            self.selected = Some(r.key());
            self.sel_index = i;
        }
    }

    /// The selected row of `state`, if any.
    pub fn selected_row(&self, state: &State) -> Option<TreeRow> {
        let rows = rows(self, state);
        self.resolve(&rows).and_then(|i| rows.get(i).copied())
    }

    /// Applies an action; returns what the run loop must carry out.
    pub fn handle(&mut self, a: Action, state: &State) -> Option<Command> {
        let rows = rows(self, state);
        self.sync_rows(&rows);
        let cur = self.resolve(&rows);
        let last = rows.len().saturating_sub(1);
        let page = self.page.max(1);
        let moved = |f: &dyn Fn(usize) -> usize| cur.map(|i| f(i).min(last));
        match a {
            Action::Up => self.move_to(&rows, moved(&|i| i.saturating_sub(1))),
            Action::Down => self.move_to(&rows, moved(&|i| i + 1)),
            Action::PageUp => self.move_to(&rows, moved(&|i| i.saturating_sub(page))),
            Action::PageDown => self.move_to(&rows, moved(&|i| i + page)),
            Action::Home => self.move_to(&rows, cur.map(|_| 0)),
            Action::End => self.move_to(&rows, cur.map(|_| last)),
            Action::ToggleDetail => self.detail = !self.detail,
            Action::Sort(c) => {
                if c == self.sort {
                    self.dir = self.dir.reverse();
                } else {
                    self.sort = c;
                    self.dir = c.default_dir();
                }
            }
            Action::StartFilter => self.filter_open = true,
            Action::FilterChar(c) => self.filter.push(c),
            Action::FilterBackspace => {
                self.filter.pop();
            }
            Action::FilterDone => self.filter_open = false,
            Action::FilterCancel => {
                self.filter.clear();
                self.filter_open = false;
            }
            Action::Suspend => return self.command_for(state, &rows, cur, true),
            Action::Resume => return self.command_for(state, &rows, cur, false),
            Action::Help => self.show_help = !self.show_help,
            Action::Escape => {
                if self.show_help {
                    self.show_help = false;
                } else if self.detail {
                    self.detail = false;
                } else {
                    self.filter.clear();
                }
            }
            Action::Quit => return Some(Command::Quit),
            Action::None => {}
        }
        if matches!(
            a,
            Action::Sort(_)
                | Action::FilterChar(_)
                | Action::FilterBackspace
                | Action::FilterCancel
                | Action::Escape
        ) {
            // The rows changed: keep the selected key, or the position when it is filtered out.
            self.sync(state);
        }
        None
    }

    fn move_to(&mut self, rows: &[TreeRow], i: Option<usize>) {
        if let Some(i) = i {
            self.select(rows, i);
        }
    }

    fn command_for(
        &mut self,
        state: &State,
        rows: &[TreeRow],
        cur: Option<usize>,
        suspend: bool,
    ) -> Option<Command> {
        let verb = if suspend { "suspend" } else { "resume" };
        let Some(row) = cur.and_then(|i| rows.get(i)) else {
            self.set_status(format!("nothing to {verb}: no row selected"), true);
            return None;
        };
        let pid = row.pid;
        let Some(p) = state.procs.get(&pid) else {
            self.set_status(format!("pid {pid} is gone"), true);
            return None;
        };
        if p.exited_ns.is_some() {
            self.set_status(format!("pid {pid} has exited"), true);
            return None;
        }
        match row.queue {
            Some(qid) => {
                if p.queues.get(&qid).is_none_or(|q| !q.alive()) {
                    self.set_status(format!("queue {qid} of pid {pid} is destroyed"), true);
                    return None;
                }
            }
            None => {
                if p.live_queues().next().is_none() {
                    self.set_status(format!("pid {pid} has no queues to {verb}"), true);
                    return None;
                }
            }
        }
        let queue = row.queue;
        Some(if suspend {
            Command::Suspend { pid, queue }
        } else {
            Command::Resume { pid, queue }
        })
    }
}

/// Maps a key to an action. While the filter prompt is open, characters go to the filter.
pub fn action_for(key: KeyEvent, app: &App) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    let alt = key.modifiers.contains(KeyModifiers::ALT);
    // Raw mode turns Ctrl-C into a key.
    if ctrl && matches!(key.code, KeyCode::Char('c' | 'C')) {
        return Action::Quit;
    }
    if app.filter_open {
        return match key.code {
            KeyCode::Enter => Action::FilterDone,
            KeyCode::Esc => Action::FilterCancel,
            KeyCode::Backspace => Action::FilterBackspace,
            KeyCode::Char(c) if !ctrl && !alt => Action::FilterChar(c),
            KeyCode::Up => Action::Up,
            KeyCode::Down => Action::Down,
            _ => Action::None,
        };
    }
    if ctrl {
        return match key.code {
            KeyCode::Char('u' | 'b') => Action::PageUp,
            KeyCode::Char('d' | 'f') => Action::PageDown,
            _ => Action::None,
        };
    }
    if alt {
        return Action::None;
    }
    match key.code {
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Home,
        KeyCode::End | KeyCode::Char('G') => Action::End,
        KeyCode::Enter => Action::ToggleDetail,
        KeyCode::Char('o' | '>') => Action::Sort(app.sort.next()),
        KeyCode::Char('<') => Action::Sort(app.sort.prev()),
        KeyCode::Char('O') => Action::Sort(app.sort),
        KeyCode::Char('/') => Action::StartFilter,
        KeyCode::Char('s') => Action::Suspend,
        KeyCode::Char('r') => Action::Resume,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Esc => Action::Escape,
        _ => Action::None,
    }
}

// ---- what the rows show, shared with the renderer ----

/// Live queues of a process.
pub fn live_count(p: &Process) -> usize {
    p.live_queues().count()
}

/// Summed dispatches/s of the live queues; None when no queue has a rate.
pub fn proc_rate(p: &Process) -> Option<f64> {
    p.live_queues()
        .filter_map(|q| q.activity.dispatches_per_s)
        .fold(None, |acc, r| Some(acc.unwrap_or(0.0) + r))
}

/// The most notable state among a process's live queues: suspended, then evicted, then active.
pub fn proc_queue_state(p: &Process) -> Option<QueueState> {
    p.live_queues()
        .map(|q| q.state)
        .min_by_key(|s| state_rank(*s))
}

/// The process row's state: `exited`, its most notable queue state, or `-` (no queues).
pub fn proc_state_label(p: &Process) -> &'static str {
    if p.exited_ns.is_some() {
        return "exited";
    }
    if p.unmanaged.is_some() && p.live_queues().next().is_none() {
        return "unmanaged";
    }
    proc_queue_state(p).map_or("-", QueueState::label)
}

fn state_rank(s: QueueState) -> u8 {
    match s {
        QueueState::Suspended => 0,
        QueueState::Evicted => 1,
        QueueState::Active => 2,
        QueueState::Destroyed => 3,
    }
}

fn proc_state_rank(p: &Process) -> u8 {
    if p.exited_ns.is_some() {
        return 5;
    }
    proc_queue_state(p).map_or(4, state_rank)
}

/// When the queue was created (or first seen, for queues found in sysfs).
pub fn queue_start_ns(q: &Queue) -> u64 {
    q.created_ns.unwrap_or(q.seen_ns)
}

/// Nanoseconds since `since` at `now` (0 when `since` is in the future).
pub fn age_ns(now: u64, since: u64) -> u64 {
    now.saturating_sub(since)
}

fn cmp_rate(a: Option<f64>, b: Option<f64>) -> Ordering {
    // No rate sorts below any rate.
    a.unwrap_or(-1.0).total_cmp(&b.unwrap_or(-1.0))
}

fn cmp_procs(col: SortColumn, a: &Process, b: &Process) -> Ordering {
    match col {
        SortColumn::Pid => a.pid.cmp(&b.pid),
        SortColumn::Comm => a.comm().to_lowercase().cmp(&b.comm().to_lowercase()),
        SortColumn::Class => a.class.cmp(&b.class),
        SortColumn::Queues => live_count(a).cmp(&live_count(b)),
        SortColumn::Rate => cmp_rate(proc_rate(a), proc_rate(b)),
        SortColumn::State => proc_state_rank(a).cmp(&proc_state_rank(b)),
        // Newest (largest start time) first when ascending by age.
        SortColumn::Age => b.seen_ns.cmp(&a.seen_ns),
    }
}

fn cmp_queues(col: SortColumn, a: &Queue, b: &Queue) -> Ordering {
    match col {
        SortColumn::Rate => cmp_rate(a.activity.dispatches_per_s, b.activity.dispatches_per_s),
        SortColumn::State => state_rank(a.state).cmp(&state_rank(b.state)),
        SortColumn::Age => queue_start_ns(b).cmp(&queue_start_ns(a)),
        _ => Ordering::Equal,
    }
}

fn contains(hay: &str, needle: &str) -> bool {
    hay.to_lowercase().contains(needle)
}

/// Whether the filter (lowercase) matches the process: pid, comm, container, cmdline or class.
pub fn process_matches(p: &Process, needle: &str) -> bool {
    if needle.is_empty() {
        return true;
    }
    p.pid.to_string().contains(needle)
        || contains(p.comm(), needle)
        || p.class.as_deref().is_some_and(|c| contains(c, needle))
        || p.info.as_ref().is_some_and(|i| {
            contains(&i.cmdline, needle)
                || i.container.as_deref().is_some_and(|c| contains(c, needle))
                || i.place().is_some_and(|c| contains(&c, needle))
        })
}

/// Whether the filter (lowercase) matches a queue row: its state, type, HQD or GPU id.
pub fn queue_matches(q: &Queue, needle: &str) -> bool {
    contains(q.state.label(), needle)
        || contains(q.kind.label(), needle)
        || q.hqd.is_some_and(|h| h.to_string().contains(needle))
        || q.gpu_id.to_string().contains(needle)
}

/// The rows of the table: each process followed by its queues, processes ordered by the sort
/// column (pid breaks ties), queues by the same column where it applies, else by queue id.
/// With a filter, a process that matches keeps all its queues; otherwise it is shown with just
/// the queues that match, or left out.
pub fn rows(app: &App, state: &State) -> Vec<TreeRow> {
    let needle = app.filter.trim().to_lowercase();
    // The queues shown of each process; None: all of them (no list built per process).
    let mut procs: Vec<(&Process, Option<Vec<&Queue>>)> = state
        .procs
        .values()
        .filter_map(|p| {
            if process_matches(p, &needle) {
                return Some((p, None));
            }
            let qs: Vec<&Queue> = p
                .queues
                .values()
                .filter(|q| queue_matches(q, &needle))
                .collect();
            (!qs.is_empty()).then_some((p, Some(qs)))
        })
        .collect();
    procs.sort_by(|(a, _), (b, _)| {
        app.dir
            .apply(cmp_procs(app.sort, a, b))
            .then(a.pid.cmp(&b.pid))
    });
    // Other columns leave queues in queue id order: the map's own, nothing to sort.
    let sorts_queues = matches!(
        app.sort,
        SortColumn::Rate | SortColumn::State | SortColumn::Age
    );
    let n = procs
        .iter()
        .map(|(p, qs)| 1 + qs.as_ref().map_or(p.queues.len(), Vec::len))
        .sum();
    let mut out = Vec::with_capacity(n);
    let mut qs: Vec<&Queue> = Vec::new();
    for (p, shown) in procs {
        out.push(TreeRow {
            pid: p.pid,
            queue: None,
            last: false,
        });
        if shown.is_none() && !sorts_queues {
            // All queues in id order: the map's keys (the queues themselves are not read).
            let n = p.queues.len();
            out.extend(p.queues.keys().enumerate().map(|(i, &qid)| TreeRow {
                pid: p.pid,
                queue: Some(qid),
                last: i + 1 == n,
            }));
            continue;
        }
        qs.clear();
        match shown {
            Some(v) => qs.extend(v),
            None => qs.extend(p.queues.values()),
        }
        if sorts_queues {
            qs.sort_by(|a, b| {
                app.dir
                    .apply(cmp_queues(app.sort, a, b))
                    .then(a.queue_id.cmp(&b.queue_id))
            });
        }
        let n = qs.len();
        out.extend(qs.iter().enumerate().map(|(i, q)| TreeRow {
            pid: p.pid,
            queue: Some(q.queue_id),
            last: i + 1 == n,
        }));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
