//! Every artifact's licence is one the repository's licence files grant: each crate's declared
//! `license` names only licences with a LICENSE-* file of the right text, the eBPF object's
//! `license` section is the kernel's string for what the gpreempt-ebpf crate declares (and one the
//! kernel counts as GPL-compatible), and the package's copyright file says the same
//! (docs/licenses.md). No root needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object as _, ObjectSection as _};
use serde_json::Value;

/// The strings the kernel takes as GPL-compatible (`license_is_gpl_compatible()`,
/// include/linux/license.h): only programs with one may call GPL-only helpers.
const KERNEL_GPL_COMPATIBLE: [&str; 6] = [
    "GPL",
    "GPL v2",
    "GPL and additional rights",
    "Dual BSD/GPL",
    "Dual MIT/GPL",
    "Dual MPL/GPL",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The file that grants an SPDX licence, and words its text must have.
fn licence_file(id: &str) -> Option<(&'static str, [&'static str; 2])> {
    match id {
        "MIT" => Some((
            "LICENSE-MIT",
            [
                "Permission is hereby granted, free of charge",
                "MIT License",
            ],
        )),
        "Apache-2.0" => Some((
            "LICENSE-APACHE",
            ["Apache License", "Version 2.0, January 2004"],
        )),
        "GPL-2.0-only" => Some((
            "LICENSE-GPL-2.0",
            ["GNU GENERAL PUBLIC LICENSE", "Version 2, June 1991"],
        )),
        _ => None,
    }
}

/// The SPDX expression a kernel licence string stands for (include/linux/module.h's list).
fn spdx_of_kernel(s: &str) -> Option<&'static str> {
    match s {
        "GPL" | "GPL v2" => Some("GPL-2.0-only"),
        "Dual MIT/GPL" => Some("MIT OR GPL-2.0-only"),
        "Dual BSD/GPL" => Some("BSD-3-Clause OR GPL-2.0-only"),
        _ => None,
    }
}

/// Every workspace crate's name and declared licence (`cargo metadata`).
fn crates() -> Vec<(String, String)> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap().to_string();
            let licence = p["license"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} declares no license"))
                .to_string();
            (name, licence)
        })
        .collect()
}

/// The NUL-terminated string in an ELF object's `license` section.
fn object_licence(elf: &[u8]) -> String {
    let file = object::File::parse(elf).expect("an ELF object");
    let data = file
        .section_by_name("license")
        .expect("no license section")
        .data()
        .unwrap();
    let s = data.split(|b| *b == 0).next().unwrap();
    assert_eq!(
        s.len() + 1,
        data.len(),
        "one NUL-terminated string: {data:?}"
    );
    String::from_utf8(s.to_vec()).unwrap()
}

#[test]
fn every_crate_declares_a_licence_the_repository_grants() {
    let crates = crates();
    assert!(crates.len() >= 6, "{crates:?}");
    for (name, licence) in &crates {
        let expected = if name == "gpreempt-ebpf" {
            "MIT OR GPL-2.0-only"
        } else {
            "MIT OR Apache-2.0"
        };
        assert_eq!(licence, expected, "{name}");
        for id in licence.split(" OR ") {
            let (file, words) =
                licence_file(id).unwrap_or_else(|| panic!("{name}: no licence file for {id}"));
            let text = read(file);
            for w in words {
                assert!(text.contains(w), "{file} is not the {id} text: no {w:?}");
            }
        }
    }
}

#[test]
fn the_ebpf_object_declares_to_the_kernel_what_its_crate_declares() {
    let bpf = object_licence(gpreempt_user::observe::probe::EBPF_OBJECT);
    assert!(
        KERNEL_GPL_COMPATIBLE.contains(&bpf.as_str()),
        "{bpf:?}: the kernel would refuse the GPL-only helpers"
    );
    let declared = crates()
        .into_iter()
        .find(|(n, _)| n == "gpreempt-ebpf")
        .map(|(_, l)| l)
        .expect("the gpreempt-ebpf crate");
    assert_eq!(
        spdx_of_kernel(&bpf),
        Some(declared.as_str()),
        "the object says {bpf:?}, its crate {declared:?}"
    );
}

#[test]
fn the_package_copyright_file_names_the_same_licences() {
    let c = read("packaging/deb/copyright");
    assert!(c.starts_with(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
    ));
    let stanza = |files: &str| -> String {
        c.split("\n\n")
            .find(|p| p.starts_with(&format!("Files: {files}\n")))
            .unwrap_or_else(|| panic!("no Files: {files}"))
            .to_string()
    };
    assert!(stanza("*").contains("\nLicense: MIT or Apache-2.0"));
    assert!(stanza("gpreempt-ebpf/*").contains("\nLicense: MIT or GPL-2"));
    for l in ["MIT", "Apache-2.0", "GPL-2"] {
        assert!(
            c.contains(&format!("\n\nLicense: {l}\n")),
            "no License: {l} paragraph"
        );
    }
    assert!(c.contains("/usr/share/common-licenses/Apache-2.0"));
    assert!(c.contains("/usr/share/common-licenses/GPL-2"));
}
