//! The audit log (`run --audit FILE`): one JSON line per decision, whole or not at all.
//!
//! A write that fails part-way (a full file system) is cut back to the last whole line, the lines
//! lost are counted, and every later record tries again: auditing resumes by itself when space
//! comes back, and status.json says it is failing meanwhile.

use std::io::Write;

/// Where the lines go: an append-only file, or a fake in tests.
pub trait Sink {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()>;
    /// Its length now.
    fn size(&mut self) -> std::io::Result<u64>;
    /// Cuts it back to `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl Sink for std::fs::File {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        Write::write_all(self, b)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

/// Failing since: the error, lines lost so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failing {
    pub error: String,
    pub lost: u64,
}

pub struct Audit<S: Sink> {
    sink: S,
    failing: Option<Failing>,
}

impl<S: Sink> Audit<S> {
    pub fn new(sink: S) -> Self {
        Self {
            sink,
            failing: None,
        }
    }

    /// Writes one record as a line. Returns what to log when auditing starts failing or
    /// resumes (once each).
    pub fn record(&mut self, v: &serde_json::Value) -> Option<String> {
        let mut line = v.to_string();
        line.push('\n');
        let before = self.sink.size();
        let r = match &before {
            Ok(_) => self.sink.write_all(line.as_bytes()),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        match (r, &mut self.failing) {
            (Ok(()), None) => None,
            (Ok(()), Some(f)) => {
                let lost = f.lost;
                self.failing = None;
                Some(format!(
                    "audit file: writing again after {lost} lost record(s)"
                ))
            }
            (Err(e), failing) => {
                // Never leave half a line: cut back to where this one began.
                if let Ok(len) = before {
                    let _ = self.sink.truncate(len);
                }
                match failing {
                    Some(f) => {
                        f.lost += 1;
                        f.error = e.to_string();
                        None
                    }
                    None => {
                        self.failing = Some(Failing {
                            error: e.to_string(),
                            lost: 1,
                        });
                        Some(format!(
                            "audit file: {e}; records are lost (counted in status.json) until a \
                             write succeeds again"
                        ))
                    }
                }
            }
        }
    }

    /// Set while records are being lost.
    pub fn failing(&self) -> Option<&Failing> {
        self.failing.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts at most `room` bytes in all; a write that does not fit writes what fits, then
    /// fails (as a full file system does).
    struct Disk {
        data: Vec<u8>,
        room: usize,
    }

    impl Sink for Disk {
        fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
            let fit = b.len().min(self.room.saturating_sub(self.data.len()));
            self.data.extend_from_slice(&b[..fit]);
            if fit < b.len() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            Ok(())
        }
        fn size(&mut self) -> std::io::Result<u64> {
            Ok(self.data.len() as u64)
        }
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_loses_whole_lines_counts_them_and_recovers() {
        let mut a = Audit::new(Disk {
            data: Vec::new(),
            room: 30,
        });
        let rec = serde_json::json!({"action": "suspend", "pid": 1}); // 28 bytes with '\n'
        assert_eq!(a.record(&rec), None);
        let w = a.record(&rec).unwrap();
        assert!(w.contains("No space left on device"), "{w}");
        assert_eq!(a.record(&rec), None, "said once");
        assert_eq!(a.failing().unwrap().lost, 2);
        // Only whole lines on disk.
        let text = String::from_utf8(a.sink.data.clone()).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.ends_with('\n'));
        // Space comes back: auditing resumes by itself and says how much was lost.
        a.sink.room = 1000;
        let w = a.record(&rec).unwrap();
        assert_eq!(w, "audit file: writing again after 2 lost record(s)");
        assert!(a.failing().is_none());
        assert_eq!(
            String::from_utf8(a.sink.data.clone())
                .unwrap()
                .lines()
                .count(),
            2
        );
    }
}
