//! The AQL pieces the emulated GPU and the workloads share: `amd_queue_t` offsets and the 64-byte
//! kernel dispatch packet (HSA spec layout).
//!
//! Emulator convention: a dispatch packet's `reserved2` carries the kernel's duration in ns when it
//! runs alone; the CUs it wants follow from its own geometry (work-groups x waves per group).

use gpreempt_common::aql::packet;
pub use gpreempt_common::aql::{amd_queue, PACKET_BYTES};
pub const PACKET_TYPE_INVALID: u16 = packet::TYPE_INVALID as u16;
pub const PACKET_TYPE_KERNEL_DISPATCH: u16 = packet::TYPE_KERNEL_DISPATCH as u16;
pub const PACKET_TYPE_BARRIER_AND: u16 = packet::TYPE_BARRIER_AND as u16;
pub const PACKET_TYPE_BARRIER_OR: u16 = packet::TYPE_BARRIER_OR as u16;
/// Header bit: wait for the previous packet to finish (PyTorch streams run in order).
pub const PACKET_BARRIER_BIT: u16 = packet::BARRIER_BIT;
pub const WAVE_SIZE: u32 = 64;
/// `amd_signal_t` (amd_hsa_signal.h in ROCR-Runtime): `kind` at 0, `value` at 8,
/// `event_mailbox_ptr` at 16, `event_id` (u32) at 24; an `hsa_signal_t` handle is its address.
pub const SIGNAL_VALUE: u64 = 8;
pub const SIGNAL_EVENT_MAILBOX: u64 = 16;
pub const SIGNAL_EVENT_ID: u64 = 24;
/// `reserved2` of the dispatch packet: the emulator's duration field.
const RESERVED2: usize = 48;

/// The fields of `hsa_kernel_dispatch_packet_t` the emulator uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dispatch {
    pub header: u16,
    pub workgroup: [u16; 3],
    pub grid: [u32; 3],
    pub kernel_object: u64,
    pub duration_ns: u64,
    pub completion_signal: u64,
}

impl Dispatch {
    pub fn packet_type(&self) -> u16 {
        self.header & 0xff
    }

    pub fn encode(&self) -> [u8; PACKET_BYTES] {
        let mut p = [0u8; PACKET_BYTES];
        let mut put = |at: usize, b: &[u8]| p[at..at + b.len()].copy_from_slice(b);
        put(packet::HEADER, &self.header.to_le_bytes());
        let dims: u16 = if self.grid[2] > 1 || self.workgroup[2] > 1 {
            3
        } else if self.grid[1] > 1 || self.workgroup[1] > 1 {
            2
        } else {
            1
        };
        put(packet::SETUP, &dims.to_le_bytes());
        for i in 0..3 {
            put(
                packet::WORKGROUP_SIZE + 2 * i,
                &self.workgroup[i].to_le_bytes(),
            );
            put(packet::GRID_SIZE + 4 * i, &self.grid[i].to_le_bytes());
        }
        put(packet::KERNEL_OBJECT, &self.kernel_object.to_le_bytes());
        put(RESERVED2, &self.duration_ns.to_le_bytes());
        put(
            packet::COMPLETION_SIGNAL,
            &self.completion_signal.to_le_bytes(),
        );
        p
    }

    pub fn decode(p: &[u8; PACKET_BYTES]) -> Self {
        let u16at = |o: usize| u16::from_le_bytes([p[o], p[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        let u64at = |o: usize| u64::from_le_bytes(p[o..o + 8].try_into().unwrap_or([0; 8]));
        let (w, g) = (packet::WORKGROUP_SIZE, packet::GRID_SIZE);
        Dispatch {
            header: u16at(packet::HEADER),
            workgroup: [u16at(w), u16at(w + 2), u16at(w + 4)],
            grid: [u32at(g), u32at(g + 4), u32at(g + 8)],
            kernel_object: u64at(packet::KERNEL_OBJECT),
            duration_ns: u64at(RESERVED2),
            completion_signal: u64at(packet::COMPLETION_SIGNAL),
        }
    }

    /// Work-groups in the grid.
    pub fn workgroups(&self) -> u64 {
        (0..3)
            .map(|i| {
                let wg = u64::from(self.workgroup[i].max(1));
                u64::from(self.grid[i].max(1)).div_ceil(wg)
            })
            .product()
    }

    /// CUs this dispatch fills when alone on a GPU with `cus` CUs of `waves_per_cu` wave slots.
    pub fn cu_demand(&self, cus: u32, waves_per_cu: u32) -> u32 {
        let threads: u32 = self
            .workgroup
            .iter()
            .map(|&w| u32::from(w.max(1)))
            .product();
        let waves = self.workgroups() * u64::from(threads.div_ceil(WAVE_SIZE));
        let want = waves.div_ceil(u64::from(waves_per_cu.max(1)));
        want.clamp(1, u64::from(cus)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_round_trip_and_geometry() {
        let d = Dispatch {
            header: PACKET_TYPE_KERNEL_DISPATCH | PACKET_BARRIER_BIT,
            workgroup: [256, 1, 1],
            grid: [196 * 256, 1, 1],
            kernel_object: 7,
            duration_ns: 29_920,
            completion_signal: 0,
        };
        let p = d.encode();
        assert_eq!(Dispatch::decode(&p), d);
        assert_eq!(d.packet_type(), PACKET_TYPE_KERNEL_DISPATCH);
        assert_eq!(d.workgroups(), 196);
        // 196 groups x 4 waves = 784 waves over 32 slots per CU = 24.5 -> 25 CUs of 104.
        assert_eq!(d.cu_demand(104, 32), 25);
        let huge = Dispatch {
            grid: [1 << 30, 1, 1],
            ..d
        };
        assert_eq!(huge.cu_demand(104, 32), 104);
    }
}
