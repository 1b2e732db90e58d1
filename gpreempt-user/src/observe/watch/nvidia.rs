//! NVIDIA processes at start: those a previous controller journaled, proven through the driver,
//! those the driver alone explains, and the rest marked unmanaged; the journal kept from then on.

use std::path::Path;

use anyhow::Result;

use super::Watcher;
use crate::{
    clock::monotonic_ns,
    observe::model::Update,
    observe::{events::Event, procinfo},
};

impl Watcher {
    /// Adopts the NVIDIA processes a previous controller journaled in `dir`, each proven through
    /// the driver ([`crate::observe::nv::adopt`]), marks the processes holding the driver that nothing
    /// explains as unmanaged, and (`journal`: `run`) journals from now on. Lines for the log.
    pub fn adopt_nv(&mut self, dir: &Path, journal: bool) -> Vec<String> {
        use crate::observe::nv::adopt;
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
        for (pid, why) in rest {
            let id = procinfo::ProcId::now(&self.paths.proc, pid).ok();
            let found = scan.as_ref().zip(id).map(|(scan, id)| {
                let fds = adopt::nvidiactl_fds(&self.paths.proc, pid);
                let mut host = adopt::RealHost {
                    proc_root: &self.paths.proc,
                };
                let t0 = std::time::Instant::now();
                (adopt::discover(id, &fds, &mut host, scan), t0.elapsed())
            });
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
                    self.apply_events();
                    log.adopted(&std::collections::BTreeMap::from([(pid, f.recs)]));
                }
                other => {
                    let why = match other.and_then(|(f, _)| f.why_not) {
                        Some(w) => format!("{why}; the driver scan found no TSG ({w})"),
                        None if scan.is_some() => {
                            format!("{why}; the driver scan found no TSG")
                        }
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
        self.nv_log = journal.then_some(log);
        lines
    }

    /// Writes the NVIDIA objects journal if it changed (after [`Self::adopt_nv`]).
    pub fn save_nv_log(&mut self, dir: &Path) -> Result<()> {
        let proc_root = self.paths.proc.clone();
        match self.nv_log.as_mut() {
            Some(log) => log.save(dir, |pid| procinfo::start_time(&proc_root, pid).ok()),
            None => Ok(()),
        }
    }
}
