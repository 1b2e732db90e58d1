//! Who did what an event records: every decoder fills it in from the record's header.

use gpreempt_common::record::RecordHeader;

/// Who did it, and when (CLOCK_MONOTONIC ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
}

fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// The origin a record's header names.
pub(super) fn origin(h: &RecordHeader) -> Origin {
    Origin {
        ts_ns: h.ts_ns,
        pid: h.pid,
        tid: h.tid,
        comm: comm_string(&h.comm),
    }
}
