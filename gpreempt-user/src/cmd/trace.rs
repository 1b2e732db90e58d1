//! `gpreempt-ebpf trace`: the event stream, as text or JSON Lines, until Ctrl-C or --duration.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args as ClapArgs;
use tokio::signal::unix::{signal, SignalKind};

use super::Global;
use crate::{
    observe::events::{Event, EventSource, FdCheck},
    observe::hints::LaunchHints,
    observe::kfd::Paths,
    observe::probe::{ProbeOptions, Probes},
    observe::watch::{Intervals, Watcher},
    trace::{Format, Sink},
};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// JSON Lines, one object per event (schema in docs/observability.md).
    #[arg(long)]
    pub json: bool,
    /// Only this process (thread group id; filtered in the kernel).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only processes whose command name (comm) is this.
    #[arg(long)]
    pub comm: Option<String>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Write events to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Show the eBPF programs' own diagnostics (aya-log) on stderr.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Launch hints: uprobes on the launch entry points (HIP/HSA, libcuda) of every GPU process
    /// seen (or only of --pid).
    #[arg(long)]
    pub launches: bool,
    /// At most one launch hint per process per this many ms (0: every launch).
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    pub launch_gap: f64,
    /// No kernel-internal probes on amdkfd (kprobes / fentry on its queue functions); ioctls
    /// still come from --ioctl-source.
    #[arg(long)]
    pub no_kernel_probes: bool,
    /// Drop a process's records beyond PER_S a second (bursts of BURST) in the kernel, counted
    /// per process (`run` and `top` always limit; a trace shows everything by default).
    #[arg(long, value_name = "PER_S[:BURST]", value_parser = parse_rate)]
    pub rate_limit: Option<(u32, u32)>,
    /// The AQL packets of every queue instead of ioctls: kernel dispatches (grid, work-group,
    /// kernel object and name) and barriers, read from the rings while pending, plus (with
    /// --json) each queue's read/write dispatch ids at every sampling tick.
    #[arg(long, conflicts_with = "launches")]
    pub dispatches: bool,
    /// With --dispatches: how often the rings are read (ms).
    #[arg(long, value_name = "MS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_interval: u64,
}

/// `PER_S[:BURST]`, both positive integers; BURST defaults to PER_S.
pub(crate) fn parse_rate(s: &str) -> Result<(u32, u32), String> {
    let num = |t: &str| match t.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{t:?} is not a positive whole number (expected PER_S[:BURST], e.g. 8192:32768)"
        )),
    };
    match s.split_once(':') {
        Some((r, b)) => Ok((num(r)?, num(b)?)),
        None => num(s).map(|r| (r, r)),
    }
}

