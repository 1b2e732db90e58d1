//! The emulated driver's sysfs and debugfs files, in the kernel's formats (kfd_topology.c
//! `node_show`, kfd_process.c procfs, kfd_debugfs.c / `seq_reg_dump` / `seq_hex_dump`).

use std::fmt::Write as _;

use gpreempt_common::kfd::hsa_cap;

use crate::model::{Gpu, Kfd, Process, Queue};
use crate::spec::Model;
use crate::topology;

/// `nodes/<n>/gpu_id`: decimal; 0 for the CPU node.
pub fn node_gpu_id(kfd: &Kfd, node: u32) -> Option<String> {
    if node == 0 {
        return Some("0\n".into());
    }
    kfd.gpus
        .iter()
        .find(|g| g.node_id == node)
        .map(|g| format!("{}\n", g.gpu_id))
}

/// `nodes/<n>/name`: the lower-cased ASIC name ("ip discovery" for IP-discovery parts).
pub fn node_name(kfd: &Kfd, node: u32) -> Option<String> {
    if node == 0 {
        return Some("\n".into());
    }
    let g = kfd.gpus.iter().find(|g| g.node_id == node)?;
    Some(match g.spec.model {
        Model::Mi210 => "aldebaran\n".into(),
        Model::Mi300x => "ip discovery\n".into(),
    })
}

/// A GPU node's `capability`: 4 watch points, doorbell type 2.0 (every SOC15 GPU:
/// `kfd_topology_add_device` sets `HSA_CAP_DOORBELL_TYPE_2_0` in the doorbell-type field, bits
/// 12-13; ROCr takes the 64-bit write-pointer doorbell path only with it), RAS (EDC, event
/// notify), SVM, debugger-capable firmware, and the trap-debug bits
/// `kfd_topology_set_capabilities` (Linux 6.4+) sets on the emulated GPUs (GC 9.4.2 and 9.4.3:
/// precise memory operations too).
pub(crate) const CAPABILITY: u32 =
    0x2838_0280 | hsa_cap::DOORBELL_TYPE_2_0 | hsa_cap::TRAP_DEBUG_GFX9_4_2;

