//! The virtual-machine tier: distribution kernels with the real amdgpu module, booted under QEMU
//! (TCG: nested KVM fails on these machines) by virtme-ng with this machine's root file system.
//!
//! `setup` is idempotent: Debian's qemu-system-x86, busybox-static (virtme-ng's initramfs) and
//! kmod; virtme-ng from PyPI in a venv under .tools/vm; for each kernel series the pinned
//! `linux-image-*-amd64-unsigned` package at its exact Debian version, unpacked under
//! .tools/vm/kernels/<version>, its modules made visible at /lib/modules/<version> (a link; what
//! installing the package would do, without touching /boot) and indexed with depmod. Debian's
//! archive keeps only the current upload of a kernel: once the pin is gone from it, the newest
//! package of the series is taken instead, loudly (the setup says so and kernels.txt records it,
//! so the VM test prints which kernel it really booted), and the pin should be moved. It writes
//! .tools/vm/kernels.txt, one `<version> <vmlinuz> <debian version> <pinned|NOT-PINNED>` line per
//! kernel, which the VM tests (tests/tests/vm.rs) read.
use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{root, run};

/// One kernel series of the matrix.
pub struct Series {
    pub series: &'static str,
    /// The package and Debian version the tier was last checked against.
    pub package: &'static str,
    pub version: &'static str,
    /// Every package of the series (one per ABI): the fallback is the newest of these.
    pub pattern: &'static str,
}

/// The kernel series booted: Debian 12's own (6.1, KFD 1.11, no debug API) and the 6.12 kernel
/// Debian 12 also ships (KFD 1.17, debug API). Debian 12 has no newer series.
pub const SERIES: [Series; 2] = [
    Series {
        series: "6.1",
        package: "linux-image-6.1.0-56-amd64-unsigned",
        version: "6.1.192-2",
        pattern: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
    },
    Series {
        series: "6.12",
        package: "linux-image-6.12.117+deb12-amd64-unsigned",
        version: "6.12.117-1~deb12u1",
        pattern: r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$",
    },
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

/// Whether the archive offers `package` at exactly `version`.
fn available(package: &str, version: &str) -> bool {
    output(Command::new("apt-cache").args(["madison", package]))
        .map(|t| {
            t.lines()
                .any(|l| l.split('|').nth(1).map(str::trim) == Some(version))
        })
        .unwrap_or(false)
}

/// The pinned package of `s`, or (gone from the archive) the newest of its series; the third
/// value says whether the pin held.
fn choose(s: &Series) -> Result<(String, String, bool)> {
    if available(s.package, s.version) {
        return Ok((s.package.to_string(), s.version.to_string(), true));
    }
    let (pkg, ver) = newest(s.pattern)?;
    eprintln!(
        "vm: WARNING: {}={} is no longer in the archive; booting {pkg}={ver} instead (move the \
         pin in xtask/src/vm.rs once it passes)",
        s.package, s.version
    );
    Ok((pkg, ver, false))
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
    for s in &SERIES {
        let series = s.series;
        // Package lists may be missing or stale on a fresh machine: update once and retry.
        let (pkg, deb_version, pinned) = match choose(s) {
            Ok(c) if c.2 => c,
            _ => {
                run(Command::new("apt-get").args(["update", "-qq"]))?;
                choose(s)?
            }
        };
        let version = pkg
            .strip_prefix("linux-image-")
            .and_then(|v| v.strip_suffix("-unsigned"))
            .context("unexpected package name")?
            .to_string();
        let tree = dir.join("kernels").join(&version);
        let vmlinuz = tree.join(format!("boot/vmlinuz-{version}"));
        // The tree records the Debian version it was unpacked from: a new upload of the same
        // ABI is fetched again.
        let stamp = tree.join("DEBIAN-VERSION");
        let unpacked = std::fs::read_to_string(&stamp).ok();
        if !vmlinuz.exists() || unpacked.as_deref().map(str::trim) != Some(deb_version.as_str()) {
            eprintln!("vm: fetching {pkg}={deb_version} (Linux {series})");
            let debs = dir.join("debs");
            // `run` works in the repository root: change directory in the shell.
            run(Command::new("sh").arg("-c").arg(format!(
                "cd '{}' && apt-get download -qq '{pkg}={deb_version}'",
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
            std::fs::write(tmp.join("DEBIAN-VERSION"), &deb_version)?;
            let _ = std::fs::remove_dir_all(&tree);
            std::fs::rename(&tmp, &tree)?;
            let _ = std::fs::remove_file(&deb);
        }
        link_modules(&tree, &version)?;
        list.push_str(&format!(
            "{version} {} {deb_version} {}\n",
            vmlinuz.display(),
            if pinned { "pinned" } else { "NOT-PINNED" }
        ));
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
