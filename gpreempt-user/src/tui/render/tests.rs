//! Render tests: column fitting, row bounds, and whole screens drawn to a test backend.

use super::style::*;
use super::table::{columns, row_bounds, Col, COLS};
use super::*;
use crate::observe::model::Update;
use crate::tui::app::{
    tests::{create, info, known_state, GPU_A},
    Action,
};
use gpreempt_common::kprobe::launch;
use ratatui::style::{Color, Modifier};
use ratatui::{backend::TestBackend, buffer::Buffer, Terminal};
use ratatui::{
    layout::Constraint,
    widgets::{Row, Table, TableState},
};

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
    let mut st = known_state();
    // Two requests of the online process (a launch to its wait's return): 4 ms and 9 ms.
    let now = st.now_ns;
    st.procs.get_mut(&100).unwrap().feed_requests(
        launch::HIP_LAUNCH_KERNEL,
        &[
            (now - 900_000_000, 4_000_000),
            (now - 400_000_000, 9_000_000),
        ],
    );
    st.tick_requests(now);
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
        words(
            "PID▲ COMM CLASS Q GPU TYPE PRIO HQD STATE DISP/S REQ50/99 BKLG AGE CONTAINER CMDLINE"
        )
    );
    assert_eq!(
        words(&line(&b, 5)),
        words("100 python online 2 suspended 1.0k 4.0/9.0 5s abcdef123456 python serve.py --mod")
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
        words("200 train offline 2 evicted - - 4s - torchrun train.py")
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
        words("300 bench - 1 active - - 3s - ./bench -n 10")
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

/// With the running controller's policy, the pane says by which rule (file:line) the process has
/// its class, and why each earlier rule did not match.
#[test]
fn the_detail_pane_says_by_which_rule() {
    let st = known_state();
    let mut app = App::default();
    app.policy = Some(
        crate::policy::Policy::parse(
            "[[rule]]\nclass = \"offline\"\nuid = 0\n\n\
             [[rule]]\nclass = \"online\"\ncomm = \"python\"\nuid = 1000\n",
            "p.toml",
        )
        .unwrap(),
    );
    app.handle(Action::ToggleDetail, &st);
    let b = render(&app, &st, 120, 40);
    find(
        &b,
        &format!("{:<KEY_W$} online, by rule 2 (p.toml:5)", "class by"),
    );
    find(
        &b,
        &format!(
            "{:<KEY_W$} rule 1 (p.toml:1, offline): did not match: uid 1000 is not 0",
            "not by"
        ),
    );
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
        .map(|i| crate::observe::kfd::sysfs::GpuNode {
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

#[test]
fn an_adaptive_controller_shows_its_goal_on_the_gpu_line() {
    let mut st = known_state();
    let view = crate::policy::AdaptiveView {
        gpu_id: GPU_A,
        phase: crate::policy::AdaptivePhase::Tuned,
        target_ns: Some(4_300_000),
        budget: "1.10x undisturbed".into(),
        clean_p90_ns: Some(3_910_000),
        free_p90_ns: Some(9_000_000),
        achieved_p90_ns: Some(4_120_000),
        defer_ns: Some(490_000),
        offline_kept: 0.93,
        bursts: 640,
    };
    st.adaptive.insert(GPU_A, view);
    let b = render(&App::new("100ms"), &st, 220, 30);
    let l = line(&b, find(&b, "adaptive: goal"));
    assert!(
        l.contains(&format!("GPU {GPU_A}"))
            && l.contains(
                "adaptive: goal 4.30ms (1.10x undisturbed): service p90 4.12ms, undisturbed \
                 3.91ms, defer 0.49ms, offline kept 93%"
            ),
        "{l}"
    );
}

/// The lever tuner's lever and phase per GPU: on the GPU's own line, and on a line of its own
/// for a GPU with no KFD node (an NVIDIA GPU).
#[test]
fn a_lever_tuner_shows_its_lever_and_phase_per_gpu() {
    use crate::observe::status::{LeverSummary, LeverView, Status};
    let mut st = known_state();
    let view = |gpu_id, lever: &str, phase: &str, epoch, quiet| LeverView {
        gpu_id,
        lever: lever.into(),
        chosen: "dynamic".into(),
        phase: phase.into(),
        epoch,
        quiet,
        summaries: vec![LeverSummary {
            lever: "dynamic".into(),
            worst: 0.96,
            p99_ns: 61_000_000,
            requests: 36,
            rate: Some(900.0),
            epochs: 3,
        }],
    };
    st.controller = Some(Status {
        gpu_levers: vec![
            view(GPU_A, "pause", "calibrating", Some((5, 15)), true),
            view(7, "dynamic", "settled", None, false),
            view(0, "timeslice", "settled", None, false),
        ],
        ..Default::default()
    });
    // Two NVIDIA GPUs, device instance 0 the one at index 1: its lever is on that line.
    st.apply(Update::NvGpus(
        crate::observe::nv::gpus::fixture::two_h100_crossed(),
    ));
    let b = render(&App::new("100ms"), &st, 220, 30);
    let l = line(&b, find(&b, "quiet window"));
    assert!(
        l.contains(&format!("GPU {GPU_A}"))
            && l.contains(
                "lever pause (calibrating 5/15, quiet window, chosen dynamic; worst service \
                 p99 0.96x its target, 36 req)"
            ),
        "{l}"
    );
    let l = line(&b, find(&b, "GPU (RM device instance 7)"));
    assert!(
        l.contains("lever dynamic (settled; worst service p99 0.96x its target, 36 req)"),
        "{l}"
    );
    let l = line(&b, find(&b, "GPU 1 NVIDIA H100"));
    assert!(
        l.contains("lever timeslice (settled, chosen dynamic"),
        "{l}"
    );
}

#[test]
fn the_detail_pane_shows_the_dispatch_mix() {
    use crate::observe::model::dispatch::kd;
    use crate::observe::model::{SampleRead, SeenPacket};
    let mut st = known_state();
    let mut packets: Vec<SeenPacket> = (0..3).map(|i| kd(1014 + i, 0xa0, 262_144, 256)).collect();
    packets.push(kd(1017, 0xb0, 512, 64));
    st.apply(Update::Samples {
        ts_ns: 7_000_000_000,
        samples: vec![(
            100,
            0,
            SampleRead::Ids {
                read: 1014,
                write: 1018,
                packets,
            },
        )],
    });
    st.apply(Update::KernelNames {
        pid: 100,
        names: std::collections::BTreeMap::from([(0xa0, "conv_fwd".to_string())]).into(),
    });
    let mut app = App::default();
    app.handle(Action::Down, &st);
    app.handle(Action::ToggleDetail, &st);
    let b = render(&app, &st, 120, 50);
    find(
        &b,
        &format!(
            "{:<KEY_W$} 4 decoded of 1004 consumed (0%): 4 kernels, 0 barriers",
            "dispatches"
        ),
    );
    find(&b, &format!("{:<KEY_W$} 512+ 25%  256K+ 75%", "grid items"));
    find(&b, &format!("{:<KEY_W$} 256 75%  64 25%", "group size"));
    find(
        &b,
        &format!(
            "{:<KEY_W$} 75.0%  grid 262144x1x1 wg 256x1x1  conv_fwd",
            "kernel"
        ),
    );
    find(
        &b,
        &format!("{:<KEY_W$} 25.0%  grid 512x1x1 wg 64x1x1  0xb0", "kernel"),
    );
}

/// An NVIDIA TSG's row shows its channel activity as the sampler gives it: GPFIFO entries
/// fetched per second in DISP/S (1500 in a second: 1.5k), entries pending in BKLG (6).
#[test]
fn an_nvidia_tsg_shows_its_channel_activity() {
    use crate::observe::model::{tests::nvidia::rm_alloc, SampleRead};
    use gpreempt_common::nv::class;
    let mut st = State::new();
    for (parent, new, cl, head) in [
        (0, 0xc1, class::NV01_ROOT_CLIENT, 0),
        (0xc1, 0x10, class::NV01_DEVICE_0, 0),
        (0x10, 0x11, class::NV20_SUBDEVICE_0, 0),
        (0x10, 0x20, class::KEPLER_CHANNEL_GROUP_A, 1),
        (0x20, 0x21, class::HOPPER_CHANNEL_GPFIFO_A, 0),
    ] {
        st.apply(rm_alloc(1, 4242, 0xc1, parent, new, cl, head));
    }
    for (ts, read, write) in [(1_000_000_000, 0, 4), (2_000_000_000, 1500, 1506)] {
        st.apply(Update::Samples {
            ts_ns: ts,
            samples: vec![(
                4242,
                0x20,
                SampleRead::Ids {
                    read,
                    write,
                    packets: Vec::new(),
                },
            )],
        });
    }
    let app = App::new("100ms");
    let b = render(&app, &st, 140, 30);
    let row = words(&row_with(&b, "tsg-gr"));
    assert!(
        has(&row, "1ch") && has(&row, "1.5k") && has(&row, "6"),
        "{row:?}"
    );
}

/// A process the running controller cannot act on (it runs under its own tracer) shows `!`
/// after its class, in red, and the detail pane says why.
#[test]
fn an_uncontrollable_process_is_marked_and_says_why() {
    let mut st = known_state();
    st.apply(Update::Uncontrollable {
        pid: 100,
        why: Some(crate::observe::model::Uncontrollable {
            kind: "traced".into(),
            reason: "already traced by pid 4321 (strace); a process under rocgdb, gdb or strace \
                     cannot be controlled: detach that tool first"
                .into(),
        }),
    });
    let mut app = App::default();
    let b = render(&app, &st, 120, 40);
    let row = row_starting(&b, "100", "python");
    assert!(has(&words(&row), "online!"), "{row}");
    let y = find(&b, "online!");
    let x = line(&b, y).find("online!").unwrap() as u16;
    assert_eq!(b[(x, y)].fg, ratatui::style::Color::Red);
    app.handle(Action::ToggleDetail, &st);
    let b = render(&app, &st, 120, 40);
    find(
        &b,
        &format!(
            "{:<KEY_W$} UNCONTROLLABLE (traced): already traced by pid 4321 (strace)",
            "control"
        ),
    );
    // It can be controlled again: the mark goes.
    st.apply(Update::Uncontrollable {
        pid: 100,
        why: None,
    });
    let b = render(&App::default(), &st, 120, 40);
    assert_absent(&b, "online!");
}

/// A process that names itself with terminal control sequences (a window title, a screen
/// clear, a newline forging a row): top shows them escaped, and no cell carries a control
/// character to the terminal.
#[test]
fn control_sequences_in_process_names_never_reach_the_terminal() {
    let mut st = known_state();
    st.apply(Update::ProcInfo {
        pid: 300,
        info: info("x\x1b]0;pwned\x07", "./bench\x1b[2J\nroot 1 online", None),
    });
    let b = render(&App::new("100ms"), &st, 220, 30);
    for (i, l) in lines(&b).iter().enumerate() {
        assert!(!l.chars().any(char::is_control), "line {i}: {l:?}");
    }
    let row = line(&b, find(&b, "bench"));
    assert!(
        row.contains("x\\x1b]0;pwned\\x07") || row.contains("x\\x1b]0;p"),
        "{row}"
    );
    assert!(row.contains("./bench\\x1b[2J\\nroot 1 online"), "{row}");
}

/// An NVIDIA-only host: one line per GPU with the ids nvidia-smi and dcgm-exporter use (index,
/// name, bus id, UUID) and its queue counts; nothing about KFD topology or HQD slots.
#[test]
fn an_nvidia_host_shows_its_gpus_and_no_amd_lines() {
    let st = crate::tui::app::tests::nvidia_host();
    let b = render(&App::new("100ms"), &st, 160, 30);
    assert_eq!(
        line(&b, 1).trim_end(),
        "GPU 0 NVIDIA H100 80GB HBM3  00000000:19:00.0  GPU-11111111-2222-3333-4444-555555555555  \
         queues 1  suspended 0  busy 0"
    );
    assert_eq!(
        line(&b, 2).trim_end(),
        "GPU 1 NVIDIA H100 80GB HBM3  00000000:3B:00.0  GPU-66666666-7777-8888-9999-aaaaaaaaaaaa  \
         queues 0  suspended 0  busy 0"
    );
    assert_absent(&b, "no GPUs found");
    assert_absent(&b, "HQD slots");
    assert_absent(&b, "HQD map");
    assert_absent(&b, "kfd");
    // The table's header comes right under the GPU lines.
    assert!(line(&b, 3).starts_with("PID"), "{}", line(&b, 3));
}

/// A TSG's id is an RM handle of 10 digits: shown whole (the PID column widens), and its GPU
/// column names the GPU by index, not by RM device instance.
#[test]
fn a_tsg_id_is_shown_whole_with_its_gpu_index() {
    let st = crate::tui::app::tests::nvidia_host();
    let b = render(&App::new("100ms"), &st, 160, 30);
    let row = words(&row_starting(&b, " └─ 1543503893", "tsg-gr"));
    assert_eq!(row[..4], ["└─", "1543503893", "0", "tsg-gr"], "{row:?}");
    // The columns after it stay aligned with their headers.
    let head = line(&b, find_start(&b, "PID"));
    let at = |l: &str, w: &str| l[..l.find(w).unwrap()].chars().count();
    let row_line = row_starting(&b, " └─ 1543503893", "tsg-gr");
    assert_eq!(
        at(&head, "TYPE"),
        at(&row_line, "tsg-gr"),
        "{head}\n{row_line}"
    );
    // Its detail pane names the GPU whole, with the device instance the RM gave it.
    let mut app = App::new("100ms");
    app.handle(Action::Down, &st);
    app.handle(Action::ToggleDetail, &st);
    let b = render(&app, &st, 160, 40);
    find(
        &b,
        "0 NVIDIA H100 80GB HBM3 00000000:19:00.0 GPU-11111111-2222-3333-4444-555555555555 \
         (RM device instance 1)",
    );
    find(&b, "- (a TSG: see its channels)");
}

/// A host with both drivers: the KFD GPU line, the NVIDIA GPU line and the HQD line.
#[test]
fn a_mixed_host_shows_both_vendors_gpus_and_the_hqd_line() {
    let mut st = known_state();
    let one = crate::observe::nv::gpus::fixture::two_h100_crossed()
        .into_iter()
        .take(1)
        .collect();
    st.apply(Update::NvGpus(one));
    let b = render(&App::new("100ms"), &st, 160, 40);
    find(&b, &format!("GPU {GPU_A} "));
    find(&b, "GPU 0 NVIDIA H100 80GB HBM3  00000000:19:00.0");
    find(&b, "HQD map from debugfs hqds");
    assert_absent(&b, "no GPUs found");
}

/// `NO_COLOR`: no cell keeps a colour (a suspended queue's yellow included); the selection is
/// still marked, by reverse video.
#[test]
fn no_color_leaves_every_cell_in_the_terminals_colours() {
    use ratatui::style::{Color, Modifier};
    let st = known_state();
    let mut app = App::new("100ms");
    let coloured = |b: &Buffer| {
        b.content
            .iter()
            .filter(|c| c.fg != Color::Reset || c.bg != Color::Reset)
            .count()
    };
    assert!(
        coloured(&render(&app, &st, 140, 40)) > 0,
        "nothing coloured to take away"
    );
    app.no_color = true;
    let b = render(&app, &st, 140, 40);
    assert_eq!(coloured(&b), 0);
    assert!(b
        .content
        .iter()
        .any(|c| c.modifier.contains(Modifier::REVERSED)));
}
