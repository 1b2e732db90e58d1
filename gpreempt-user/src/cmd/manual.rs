//! `suspend` and `resume`: manual control. With a controller running (`run`, or an earlier
//! `suspend` still holding queues) the request goes to it over the control socket. Otherwise
//! `suspend` becomes the controller: it holds the queues suspended until Ctrl-C, a `resume`,
//! `--for` or the watchdog (the kernel resumes them when their debugger exits, so a suspension
//! cannot outlive the process that made it).

use std::{path::Path, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    backend::kfd::control::Limits,
    backend::Arrival,
    controller::{
        daemon::{self, Request, Response},
        hold::{Holder, Next},
    },
    observe::model::State,
    observe::procinfo,
    outcome::Notice,
    outcome::QueueOutcome,
    policy::Class,
};

#[derive(clap::Args, Debug)]
pub struct SuspendArgs {
    /// The process (host pid).
    #[arg(long)]
    pub pid: u32,
    /// Only these queue ids (repeatable; default: every queue, including new ones).
    #[arg(long)]
    pub queue: Vec<u32>,
    /// Preemption grace period in the kernel's units (1K GPU clocks; default: the kernel's).
    #[arg(long)]
    pub grace: Option<u32>,
    /// Resume after this long (e.g. 500ms, 30s, 5m).
    #[arg(long = "for", value_name = "DURATION")]
    pub for_: Option<DurationArg>,
    /// The watchdog: nothing stays suspended longer than this.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub max_suspend: DurationArg,
}

#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The process (host pid).
    #[arg(long)]
    pub pid: u32,
    /// Only these queue ids (repeatable; default: all).
    #[arg(long)]
    pub queue: Vec<u32>,
}

