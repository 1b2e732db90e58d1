//! The emulated GPU models: the properties KFD reports in topology and the numbers the scheduler
//! model uses. Values follow the real parts; figures derived from them are emulated.

use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Instinct MI210 (gfx90a, Aldebaran): one XCC, 104 CUs.
    Mi210,
    /// Instinct MI300X (gfx942): eight XCCs, 304 CUs, shown as one partition (SPX).
    Mi300x,
}

impl FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "mi210" => Ok(Model::Mi210),
            "mi300x" => Ok(Model::Mi300x),
            other => Err(format!("unknown GPU model {other:?}: use mi210 or mi300x")),
        }
    }
}

/// What one emulated GPU is.
#[derive(Clone, Debug)]
pub struct Spec {
    pub model: Model,
    pub gfx_target_version: u32,
    pub device_id: u32,
    /// PCI revision (with the device id, libdrm's amdgpu.ids names the part).
    pub pci_rev: u32,
    pub cu_count: u32,
    pub simd_per_cu: u32,
    pub max_waves_per_simd: u32,
    pub array_count: u32,
    pub simd_arrays_per_engine: u32,
    pub num_xcc: u32,
    /// KFD's MEC: pipes x queues (HQD slots) per XCC.
    pub pipes: u32,
    pub queues_per_pipe: u32,
    pub vram_bytes: u64,
    /// VRAM bus width in bits and peak memory clock (MHz): the memory bank's `width` and
    /// `mem_clk_max`.
    pub vram_width: u32,
    pub mem_clk_max_mhz: u32,
    pub max_engine_clk_mhz: u32,
    pub lds_size_kb: u32,
    pub num_sdma_engines: u32,
    pub num_sdma_xgmi_engines: u32,
    pub mec_fw_version: u32,
    pub sdma_fw_version: u32,
    /// GC 9.4.2+ debug VMIDs per process: no device-wide debug reservation.
    pub per_vmid_debug: bool,
    /// Per-process queue limit per device (`pqm_create_queue`).
    pub max_queues_per_device: u32,
    /// GPU clock, for the debugger's grace period (units of 1K clocks).
    pub clock_mhz: u32,
}

impl Spec {
    pub fn new(model: Model) -> Self {
        match model {
            Model::Mi210 => Spec {
                model,
                gfx_target_version: 90010,
                device_id: 0x740f,
                pci_rev: 0x02,
                cu_count: 104,
                simd_per_cu: 4,
                max_waves_per_simd: 8,
                array_count: 8,
                simd_arrays_per_engine: 1,
                num_xcc: 1,
                pipes: 4,
                queues_per_pipe: 8,
                vram_bytes: 64 << 30,
                vram_width: 4096,
                mem_clk_max_mhz: 1600,
                max_engine_clk_mhz: 1700,
                lds_size_kb: 64,
                num_sdma_engines: 2,
                num_sdma_xgmi_engines: 3,
                mec_fw_version: 78,
                sdma_fw_version: 8,
                per_vmid_debug: true,
                max_queues_per_device: 127,
                clock_mhz: 1700,
            },
            Model::Mi300x => Spec {
                model,
                gfx_target_version: 90402,
                device_id: 0x74a1,
                pci_rev: 0x00,
                cu_count: 304,
                simd_per_cu: 4,
                max_waves_per_simd: 8,
                array_count: 32,
                simd_arrays_per_engine: 1,
                num_xcc: 8,
                pipes: 4,
                queues_per_pipe: 8,
                vram_bytes: 192 << 30,
                vram_width: 8192,
                mem_clk_max_mhz: 1300,
                max_engine_clk_mhz: 2100,
                lds_size_kb: 64,
                num_sdma_engines: 2,
                num_sdma_xgmi_engines: 14,
                mec_fw_version: 177,
                sdma_fw_version: 21,
                per_vmid_debug: true,
                max_queues_per_device: 255,
                clock_mhz: 2100,
            },
        }
    }

    pub fn name(&self) -> &'static str {
        match self.model {
            Model::Mi210 => "mi210",
            Model::Mi300x => "mi300x",
        }
    }

    pub fn simd_count(&self) -> u32 {
        self.cu_count * self.simd_per_cu
    }

    /// HQD slots KFD owns per XCC.
    pub fn hqd_slots(&self) -> u32 {
        self.pipes * self.queues_per_pipe
    }

    /// Wave slots of one CU.
    pub fn waves_per_cu(&self) -> u32 {
        self.simd_per_cu * self.max_waves_per_simd
    }
}

/// Costs of the scheduler model (emulated; the order of magnitude of HWS/CWSR on MI200).
#[derive(Clone, Debug)]
pub struct Costs {
    /// An HWS runlist re-upload: every queue of the device is unmapped and mapped again.
    pub runlist_update_ns: u64,
    /// CWSR: saving a running dispatch's waves when its queue is preempted.
    pub cwsr_save_ns: u64,
    /// CWSR: restoring them when the queue runs again.
    pub cwsr_restore_ns: u64,
    /// HWS time slice when more queues are runnable than HQD slots.
    pub oversubscription_quantum_ns: u64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            runlist_update_ns: 40_000,
            cwsr_save_ns: 25_000,
            cwsr_restore_ns: 15_000,
            oversubscription_quantum_ns: 2_000_000,
        }
    }
}
