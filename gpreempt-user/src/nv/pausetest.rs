//! `gpreempt-ebpf nv-pause-test` (hidden): the NVIDIA pause path end to end on a real GPU, for the
//! GPU experiment kit (scripts/gpu-experiment.sh). The observer builds the model of a process
//! started after it (its RM clients, TSGs and channels, from the RM escapes); then pause / resume
//! cycles go through the guardian exactly as the controller's will: hold first, then pause with
//! our own duplicate of the target's fd, resume, release. Prints one JSON line per cycle.

use std::{
    collections::BTreeMap,
    os::fd::AsFd,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    clock::monotonic_ns,
    kfd::Paths,
    nv::{
        control::{dup_fd, set_disabled, Channels},
        guardian::{GuardianHandle, HoldEntry},
    },
    state::{QueueKind, State},
    watch::{Intervals, Watcher},
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
    /// Seconds to wait for the target.
    #[arg(long, default_value_t = 60.0)]
    pub wait: f64,
}

/// The pause sets of a process: per (client, fd, subdevice), every channel of every TSG.
fn pause_sets(state: &State, pid: u32) -> Vec<(i32, Channels)> {
    let mut sets: BTreeMap<(u32, i32, u32), Vec<u32>> = BTreeMap::new();
    let Some(p) = state.procs.get(&pid) else {
        return Vec::new();
    };
    for q in p.live_queues() {
        let Some(t) = &q.nv else { continue };
        let Some(sub) = t.h_subdevice else { continue };
        let v = sets.entry((t.h_client, t.fd, sub)).or_default();
        if t.channels.is_empty() {
            v.push(q.queue_id); // a TSG handle stands for its channels
        } else {
            v.extend(&t.channels);
        }
    }
    sets.into_iter()
        .map(|((h_client, fd, h_subdevice), channels)| {
            (
                fd,
                Channels {
                    h_client,
                    h_subdevice,
                    channels,
                },
            )
        })
        .collect()
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
        std::path::Path::new("/dev/kfd"),
        Intervals::from_ms(1000, 1000, 1000),
        false,
    )?;
    eprintln!("nv-pause-test: watching for a {} process", args.comm);
    let pid = find_target(&mut w, &args.comm, Duration::from_secs_f64(args.wait)).await?;
    let sets = pause_sets(&w.state, pid);
    for (fd, c) in &sets {
        eprintln!(
            "nv-pause-test: pid {pid} fd {fd} client {:#x} subdevice {:#x}: {} channel(s)",
            c.h_client,
            c.h_subdevice,
            c.channels.len()
        );
    }
    if sets.is_empty() {
        bail!("pid {pid}: no client with a subdevice and channels");
    }
    let dir = crate::daemon::run_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = std::env::current_exe().context("locating our own binary")?;
    let mut guardian = GuardianHandle::spawn(&exe, &dir.join("nv-journal"))?;
    let mut fds = Vec::new();
    for (fd, c) in &sets {
        guardian.hold(&HoldEntry {
            pid,
            fd: *fd,
            h_client: c.h_client,
            h_subdevice: c.h_subdevice,
            channels: c.channels.clone(),
        })?;
        fds.push((dup_fd(pid, *fd)?, c));
    }
    let secs = Duration::from_secs_f64;
    for cycle in 0..args.cycles {
        tokio::time::sleep(secs(args.run)).await;
        let t_pause = monotonic_ns();
        let mut disable = Duration::ZERO;
        for (fd, c) in &fds {
            disable += set_disabled(fd.as_fd(), c, true)?;
        }
        if args.die_while_paused {
            eprintln!("nv-pause-test: paused; dying (SIGKILL) without resuming");
            // SAFETY: kill(2) of our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        tokio::time::sleep(secs(args.pause)).await;
        let t_resume = monotonic_ns();
        let mut enable = Duration::ZERO;
        for (fd, c) in &fds {
            enable += set_disabled(fd.as_fd(), c, false)?;
        }
        println!(
            "{{\"cycle\":{cycle},\"pid\":{pid},\"paused_at_ns\":{t_pause},\"resumed_at_ns\":{t_resume},\
             \"disable_ms\":{:.3},\"enable_ms\":{:.3},\"wall_clock_pause_s\":{:.3}}}",
            disable.as_secs_f64() * 1e3,
            enable.as_secs_f64() * 1e3,
            (t_resume - t_pause) as f64 / 1e9
        );
    }
    for (_, c) in &sets {
        guardian.release(pid, c.h_client)?;
    }
    guardian.shutdown(Duration::from_secs(5))?;
    Ok(ExitCode::SUCCESS)
}
