//! The render node stand-in (`/dev/dri/renderD<minor>`): what the ROCm thunk and libdrm_amdgpu
//! ask of an amdgpu DRM file, with the kernel's semantics (`drm_ioctl` in drm_ioctl.c,
//! `amdgpu_info_ioctl` in amdgpu_kms.c):
//!
//! - the thunk opens the node named by the topology's `drm_render_minor` and passes the fd to
//!   ACQUIRE_VM, then maps its buffer objects through it (`mmap` at each allocation's
//!   `mmap_offset`: served by FUSE passthrough, device.rs);
//! - libdrm_amdgpu (`amdgpu_device_initialize`, the thunk's marketing name) asks
//!   `DRM_IOCTL_VERSION` (driver "amdgpu", major 3), `DRM_IOCTL_GET_CLIENT` and `AMDGPU_INFO`
//!   (ACCEL_WORKING, DEV_INFO, READ_MMR_REG, ...).
//!
//! Nothing else of amdgpu (GEM, command submission) is served: those return EINVAL, as
//! `drm_ioctl` does for a number without a handler.

use gpreempt_common::kfd::{ioc_nr, ioc_size};

use crate::model::{Errno, Host, Outcome};
use crate::spec::Spec;

const DRM_VERSION: u32 = 0x00;
const DRM_GET_CLIENT: u32 = 0x05;
const DRM_COMMAND_BASE: u32 = 0x40;
const DRM_AMDGPU_INFO: u32 = DRM_COMMAND_BASE + 0x05;

/// `KMS_DRIVER_MAJOR` / `MINOR` / `PATCHLEVEL` (amdgpu_drv.c; 3.61 is what Linux 6.12 reports).
const KMS_MAJOR: i32 = 3;
const KMS_MINOR: i32 = 61;
const DRIVER_NAME: &str = "amdgpu";
const DRIVER_DATE: &str = "20150101";
const DRIVER_DESC: &str = "AMD GPU";

/// `AMDGPU_INFO_*` queries (amdgpu_drm.h).
const INFO_ACCEL_WORKING: u32 = 0x00;
const INFO_HW_IP_COUNT: u32 = 0x03;
const INFO_VRAM_GTT: u32 = 0x14;
const INFO_READ_MMR_REG: u32 = 0x15;
const INFO_DEV_INFO: u32 = 0x16;
const INFO_MEMORY: u32 = 0x19;
/// `AMDGPU_FAMILY_AI` (Vega10 and the other GFX9 parts).
const FAMILY_AI: u32 = 141;
const VRAM_TYPE_HBM: u32 = 6;

fn done(ret: i32, out: &[u8]) -> Outcome {
    Outcome::Done {
        ret,
        out: out.to_vec(),
    }
}

