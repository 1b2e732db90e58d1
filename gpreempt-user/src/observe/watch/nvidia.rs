//! NVIDIA processes at start: those a previous controller journaled, proven through the driver,
//! those the driver alone explains, and the rest marked unmanaged; the journal kept from then on.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::Watcher;
use crate::{
    clock::monotonic_ns,
    observe::model::Update,
    observe::nv::adopt,
    observe::{events::Event, procinfo},
};

/// Driver scans of processes no journal names, running off the caller's thread
/// ([`Watcher::adopt_nv_start`]); [`Watcher::adopt_nv_finish`] applies what they found.
pub struct Discovery {
    lines: Vec<String>,
    scanned: bool,
    job: Option<std::thread::JoinHandle<Vec<Scanned>>>,
}

/// One process the driver was asked about: its pid, why no journal explained it, and what the
/// scan found (None: no scan) with how long it took.
type Scanned = (u32, String, Option<(adopt::Found, Duration)>);

/// At most this many processes are scanned at once (each scan is one thread of driver calls).
const SCAN_THREADS: usize = 8;

impl Watcher {
    /// [`Self::adopt_nv_start`] and [`Self::adopt_nv_finish`] in one (`top`, `queues`).
    pub fn adopt_nv(&mut self, dir: &Path, journal: bool) -> Vec<String> {
        let d = self.adopt_nv_start(dir, journal);
        self.adopt_nv_finish(d)
    }

    /// Adopts the NVIDIA processes a previous controller journaled in `dir`, each proven through
    /// the driver ([`crate::observe::nv::adopt`]), and starts scanning the driver for the
    /// processes holding it that the journal does not explain, several at once, on threads of
    /// their own: the caller goes on (`run` self-tests meanwhile). `journal`: `run` journals
    /// from now on.
    pub fn adopt_nv_start(&mut self, dir: &Path, journal: bool) -> Discovery {
        let mut lines = Vec::new();
        let mut log = adopt::ObjectLog::default();
        match adopt::load(dir) {
            Ok(j) if !j.is_empty() => {
                let journaled = j.len();
                let mut host = adopt::RealHost {
                    proc_root: &self.paths.proc,
                };
                let a = adopt::adopt(j, &mut host, monotonic_ns());
                lines.push(format!(
                    "NVIDIA: adopted {} running process(es) with {} TSG(s) from {} \
                     ({journaled} journaled; each proven through the driver)",
                    a.kept.len(),
                    a.tsgs(),
                    dir.join(adopt::FILE).display()
                ));
                for (pid, why) in &a.refused {
                    lines.push(format!("pid {pid}: not adopted: {why}"));
                }
                log.adopted(&a.kept);
                self.batch.extend(a.events.into_iter().map(Event::Nv));
                self.apply_events();
            }
            Ok(_) => {}
            Err(e) => lines.push(format!("NVIDIA objects journal not used: {e:#}")),
        }
        let known = self.state.nv_client_pids();
        let rest = adopt::unexplained(&self.paths.proc, &known, std::process::id());
        // What no journal names is looked for in the driver itself.
        let scan = if rest.is_empty() {
            None
        } else {
            match crate::observe::nv::rm::next_client_index() {
                Ok(top) => Some(adopt::Scan {
                    client_top: top,
                    bases: adopt::DEFAULT_BASES.to_vec(),
                    max_calls: adopt::MAX_CALLS,
                }),
                Err(e) => {
                    lines.push(format!(
                        "NVIDIA: no driver scan of running processes: {e:#}"
                    ));
                    None
                }
            }
        };
        let scanned = scan.is_some();
        let proc_root = self.paths.proc.clone();
        let job = (!rest.is_empty()).then(|| {
            std::thread::Builder::new()
                .name("nv-discover".into())
                .spawn(move || scan_all(&proc_root, rest, scan.as_ref()))
        });
        let job = match job.transpose() {
            Ok(j) => j,
            Err(e) => {
                lines.push(format!("NVIDIA: no driver scan of running processes: {e}"));
                None
            }
        };
        // Journaled from now on: a process starting while the scans run is journaled too.
        self.nv_log = journal.then_some(log);
        Discovery {
            lines,
            scanned,
            job,
        }
    }

