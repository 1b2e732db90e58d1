//! Launch uprobes: attached per watched process at the runtime's launch entry points, and
//! detached off the caller's thread (closing a uprobe waits for RCU grace periods).

use anyhow::{bail, Result};
use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeScope},
    UProbe,
};

use super::{Probes, SourceKind};
use crate::observe::launch::LaunchTarget;

impl Probes {
    /// many points were attached; points that fail are logged and skipped.
    pub fn watch_launches(&mut self, pid: u32, targets: &[LaunchTarget]) -> Result<usize> {
        if let Err(e) = &self.launch_ready {
            bail!("launch uprobes unavailable: {e}");
        }
        if self.launch_links.contains_key(&pid) {
            return Ok(self.launch_links[&pid].len());
        }
        let Some(scope) = std::num::NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
            bail!("pid 0 cannot be watched");
        };
        let mut links = Vec::new();
        let mut last_err = None;
        for t in targets {
            let prog: &mut UProbe = match self.ebpf.program_mut(t.program) {
                Some(p) => p.try_into()?,
                None => bail!("program {} missing from the eBPF object", t.program),
            };
            match prog.attach(
                UProbeAttachLocation::AbsoluteOffset(t.file_offset),
                &t.path,
                scope,
            ) {
                Ok(link) => links.push((t.program, link)),
                Err(e) => {
                    log::debug!(
                        "uprobe {} at {}+{:#x} for pid {pid}: {e:#}",
                        t.symbol,
                        t.path.display(),
                        t.file_offset
                    );
                    last_err = Some(e);
                }
            }
        }
        if links.is_empty() {
            if let Some(e) = last_err {
                return Err(
                    anyhow::Error::new(e).context(format!("attaching launch uprobes to pid {pid}"))
                );
            }
        }
        let n = links.len();
        self.launch_links.insert(pid, links);
        self.update_launch_source();
        Ok(n)
    }

    /// Detaches the launch uprobes of `pid` (its exit, or it is no longer watched).
    pub fn unwatch_launches(&mut self, pid: u32) {
        let Some(links) = self.launch_links.remove(&pid) else {
            return;
        };
        let mut taken = Vec::with_capacity(links.len());
        for (program, link) in links {
            if let Some(Ok(p)) = self.ebpf.program_mut(program).map(<&mut UProbe>::try_from) {
                if let Ok(l) = p.take_link(link) {
                    taken.push(l);
                }
            }
        }
        self.detacher.detach(taken);
        self.update_launch_source();
    }

    /// Pids whose launches are watched.
    pub fn watched_launches(&self) -> impl Iterator<Item = u32> + '_ {
        self.launch_links.keys().copied()
    }

    fn update_launch_source(&mut self) {
        let procs = self.launch_links.len();
        let points: usize = self.launch_links.values().map(Vec::len).sum();
        if let Some(s) = self
            .sources
            .iter_mut()
            .find(|s| s.kind == SourceKind::Uprobe)
        {
            s.live = procs > 0;
            s.detail = if procs > 0 {
                format!("{procs} process(es), {points} entry point(s)")
            } else {
                "ready; no process watched".into()
            };
        }
    }
}
