//! The watcher over stand-in trees (`/proc`, `/sys/class/kfd/kfd`, debugfs): which GPUs an
//! NVIDIA-only, an AMD-only, a mixed host and a host with neither show, and which AMD warnings
//! each gets.

use std::path::{Path, PathBuf};

use super::Watcher;
use crate::observe::kfd::Paths;
use crate::observe::model::tests::nvidia::rm_alloc;
use crate::observe::nv::gpus::fixture::{write_gpus, TWO_H100};
use gpreempt_common::nv::class;

/// A stand-in root removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("gpreempt-watch-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn paths(&self) -> Paths {
        Paths {
            sysfs: self.0.join("sys/class/kfd/kfd"),
            debugfs: self.0.join("sys/kernel/debug/kfd"),
            proc: self.0.join("proc"),
        }
    }
    /// One KFD GPU node (an MI210) in the stand-in topology.
    fn kfd_gpu(&self) {
        let n = self.paths().sysfs.join("topology/nodes/1");
        std::fs::create_dir_all(&n).unwrap();
        std::fs::write(n.join("gpu_id"), "43981\n").unwrap();
        std::fs::write(n.join("name"), "aldebaran\n").unwrap();
        std::fs::write(
            n.join("properties"),
            "simd_count 416\nsimd_per_cu 4\ngfx_target_version 90010\nnum_cp_queues 32\n",
        )
        .unwrap();
        std::fs::create_dir_all(self.paths().sysfs.join("proc")).unwrap();
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The watcher's first read of `root` (no eBPF, no RM), then a TSG of pid 4242 on device
/// instance 1 and another reconcile, as `top` would.
fn watch(root: &Path, paths: Paths) -> Watcher {
    let _ = root;
    let mut w = Watcher::without_events_kfd(paths, false).unwrap();
    w.nv_rm = false;
    w.reconcile_now(true);
    w.nv_gpus_now(true);
    w.hqds_now();
    for (parent, new, cl, head) in [
        (0, 0xc1, class::NV01_ROOT_CLIENT, 0),
        (0xc1, 0x10, class::NV01_DEVICE_0, 1),
        (0x10, 0x11, class::NV20_SUBDEVICE_0, 0),
        (0x10, 0x5c00_0015, class::KEPLER_CHANNEL_GROUP_A, 1),
    ] {
        w.state
            .apply(rm_alloc(1, 4242, 0xc1, parent, new, cl, head));
    }
    w.reconcile_now(false);
    w.nv_gpus_now(false);
    w
}

fn amd_warnings(w: &Watcher) -> Vec<&String> {
    w.warnings
        .iter()
        .filter(|m| {
            m.contains("hqds") || m.contains("mqds") || m.contains("HQD") || m.contains("kfd")
        })
        .collect()
}

#[test]
fn an_nvidia_only_host_lists_its_gpus_and_gets_no_amd_warning() {
    let t = Tree::new("nv");
    write_gpus(&t.paths().proc, &TWO_H100);
    let w = watch(&t.0, t.paths());
    assert!(w.state.gpus.is_empty());
    let ids: Vec<(u32, &str, Option<&str>)> = w
        .state
        .nv_gpus
        .iter()
        .map(|g| (g.index, g.pci_bus_id.as_str(), g.uuid.as_deref()))
        .collect();
    assert_eq!(
        ids,
        [
            (0, "00000000:19:00.0", Some(TWO_H100[0].2)),
            (1, "00000000:3B:00.0", Some(TWO_H100[1].2))
        ]
    );
    assert!(w.state.nvidia_only());
    // No HQDs to read, and a TSG (no MQD) asks for no debugfs mqds.
    assert!(amd_warnings(&w).is_empty(), "{:?}", w.warnings);
    assert_eq!(w.state.hqds_ns, None);
}

#[test]
fn a_mixed_host_shows_both_and_keeps_the_amd_warnings() {
    let t = Tree::new("mixed");
    write_gpus(&t.paths().proc, &TWO_H100[..1]);
    t.kfd_gpu();
    let w = watch(&t.0, t.paths());
    assert_eq!(w.state.gpus.len(), 1);
    assert_eq!(w.state.nv_gpus.len(), 1);
    // One NVIDIA GPU: device instance 0, without asking the RM.
    assert_eq!(w.state.nv_gpus[0].device_instance, Some(0));
    assert!(!w.state.nvidia_only());
    // debugfs is missing: the AMD side says so.
    assert!(
        amd_warnings(&w).iter().any(|m| m.contains("hqds")),
        "{:?}",
        w.warnings
    );
}

#[test]
fn a_host_with_neither_keeps_todays_advice() {
    let t = Tree::new("none");
    let w = watch(&t.0, t.paths());
    assert!(w.state.gpus.is_empty() && w.state.nv_gpus.is_empty());
    assert!(!w.state.nvidia_only());
    assert!(
        amd_warnings(&w)
            .iter()
            .any(|m| m.contains("HQD slots unknown")),
        "{:?}",
        w.warnings
    );
}

#[test]
fn an_amd_only_host_lists_no_nvidia_gpu() {
    let t = Tree::new("amd");
    t.kfd_gpu();
    let w = watch(&t.0, t.paths());
    assert_eq!(w.state.gpus.len(), 1);
    assert!(w.state.nv_gpus.is_empty());
}
