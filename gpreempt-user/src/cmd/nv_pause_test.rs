//! `gpreempt-ebpf nv-pause-test` (hidden): the NVIDIA pause path end to end on a real GPU, for the
//! GPU experiment kit (scripts/gpu-experiment.sh). The observer builds the model of a process
//! started after it (its RM clients, TSGs and channels, from the RM escapes); then pause / resume
//! cycles go through the controller's own NVIDIA path ([`NvControl`]: the guardian's hold first,
//! then pauses through a duplicate of the target's fd). Prints one JSON line per cycle.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    backend::nv::controller::NvControl,
    observe::kfd::Paths,
    observe::model::QueueKind,
    observe::watch::{Intervals, Watcher},
    outcome::QueueOutcome,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The target: the first process with this command name that allocates a compute TSG.
    #[arg(long)]
    pub comm: String,
    /// Seconds the target runs before each pause (and after the last one).
    #[arg(long, default_value_t = 1.5)]
    pub run: f64,
    /// Seconds each pause lasts.
    #[arg(long, default_value_t = 1.0)]
    pub pause: f64,
    #[arg(long, default_value_t = 3)]
    pub cycles: u32,
    /// Kill ourselves (SIGKILL) in the first pause: the guardian must resume the target.
    #[arg(long)]
    pub die_while_paused: bool,
    /// Odd cycles pause with bOnlyDisableScheduling (running work finishes), even ones preempt:
    /// both pause modes timed on the same target.
    #[arg(long)]
    pub alternate_schedule_only: bool,
    /// Seconds to wait for the target.
    #[arg(long, default_value_t = 60.0)]
    pub wait: f64,
}

/// Waits until a `comm` process has a compute TSG with channels and allocates nothing for 2 s.
async fn find_target(w: &mut Watcher, comm: &str, wait: Duration) -> Result<u32> {
    let t0 = Instant::now();
    let mut last: Option<(u32, usize, Instant)> = None;
    while t0.elapsed() < wait {
        tokio::time::timeout(Duration::from_millis(200), w.pump())
            .await
            .ok()
            .transpose()?;
        let found = w.state.procs.values().find(|p| {
            p.exited_ns.is_none()
                && p.comm() == comm
                && p.live_queues().any(|q| {
                    q.kind == QueueKind::NvCompute
                        && q.nv.as_ref().is_some_and(|t| !t.channels.is_empty())
                })
        });
        let Some(p) = found else { continue };
        let n: usize = p
            .live_queues()
            .filter_map(|q| q.nv.as_ref())
            .map(|t| t.channels.len() + 1)
            .sum();
        match last {
            Some((pid, m, since)) if pid == p.pid && m == n => {
                if since.elapsed() >= Duration::from_secs(2) {
                    return Ok(pid);
                }
            }
            _ => last = Some((p.pid, n, Instant::now())),
        }
    }
    bail!("no {comm} process with an NVIDIA compute TSG within {wait:?}")
}

pub async fn main(args: &Args) -> Result<ExitCode> {
    let mut w = Watcher::start_kfd(
        Paths::default(),
        crate::observe::probe::ProbeOptions::default(),
        Intervals::from_ms(1000, 1000, 1000),
        false,
    )?;
    eprintln!("nv-pause-test: watching for a {} process", args.comm);
    let pid = find_target(&mut w, &args.comm, Duration::from_secs_f64(args.wait)).await?;
    let tsgs: Vec<u32> = w
        .state
        .procs
        .get(&pid)
        .map(|p| {
            p.live_queues()
                .filter(|q| q.nv.is_some())
                .map(|q| q.queue_id)
                .collect()
        })
        .unwrap_or_default();
    let channels: usize = w.state.procs.get(&pid).map_or(0, |p| {
        p.live_queues()
            .filter_map(|q| q.nv.as_ref())
            .map(|t| t.channels.len())
            .sum()
    });
    eprintln!(
        "nv-pause-test: pid {pid}: {} TSG(s), {channels} channel(s)",
        tsgs.len()
    );
    let dir = crate::rundir::run_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The controller's own path: fd duplicates, the guardian's hold, then the pauses.
    let mut nv = NvControl::new(&dir)?;
    nv.prepare(&w.state, pid)?;
    let took = |r: &crate::outcome::OpReport| -> Result<f64> {
        if r.queues.iter().any(|q| q.outcome != QueueOutcome::Done) {
            bail!("pid {pid}: not every TSG was acted on: {:?}", r.queues);
        }
        Ok(r.returned_ns.saturating_sub(r.issued_ns) as f64 / 1e6)
    };
    let secs = Duration::from_secs_f64;
    for cycle in 0..args.cycles {
        tokio::time::sleep(secs(args.run)).await;
        let schedule_only = args.alternate_schedule_only && cycle % 2 == 1;
        nv.set_schedule_only(schedule_only);
        let paused = nv.act(&w.state, pid, &tsgs, true)?;
        let disable_ms = took(&paused)?;
        if args.die_while_paused {
            eprintln!("nv-pause-test: paused; dying (SIGKILL) without resuming");
            // SAFETY: kill(2) of our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        tokio::time::sleep(secs(args.pause)).await;
        let resumed = nv.act(&w.state, pid, &tsgs, false)?;
        let enable_ms = took(&resumed)?;
        let (t_pause, t_resume) = (paused.issued_ns, resumed.issued_ns);
        println!(
            "{{\"cycle\":{cycle},\"pid\":{pid},\"paused_at_ns\":{t_pause},\"resumed_at_ns\":{t_resume},\
             \"schedule_only\":{schedule_only},\"disable_ms\":{disable_ms:.3},\"enable_ms\":{enable_ms:.3},\"wall_clock_pause_s\":{:.3}}}",
            (t_resume - t_pause) as f64 / 1e9
        );
    }
    nv.shutdown();
    Ok(ExitCode::SUCCESS)
}
