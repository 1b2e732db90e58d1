//! Queue ids a user names (`suspend --queue`, top's keys, socket requests) are checked before
//! anything reaches a driver: each must be a live queue of that process, and an AMD id must not
//! carry the status bits the kernel ORs into ids (an ERROR bit would fence the GPU).

use std::{collections::BTreeSet, path::Path};

use gpreempt_common::kfd::{KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK};

use crate::observe::model::{State, Vendor};

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

/// [`check_queues`] against this host's KFD sysfs.
pub fn check(state: &State, pid: u32, ids: &[u32]) -> Result<(), String> {
    check_queues(
        state,
        pid,
        ids,
        &crate::observe::kfd::Paths::default().sysfs,
    )
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
