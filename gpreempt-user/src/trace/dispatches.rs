//! `trace --dispatches` lines (JSON Lines schema in docs/observability.md).

use crate::term::clean;
use std::io::Write;

use serde::Serialize;

use crate::observe::model::{FreshDispatch, Queue};

#[derive(Serialize)]
struct DispatchLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    ts_ns: u64,
    pid: u32,
    comm: &'a str,
    gpu_id: u32,
    queue_id: u32,
    dispatch_id: u64,
    packet: &'static str,
    barrier: bool,
    grid: [u32; 3],
    workgroup: [u16; 3],
    work_items: u64,
    workgroups: u64,
    kernel_object: u64,
    kernel: Option<&'a str>,
    private_segment_size: u32,
    group_segment_size: u32,
}

// The samples' and the summary's keys are in alphabetical order: the order they were first
// written in (a `serde_json::json!` map), kept so no consumer sees a change.

#[derive(Serialize)]
struct AqlSample {
    gpu_id: u32,
    pid: u32,
    queue_id: u32,
    read_dispatch_id: u64,
    ts_ns: u64,
    #[serde(rename = "type")]
    kind: &'static str,
    write_dispatch_id: u64,
}

/// An NVIDIA TSG's GPFIFO entries fetched (GP_GET) and submitted (GP_PUT) over its channels.
#[derive(Serialize)]
struct GpfifoSample {
    gp_get_total: u64,
    gp_put_total: u64,
    gpu_id: u32,
    pid: u32,
    ts_ns: u64,
    tsg: u32,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct DispatchSummary<'a> {
    barriers: u64,
    comm: &'a str,
    consumed: u64,
    decoded: u64,
    gpu_id: u32,
    kernel_dispatches: u64,
    pid: u32,
    queue_id: u32,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// One decoded packet.
pub fn write_dispatch<W: Write>(
    w: &mut W,
    json: bool,
    d: &FreshDispatch,
    comm: &str,
    kernel: Option<&str>,
) -> std::io::Result<()> {
    let p = &d.packet.packet;
    let dispatch = p.kind == gpreempt_common::aql::PacketKind::KernelDispatch;
    if !json {
        // The process names itself and its code objects name the kernels: nothing a terminal
        // obeys.
        let (comm, kernel) = (clean(comm), kernel.map(clean));
        let what = if dispatch {
            format!(
                "grid {}x{}x{} wg {}x{}x{} object {:#x}{}",
                p.grid[0],
                p.grid[1],
                p.grid[2],
                p.workgroup[0],
                p.workgroup[1],
                p.workgroup[2],
                p.kernel_object,
                kernel.map(|k| format!(" {k}")).unwrap_or_default()
            )
        } else {
            String::new()
        };
        return writeln!(
            w,
            "{:>6}.{:06} {comm}[{}] gpu {} q{} #{} {}{} {what}",
            d.ts_ns / 1_000_000_000,
            d.ts_ns % 1_000_000_000 / 1000,
            d.pid,
            d.gpu_id,
            d.queue_id,
            d.packet.dispatch_id,
            p.kind.name(),
            if p.barrier { " barrier" } else { "" },
        );
    }
    let line = DispatchLine {
        kind: "dispatch",
        ts_ns: d.ts_ns,
        pid: d.pid,
        comm,
        gpu_id: d.gpu_id,
        queue_id: d.queue_id,
        dispatch_id: d.packet.dispatch_id,
        packet: p.kind.name(),
        barrier: p.barrier,
        grid: p.grid,
        workgroup: p.workgroup,
        work_items: if dispatch { p.work_items() } else { 0 },
        workgroups: if dispatch { p.workgroups() } else { 0 },
        kernel_object: p.kernel_object,
        kernel,
        private_segment_size: p.private_segment_size,
        group_segment_size: p.group_segment_size,
    };
    serde_json::to_writer(&mut *w, &line)?;
    w.write_all(b"\n")
}

/// A queue's dispatch ids at one sampling tick (JSON only: RPTR/WPTR behaviour over time).
pub fn write_sample<W: Write>(w: &mut W, pid: u32, q: &Queue) -> std::io::Result<()> {
    let a = &q.activity;
    let (Some(read), Some(write)) = (a.read_dispatch_id, a.write_dispatch_id) else {
        return Ok(());
    };
    // An NVIDIA TSG's ids count GPFIFO entries over its channels, not AQL packets.
    if q.nv.is_some() {
        serde_json::to_writer(
            &mut *w,
            &GpfifoSample {
                gp_get_total: read,
                gp_put_total: write,
                gpu_id: q.gpu_id,
                pid,
                ts_ns: a.sample_ns,
                tsg: q.queue_id,
                kind: "gpfifo_sample",
            },
        )?;
    } else {
        serde_json::to_writer(
            &mut *w,
            &AqlSample {
                gpu_id: q.gpu_id,
                pid,
                queue_id: q.queue_id,
                read_dispatch_id: read,
                ts_ns: a.sample_ns,
                kind: "aql_sample",
                write_dispatch_id: write,
            },
        )?;
    }
    w.write_all(b"\n")
}

/// What a queue's packets amounted to, at the end of a trace.
pub fn write_summary<W: Write>(
    w: &mut W,
    json: bool,
    pid: u32,
    comm: &str,
    q: &Queue,
) -> std::io::Result<()> {
    let m = &q.activity.dispatches;
    if !json {
        let comm = clean(comm);
        let cov = m
            .coverage()
            .map(|c| format!(" ({:.0}%)", c * 100.0))
            .unwrap_or_default();
        return writeln!(
            w,
            "{comm}[{pid}] q{}: {} packets decoded of {} consumed{cov}; {} kernel dispatches, {} barriers",
            q.queue_id, m.decoded, m.consumed, m.kernel_dispatches, m.barriers
        );
    }
    serde_json::to_writer(
        &mut *w,
        &DispatchSummary {
            barriers: m.barriers,
            comm,
            consumed: m.consumed,
            decoded: m.decoded,
            gpu_id: q.gpu_id,
            kernel_dispatches: m.kernel_dispatches,
            pid,
            queue_id: q.queue_id,
            kind: "dispatch_summary",
        },
    )?;
    w.write_all(b"\n")
}