pub async fn main(g: &Global, args: &Args) -> Result<ExitCode> {
    if let Some(d) = args.duration {
        anyhow::ensure!(
            d.is_finite() && d > 0.0,
            "--duration must be a positive number of seconds"
        );
    }
    let out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    if args.dispatches {
        return dispatches(g, args, out).await;
    }
    let mut sink = Sink::new(
        out,
        if args.json {
            Format::Json
        } else {
            Format::Text
        },
    );

    let mut probes = attach(g, args)?;
    let mut source = EventSource::new(probes.take_events()?, FdCheck::new(&g.kfd_device))
        .context("watching the ring buffer")?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = until(args);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut launches = watch_launches(args, &probes)?;
    eprintln!("gpreempt-ebpf: {}", probes.summary());
    for why in crate::observe::probe::not_live_reasons(probes.sources()) {
        eprintln!("gpreempt-ebpf: {why}");
    }
    let nvidia = std::path::Path::new(gpreempt_common::nv::NVIDIACTL).exists();
    for line in nv_gpu_lines(&crate::observe::nv::gpus::read_joined(
        std::path::Path::new("/proc"),
        nvidia,
    )) {
        eprintln!("gpreempt-ebpf: {line}");
    }
    // Tests and scripts wait for this line before they start the workload.
    eprintln!(
        "gpreempt-ebpf: tracing KFD ioctls on {}{}{} (Ctrl-C to stop)",
        g.kfd_device.display(),
        if nvidia { " and NVIDIA RM escapes" } else { "" },
        args.pid.map(|p| format!(" of pid {p}")).unwrap_or_default()
    );
    let mut batch: Vec<Event> = Vec::with_capacity(256);
    let mut reported_lost = 0;
    // Records the rate limit dropped, per process: read live, final at its exit.
    let mut limited: std::collections::BTreeMap<u32, u64> = Default::default();
    let mut written = 0u64;
    loop {
        tokio::select! {
            r = source.next_batch(&mut batch) => {
                r.context("reading the ring buffer")?;
                note_limited(&mut limited, &batch);
                if let Some(l) = launches.as_mut() {
                    follow_launches(l, &mut probes, &batch);
                }
                if let Err(e) = emit(&batch, args, &mut sink, &mut written) {
                    return write_failed(e);
                }
            }
            Some((pid, r, took)) = async {
                match launches.as_mut() {
                    Some(l) => l.next().await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(l) = launches.as_mut() {
                    // Alive: its exit would have unwatched it.
                    if let Some(line) = l.resolved(&mut probes, pid, r, true).describe(pid, took) {
                        eprintln!("gpreempt-ebpf: {line}");
                    }
                }
            }
            _ = tick.tick() => {
                probes.flush_log();
                for (pid, n) in probes.rate_limited().unwrap_or_default() {
                    let e = limited.entry(pid).or_default();
                    *e = (*e).max(u64::from(n));
                }
                let lost = probes.stats()?.lost();
                if lost > reported_lost {
                    log::warn!("{} KFD records lost in the kernel so far (ring buffer or in-flight map full)", lost);
                    reported_lost = lost;
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut deadline => break,
        }
    }
    // Drain what is already in the ring buffer without waiting for more.
    while let Ok(Ok(())) =
        tokio::time::timeout(Duration::from_millis(20), source.next_batch(&mut batch)).await
    {
        if batch.is_empty() {
            break;
        }
        note_limited(&mut limited, &batch);
        if emit(&batch, args, &mut sink, &mut written).is_err() {
            break;
        }
    }
    probes.flush_log();
    for (pid, n) in probes.rate_limited().unwrap_or_default() {
        let e = limited.entry(pid).or_default();
        *e = (*e).max(u64::from(n));
    }
    for (pid, n) in &limited {
        eprintln!("gpreempt-ebpf: pid {pid}: {n} records dropped by the rate limit");
    }
    eprintln!("gpreempt-ebpf: {}", summary(written, &probes, &source)?);
    Ok(ExitCode::SUCCESS)
}

/// The probes for a trace: every record the operator asked to see (losses are counted).
fn attach(g: &Global, args: &Args) -> Result<Probes> {
    anyhow::ensure!(
        args.launch_gap.is_finite() && args.launch_gap >= 0.0,
        "--launch-gap must be a number of milliseconds >= 0"
    );
    Probes::attach(&ProbeOptions {
        pid: args.pid,
        ebpf_log: args.ebpf_log,
        no_kernel_probes: args.no_kernel_probes,
        launch_gap_ns: (args.launch_gap * 1e6) as u64,
        kfd_device: g.kfd_device.clone(),
        nvidia_devices: g.nvidia_device.clone(),
        rate_limit: args.rate_limit,
        ioctl_source: g.ioctl_source,
        ring_bytes: g.ring_kib * 1024,
    })
}

/// `--launches`: launch uprobes on the traced process, or on every KFD process now.
fn watch_launches(args: &Args, probes: &Probes) -> Result<Option<LaunchHints>> {
    let Some(mut l) = args.launches.then(LaunchHints::default) else {
        return Ok(None);
    };
    let pids: Vec<u32> = match args.pid {
        Some(p) => vec![p],
        None => crate::observe::kfd::sysfs::read_procs(
            &crate::observe::kfd::Paths::default().sysfs,
            |_, _| None,
        )
        .map(|s| s.procs.iter().map(|p| p.pid).collect())
        .unwrap_or_default(),
    };
    for pid in pids {
        l.watch(probes, pid)?;
    }
    Ok(Some(l))
}

/// The closing line: what was written, seen, lost and dropped, and why.
fn summary(written: u64, probes: &Probes, source: &EventSource) -> Result<String> {
    let k = probes.stats()?;
    let u = source.stats;
    Ok(format!(
        "summary: written={written} seen={} lost_ringbuf_full={} lost_inflight_full={} \
         args_unreadable={} not_kfd={} unverified={} malformed={} kernel_probe_hits={} \
         launches_seen={} launch_hints={} dropped_other_file={} rate_limited={}",
        k.seen,
        k.ringbuf_full,
        k.inflight_full,
        k.args_fault,
        // Named `not_kfd` in the line (scripts parse it), whichever device was wanted.
        u.not_device,
        u.unverified,
        u.malformed,
        k.kernel_seen,
        k.launch_seen,
        k.launch_emitted,
        k.other_file,
        k.rate_limited
    ))
}

/// One line per NVIDIA GPU for the banner: its index, name, bus id and UUID (the ids nvidia-smi
/// and dcgm-exporter use) and the RM device instance its objects carry (`NV01_DEVICE_0`'s
/// `deviceId` in `rm_alloc` events).
pub(crate) fn nv_gpu_lines(gpus: &[crate::observe::nv::gpus::NvGpu]) -> Vec<String> {
    gpus.iter()
        .map(|g| {
            format!(
                "NVIDIA GPU {}, RM device instance {}",
                crate::term::clean(&g.describe()),
                g.device_instance
                    .map_or_else(|| "unknown".to_string(), |i| i.to_string())
            )
        })
        .collect()
}

/// `trace --dispatches`: the live map's sampler, streaming each packet it decodes once.
async fn dispatches(g: &Global, args: &Args, mut out: Box<dyn Write>) -> Result<ExitCode> {
    use crate::trace::dispatches::{write_dispatch, write_sample, write_summary};
    let mut opts = g.probe_options();
    opts.pid = args.pid;
    opts.rate_limit = args.rate_limit;
    let mut w = Watcher::start(
        Paths::default(),
        opts,
        Intervals::from_ms(1000, 1000, args.sample_interval),
    )?;
    w.state.take_dispatches();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = until(args);
    tokio::pin!(deadline);
    for why in &w.warnings {
        eprintln!("gpreempt-ebpf: {why}");
    }
    eprintln!(
        "gpreempt-ebpf: tracing AQL packets every {} ms{} (Ctrl-C to stop)",
        args.sample_interval,
        args.pid.map(|p| format!(" of pid {p}")).unwrap_or_default()
    );
    let wanted = |pid: u32, comm: &str| {
        args.pid.is_none_or(|p| p == pid) && args.comm.as_ref().is_none_or(|c| c == comm)
    };
    // Last sampling tick written per queue; queues whose summary was written.
    let mut sampled: std::collections::HashMap<(u32, u32), u64> = Default::default();
    let mut summarized: std::collections::HashSet<(u32, u32)> = Default::default();
    let has_packets = |q: &crate::observe::model::Queue| {
        q.activity.dispatches.consumed > 0 || q.activity.dispatches.decoded > 0
    };
    // JSON summaries go with the packets; text ones to stderr.
    let json = args.json;
    let summary = |out: &mut Box<dyn Write>,
                   err: &mut std::io::StderrLock<'_>,
                   pid: u32,
                   comm: &str,
                   q: &crate::observe::model::Queue| {
        if json {
            write_summary(out, true, pid, comm, q)
        } else {
            write_summary(err, false, pid, comm, q)
        }
    };
    let mut written = 0u64;
    loop {
        tokio::select! {
            r = w.pump() => r?,
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut deadline => break,
        }
        let res = (|| -> std::io::Result<()> {
            for d in w.state.take_dispatches() {
                let Some(p) = w.state.procs.get(&d.pid) else {
                    continue;
                };
                if !wanted(p.pid, p.comm()) {
                    continue;
                }
                let kernel = w.state.kernel_name(d.pid, d.packet.packet.kernel_object);
                write_dispatch(&mut out, args.json, &d, p.comm(), kernel)?;
                written += 1;
            }
            let mut err = std::io::stderr().lock();
            for p in w.state.procs.values().filter(|p| wanted(p.pid, p.comm())) {
                for q in p.queues.values() {
                    if args.json && q.alive() {
                        let last = sampled.entry((p.pid, q.queue_id)).or_default();
                        if q.activity.sample_ns > *last {
                            *last = q.activity.sample_ns;
                            write_sample(&mut out, p.pid, q)?;
                        }
                    }
                    // Said when the queue ends: the model forgets it a moment later.
                    let ended = !q.alive() || p.exited_ns.is_some();
                    if ended && has_packets(q) && summarized.insert((p.pid, q.queue_id)) {
                        summary(&mut out, &mut err, p.pid, p.comm(), q)?;
                    }
                }
            }
            out.flush()
        })();
        if let Err(e) = res {
            return write_failed(e);
        }
    }
    let res = (|| -> std::io::Result<()> {
        let mut err = std::io::stderr().lock();
        for p in w.state.procs.values().filter(|p| wanted(p.pid, p.comm())) {
            for q in p.queues.values().filter(|q| has_packets(q)) {
                if summarized.insert((p.pid, q.queue_id)) {
                    summary(&mut out, &mut err, p.pid, p.comm(), q)?;
                }
            }
        }
        out.flush()
    })();
    if let Err(e) = res {
        return write_failed(e);
    }
    eprintln!("gpreempt-ebpf: summary: packets written={written}");
    if w.channels.reads > 0 {
        eprintln!(
            "gpreempt-ebpf: NVIDIA channel activity: {} USERD reads, {:.1} us each on average",
            w.channels.reads,
            w.channels.read_ns as f64 / w.channels.reads as f64 / 1e3
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Sleeps for --duration (forever without it).
fn until(args: &Args) -> tokio::time::Sleep {
    tokio::time::sleep(
        args.duration
            .map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(u64::MAX / 4)),
    )
}

/// A process's exit carries its final count of rate-limited records.
fn note_limited(limited: &mut std::collections::BTreeMap<u32, u64>, batch: &[Event]) {
    for ev in batch {
        if let Event::ProcessExit(x) = ev {
            if x.rate_limited > 0 {
                limited.insert(x.origin.pid, x.rate_limited);
            }
        }
    }
}

/// `trace --launches`: launch hints on every GPU process as it shows up (resolved off the loop,
/// the watcher's lifecycle), off at its exit.
fn follow_launches(hints: &mut LaunchHints, probes: &mut Probes, batch: &[Event]) {
    for ev in batch {
        let pid = match ev {
            Event::Ioctl(i) => i.origin.pid,
            Event::Nv(n) => n.origin.pid,
            Event::ProcessExit(p) => {
                hints.unwatch(probes, p.origin.pid);
                continue;
            }
            _ => continue,
        };
        if let Err(e) = hints.watch(probes, pid) {
            eprintln!("gpreempt-ebpf: pid {pid}: no launch hints: {e:#}");
        }
    }
}

/// Writes the wanted events of a batch and flushes, counting what was written.
fn emit<W: Write>(
    batch: &[Event],
    args: &Args,
    sink: &mut Sink<W>,
    written: &mut u64,
) -> std::io::Result<()> {
    for ev in batch.iter().filter(|e| wanted(e, args)) {
        sink.write(ev)?;
        *written += 1;
    }
    sink.flush()
}

/// The user-space filters of `trace` (the pid filter runs in the kernel).
fn wanted(ev: &Event, args: &Args) -> bool {
    let comm = &ev.origin().comm;
    args.comm.as_ref().is_none_or(|c| c == comm)
}

/// A closed stdout (e.g. `| head`) ends tracing quietly; other write errors are reported.
pub(crate) fn write_failed(e: std::io::Error) -> Result<ExitCode> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(ExitCode::SUCCESS);
    }
    Err(e).context("writing events")
}

#[cfg(test)]
mod tests {
    /// The banner names each NVIDIA GPU by index, name, bus id and UUID, with the RM device
    /// instance its `rm_alloc` events carry.
    #[test]
    fn the_banner_names_nvidia_gpus_with_their_device_instance() {
        let mut gpus = crate::observe::nv::gpus::fixture::two_h100_crossed();
        gpus[1].device_instance = None;
        assert_eq!(
            super::nv_gpu_lines(&gpus),
            [
                "NVIDIA GPU 0 NVIDIA H100 80GB HBM3 00000000:19:00.0 \
                 GPU-11111111-2222-3333-4444-555555555555, RM device instance 1",
                "NVIDIA GPU 1 NVIDIA H100 80GB HBM3 00000000:3B:00.0 \
                 GPU-66666666-7777-8888-9999-aaaaaaaaaaaa, RM device instance unknown",
            ]
        );
    }
}
