//! Kernel names for the dispatch mix, read off the event loop: a process's code objects can be
//! large (a PyTorch process maps hundreds of MB of them), so one reader thread walks ROCr's
//! loader list ([`crate::observe::kfd::codeobj`]) for one process at a time and the answers come back to
//! the loop. A process is asked again only when its queues dispatch kernels still unnamed, and
//! not more often than [`RETRY`] (a new code object is loaded; the first read raced the loader).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::observe::model::State;

/// At most one read of a process's code objects this often.
pub const RETRY: Duration = Duration::from_secs(5);
/// A process that publishes no loader list (not ROCr) is asked this rarely.
pub const RETRY_FAILED: Duration = Duration::from_secs(30);

/// A pid and its names, or why there are none.
pub type Answer = (
    u32,
    Result<crate::observe::kfd::codeobj::KernelNames, Unread>,
);

/// Why a process's names could not be read; `denied`: for want of a permission (the
/// controller's capabilities or sandbox), which the journal must show.
#[derive(Debug)]
pub struct Unread {
    pub why: String,
    pub denied: bool,
}

#[derive(Default)]
pub struct KernelNames {
    proc_root: Option<PathBuf>,
    ask: Option<std::sync::mpsc::Sender<u32>>,
    answers: Option<tokio::sync::mpsc::UnboundedReceiver<Answer>>,
    /// When each pid was last asked, and whether that read failed.
    asked: HashMap<u32, (Instant, bool)>,
    /// Pids whose names were read once (said at info level once).
    named: std::collections::HashSet<u32>,
    pending: Option<u32>,
}

impl KernelNames {
    /// Reads under `proc_root` (tests use a fake tree); `/proc` by default.
    pub fn with_proc_root(proc_root: PathBuf) -> Self {
        Self {
            proc_root: Some(proc_root),
            ..Default::default()
        }
    }

    /// Asks for the names of one process whose queues dispatched unnamed kernels, if none is
    /// being read and its turn has come.
    pub fn want(&mut self, state: &State) {
        if self.pending.is_some() {
            return;
        }
        let now = Instant::now();
        self.asked.retain(|pid, _| state.procs.contains_key(pid));
        self.named.retain(|pid| self.asked.contains_key(pid));
        let due = state.procs.values().find(|p| {
            p.exited_ns.is_none()
                && p.queues
                    .values()
                    .any(|q| q.activity.dispatches.unnamed() > 0)
                && self.asked.get(&p.pid).is_none_or(|(at, failed)| {
                    now.duration_since(*at) >= if *failed { RETRY_FAILED } else { RETRY }
                })
        });
        let Some(pid) = due.map(|p| p.pid) else {
            return;
        };
        if self.ask.is_none() {
            self.start();
        }
        if self.ask.as_ref().is_some_and(|a| a.send(pid).is_ok()) {
            self.asked.insert(pid, (now, false));
            self.pending = Some(pid);
        }
    }

    fn start(&mut self) {
        let (ask, asked) = std::sync::mpsc::channel::<u32>();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let root = self
            .proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc"));
        let spawned =
            std::thread::Builder::new()
                .name("kernel-names".into())
                .spawn(move || {
                    for pid in asked {
                        let r = crate::observe::kfd::codeobj::read_kernel_names(&root, pid)
                            .map_err(|e| Unread {
                                why: format!("{e:#}"),
                                denied: crate::observe::target_file::permission_problem(&e),
                            });
                        if tx.send((pid, r)).is_err() {
                            return;
                        }
                    }
                });
        match spawned {
            Ok(_) => {
                self.ask = Some(ask);
                self.answers = Some(rx);
            }
            Err(e) => log::warn!("kernel names: cannot start the reader thread: {e}"),
        }
    }

    /// The next answer (pending forever without a reader).
    pub async fn next(&mut self) -> Option<Answer> {
        match self.answers.as_mut() {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Notes an answer; the names to apply, if any. The first answer per pid is said: names read
    /// at info level, a failure at debug level (most processes on a host are not ROCr processes
    /// with code objects; a permission problem was warned about where the file was opened).
    pub fn answered(
        &mut self,
        (pid, r): Answer,
    ) -> Option<crate::observe::kfd::codeobj::KernelNames> {
        if self.pending == Some(pid) {
            self.pending = None;
        }
        match r {
            Ok(names) => {
                if self.asked.contains_key(&pid) && self.named.insert(pid) {
                    log::info!(
                        "pid {pid}: kernel names read from {} code object(s)",
                        names.code_objects
                    );
                }
                Some(names)
            }
            Err(Unread { why, denied }) => {
                static GATE: crate::observe::target_file::WarnGate =
                    crate::observe::target_file::WarnGate::new();
                if let Some(a) = self.asked.get_mut(&pid) {
                    if GATE.warn(denied, Instant::now()) {
                        log::warn!("pid {pid}: no kernel names: {why}");
                    } else if !a.1 {
                        log::debug!("pid {pid}: no kernel names: {why}");
                    }
                    a.1 = true;
                }
                None
            }
        }
    }
}
