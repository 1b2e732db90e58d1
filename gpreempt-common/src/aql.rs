//! ROCr's `amd_queue_t` (amd_hsa_queue.h): where an AQL queue's dispatch ids live in the owning
//! process's memory. CREATE_QUEUE's `read_pointer_address` / `write_pointer_address` point into it
//! (docs/kfd.md).

/// Byte offsets inside `amd_queue_t` (256 bytes, 64-byte aligned).
pub mod amd_queue {
    pub const SIZE: usize = 256;
    /// `hsa_queue_t.base_address`: the ring's VA.
    pub const BASE_ADDRESS: usize = 0x08;
    /// `hsa_queue_t.size`: ring size in packets (power of two).
    pub const SIZE_PACKETS: usize = 0x18;
    /// Producer index in packets (bumped when a slot is reserved).
    pub const WRITE_DISPATCH_ID: usize = 0x38;
    /// Consumer index in packets (written by the CP; 64-bit, never wraps).
    pub const READ_DISPATCH_ID: usize = 0x80;
    /// Always 0x80 (= READ_DISPATCH_ID): a cheap signature.
    pub const READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET: usize = 0x88;
}

/// Bytes of one AQL packet.
pub const PACKET_BYTES: usize = 64;

/// AQL packet header and packet layouts (HSA runtime `hsa.h`: `hsa_packet_header_t`,
/// `hsa_kernel_dispatch_packet_t`, `hsa_barrier_and_packet_t`; docs/kfd.md "AQL packets").
pub mod packet {
    /// Header bits 0..8: the packet type.
    pub const TYPE_VENDOR_SPECIFIC: u8 = 0;
    /// A slot the packet processor handed back (or never given): not a packet.
    pub const TYPE_INVALID: u8 = 1;
    pub const TYPE_KERNEL_DISPATCH: u8 = 2;
    pub const TYPE_BARRIER_AND: u8 = 3;
    pub const TYPE_AGENT_DISPATCH: u8 = 4;
    pub const TYPE_BARRIER_OR: u8 = 5;
    /// Header bit 8: the packet waits for every earlier packet of its queue to complete.
    pub const BARRIER_BIT: u16 = 1 << 8;

    /// `hsa_kernel_dispatch_packet_t` byte offsets.
    pub const HEADER: usize = 0;
    /// u16: dimensions in bits 0..2.
    pub const SETUP: usize = 2;
    /// u16 x 3.
    pub const WORKGROUP_SIZE: usize = 4;
    /// u32 x 3: work-items, not work-groups.
    pub const GRID_SIZE: usize = 12;
    pub const PRIVATE_SEGMENT_SIZE: usize = 24;
    pub const GROUP_SEGMENT_SIZE: usize = 28;
    /// u64: the address of the kernel descriptor in the process.
    pub const KERNEL_OBJECT: usize = 32;
    pub const KERNARG_ADDRESS: usize = 40;
    pub const COMPLETION_SIGNAL: usize = 56;
}

/// What one AQL packet is, as far as an observer needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    KernelDispatch,
    BarrierAnd,
    BarrierOr,
    AgentDispatch,
    VendorSpecific,
}

impl PacketKind {
    /// The kind of a header; None for INVALID and types the HSA spec does not define.
    pub fn from_header(header: u16) -> Option<Self> {
        match (header & 0xff) as u8 {
            packet::TYPE_KERNEL_DISPATCH => Some(Self::KernelDispatch),
            packet::TYPE_BARRIER_AND => Some(Self::BarrierAnd),
            packet::TYPE_BARRIER_OR => Some(Self::BarrierOr),
            packet::TYPE_AGENT_DISPATCH => Some(Self::AgentDispatch),
            packet::TYPE_VENDOR_SPECIFIC => Some(Self::VendorSpecific),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::KernelDispatch => "kernel_dispatch",
            Self::BarrierAnd => "barrier_and",
            Self::BarrierOr => "barrier_or",
            Self::AgentDispatch => "agent_dispatch",
            Self::VendorSpecific => "vendor_specific",
        }
    }
}

/// A decoded packet: the kernel dispatch fields are zero for the other kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub kind: PacketKind,
    pub barrier: bool,
    pub workgroup: [u16; 3],
    pub grid: [u32; 3],
    pub private_segment_size: u32,
    pub group_segment_size: u32,
    pub kernel_object: u64,
}