    /// Applies what [`Self::adopt_nv_start`]'s scans found (waiting for them): found processes
    /// are replayed into the model and journaled, the rest marked unmanaged. Lines for the log.
    pub fn adopt_nv_finish(&mut self, d: Discovery) -> Vec<String> {
        let Discovery {
            mut lines,
            scanned,
            job,
        } = d;
        let results = match job.map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => {
                lines.push("NVIDIA: the driver scan of running processes panicked".into());
                Vec::new()
            }
            None => Vec::new(),
        };
        for (pid, why, found) in results {
            match found {
                Some((f, took)) if f.tsgs() > 0 => {
                    lines.push(format!(
                        "pid {pid}: {} TSG(s) found through the driver ({} calls, {} ms; it \
                         opened the driver before the observer attached: no channel activity){}",
                        f.tsgs(),
                        f.calls,
                        took.as_millis(),
                        f.why_not.map(|w| format!("; {w}")).unwrap_or_default()
                    ));
                    let now = monotonic_ns();
                    self.batch
                        .extend(f.recs.iter().map(|r| Event::Nv(adopt::event(pid, r, now))));
                    // Replayed, not observed: journaled once, as found.
                    let mut log = self.nv_log.take();
                    self.apply_events();
                    if let Some(log) = log.as_mut() {
                        log.adopted(&std::collections::BTreeMap::from([(pid, f.recs)]));
                    }
                    self.nv_log = log;
                }
                other => {
                    let why = match other.and_then(|(f, _)| f.why_not) {
                        Some(w) => format!("{why}; the driver scan found no TSG ({w})"),
                        None if scanned => format!("{why}; the driver scan found no TSG"),
                        None => why,
                    };
                    let why = format!(
                        "{why}: not managed (restart it, or start the controller before GPU work)"
                    );
                    lines.push(format!("pid {pid}: unmanaged: {why}"));
                    self.state.apply(Update::Unmanaged { pid, why });
                    self.proc_info(pid);
                }
            }
        }
        lines
    }

    /// Writes the drivers' objects journals that changed (NVIDIA's, after [`Self::adopt_nv`]).
    pub fn save_journals(&mut self, dir: &Path) -> Result<()> {
        let proc_root = self.paths.proc.clone();
        match self.nv_log.as_mut() {
            Some(log) => log.save(dir, |pid| procinfo::start_time(&proc_root, pid).ok()),
            None => Ok(()),
        }
    }
}

/// Scans every process in `rest` (none without `scan`), [`SCAN_THREADS`] at a time, in the
/// order given.
fn scan_all(
    proc_root: &Path,
    rest: Vec<(u32, String)>,
    scan: Option<&adopt::Scan>,
) -> Vec<Scanned> {
    let Some(scan) = scan else {
        return rest
            .into_iter()
            .map(|(pid, why)| (pid, why, None))
            .collect();
    };
    let one = |pid: u32| {
        let id = procinfo::ProcId::now(proc_root, pid).ok()?;
        let fds = adopt::nvidiactl_fds(proc_root, pid);
        let mut host = adopt::RealHost { proc_root };
        let t0 = Instant::now();
        Some((adopt::discover(id, &fds, &mut host, scan), t0.elapsed()))
    };
    let mut out = Vec::with_capacity(rest.len());
    for chunk in rest.chunks(SCAN_THREADS) {
        let found: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|(pid, _)| s.spawn(move || one(*pid)))
                .collect();
            hs.into_iter().map(|h| h.join().ok().flatten()).collect()
        });
        out.extend(
            chunk
                .iter()
                .cloned()
                .zip(found)
                .map(|((pid, why), f)| (pid, why, f)),
        );
    }
    out
}