/// `nodes/<n>/properties`, in `node_show`'s order.
pub fn node_properties(kfd: &Kfd, node: u32) -> Option<String> {
    let mut s = String::new();
    let mut p32 = |k: &str, v: u64| {
        let _ = writeln!(s, "{k} {v}");
    };
    if node == 0 {
        let cpu = &kfd.host_cpu;
        for (k, v) in [
            ("cpu_cores_count", u64::from(cpu.cores)),
            ("simd_count", 0),
            ("mem_banks_count", u64::from(topology::mem_banks(kfd, 0))),
            ("caches_count", 0),
            ("io_links_count", u64::from(topology::io_links(kfd, 0))),
            ("p2p_links_count", 0),
            ("cpu_core_id_base", u64::from(cpu.apic_base)),
            ("simd_id_base", 0),
            ("max_waves_per_simd", 0),
            ("lds_size_in_kb", 0),
            ("gds_size_in_kb", 0),
            ("num_gws", 0),
            ("wave_front_size", 0),
            ("array_count", 0),
            ("simd_arrays_per_engine", 0),
            ("cu_per_simd_array", 0),
            ("simd_per_cu", 0),
            ("max_slots_scratch_cu", 0),
            ("gfx_target_version", 0),
            ("vendor_id", 0),
            ("device_id", 0),
            ("location_id", 0),
            ("domain", 0),
            ("drm_render_minor", 0),
            ("hive_id", 0),
            ("num_sdma_engines", 0),
            ("num_sdma_xgmi_engines", 0),
            ("num_sdma_queues_per_engine", 0),
            ("num_cp_queues", 0),
            ("max_engine_clk_ccompute", 2400),
        ] {
            p32(k, v);
        }
        return Some(s);
    }
    let g = kfd.gpus.iter().find(|g| g.node_id == node)?;
    let sp = &g.spec;
    let arrays = sp.array_count;
    for (k, v) in [
        ("cpu_cores_count", 0),
        ("simd_count", u64::from(sp.simd_count())),
        ("mem_banks_count", u64::from(topology::mem_banks(kfd, node))),
        ("caches_count", u64::from(topology::cache_count(kfd, node))),
        ("io_links_count", u64::from(topology::io_links(kfd, node))),
        ("p2p_links_count", 0),
        ("cpu_core_id_base", 0),
        ("simd_id_base", u64::from(topology::simd_id_base(node))),
        ("max_waves_per_simd", u64::from(sp.max_waves_per_simd)),
        ("lds_size_in_kb", u64::from(sp.lds_size_kb)),
        ("gds_size_in_kb", 0),
        ("num_gws", 64),
        ("wave_front_size", 64),
        ("array_count", u64::from(arrays)),
        (
            "simd_arrays_per_engine",
            u64::from(sp.simd_arrays_per_engine),
        ),
        ("cu_per_simd_array", u64::from(sp.cu_count / arrays.max(1))),
        ("simd_per_cu", u64::from(sp.simd_per_cu)),
        ("max_slots_scratch_cu", 32),
        ("gfx_target_version", u64::from(sp.gfx_target_version)),
        ("vendor_id", 0x1002),
        ("device_id", u64::from(sp.device_id)),
        ("location_id", u64::from(g.node_id) << 8),
        ("domain", 0),
        ("drm_render_minor", u64::from(g.render_minor)),
        ("hive_id", 0),
        ("num_sdma_engines", u64::from(sp.num_sdma_engines)),
        ("num_sdma_xgmi_engines", u64::from(sp.num_sdma_xgmi_engines)),
        ("num_sdma_queues_per_engine", 8),
        ("num_cp_queues", u64::from(sp.hqd_slots())),
        ("max_engine_clk_fcompute", u64::from(sp.max_engine_clk_mhz)),
        ("local_mem_size", 0),
        ("fw_version", u64::from(sp.mec_fw_version)),
        ("capability", u64::from(CAPABILITY)),
        ("debug_prop", 0x1_7a),
        ("sdma_fw_version", u64::from(sp.sdma_fw_version)),
        ("unique_id", 0x5a11_0000_0000 | u64::from(g.gpu_id)),
        ("num_xcc", u64::from(sp.num_xcc)),
        ("max_engine_clk_ccompute", 2400),
    ] {
        p32(k, v);
    }
    Some(s)
}

/// `proc/<pid>/pasid`: 0 since the PASID moved to the per-device data.
pub fn proc_pasid() -> String {
    "0\n".into()
}

/// `proc/<pid>/queues/<qid>/size` (no newline).
pub fn queue_size(q: &Queue) -> String {
    format!("{}", q.ring_size)
}
/// `queues/<qid>/type`: the internal queue type (no newline).
pub fn queue_type(q: &Queue) -> String {
    format!("{}", q.internal_type())
}
/// `queues/<qid>/gpuid` (no newline).
pub fn queue_gpuid(q: &Queue) -> String {
    format!("{}", q.gpu_id)
}
/// `proc/<pid>/vram_<gpuid>`.
pub fn vram(p: &Process, gpu_id: u32) -> Option<String> {
    p.pdds.get(&gpu_id).map(|d| format!("{}\n", d.vram_usage))
}
/// `proc/<pid>/sdma_<gpuid>`: SDMA activity (µs); SDMA is not emulated.
pub fn sdma(p: &Process, gpu_id: u32) -> Option<String> {
    p.pdds.get(&gpu_id).map(|_| "0\n".into())
}
/// `stats_<gpuid>/evicted_ms`.
pub fn evicted_ms(p: &Process, gpu_id: u32) -> Option<String> {
    p.pdds.get(&gpu_id).map(|d| format!("{}\n", d.evicted_ms))
}
/// `stats_<gpuid>/cu_occupancy`.
pub fn cu_occupancy(kfd: &Kfd, p: &Process, gpu_id: u32) -> Option<String> {
    let gi = kfd.gpus.iter().position(|g| g.gpu_id == gpu_id)?;
    Some(format!("{}\n", crate::gpu::cu_occupancy(kfd, gi, p.pid)))
}

