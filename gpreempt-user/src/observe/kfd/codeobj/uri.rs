//! ROCr's code object URIs: where an entry of the loader list keeps its bytes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::PathBuf;

use anyhow::{bail, ensure, Context as _, Result};

/// Where a code object's bytes are, from its URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Location {
    /// `memory://PID#offset=ADDR&size=N`: in the process's memory. The PID is the one in the
    /// process's own pid namespace, so it is not compared with ours.
    Memory { address: u64, size: u64 },
    /// `file://PATH[#offset=N&size=M]`: in a file, as the process sees it; no size: to the end.
    File {
        path: PathBuf,
        offset: u64,
        size: Option<u64>,
    },
}

/// Parses ROCr's code object URIs (`amd_hsa_loader.cpp`; rocgdb's `solib-rocm.c` reads them the
/// same way): scheme (any case) `://` path, then `#` or `?` and `&`-separated `key=value`
/// parameters. File paths are percent-encoded; numbers are decimal or `0x` hex.
pub(super) fn parse_uri(uri: &str) -> Result<Location> {
    let (scheme, rest) = uri
        .split_once("://")
        .with_context(|| format!("not a code object URI (no scheme): {uri:?}"))?;
    let (path, query) = match rest.find(['#', '?']) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let mut offset = None;
    let mut size = None;
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let slot = match key {
            "offset" => &mut offset,
            "size" => &mut size,
            _ => continue,
        };
        *slot =
            Some(parse_number(value).with_context(|| format!("bad {key} {value:?} in {uri:?}"))?);
    }
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => {
            ensure!(
                !path.is_empty() && path.bytes().all(|b| b.is_ascii_digit()),
                "no pid in {uri:?}"
            );
            let address = offset.with_context(|| format!("no offset in {uri:?}"))?;
            let size = size
                .filter(|&s| s > 0)
                .with_context(|| format!("no size in {uri:?}"))?;
            Ok(Location::Memory { address, size })
        }
        "file" => {
            let path = PathBuf::from(OsString::from_vec(percent_decode(path)));
            ensure!(path.is_absolute(), "not an absolute path in {uri:?}");
            Ok(Location::File {
                path,
                offset: offset.unwrap_or(0),
                size: size.filter(|&s| s > 0),
            })
        }
        other => bail!("unsupported code object URI scheme {other:?} in {uri:?}"),
    }
}

pub(super) fn parse_number(v: &str) -> Result<u64> {
    Ok(
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16)?,
            None => v.parse()?,
        },
    )
}

/// `%XX` to the byte; anything else as it is (as rocgdb does with a stray `%`).
pub(super) fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}
