//! The JSON Lines form: one typed record per event (schema in docs/observability.md).

use std::io::Write;

use serde::Serialize;

use super::fields::*;
use crate::observe::events::Event;

/// Event-specific fields in their order, serialized as JSON object entries.
struct Pairs<'a, V>(&'a [(&'static str, V)]);

impl<V: Serialize> Serialize for Pairs<'_, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One `--json` line (docs/observability.md): the common fields, then the kind's own, in this
/// order.
#[derive(Serialize)]
struct EventLine<'a> {
    ts_ns: u64,
    pid: u32,
    tid: u32,
    comm: &'a str,
    event: &'a str,
    #[serde(flatten)]
    body: Body<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Body<'a> {
    ProcessExit {},
    Kernel {
        source: &'static str,
        #[serde(flatten)]
        fields: Pairs<'a, u64>,
    },
    Launch {
        source: &'static str,
        suppressed: u32,
        arg0: u64,
    },
    Nv {
        vendor: &'static str,
        ret: i64,
        duration_ns: u64,
        fd: i32,
        /// Present only when false.
        #[serde(skip_serializing_if = "is_true")]
        verified: bool,
        #[serde(flatten)]
        fields: Pairs<'a, Val>,
    },
    Ioctl {
        ret: i64,
        duration_ns: u64,
        fd: i32,
        nr: u32,
        /// Present only when false.
        #[serde(skip_serializing_if = "is_true")]
        verified: bool,
        #[serde(flatten)]
        fields: Pairs<'a, Val>,
    },
}

/// Writes one JSON object per event (docs/observability.md documents the schema). Serialized
/// straight to `w`: building a `serde_json::Value` per event was the bottleneck of the consumer.
pub fn write_json<W: Write>(ev: &Event, w: &mut W) -> std::io::Result<()> {
    let o = ev.origin();
    let event = event_name(ev);
    let fields;
    let kernel;
    let body = match ev {
        Event::ProcessExit(_) => Body::ProcessExit {},
        Event::Kernel(k) => {
            kernel = kernel_fields(k);
            Body::Kernel {
                source: "kprobe",
                fields: Pairs(&kernel),
            }
        }
        Event::Launch(l) => Body::Launch {
            source: "uprobe",
            suppressed: l.suppressed,
            arg0: l.arg0,
        },
        Event::Nv(n) => {
            fields = nv_fields(n);
            Body::Nv {
                vendor: "nvidia",
                ret: n.ret,
                duration_ns: n.duration_ns,
                fd: n.fd,
                verified: n.verified,
                fields: Pairs(&fields),
            }
        }
        Event::Ioctl(i) => {
            fields = call_fields(i);
            Body::Ioctl {
                ret: i.ret,
                duration_ns: i.duration_ns,
                fd: i.fd,
                nr: i.nr(),
                verified: i.verified,
                fields: Pairs(&fields),
            }
        }
    };
    let line = EventLine {
        ts_ns: o.ts_ns,
        pid: o.pid,
        tid: o.tid,
        comm: &o.comm,
        event: &event,
        body,
    };
    serde_json::to_writer(&mut *w, &line)?;
    w.write_all(b"\n")
}