// ---------------------------------------------------------------------------------------------
// debugfs

/// GC segment 1's base on single-XCC GFX9 parts (inferred, docs/kfd.md).
const GC_BASE_1: u32 = 0xA000;
use gpreempt_common::kfd::gfx9_hqd::{self as reg, CP_MQD_BASE_ADDR, HQD_N_REGS};

/// The GPU address of a queue's MQD (emulated; the kernel allocates it in GTT).
fn mqd_addr(p: &Process, q: &Queue) -> u64 {
    0x0000_7f00_0000_0000 | (u64::from(p.doorbell_slice) << 24) | (u64::from(q.id) << 12)
}

/// The HQD register image of a queue (what the MQD holds and a mapped HQD shows).
pub fn hqd_regs(p: &Process, q: &Queue, vmid: u32, active: bool) -> [u32; HQD_N_REGS] {
    let mut r = [0u32; HQD_N_REGS];
    let mqd = mqd_addr(p, q);
    let lo = |v: u64| v as u32;
    let hi = |v: u64| (v >> 32) as u32;
    r[reg::MQD_BASE_LO] = lo(mqd);
    r[reg::MQD_BASE_HI] = hi(mqd);
    r[reg::ACTIVE] = u32::from(active);
    r[reg::VMID] = vmid;
    r[reg::PERSISTENT_STATE] = 0x0be0_5501;
    r[reg::PIPE_PRIORITY] = q.pipe_priority();
    r[reg::QUEUE_PRIORITY] = q.priority;
    r[reg::QUANTUM] = 0x0000_0a01;
    r[reg::PQ_BASE] = lo(q.ring_base >> 8);
    r[reg::PQ_BASE_HI] = hi(q.ring_base >> 8);
    let size_dw = q.ring_size / 4;
    // CP_HQD_PQ_RPTR counts dwords modulo the ring.
    let read_dw = (q.exec.read_id * 16) as u32;
    r[reg::PQ_RPTR] = if size_dw > 0 { read_dw % size_dw } else { 0 };
    r[reg::PQ_RPTR_REPORT_ADDR] = lo(q.rptr_addr);
    r[reg::PQ_RPTR_REPORT_ADDR_HI] = hi(q.rptr_addr);
    r[reg::PQ_WPTR_POLL_ADDR] = lo(q.wptr_addr);
    r[reg::PQ_WPTR_POLL_ADDR_HI] = hi(q.wptr_addr);
    r[reg::PQ_DOORBELL_CONTROL] = (q.doorbell_off << 2) | (1 << 30);
    r[reg::PQ_CONTROL] = (size_dw.max(2).trailing_zeros() - 1) | (1 << 8) | (1 << 30);
    r[reg::EOP_BASE_ADDR] = lo(q.eop_addr >> 8);
    r[reg::EOP_BASE_ADDR_HI] = hi(q.eop_addr >> 8);
    r[reg::EOP_CONTROL] = (q.eop_size.max(8) / 4).trailing_zeros().saturating_sub(1);
    r[reg::CTX_SAVE_BASE_ADDR_LO] = lo(q.ctx_save_addr);
    r[reg::CTX_SAVE_BASE_ADDR_HI] = hi(q.ctx_save_addr);
    r[reg::CNTL_STACK_SIZE] = q.ctl_stack_size;
    r[reg::CTX_SAVE_SIZE] = q.ctx_save_size;
    r[reg::AQL_CONTROL] = u32::from(q.is_aql());
    // AQL write pointer counts 64-byte packets: the HQD holds it in dwords (x16).
    let wptr = q.exec.write_id * 16;
    r[reg::PQ_WPTR_LO] = lo(wptr);
    r[reg::PQ_WPTR_HI] = hi(wptr);
    r
}