fn print_response(r: &Response, suspend: bool) -> ExitCode {
    match (&r.report, &r.error) {
        (Some(rep), _) => {
            println!("{}", rep.describe(suspend));
            if rep.queues.is_empty() || rep.queues.iter().any(|q| q.outcome == QueueOutcome::Done) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        (None, Some(e)) => {
            eprintln!("gpreempt-ebpf: error: {e}");
            ExitCode::FAILURE
        }
        (None, None) => ExitCode::SUCCESS,
    }
}

fn queues_arg(q: &[u32]) -> Option<Vec<u32>> {
    (!q.is_empty()).then(|| q.to_vec())
}

/// The backends' upkeep (the KFD lease's heartbeat), saying any problem.
fn upkeep(hold: &mut Holder, state: &State) {
    for n in hold.upkeep(state) {
        if let Notice::Problem { text, .. } = n {
            eprintln!("{text}");
        }
    }
}

/// What ends the hold.
fn holding_line(a: &SuspendArgs, max: std::time::Duration) -> String {
    format!(
        "holding them until Ctrl-C, `gpreempt-ebpf resume --pid {}`{}, or {} (watchdog)",
        a.pid,
        a.for_
            .as_ref()
            .map(|d| format!(", {} elapsed", crate::policy::fmt_ns(d.0.as_nanos() as u64)))
            .unwrap_or_default(),
        crate::policy::fmt_ns(max.as_nanos() as u64)
    )
}

pub async fn suspend(g: &super::Global, a: &SuspendArgs) -> Result<ExitCode> {
    let dir = crate::rundir::run_dir();
    let req = Request::Suspend {
        pid: a.pid,
        queues: queues_arg(&a.queue),
        grace: a.grace,
    };
    if let Some(r) = daemon::ask(&dir, &req).await? {
        return Ok(print_response(&r, true));
    }
    procinfo::start_time(Path::new("/proc"), a.pid)
        .with_context(|| format!("pid {} does not exist", a.pid))?;
    // Before anything is attached: a bad id must not reach the kernel.
    crate::controller::requests::check_queues(
        &State::new(),
        a.pid,
        &a.queue,
        &crate::observe::kfd::Paths::default().sysfs,
    )
    .map_err(|e| anyhow::anyhow!("pid {}: {e}", a.pid))?;
    let lock = daemon::Lock::acquire(&dir)?;
    // Before it is seized (which interrupts its system calls): a process with no GPU open has
    // nothing to suspend. After the run directory's checks, which come first.
    gpu_user(a.pid, &g.kfd_device)?;
    let max = a.max_suspend.0;
    let mut hold = Holder::by_pid(lock, &g.kfd_device, max, "suspend").await?;
    // No observer here: the target is acted on by its pid alone.
    let state = State::new();
    // Attached ahead and recorded (targets.json), as `run` does with an offline process.
    if let Err(e) = hold.classed(&state, a.pid, Class::Offline).await {
        hold.shutdown().await;
        anyhow::bail!("pid {}: {e}", a.pid);
    }
    let first = hold.answer(&state, req).await;
    let Some((first, _)) = first.acted else {
        hold.shutdown().await;
        anyhow::bail!(
            "{}",
            first.response.error.unwrap_or_else(|| "no answer".into())
        );
    };
    println!("{}", first.describe(true));
    if hold.held().is_empty() {
        hold.shutdown().await;
        return Ok(ExitCode::FAILURE);
    }
    hold.serve(daemon::Access::default())?;
    hold.publish()?;
    // The lease is armed before the hold is announced: a stop right after the announcement is
    // then bounded by the lease, not by the guardian's start-up grace.
    upkeep(&mut hold, &state);
    println!("{}", holding_line(a, max));
    let why = match hold_until_done(&mut hold, &state, a).await {
        Ok(why) => why,
        Err(e) => {
            hold.shutdown().await;
            return Err(e);
        }
    };
    let reports = hold.shutdown().await;
    for r in reports.iter().filter(|r| !r.queues.is_empty()) {
        println!("{}", r.describe(false));
    }
    println!("{why}: nothing is left suspended");
    Ok(ExitCode::SUCCESS)
}

/// Holds until a signal, `--for`, the target's exit or the last queue resumed: why it ended.
async fn hold_until_done(hold: &mut Holder, state: &State, a: &SuspendArgs) -> Result<String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let until = async {
        match &a.for_ {
            Some(d) => tokio::time::sleep(d.0).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    // The KFD lease's heartbeat (kfd_lease): if this loop stops, the guardian kills us and the
    // kernel resumes the target.
    let mut beat = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = beat.tick() => upkeep(hold, state),
            _ = int.recv() => return Ok("interrupted".into()),
            _ = term.recv() => return Ok("terminated".into()),
            _ = hup.recv() => return Ok("hangup".into()),
            _ = &mut until => return Ok("--for elapsed".into()),
            next = hold.next() => match next {
                // The KFD control thread sends notices only; the holder applied them.
                Next::Arrival(Arrival::Notice(n)) => match n {
                    Notice::TargetGone { pid, .. } if pid == a.pid => {
                        return Ok(format!("pid {pid} exited"))
                    }
                    Notice::Acted { report, suspend, why } => {
                        println!("{} ({why})", report.describe(suspend));
                    }
                    Notice::Problem { pid, text } => eprintln!("pid {pid}: {text}"),
                    Notice::Fenced { gpu_id, why } => eprintln!("GPU {gpu_id:#x}: {why}"),
                    Notice::Escaped { pid, text, answer, .. } => {
                        eprintln!("pid {pid}: escaped: {text}: {answer}")
                    }
                    Notice::TargetGone { .. }
                    | Notice::Timeslice { .. }
                    | Notice::LeverFailed { .. } => {}
                },
                Next::Arrival(_) => {}
                Next::Request((req, reply)) => {
                    let ans = hold.answer(state, req).await;
                    if let Some((r, suspend)) = &ans.acted {
                        println!("{}", r.describe(*suspend));
                    }
                    let _ = reply.send(ans.response);
                }
            },
        }
        if hold.held().is_empty() {
            return Ok("every queue resumed".into());
        }
    }
}

