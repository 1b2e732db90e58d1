//! `/sys/class/kfd/kfd`: GPU nodes (`topology/nodes/N/{gpu_id,name,properties}`) and the queues of
//! every KFD process (`proc/PID/queues/QID/{gpuid,type,size}`).

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use serde::Serialize;

/// One GPU node of the topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuNode {
    pub node: u32,
    pub gpu_id: u32,
    /// `name`: the ASIC name, "ip discovery" on IP-discovery parts (MI200 and later).
    pub name: String,
    /// e.g. 90010 (gfx90a), 90402 (gfx942).
    pub gfx_target_version: u32,
    pub device_id: u32,
    pub cu_count: u32,
    /// `num_cp_queues`: the compute HQD slots the KFD owns (per XCC).
    pub hqd_slots: u32,
    pub num_xcc: u32,
    pub drm_render_minor: u32,
}

impl GpuNode {
    /// `gfx90a` from 90010: major*10000 + minor*100 + stepping, minor and stepping in hex digits.
    pub fn gfx_target(&self) -> String {
        let v = self.gfx_target_version;
        format!("gfx{}{:x}{:x}", v / 10000, (v / 100) % 100, v % 100)
    }
}

/// `properties`: `name value` per line.
pub fn parse_properties(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// A node's files; `None` for CPU nodes (gpu_id 0).
pub fn parse_node(
    node: u32,
    gpu_id: &str,
    name: &str,
    properties: &str,
) -> Result<Option<GpuNode>> {
    let gpu_id: u32 = gpu_id
        .trim()
        .parse()
        .with_context(|| format!("node {node}: gpu_id {:?} is not a number", gpu_id.trim()))?;
    if gpu_id == 0 {
        return Ok(None);
    }
    let p = parse_properties(properties);
    let get = |k: &str| p.get(k).copied().unwrap_or(0) as u32;
    let simd_per_cu = get("simd_per_cu").max(1);
    Ok(Some(GpuNode {
        node,
        gpu_id,
        name: name.trim().to_string(),
        gfx_target_version: get("gfx_target_version"),
        device_id: get("device_id"),
        cu_count: get("simd_count") / simd_per_cu,
        hqd_slots: get("num_cp_queues"),
        num_xcc: get("num_xcc").max(1),
        drm_render_minor: get("drm_render_minor"),
    }))
}

fn read_text(p: &Path) -> io::Result<String> {
    std::fs::read_to_string(p)
}

/// Numbered entries of a directory (`nodes/0`, `proc/1234`, `queues/3`), sorted.
fn numbered(dir: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    let mut v: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_str()?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    v.sort_by_key(|e| e.0);
    Ok(v)
}

/// The GPUs of `root/topology/nodes`.
pub fn read_topology(root: &Path) -> Result<Vec<GpuNode>> {
    let nodes = root.join("topology/nodes");
    let entries = numbered(&nodes).with_context(|| {
        format!(
            "reading {} (is amdgpu loaded and is this an AMD GPU host?)",
            nodes.display()
        )
    })?;
    let mut gpus = Vec::new();
    for (n, dir) in entries {
        let file = |f: &str| {
            read_text(&dir.join(f)).with_context(|| format!("reading {}", dir.join(f).display()))
        };
        if let Some(g) = parse_node(n, &file("gpu_id")?, &file("name")?, &file("properties")?)? {
            gpus.push(g);
        }
    }
    Ok(gpus)
}

/// A queue directory `proc/PID/queues/QID`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SysQueue {
    pub queue_id: u32,
    pub gpu_id: u32,
    /// The kernel's internal type (0 compute, PM4 and AQL alike; 1 SDMA; 3/4 SDMA XGMI).
    pub kind: u32,
    /// Ring size in bytes.
    pub size: u64,
}

/// A KFD process and its queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SysProc {
    pub pid: u32,
    pub queues: Vec<SysQueue>,
}

/// All KFD processes, with a timestamp taken before reading (CLOCK_MONOTONIC ns): an event newer
/// than it may not be in the snapshot yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcSnapshot {
    pub taken_ns: u64,
    pub procs: Vec<SysProc>,
}

/// Reads `root/proc`. A process or queue that vanishes while being read is left out: the kernel
/// removes the directories as it tears them down. `known(pid, qid)` returns queues the caller
/// already knows: their files are not read again (a queue's gpu, type and size never change), so
/// a steady host costs one readdir per process.
pub fn read_procs(
    root: &Path,
    known: impl Fn(u32, u32) -> Option<SysQueue>,
) -> Result<ProcSnapshot> {
    let taken_ns = crate::clock::monotonic_ns();
    let dir = root.join("proc");
    let mut procs = Vec::new();
    for (pid, pdir) in numbered(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let qdir = pdir.join("queues");
        let Ok(qs) = numbered(&qdir) else { continue };
        let mut queues = Vec::with_capacity(qs.len());
        for (qid, d) in qs {
            if let Some(q) = known(pid, qid).or_else(|| read_queue(qid, &d)) {
                queues.push(q);
            }
        }
        procs.push(SysProc { pid, queues });
    }
    Ok(ProcSnapshot { taken_ns, procs })
}

fn read_queue(queue_id: u32, d: &Path) -> Option<SysQueue> {
    let num = |f: &str| -> Option<u64> { read_text(&d.join(f)).ok()?.trim().parse().ok() };
    Some(SysQueue {
        queue_id,
        gpu_id: num("gpuid")? as u32,
        kind: num("type")? as u32,
        size: num("size")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_properties_give_cus_slots_and_target() {
        let props = "cpu_cores_count 0\nsimd_count 416\nsimd_per_cu 4\ngfx_target_version 90010\n\
                     num_cp_queues 32\ndevice_id 29711\nnum_xcc 1\ndrm_render_minor 128\n";
        let g = parse_node(1, "12345\n", "aldebaran\n", props)
            .unwrap()
            .unwrap();
        assert_eq!(g.gpu_id, 12345);
        assert_eq!(g.cu_count, 104);
        assert_eq!(g.hqd_slots, 32);
        assert_eq!(g.gfx_target(), "gfx90a");
        assert_eq!(g.name, "aldebaran");
        assert_eq!(
            GpuNode {
                gfx_target_version: 90402,
                ..g.clone()
            }
            .gfx_target(),
            "gfx942"
        );
        assert_eq!(parse_node(0, "0\n", "\n", "").unwrap(), None);
        let e = parse_node(2, "x\n", "", "").unwrap_err().to_string();
        assert!(e.contains("node 2: gpu_id \"x\""), "{e}");
    }
}
