//! `top`: the live TUI. [`app`] holds the UI state and turns keys into actions and commands,
//! [`render`] draws a [`State`](crate::observe::model::State); this module runs the loop that ties the
//! terminal, the watcher ([`Source`]) and the keys together.
//!
//! One `tokio::select!` over: key and resize events (read on a dedicated thread), the watcher's
//! updates, a render timer, and SIGINT / SIGTERM. The screen is redrawn on the timer (when
//! something changed, and at least once a second for the ages) and after each key, never per
//! update. The terminal is restored on every way out: return, error, signal or panic.

pub mod app;
pub mod render;

use std::{
    future::Future,
    io::{self, Stdout},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context as _};
use crossterm::{
    cursor::{Hide, Show},
    event::{self, Event},
    execute,
    terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{
    backend::{Backend, CrosstermBackend},
    layout::Rect,
    Terminal,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
    time::MissedTickBehavior,
};

use self::app::{action_for, App, Command};
use crate::observe::model::State;

/// What the TUI needs from the watcher (crate::observe::watch implements it; tests use a fake).
#[allow(async_fn_in_trait)]
pub trait Source {
    /// Waits for and applies the next updates. Must be cancel-safe (used in tokio::select!).
    async fn pump(&mut self) -> anyhow::Result<()>;
    fn state(&self) -> &crate::observe::model::State;
    /// Carries out a command from a key; Ok(message for the status line) or Err (shown too).
    async fn command(&mut self, c: &app::Command) -> anyhow::Result<String>;
}

/// How long the input thread waits for an event before checking whether it should stop.
const INPUT_POLL: Duration = Duration::from_millis(50);
/// Redraw at least this often even when nothing changed (ages, status expiry).
const IDLE_REDRAW: Duration = Duration::from_secs(1);

/// How often the running controller's policy file is read again (a reload, another
/// controller).
const POLICY_REFRESH: Duration = Duration::from_secs(5);

/// Runs the TUI until `q`, Ctrl-C, SIGINT or SIGTERM; redraws at most every `interval`.
pub async fn run<S: Source>(source: &mut S, interval: Duration) -> anyhow::Result<()> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
        }
    };

    let mut term = TerminalGuard::enter()
        .context("setting up the terminal (top needs an interactive terminal)")?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = InputThread::spawn(tx)?;

    let res = event_loop(&mut term.terminal, source, &mut rx, interval, shutdown).await;

    drop(rx);
    // Stop reading the terminal before leaving raw mode.
    drop(input);
    drop(term);
    res
}

