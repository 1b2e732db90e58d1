//! The KFD topology tree under `/sys/devices/virtual/kfd/kfd/topology/nodes/<n>/` beyond the node's
//! own `properties` (views.rs): `mem_banks/`, `caches/` and `io_links/`, each entry a
//! `properties` file in the kernel's `mem_show`, `kfd_cache_show` and `iolink_show` formats
//! (`amdkfd/kfd_topology.c`), with the values the kernel's virtual CRAT gives a dGPU
//! (`amdkfd/kfd_crat.c`). The thunk parses all three (`topology.c` in ROCT-Thunk-Interface) and
//! ROCr builds its memory regions from the banks (docs/sim.md).

use std::fmt::Write as _;

use crate::model::{Gpu, Kfd};

/// `simd_id_base` of a GPU node (the kernel numbers GPU SIMDs from 0x80001000).
pub fn simd_id_base(node: u32) -> u32 {
    0x8000_1000 + (node - 1) * 0x100
}

/// `HSA_MEM_HEAP_TYPE_*` (kfd_crat.h).
const HEAP_SYSTEM: u32 = 0;
/// A large-BAR dGPU (no private framebuffer) reports its VRAM as public (`kfd_create_vcrat_image_gpu`).
const HEAP_FB_PUBLIC: u32 = 1;
/// `CRAT_IOLINK_TYPE_PCIEXPRESS`.
const IOLINK_PCIE: u32 = 2;
/// `CRAT_IOLINK_FLAGS_ENABLED`.
const IOLINK_ENABLED: u32 = 1;
/// PCIe link weight between a GPU and its CPU (`KFD_CRAT_INTRA_SOCKET_WEIGHT`); the thunk takes a
/// link of weight <= 20 as the GPU's direct CPU.
const PCIE_WEIGHT: u32 = 20;
/// `HSA_CACHE_TYPE_*`: the `type` file holds these, which `kfd_parse_subtype_cache` derives from
/// the CRAT cache flags (data, instruction, CPU, SIMD -> HSACU). ROCr keeps a GPU's data caches
/// of the HSACU kind as the agent's caches and refuses an agent without one.
const CACHE_DATA: u32 = 0x1;
const CACHE_INST: u32 = 0x2;
const CACHE_HSACU: u32 = 0x8;

fn gpu_of(kfd: &Kfd, node: u32) -> Option<&Gpu> {
    kfd.gpus.iter().find(|g| g.node_id == node)
}

/// Whether `node` exists (node 0 is the CPU).
pub fn node_exists(kfd: &Kfd, node: u32) -> bool {
    node == 0 || gpu_of(kfd, node).is_some()
}

/// `mem_banks_count` of a node.
pub fn mem_banks(kfd: &Kfd, node: u32) -> u32 {
    u32::from(node_exists(kfd, node))
}

/// `mem_banks/<i>/properties` (`mem_show`).
pub fn mem_bank(kfd: &Kfd, node: u32, i: u32) -> Option<String> {
    if i >= mem_banks(kfd, node) {
        return None;
    }
    let (heap, size, width, clk) = match gpu_of(kfd, node) {
        None => (HEAP_SYSTEM, kfd.host_cpu.mem_bytes, 64, 0),
        Some(g) => (
            HEAP_FB_PUBLIC,
            g.spec.vram_bytes,
            g.spec.vram_width,
            g.spec.mem_clk_max_mhz,
        ),
    };
    Some(format!(
        "heap_type {heap}\nsize_in_bytes {size}\nflags 0\nwidth {width}\nmem_clk_max {clk}\n"
    ))
}

/// One `io_link` (`iolink_show`): (node_from, node_to).
fn io_link_ends(kfd: &Kfd, node: u32, i: u32) -> Option<(u32, u32)> {
    if node == 0 {
        // The CPU node gets the reverse of every GPU's link to it (`kfd_fill_iolink_non_crat_info`).
        let g = kfd.gpus.get(i as usize)?;
        Some((0, g.node_id))
    } else {
        gpu_of(kfd, node)?;
        (i == 0).then_some((node, 0))
    }
}

/// `io_links_count` of a node.
pub fn io_links(kfd: &Kfd, node: u32) -> u32 {
    if node == 0 {
        kfd.gpus.len() as u32
    } else {
        u32::from(gpu_of(kfd, node).is_some())
    }
}

/// `io_links/<i>/properties`: a PCIe 4.0 x16 link between each GPU and the CPU.
pub fn io_link(kfd: &Kfd, node: u32, i: u32) -> Option<String> {
    let (from, to) = io_link_ends(kfd, node, i)?;
    let mut s = String::new();
    for (k, v) in [
        ("type", IOLINK_PCIE),
        ("version_major", 0),
        ("version_minor", 0),
        ("node_from", from),
        ("node_to", to),
        ("weight", PCIE_WEIGHT),
        ("min_latency", 0),
        ("max_latency", 0),
        ("min_bandwidth", 312),
        ("max_bandwidth", 31_508),
        ("recommended_transfer_size", 0),
        ("flags", IOLINK_ENABLED),
    ] {
        let _ = writeln!(s, "{k} {v}");
    }
    Some(s)
}

