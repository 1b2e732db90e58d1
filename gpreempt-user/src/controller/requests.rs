//! The one way a running controller answers a request on its socket, whoever the controller is
//! (`run`, a `suspend` holder, `top` after an `s` key): through the backend seam, never the
//! vendor control directly. Queue ids a user names are checked first: nothing reaches a driver
//! for an id that is not a live queue of that process.

use std::{collections::BTreeSet, path::Path};

use gpreempt_common::kfd::{KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK};

use crate::{
    backend::{ActError, Acted, Backends, Ticket},
    controller::daemon::{Request, Response, Status},
    observe::model::{State, Vendor},
    outcome::OpReport,
};

/// The bits the kernel ORs into a queue id to report its status, and bit 29 (a RESET status was
/// proposed there; KFD queue ids stay below 1024). An id carrying one comes back with that
/// status: an ERROR would fence the GPU.
pub const KFD_STATUS_BITS: u32 = KFD_DBG_QUEUE_ERROR_MASK | KFD_DBG_QUEUE_INVALID_MASK | 1 << 29;

/// Refuses user-given `ids` unless each is a live queue of `pid`: the model's queues when it
/// knows the process, else the KFD's sysfs (`sysfs/proc/PID/queues`; a controller without a
/// model). KFD ids with status bits are refused by name.
pub fn check_queues(state: &State, pid: u32, ids: &[u32], sysfs: &Path) -> Result<(), String> {
    let (amd, live) = match state.procs.get(&pid) {
        Some(p) => (
            p.vendor().unwrap_or(Vendor::Amd) == Vendor::Amd,
            p.live_queues().map(|q| q.queue_id).collect(),
        ),
        None => (true, sysfs_queues(sysfs, pid)),
    };
    check_ids(amd, &live, ids)
}

