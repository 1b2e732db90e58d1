//! `run --reload-on-change`: the policy file is re-read when it changes, as on SIGHUP. In a
//! Kubernetes pod the policy is a ConfigMap volume, which the kubelet updates by swapping a
//! `..data` link to a new directory: the file's path stays, the file behind it is new. So the
//! identity (device, inode), size and modification time of what the path resolves to are
//! compared, every couple of seconds, from the loop's publish tick (a stat, no watch to lose).

use std::{os::unix::fs::MetadataExt as _, path::PathBuf};

/// What the path resolves to: device, inode, size, mtime (s, ns).
type Fingerprint = (u64, u64, u64, i64, i64);

pub(super) struct PolicyWatch {
    path: PathBuf,
    last: Option<Fingerprint>,
}

fn fingerprint(path: &std::path::Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

impl PolicyWatch {
    pub(super) fn new(path: PathBuf) -> Self {
        let last = fingerprint(&path);
        Self { path, last }
    }

    /// Whether the file changed since the last call; a file that is gone (mid-swap) is not a
    /// change: the reload waits until a file is there again.
    pub(super) fn changed(&mut self) -> bool {
        match fingerprint(&self.path) {
            Some(now) if Some(now) != self.last => {
                self.last = Some(now);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ConfigMap's update: `policy.toml -> ..data/policy.toml`, `..data -> ..2026_1`, and the
    /// kubelet points `..data` at a new directory. The path is the same; the watch sees it.
    #[test]
    fn a_configmap_swap_and_an_edit_are_changes_a_missing_file_is_not() {
        let dir = std::env::temp_dir().join(format!("gp-policy-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for v in ["..2026_1", "..2026_2"] {
            std::fs::create_dir_all(dir.join(v)).unwrap();
            std::fs::write(dir.join(v).join("policy.toml"), format!("# {v}\n")).unwrap();
        }
        std::os::unix::fs::symlink("..2026_1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/policy.toml", dir.join("policy.toml")).unwrap();
        let mut w = PolicyWatch::new(dir.join("policy.toml"));
        assert!(!w.changed(), "nothing changed yet");
        // The kubelet's atomic swap: a new link renamed over `..data`.
        std::os::unix::fs::symlink("..2026_2", dir.join("..data.tmp")).unwrap();
        std::fs::rename(dir.join("..data.tmp"), dir.join("..data")).unwrap();
        assert!(w.changed(), "the swap");
        assert!(!w.changed(), "seen once");
        // Gone for a moment: not a change, and its return is one.
        std::fs::remove_file(dir.join("..data")).unwrap();
        assert!(!w.changed());
        std::os::unix::fs::symlink("..2026_1", dir.join("..data")).unwrap();
        assert!(w.changed());
        // An edit in place (another size).
        std::fs::write(dir.join("..2026_1/policy.toml"), "# edited, longer\n").unwrap();
        assert!(w.changed());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
