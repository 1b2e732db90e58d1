//! A backend the rest of the code has never seen, in memory, with two levers (`pause` and a
//! standing `timeslice`), driven through the real engine and controller: nothing above
//! `backend/` names a vendor or a lever it does not get from the backend's offers.
//!
//! It stands in for the backend of the model's AMD queues (the model's vendors are the drivers
//! it decodes); everything it does is its own, and its offers differ from the AMD backend's.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
    rc::Rc,
};

use super::*;
use crate::{
    backend::{Backend, Backends, BoxFut},
    controller::daemon::Lock,
    lever::{Lever, Offer, Offers, Undo},
    observe::model::{Process, Queue, QueueKind, QueueState, SampleStatus, Source, State, Vendor},
    observe::procinfo::ProcInfo,
    outcome::QueueResult,
};

const GPU: u32 = 0x7a;
const ONLINE: u32 = 4100;
const OFFLINE: u32 = 4200;

const TOY_OFFERS: Offers = Offers {
    list: &[
        Offer {
            lever: Lever::Pause,
            cost: "a map insert",
            undo: Undo::ResumeByKernel,
        },
        Offer {
            lever: Lever::Timeslice,
            cost: "a map insert, at classification",
            undo: Undo::RestoreByGuardian,
        },
    ],
    default: Lever::Pause,
};

/// What the toy driver holds, and what the controller asked of it.
#[derive(Default)]
struct Driver {
    paused: BTreeMap<u32, BTreeSet<u32>>,
    /// pid -> the short timeslice (us) its queues have.
    sliced: BTreeMap<u32, u64>,
    /// The policy's lever as the toy reads it (its own configuration).
    lever: Option<Lever>,
    gpu_levers: Vec<BTreeMap<u32, Lever>>,
    pauses: u32,
    /// Held again after an escape: (pid, escalated).
    reholds: Vec<(u32, bool)>,
    /// Suspends are refused as the kernel refuses a runtime without the debug API.
    no_debug_api: bool,
}

struct Toy(Rc<RefCell<Driver>>);

fn report(pid: u32, queues: &[u32]) -> OpReport {
    OpReport {
        pid,
        ret: Some(queues.len() as i32),
        queues: queues
            .iter()
            .map(|&queue_id| QueueResult {
                queue_id,
                gpu_id: Some(GPU),
                outcome: QueueOutcome::Done,
            })
            .collect(),
        issued_ns: monotonic_ns(),
        returned_ns: monotonic_ns(),
        effect: Effect::Paused,
    }
}

impl Toy {
    /// The lever it acts by on `GPU`: the tuner's, else the policy's where offered.
    fn lever(&self) -> Lever {
        let d = self.0.borrow();
        let tuned = d.gpu_levers.last().and_then(|m| m.get(&GPU).copied());
        tuned.unwrap_or_else(|| TOY_OFFERS.resolve(d.lever.unwrap_or(Lever::Pause)))
    }
}

impl Backend for Toy {
    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }

    fn offers(&self) -> Offers {
        TOY_OFFERS
    }

    fn classed<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        class: Class,
    ) -> BoxFut<'a, Result<(), ActError>> {
        // The standing lever is this backend's own business, at classification.
        if class == Class::Offline && self.lever() == Lever::Timeslice {
            self.0.borrow_mut().sliced.insert(pid, 200);
        }
        Box::pin(async { Ok(()) })
    }

    fn suspend<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        _: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        let qs = queues.unwrap_or_default();
        let mut d = self.0.borrow_mut();
        if d.no_debug_api {
            let e = crate::backend::TargetError::NoDebugApi("no RUNTIME_ENABLE".into());
            return Box::pin(async move { Acted::Now(Err(e.into())) });
        }
        d.pauses += 1;
        d.paused.entry(pid).or_default().extend(&qs);
        Box::pin(async move { Acted::Now(Ok(report(pid, &qs))) })
    }

    fn resume<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted> {
        let mut d = self.0.borrow_mut();
        let held = d.paused.entry(pid).or_default();
        let qs: Vec<u32> = match queues {
            Some(q) => q.into_iter().filter(|q| held.remove(q)).collect(),
            None => std::mem::take(held).into_iter().collect(),
        };
        Box::pin(async move { Acted::Now(Ok(report(pid, &qs))) })
    }

    fn rehold<'a>(
        &'a mut self,
        _: &'a State,
        pid: u32,
        _: crate::outcome::EscapeKind,
        escalate: bool,
    ) -> BoxFut<'a, Result<Vec<OpReport>, ActError>> {
        let mut d = self.0.borrow_mut();
        d.reholds.push((pid, escalate));
        let held: Vec<u32> = d.paused.get(&pid).into_iter().flatten().copied().collect();
        Box::pin(async move { Ok(vec![report(pid, &held)]) })
    }

    fn forget(&mut self, pid: u32) {
        self.0.borrow_mut().sliced.remove(&pid);
    }

    fn upkeep(&mut self, _: &State, _: u64) -> Vec<Notice> {
        Vec::new()
    }

    fn set_policy(&mut self, policy: &Policy) {
        self.0.borrow_mut().lever = Some(policy.levers.lever);
    }

    fn set_gpu_levers(&mut self, levers: &BTreeMap<u32, Lever>) {
        let mut d = self.0.borrow_mut();
        if d.gpu_levers.last() != Some(levers) {
            d.gpu_levers.push(levers.clone());
        }
    }

    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        let d = self.0.borrow();
        d.sliced
            .iter()
            .map(|(&pid, &us)| (pid, 0, 2048, us))
            .collect()
    }

    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        let mut d = self.0.borrow_mut();
        let reports: Vec<OpReport> = std::mem::take(&mut d.paused)
            .into_iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(pid, q)| report(pid, &q.into_iter().collect::<Vec<_>>()))
            .collect();
        // What a standing lever changed goes back too.
        d.sliced.clear();
        Box::pin(async move { reports })
    }
}

