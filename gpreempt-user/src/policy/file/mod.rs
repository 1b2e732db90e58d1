//! The policy file: TOML text to a validated [`Policy`], every problem reported at once as
//! `file:LINE: key: message`, and the duration syntax (`20ms`, `1.5s`) its values use.
//!
//! This file holds the entry points (reading, parsing, binding pid rules) and the [`Parser`]
//! that collects problems with their lines; the document is walked in parts:
//! - [`document`]: the top-level tables, `[policy]`, `[timeslice]`, `[control]`, and the
//!   relations between values;
//! - [`tables`]: the `[adaptive]` and `[nvidia]` tables;
//! - [`rules`]: the `[[rule]]` tables, with the limits on their regexes;
//! - [`values`]: one value of a given type (table, string, duration, number, class, GPU list).

use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use toml::de::DeValue;
use toml::Spanned;

use super::Policy;

mod document;
mod rules;
mod tables;
#[cfg(test)]
mod tests;
mod values;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub source: String,
    /// (1-based line, message), in line order.
    pub problems: Vec<(usize, String)>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (line, msg)) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}:{line}: {msg}", self.source)?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyError {}

impl Policy {
    /// Parses and validates a policy file's text; `source` names it in messages.
    pub fn parse(text: &str, source: &str) -> Result<Policy, PolicyError> {
        let mut p = Parser::new(text);
        let policy = p.document(source);
        if p.problems.is_empty() {
            if let Some(policy) = policy {
                return Ok(policy);
            }
        }
        let mut problems = p.problems;
        // Stable: problems on one line keep the order they were found in.
        problems.sort_by_key(|(line, _)| *line);
        problems.dedup();
        Err(PolicyError {
            source: source.to_owned(),
            problems,
        })
    }

    /// Reads and parses a policy file: a regular file of at most [`MAX_POLICY_BYTES`], opened
    /// without blocking (a FIFO or a device would hang the controller, even against SIGTERM).
    /// Reads, parses and validates `path`, and binds its `pid` rules to the processes that
    /// have those pids now ([`Self::bind_pids`]).
    pub fn load(path: &Path) -> anyhow::Result<Policy> {
        let text = read_policy_file(path)?;
        let mut p = Self::parse(&text, &path.display().to_string())?;
        p.bind_pids(Path::new("/proc"));
        Ok(p)
    }

    /// A pid is not an identity: whoever gets a freed pid first owns it next. So each `pid`
    /// rule is bound to the process that has the pid now (its start time, under `proc_root`),
    /// and a process that gets the pid later does not match it; a pid nobody has matches
    /// nothing. Each binding is said in [`Self::pid_notes`]; a reload binds again.
    pub fn bind_pids(&mut self, proc_root: &Path) {
        let source = self.source.clone();
        let mut notes = Vec::new();
        for (i, r) in self.rules.iter_mut().enumerate() {
            let Some(pid) = r.pid else { continue };
            let at = format!("{source}: rule {} (line {})", i + 1, r.line);
            match crate::observe::procinfo::start_time(proc_root, pid) {
                Ok(t) => {
                    r.pid_bound = super::PidBound::Started(t);
                    notes.push(format!(
                        "{at}: pid {pid} is bound to the process that has it now (started at \
                         tick {t}); a process that gets pid {pid} later does not match (a \
                         reload binds again)"
                    ));
                }
                Err(_) => {
                    r.pid_bound = super::PidBound::NoProcess;
                    notes.push(format!(
                        "{at}: no process has pid {pid}: the rule matches nothing (pid rules \
                         name processes that run when the policy is loaded; reload once it runs)"
                    ));
                }
            }
        }
        self.pid_notes = notes;
    }
}

/// Largest policy file accepted (a policy is a few KiB; 10,000 rules fit). Parsing allocates a
/// few times the text: refused before reading.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// The policy file's text, refusing what is not a regular file of bounded size.
pub fn read_policy_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let shown = path.display();
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot read policy file {shown}"))?;
    let meta = f
        .metadata()
        .with_context(|| format!("cannot read policy file {shown}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        anyhow::bail!("policy file {shown} is {what}: give a regular file");
    }
    if meta.len() > MAX_POLICY_BYTES {
        anyhow::bail!(
            "policy file {shown} is {} bytes: larger than the {} MiB a policy may be",
            meta.len(),
            MAX_POLICY_BYTES >> 20
        );
    }
    let mut text = String::new();
    f.take(MAX_POLICY_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read policy file {shown} (is it UTF-8 text?)"))?;
    if text.len() as u64 > MAX_POLICY_BYTES {
        anyhow::bail!(
            "policy file {shown} grew past {} MiB while read",
            MAX_POLICY_BYTES >> 20
        );
    }
    Ok(text)
}

/// Parses `20ms`, `1.5s`, `500us`, `100ns` into nanoseconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    const HINT: &str = "(use e.g. 500us, 20ms, 1.5s)";
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("negative duration {s:?} {HINT}"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u128 = match unit.trim_start() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" => return Err(format!("duration {s:?} has no unit {HINT}")),
        _ => return Err(format!("invalid duration {s:?} {HINT}")),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(format!("invalid duration {s:?} {HINT}"));
    }
    let digits = |d: &str| -> Result<u128, String> {
        if d.is_empty() {
            return Ok(0);
        }
        d.parse::<u128>()
            .map_err(|_| format!("duration {s:?} is too large"))
    };
    let mut ns = digits(int)?
        .checked_mul(scale)
        .ok_or_else(|| format!("duration {s:?} is too large"))?;
    // Fractional digits beyond nanoseconds are dropped.
    let frac = &frac[..frac.len().min(12)];
    if !frac.is_empty() {
        ns += digits(frac)? * scale / 10u128.pow(frac.len() as u32);
    }
    u64::try_from(ns).map_err(|_| format!("duration {s:?} is too large"))
}

type Val<'i> = Spanned<DeValue<'i>>;

/// Walks the parsed document, collecting every problem with its line.
struct Parser<'t> {
    text: &'t str,
    /// Byte offsets of every '\n' in `text`.
    newlines: Vec<usize>,
    problems: Vec<(usize, String)>,
    /// Bytes the rules' compiled regexes use so far (against [`REGEX_BUDGET`]).
    regex_used: usize,
}

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Self {
        Self {
            text,
            newlines: text
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
            problems: Vec::new(),
            regex_used: 0,
        }
    }

    /// 1-based line of a byte offset: newlines before it, by binary search (a scan per rule
    /// made large policies quadratic: 40,000 rules took 8 s).
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.newlines.partition_point(|&n| n < end) + 1
    }

    fn err(&mut self, offset: usize, msg: String) {
        let line = self.line(offset);
        self.problems.push((line, msg));
    }
}
