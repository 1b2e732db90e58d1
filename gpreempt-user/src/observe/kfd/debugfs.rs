//! debugfs `hqds` (live HQD registers per slot: which queue sits in which hardware slot) and `mqds`
//! (each process's queue descriptors), in `dqm_debugfs_hqds` / `pqm_debugfs_mqds` formats.
//!
//! Register indices are GFX9's (`gfx9_hqd`); other generations parse but give no fields.

use anyhow::{bail, Result};
use gpreempt_common::kfd::{gfx9_hqd as reg, DOORBELL_PROCESS_SLICE_BYTES};
use serde::Serialize;

/// A register image in dump order (index 0 = CP_MQD_BASE_ADDR).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Regs(pub Vec<u32>);

impl Regs {
    /// The image a GFX9 slot shows for a mapped queue (the inverse of the accessors below; tests
    /// and the load benchmark build dumps with it): active, ring, user rptr/wptr addresses,
    /// doorbell dword index with DOORBELL_EN, ring size.
    pub fn mapped(ring: u64, rptr: u64, wptr: u64, doorbell_dw: u32, ring_size: u64) -> Self {
        let mut r = vec![0u32; reg::HQD_N_REGS];
        let lo = |v: u64| v as u32;
        let hi = |v: u64| (v >> 32) as u32;
        r[reg::ACTIVE] = 1;
        r[reg::PQ_BASE] = lo(ring >> 8);
        r[reg::PQ_BASE_HI] = hi(ring >> 8);
        r[reg::PQ_RPTR_REPORT_ADDR] = lo(rptr);
        r[reg::PQ_RPTR_REPORT_ADDR_HI] = hi(rptr);
        r[reg::PQ_WPTR_POLL_ADDR] = lo(wptr);
        r[reg::PQ_WPTR_POLL_ADDR_HI] = hi(wptr);
        r[reg::PQ_DOORBELL_CONTROL] =
            ((doorbell_dw << reg::DOORBELL_OFFSET_SHIFT) & reg::DOORBELL_OFFSET_MASK) | (1 << 30);
        // log2(ring size in dwords) - 1.
        r[reg::PQ_CONTROL] = (ring_size / 4).max(2).trailing_zeros() - 1;
        Self(r)
    }

    fn get(&self, i: usize) -> Option<u32> {
        (self.0.len() == reg::HQD_N_REGS).then(|| self.0[i])
    }
    fn get64(&self, lo: usize, hi: usize) -> Option<u64> {
        Some(u64::from(self.get(lo)?) | (u64::from(self.get(hi)?) << 32))
    }
    /// CP_HQD_ACTIVE bit 0.
    pub fn active(&self) -> bool {
        self.get(reg::ACTIVE).is_some_and(|v| v & 1 != 0)
    }
    /// Ring VA (CP_HQD_PQ_BASE << 8).
    pub fn ring_base(&self) -> Option<u64> {
        Some(self.get64(reg::PQ_BASE, reg::PQ_BASE_HI)? << 8)
    }
    pub fn rptr_addr(&self) -> Option<u64> {
        self.get64(reg::PQ_RPTR_REPORT_ADDR, reg::PQ_RPTR_REPORT_ADDR_HI)
    }
    pub fn wptr_addr(&self) -> Option<u64> {
        self.get64(reg::PQ_WPTR_POLL_ADDR, reg::PQ_WPTR_POLL_ADDR_HI)
    }
    /// DOORBELL_OFFSET: dword index in the doorbell BAR (`q->properties.doorbell_off`).
    pub fn doorbell_dw(&self) -> Option<u32> {
        Some(
            (self.get(reg::PQ_DOORBELL_CONTROL)? & reg::DOORBELL_OFFSET_MASK)
                >> reg::DOORBELL_OFFSET_SHIFT,
        )
    }
    /// The queue's byte offset in its process doorbell slice: the low bits of CREATE_QUEUE's
    /// `doorbell_offset`.
    pub fn doorbell_in_slice(&self) -> Option<u64> {
        Some((u64::from(self.doorbell_dw()?) * 4) & (DOORBELL_PROCESS_SLICE_BYTES - 1))
    }
    pub fn vmid(&self) -> Option<u32> {
        self.get(reg::VMID)
    }
    pub fn queue_priority(&self) -> Option<u32> {
        self.get(reg::QUEUE_PRIORITY)
    }
    /// Ring size in bytes from CP_HQD_PQ_CONTROL (low 6 bits: log2(dwords) - 1).
    pub fn ring_size(&self) -> Option<u64> {
        let log = (self.get(reg::PQ_CONTROL)? & 0x3f) + 1;
        Some(4u64 << log)
    }
    /// CP_HQD_PQ_WPTR: dwords (AQL: packets x 16).
    pub fn wptr_dw(&self) -> Option<u64> {
        self.get64(reg::PQ_WPTR_LO, reg::PQ_WPTR_HI)
    }
}

/// One compute HQD slot: ` Inst I,  CP Pipe P, Queue Q`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HqdSlot {
    pub inst: u32,
    pub pipe: u32,
    pub queue: u32,
    pub regs: Regs,
}