pub async fn resume(g: &super::Global, a: &ResumeArgs) -> Result<ExitCode> {
    let dir = crate::rundir::run_dir();
    let req = Request::Resume {
        pid: a.pid,
        queues: queues_arg(&a.queue),
    };
    if let Some(r) = daemon::ask(&dir, &req).await? {
        return Ok(print_response(&r, false));
    }
    // No controller: a suspension of ours cannot exist (it ends with its controller), but a
    // process may still have queues suspended by a debugger that vanished oddly. Attach,
    // resume everything, detach. Only a process with a GPU open can have queues at all.
    procinfo::start_time(Path::new("/proc"), a.pid)
        .with_context(|| format!("pid {} does not exist", a.pid))?;
    let lock = daemon::Lock::acquire(&dir)?;
    gpu_user(a.pid, &g.kfd_device)?;
    let max = Limits::default().max_suspend;
    let mut hold = Holder::by_pid(lock, &g.kfd_device, max, "resume").await?;
    let r = hold.resume(&State::new(), a.pid, None).await;
    hold.shutdown().await;
    match r {
        Ok(rep) => {
            // Under HWS the kernel counts every queue it found, suspended or running.
            println!(
                "pid {}: no controller was running; the kernel resumed whatever of its queues \
                 was suspended ({} queue(s) found)",
                a.pid,
                rep.ret.map_or("?".into(), |n| n.to_string())
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => anyhow::bail!("pid {}: {e}", a.pid),
    }
}

/// Err unless `pid` has a KFD (or NVIDIA) device open: the reason, in the user's words.
fn gpu_user(pid: u32, kfd_device: &Path) -> Result<()> {
    match crate::observe::gpufiles::opens_gpu(Path::new("/proc"), pid, kfd_device) {
        Ok(true) => Ok(()),
        Ok(false) => anyhow::bail!(
            "pid {pid} has no GPU device open ({} or an NVIDIA node): it has no queues to act on, \
             and it was not touched",
            kfd_device.display()
        ),
        Err(e) => anyhow::bail!("pid {pid}: cannot read its open files (/proc/{pid}/fd): {e}"),
    }
}

/// `--for 30s` style durations on the command line.
#[derive(Clone, Debug)]
pub struct DurationArg(pub Duration);

impl std::str::FromStr for DurationArg {
    type Err = String;
    /// A policy duration (`500us`, `20ms`, `1.5s`), or minutes / hours (`5m`, `1h`), or bare
    /// seconds.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (num, secs) = if let Some(n) = t.strip_suffix('h') {
            (n, 3600.0)
        } else if let Some(n) = t.strip_suffix('m') {
            (n, 60.0)
        } else if t.parse::<f64>().is_ok() {
            (t, 1.0)
        } else {
            let ns = crate::policy::parse_duration(t)?;
            return if ns > 0 {
                Ok(Self(Duration::from_nanos(ns)))
            } else {
                Err(format!("duration {s:?} must be positive"))
            };
        };
        let v: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration {s:?} (use e.g. 500ms, 30s, 5m)"))?;
        let d = v * secs;
        // Say which: `1e400` is infinite (too large), `-5`/`0` are not positive, `nan` no number.
        if d.is_nan() {
            return Err(format!(
                "duration {s:?} is not a number (use e.g. 500ms, 30s, 5m)"
            ));
        }
        if d <= 0.0 {
            return Err(format!("duration {s:?} must be positive"));
        }
        Duration::try_from_secs_f64(d)
            .map(Self)
            .map_err(|_| format!("duration {s:?} is too large (at most about 584 years)"))
    }
}

#[cfg(test)]
mod tests {
    use super::DurationArg;

    fn err(s: &str) -> String {
        s.parse::<DurationArg>().unwrap_err()
    }

    #[test]
    fn durations_say_what_is_wrong() {
        assert_eq!(
            "1.5s".parse::<DurationArg>().unwrap().0,
            std::time::Duration::from_millis(1500)
        );
        assert_eq!("2m".parse::<DurationArg>().unwrap().0.as_secs(), 120);
        assert!(err("1e400").contains("is too large"), "{}", err("1e400"));
        assert!(err("1e30h").contains("is too large"));
        assert!(err("0").contains("must be positive"));
        assert!(err("-5").contains("must be positive"));
        assert!(err("nan").contains("is not a number"), "{}", err("nan"));
        assert!(
            err("5 parsecs").contains("invalid duration"),
            "{}",
            err("5 parsecs")
        );
    }
}
