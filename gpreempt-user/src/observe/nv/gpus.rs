//! The host's NVIDIA GPUs as the driver lists them without NVML: one directory per GPU under
//! `/proc/driver/nvidia/gpus/`, named by its PCI location, with an `information` file
//! (`nv_procfs_read_gpu_info` in kernel-open/nvidia/nv-procfs.c: `Model:`, `GPU UUID:`,
//! `Bus Location:`, `Device Minor:` lines, a tab before each value).
//!
//! A GPU gets the ids dcgm-exporter labels it with: its index (`gpu`: NVML's order, by PCI bus
//! id), its UUID (`UUID`) and its bus id in NVML's form (`pci_bus_id`, `00000000:19:00.0`). The
//! model knows NVIDIA queues by the RM device instance of their device (a device's alloc
//! `deviceId`), which the RM hands out as GPUs attach, not by bus order: [`join_instances`]
//! pairs the two through the RM's GPU ids, which encode the PCI location.

use std::path::Path;

use serde::Serialize;

/// One NVIDIA GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NvGpu {
    /// nvidia-smi's and dcgm-exporter's index (`gpu`): the position by PCI bus id.
    pub index: u32,
    /// `Model:`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// NVML's bus id (`00000000:19:00.0`), dcgm-exporter's `pci_bus_id`.
    pub pci_bus_id: String,
    /// `GPU-xxxxxxxx-...` (None: the driver printed none, e.g. before the GPU was initialised).
    pub uuid: Option<String>,
    /// The minor of its device node, `/dev/nvidia<minor>`.
    pub minor: Option<u32>,
    /// The RM device instance: the `gpu_id` of this GPU's queues (TSGs) in the model. None until
    /// the RM was asked (or where it could not be: no RM access, the GPU not attached yet).
    pub device_instance: Option<u32>,
    /// PCI domain, bus, device, function, for ordering and the RM's GPU id.
    #[serde(skip)]
    pub pci: (u32, u8, u8, u8),
}

impl NvGpu {
    /// `/dev/nvidia<minor>`, when the driver said its minor.
    pub fn device_node(&self) -> Option<String> {
        self.minor.map(|m| format!("/dev/nvidia{m}"))
    }

    /// One line: `0 NVIDIA H100 80GB HBM3 00000000:19:00.0 GPU-...`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {} {}",
            self.index,
            self.name,
            self.pci_bus_id,
            self.uuid.as_deref().unwrap_or("(no UUID)")
        )
    }
}

/// `dddd:bb:dd.f` (the directory's name and `Bus Location:`) as numbers.
pub fn parse_bus_location(s: &str) -> Option<(u32, u8, u8, u8)> {
    let (domain, rest) = s.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u8::from_str_radix(bus, 16).ok()?,
        u8::from_str_radix(dev, 16).ok()?,
        u8::from_str_radix(func, 16).ok()?,
    ))
}

/// The value of `key:` in an `information` text (`Model: \t\t NVIDIA H200`).
pub fn info_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix(':'))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// One GPU from its directory name (the driver names it by the GPU's PCI location, as
/// `Bus Location:` says) and its `information` text (None: unreadable). The index is set by
/// [`list`].
pub fn parse_gpu(dir_name: &str, information: Option<&str>) -> Option<NvGpu> {
    let info = information.unwrap_or("");
    let pci = parse_bus_location(dir_name)
        .or_else(|| info_field(info, "Bus Location").and_then(parse_bus_location))?;
    Some(NvGpu {
        index: 0,
        name: info_field(info, "Model")
            .unwrap_or("NVIDIA GPU")
            .to_string(),
        pci_bus_id: format!("{:08X}:{:02X}:{:02X}.{:X}", pci.0, pci.1, pci.2, pci.3),
        uuid: info_field(info, "GPU UUID").map(str::to_string),
        minor: info_field(info, "Device Minor").and_then(|m| m.parse().ok()),
        device_instance: None,
        pci,
    })
}

/// Every GPU under `<proc_root>/driver/nvidia/gpus`, indexed by PCI bus id; empty without the
/// driver. A directory whose name is no PCI location is skipped.
pub fn read(proc_root: &Path) -> Vec<NvGpu> {
    let dir = proc_root.join("driver/nvidia/gpus");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let found: Vec<NvGpu> = rd
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let info = std::fs::read_to_string(dir.join(&name).join("information")).ok();
            parse_gpu(&name, info.as_deref())
        })
        .collect();
    list(found)
}

