//! NVIDIA resource-manager escapes (RM_ALLOC / RM_FREE / RM_CONTROL on nvidiactl or nvidiaN),
//! decoded as the driver's nvos.h lays them out, and where a GPFIFO channel's ring and USERD are.

use gpreempt_common::{
    kfd, nv,
    record::{IoctlRecord, ARGS_MAX},
};

use super::origin::{origin, Origin};

/// An NVIDIA RM escape, with the struct as the driver left it (status filled) when the ioctl
/// returned 0. The RM's own result is `status` (NV_STATUS), not the ioctl's return value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvEvent {
    pub origin: Origin,
    pub fd: i32,
    pub cmd: u32,
    pub ret: i64,
    pub duration_ns: u64,
    pub call: NvCall,
    /// Whether the fd was confirmed to be an NVIDIA device (/dev/nvidiactl, /dev/nvidiaN).
    pub verified: bool,
}

/// The decoded RM escape, named as in the driver's nvos.h.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvCall {
    /// NVOS21 (32 bytes) or NVOS64 (48 bytes, `nvos64`). `alloc_params`: the head of
    /// `*pAllocParms`, read at exit (None if unreadable), zero-padded past `alloc_params_len`
    /// bytes ([`nv::ALLOC_HEAD_LEN`], or [`nv::PARAMS_HEAD_LEN`] where the struct ended sooner).
    Alloc {
        h_root: u32,
        h_object_parent: u32,
        h_object_new: u32,
        h_class: u32,
        params_size: u32,
        status: u32,
        nvos64: bool,
        alloc_params: Option<[u8; nv::ALLOC_HEAD_LEN]>,
        alloc_params_len: usize,
    },
    Free {
        h_root: u32,
        h_object_parent: u32,
        h_object_old: u32,
        status: u32,
    },
    /// `params`: the head of `*params` read at exit (up to paramsSize bytes; empty if
    /// unreadable): the values the trace decodes for the controls it knows.
    Control {
        h_client: u32,
        h_object: u32,
        cmd: u32,
        flags: u32,
        params_size: u32,
        params: Vec<u8>,
        status: u32,
    },
    /// A struct too short to decode.
    Short,
}

impl NvEvent {
    pub fn name(&self) -> &'static str {
        match kfd::ioc_nr(self.cmd) {
            nv::nr::RM_ALLOC => "rm_alloc",
            nv::nr::RM_FREE => "rm_free",
            nv::nr::RM_CONTROL => "rm_control",
            _ => "rm_unknown",
        }
    }

    /// The RM's status, when the ioctl itself succeeded.
    pub fn status(&self) -> Option<u32> {
        match self.call {
            NvCall::Alloc { status, .. }
            | NvCall::Free { status, .. }
            | NvCall::Control { status, .. } => (self.ret == 0).then_some(status),
            NvCall::Short => None,
        }
    }

    /// Succeeded in the RM too.
    pub fn ok(&self) -> bool {
        self.status() == Some(nv::status::OK)
    }

    /// A TSG allocation's engine type (`engineType` of its alloc params).
    pub fn engine_type(&self) -> Option<u32> {
        match &self.call {
            NvCall::Alloc {
                h_class: nv::class::KEPLER_CHANNEL_GROUP_A,
                alloc_params: Some(p),
                ..
            } => Some(nv::u32_at(p, nv::TSG_ENGINE_TYPE_AT)),
            _ => None,
        }
    }

    /// A channel allocation's ring and USERD placement (its alloc params' head), when the
    /// whole head was read.
    pub fn channel_ring(&self) -> Option<ChannelRing> {
        match &self.call {
            NvCall::Alloc {
                h_class,
                h_object_new,
                alloc_params: Some(p),
                alloc_params_len,
                ..
            } if nv::class::is_channel(*h_class) && *alloc_params_len >= nv::ALLOC_HEAD_LEN => {
                use nv::channel as c;
                Some(ChannelRing {
                    h_channel: *h_object_new,
                    gpfifo_va: nv::u64_at(p, c::GPFIFO_OFFSET),
                    entries: nv::u32_at(p, c::GPFIFO_ENTRIES),
                    h_buffer: nv::u32_at(p, c::H_OBJECT_BUFFER),
                    h_userd: nv::u32_at(p, c::H_USERD_MEMORY),
                    userd_offset: nv::u64_at(p, c::USERD_OFFSET),
                })
            }
            _ => None,
        }
    }
}

