//! The guardian's voice: one stderr line for each thing it did or could not do.

/// Says `msg` on stderr, as the guardian.
pub(super) fn say(msg: &str) {
    eprintln!("gpreempt-ebpf nv-guardian: {msg}");
}
