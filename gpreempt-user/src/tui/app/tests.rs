//! `top` UI state tests, and the fixtures (events, known states) the other `tui` tests share.

use super::*;
use crate::{
    observe::events::{Event, KfdCall},
    observe::kfd::{
        debugfs::{HqdNode, HqdSlot, Regs},
        sysfs::GpuNode,
    },
    observe::model::{SampleRead, Update},
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
        gid: Some(1000),
        groups: Vec::new(),
        ns_pid: container.map(|_| 7),
        cgroup: "/system.slice/x.scope".into(),
        container: container.map(Into::into),
        pod: None,
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

/// A process of an NVIDIA host with one TSG (RM handle 0x5c000015 = 1543503893) on RM device
/// instance 1, which the crossed fixture says is the GPU at index 0 (00000000:19:00.0).
pub(crate) fn nvidia_host() -> State {
    use crate::observe::model::tests::nvidia::rm_alloc;
    use gpreempt_common::nv::class;
    let mut st = State::new();
    st.apply(Update::NvGpus(
        crate::observe::nv::gpus::fixture::two_h100_crossed(),
    ));
    let client = 0xc1d0_001f;
    for (parent, new, cl, head) in [
        (0, client, class::NV01_ROOT_CLIENT, 0),
        (client, 0x5c00_0001, class::NV01_DEVICE_0, 1),
        (0x5c00_0001, 0x5c00_0002, class::NV20_SUBDEVICE_0, 0),
        (0x5c00_0001, 0x5c00_0015, class::KEPLER_CHANNEL_GROUP_A, 1),
    ] {
        st.apply(rm_alloc(1, 4242, client, parent, new, cl, head));
    }
    st
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
                packets: vec![],
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
                packets: vec![],
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
            rate_limited: 0,
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