/// Slot coordinates shown to users.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HqdId {
    pub inst: u32,
    pub pipe: u32,
    pub queue: u32,
}

impl std::fmt::Display for HqdId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.inst, self.pipe, self.queue)
    }
}

impl HqdSlot {
    pub fn id(&self) -> HqdId {
        HqdId {
            inst: self.inst,
            pipe: self.pipe,
            queue: self.queue,
        }
    }
}

/// One node of `hqds`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HqdNode {
    pub node: u32,
    pub gpu_id: u32,
    /// "Device is stopped": the scheduler is not running (e.g. during reset or suspend).
    pub stopped: bool,
    /// Compute slots KFD owns (the HIQ and SDMA blocks are not included).
    pub slots: Vec<HqdSlot>,
}

/// Parse error with the 1-based line it is about.
fn err<T>(line: usize, msg: impl std::fmt::Display) -> Result<T> {
    bail!("line {line}: {msg}")
}

/// `    %08x: %08x %08x ...` -> (address, values).
fn reg_line(l: &str) -> Option<(u32, Vec<u32>)> {
    let (addr, rest) = l.trim_start().split_once(':')?;
    let addr = u32::from_str_radix(addr, 16).ok()?;
    let vals = rest
        .split_whitespace()
        .map(|w| u32::from_str_radix(w, 16).ok())
        .collect::<Option<Vec<u32>>>()?;
    Some((addr, vals))
}

/// ` Inst %d,  CP Pipe %d, Queue %d`.
fn slot_header(l: &str) -> Option<(u32, u32, u32)> {
    let l = l.trim();
    let rest = l.strip_prefix("Inst ")?;
    let (inst, rest) = rest.split_once(',')?;
    let rest = rest.trim_start().strip_prefix("CP Pipe ")?;
    let (pipe, rest) = rest.split_once(',')?;
    let q = rest.trim_start().strip_prefix("Queue ")?;
    Some((
        inst.parse().ok()?,
        pipe.parse().ok()?,
        q.trim().parse().ok()?,
    ))
}

/// `Node %u, gpu_id %x:`.
fn node_header(l: &str) -> Option<(u32, u32)> {
    let rest = l.strip_prefix("Node ")?;
    let (node, rest) = rest.split_once(',')?;
    let id = rest.trim().strip_prefix("gpu_id ")?.strip_suffix(':')?;
    Some((node.parse().ok()?, u32::from_str_radix(id, 16).ok()?))
}

/// Parses `hqds`. Unknown lines (HIQ and SDMA headers and their blocks) are skipped; a register
/// line that does not parse is an error: the format changed and matching would be wrong.
pub fn parse_hqds(text: &str) -> Result<Vec<HqdNode>> {
    let mut nodes: Vec<HqdNode> = Vec::new();
    // Whether register lines currently belong to a compute slot.
    let mut in_slot = false;
    let mut last_addr: Option<u32> = None;
    for (i, l) in text.lines().enumerate() {
        let n = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        if let Some((node, gpu_id)) = node_header(l) {
            nodes.push(HqdNode {
                node,
                gpu_id,
                ..Default::default()
            });
            in_slot = false;
            continue;
        }
        let Some(cur) = nodes.last_mut() else {
            return err(n, format!("expected \"Node N, gpu_id X:\", found {l:?}"));
        };
        if l.trim() == "Device is stopped" {
            cur.stopped = true;
            continue;
        }
        if let Some((inst, pipe, queue)) = slot_header(l) {
            cur.slots.push(HqdSlot {
                inst,
                pipe,
                queue,
                regs: Regs::default(),
            });
            in_slot = true;
            last_addr = None;
            continue;
        }
        if let Some((addr, vals)) = reg_line(l) {
            if !in_slot {
                continue;
            }
            let Some(slot) = cur.slots.last_mut() else {
                continue;
            };
            // A gap in addresses starts a new line in seq_reg_dump; the image is the run of
            // consecutive registers.
            if last_addr.is_some_and(|a| a != addr) {
                return err(n, format!("register address {addr:#x} is not consecutive"));
            }
            last_addr = Some(addr + 4 * vals.len() as u32);
            slot.regs.0.extend(vals);
            continue;
        }
        // HIQ / SDMA headers and anything newer: their blocks are not compute slots.
        if l.contains(':')
            && !l
                .trim_start()
                .starts_with(|c: char| c.is_ascii_alphabetic())
        {
            return err(n, format!("unreadable register line {l:?}"));
        }
        in_slot = false;
    }
    Ok(nodes)
}

/// Kind of an `mqds` queue line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MqdKind {
    Compute,
    Sdma,
    Other,
}

/// One queue descriptor of `mqds` (no queue id: the kernel does not print it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqdQueue {
    pub gpu_id: u32,
    pub kind: MqdKind,
    /// Compute: the first XCC's register image (MQD dwords 128..184); stale while mapped.
    pub regs: Regs,
}

/// A process block of `mqds`, queues in the kernel's list order (newest first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqdProcess {
    pub pid: u32,
    pub queues: Vec<MqdQueue>,
}