/// `seq_reg_dump`: "    addr: value" with up to 8 values per line while addresses are
/// consecutive; the block ends with a newline.
pub fn seq_reg_dump(out: &mut String, regs: &[(u32, u32)]) {
    let mut count = 0;
    for (i, &(addr, val)) in regs.iter().enumerate() {
        if count == 0 || regs[i - 1].0 + 4 != addr {
            let _ = write!(
                out,
                "{}    {addr:08x}: {val:08x}",
                if i > 0 { "\n" } else { "" }
            );
            count = 7;
        } else {
            let _ = write!(out, " {val:08x}");
            count -= 1;
        }
    }
    out.push('\n');
}

/// `seq_hex_dump(m, prefix, DUMP_PREFIX_OFFSET, 32, 4, buf, len, false)`.
pub fn seq_hex_dump(out: &mut String, prefix: &str, words: &[u32]) {
    for (row, chunk) in words.chunks(8).enumerate() {
        let _ = write!(out, "{prefix}{:08x}:", row * 32);
        for w in chunk {
            let _ = write!(out, " {w:08x}");
        }
        out.push('\n');
    }
}

fn hqd_block(regs: &[u32; HQD_N_REGS]) -> Vec<(u32, u32)> {
    regs.iter()
        .enumerate()
        .map(|(i, &v)| ((GC_BASE_1 + CP_MQD_BASE_ADDR + i as u32) << 2, v))
        .collect()
}

/// The VMID HWS gives a process: in runlist order of processes, from 8 (KFD's first VMID).
fn vmid_of(g: &Gpu, pid: u32) -> u32 {
    let mut pids: Vec<u32> = g.runlist.iter().map(|k| k.0).collect();
    pids.dedup();
    pids.iter()
        .position(|&p| p == pid)
        .map_or(0, |i| 8 + i as u32)
}

/// debugfs `mqds`.
pub fn mqds(kfd: &Kfd) -> String {
    let mut s = String::new();
    for p in kfd.procs.values() {
        // After the PASID rework the header's "PASID" is the pid in hex.
        let _ = writeln!(s, "Process {} PASID 0x{:x}:", p.pid, p.pid);
        let mut order: Vec<&Queue> = p.queues.values().collect();
        order.sort_by_key(|q| std::cmp::Reverse(q.serial));
        for q in order {
            let mut words = vec![0u32; if q.is_compute() { 512 } else { 128 }];
            if q.is_compute() {
                let _ = writeln!(s, "  Compute queue on device {:x}", q.gpu_id);
                let vmid = kfd.gpu(q.gpu_id).map_or(0, |g| vmid_of(g, p.pid));
                words[128..128 + HQD_N_REGS].copy_from_slice(&hqd_regs(p, q, vmid, q.is_active()));
            } else {
                let _ = writeln!(s, "  SDMA queue on device {:x}", q.gpu_id);
                words[0] = (q.ring_size / 4).trailing_zeros() << 1 | 1;
                words[1] = (q.ring_base >> 8) as u32;
                words[2] = (q.ring_base >> 40) as u32;
            }
            seq_hex_dump(&mut s, "    ", &words);
        }
    }
    s
}

