//! NVIDIA RM objects on the model: clients, devices and subdevices remembered per process, TSGs
//! kept as queues with their channels.

use super::{LogKind, NvTsg, Queue, QueueKind, Source, State};
use crate::observe::events::{NvCall, NvEvent};

impl State {
    /// Processes with an RM client the model knows.
    pub fn nv_client_pids(&self) -> std::collections::BTreeSet<u32> {
        self.nv_objects.keys().map(|&(pid, _)| pid).collect()
    }

    /// What the controller says it changed: exactly the listed TSGs carry a changed timeslice.
    pub(super) fn timeslices(&mut self, list: &[(u32, u32, u64, u64)]) {
        for p in self.procs.values_mut() {
            for q in p.queues.values_mut() {
                if let Some(t) = q.nv.as_mut() {
                    t.timeslice_us = list
                        .iter()
                        .find(|&&(pid, tsg, _, _)| pid == p.pid && tsg == q.queue_id)
                        .map(|&(_, _, original, current)| (original, current));
                }
            }
        }
    }

    /// NVIDIA RM escapes: clients, devices, subdevices, TSGs (as queues) and their channels.
    pub(super) fn nv(&mut self, n: &NvEvent) {
        use gpreempt_common::nv::{self as abi, class};
        let ts = n.origin.ts_ns;
        self.touch(ts);
        if !n.ok() {
            return;
        }
        let pid = n.origin.pid;
        match n.call {
            NvCall::Alloc {
                h_root,
                h_object_parent,
                h_object_new,
                h_class,
                alloc_params,
                ..
            } => {
                // A client's hRoot is its own new handle (0 on input when the RM picks it).
                let client = if class::is_client(h_class) {
                    h_object_new
                } else {
                    h_root
                };
                let c = self.nv_objects.entry((pid, client)).or_default();
                // The RM ties a client to the file it was created on: every call on it uses
                // that fd.
                // The pair on nvidia_unlocked_ioctl names the fd only where a client is made.
                if n.fd >= 0 {
                    c.fd = n.fd;
                }
                if class::is_client(h_class) {
                    return;
                }
                c.objects.insert(h_object_new, (h_class, h_object_parent));
                match h_class {
                    class::NV01_DEVICE_0 => {
                        let idx = alloc_params.map_or(0, |p| abi::u32_at(&p, 0));
                        c.devices.insert(h_object_new, idx);
                    }
                    class::NV20_SUBDEVICE_0 => {
                        c.subdevices.entry(h_object_parent).or_insert(h_object_new);
                    }
                    class::KEPLER_CHANNEL_GROUP_A => {
                        let engine = n.engine_type().unwrap_or(0);
                        let gpu = c.devices.get(&h_object_parent).copied().unwrap_or(0);
                        let tsg = NvTsg {
                            h_client: h_root,
                            fd: c.fd,
                            h_subdevice: c.subdevices.get(&h_object_parent).copied(),
                            engine_type: engine,
                            channels: Vec::new(),
                            rings: Vec::new(),
                            timeslice_us: None,
                        };
                        let kind = if engine == abi::ENGINE_TYPE_GRAPHICS {
                            QueueKind::NvCompute
                        } else {
                            QueueKind::NvCopy
                        };
                        let p = self.proc_mut(pid, Source::Event, ts);
                        p.last_event_ns = ts;
                        let mut q = Queue::new(h_object_new, gpu, kind, Source::Event, ts);
                        q.created_ns = Some(ts);
                        q.nv = Some(tsg);
                        p.queues.insert(h_object_new, q);
                        self.log(
                            ts,
                            LogKind::Create,
                            pid,
                            Some(h_object_new),
                            format!(
                                "NVIDIA TSG {h_object_new:#x} (engine {engine:#x}) of client {h_root:#x}"
                            ),
                        );
                    }
                    c if class::is_channel(c) => {
                        let Some(q) = self
                            .procs
                            .get_mut(&pid)
                            .and_then(|p| p.queues.get_mut(&h_object_parent))
                        else {
                            return;
                        };
                        if let Some(t) = q.nv.as_mut().filter(|t| t.h_client == h_root) {
                            t.channels.push(h_object_new);
                            t.rings.extend(n.channel_ring());
                            q.last_event_ns = ts;
                        }
                    }
                    _ => {}
                }
            }
            NvCall::Free {
                h_root,
                h_object_old,
                ..
            } => self.nv_free(pid, h_root, h_object_old, ts),
            NvCall::Control { .. } | NvCall::Short => {}
        }
    }

    /// An RM free: a client takes everything under it; a TSG is destroyed; a channel leaves its
    /// TSG.
    fn nv_free(&mut self, pid: u32, h_root: u32, h_object_old: u32, ts: u64) {
        use gpreempt_common::nv::class;
        if h_object_old == h_root {
            // The client and everything under it.
            if let Some(c) = self.nv_objects.remove(&(pid, h_root)) {
                for (h, (cl, _)) in c.objects {
                    if cl == class::KEPLER_CHANNEL_GROUP_A {
                        self.destroy(pid, h, ts, "NVIDIA client freed");
                    }
                }
            }
            return;
        }
        let Some(c) = self.nv_objects.get_mut(&(pid, h_root)) else {
            return;
        };
        let Some((cl, parent)) = c.objects.remove(&h_object_old) else {
            return;
        };
        if cl == class::NV20_SUBDEVICE_0 && c.subdevices.get(&parent) == Some(&h_object_old) {
            c.subdevices.remove(&parent);
        }
        if cl == class::KEPLER_CHANNEL_GROUP_A {
            self.destroy(pid, h_object_old, ts, "NVIDIA TSG freed");
        } else if class::is_channel(cl) {
            if let Some(t) = self
                .procs
                .get_mut(&pid)
                .and_then(|p| p.queues.get_mut(&parent))
                .and_then(|q| q.nv.as_mut())
            {
                t.channels.retain(|&h| h != h_object_old);
                t.rings.retain(|r| r.h_channel != h_object_old);
            }
        }
    }
}
