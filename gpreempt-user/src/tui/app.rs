//! `top`'s UI state, kept apart from rendering: the selection, sort order, filter, open panes and
//! the status line. Keys map to [`Action`]s ([`action_for`]); [`App::handle`] applies one and may
//! hand the run loop a [`Command`] to carry out. Everything here is pure.

use std::{cell::Cell, cmp::Ordering, time::Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::model::{Process, Queue, QueueState, State};

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
pub(crate) mod tests {
    use super::*;
    use crate::{
        kfd::{
            debugfs::{HqdNode, HqdSlot, Regs},
            sysfs::GpuNode,
        },
        model::{SampleRead, Update},
        observe::events::{Event, KfdCall},
        observe::procinfo::ProcInfo,
    };
    use gpreempt_common::kfd::{self, gfx9_hqd as reg};

    pub(crate) const GPU_A: u32 = 1001;
    pub(crate) const GPU_B: u32 = 2002;

    pub(crate) fn ring(pid: u32, qid: u32) -> u64 {
        0x7f00_0000_0000 + (u64::from(pid) << 16) + (u64::from(qid) << 12)
    }

    /// A CREATE_QUEUE event at `ts` (ns) by `pid`.
    pub(crate) fn create(ts: u64, pid: u32, qid: u32, gpu: u32) -> Update {
        let mut ev = crate::observe::events::tests::create_queue(0);
        ev.origin.ts_ns = ts;
        ev.origin.pid = pid;
        if let KfdCall::CreateQueue { args, .. } = &mut ev.call {
            args.queue_id = qid;
            args.gpu_id = gpu;
            args.ring_base_address = ring(pid, qid);
            args.read_pointer_address = ring(pid, qid) + 0x800;
            args.write_pointer_address = ring(pid, qid) + 0x7b8;
            args.doorbell_offset = kfd::doorbell_mmap_offset(gpu, u64::from(qid) * 8);
        }
        Update::Event(Event::Ioctl(ev))
    }

    pub(crate) fn destroy(ts: u64, pid: u32, qid: u32) -> Update {
        let mut ev = crate::observe::events::tests::create_queue(0);
        ev.origin.ts_ns = ts;
        ev.origin.pid = pid;
        ev.call = KfdCall::DestroyQueue(kfd::DestroyQueueArgs {
            queue_id: qid,
            ..Default::default()
        });
        Update::Event(Event::Ioctl(ev))
    }

    pub(crate) fn info(comm: &str, cmdline: &str, container: Option<&str>) -> ProcInfo {
        ProcInfo {
            comm: comm.into(),
            cmdline: cmdline.into(),
            uid: Some(1000),
            ns_pid: container.map(|_| 7),
            cgroup: "/system.slice/x.scope".into(),
            container: container.map(Into::into),
            start_time: 42,
        }
    }

    fn gpu(node: u32, gpu_id: u32) -> GpuNode {
        GpuNode {
            node,
            gpu_id,
            name: "ip discovery".into(),
            gfx_target_version: 90010,
            device_id: 0x740f,
            cu_count: 104,
            hqd_slots: 24,
            num_xcc: 1,
            drm_render_minor: 128 + node,
        }
    }

    /// The HQD dump of one GPU: 32 slots, the queue (pid, qid) in slot 0.1.2.
    fn hqds(gpu_id: u32, pid: u32, qid: u32) -> HqdNode {
        let mut slots = Vec::new();
        for pipe in 0..4 {
            for queue in 0..8 {
                let r = if (pipe, queue) == (1, 2) {
                    let rb = ring(pid, qid);
                    // dword index qid*2 -> byte offset qid*8 in the slice.
                    Regs::mapped(rb, rb + 0x800, rb + 0x7b8, qid * 2, 0x1_0000)
                } else {
                    Regs(vec![0u32; reg::HQD_N_REGS])
                };
                slots.push(HqdSlot {
                    inst: 0,
                    pipe,
                    queue,
                    regs: r,
                });
            }
        }
        HqdNode {
            node: 1,
            gpu_id,
            stopped: false,
            slots,
        }
    }

    /// Two GPUs, three processes:
    /// - 100 `python` (container, class online): queues 0 (GPU A, HQD 0.1.2, 1000 dispatch/s),
    ///   1 (GPU A, suspended by 999), 2 (GPU B, destroyed)
    /// - 200 `train` (class offline): queues 0, 1 on GPU B, evicted
    /// - 300 `bench`: queue 5 on GPU A, active
    pub(crate) fn known_state() -> State {
        let s = 1_000_000_000u64;
        let mut st = State::new();
        st.apply(Update::Topology(vec![gpu(1, GPU_A), gpu(2, GPU_B)]));
        st.apply(create(s, 100, 0, GPU_A));
        st.apply(create(s, 100, 1, GPU_A));
        st.apply(create(s, 100, 2, GPU_B));
        st.apply(create(2 * s, 200, 0, GPU_B));
        st.apply(create(2 * s, 200, 1, GPU_B));
        st.apply(create(3 * s, 300, 5, GPU_A));
        st.apply(Update::ProcInfo {
            pid: 100,
            info: info(
                "python",
                "python serve.py --model resnet18",
                Some("abcdef123456"),
            ),
        });
        st.apply(Update::ProcInfo {
            pid: 200,
            info: info("train", "torchrun train.py", None),
        });
        st.apply(Update::ProcInfo {
            pid: 300,
            info: info("bench", "./bench -n 10", None),
        });
        st.apply(Update::Class {
            pid: 100,
            class: Some("online".into()),
        });
        st.apply(Update::Class {
            pid: 200,
            class: Some("offline".into()),
        });
        st.apply(Update::Hqds {
            taken_ns: 4 * s,
            nodes: vec![hqds(GPU_A, 100, 0)],
        });
        st.apply(Update::Suspended {
            ts_ns: 5 * s,
            by: 999,
            target: 100,
            queues: Some(vec![1]),
        });
        st.apply(destroy(5 * s, 100, 2));
        st.apply(Update::Evicted {
            ts_ns: 5 * s,
            pid: 200,
        });
        st.apply(Update::Samples {
            ts_ns: 5 * s,
            samples: vec![(
                100,
                0,
                SampleRead::Ids {
                    read: 10,
                    write: 12,
                },
            )],
        });
        st.apply(Update::Samples {
            ts_ns: 6 * s,
            samples: vec![(
                100,
                0,
                SampleRead::Ids {
                    read: 1010,
                    write: 1014,
                },
            )],
        });
        st.apply(Update::Tick { now_ns: 6 * s });
        st
    }

    fn keys(st: &State, app: &App) -> Vec<RowKey> {
        rows(app, st).iter().map(TreeRow::key).collect()
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn the_known_state_is_what_the_tests_expect() {
        let st = known_state();
        let q = st.queue(100, 0).unwrap();
        assert_eq!(q.hqd.map(|h| h.to_string()).as_deref(), Some("0.1.2"));
        assert_eq!(q.activity.dispatches_per_s, Some(1000.0));
        assert_eq!(st.queue(100, 1).unwrap().state, QueueState::Suspended);
        assert_eq!(st.queue(100, 2).unwrap().state, QueueState::Destroyed);
        assert_eq!(st.queue(200, 0).unwrap().state, QueueState::Evicted);
        assert_eq!(st.gpu(GPU_A).unwrap().hqds_used, Some(1));
        assert_eq!(st.gpu(GPU_B).unwrap().hqds_used, None);
    }

    #[test]
    fn keys_map_to_actions() {
        let app = App::default();
        assert_eq!(action_for(key(KeyCode::Up), &app), Action::Up);
        assert_eq!(action_for(key(KeyCode::Char('k')), &app), Action::Up);
        assert_eq!(action_for(key(KeyCode::Down), &app), Action::Down);
        assert_eq!(action_for(key(KeyCode::Char('j')), &app), Action::Down);
        assert_eq!(action_for(key(KeyCode::PageUp), &app), Action::PageUp);
        assert_eq!(action_for(key(KeyCode::PageDown), &app), Action::PageDown);
        assert_eq!(action_for(key(KeyCode::Home), &app), Action::Home);
        assert_eq!(action_for(key(KeyCode::End), &app), Action::End);
        assert_eq!(action_for(key(KeyCode::Enter), &app), Action::ToggleDetail);
        assert_eq!(
            action_for(key(KeyCode::Char('o')), &app),
            Action::Sort(SortColumn::Comm)
        );
        assert_eq!(
            action_for(key(KeyCode::Char('>')), &app),
            Action::Sort(SortColumn::Comm)
        );
        assert_eq!(
            action_for(key(KeyCode::Char('<')), &app),
            Action::Sort(SortColumn::Age)
        );
        assert_eq!(
            action_for(key(KeyCode::Char('O')), &app),
            Action::Sort(SortColumn::Pid)
        );
        assert_eq!(
            action_for(key(KeyCode::Char('/')), &app),
            Action::StartFilter
        );
        assert_eq!(action_for(key(KeyCode::Char('s')), &app), Action::Suspend);
        assert_eq!(action_for(key(KeyCode::Char('r')), &app), Action::Resume);
        assert_eq!(action_for(key(KeyCode::Char('?')), &app), Action::Help);
        assert_eq!(action_for(key(KeyCode::Char('q')), &app), Action::Quit);
        assert_eq!(action_for(key(KeyCode::Esc), &app), Action::Escape);
        assert_eq!(action_for(key(KeyCode::Char('x')), &app), Action::None);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action_for(ctrl_c, &app), Action::Quit);
        let ctrl_d = KeyEvent::new(KeyCode::Char('d'), KeyModifiers::CONTROL);
        assert_eq!(action_for(ctrl_d, &app), Action::PageDown);
        // Ctrl-s is not `s`.
        let ctrl_s = KeyEvent::new(KeyCode::Char('s'), KeyModifiers::CONTROL);
        assert_eq!(action_for(ctrl_s, &app), Action::None);
        let mut release = key(KeyCode::Char('q'));
        release.kind = KeyEventKind::Release;
        assert_eq!(action_for(release, &app), Action::None);
    }

    #[test]
    fn the_filter_prompt_takes_characters() {
        let app = App {
            filter_open: true,
            ..App::default()
        };
        assert_eq!(
            action_for(key(KeyCode::Char('q')), &app),
            Action::FilterChar('q')
        );
        assert_eq!(
            action_for(key(KeyCode::Char('s')), &app),
            Action::FilterChar('s')
        );
        assert_eq!(
            action_for(key(KeyCode::Backspace), &app),
            Action::FilterBackspace
        );
        assert_eq!(action_for(key(KeyCode::Enter), &app), Action::FilterDone);
        assert_eq!(action_for(key(KeyCode::Esc), &app), Action::FilterCancel);
        assert_eq!(action_for(key(KeyCode::Down), &app), Action::Down);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action_for(ctrl_c, &app), Action::Quit);
    }

    #[test]
    fn rows_are_a_process_queue_tree() {
        let st = known_state();
        let app = App::default();
        let r = rows(&app, &st);
        let k: Vec<RowKey> = r.iter().map(TreeRow::key).collect();
        assert_eq!(
            k,
            vec![
                (100, None),
                (100, Some(0)),
                (100, Some(1)),
                (100, Some(2)),
                (200, None),
                (200, Some(0)),
                (200, Some(1)),
                (300, None),
                (300, Some(5)),
            ]
        );
        let lasts: Vec<bool> = r.iter().map(|r| r.last).collect();
        assert_eq!(
            lasts,
            vec![false, false, false, true, false, false, true, false, true]
        );
    }

    #[test]
    fn process_summaries() {
        let st = known_state();
        let p = &st.procs[&100];
        assert_eq!(live_count(p), 2);
        assert_eq!(proc_rate(p), Some(1000.0));
        assert_eq!(proc_state_label(p), "suspended");
        assert_eq!(proc_state_label(&st.procs[&200]), "evicted");
        assert_eq!(proc_state_label(&st.procs[&300]), "active");
        assert_eq!(proc_rate(&st.procs[&300]), None);
    }

    fn order(st: &State, app: &App) -> Vec<u32> {
        rows(app, st)
            .iter()
            .filter(|r| r.queue.is_none())
            .map(|r| r.pid)
            .collect()
    }

    #[test]
    fn sorting_orders_processes_and_keeps_queues_under_them() {
        let st = known_state();
        let mut app = App::default();
        assert_eq!(order(&st, &app), vec![100, 200, 300]);
        app.handle(Action::Sort(SortColumn::Pid), &st);
        assert_eq!(app.dir, SortDir::Desc);
        assert_eq!(order(&st, &app), vec![300, 200, 100]);
        app.handle(Action::Sort(SortColumn::Comm), &st);
        assert_eq!(app.dir, SortDir::Asc);
        assert_eq!(order(&st, &app), vec![300, 100, 200]); // bench, python, train
        app.handle(Action::Sort(SortColumn::Queues), &st);
        // 100 and 200 have 2 live queues each (pid breaks the tie), 300 has 1.
        assert_eq!(order(&st, &app), vec![100, 200, 300]);
        app.handle(Action::Sort(SortColumn::Rate), &st);
        assert_eq!(order(&st, &app)[0], 100);
        app.handle(Action::Sort(SortColumn::State), &st);
        assert_eq!(order(&st, &app), vec![100, 200, 300]); // suspended, evicted, active
        app.handle(Action::Sort(SortColumn::State), &st);
        assert_eq!(order(&st, &app), vec![300, 200, 100]);
        app.handle(Action::Sort(SortColumn::Age), &st);
        assert_eq!(order(&st, &app), vec![300, 200, 100]); // newest first
        app.handle(Action::Sort(SortColumn::Class), &st);
        assert_eq!(order(&st, &app), vec![300, 200, 100]); // none, offline, online
                                                           // Queues stay under their process whatever the order.
        for (i, r) in rows(&app, &st).iter().enumerate() {
            if r.queue.is_some() {
                let parent = rows(&app, &st)[..i]
                    .iter()
                    .rev()
                    .find(|r| r.queue.is_none())
                    .copied()
                    .unwrap();
                assert_eq!(parent.pid, r.pid);
            }
        }
        // By state, queues are ordered too: suspended 1 before active 0, destroyed last.
        let mut app = App::default();
        app.handle(Action::Sort(SortColumn::State), &st);
        let k = keys(&st, &app);
        assert_eq!(
            &k[..4],
            &[(100, None), (100, Some(1)), (100, Some(0)), (100, Some(2))]
        );
    }

    #[test]
    fn sort_keys_cycle_columns_and_reverse() {
        let st = known_state();
        let mut app = App::default();
        for _ in 0..SortColumn::ALL.len() {
            let a = action_for(key(KeyCode::Char('o')), &app);
            app.handle(a, &st);
        }
        assert_eq!(app.sort, SortColumn::Pid);
        let a = action_for(key(KeyCode::Char('<')), &app);
        app.handle(a, &st);
        assert_eq!(app.sort, SortColumn::Age);
        let a = action_for(key(KeyCode::Char('O')), &app);
        app.handle(a, &st);
        assert_eq!((app.sort, app.dir), (SortColumn::Age, SortDir::Desc));
    }

    #[test]
    fn the_filter_matches_processes_and_queues_case_insensitively() {
        let st = known_state();
        let mut app = App::default();
        let type_in = |app: &mut App, text: &str| {
            app.handle(Action::FilterCancel, &st);
            app.handle(Action::StartFilter, &st);
            for c in text.chars() {
                app.handle(Action::FilterChar(c), &st);
            }
            app.handle(Action::FilterDone, &st);
            keys(&st, app)
        };
        // comm: a matching process keeps all its queues.
        assert_eq!(
            type_in(&mut app, "PYTH"),
            vec![(100, None), (100, Some(0)), (100, Some(1)), (100, Some(2))]
        );
        assert!(!app.filter_open);
        assert_eq!(app.filter, "PYTH");
        // pid, container, cmdline, class
        assert_eq!(type_in(&mut app, "300"), vec![(300, None), (300, Some(5))]);
        assert_eq!(type_in(&mut app, "ABCDEF")[0], (100, None));
        assert_eq!(type_in(&mut app, "torchrun")[0], (200, None));
        assert_eq!(type_in(&mut app, "offline")[0], (200, None));
        // Queue rows: state, type, HQD; the process row stays as their parent.
        assert_eq!(
            type_in(&mut app, "suspended"),
            vec![(100, None), (100, Some(1))]
        );
        assert_eq!(
            type_in(&mut app, "0.1.2"),
            vec![(100, None), (100, Some(0))]
        );
        assert_eq!(
            type_in(&mut app, "evicted"),
            vec![(200, None), (200, Some(0)), (200, Some(1))]
        );
        assert_eq!(type_in(&mut app, "nothing-like-this"), vec![]);
        // Esc in the prompt clears it.
        app.handle(Action::StartFilter, &st);
        app.handle(Action::FilterBackspace, &st);
        app.handle(Action::FilterCancel, &st);
        assert_eq!(app.filter, "");
        assert!(!app.filter_open);
        assert_eq!(keys(&st, &app).len(), 9);
    }

    #[test]
    fn navigation_moves_and_clamps() {
        let st = known_state();
        let mut app = App::default();
        assert_eq!(app.selected_row(&st).unwrap().key(), (100, None));
        app.handle(Action::Up, &st);
        assert_eq!(app.selected, Some((100, None)));
        app.handle(Action::Down, &st);
        app.handle(Action::Down, &st);
        assert_eq!(app.selected, Some((100, Some(1))));
        app.handle(Action::End, &st);
        assert_eq!(app.selected, Some((300, Some(5))));
        app.handle(Action::Down, &st);
        assert_eq!(app.selected, Some((300, Some(5))));
        app.page = 4;
        app.handle(Action::PageUp, &st);
        assert_eq!(app.selected, Some((200, None)));
        app.handle(Action::PageUp, &st);
        app.handle(Action::PageUp, &st);
        assert_eq!(app.selected, Some((100, None)));
        app.handle(Action::PageDown, &st);
        assert_eq!(app.selected, Some((200, None)));
        app.handle(Action::Home, &st);
        assert_eq!(app.selected, Some((100, None)));
    }

    #[test]
    fn the_selection_follows_its_row_when_rows_change() {
        let mut st = known_state();
        let mut app = App::default();
        app.handle(Action::End, &st);
        assert_eq!(app.selected, Some((300, Some(5))));
        // A new process sorted before it: the same row stays selected.
        st.apply(create(7_000_000_000, 50, 3, GPU_A));
        app.sync(&st);
        assert_eq!(app.selected, Some((300, Some(5))));
        assert_eq!(app.selected_row(&st).unwrap().key(), (300, Some(5)));
        // Sorting moves the row; the selection moves with it.
        app.handle(Action::Sort(SortColumn::Pid), &st);
        assert_eq!(app.selected, Some((300, Some(5))));
        assert_eq!(
            app.resolve(&rows(&app, &st)),
            Some(1),
            "300 is first when sorted by pid descending"
        );
        // The queue goes (destroyed, then dropped after the linger): its process is selected.
        st.apply(destroy(7_000_000_000, 300, 5));
        st.apply(Update::Tick {
            now_ns: 20_000_000_000,
        });
        app.sync(&st);
        assert_eq!(app.selected, Some((300, None)));
        // The process goes: the cursor stays where it was.
        st.apply(Update::Event(Event::ProcessExit(
            crate::observe::events::ProcessExit {
                origin: crate::observe::events::Origin {
                    ts_ns: 21_000_000_000,
                    pid: 300,
                    tid: 300,
                    comm: "bench".into(),
                },
            },
        )));
        st.apply(Update::Tick {
            now_ns: 30_000_000_000,
        });
        assert!(!st.procs.contains_key(&300));
        app.sync(&st);
        assert_eq!(app.selected, Some((200, None)), "the row now at index 0");
        // Everything goes: no selection, and moving does nothing.
        let empty = State::new();
        app.handle(Action::Down, &empty);
        assert_eq!(app.selected, None);
        assert_eq!(app.handle(Action::Suspend, &empty), None);
        assert!(app.status.as_ref().unwrap().error);
    }

    #[test]
    fn a_filter_that_hides_the_selection_keeps_the_position() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::Down, &st);
        app.handle(Action::Down, &st); // (100, 1), index 2
                                       // The filter hides (100, 1) and its process: the cursor stays at index 2.
        app.filter = "train".into();
        app.sync(&st);
        assert_eq!(app.selected, Some((200, Some(1))));
        // Typing: "tr" still shows 100 with its destroyed queue ("destroyed" holds "tr"), so
        // the queue's process is selected; "tra" hides it, and the cursor keeps its place.
        app.filter.clear();
        app.handle(Action::Home, &st);
        app.handle(Action::Down, &st);
        app.handle(Action::Down, &st);
        app.handle(Action::StartFilter, &st);
        app.handle(Action::FilterChar('t'), &st);
        assert_eq!(app.selected, Some((100, Some(1))));
        app.handle(Action::FilterChar('r'), &st);
        assert_eq!(app.selected, Some((100, None)));
        app.handle(Action::FilterChar('a'), &st);
        assert_eq!(app.selected, Some((200, None)));
        app.handle(Action::Down, &st);
        app.handle(Action::Down, &st);
        assert_eq!(app.selected, Some((200, Some(1))));
        // Clearing the filter keeps the row that was selected through it.
        app.handle(Action::FilterCancel, &st);
        assert_eq!(app.selected, Some((200, Some(1))));
    }

    #[test]
    fn suspend_and_resume_act_on_the_selection() {
        let st = known_state();
        let mut app = App::default();
        assert_eq!(
            app.handle(Action::Suspend, &st),
            Some(Command::Suspend {
                pid: 100,
                queue: None
            })
        );
        app.handle(Action::Down, &st);
        app.handle(Action::Down, &st);
        assert_eq!(
            app.handle(Action::Resume, &st),
            Some(Command::Resume {
                pid: 100,
                queue: Some(1)
            })
        );
        // A destroyed queue: refused with a message.
        app.handle(Action::Down, &st);
        assert_eq!(app.selected, Some((100, Some(2))));
        assert_eq!(app.handle(Action::Suspend, &st), None);
        let status = app.status.clone().unwrap();
        assert!(status.error);
        assert!(status.text.contains("destroyed"), "{}", status.text);
        assert_eq!(app.handle(Action::Quit, &st), Some(Command::Quit));
    }

    #[test]
    fn panes_toggle() {
        let st = known_state();
        let mut app = App::default();
        app.handle(Action::ToggleDetail, &st);
        assert!(app.detail);
        app.handle(Action::Help, &st);
        assert!(app.show_help);
        app.handle(Action::Escape, &st);
        assert!(!app.show_help && app.detail);
        app.handle(Action::Escape, &st);
        assert!(!app.detail);
        app.filter = "python".into();
        app.handle(Action::Escape, &st);
        assert_eq!(app.filter, "");
        app.handle(Action::Help, &st);
        app.handle(Action::Help, &st);
        assert!(!app.show_help);
    }
}