/// debugfs `hqds`.
pub fn hqds(kfd: &Kfd) -> String {
    let mut s = String::new();
    for g in &kfd.gpus {
        let _ = writeln!(s, "Node {}, gpu_id {:x}:", g.node_id, g.gpu_id);
        let sp = &g.spec;
        for inst in 0..sp.num_xcc {
            // The HIQ: KFD_CIK_HIQ_PIPE 4 -> MEC 2, pipe 0, queue 0.
            let _ = writeln!(s, "   Inst {inst}, HIQ on MEC 2 Pipe 0 Queue 0");
            let mut hiq = [0u32; HQD_N_REGS];
            hiq[reg::ACTIVE] = 1;
            hiq[reg::PERSISTENT_STATE] = 0x0be0_5501;
            hiq[reg::PQ_CONTROL] = 0x5030_8509;
            seq_reg_dump(&mut s, &hqd_block(&hiq));
            for slot in 0..g.slots.len() {
                let (pipe, queue) = g.pipe_queue(slot);
                let _ = writeln!(s, "   Inst {inst},  CP Pipe {pipe}, Queue {queue}");
                let regs = match g.slots[slot] {
                    Some(k) => match (kfd.procs.get(&k.0), kfd.queue(k)) {
                        (Some(p), Some(q)) => hqd_regs(p, q, vmid_of(g, k.0), true),
                        _ => [0; HQD_N_REGS],
                    },
                    None => [0; HQD_N_REGS],
                };
                seq_reg_dump(&mut s, &hqd_block(&regs));
            }
        }
        // SDMA RLC queues (not emulated: idle registers).
        for engine in 0..sp.num_sdma_engines + sp.num_sdma_xgmi_engines {
            for rlc in 0..8u32 {
                let _ = writeln!(s, "  SDMA Engine {engine}, RLC {rlc}");
                let base = 0x4880 + engine * 0x800 + rlc * 0x80;
                let regs: Vec<(u32, u32)> = (0..19).map(|i| ((base + i) << 2, 0)).collect();
                seq_reg_dump(&mut s, &regs);
            }
        }
    }
    s
}

/// PM4 type-3 header for a packet of `ndw` dwords.
fn pm4(opcode: u32, ndw: u32) -> u32 {
    (3 << 30) | ((ndw - 2) << 16) | (opcode << 8)
}
const PM4_MAP_PROCESS: u32 = 0xA1;
const PM4_MAP_QUEUES: u32 = 0xA2;
const PM4_RUN_LIST: u32 = 0xA5;

/// The runlist IB HWS would run: MAP_PROCESS per process, MAP_QUEUES per queue, and a chained
/// RUN_LIST when oversubscribed.
pub fn runlist_ib(kfd: &Kfd, g: &Gpu) -> Vec<u32> {
    let mut ib = Vec::new();
    let mut last = None;
    for k in &g.runlist {
        let (Some(p), Some(q)) = (kfd.procs.get(&k.0), kfd.queue(*k)) else {
            continue;
        };
        if last != Some(k.0) {
            last = Some(k.0);
            let pasid = p.pdds.get(&g.gpu_id).map_or(0, |d| d.pasid);
            let mut pkt = vec![pm4(PM4_MAP_PROCESS, 15), pasid & 0xffff];
            pkt.extend([0u32; 13]);
            ib.extend(pkt);
        }
        let mqd = mqd_addr(p, q);
        let slot = g.slot_of(*k).unwrap_or(0);
        let (pipe, queue) = g.pipe_queue(slot);
        ib.extend([
            pm4(PM4_MAP_QUEUES, 7),
            (queue << 8) | (pipe << 16) | (1 << 29),
            q.doorbell_off << 2,
            mqd as u32,
            (mqd >> 32) as u32,
            q.wptr_addr as u32,
            (q.wptr_addr >> 32) as u32,
        ]);
    }
    if g.runlist.len() > g.slots.len() {
        ib.extend([pm4(PM4_RUN_LIST, 4), 0, 0, ib.len() as u32 + 4]);
    }
    ib
}