/// One GPU cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cache {
    processor_id_low: u32,
    level: u32,
    size_kb: u32,
    kind: u32,
    /// CUs (bit i: the entry's first CU + i) sharing it.
    siblings: u32,
}

/// The GPU's caches as `kfd_fill_gpu_cache_info` lists them for GC 9.4.2 (`aldebaran_cache_info`:
/// a 16 KB vector L1 per CU, a 32 KB instruction and a 16 KB scalar cache per 2 CUs, an 8 MB L2
/// per 14 CUs), one entry per group of sharing CUs of each shader array. *Emulator convention:*
/// the CUs of an array are numbered consecutively from the node's `simd_id_base`.
fn caches(g: &Gpu) -> Vec<Cache> {
    let sp = &g.spec;
    let arrays = sp.array_count.max(1);
    let per_array = sp.cu_count / arrays;
    let base = simd_id_base(g.node_id);
    let kinds = [
        (1, 16, CACHE_DATA | CACHE_HSACU, 1),
        (1, 32, CACHE_INST | CACHE_HSACU, 2),
        (1, 16, CACHE_DATA | CACHE_HSACU, 2),
        (2, 8192, CACHE_DATA | CACHE_HSACU, 14),
    ];
    let mut v = Vec::new();
    for (level, size_kb, kind, shared) in kinds {
        for a in 0..arrays {
            let mut cu = 0;
            while cu < per_array {
                let n = shared.min(per_array - cu);
                v.push(Cache {
                    processor_id_low: base + a * per_array + cu,
                    level,
                    size_kb,
                    kind,
                    siblings: (1u32 << n) - 1,
                });
                cu += shared;
            }
        }
    }
    v
}

/// `caches_count` of a node (the CPU node's caches come from the CPU's own sysfs, as on a host
/// without an ACPI CRAT).
pub fn cache_count(kfd: &Kfd, node: u32) -> u32 {
    gpu_of(kfd, node).map_or(0, |g| caches(g).len() as u32)
}

/// `caches/<i>/properties` (`kfd_cache_show`): the sibling map is printed bit by bit, 32 bits
/// (a GPU cache's `sibling_map_size` of 4 bytes).
pub fn cache(kfd: &Kfd, node: u32, i: u32) -> Option<String> {
    let c = *caches(gpu_of(kfd, node)?).get(i as usize)?;
    let mut s = String::new();
    for (k, v) in [
        ("processor_id_low", c.processor_id_low),
        ("level", c.level),
        ("size", c.size_kb),
        ("cache_line_size", if c.level == 2 { 128 } else { 64 }),
        ("cache_lines_per_tag", 0),
        ("association", 0),
        ("latency", 0),
        ("type", c.kind),
    ] {
        let _ = writeln!(s, "{k} {v}");
    }
    let bits: Vec<&str> = (0..32)
        .map(|b| if c.siblings >> b & 1 == 1 { "1" } else { "0" })
        .collect();
    let _ = writeln!(s, "sibling_map {}", bits.join(","));
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::World;

    #[test]
    fn banks_links_and_caches_in_the_kernel_formats() {
        let w = World::new();
        let k = &w.kfd;
        assert_eq!(
            mem_bank(k, 1, 0).unwrap(),
            "heap_type 1\nsize_in_bytes 68719476736\nflags 0\nwidth 4096\nmem_clk_max 1600\n"
        );
        assert!(mem_bank(k, 1, 1).is_none());
        assert!(mem_bank(k, 0, 0).unwrap().starts_with("heap_type 0\n"));
        let l = io_link(k, 1, 0).unwrap();
        assert!(
            l.starts_with(
                "type 2\nversion_major 0\nversion_minor 0\nnode_from 1\nnode_to 0\nweight 20\n"
            ),
            "{l}"
        );
        assert!(io_link(k, 0, 0)
            .unwrap()
            .contains("node_from 0\nnode_to 1\n"));
        assert!(io_link(k, 1, 1).is_none());
        // 104 CUs in 8 arrays of 13: 104 L1, 56 + 56 SQC, 8 L2.
        assert_eq!(cache_count(k, 1), 104 + 56 + 56 + 8);
        assert_eq!(cache_count(k, 0), 0);
        let c = cache(k, 1, 0).unwrap();
        assert!(
            c.starts_with("processor_id_low 2147487744\nlevel 1\nsize 16\n"),
            "{c}"
        );
        assert!(c.ends_with("type 9\nsibling_map 1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0\n"), "{c}");
        let l2 = cache(k, 1, cache_count(k, 1) - 1).unwrap();
        assert!(l2.contains("level 2\nsize 8192\n"), "{l2}");
        assert!(
            l2.contains("sibling_map 1,1,1,1,1,1,1,1,1,1,1,1,1,0,"),
            "{l2}"
        );
    }
}
