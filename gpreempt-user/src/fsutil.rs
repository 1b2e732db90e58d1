//! Files the tool writes for other processes to read (status, targets): replaced whole, so a
//! reader never sees half a file.

use std::path::Path;

use anyhow::{Context as _, Result};

/// Writes `data` to a temporary sibling, then renames it over `path`.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}
