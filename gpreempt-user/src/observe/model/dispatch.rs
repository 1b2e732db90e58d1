//! The dispatch mix of a queue: what its AQL packets asked of the GPU, from the packets the
//! sampler decoded while they were pending. Bounded whatever the process does: a fixed number of
//! size buckets, at most [`GROUP_SIZES_MAX`] work-group sizes and [`KERNELS_MAX`] kernel
//! objects (the rest counted), the last [`RECENT_MAX`] packets.

use std::collections::{BTreeMap, VecDeque};

use gpreempt_common::aql::PacketKind;
use serde::Serialize;

use crate::observe::kfd::codeobj::KernelNames;

/// Kernel objects tracked per queue; later ones are counted under `other_kernels`.
pub const KERNELS_MAX: usize = 256;
/// Distinct work-group sizes tracked per queue; dispatches of later ones are counted under
/// `other_group_sizes` (a process writes its own packets: a group size is 16 bits per dimension,
/// so it could make the map grow by 2^48 entries).
pub const GROUP_SIZES_MAX: usize = 64;
/// Packets kept for the detail view.
pub const RECENT_MAX: usize = 32;
/// Log2 buckets of work-items per grid: bucket i holds grids of [2^i, 2^(i+1)) work-items.
pub const SIZE_BUCKETS: usize = 33;

/// How often one kernel object was dispatched, and its last geometry.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelCount {
    pub count: u64,
    /// Its name from the process's code objects (docs/kfd.md), when known.
    pub name: Option<String>,
    pub grid: [u32; 3],
    pub workgroup: [u16; 3],
}

/// One AQL packet read from a queue's ring while it was still pending (written, not consumed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeenPacket {
    /// The packet's index in the queue (its dispatch id).
    pub dispatch_id: u64,
    pub packet: gpreempt_common::aql::Packet,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DispatchMix {
    /// Packets decoded (each once).
    pub decoded: u64,
    /// Packets the read id says were consumed while the queue was sampled: `decoded / consumed`
    /// is the coverage (packets written and consumed between two ticks are not seen).
    pub consumed: u64,
    pub kernel_dispatches: u64,
    pub barriers: u64,
    /// Agent-dispatch and vendor-specific packets.
    pub other_packets: u64,
    /// Kernel dispatches by log2 of their grid's work-items (index = bucket).
    pub grid_log2: Vec<u64>,
    /// Kernel dispatches by work-items per work-group (at most [`GROUP_SIZES_MAX`] sizes).
    pub group_sizes: BTreeMap<u64, u64>,
    /// Kernel dispatches whose group size came after the map was full.
    pub other_group_sizes: u64,
    /// By kernel object (its descriptor's address).
    pub kernels: BTreeMap<u64, KernelCount>,
    pub other_kernels: u64,
    #[serde(skip)]
    pub recent: VecDeque<SeenPacket>,
    /// Kernel objects without a name: kept so the name reader's check each tick is O(1).
    #[serde(skip)]
    unnamed: usize,
}

impl DispatchMix {
    /// Names kernels not named yet from `names`.
    pub fn name_from(&mut self, names: &KernelNames) {
        for (o, k) in self.kernels.iter_mut().filter(|(_, k)| k.name.is_none()) {
            k.name = names.get(*o).map(str::to_owned);
        }
        self.unnamed = self.kernels.values().filter(|k| k.name.is_none()).count();
    }

    /// Counts a packet; a new kernel object takes its name from `names` when there.
    pub fn add(&mut self, p: &SeenPacket, names: &KernelNames) {
        self.decoded += 1;
        let d = &p.packet;
        match d.kind {
            PacketKind::KernelDispatch => {
                self.kernel_dispatches += 1;
                if self.grid_log2.is_empty() {
                    self.grid_log2 = vec![0; SIZE_BUCKETS];
                }
                let bucket = (63 - d.work_items().max(1).leading_zeros()) as usize;
                self.grid_log2[bucket.min(SIZE_BUCKETS - 1)] += 1;
                let groups_full = self.group_sizes.len() >= GROUP_SIZES_MAX;
                match self.group_sizes.get_mut(&d.group_size()) {
                    Some(n) => *n += 1,
                    None if groups_full => self.other_group_sizes += 1,
                    None => {
                        self.group_sizes.insert(d.group_size(), 1);
                    }
                }
                let full = self.kernels.len() >= KERNELS_MAX;
                match self.kernels.get_mut(&d.kernel_object) {
                    Some(k) => {
                        k.count += 1;
                        k.grid = d.grid;
                        k.workgroup = d.workgroup;
                    }
                    None if full => self.other_kernels += 1,
                    None => {
                        let name = names.get(d.kernel_object).map(str::to_owned);
                        self.unnamed += usize::from(name.is_none());
                        self.kernels.insert(
                            d.kernel_object,
                            KernelCount {
                                count: 1,
                                name,
                                grid: d.grid,
                                workgroup: d.workgroup,
                            },
                        );
                    }
                }
            }
            PacketKind::BarrierAnd | PacketKind::BarrierOr => self.barriers += 1,
            PacketKind::AgentDispatch | PacketKind::VendorSpecific => self.other_packets += 1,
        }
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(*p);
    }