fn sysfs_queues(sysfs: &Path, pid: u32) -> BTreeSet<u32> {
    std::fs::read_dir(sysfs.join("proc").join(pid.to_string()).join("queues"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The pure rule behind [`check_queues`].
pub fn check_ids(amd: bool, live: &BTreeSet<u32>, ids: &[u32]) -> Result<(), String> {
    for &q in ids {
        if amd && q & KFD_STATUS_BITS != 0 {
            return Err(format!(
                "queue id {q} ({q:#x}) carries KFD status bits ({:#x}): it is no queue id; \
                 the ids are in the QUEUE column of `gpreempt-ebpf queues`",
                q & KFD_STATUS_BITS
            ));
        }
        if !live.contains(&q) {
            let have = if live.is_empty() {
                "none".to_string()
            } else {
                live.iter()
                    .map(|q| q.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(format!("no live queue {q} (its queues: {have})"));
        }
    }
    Ok(())
}

/// A request's answer, and what was done (for the caller's model, audit and status).
pub struct Answer {
    pub response: Response,
    /// The report of a suspend (`true`) or resume (`false`) that reached the driver.
    pub acted: Option<(OpReport, bool)>,
}

/// Answered now, or once a backend's worker is done ([`finish`] it then).
pub enum Answered {
    Now(Box<Answer>),
    Later {
        ticket: Ticket,
        pid: u32,
        suspend: bool,
    },
}

impl Answered {
    /// For a controller whose backends all act at once (KFD only: `suspend`, `top`).
    pub fn now(self) -> Answer {
        match self {
            Self::Now(a) => *a,
            Self::Later {
                ticket,
                pid,
                suspend,
            } => finish(pid, suspend, Acted::Later(ticket).now()),
        }
    }
}

/// Serves `req` with the backend of the target's vendor; `status` is asked only for a status
/// request.
pub async fn answer(
    backends: &mut Backends,
    state: &State,
    req: Request,
    status: impl FnOnce() -> Status,
) -> Answered {
    let (suspend, pid, r) = match req {
        Request::Status => {
            return Answered::Now(Box::new(Answer {
                response: Response {
                    ok: true,
                    status: Some(status()),
                    ..Default::default()
                },
                acted: None,
            }))
        }
        Request::Suspend { pid, queues, grace } => {
            if let Some(e) = refuse(state, pid, &queues) {
                return Answered::Now(Box::new(e));
            }
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.suspend(state, pid, queues, grace).await,
                Err(e) => Acted::Now(Err(e)),
            };
            (true, pid, r)
        }
        Request::Resume { pid, queues } => {
            if let Some(e) = refuse(state, pid, &queues) {
                return Answered::Now(Box::new(e));
            }
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.resume(state, pid, queues).await,
                Err(e) => Acted::Now(Err(e)),
            };
            (false, pid, r)
        }
    };
    match r {
        Acted::Now(r) => Answered::Now(Box::new(finish(pid, suspend, r))),
        Acted::Later(ticket) => Answered::Later {
            ticket,
            pid,
            suspend,
        },
    }
}

/// The answer to a suspend (`suspend`) or resume of `pid` that came to `r`.
pub fn finish(pid: u32, suspend: bool, r: Result<OpReport, ActError>) -> Answer {
    match r {
        Ok(report) => Answer {
            response: Response {
                ok: true,
                report: Some(report.clone()),
                ..Default::default()
            },
            acted: Some((report, suspend)),
        },
        Err(e) => Answer {
            response: Response::err(format!("pid {pid}: {e}")),
            acted: None,
        },
    }
}

/// The answer to a request naming a queue `pid` does not have (None: go ahead).
fn refuse(state: &State, pid: u32, queues: &Option<Vec<u32>>) -> Option<Answer> {
    let ids = queues.as_deref()?;
    let sysfs = crate::observe::kfd::Paths::default().sysfs;
    check_queues(state, pid, ids, &sysfs).err().map(|e| Answer {
        response: Response::err(format!("pid {pid}: {e}")),
        acted: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    #[test]
    fn queue_ids_with_status_bits_are_refused_by_name() {
        // Queue 0 with the ERROR bit: what fenced a GPU when it reached the kernel.
        let e = check_ids(true, &live(&[0, 1]), &[1 << 30]).unwrap_err();
        assert!(
            e.contains("queue id 1073741824 (0x40000000) carries KFD status bits"),
            "{e}"
        );
        for bad in [1 << 31, 1 << 29, (1 << 31) | 1] {
            assert!(check_ids(true, &live(&[0, 1]), &[bad]).is_err(), "{bad:#x}");
        }
        assert_eq!(check_ids(true, &live(&[0, 1]), &[0, 1]), Ok(()));
    }

    #[test]
    fn only_live_queues_of_the_process_pass() {
        let e = check_ids(true, &live(&[0, 1]), &[0, 7]).unwrap_err();
        assert_eq!(e, "no live queue 7 (its queues: 0, 1)");
        let e = check_ids(true, &live(&[]), &[0]).unwrap_err();
        assert!(e.ends_with("(its queues: none)"), "{e}");
        // NVIDIA TSG handles use the high bits: only liveness applies to them.
        assert_eq!(
            check_ids(false, &live(&[0x5c00_0013]), &[0x5c00_0013]),
            Ok(())
        );
    }

    #[test]
    fn without_a_model_the_kfd_sysfs_names_the_queues() {
        let root = std::env::temp_dir().join(format!("gp-requests-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for q in ["0", "3"] {
            std::fs::create_dir_all(root.join("proc/4242/queues").join(q)).unwrap();
        }
        let state = State::new();
        assert_eq!(check_queues(&state, 4242, &[3, 0], &root), Ok(()));
        assert!(check_queues(&state, 4242, &[1], &root).is_err());
        assert!(
            check_queues(&state, 4343, &[0], &root).is_err(),
            "no such process"
        );
        let e = check_queues(&state, 4242, &[1 << 30], &root).unwrap_err();
        assert!(e.contains("status bits"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
