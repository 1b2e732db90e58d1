//! The report's types: a check's [`Verdict`], the [`Check`] line itself, and the [`Root`] every
//! check reads below. The checks of every vendor build on them.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub finding: String,
    /// What to change (one sentence); `None` when ok.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: &str, finding: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Ok,
            finding: finding.into(),
            fix: None,
        }
    }
    pub fn warn(name: &str, finding: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Warn,
            finding: finding.into(),
            fix: Some(fix.into()),
        }
    }
    pub fn fail(name: &str, finding: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict: Verdict::Fail,
            finding: finding.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Where `/sys`, `/proc`, `/boot` and the like are: `/` on a host, a fake tree in tests.
#[derive(Clone, Debug)]
pub struct Root {
    pub(super) base: PathBuf,
}

impl Default for Root {
    fn default() -> Self {
        Self::at("/")
    }
}

impl Root {
    pub fn at(base: impl Into<PathBuf>) -> Self {
        Self { base: base.into() }
    }
    /// `abs` (an absolute host path) below this root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.base.join(abs.trim_start_matches('/'))
    }
    pub(super) fn read(&self, abs: &str) -> io::Result<String> {
        fs::read_to_string(self.path(abs))
    }
    /// The trimmed contents, `None` when unreadable.
    pub(super) fn value(&self, abs: &str) -> Option<String> {
        self.read(abs).ok().map(|s| s.trim().to_string())
    }
    pub(super) fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }
}

/// The numeric entries of a directory (pids under `/proc`, the KFD's `proc`); none when
/// unreadable.
pub(super) fn numeric_entries(dir: &Path) -> Vec<u32> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
