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