    /// Kernel objects without a name yet.
    pub fn unnamed(&self) -> usize {
        self.unnamed
    }

    /// The most dispatched kernels, most first (ties by object address).
    pub fn top_kernels(&self, n: usize) -> Vec<(u64, &KernelCount)> {
        let mut v: Vec<(u64, &KernelCount)> = self.kernels.iter().map(|(o, k)| (*o, k)).collect();
        v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Decoded share of the consumed packets (None before anything was consumed).
    pub fn coverage(&self) -> Option<f64> {
        (self.consumed > 0).then(|| (self.decoded as f64 / self.consumed as f64).min(1.0))
    }
}

/// `1K`, `256K`, `4M`: a power of two for a bucket's lower bound.
pub fn pow2_label(log2: usize) -> String {
    match log2 {
        0..=9 => (1u64 << log2).to_string(),
        10..=19 => format!("{}K", 1u64 << (log2 - 10)),
        20..=29 => format!("{}M", 1u64 << (log2 - 20)),
        _ => format!("{}G", 1u64 << (log2.min(39) - 30)),
    }
}

/// A kernel dispatch packet as the sampler decodes it (tests).
#[cfg(test)]
pub(crate) fn kd(id: u64, object: u64, work_items: u32, group: u16) -> SeenPacket {
    use gpreempt_common::aql::Packet;
    SeenPacket {
        dispatch_id: id,
        packet: Packet {
            kind: PacketKind::KernelDispatch,
            barrier: true,
            workgroup: [group, 1, 1],
            grid: [work_items, 1, 1],
            private_segment_size: 0,
            group_segment_size: 0,
            kernel_object: object,
        },
    }
}

#[cfg(test)]
mod tests {
    use gpreempt_common::aql::Packet;

    use super::*;

    #[test]
    fn counts_sizes_kernels_and_barriers_within_bounds() {
        let mut m = DispatchMix::default();
        let none = KernelNames::default();
        m.add(&kd(0, 0xa0, 262_144, 256), &none);
        m.add(&kd(1, 0xa0, 262_144, 256), &none);
        m.add(&kd(2, 0xb0, 512, 64), &none);
        m.add(
            &SeenPacket {
                dispatch_id: 3,
                packet: Packet {
                    kind: PacketKind::BarrierAnd,
                    ..kd(3, 0, 1, 1).packet
                },
            },
            &none,
        );
        assert_eq!((m.decoded, m.kernel_dispatches, m.barriers), (4, 3, 1));
        assert_eq!(m.grid_log2[18], 2, "262144 = 2^18");
        assert_eq!(m.grid_log2[9], 1, "512 = 2^9");
        assert_eq!(m.group_sizes.get(&256), Some(&2));
        let top = m.top_kernels(1);
        assert_eq!((top[0].0, top[0].1.count), (0xa0, 2));
        assert_eq!(m.unnamed(), 2);
        m.name_from(&BTreeMap::from([(0xa0, "conv".to_string())]).into());
        assert_eq!(m.kernels[&0xa0].name.as_deref(), Some("conv"));
        assert_eq!(m.unnamed(), 1);
        assert_eq!(m.kernels[&0xb0].name, None);
        assert_eq!(m.coverage(), None);
        m.consumed = 8;
        assert_eq!(m.coverage(), Some(0.5));

        for i in 0..(KERNELS_MAX as u64 + 10) {
            m.add(&kd(10 + i, 0x1000 + i, 64, 64), &none);
        }
        assert_eq!(m.kernels.len(), KERNELS_MAX);
        assert_eq!(m.other_kernels, 12, "2 objects were there before");
        assert_eq!(m.recent.len(), RECENT_MAX);
        assert_eq!(pow2_label(18), "256K");

        // Work-group sizes: bounded too, the rest counted.
        let mut m = DispatchMix::default();
        for i in 0..10_000u64 {
            m.add(&kd(i, 0xa0, 4096, 1 + (i % 5000) as u16), &none);
        }
        assert_eq!(m.group_sizes.len(), GROUP_SIZES_MAX);
        assert_eq!(
            m.group_sizes.values().sum::<u64>() + m.other_group_sizes,
            10_000
        );
        assert_eq!(
            m.group_sizes.get(&1),
            Some(&2),
            "a tracked size still counts"
        );
        assert_eq!(pow2_label(9), "512");
        assert_eq!(pow2_label(20), "1M");
    }
}
