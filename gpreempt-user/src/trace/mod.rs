//! `gpreempt-ebpf trace`: the event stream as readable lines or JSON Lines.
//!
//! Field names follow kfd_ioctl.h; the schema is in docs/observability.md.
//!
//! - [`fields`]: each event's fields, shared by both forms;
//! - [`json`]: the JSON Lines records;
//! - [`dispatches`]: `trace --dispatches` lines.

use std::io::Write;

use crate::observe::events::Event;

pub mod dispatches;
mod fields;
mod json;

use fields::kernel_fields;
pub use fields::*;
pub use json::write_json;

/// One readable line: `TIME PID/TID COMM EVENT fields... = RET (DURATION)`.
pub fn to_line(ev: &Event, t0_ns: u64) -> String {
    use std::fmt::Write as _;
    let o = ev.origin();
    let rel = o.ts_ns.saturating_sub(t0_ns);
    let mut s = format!(
        "{:>5}.{:06} {:>7}/{:<7} {:<15} {}",
        rel / 1_000_000_000,
        (rel % 1_000_000_000) / 1000,
        o.pid,
        o.tid,
        o.comm,
        event_name(ev)
    );
    if let Event::Kernel(k) = ev {
        for (name, v) in kernel_fields(k) {
            if v > 0xffff {
                let _ = write!(s, " {name}={v:#x}");
            } else {
                let _ = write!(s, " {name}={v}");
            }
        }
    }
    if let Event::Nv(n) = ev {
        for (k, v) in nv_fields(n) {
            let _ = write!(s, " {k}={}", v.text());
        }
        let _ = write!(s, " = {} <{:.1}us>", n.ret, n.duration_ns as f64 / 1000.0);
        if !n.verified {
            s.push_str(" [fd unverified]");
        }
    }
    if let Event::Launch(l) = ev {
        let _ = write!(s, " arg0={:#x}", l.arg0);
        if l.suppressed > 0 {
            let _ = write!(s, " (+{} launches since the last hint)", l.suppressed);
        }
    }
    if let Event::Ioctl(i) = ev {
        for (k, v) in call_fields(i) {
            let _ = write!(s, " {k}={}", v.text());
        }
        if i.ret < 0 {
            let errno = nix::errno::Errno::from_raw((-i.ret) as i32);
            let _ = write!(s, " = {} ({errno})", i.ret);
        } else {
            let _ = write!(s, " = {}", i.ret);
        }
        let _ = write!(s, " <{:.1}us>", i.duration_ns as f64 / 1000.0);
        if !i.verified {
            s.push_str(" [fd unverified]");
        }
    }
    s
}

/// Output format of `trace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// Writes events; flushes per batch so `trace` is live on a terminal and in a pipe.
pub struct Sink<W: Write> {
    out: W,
    format: Format,
    t0_ns: Option<u64>,
}

impl<W: Write> Sink<W> {
    pub fn new(out: W, format: Format) -> Self {
        Self {
            out,
            format,
            t0_ns: None,
        }
    }

    pub fn write(&mut self, ev: &Event) -> std::io::Result<()> {
        match self.format {
            Format::Json => write_json(ev, &mut self.out),
            Format::Text => {
                let ts = ev.origin().ts_ns;
                let t0 = *self.t0_ns.get_or_insert(ts);
                // The line quotes the process's name: one line, nothing a terminal obeys.
                writeln!(self.out, "{}", crate::term::clean(&to_line(ev, t0)))
            }
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests;
