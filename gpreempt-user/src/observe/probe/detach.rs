//! Detaching launch uprobes off the caller's thread: [`Probes`](super::Probes) owns one.

/// Detaches launch uprobes off the caller's thread. Closing a uprobe's perf event waits for
/// RCU grace periods (`perf_uprobe_destroy` -> `uprobe_unregister` -> `synchronize_rcu`): about
/// 0.25 s per process on a loaded 2-vCPU host, seconds for many processes or under a signal
/// storm. On the controller's loop that time could outlast the lease guardian's patience
/// (backend/kfd/lease.rs), which would kill a controller that is only tearing probes down.
#[derive(Default)]
pub(super) struct Detacher {
    tx: Option<std::sync::mpsc::Sender<Vec<aya::programs::uprobe::UProbeLink>>>,
}

impl Detacher {
    /// Hands `links` to the detaching thread (started on first use); where no thread can be
    /// started they are dropped here.
    pub(super) fn detach(&mut self, links: Vec<aya::programs::uprobe::UProbeLink>) {
        if self.tx.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<aya::programs::uprobe::UProbeLink>>();
            let started = std::thread::Builder::new()
                .name("uprobe-detach".into())
                .spawn(move || {
                    for links in rx {
                        drop(links);
                    }
                });
            match started {
                Ok(_) => self.tx = Some(tx),
                Err(e) => log::warn!("uprobes are detached on the loop (no thread: {e})"),
            }
        }
        let Some(tx) = &self.tx else {
            drop(links);
            return;
        };
        if let Err(std::sync::mpsc::SendError(links)) = tx.send(links) {
            self.tx = None;
            drop(links);
        }
    }
}