/// The thread that reads terminal events; dropping it stops it (within [`INPUT_POLL`]) and
/// waits for it, also when the loop unwinds from a panic.
struct InputThread {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl InputThread {
    fn spawn(tx: mpsc::UnboundedSender<io::Result<Event>>) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("tui-input".into())
            .spawn(move || read_input(&flag, &tx))
            .context("starting the terminal input thread")?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for InputThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Reads terminal events until `stop` is set, the receiver is gone, or reading fails (the
/// error is sent on).
fn read_input(stop: &AtomicBool, tx: &mpsc::UnboundedSender<io::Result<Event>>) {
    while !stop.load(Ordering::Relaxed) {
        match event::poll(INPUT_POLL) {
            Ok(false) => {}
            Ok(true) => {
                let ev = event::read();
                let failed = ev.is_err();
                if tx.send(ev).is_err() || failed {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// `100ms`, `1s`, `1.5s`.
pub fn interval_label(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if d.subsec_millis() == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn redraw<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    state: &State,
) -> anyhow::Result<()> {
    let size = terminal.size().context("reading the terminal size")?;
    frame(
        terminal,
        app,
        state,
        Rect::new(0, 0, size.width, size.height),
    )
    .context("drawing the screen")
}

/// One frame of a terminal of `area` (its size): the rows PageUp / PageDown move, the selection
/// kept on its row, then the screen. The table's rows are computed once for both.
pub fn frame<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    state: &State,
    area: Rect,
) -> io::Result<()> {
    app.page = render::table_page(area, app, state);
    let rows = app::rows(app, state);
    app.sync_rows(&rows);
    terminal.draw(|f| render::draw_rows(f, app, state, &rows))?;
    Ok(())
}

/// The loop, over any backend and input channel (tests drive it with a `TestBackend`).
async fn event_loop<B: Backend, S: Source>(
    terminal: &mut Terminal<B>,
    source: &mut S,
    input: &mut mpsc::UnboundedReceiver<io::Result<Event>>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut app = App::new(interval_label(interval));
    app.no_color = crate::term::no_color();
    app.label = std::env::var("GPREEMPT_LABEL")
        .ok()
        .filter(|l| !l.is_empty());
    let mut timer = tokio::time::interval(interval.max(Duration::from_millis(10)));
    timer.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    let mut dirty = true;
    let mut last_draw = Instant::now();
    let mut policy_at: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            ev = input.recv() => {
                match ev {
                    Some(Ok(Event::Key(k))) => {
                        let action = action_for(k, &app);
                        match app.handle(action, source.state()) {
                            Some(Command::Quit) => return Ok(()),
                            Some(c) => match source.command(&c).await {
                                Ok(msg) => app.set_status(msg, false),
                                Err(e) => app.set_status(format!("{e:#}"), true),
                            },
                            None => {}
                        }
                    }
                    Some(Ok(Event::Resize(..))) => {}
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e).context("reading terminal input"),
                    None => return Err(anyhow!("the terminal input thread stopped")),
                }
                redraw(terminal, &mut app, source.state())?;
                dirty = false;
                last_draw = Instant::now();
            }
            _ = timer.tick() => {
                // The running controller's policy, for the detail pane's "why this class".
                if policy_at.is_none_or(|t| t.elapsed() >= POLICY_REFRESH) {
                    app.policy = crate::policy::running(&crate::rundir::run_dir())
                        .ok()
                        .map(|r| r.policy);
                    policy_at = Some(Instant::now());
                }
                if dirty || last_draw.elapsed() >= IDLE_REDRAW {
                    redraw(terminal, &mut app, source.state())?;
                    dirty = false;
                    last_draw = Instant::now();
                }
            }
            r = source.pump() => {
                r?;
                dirty = true;
            }
        }
    }
}

/// Whether the terminal is in TUI mode (the panic hook restores it only then).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: std::sync::Once = std::sync::Once::new();

/// Leaves raw mode and the alternate screen and shows the cursor; errors are ignored (there is
/// nothing better to do while already leaving).
fn restore_terminal() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
    }
}

/// Owns the terminal in TUI mode; dropping it restores the terminal.
struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl TerminalGuard {
    fn enter() -> anyhow::Result<Self> {
        HOOK.call_once(|| {
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_terminal();
                prev(info);
            }));
        });
        enable_raw_mode().context("enabling raw mode")?;
        ACTIVE.store(true, Ordering::SeqCst);
        // From here on, an error drops the guard-to-be: restore by hand.
        let setup = || -> anyhow::Result<Terminal<CrosstermBackend<Stdout>>> {
            execute!(io::stdout(), EnterAlternateScreen, Hide)
                .context("entering the alternate screen")?;
            let mut t = Terminal::new(CrosstermBackend::new(io::stdout()))?;
            t.clear()?;
            Ok(t)
        };
        match setup() {
            Ok(terminal) => Ok(Self { terminal }),
            Err(e) => {
                restore_terminal();
                Err(e)
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::model::Update;
    use crate::tui::app::tests::known_state;
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use ratatui::backend::TestBackend;

    struct Fake {
        state: State,
        updates: mpsc::UnboundedReceiver<Update>,
        commands: Vec<Command>,
        fail: bool,
    }

    impl Source for Fake {
        async fn pump(&mut self) -> anyhow::Result<()> {
            match self.updates.recv().await {
                Some(u) => {
                    self.state.apply(u);
                    Ok(())
                }
                // No more updates: wait for ever (the loop ends on a key or a signal).
                None => std::future::pending().await,
            }
        }
        fn state(&self) -> &State {
            &self.state
        }
        async fn command(&mut self, c: &Command) -> anyhow::Result<String> {
            self.commands.push(c.clone());
            if self.fail {
                anyhow::bail!("no permission to attach to the target");
            }
            Ok(format!("done: {c:?}"))
        }
    }

    fn key(c: char) -> io::Result<Event> {
        Ok(Event::Key(KeyEvent::new(
            KeyCode::Char(c),
            KeyModifiers::NONE,
        )))
    }

    fn ctrl_c() -> io::Result<Event> {
        Ok(Event::Key(KeyEvent::new(
            KeyCode::Char('c'),
            KeyModifiers::CONTROL,
        )))
    }

    fn screen(t: &Terminal<TestBackend>) -> String {
        let b = t.backend().buffer();
        (0..b.area.height)
            .map(|y| {
                (0..b.area.width)
                    .map(|x| b[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn fake(fail: bool) -> (Fake, mpsc::UnboundedSender<Update>) {
        let (utx, urx) = mpsc::unbounded_channel();
        let f = Fake {
            state: known_state(),
            updates: urx,
            commands: Vec::new(),
            fail,
        };
        (f, utx)
    }

    /// NVIDIA TSGs: their channel count in the HQD column, their RM objects in the detail pane.
    #[tokio::test]
    async fn nvidia_tsgs_show_their_channels() {
        let (_utx, urx) = mpsc::unbounded_channel();
        let mut src = Fake {
            state: crate::backend::nv::controller::tests::host(),
            updates: urx,
            commands: Vec::new(),
            fail: false,
        };
        let mut term = Terminal::new(TestBackend::new(120, 40)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(key('j')).unwrap();
        tx.send(Ok(Event::Key(KeyEvent::new(
            KeyCode::Enter,
            KeyModifiers::NONE,
        ))))
        .unwrap();
        let driver = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.send(ctrl_c()).unwrap();
        };
        let (res, ()) = tokio::join!(
            event_loop(
                &mut term,
                &mut src,
                &mut rx,
                Duration::from_millis(10),
                std::future::pending::<()>()
            ),
            driver
        );
        res.unwrap();
        let s = screen(&term);
        assert!(s.contains("tsg-gr") && s.contains("tsg-ce"), "{s}");
        assert!(s.contains("2ch"), "TSG 0x20 has channels 0x21, 0x22:\n{s}");
        assert!(s.contains("rm client") && s.contains("0xc1 (fd"), "{s}");
        assert!(s.contains("2: 0x21 0x22"), "{s}");
    }

    #[test]
    fn interval_labels() {
        assert_eq!(interval_label(Duration::from_millis(100)), "100ms");
        assert_eq!(interval_label(Duration::from_secs(2)), "2s");
        assert_eq!(interval_label(Duration::from_millis(1500)), "1.5s");
    }

    #[tokio::test]
    async fn keys_become_commands_and_q_quits() {
        let (mut src, utx) = fake(false);
        let mut term = Terminal::new(TestBackend::new(100, 30)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for c in ['j', 'j', 's', 'r'] {
            tx.send(key(c)).unwrap();
        }
        let shutdown = std::future::pending::<()>();
        let driver = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // An update arrives: a new queue shows after the next timer tick.
            utx.send(crate::tui::app::tests::create(7_000_000_000, 100, 3, 1001))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.send(ctrl_c()).unwrap();
        };
        let (res, ()) = tokio::join!(
            event_loop(
                &mut term,
                &mut src,
                &mut rx,
                Duration::from_millis(10),
                shutdown
            ),
            driver
        );
        res.unwrap();
        assert_eq!(
            src.commands,
            vec![
                Command::Suspend {
                    pid: 100,
                    queue: Some(1)
                },
                Command::Resume {
                    pid: 100,
                    queue: Some(1)
                },
            ]
        );
        let s = screen(&term);
        assert!(s.contains("done: Resume"), "{s}");
        assert!(s.contains(" └─ 3"), "the pumped update is drawn:\n{s}");
    }

    #[tokio::test]
    async fn command_errors_are_shown_and_signals_end_the_loop() {
        let (mut src, _utx) = fake(true);
        let mut term = Terminal::new(TestBackend::new(100, 30)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(key('s')).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        let driver = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stop_tx.send(()).unwrap();
        };
        let (res, ()) = tokio::join!(
            event_loop(
                &mut term,
                &mut src,
                &mut rx,
                Duration::from_millis(10),
                shutdown
            ),
            driver
        );
        res.unwrap();
        assert_eq!(src.commands.len(), 1);
        let s = screen(&term);
        assert!(s.contains("no permission to attach to the target"), "{s}");
    }

    #[tokio::test]
    async fn input_errors_end_the_loop_with_an_error() {
        let (mut src, _utx) = fake(false);
        let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Err(io::Error::other("tty gone"))).unwrap();
        let err = event_loop(
            &mut term,
            &mut src,
            &mut rx,
            Duration::from_millis(10),
            std::future::pending(),
        )
        .await
        .unwrap_err();
        assert!(format!("{err:#}").contains("tty gone"), "{err:#}");
    }
}