fn process(pid: u32, comm: &str, queues: &[u32]) -> Process {
    let mut p = Process {
        info: Some(ProcInfo {
            comm: comm.into(),
            start_time: u64::from(pid) * 7,
            ..Default::default()
        }),
        ..Process::new(pid, Source::Event, 0)
    };
    for &q in queues {
        p.queues.insert(
            q,
            Queue {
                created_ns: Some(0),
                ..Queue::new(q, GPU, QueueKind::ComputeAql, Source::Event, 0)
            },
        );
    }
    p
}

/// Online work on `GPU` now: a backlog in a fresh sample of the online queue.
fn online_busy(w: &mut Watcher, write: u64) {
    if let Some(q) = w
        .state
        .procs
        .get_mut(&ONLINE)
        .and_then(|p| p.queues.get_mut(&1))
    {
        let a = &mut q.activity;
        a.status = SampleStatus::Valid;
        a.write_dispatch_id = Some(write);
        a.read_dispatch_id = Some(write - 3);
        a.backlog = Some(3);
        a.busy = Some(true);
        a.sample_ns = monotonic_ns();
    }
    // Offline work too, so that an offline queue has something to yield.
    if let Some(q) = w
        .state
        .procs
        .get_mut(&OFFLINE)
        .and_then(|p| p.queues.get_mut(&2))
    {
        let a = &mut q.activity;
        a.status = SampleStatus::Valid;
        let r = a.read_dispatch_id.unwrap_or(0) + 5;
        a.read_dispatch_id = Some(r);
        a.write_dispatch_id = Some(r + 10);
        a.backlog = Some(10);
        a.busy = Some(true);
        a.sample_ns = monotonic_ns();
    }
    w.state.now_ns = monotonic_ns();
}

struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const RULES: &str = "[[rule]]\nclass = \"online\"\ncomm = \"on\"\n\
                     [[rule]]\nclass = \"offline\"\ncomm = \"off\"\n";

/// The real controller over the toy backend under `policy`, a host with one online and one
/// offline process on the toy's GPU.
fn controller(policy: &str, dir: &Dir) -> (Ctx, Watcher, Rc<RefCell<Driver>>) {
    let text = format!("[policy]\nlaunch_hints = false\nmin_interval = \"1ms\"\n{policy}{RULES}");
    let policy = Policy::parse(&text, "toy.toml").unwrap();
    let driver = Rc::new(RefCell::new(Driver::default()));
    let backends = Backends::of(vec![Box::new(Toy(driver.clone()))]);
    let hold = Holder::new(Lock::acquire(&dir.0).unwrap(), backends, "run");
    let ctx = Ctx::new(policy, false, hold, None);
    let mut w = Watcher::for_tests();
    w.state.procs.insert(ONLINE, process(ONLINE, "on", &[1]));
    w.state
        .procs
        .insert(OFFLINE, process(OFFLINE, "off", &[2, 3]));
    (ctx, w, driver)
}

fn dir(name: &str) -> Dir {
    Dir(std::env::temp_dir().join(format!("gp-toy-{name}-{}", std::process::id())))
}

