//! What the deployment tests (tests/tests/packaging.rs) need besides Debian's packages, made once
//! in `.tools/` (idempotent; both come from registries CI reaches, and neither needs the network
//! once made):
//! - `.tools/k8s-validate`: the PyPI package kubernetes-validate, which checks manifests
//!   against the Kubernetes JSON schemas it bundles (offline);
//! - `.tools/image-base/debian-bookworm.tar`: a Debian root file system made by mmdebstrap
//!   from Debian's packages, the base the image test builds packaging/Containerfile on (no image
//!   registry is reachable from CI).
//!
//! And what the real-ROCm test of a runtime that enables the KFD debug API needs
//! (tests/tests/rocm.rs): `.tools/rocm-trixie`, a Debian 13 root file system with its ROCm
//! (rocminfo 6.1.2, ROCr 6.1.2, libhsakmt 6.2.4, HIP 5.7.1) made by mmdebstrap, which the test
//! chroots into inside `sim` (Debian 12, the host's suite, has ROCm 5.2 only).
//!
//! And what the systemd unit test boots (tests/tests/unit.rs): `.tools/unit-root`, a Debian 12
//! root file system with systemd as its init, made by mmdebstrap, which the test boots with
//! `systemd-nspawn --boot --volatile=overlay` (every boot starts from it unchanged).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::{root, run};

/// Pinned: the schemas it bundles (Kubernetes 1.25 to 1.37) are what the tests validate against.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";
const SUITE: &str = "bookworm";

/// Debian 13's ROCm userspace; the marker records it, so a changed list makes the root again.
const ROCM_SUITE: &str = "trixie";
const ROCM_PACKAGES: &str = "rocminfo,libamdhip64-5";

/// The unit test's root: systemd as init (`systemd-sysv`), D-Bus for `systemctl`'s usual path;
/// the marker records it, so a changed list makes the root again.
const UNIT_ROOT_PACKAGES: &str = "systemd,systemd-sysv,dbus";

pub fn unit_root() -> PathBuf {
    root().join(".tools/unit-root")
}

pub fn rocm_root() -> PathBuf {
    root().join(".tools/rocm-trixie")
}

pub fn validator_dir() -> PathBuf {
    root().join(".tools/k8s-validate")
}

pub fn base_tar() -> PathBuf {
    root().join(format!(".tools/image-base/debian-{SUITE}.tar"))
}

/// Makes whatever of the two is missing. Network only here (PyPI, Debian's mirror).
pub fn prepare() -> Result<()> {
    let dir = validator_dir();
    if !dir.join("kubernetes_validate").is_dir() {
        let tmp = dir.with_extension("partial");
        let _ = fs::remove_dir_all(&tmp);
        // Debian's python3 and pip (not whatever python3 is first on PATH): the tests run
        // the validator with /usr/bin/python3.
        run(Command::new("/usr/bin/python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-warn-script-location", "--target"])
            .arg(&tmp)
            .arg(VALIDATOR)
            .env("PIP_ROOT_USER_ACTION", "ignore"))?;
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&tmp, &dir).with_context(|| format!("renaming {}", tmp.display()))?;
    }
    let tar = base_tar();
    if !tar.is_file() {
        let parent = tar.parent().context("base tar has a parent")?;
        fs::create_dir_all(parent)?;
        let tmp = tar.with_extension("partial.tar");
        let _ = fs::remove_file(&tmp);
        // `essential`: dpkg, a shell, coreutils and util-linux (nsenter, which the DaemonSets
        // start the controller with), no apt: the image installs the .deb with dpkg alone.
        run(Command::new("mmdebstrap")
            .args(["--variant=essential", "--quiet", SUITE])
            .arg(&tmp))?;
        fs::rename(&tmp, &tar).with_context(|| format!("renaming {}", tmp.display()))?;
    }
    prepare_rocm_root()?;
    prepare_unit_root()
}

/// `.tools/unit-root`: made once (9 min here on 2 busy cores with its downloads; 0 s when made).
fn prepare_unit_root() -> Result<()> {
    let dir = unit_root();
    let marker = dir.join(".gpreempt-unit-root");
    let want = format!("{SUITE} minbase {UNIT_ROOT_PACKAGES}\n");
    if fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(());
    }
    let tmp = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&tmp);
    // `minbase` (apt and dpkg: the test installs the .deb with dpkg -i) plus systemd; no
    // documentation or translations. Root mode: systemd's files keep their owners.
    run(Command::new("mmdebstrap")
        .args(["--variant=minbase", "--mode=root", "--quiet"])
        .arg(format!("--include={UNIT_ROOT_PACKAGES}"))
        .args([
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            SUITE,
        ])
        .arg(&tmp))?;
    fs::write(tmp.join(".gpreempt-unit-root"), &want)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

/// `.tools/rocm-trixie`: made once (about 40 s on 2 cores, downloads included; 0 s when made).
fn prepare_rocm_root() -> Result<()> {
    let dir = rocm_root();
    let marker = dir.join(".gpreempt-rocm");
    let want = format!("{ROCM_SUITE} {ROCM_PACKAGES}\n");
    if fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(());
    }
    let tmp = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&tmp);
    // `essential` plus the runtime (apt resolves the includes from outside; no apt inside):
    // nothing else runs in it. Documentation and translations are left out (~30 MB).
    run(Command::new("mmdebstrap")
        .args(["--variant=essential", "--quiet"])
        .arg(format!("--include={ROCM_PACKAGES}"))
        .args([
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            ROCM_SUITE,
        ])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian"))?;
    fs::write(tmp.join(".gpreempt-rocm"), &want)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}