fn err(e: Errno, out: &[u8]) -> Outcome {
    done(-e, out)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// One ioctl on the render node of `gpu` by process `pid`.
pub fn ioctl(gpu: &Spec, pid: u32, cmd: u32, input: &[u8], host: &mut dyn Host) -> Outcome {
    // drm_ioctl dispatches on the number alone, like kfd_ioctl (the type byte is not checked).
    let mut a = input.to_vec();
    a.resize(ioc_size(cmd) as usize, 0);
    match ioc_nr(cmd) {
        DRM_VERSION if a.len() >= 64 => version(pid, a, host),
        DRM_GET_CLIENT if a.len() >= 40 => get_client(pid, a),
        DRM_AMDGPU_INFO if a.len() >= 32 => info(gpu, pid, a, host),
        _ => err(libc::EINVAL, input),
    }
}

/// `drm_version`: copies up to each buffer's length and returns every string's full length.
fn version(pid: u32, mut a: Vec<u8>, host: &mut dyn Host) -> Outcome {
    put_u32(&mut a, 0, KMS_MAJOR as u32);
    put_u32(&mut a, 4, KMS_MINOR as u32);
    put_u32(&mut a, 8, 0);
    for (at, s) in [(16, DRIVER_NAME), (32, DRIVER_DATE), (48, DRIVER_DESC)] {
        let (len, ptr) = (get_u64(&a, at) as usize, get_u64(&a, at + 8));
        let n = len.min(s.len());
        if n > 0 && host.write_mem(pid, ptr, &s.as_bytes()[..n]).is_err() {
            return err(libc::EFAULT, &a);
        }
        put_u64(&mut a, at, s.len() as u64);
    }
    done(0, &a)
}

/// `drm_getclient`: only index 0, the caller itself, exists for a render node; `auth` is what
/// `drm_file_alloc` gives a file (CAP_SYS_ADMIN), here whether the caller is root.
fn get_client(pid: u32, mut a: Vec<u8>) -> Outcome {
    if get_u32(&a, 0) != 0 {
        return err(libc::EINVAL, &a);
    }
    let root = crate::host::status_field(pid, "Uid:") == Some(0);
    put_u32(&mut a, 4, u32::from(root));
    put_u64(&mut a, 8, u64::from(pid));
    put_u64(
        &mut a,
        16,
        u64::from(crate::host::status_field(pid, "Uid:").unwrap_or(0)),
    );
    put_u64(&mut a, 24, 0);
    put_u64(&mut a, 32, 0);
    done(0, &a)
}

/// `struct drm_amdgpu_info_device` as far as the kernel fills it for a GFX9 part (448 bytes in
/// current kernels; a caller gets `min(return_size, 448)`).
fn dev_info(sp: &Spec) -> Vec<u8> {
    let mut d = vec![0u8; 448];
    let ses = sp.array_count / sp.simd_arrays_per_engine.max(1);
    put_u32(&mut d, 0, sp.device_id);
    put_u32(&mut d, 4, 1); // chip_rev
    put_u32(&mut d, 8, 0x3d); // external_rev
    put_u32(&mut d, 12, sp.pci_rev);
    put_u32(&mut d, 16, FAMILY_AI);
    put_u32(&mut d, 20, ses);
    put_u32(&mut d, 24, sp.simd_arrays_per_engine);
    put_u32(&mut d, 28, 100_000); // gpu_counter_freq (kHz): the 100 MHz reference clock
    put_u64(&mut d, 32, u64::from(sp.max_engine_clk_mhz) * 1000);
    put_u64(&mut d, 40, u64::from(sp.mem_clk_max_mhz) * 1000);
    put_u32(&mut d, 48, sp.cu_count);
    let per_sh = sp.cu_count / sp.array_count.max(1);
    let mask = if per_sh >= 32 {
        u32::MAX
    } else {
        (1u32 << per_sh) - 1
    };
    // cu_bitmap[4][4] at 56 and cu_ao_bitmap[4][4] at 272: SE i, SH j.
    for se in 0..ses.min(4) as usize {
        for sh in 0..sp.simd_arrays_per_engine.min(4) as usize {
            put_u32(&mut d, 56 + (se * 4 + sh) * 4, mask);
            put_u32(&mut d, 272 + (se * 4 + sh) * 4, mask);
        }
    }
    // Virtual address range for user-mode drivers (AMDGPU_VA_RESERVED_BOTTOM .. 47 bits), high
    // half from 0xffff8000_00000000.
    put_u64(&mut d, 144, 0x20_0000);
    put_u64(&mut d, 152, 0x8000_0000_0000 - 0x20_0000);
    put_u32(&mut d, 160, 4096); // virtual_address_alignment
    put_u32(&mut d, 164, 0x20_0000); // pte_fragment_size
    put_u32(&mut d, 168, 4096); // gart_page_size
    put_u32(&mut d, 176, VRAM_TYPE_HBM);
    put_u32(&mut d, 180, sp.vram_width);
    put_u32(&mut d, 240, 64); // wave_front_size
    put_u32(&mut d, 244, 256); // num_shader_visible_vgprs
    put_u32(&mut d, 248, per_sh);
    put_u32(&mut d, 252, 16); // num_tcc_blocks
    put_u64(&mut d, 336, 0xffff_8000_0000_0000);
    put_u64(&mut d, 344, 0xffff_ffff_ffe0_0000);
    d
}

/// `amdgpu_info_ioctl`: the answer goes to `return_pointer`, at most `return_size` bytes.
fn info(gpu: &Spec, pid: u32, a: Vec<u8>, host: &mut dyn Host) -> Outcome {
    let (ptr, size, query) = (get_u64(&a, 0), get_u32(&a, 8) as usize, get_u32(&a, 12));
    if ptr == 0 || size == 0 {
        return err(libc::EINVAL, &a);
    }
    let vram = gpu.vram_bytes;
    let reply: Vec<u8> = match query {
        INFO_ACCEL_WORKING => 1u32.to_le_bytes().to_vec(),
        // One compute ring, no graphics or other engines exposed to submission here.
        INFO_HW_IP_COUNT => u32::from(get_u32(&a, 16) == 1).to_le_bytes().to_vec(),
        INFO_DEV_INFO => dev_info(gpu),
        INFO_VRAM_GTT => [vram, vram, vram / 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        INFO_MEMORY => {
            // vram, cpu_accessible_vram, gtt: total, usable, usage, max_allocation.
            let heap = |t: u64| [t, t, 0, t * 3 / 4];
            [heap(vram), heap(vram), heap(vram / 2)]
                .iter()
                .flatten()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        INFO_READ_MMR_REG => {
            // Register values are not modelled: the allowed registers read as 0.
            let count = get_u32(&a, 20) as usize;
            if count == 0 || count > 128 {
                return err(libc::EINVAL, &a);
            }
            vec![0u8; count * 4]
        }
        _ => return err(libc::EINVAL, &a),
    };
    let n = size.min(reply.len());
    if host.write_mem(pid, ptr, &reply[..n]).is_err() {
        return err(libc::EFAULT, &a);
    }
    done(0, &a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{FakeHost, World};
    use gpreempt_common::kfd::{ior, iow, iowr};
    const DRM_IOCTL_BASE: u32 = b'd' as u32;

    #[test]
    fn version_client_and_info_answer_as_amdgpu() {
        let w = World::new();
        let gpu = &w.kfd.gpus[0].spec;
        let mut h = FakeHost::default();
        // drm_version with buffers of 3 bytes for the name: copied short, full length returned.
        let mut v = vec![0u8; 64];
        put_u64(&mut v, 16, 3);
        put_u64(&mut v, 24, 0x1000);
        let Outcome::Done { ret, out } = ioctl(
            gpu,
            7,
            iowr(DRM_VERSION, 64) & !0xff00 | (DRM_IOCTL_BASE << 8),
            &v,
            &mut h,
        ) else {
            panic!("blocked")
        };
        assert_eq!(ret, 0);
        assert_eq!(get_u32(&out, 0), 3);
        assert_eq!(get_u64(&out, 16), 6, "full name length");
        let mut name = [0u8; 4];
        h.read_mem(7, 0x1000, &mut name).unwrap();
        assert_eq!(&name, b"amd\0");
        // AMDGPU_INFO DEV_INFO: device id and PCI revision of an MI210.
        let mut i = vec![0u8; 32];
        put_u64(&mut i, 0, 0x2000);
        put_u32(&mut i, 8, 16);
        put_u32(&mut i, 12, INFO_DEV_INFO);
        let cmd = iow(DRM_AMDGPU_INFO, 32) & !0xff00 | (DRM_IOCTL_BASE << 8);
        assert!(matches!(
            ioctl(gpu, 7, cmd, &i, &mut h),
            Outcome::Done { ret: 0, .. }
        ));
        let mut d = [0u8; 16];
        h.read_mem(7, 0x2000, &mut d).unwrap();
        assert_eq!((get_u32(&d, 0), get_u32(&d, 12)), (0x740f, 2));
        // Index 1 of GET_CLIENT, an unknown driver ioctl and a core one without a handler here:
        // EINVAL.
        let mut c = vec![0u8; 40];
        put_u32(&mut c, 0, 1);
        let cmd = iowr(DRM_GET_CLIENT, 40) & !0xff00 | (DRM_IOCTL_BASE << 8);
        assert!(
            matches!(ioctl(gpu, 7, cmd, &c, &mut h), Outcome::Done { ret, .. } if ret == -libc::EINVAL)
        );
        let cmd = iowr(0x50, 8) & !0xff00 | (DRM_IOCTL_BASE << 8);
        assert!(
            matches!(ioctl(gpu, 7, cmd, &[0; 8], &mut h), Outcome::Done { ret, .. } if ret == -libc::EINVAL)
        );
        assert!(
            matches!(ioctl(gpu, 7, ior(1, 8), &[0; 8], &mut h), Outcome::Done { ret, .. } if ret == -libc::EINVAL)
        );
    }
}