/// [`read`], joined with the RM's device instances: asked on a client of our own when `rm` (the
/// host has /dev/nvidiactl) and there is more than one GPU to tell apart. Without the RM's
/// answer the device instances of several GPUs stay unknown (logged).
pub fn read_joined(proc_root: &Path, rm: bool) -> Vec<NvGpu> {
    let mut gpus = read(proc_root);
    let pairs = if gpus.len() > 1 && rm {
        super::rm::attached_gpus().unwrap_or_else(|e| {
            log::info!("NVIDIA GPUs: which GPU each RM device instance is stays unknown: {e:#}");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    join_instances(&mut gpus, &pairs);
    gpus
}

/// Orders by PCI location and numbers them from 0 (NVML's enumeration order).
pub fn list(mut gpus: Vec<NvGpu>) -> Vec<NvGpu> {
    gpus.sort_by_key(|g| g.pci);
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    gpus
}

/// The PCI domain (low 16 bits), bus and device an RM GPU id stands for: on Linux the RM makes
/// a GPU's id from its PCI location (`gpuGenerate32BitId`, src/nvidia/src/kernel/gpu/gpu.c:
/// domain << 16 | bus << 8 | device).
pub fn rm_gpu_id_location(gpu_id: u32) -> (u32, u8, u8) {
    (gpu_id >> 16, (gpu_id >> 8) as u8, gpu_id as u8)
}

/// Sets each GPU's device instance from the RM's (GPU id, device instance) pairs; a GPU the RM
/// did not name keeps what it had (it may have detached since: its queues went with it).
pub fn join_instances(gpus: &mut [NvGpu], rm: &[(u32, u32)]) {
    for g in gpus.iter_mut() {
        let at = (g.pci.0 & 0xffff, g.pci.1, g.pci.2);
        if let Some(&(_, inst)) = rm.iter().find(|&&(id, _)| rm_gpu_id_location(id) == at) {
            g.device_instance = Some(inst);
        }
    }
    // With one GPU there is one device instance, 0: nothing to ask.
    if let [g] = gpus {
        g.device_instance.get_or_insert(0);
    }
}

/// The GPU whose queues carry `gpu_id` (an RM device instance).
pub fn by_instance(gpus: &[NvGpu], gpu_id: u32) -> Option<&NvGpu> {
    gpus.iter().find(|g| g.device_instance == Some(gpu_id))
}

/// Stand-in `/proc/driver/nvidia/gpus` trees and GPUs for tests.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    /// The two H100s of a stand-in host: (directory, minor, UUID).
    pub(crate) const TWO_H100: [(&str, u32, &str); 2] = [
        (
            "0000:19:00.0",
            0,
            "GPU-11111111-2222-3333-4444-555555555555",
        ),
        (
            "0000:3b:00.0",
            1,
            "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa",
        ),
    ];

    /// Writes `<proc_root>/driver/nvidia/gpus/<bus>/information` for each GPU, in the driver's
    /// format.
    pub(crate) fn write_gpus(proc_root: &Path, gpus: &[(&str, u32, &str)]) {
        for &(bus, minor, uuid) in gpus {
            let dir = proc_root.join("driver/nvidia/gpus").join(bus);
            std::fs::create_dir_all(&dir).unwrap();
            let text = format!(
                "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 156\nGPU UUID: \t {uuid}\n\
                 Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n\
                 DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n\
                 GPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
            );
            std::fs::write(dir.join("information"), text).unwrap();
        }
    }

    /// [`TWO_H100`] as read, with the RM's device instances crossed (the second by bus id
    /// attached first): index 0 is device instance 1.
    pub(crate) fn two_h100_crossed() -> Vec<NvGpu> {
        let mut gpus = list(
            TWO_H100
                .iter()
                .map(|&(bus, _, _)| parse_gpu(bus, None).unwrap())
                .collect(),
        );
        for (g, &(_, minor, uuid)) in gpus.iter_mut().zip(TWO_H100.iter()) {
            g.name = "NVIDIA H100 80GB HBM3".into();
            g.uuid = Some(uuid.into());
            g.minor = Some(minor);
        }
        join_instances(&mut gpus, &[(0x0000_3b00, 0), (0x0000_1900, 1)]);
        gpus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `nv_procfs_read_gpu_info` prints it (an H100 SXM host's second GPU).
    pub const H100_INFO: &str = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 156\nGPU UUID: \t GPU-5d1a3c4e-7f20-2b6d-9a1e-0c3b4f5a6d7e\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 1\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n";

    #[test]
    fn the_information_file_gives_name_uuid_bus_id_and_minor() {
        let g = parse_gpu("0000:3b:00.0", Some(H100_INFO)).unwrap();
        assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(
            g.uuid.as_deref(),
            Some("GPU-5d1a3c4e-7f20-2b6d-9a1e-0c3b4f5a6d7e")
        );
        assert_eq!(g.pci_bus_id, "00000000:3B:00.0");
        assert_eq!(g.minor, Some(1));
        assert_eq!(g.device_node().as_deref(), Some("/dev/nvidia1"));
        // Unreadable: the directory's name still places it.
        let g = parse_gpu("0001:19:00.0", None).unwrap();
        assert_eq!(
            (g.pci_bus_id.as_str(), g.uuid, g.minor),
            ("00000001:19:00.0", None, None)
        );
        assert!(parse_gpu("README", None).is_none());
    }

    #[test]
    fn a_stand_in_proc_tree_lists_its_gpus_by_bus_id() {
        let root = std::env::temp_dir().join(format!("gpreempt-nvgpus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        assert!(read(&root).is_empty(), "no driver: no GPU");
        // Written out of order: the index follows the bus id.
        fixture::write_gpus(&root, &[fixture::TWO_H100[1], fixture::TWO_H100[0]]);
        std::fs::create_dir_all(root.join("driver/nvidia/gpus/README")).unwrap();
        let gpus = read_joined(&root, false);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            gpus.iter()
                .map(|g| (g.index, g.describe(), g.minor, g.device_instance))
                .collect::<Vec<_>>(),
            [
                (
                    0,
                    "0 NVIDIA H100 80GB HBM3 00000000:19:00.0 \
                     GPU-11111111-2222-3333-4444-555555555555"
                        .to_string(),
                    Some(0),
                    None
                ),
                (
                    1,
                    "1 NVIDIA H100 80GB HBM3 00000000:3B:00.0 \
                     GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
                        .to_string(),
                    Some(1),
                    None
                ),
            ]
        );
    }

    #[test]
    fn gpus_are_indexed_by_bus_id_and_joined_to_device_instances_by_gpu_id() {
        let info = |bus: &str, minor: u32| {
            H100_INFO
                .replace("0000:3b:00.0", bus)
                .replace("Device Minor: \t 1", &format!("Device Minor: \t {minor}"))
        };
        let mut gpus = list(vec![
            parse_gpu("0000:3b:00.0", Some(&info("0000:3b:00.0", 0))).unwrap(),
            parse_gpu("0000:19:00.0", Some(&info("0000:19:00.0", 1))).unwrap(),
        ]);
        assert_eq!(
            gpus.iter()
                .map(|g| (g.index, g.pci_bus_id.as_str()))
                .collect::<Vec<_>>(),
            [(0, "00000000:19:00.0"), (1, "00000000:3B:00.0")]
        );
        // The RM attached 3b first: it is device instance 0.
        join_instances(&mut gpus, &[(0x0000_3b00, 0), (0x0000_1900, 1)]);
        assert_eq!(
            by_instance(&gpus, 0).unwrap().pci_bus_id,
            "00000000:3B:00.0"
        );
        assert_eq!(by_instance(&gpus, 1).unwrap().index, 0);
        assert!(by_instance(&gpus, 2).is_none());
        // Without the RM's answer two GPUs stay unjoined; one is instance 0.
        let mut two = list(vec![gpus[0].clone(), gpus[1].clone()]);
        two.iter_mut().for_each(|g| g.device_instance = None);
        join_instances(&mut two, &[]);
        assert!(two.iter().all(|g| g.device_instance.is_none()));
        let mut one = vec![two[0].clone()];
        join_instances(&mut one, &[]);
        assert_eq!(one[0].device_instance, Some(0));
    }
}
