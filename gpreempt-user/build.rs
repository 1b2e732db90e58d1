//! Builds the eBPF programs (gpreempt-ebpf, bpfel-unknown-none) and embeds them in the binary.
use anyhow::{bail, Context as _};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_EBPF_TOOLCHAIN");
    println!("cargo:rerun-if-changed=../gpreempt-common/src");
    // `.cargo/config.toml` points this at the toolchain `cargo xtask setup` prepared; a user may set
    // it to a rustup toolchain name instead (e.g. `nightly`, with rust-src and bpf-linker).
    let toolchain = std::env::var("AYA_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    let as_path = PathBuf::from(&toolchain);
    if as_path.is_absolute() && !as_path.join("bin/rustc").exists() {
        bail!(
            "no eBPF toolchain at {}: run `cargo xtask setup` first (or set AYA_EBPF_TOOLCHAIN to a \
             nightly toolchain with rust-src, and put bpf-linker on PATH)",
            as_path.display()
        );
    }
    let ebpf_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("../gpreempt-ebpf")
        .canonicalize()
        .context("gpreempt-ebpf crate not found next to gpreempt-user")?;
    let root_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "gpreempt-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
