//! `gpreempt-ebpf top`: the watcher feeding the TUI. Its `s` / `r` keys go to the running
//! controller over its socket; with none running, top itself becomes the controller on the
//! first key (holding the lock; what it suspended is resumed when it exits).

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use crate::{
    backend::kfd::control::Limits,
    backend::{Arrival, Backends},
    controller::{
        daemon::{self, Lock, Request, Response, Status},
        requests::answer,
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

/// top's own control (the KFD backend), started on the first `s` / `r` when no controller runs.
struct Local {
    _lock: Lock,
    backends: Backends,
    arrivals: tokio::sync::mpsc::UnboundedReceiver<Arrival>,
    requests: tokio::sync::mpsc::Receiver<daemon::Incoming>,
}

pub struct Top {
    w: Watcher,
    kfd_device: std::path::PathBuf,
    local: Option<Local>,
}

impl Top {
    fn apply(&mut self, r: &crate::outcome::OpReport, suspend: bool) {
        let (ts_ns, by, target, queues) =
            (r.returned_ns, std::process::id(), r.pid, Some(r.done()));
        self.w
            .state
            .apply(Update::queue_op(suspend, ts_ns, by, target, queues));
    }

    fn status(&self) -> Status {
        Status {
            controller_pid: std::process::id(),
            mode: "top".into(),
            held: self
                .w
                .state
                .procs
                .values()
                .flat_map(|p| p.live_queues().map(move |q| (p.pid, q)))
                .filter(|(_, q)| q.suspended_by == Some(std::process::id()))
                .map(|(pid, q)| (pid, q.queue_id, Some(q.gpu_id)))
                .collect(),
            ..Default::default()
        }
    }

    async fn send(&mut self, req: Request) -> Result<Response> {
        let dir = crate::rundir::run_dir();
        if self.local.is_none() {
            if let Some(r) = daemon::ask(&dir, &req).await? {
                return Ok(r);
            }
            let lock = Lock::acquire(&dir)?;
            let mut backends =
                Backends::kfd_only(&self.kfd_device, &dir, Limits::default().max_suspend).await?;
            let arrivals = backends.take_arrivals();
            let requests = daemon::serve(&dir, daemon::Access::default())?;
            self.local = Some(Local {
                _lock: lock,
                backends,
                arrivals,
                requests,
            });
        }
        let Some(local) = &mut self.local else {
            anyhow::bail!("no control");
        };
        let ans = answer(&mut local.backends, &self.w.state, req, Status::default)
            .await
            .now();
        if let Some((r, suspend)) = &ans.acted {
            self.apply(r, *suspend);
            let _ = daemon::write_status(&dir, &self.status());
        }
        let resp = ans.response;
        Ok(resp)
    }
}

impl tui::Source for Top {
    async fn pump(&mut self) -> Result<()> {
        let Some(local) = &mut self.local else {
            return self.w.pump().await;
        };
        // The KFD lease: top holding queues must keep beating, or its guardian kills it.
        let now = crate::clock::monotonic_ns();
        for b in &mut local.backends.list {
            for n in b.upkeep(&self.w.state, now) {
                if let Notice::Problem { text, .. } = n {
                    self.w.state.apply(Update::Warning { ts_ns: now, text });
                }
            }
        }
        enum Got {
            Notice(Notice),
            Request(daemon::Incoming),
        }
        let got = tokio::select! {
            r = self.w.pump() => return r,
            // The KFD control thread sends notices only.
            Some(Arrival::Notice(n)) = local.arrivals.recv() => Got::Notice(n),
            Some(i) = local.requests.recv() => Got::Request(i),
        };
        match got {
            Got::Notice(Notice::Acted {
                report, suspend, ..
            }) => self.apply(&report, suspend),
            Got::Notice(Notice::Problem { pid, text }) => self.w.state.apply(Update::Warning {
                ts_ns: crate::clock::monotonic_ns(),
                text: format!("pid {pid}: {text}"),
            }),
            Got::Notice(Notice::Fenced { gpu_id, why }) => self.w.state.apply(Update::Warning {
                ts_ns: crate::clock::monotonic_ns(),
                text: format!("GPU {gpu_id:#x}: {why}"),
            }),
            // top's own control is the KFD backend: it changes no timeslice.
            Got::Notice(
                Notice::TargetGone { .. } | Notice::Timeslice { .. } | Notice::LeverFailed { .. },
            ) => {}
            Got::Request((req, reply)) => {
                let resp = match req {
                    Request::Status => Response {
                        ok: true,
                        status: Some(self.status()),
                        ..Default::default()
                    },
                    req => self.send(req).await.unwrap_or_else(Response::err),
                };
                let _ = reply.send(resp);
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
    };
    // stderr lines would tear the screen: problems go to the event log while the TUI is up.
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Off);
    let r = tui::run(&mut top, ms(args.interval)).await;
    log::set_max_level(level);
    if let Some(mut local) = top.local.take() {
        // What top suspended runs again.
        local.backends.shutdown().await;
    }
    r?;
    Ok(ExitCode::SUCCESS)
}
