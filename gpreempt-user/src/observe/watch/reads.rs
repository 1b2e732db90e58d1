//! The periodic reads that keep the model true when events are missed or came before the
//! start: sysfs processes and queues, /proc facts (pid reuse, processes gone without an exit),
//! debugfs `mqds`/`hqds`, kernel names and the queues' dispatch ids.

use crate::{
    clock::monotonic_ns,
    observe::kfd::{debugfs, sampler, sysfs},
    observe::model::Update,
    observe::procinfo,
};

use super::Watcher;

impl Watcher {
    pub(super) fn reconcile_now(&mut self, force_mqds: bool) {
        let state = &self.state;
        let known = |pid: u32, qid: u32| {
            let q = state.queue(pid, qid).filter(|q| q.alive())?;
            Some(sysfs::SysQueue {
                queue_id: qid,
                gpu_id: q.gpu_id,
                kind: q.kind.sysfs_type(),
                size: q.ring_size,
            })
        };
        match sysfs::read_procs(&self.paths.sysfs, known) {
            Ok(s) => self.state.apply(Update::Procs(s)),
            // No KFD at all (an NVIDIA host, or amdgpu not loaded): nothing to reconcile; the
            // header and doctor say what a host without GPUs lacks.
            Err(_) if !self.paths.sysfs.exists() => {}
            Err(e) => self.warn_once(format!("{e:#}")),
        }
        // Pid reuse and processes gone without an exit event.
        let pids: Vec<(u32, Option<u64>)> = self
            .state
            .procs
            .values()
            .filter(|p| p.exited_ns.is_none())
            .map(|p| (p.pid, p.info.as_ref().map(|i| i.start_time)))
            .collect();
        for (pid, known) in pids {
            match procinfo::start_time(&self.paths.proc, pid) {
                Ok(t) if known == Some(t) => {}
                Ok(_) => self.proc_info(pid),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.state.apply(Update::ProcGone { pid })
                }
                Err(_) => {}
            }
        }
        // KFD queues only: an NVIDIA TSG has no MQD (its rings come from its alloc params).
        let need_mqds = self.state.procs.values().any(|p| {
            p.live_queues()
                .any(|q| q.kind.is_compute() && q.nv.is_none() && q.ring_base_address.is_none())
        });
        if force_mqds || need_mqds {
            let path = self.paths.debugfs.join("mqds");
            match std::fs::read_to_string(&path) {
                Ok(t) => match debugfs::parse_mqds(&t) {
                    Ok(m) => self.state.apply(Update::Mqds(m)),
                    Err(e) => self.warn_once(format!("{}: {e:#}", path.display())),
                },
                Err(e) if need_mqds => self.warn_once(format!(
                    "cannot read {} ({e}): rings of queues created before the tool started stay unknown",
                    path.display()
                )),
                Err(_) => {}
            }
        }
    }

    /// Kernel names of every process that dispatched unnamed kernels, read here and now (for
    /// the one-shot `queues`; the live map reads them off the loop).
    pub(super) fn name_kernels_now(&mut self) {
        let pids: Vec<u32> = self
            .state
            .procs
            .values()
            .filter(|p| {
                p.queues
                    .values()
                    .any(|q| q.activity.dispatches.unnamed() > 0)
            })
            .map(|p| p.pid)
            .collect();
        for pid in pids {
            match crate::observe::kfd::codeobj::read_kernel_names(&self.paths.proc, pid) {
                Ok(names) => self.state.apply(Update::KernelNames { pid, names }),
                Err(e) => log::debug!("pid {pid}: no kernel names: {e:#}"),
            }
        }
    }

    /// Before a GPU set-up call of `pid` lands in its record: is the record's process the one
    /// that has the pid now? A process that was never seen to exit (it made no GPU call while
    /// we watched, so no exit record came) may have handed its pid to a new one, whose calls
    /// would otherwise count as the old one's (and get its class). The new one gets a record of
    /// its own and is classified afresh.
    pub(super) fn same_owner(&mut self, pid: u32) {
        let Some(known) = self
            .state
            .procs
            .get(&pid)
            .filter(|p| p.exited_ns.is_none())
            .and_then(|p| p.info.as_ref())
            .map(|i| i.start_time)
        else {
            return;
        };
        match procinfo::start_time(&self.paths.proc, pid) {
            Ok(t) if t != known => {
                log::warn!(
                    "pid {pid}: a new process (started at tick {t}) has the pid of one started at \
                     tick {known} whose exit was not seen: a new process, classified afresh"
                );
                self.proc_info(pid);
            }
            _ => {}
        }
    }

    /// Reads `pid`'s /proc facts again now: an act found the pid owned by another process than
    /// the model's (a different start time), and the model replaces it with the new one.
    pub fn recheck(&mut self, pid: u32) {
        self.proc_info(pid);
    }

    pub(super) fn proc_info(&mut self, pid: u32) {
        match procinfo::read(&self.paths.proc, pid) {
            Ok(info) => self.state.apply(Update::ProcInfo { pid, info }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.state.apply(Update::ProcGone { pid })
            }
            Err(e) => log::debug!("pid {pid}: {e}"),
        }
    }

    /// The NVIDIA GPUs (`<proc>/driver/nvidia/gpus`), joined with the RM's device instances.
    /// Without `force` only when a live TSG names a device instance no GPU has that was not
    /// asked about already (a GPU attaches when its first process opens it).
    pub(super) fn nv_gpus_now(&mut self, force: bool) {
        let unjoined: std::collections::BTreeSet<u32> = self
            .state
            .procs
            .values()
            .flat_map(|p| p.live_queues())
            .filter(|q| q.nv.is_some() && self.state.nv_gpu(q.gpu_id).is_none())
            .map(|q| q.gpu_id)
            .collect();
        if !force && (unjoined.is_empty() || unjoined == self.nv_unjoined) {
            return;
        }
        self.nv_unjoined = unjoined;
        let gpus = crate::observe::nv::gpus::read_joined(&self.paths.proc, self.nv_rm);
        if gpus != self.state.nv_gpus {
            self.state.apply(Update::NvGpus(gpus));
        }
    }

    pub(super) fn hqds_now(&mut self) {
        // No amdgpu here: no HQDs to read, and no advice about debugfs to give.
        if self.state.nvidia_only() {
            return;
        }
        let path = self.paths.debugfs.join("hqds");
        let taken_ns = monotonic_ns();
        match std::fs::read_to_string(&path) {
            Ok(t) => match debugfs::parse_hqds(&t) {
                Ok(nodes) => self.state.apply(Update::Hqds { taken_ns, nodes }),
                Err(e) => self.warn_once(format!("{}: {e:#}", path.display())),
            },
            Err(e) => {
                self.warn_once(format!(
                    "cannot read {} ({e}): HQD slots unknown; as root, mount debugfs \
                     (mount -t debugfs none /sys/kernel/debug)",
                    path.display()
                ));
            }
        }
    }

    pub(super) fn sample_now(&mut self) {
        let mut samples = sampler::sample(&self.state);
        let now = monotonic_ns();
        samples.extend(self.channels.sample(&self.state, now));
        if !samples.is_empty() {
            self.state.apply(Update::Samples {
                ts_ns: now,
                samples,
            });
        }
    }
}
