//! The virtual-machine tier: distribution kernels with the real amdgpu module, booted under QEMU
//! (TCG: nested KVM fails on these machines) by virtme-ng with this machine's root file system.
//!
//! `setup` is idempotent: Debian's qemu-system-x86, busybox-static (virtme-ng's initramfs) and
//! kmod; virtme-ng from PyPI in a venv under .tools/vm; for each kernel series the newest
//! `linux-image-*-amd64-unsigned` the archive has, unpacked under .tools/vm/kernels/<version>,
//! its modules made visible at /lib/modules/<version> (a link; what installing the package would
//! do, without touching /boot) and indexed with depmod. It writes .tools/vm/kernels.txt, one
//! `<version> <vmlinuz>` line per kernel, which the VM tests (tests/tests/vm.rs) read.
use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{root, run};

/// The kernel series booted: Debian 12's own (6.1, KFD 1.11, no debug API) and the 6.12 kernel
/// Debian 12 also ships (KFD 1.17, debug API). Each pattern names exactly one package per
/// version; the newest is taken.
pub const SERIES: [(&str, &str); 2] = [
    ("6.1", r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$"),
    ("6.12", r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$"),
];

/// virtme-ng, pinned: the version the VM tier was written against.
const VIRTME_NG: &str = "virtme-ng==1.42";

fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .current_dir(root())
        .output()
        .with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Newest package matching `pattern` (by Debian version order), with its version string.
fn newest(pattern: &str) -> Result<(String, String)> {
    let names = output(Command::new("apt-cache").args(["search", "--names-only", pattern]))?;
    let mut best: Option<(String, String)> = None;
    for name in names.lines().filter_map(|l| l.split_whitespace().next()) {
        let ver = output(Command::new("apt-cache").args(["show", "--no-all-versions", name]))?
            .lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .unwrap_or_default()
            .to_string();
        let newer = match &best {
            None => true,
            Some((_, v)) => Command::new("dpkg")
                .args(["--compare-versions", &ver, "gt", v])
                .status()
                .map(|s| s.success())
                .unwrap_or(false),
        };
        if newer {
            best = Some((name.to_string(), ver));
        }
    }
    best.with_context(|| {
        format!(
            "no package matches {pattern} (apt-get update, and is Debian 12's archive reachable?)"
        )
    })
}

pub fn setup() -> Result<()> {
    crate::ensure_packages(&[
        ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
        ("busybox-static", "/bin/busybox"),
        ("kmod", "/sbin/depmod"),
    ])?;
    let dir = root().join(".tools/vm");
    std::fs::create_dir_all(dir.join("debs"))?;
    let venv = dir.join("venv");
    if !venv.join("bin/vng").exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "-q", VIRTME_NG]))?;
    }
    let mut list = String::new();
    for (series, pattern) in SERIES {
        // Package lists may be missing or stale on a fresh machine: update once and retry.
        let (pkg, _) = match newest(pattern) {
            Ok(p) => p,
            Err(_) => {
                run(Command::new("apt-get").args(["update", "-qq"]))?;
                newest(pattern)?
            }
        };
        let version = pkg
            .strip_prefix("linux-image-")
            .and_then(|v| v.strip_suffix("-unsigned"))
            .context("unexpected package name")?
            .to_string();
        let tree = dir.join("kernels").join(&version);
        let vmlinuz = tree.join(format!("boot/vmlinuz-{version}"));
        if !vmlinuz.exists() {
            eprintln!("vm: fetching {pkg} (Linux {series})");
            let debs = dir.join("debs");
            // `run` works in the repository root: change directory in the shell.
            run(Command::new("sh").arg("-c").arg(format!(
                "cd '{}' && apt-get download -qq {pkg}",
                debs.display()
            )))?;
            let deb = std::fs::read_dir(&debs)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{pkg}_")))
                })
                .with_context(|| format!("{pkg}: downloaded .deb not found"))?;
            let tmp = dir.join("kernels").join(format!("{version}.part"));
            std::fs::create_dir_all(dir.join("kernels"))?;
            let _ = std::fs::remove_dir_all(&tmp);
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
            run(Command::new("depmod").arg("-b").arg(&tmp).arg(&version))?;
            let _ = std::fs::remove_dir_all(&tree);
            std::fs::rename(&tmp, &tree)?;
            let _ = std::fs::remove_file(&deb);
        }
        link_modules(&tree, &version)?;
        list.push_str(&format!("{version} {}\n", vmlinuz.display()));
    }
    std::fs::write(dir.join("kernels.txt"), list)?;
    Ok(())
}

/// /lib/modules/<version> -> the unpacked tree's (virtme-ng loads modules from there). A real
/// directory there (the kernel package installed) is left alone.
fn link_modules(tree: &Path, version: &str) -> Result<()> {
    let mods = tree.join("lib/modules").join(version);
    let at = Path::new("/lib/modules").join(version);
    match std::fs::symlink_metadata(&at) {
        Ok(m) if !m.file_type().is_symlink() => return Ok(()),
        Ok(_) => std::fs::remove_file(&at)?,
        Err(_) => std::fs::create_dir_all("/lib/modules")?,
    }
    std::os::unix::fs::symlink(&mods, &at)
        .with_context(|| format!("linking {} to {}", at.display(), mods.display()))
}