/// Parses `mqds`.
pub fn parse_mqds(text: &str) -> Result<Vec<MqdProcess>> {
    let mut procs: Vec<MqdProcess> = Vec::new();
    let mut words: Vec<u32> = Vec::new();
    let finish = |procs: &mut Vec<MqdProcess>, words: &mut Vec<u32>| {
        if let Some(q) = procs.last_mut().and_then(|p| p.queues.last_mut()) {
            if q.kind == MqdKind::Compute && q.regs.0.is_empty() {
                let start = reg::MQD_REG_DWORD;
                if words.len() >= start + reg::HQD_N_REGS {
                    q.regs = Regs(words[start..start + reg::HQD_N_REGS].to_vec());
                }
            }
        }
        words.clear();
    };
    for (i, l) in text.lines().enumerate() {
        let n = i + 1;
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("Process ") {
            finish(&mut procs, &mut words);
            let pid = rest.split_whitespace().next().and_then(|p| p.parse().ok());
            let Some(pid) = pid else {
                return err(n, format!("unreadable process header {l:?}"));
            };
            procs.push(MqdProcess {
                pid,
                queues: Vec::new(),
            });
            continue;
        }
        let kind = if t.starts_with("Compute queue on device ") {
            Some(MqdKind::Compute)
        } else if t.starts_with("SDMA queue on device ") {
            Some(MqdKind::Sdma)
        } else if t.contains("on device ") || t.starts_with("Weird") || t.starts_with("Bad ") {
            Some(MqdKind::Other)
        } else {
            None
        };
        if let Some(kind) = kind {
            finish(&mut procs, &mut words);
            let gpu_id = t
                .rsplit_once("on device ")
                .and_then(|(_, id)| u32::from_str_radix(id.trim(), 16).ok())
                .unwrap_or(0);
            let Some(p) = procs.last_mut() else {
                return err(n, "queue line before any \"Process\" line");
            };
            p.queues.push(MqdQueue {
                gpu_id,
                kind,
                regs: Regs::default(),
            });
            continue;
        }
        match reg_line(l) {
            Some((off, vals)) => {
                // Multi-XCC parts dump one MQD per XCC back to back: keep the first.
                if off as usize / 4 == words.len() {
                    words.extend(vals);
                } else if off == 0 && !words.is_empty() {
                    finish(&mut procs, &mut words);
                }
            }
            None => return err(n, format!("unreadable line {l:?}")),
        }
    }
    finish(&mut procs, &mut words);
    Ok(procs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hqds_slots_and_fields() {
        let mut regs = vec![0u32; 56];
        regs[reg::ACTIVE] = 1;
        regs[reg::VMID] = 8;
        regs[reg::PQ_BASE] = 0x7f12_3400 >> 8;
        regs[reg::PQ_BASE_HI] = 0;
        regs[reg::PQ_RPTR_REPORT_ADDR] = 0x5080;
        regs[reg::PQ_WPTR_POLL_ADDR] = 0x5038;
        regs[reg::PQ_DOORBELL_CONTROL] = ((2048 + 6) << 2) | (1 << 30);
        regs[reg::PQ_CONTROL] = 9 | (1 << 8);
        // The encoder the tests and the load benchmark use gives the same image.
        let mut m = Regs::mapped(0x7f12_3400, 0x5080, 0x5038, 2048 + 6, 4096).0;
        m[reg::VMID] = 8;
        m[reg::PQ_CONTROL] |= 1 << 8;
        assert_eq!(m, regs);
        let mut text =
            String::from("Node 1, gpu_id 3039:\n   Inst 0, HIQ on MEC 2 Pipe 0 Queue 0\n");
        text += "    00028914: 00000000 00000001\n\n";
        text += " Inst 0,  CP Pipe 1, Queue 2\n";
        for (row, c) in regs.chunks(8).enumerate() {
            text += &format!("    {:08x}:", 0x28914 + row * 32);
            for v in c {
                text += &format!(" {v:08x}");
            }
            text += "\n";
        }
        text += "\n  SDMA Engine 0, RLC 0\n    00012200: 00000000\n\n";
        let nodes = parse_hqds(&text).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].gpu_id, 0x3039);
        assert_eq!(nodes[0].slots.len(), 1);
        let s = &nodes[0].slots[0];
        assert_eq!(s.id().to_string(), "0.1.2");
        assert!(s.regs.active());
        assert_eq!(s.regs.ring_base(), Some(0x7f12_3400));
        assert_eq!(s.regs.rptr_addr(), Some(0x5080));
        assert_eq!(s.regs.wptr_addr(), Some(0x5038));
        assert_eq!(s.regs.doorbell_dw(), Some(2054));
        assert_eq!(s.regs.doorbell_in_slice(), Some(24));
        assert_eq!(s.regs.ring_size(), Some(4096));
        assert_eq!(s.regs.vmid(), Some(8));

        let e = parse_hqds("    00028914: 0000zz00\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("line 1:"), "{e}");
        let e =
            parse_hqds("Node 1, gpu_id 1:\n Inst 0,  CP Pipe 0, Queue 0\n    00000000: nothex\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("line 3: unreadable register line"), "{e}");
    }
}