impl Packet {
    /// Decodes a slot; None for an INVALID (consumed or not yet written) or undefined header.
    pub fn decode(p: &[u8; PACKET_BYTES]) -> Option<Self> {
        let u16at = |o: usize| u16::from_le_bytes([p[o], p[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        let header = u16at(packet::HEADER);
        let kind = PacketKind::from_header(header)?;
        let barrier = header & packet::BARRIER_BIT != 0;
        if kind != PacketKind::KernelDispatch {
            return Some(Self {
                kind,
                barrier,
                workgroup: [0; 3],
                grid: [0; 3],
                private_segment_size: 0,
                group_segment_size: 0,
                kernel_object: 0,
            });
        }
        let mut obj = [0u8; 8];
        obj.copy_from_slice(&p[packet::KERNEL_OBJECT..packet::KERNEL_OBJECT + 8]);
        let w = packet::WORKGROUP_SIZE;
        let g = packet::GRID_SIZE;
        Some(Self {
            kind,
            barrier,
            workgroup: [u16at(w), u16at(w + 2), u16at(w + 4)],
            grid: [u32at(g), u32at(g + 4), u32at(g + 8)],
            private_segment_size: u32at(packet::PRIVATE_SEGMENT_SIZE),
            group_segment_size: u32at(packet::GROUP_SEGMENT_SIZE),
            kernel_object: u64::from_le_bytes(obj),
        })
    }

    /// Work-items in the grid (grid sizes count work-items in HSA).
    pub fn work_items(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g.max(1))).product()
    }

    /// Work-items per work-group.
    pub fn group_size(&self) -> u64 {
        self.workgroup
            .iter()
            .map(|&w| u64::from(w.max(1)))
            .product()
    }

    /// Work-groups in the grid (partial groups count).
    pub fn workgroups(&self) -> u64 {
        (0..3)
            .map(|i| u64::from(self.grid[i].max(1)).div_ceil(u64::from(self.workgroup[i].max(1))))
            .product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dispatch_and_barrier_packets_decode() {
        let mut p = [0u8; PACKET_BYTES];
        p[0..2].copy_from_slice(&(2u16 | packet::BARRIER_BIT).to_le_bytes());
        p[4..6].copy_from_slice(&256u16.to_le_bytes());
        p[6..8].copy_from_slice(&1u16.to_le_bytes());
        p[8..10].copy_from_slice(&1u16.to_le_bytes());
        p[12..16].copy_from_slice(&262_144u32.to_le_bytes());
        p[16..20].copy_from_slice(&1u32.to_le_bytes());
        p[20..24].copy_from_slice(&1u32.to_le_bytes());
        p[24..28].copy_from_slice(&64u32.to_le_bytes());
        p[28..32].copy_from_slice(&4096u32.to_le_bytes());
        p[32..40].copy_from_slice(&0x7f00_1234_5000u64.to_le_bytes());
        let d = Packet::decode(&p).unwrap();
        assert_eq!(d.kind, PacketKind::KernelDispatch);
        assert!(d.barrier);
        assert_eq!(d.grid, [262_144, 1, 1]);
        assert_eq!(d.workgroup, [256, 1, 1]);
        assert_eq!((d.private_segment_size, d.group_segment_size), (64, 4096));
        assert_eq!(d.kernel_object, 0x7f00_1234_5000);
        assert_eq!(
            (d.work_items(), d.group_size(), d.workgroups()),
            (262_144, 256, 1024)
        );
        // A partial last group still counts.
        p[12..16].copy_from_slice(&257u32.to_le_bytes());
        assert_eq!(Packet::decode(&p).unwrap().workgroups(), 2);

        p[0..2].copy_from_slice(&3u16.to_le_bytes());
        let b = Packet::decode(&p).unwrap();
        assert_eq!(
            (b.kind, b.barrier, b.kernel_object),
            (PacketKind::BarrierAnd, false, 0)
        );
        p[0..2].copy_from_slice(&(1u16 | packet::BARRIER_BIT).to_le_bytes());
        assert_eq!(Packet::decode(&p), None, "INVALID is no packet");
        p[0..2].copy_from_slice(&6u16.to_le_bytes());
        assert_eq!(Packet::decode(&p), None, "undefined type");
    }
}
