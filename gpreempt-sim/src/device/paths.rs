//! What each path of the mount is: the device, the render nodes, and the sysfs and debugfs files
//! as the kernel lays them out (`kfd_topology.c`, `kfd_process.c`, `kfd_debugfs.c`), rendered
//! from the model.

use crate::model::Kfd;
use crate::{topology, views};

/// Names inside the mount.
pub const DEVICE: &str = "kfd";
pub const DRI_DIR: &str = "dri";
pub const SYSFS_DIR: &str = "sysfs-kfd";
pub const DEBUGFS_DIR: &str = "debug-kfd";
pub const MODULES: &str = "modules";

/// What a path in the mount is.
pub(super) enum Node {
    Dir(Vec<(String, bool)>),
    Text(String),
    Device,
    /// The render node of GPU index `.0`.
    Render(usize),
    /// debugfs `hang_hws` (write-only).
    HangHws,
}

pub(super) fn render_name(minor: u32) -> String {
    format!("renderD{minor}")
}

/// A node's `mem_banks/`, `caches/` or `io_links/` subtree.
pub(super) fn node_sub(kfd: &Kfd, n: u32, kind: &str, rest: &[&str]) -> Option<Node> {
    let count = match kind {
        "mem_banks" => topology::mem_banks(kfd, n),
        "caches" => topology::cache_count(kfd, n),
        "io_links" => topology::io_links(kfd, n),
        "p2p_links" => 0,
        _ => return None,
    };
    match rest {
        [] => Some(dir((0..count).map(|i| (i.to_string(), true)))),
        [i] => {
            let i: u32 = i.parse().ok()?;
            (i < count).then(|| dir([("properties".to_string(), false)]))
        }
        [i, "properties"] => {
            let i: u32 = i.parse().ok()?;
            Some(Node::Text(match kind {
                "mem_banks" => topology::mem_bank(kfd, n, i)?,
                "caches" => topology::cache(kfd, n, i)?,
                _ => topology::io_link(kfd, n, i)?,
            }))
        }
        _ => None,
    }
}

pub(super) fn dir(entries: impl IntoIterator<Item = (String, bool)>) -> Node {
    Node::Dir(entries.into_iter().collect())
}

