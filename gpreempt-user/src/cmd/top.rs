//! `gpreempt-ebpf top`: the watcher feeding the TUI. Its `s` / `r` keys go to the running
//! controller over its socket; with none running, top itself becomes the controller on the
//! first key (holding the lock; what it suspended is resumed when it exits).

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use crate::{
    backend::kfd::control::Limits,
    backend::Arrival,
    controller::{
        daemon::{self, Lock, Request, Response},
        hold::{Holder, Next},
    },
    observe::kfd::Paths,
    observe::model::{State, Update},
    observe::watch::{Intervals, Watcher},
    outcome::Notice,
    tui::{self, app::Command},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Screen refresh interval in milliseconds.
    #[arg(long, default_value_t = 100, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub interval: u64,
    /// How often to read debugfs `hqds` for HQD slots (ms; not free on real GPUs).
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub hqd_interval: u64,
    /// How often to read the queues' dispatch ids (ms; one syscall per process).
    #[arg(long, default_value_t = 500, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub sample_interval: u64,
    /// How often to reconcile with sysfs and /proc (ms).
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub reconcile_interval: u64,
}

pub struct Top {
    w: Watcher,
    kfd_device: std::path::PathBuf,
    /// top's own control (the KFD backend), started on the first `s` / `r` when no controller
    /// runs.
    local: Option<Holder>,
    /// When GPU processes were last given request-latency uprobes (once a second).
    watched_at: Option<std::time::Instant>,
}

/// An act of top's own control, into its model (our DBG_TRAP calls are not read back from the
/// eBPF events).
fn apply(w: &mut Watcher, r: &crate::outcome::OpReport, suspend: bool) {
    let (ts_ns, by, target, queues) = (r.returned_ns, std::process::id(), r.pid, Some(r.done()));
    w.state
        .apply(Update::queue_op(suspend, ts_ns, by, target, queues));
}

impl Top {
    async fn send(&mut self, req: Request) -> Result<Response> {
        if self.local.is_none() {
            let dir = crate::rundir::run_dir();
            if let Some(r) = daemon::ask(&dir, &req).await? {
                return Ok(r);
            }
            let lock = Lock::acquire(&dir)?;
            let max = Limits::default().max_suspend;
            let mut hold = Holder::by_pid(lock, &self.kfd_device, max, "top").await?;
            hold.serve(daemon::Access::default())?;
            self.local = Some(hold);
        }
        let Some(hold) = &mut self.local else {
            anyhow::bail!("no control");
        };
        let ans = hold.answer(&self.w.state, req).await;
        if let Some((r, suspend)) = &ans.acted {
            apply(&mut self.w, r, *suspend);
        }
        Ok(ans.response)
    }
}

impl tui::Source for Top {
    async fn pump(&mut self) -> Result<()> {
        if self
            .watched_at
            .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1))
        {
            self.watched_at = Some(std::time::Instant::now());
            self.w.watch_every_gpu_process();
        }
        let Some(hold) = &mut self.local else {
            return self.w.pump().await;
        };
        // The KFD lease: top holding queues must keep beating, or its guardian kills it.
        for n in hold.upkeep(&self.w.state) {
            if let Notice::Problem { text, .. } = n {
                let ts_ns = crate::clock::monotonic_ns();
                self.w.state.apply(Update::Warning { ts_ns, text });
            }
        }
        let next = tokio::select! {
            r = self.w.pump() => return r,
            next = hold.next() => next,
        };
        let warn = |text| Update::Warning {
            ts_ns: crate::clock::monotonic_ns(),
            text,
        };
        match next {
            // The KFD control thread sends notices only; the holder applied them.
            Next::Arrival(Arrival::Notice(n)) => match n {
                Notice::Acted {
                    report, suspend, ..
                } => apply(&mut self.w, &report, suspend),
                Notice::Problem { pid, text } => {
                    self.w.state.apply(warn(format!("pid {pid}: {text}")))
                }
                Notice::Fenced { gpu_id, why } => {
                    self.w.state.apply(warn(format!("GPU {gpu_id:#x}: {why}")))
                }
                Notice::Escaped {
                    pid, text, answer, ..
                } => self
                    .w
                    .state
                    .apply(warn(format!("pid {pid}: escaped: {text}: {answer}"))),
                // top's own control is the KFD backend: it changes no timeslice.
                Notice::TargetGone { .. }
                | Notice::Timeslice { .. }
                | Notice::LeverFailed { .. } => {}
            },
            Next::Arrival(_) => {}
            Next::Request((req, reply)) => {
                let ans = hold.answer(&self.w.state, req).await;
                if let Some((r, suspend)) = &ans.acted {
                    apply(&mut self.w, r, *suspend);
                }
                let _ = reply.send(ans.response);
            }
        }
        Ok(())
    }
    fn state(&self) -> &State {
        &self.w.state
    }
    async fn command(&mut self, c: &Command) -> Result<String> {
        let (req, suspend) = match *c {
            Command::Suspend { pid, queue } => (
                Request::Suspend {
                    pid,
                    queues: queue.map(|q| vec![q]),
                    grace: None,
                },
                true,
            ),
            Command::Resume { pid, queue } => (
                Request::Resume {
                    pid,
                    queues: queue.map(|q| vec![q]),
                },
                false,
            ),
            Command::Quit => return Ok(String::new()),
        };
        let resp = self.send(req).await?;
        match (resp.report, resp.error) {
            (Some(r), _) => Ok(r.describe(suspend)),
            (None, Some(e)) => anyhow::bail!("{e}"),
            (None, None) => Ok(String::new()),
        }
    }
}

pub async fn main(g: &super::Global, args: &Args) -> Result<ExitCode> {
    let ms = Duration::from_millis;
    let mut w = Watcher::start(
        Paths::default(),
        g.probe_options(),
        Intervals::from_ms(
            args.reconcile_interval,
            args.hqd_interval,
            args.sample_interval,
        ),
    )?;
    // CUDA processes already running: what a controller journaled (proven through the driver),
    // and the rest shown as unmanaged. The lines go to the model's log.
    if std::path::Path::new(gpreempt_common::nv::NVIDIACTL).exists() {
        for line in w.adopt_nv(&crate::rundir::run_dir(), false) {
            log::info!("{line}");
        }
    }
    let mut top = Top {
        w,
        kfd_device: g.kfd_device.clone(),
        local: None,
        watched_at: None,
    };
    // stderr lines would tear the screen: problems go to the event log while the TUI is up.
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Off);
    let r = tui::run(&mut top, ms(args.interval)).await;
    log::set_max_level(level);
    if let Some(mut hold) = top.local.take() {
        // What top suspended runs again.
        hold.shutdown().await;
    }
    r?;
    Ok(ExitCode::SUCCESS)
}
