//! The HWS runlist of the emulated amdkfd, and the model's calls into the GPU engine (gpu.rs):
//! the engine runs on `Kfd`, so only this file, not the model's structs, depends on it.

use gpreempt_common::kfd;

use super::{Kfd, QKey};

impl Kfd {
    /// Account the GPUs' progress up to `now` before an ioctl changes any state.
    pub(super) fn sync_engine(&mut self, now: u64) {
        crate::gpu::sync(self, now);
    }

    /// `execute_queues_cpsch`: unmap every dynamic queue of the device and upload a new runlist.
    pub fn execute_queues(&mut self, gi: usize, now: u64) {
        self.preempt(gi, now, kfd::USE_DEFAULT_GRACE_PERIOD);
    }

    /// `execute_queues_cpsch` with a grace period; false when the CP did not acknowledge the
    /// preemption (debugfs `hang_hws`): the emulated device then recovers, as after a reset.
    pub(super) fn preempt(&mut self, gi: usize, now: u64, grace: u32) -> bool {
        if std::mem::take(&mut self.gpus[gi].hws_hung) {
            return false;
        }
        let gpu_id = self.gpus[gi].gpu_id;
        let mut active: Vec<(u64, u64, QKey)> = self
            .procs
            .values()
            .flat_map(|p| {
                p.queues
                    .values()
                    .filter(|q| q.gpu_id == gpu_id && q.is_active() && q.is_compute())
                    .map(move |q| (p.serial, q.serial, (p.pid, q.id)))
            })
            .collect();
        active.sort_unstable();
        let runlist: Vec<QKey> = active.into_iter().map(|(_, _, k)| k).collect();
        // The grace period lets running waves finish before CWSR (1K clocks per unit).
        let grace_ns = if grace == kfd::USE_DEFAULT_GRACE_PERIOD {
            0
        } else {
            u64::from(grace) * 1000 * 1000 / u64::from(self.gpus[gi].spec.clock_mhz.max(1))
        };
        crate::gpu::upload_runlist(self, gi, runlist, now, grace_ns);
        true
    }
}