#[tokio::test(flavor = "current_thread")]
async fn the_engine_pauses_through_a_backend_it_only_knows_by_its_offers() {
    let d = dir("pause");
    let (mut ctx, mut w, driver) = controller("[nvidia]\nlever = \"pause\"\n", &d);
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    assert_eq!(
        driver.borrow().paused.get(&OFFLINE),
        Some(&BTreeSet::from([2, 3])),
        "the offline queues are paused while online work is busy"
    );
    let q = &w.state.procs[&OFFLINE].queues;
    assert!(q.values().all(|q| q.state == QueueState::Suspended));
    assert!(driver.borrow().sliced.is_empty(), "no standing timeslice");
    // The controller stops: the toy's shutdown resumes what it holds.
    let (_, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let code = stop(ctx, &mut w, arrivals, &d.0, Ok("test".into()))
        .await
        .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(driver.borrow().paused.values().all(BTreeSet::is_empty));
}

#[tokio::test(flavor = "current_thread")]
async fn a_standing_lever_the_backend_offers_means_no_pause_per_episode() {
    let d = dir("slice");
    let (mut ctx, mut w, driver) = controller("[nvidia]\nlever = \"timeslice\"\n", &d);
    for i in 0..5 {
        online_busy(&mut w, 10 + i);
        ctx.tick(&mut w).await;
    }
    let dr = driver.borrow();
    assert_eq!(
        dr.pauses, 0,
        "the engine decided no pause under `timeslice`"
    );
    assert_eq!(dr.sliced.get(&OFFLINE), Some(&200), "set at classification");
    assert!(!dr.sliced.contains_key(&ONLINE));
    drop(dr);
    // What the status publishes comes from the backend, not from a vendor's code.
    assert_eq!(ctx.status(&w).timeslices, vec![(OFFLINE, 0, 2048, 200)]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_lever_the_backend_does_not_offer_falls_back_to_its_default() {
    let d = dir("fallback");
    // `none` is not among the toy's offers: it pauses, its default (where `none` is offered,
    // nothing would be paused).
    let (mut ctx, mut w, driver) = controller("[nvidia]\nlever = \"none\"\n", &d);
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    assert_eq!(driver.borrow().pauses, 1);
    assert!(driver.borrow().sliced.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn the_lever_tuner_measures_only_the_levers_the_backend_offers() {
    let d = dir("tune");
    let (mut ctx, mut w, driver) = controller(
        "strategy = \"adaptive\"\n[nvidia]\nlever = \"timeslice\"\n",
        &d,
    );
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    // 30 s of a pair where pausing keeps online bursts shorter, on the engine's clock: a burst
    // every 50 ms, offline progress every 10 ms, the controller's lever path each ms.
    let ms = 1_000_000u64;
    let start = monotonic_ns();
    let (mut now, mut burst, mut progress) = (start, start + 50 * ms, start + 10 * ms);
    while now < start + 30_000 * ms {
        now += ms;
        let lever = ctx.engine.gpu_levers().get(&GPU).copied();
        if now >= burst {
            burst += 50 * ms;
            let took = if lever == Some(Lever::Pause) { 4 } else { 6 };
            ctx.engine.lever_burst(GPU, now, took * ms);
        }
        if now >= progress {
            progress += 10 * ms;
            ctx.engine.lever_offline_progress(GPU, now, 10);
        }
        ctx.engine.decide(&w.state, now);
        ctx.lever_changes(now);
    }
    // It measured the two levers the toy offers, and no other, and chose the pause.
    let views = ctx.engine.lever_views();
    assert_eq!(views.len(), 1, "{views:?}");
    let measured: BTreeSet<Lever> = views[0].summaries.iter().map(|s| s.lever).collect();
    assert_eq!(
        measured,
        BTreeSet::from([Lever::Timeslice, Lever::Pause]),
        "{views:?}"
    );
    assert_eq!(ctx.engine.gpu_levers().get(&GPU), Some(&Lever::Pause));
    // The backend heard every change, each an offered lever.
    let seen = driver.borrow().gpu_levers.clone();
    assert_eq!(
        seen.last().and_then(|m| m.get(&GPU)),
        Some(&Lever::Pause),
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .flat_map(|m| m.values())
        .all(|l| TOY_OFFERS.set().contains(*l)));
}

/// A successful DBG_TRAP `op` that `caller` made on `target`, as the observer decodes it.
fn debug_call(caller: u32, target: u32, op: u32) -> Update {
    use crate::observe::events::{Event, IoctlEvent, KfdCall, Origin};
    Update::Event(Event::Ioctl(IoctlEvent {
        origin: Origin {
            ts_ns: monotonic_ns(),
            pid: caller,
            tid: caller,
            comm: "off".into(),
        },
        fd: 3,
        cmd: gpreempt_common::kfd::cmd::DBG_TRAP,
        ret: 0,
        duration_ns: 0,
        call: KfdCall::DbgTrap(gpreempt_common::kfd::DbgTrapArgs::bare(target, op)),
        verified: true,
    }))
}

/// A held process that resumes its own queues (amdkfd lets it debug-trap itself) is held again
/// at the next tick, shown as escaped in the status file and the model for as long as it
/// lives (a state, not an event), counted per escape, and audited; a process held by nothing
/// that does the same escapes nothing. With `escape = "freeze"` its third escape asks for more.
#[tokio::test(flavor = "current_thread")]
async fn a_held_process_that_resumes_itself_is_held_again_and_shown_escaped() {
    use gpreempt_common::kfd::dbg_op;
    let d = dir("escape");
    let (mut ctx, mut w, driver) =
        controller("escape = \"freeze\"\n[nvidia]\nlever = \"pause\"\n", &d);
    ctx.tick(&mut w).await;
    // Not held yet: its own RESUME_QUEUES escapes nothing.
    w.state
        .apply(debug_call(OFFLINE, OFFLINE, dbg_op::RESUME_QUEUES));
    ctx.tick(&mut w).await;
    assert!(driver.borrow().reholds.is_empty());
    assert!(ctx.status(&w).escaped.is_empty());
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    assert_eq!(
        driver.borrow().paused.get(&OFFLINE),
        Some(&BTreeSet::from([2, 3]))
    );
    // It resumes itself (twice within one turn: one escape); the model sees its queues run.
    w.state
        .apply(debug_call(OFFLINE, OFFLINE, dbg_op::RESUME_QUEUES));
    w.state
        .apply(debug_call(OFFLINE, OFFLINE, dbg_op::RESUME_QUEUES));
    ctx.tick(&mut w).await;
    assert_eq!(driver.borrow().reholds, vec![(OFFLINE, false)]);
    let q = &w.state.procs[&OFFLINE].queues;
    assert!(
        q.values().all(|q| q.state == QueueState::Suspended),
        "held again"
    );
    let st = ctx.status(&w);
    let e = &st.escaped[&OFFLINE];
    assert_eq!((e.kind.as_str(), e.count), ("resumed", 1), "{e:?}");
    assert!(
        e.reason.contains("resumed its own suspended queues"),
        "{e:?}"
    );
    assert!(e.answer.contains("held again"), "{e:?}");
    // Stable: still there on later turns with nothing new.
    for _ in 0..3 {
        ctx.tick(&mut w).await;
    }
    assert_eq!(ctx.status(&w).escaped[&OFFLINE].count, 1);
    assert_eq!(
        w.state.procs[&OFFLINE].escaped.as_ref().map(|e| e.count),
        Some(1)
    );
    // It disables the session, then takes one of its own: the latest kind, counted.
    w.state.apply(debug_call(OFFLINE, OFFLINE, dbg_op::DISABLE));
    ctx.tick(&mut w).await;
    w.state.apply(debug_call(OFFLINE, OFFLINE, dbg_op::ENABLE));
    ctx.tick(&mut w).await;
    let e = ctx.status(&w).escaped[&OFFLINE].clone();
    assert_eq!((e.kind.as_str(), e.count), ("trap_taken", 3), "{e:?}");
    // The third escape under `escape = "freeze"` asked for more than a re-hold.
    assert_eq!(
        driver.borrow().reholds,
        vec![(OFFLINE, false), (OFFLINE, false), (OFFLINE, true)]
    );
    // Our own calls are not escapes.
    w.state.apply(debug_call(ctx.me, OFFLINE, dbg_op::DISABLE));
    ctx.tick(&mut w).await;
    assert_eq!(ctx.status(&w).escaped[&OFFLINE].count, 3);
    // Gone: forgotten.
    w.state.procs.get_mut(&OFFLINE).unwrap().exited_ns = Some(1);
    ctx.forget_escapes(&w);
    assert!(ctx.status(&w).escaped.is_empty());
}

/// A process whose runtime never enabled the debug API is refused by its suspends, not by its
/// attach: the retry of refused processes must not retract the refusal (it came and went
/// between metric scrapes), so every status of the next seconds shows it.
#[tokio::test(flavor = "current_thread")]
async fn a_process_refused_by_its_suspends_stays_refused_across_retries() {
    let d = dir("nodebug");
    let (mut ctx, mut w, driver) = controller("[nvidia]\nlever = \"pause\"\n", &d);
    driver.borrow_mut().no_debug_api = true;
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    assert_eq!(
        ctx.status(&w)
            .uncontrollable
            .get(&OFFLINE)
            .map(|u| u.kind.as_str()),
        Some("no_debug_api")
    );
    // Publishes without online work (no new suspend), the retries among them.
    for n in 1..=24 {
        ctx.retry_refused(&mut w).await;
        let st = ctx.status(&w);
        assert_eq!(
            st.uncontrollable.get(&OFFLINE).map(|u| u.kind.as_str()),
            Some("no_debug_api"),
            "publish {n}"
        );
    }
    // A suspend that works retracts it.
    driver.borrow_mut().no_debug_api = false;
    for i in 0..50 {
        online_busy(&mut w, 20 + i);
        ctx.tick(&mut w).await;
        if driver.borrow().pauses > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(driver.borrow().pauses > 0, "suspended at last");
    assert!(!ctx.status(&w).uncontrollable.contains_key(&OFFLINE));
}

/// A fresh sample of `pid`'s queue `qid` reading `read`.
fn sample(w: &mut Watcher, pid: u32, qid: u32, read: u64) {
    if let Some(q) = w
        .state
        .procs
        .get_mut(&pid)
        .and_then(|p| p.queues.get_mut(&qid))
    {
        q.activity.status = SampleStatus::Valid;
        q.activity.read_dispatch_id = Some(read);
        q.activity.write_dispatch_id = Some(read + 10);
        q.activity.sample_ns = monotonic_ns();
    }
}

/// A held queue whose dispatch ids stand still is left alone; one whose ids move past its
/// settled baseline (a way out no call seen explains) is an escape: held again and shown.
#[tokio::test(flavor = "current_thread")]
async fn a_held_queue_whose_dispatch_ids_move_is_an_escape() {
    let d = dir("progress");
    let (mut ctx, mut w, driver) = controller("[nvidia]\nlever = \"pause\"\n", &d);
    online_busy(&mut w, 10);
    ctx.tick(&mut w).await;
    assert_eq!(
        driver.borrow().paused.get(&OFFLINE),
        Some(&BTreeSet::from([2, 3]))
    );
    for i in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        online_busy(&mut w, 20 + i);
        sample(&mut w, OFFLINE, 2, 100);
        sample(&mut w, OFFLINE, 3, 7);
        ctx.tick(&mut w).await;
    }
    assert!(driver.borrow().reholds.is_empty(), "standing still");
    assert!(ctx.status(&w).escaped.is_empty());
    online_busy(&mut w, 30);
    sample(&mut w, OFFLINE, 2, 100);
    sample(&mut w, OFFLINE, 3, 20);
    ctx.tick(&mut w).await;
    assert_eq!(driver.borrow().reholds, vec![(OFFLINE, false)]);
    let e = ctx.status(&w).escaped[&OFFLINE].clone();
    assert_eq!((e.kind.as_str(), e.count), ("progress", 1), "{e:?}");
}

/// A process's class is audited once, with the rule that gave it (1-based, `file:line`), or
/// `default`; a turn with no change audits nothing.
#[tokio::test(flavor = "current_thread")]
async fn each_class_is_audited_with_its_rule() {
    let d = dir("classes");
    let (mut ctx, mut w, _) = controller("", &d);
    w.state.procs.insert(77, process(77, "other", &[]));
    ctx.tick(&mut w).await;
    ctx.tick(&mut w).await;
    let classes: Vec<serde_json::Value> = ctx
        .status(&w)
        .decisions
        .into_iter()
        .filter(|r| r["action"] == "class")
        .collect();
    let of = |pid: u32| {
        let r: Vec<&serde_json::Value> = classes.iter().filter(|r| r["pid"] == pid).collect();
        assert_eq!(r.len(), 1, "{classes:#?}");
        r[0].clone()
    };
    // The toy policy's rules start on lines 4 and 7.
    let on = of(ONLINE);
    assert_eq!(
        (&on["class"], &on["rule"], &on["rule_line"]),
        (
            &serde_json::json!("online"),
            &serde_json::json!(1),
            &serde_json::json!("toy.toml:4")
        ),
        "{on}"
    );
    assert_eq!(on["reason"], "online, by rule 1 (toy.toml:4)");
    let off = of(OFFLINE);
    assert_eq!(
        (&off["rule"], &off["rule_line"]),
        (&serde_json::json!(2), &serde_json::json!("toy.toml:7"))
    );
    let other = of(77);
    assert_eq!(
        (&other["class"], &other["rule"], other.get("rule_line")),
        (
            &serde_json::json!("ignore"),
            &serde_json::json!("default"),
            None
        ),
        "{other}"
    );
}