/// Resolve a path against the model (None: no such file).
pub(super) fn resolve(kfd: &Kfd, modules: &str, path: &str) -> Option<Node> {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let d = |n: &str| (n.to_string(), true);
    let f = |n: &str| (n.to_string(), false);
    Some(match parts.as_slice() {
        [] => dir([
            f(DEVICE),
            d(DRI_DIR),
            d(SYSFS_DIR),
            d(DEBUGFS_DIR),
            f(MODULES),
        ]),
        [DEVICE] => Node::Device,
        [MODULES] => Node::Text(modules.to_string()),
        [DRI_DIR] => dir(kfd.gpus.iter().map(|g| f(&render_name(g.render_minor)))),
        [DRI_DIR, name] => {
            let gi = kfd
                .gpus
                .iter()
                .position(|g| render_name(g.render_minor) == *name)?;
            Node::Render(gi)
        }
        [SYSFS_DIR] => dir([d("kfd")]),
        [SYSFS_DIR, "kfd"] => dir([d("topology"), d("proc")]),
        [SYSFS_DIR, "kfd", "topology"] => {
            dir([f("generation_id"), f("system_properties"), d("nodes")])
        }
        [SYSFS_DIR, "kfd", "topology", "generation_id"] => Node::Text("1\n".into()),
        [SYSFS_DIR, "kfd", "topology", "system_properties"] => {
            Node::Text("platform_oem 0\nplatform_id 0\nplatform_rev 0\n".into())
        }
        [SYSFS_DIR, "kfd", "topology", "nodes"] => {
            dir((0..=kfd.gpus.len()).map(|n| d(&n.to_string())))
        }
        [SYSFS_DIR, "kfd", "topology", "nodes", n] => {
            let n: u32 = n.parse().ok()?;
            views::node_gpu_id(kfd, n)?;
            dir([
                f("gpu_id"),
                f("name"),
                f("properties"),
                d("mem_banks"),
                d("caches"),
                d("io_links"),
                d("p2p_links"),
            ])
        }
        [SYSFS_DIR, "kfd", "topology", "nodes", n, kind, rest @ ..]
            if matches!(*kind, "mem_banks" | "caches" | "io_links" | "p2p_links") =>
        {
            let n: u32 = n.parse().ok()?;
            views::node_gpu_id(kfd, n)?;
            node_sub(kfd, n, kind, rest)?
        }
        [SYSFS_DIR, "kfd", "topology", "nodes", n, file] => {
            let n: u32 = n.parse().ok()?;
            Node::Text(match *file {
                "gpu_id" => views::node_gpu_id(kfd, n)?,
                "name" => views::node_name(kfd, n)?,
                "properties" => views::node_properties(kfd, n)?,
                _ => return None,
            })
        }
        [SYSFS_DIR, "kfd", "proc"] => dir(kfd.procs.keys().map(|p| d(&p.to_string()))),
        [SYSFS_DIR, "kfd", "proc", pid, rest @ ..] => {
            proc_node(kfd, kfd.procs.get(&pid.parse().ok()?)?, rest)?
        }
        [DEBUGFS_DIR] => dir([f("mqds"), f("hqds"), f("rls"), f("hang_hws")]),
        [DEBUGFS_DIR, "mqds"] => Node::Text(views::mqds(kfd)),
        [DEBUGFS_DIR, "hqds"] => Node::Text(views::hqds(kfd)),
        [DEBUGFS_DIR, "rls"] => Node::Text(views::rls(kfd)),
        [DEBUGFS_DIR, "hang_hws"] => Node::HangHws,
        _ => return None,
    })
}

/// A file under `/sys/class/kfd/kfd/proc/<pid>/` (as `kfd_procfs_add_queue` and friends make).
pub(super) fn proc_node(kfd: &Kfd, p: &crate::model::Process, rest: &[&str]) -> Option<Node> {
    let d = |n: &str| (n.to_string(), true);
    let f = |n: &str| (n.to_string(), false);
    Some(match rest {
        [] => {
            let mut e = vec![f("pasid"), d("queues")];
            for g in p.pdds.keys() {
                e.extend([
                    f(&format!("vram_{g}")),
                    f(&format!("sdma_{g}")),
                    d(&format!("stats_{g}")),
                ]);
            }
            Node::Dir(e)
        }
        ["pasid"] => Node::Text(views::proc_pasid()),
        ["queues"] => dir(p.queues.keys().map(|q| d(&q.to_string()))),
        ["queues", q] => {
            p.queues.get(&q.parse().ok()?)?;
            dir([f("size"), f("type"), f("gpuid")])
        }
        ["queues", q, file] => {
            let q = p.queues.get(&q.parse().ok()?)?;
            Node::Text(match *file {
                "size" => views::queue_size(q),
                "type" => views::queue_type(q),
                "gpuid" => views::queue_gpuid(q),
                _ => return None,
            })
        }
        [name] => {
            let (kind, g) = name.split_once('_')?;
            let g: u32 = g.parse().ok()?;
            match kind {
                "vram" => Node::Text(views::vram(p, g)?),
                "sdma" => Node::Text(views::sdma(p, g)?),
                "stats" => {
                    p.pdds.get(&g)?;
                    dir([f("evicted_ms"), f("cu_occupancy")])
                }
                _ => return None,
            }
        }
        [stats, file] => {
            let g: u32 = stats.strip_prefix("stats_")?.parse().ok()?;
            Node::Text(match *file {
                "evicted_ms" => views::evicted_ms(p, g)?,
                "cu_occupancy" => views::cu_occupancy(kfd, p, g)?,
                _ => return None,
            })
        }
        _ => return None,
    })
}
