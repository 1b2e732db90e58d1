//! What the deployment tests (tests/tests/packaging.rs) need besides Debian's packages, made once
//! in `.tools/` (idempotent; both come from registries CI reaches, and neither needs the network
//! once made):
//! - `.tools/k8s-validate`: the PyPI package kubernetes-validate, which checks manifests
//!   against the Kubernetes JSON schemas it bundles (offline);
//! - `.tools/image-base/debian-bookworm.tar`: a Debian root file system made by mmdebstrap
//!   from Debian's packages, the base the image test builds packaging/Containerfile on (no image
//!   registry is reachable from CI).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::{root, run};

/// Pinned: the schemas it bundles (Kubernetes 1.25 to 1.37) are what the tests validate against.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";
const SUITE: &str = "bookworm";

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
    Ok(())
}