/// Where a GPFIFO channel's ring and USERD live, as its allocation said (`NV_CHANNEL_ALLOC_PARAMS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChannelRing {
    pub h_channel: u32,
    /// gpFifoOffset: the ring's GPU virtual address (libcuda maps it at the same CPU address).
    pub gpfifo_va: u64,
    /// gpFifoEntries.
    pub entries: u32,
    /// hObjectBuffer: the ring's memory object.
    pub h_buffer: u32,
    /// hUserdMemory[0] (0: the RM's own USERD pool, which the client maps through the channel).
    pub h_userd: u32,
    /// userdOffset[0]: the USERD's offset in `h_userd`.
    pub userd_offset: u64,
}

/// Decodes an RM escape record.
pub fn decode_nv(r: &IoctlRecord) -> NvEvent {
    let args_len = (r.args_len as usize).min(ARGS_MAX);
    let out_len = (r.out_len as usize).min(ARGS_MAX);
    let succeeded = r.ret == 0 && out_len >= args_len && args_len > 0;
    let view: &[u8] = if succeeded {
        &r.out[..args_len]
    } else {
        &r.args[..args_len]
    };
    let u = |at| nv::u32_at(view, at);
    let call = match (kfd::ioc_nr(r.cmd), args_len as u32) {
        (nv::nr::RM_ALLOC, n) if n >= nv::alloc::NVOS21_SIZE => {
            let nvos64 = n >= nv::alloc::NVOS64_SIZE;
            let (size_at, status_at) = if nvos64 {
                (nv::alloc::NVOS64_PARAMS_SIZE, nv::alloc::NVOS64_STATUS)
            } else {
                (nv::alloc::NVOS21_PARAMS_SIZE, nv::alloc::NVOS21_STATUS)
            };
            // Inputs: read at exit whatever the outcome.
            let alloc_params_len = out_len
                .saturating_sub(nv::PARAMS_HEAD_AT)
                .min(nv::ALLOC_HEAD_LEN);
            let alloc_params = (alloc_params_len >= nv::PARAMS_HEAD_LEN).then(|| {
                let mut p = [0u8; nv::ALLOC_HEAD_LEN];
                p[..alloc_params_len].copy_from_slice(
                    &r.out[nv::PARAMS_HEAD_AT..nv::PARAMS_HEAD_AT + alloc_params_len],
                );
                p
            });
            NvCall::Alloc {
                h_root: u(nv::alloc::H_ROOT),
                h_object_parent: u(nv::alloc::H_OBJECT_PARENT),
                h_object_new: u(nv::alloc::H_OBJECT_NEW),
                h_class: u(nv::alloc::H_CLASS),
                params_size: u(size_at),
                status: u(status_at),
                nvos64,
                alloc_params,
                alloc_params_len,
            }
        }
        (nv::nr::RM_FREE, n) if n >= nv::free::SIZE => NvCall::Free {
            h_root: u(nv::free::H_ROOT),
            h_object_parent: u(nv::free::H_OBJECT_PARENT),
            h_object_old: u(nv::free::H_OBJECT_OLD),
            status: u(nv::free::STATUS),
        },
        (nv::nr::RM_CONTROL, n) if n >= nv::control::SIZE => NvCall::Control {
            h_client: u(nv::control::H_CLIENT),
            h_object: u(nv::control::H_OBJECT),
            cmd: u(nv::control::CMD),
            flags: u(nv::control::FLAGS),
            params_size: u(nv::control::PARAMS_SIZE),
            status: u(nv::control::STATUS),
            params: r
                .out
                .get(nv::PARAMS_HEAD_AT..out_len.max(nv::PARAMS_HEAD_AT))
                .unwrap_or_default()
                .to_vec(),
        },
        _ => NvCall::Short,
    };
    NvEvent {
        origin: origin(&r.hdr),
        fd: r.fd,
        cmd: r.cmd,
        ret: r.ret,
        duration_ns: r.duration_ns,
        call,
        verified: false,
    }
}