/// debugfs `rls`.
pub fn rls(kfd: &Kfd) -> String {
    let mut s = String::new();
    for g in &kfd.gpus {
        let _ = writeln!(s, "Node {}, gpu_id {:x}:", g.node_id, g.gpu_id);
        if g.runlist.is_empty() {
            s.push_str("  No active runlist\n");
        } else {
            seq_hex_dump(&mut s, "  ", &runlist_ib(kfd, g));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{World, TARGET};

    #[test]
    fn kernel_formats_for_a_known_state() {
        let mut w = World::new();
        w.process(TARGET, true, 1);
        let gpu = w.gpu;
        let k = &w.kfd;
        assert_eq!(node_gpu_id(k, 1).unwrap(), format!("{gpu}\n"));
        assert_eq!(node_gpu_id(k, 0).unwrap(), "0\n");
        assert_eq!(node_name(k, 1).unwrap(), "aldebaran\n");
        let props = node_properties(k, 1).unwrap();
        assert!(
            props.starts_with("cpu_cores_count 0\nsimd_count 416\nmem_banks_count 1\n"),
            "{props}"
        );
        assert!(props.contains("\ngfx_target_version 90010\nvendor_id 4098\ndevice_id 29711\n"));
        assert!(props.ends_with("num_xcc 1\nmax_engine_clk_ccompute 2400\n"));
        let p = &k.procs[&TARGET];
        let q = &p.queues[&0];
        // queues/<qid>/* have no trailing newline; vram has one.
        assert_eq!(
            (queue_size(q), queue_type(q), queue_gpuid(q)),
            ("65536".into(), "0".into(), gpu.to_string())
        );
        assert_eq!(vram(p, gpu).unwrap(), "0\n");
        assert_eq!(proc_pasid(), "0\n");
        let m = mqds(k);
        let mut lines = m.lines();
        assert_eq!(
            lines.next().unwrap(),
            format!("Process {TARGET} PASID 0x{TARGET:x}:")
        );
        assert_eq!(
            lines.next().unwrap(),
            format!("  Compute queue on device {gpu:x}")
        );
        assert_eq!(
            lines.next().unwrap(),
            "    00000000: 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000"
        );
        assert_eq!(m.lines().count(), 2 + 64);
        // MQD dword 136 (0x220) is CP_HQD_PQ_BASE = ring >> 8.
        let row = m.lines().nth(2 + 0x220 / 32).unwrap();
        assert!(
            row.starts_with(&format!(
                "    00000220: {:08x} 00000000 ",
                0x11_0000u64 >> 8
            )),
            "{row}"
        );
        let h = hqds(k);
        let mut lines = h.lines();
        assert_eq!(lines.next().unwrap(), format!("Node 1, gpu_id {gpu:x}:"));
        assert_eq!(
            lines.next().unwrap(),
            "   Inst 0, HIQ on MEC 2 Pipe 0 Queue 0"
        );
        assert!(lines.next().unwrap().starts_with("    00028914: "));
        // The queue sits in pipe 0 queue 0: CP_HQD_ACTIVE = 1 and PQ_BASE = ring >> 8.
        let at = h.find("   Inst 0,  CP Pipe 0, Queue 0\n").unwrap();
        let block: Vec<&str> = h[at..].lines().skip(1).take(7).collect();
        let first: Vec<&str> = block[0].split_whitespace().collect();
        assert_eq!(first[0], "00028914:");
        assert_eq!(first[3], "00000001", "CP_HQD_ACTIVE");
        let second: Vec<&str> = block[1].split_whitespace().collect();
        assert_eq!(second[0], "00028934:");
        assert_eq!(
            second[1],
            format!("{:08x}", 0x11_0000u64 >> 8),
            "CP_HQD_PQ_BASE"
        );
        assert!(h.contains("   Inst 0,  CP Pipe 3, Queue 7\n"));
        assert!(h.contains("  SDMA Engine 4, RLC 7\n"));
        let r = rls(k);
        assert!(
            r.starts_with(&format!("Node 1, gpu_id {gpu:x}:\n  00000000: c00da100 ")),
            "{r}"
        );
    }

    #[test]
    fn reg_dump_breaks_lines_at_eight_and_at_gaps() {
        let mut s = String::new();
        let regs: Vec<(u32, u32)> = (0..9)
            .map(|i| (0x100 + 4 * i, i))
            .chain([(0x200, 9)])
            .collect();
        seq_reg_dump(&mut s, &regs);
        assert_eq!(
            s,
            "    00000100: 00000000 00000001 00000002 00000003 00000004 00000005 00000006 00000007\n    00000120: 00000008\n    00000200: 00000009\n"
        );
        let mut s = String::new();
        seq_hex_dump(&mut s, "  ", &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(s, "  00000000: 00000001 00000002 00000003 00000004 00000005 00000006 00000007 00000008\n  00000020: 00000009\n");
    }
}
