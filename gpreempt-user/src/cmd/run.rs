//! `gpreempt-ebpf run --policy FILE`: the controller's arguments and wiring. The loop itself
//! (deciding, acting, auditing, cleaning up) is [`crate::controller::run_loop`].

use std::{path::Path, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    backend::Backends,
    controller::{
        alarm::Alarm,
        daemon,
        hold::Holder,
        notify::{Message, Notifier},
        run_loop::{self, Setup, Signals},
    },
    observe::kfd::Paths,
    observe::watch::{Intervals, Watcher},
    policy::Policy,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The policy file (TOML: docs/policy.md, examples/; `policy check FILE` validates it).
    #[arg(long, value_name = "FILE")]
    pub policy: std::path::PathBuf,
    /// Decide and log, act on nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also reload the policy when its file changes (checked every 2 s), as on SIGHUP: for a
    /// policy mounted from a Kubernetes ConfigMap, which the kubelet updates in place.
    #[arg(long)]
    pub reload_on_change: bool,
    /// Append every decision and its outcome here, as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<std::path::PathBuf>,
    /// Keep the audit file under SIZE (e.g. 64MiB): past it the file becomes FILE.1 (replacing
    /// the one before) and a new FILE starts; at most twice SIZE on disk. SIGHUP reopens FILE
    /// (for logrotate).
    #[arg(long, value_name = "SIZE", requires = "audit", value_parser = crate::controller::audit::parse_size)]
    pub audit_max_size: Option<u64>,
    /// How often the policy decides (ms).
    #[arg(long, default_value_t = 1, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub tick: u64,
    /// How often the queues' dispatch ids are read (ms): how fast online work is noticed.
    #[arg(long, default_value_t = 1, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sample_interval: u64,
    /// How often to reconcile with sysfs and /proc (ms).
    #[arg(long, default_value_t = 500, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub reconcile_interval: u64,
    /// How often to read debugfs `hqds` for HQD slots (ms; AMD).
    #[arg(long, default_value_t = 2000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub hqd_interval: u64,
    /// Drop a process's GPU driver records beyond PER_S a second (bursts of BURST) in the kernel,
    /// counted per process (default 8192:32768): a flood of ioctls cannot blind the controller.
    #[arg(long, value_name = "PER_S[:BURST]", value_parser = super::trace::parse_rate)]
    pub rate_limit: Option<(u32, u32)>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464; off by default).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// Reads the policy off this thread: a file that stalls (a hung network mount) must not make
/// SIGINT and SIGTERM wait. A plain thread, so an abandoned read does not hold up the exit.
async fn load_policy(path: &Path, sig: &mut Signals) -> Result<Policy> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let owned = path.to_path_buf();
    std::thread::Builder::new()
        .name("policy-load".into())
        .spawn(move || {
            let _ = tx.send(Policy::load(&owned));
        })
        .context("starting the policy reader")?;
    tokio::select! {
        r = rx => r.context("the policy reader ended without an answer")?,
        _ = sig.int.recv() => anyhow::bail!("interrupted while reading the policy {}", path.display()),
        _ = sig.term.recv() => anyhow::bail!("terminated while reading the policy {}", path.display()),
    }
}

pub async fn main(g: &super::Global, args: &Args) -> Result<ExitCode> {
    let t_start = std::time::Instant::now();
    crate::observe::probe::preflight()?;
    let (before, after) = crate::controller::limits::raise_fd_limit();
    if after > before {
        log::info!("open files: soft limit raised from {before} to {after}");
    }
    // Signals first: from here on nothing ends the process without the loop's cleanup.
    let mut signals = Signals::new()?;
    let mut notify = Notifier::from_env();
    notify.send(&Message::Status("starting: loading programs, self-testing"));
    let policy = load_policy(&args.policy, &mut signals).await?;
    for w in policy.trust_warnings() {
        log::warn!("{w}");
    }
    let dir = crate::rundir::run_dir();
    let lock = daemon::Lock::acquire(&dir)?;
    let metrics = run_loop::bind_metrics(args.metrics).await?;
    // Made before the backends, so that failing to make it leaves nothing to undo.
    let alarm = Alarm::new()?;
    let nvidiactl = Path::new(gpreempt_common::nv::NVIDIACTL);
    let mut backends = if args.dry_run {
        Backends::of(Vec::new())
    } else {
        let max_suspend = Duration::from_nanos(policy.max_suspend_ns);
        Backends::for_host(&g.kfd_device, nvidiactl, &dir, max_suspend).await?
    };
    let t_observer = std::time::Instant::now();
    let mut watcher = Watcher::start(
        Paths::default(),
        crate::observe::probe::ProbeOptions {
            rate_limit: args.rate_limit.or(Some(crate::observe::probe::RATE_LIMIT)),
            ..g.probe_options()
        },
        Intervals::from_ms(
            args.reconcile_interval,
            args.hqd_interval,
            args.sample_interval,
        ),
    )?;
    // Before the first decision: adopted processes are classified like any. The driver scans of
    // processes no journal names run while the self-test does.
    let observer_ms = t_observer.elapsed().as_millis();
    let discovery =
        (!args.dry_run && nvidiactl.exists()).then(|| watcher.adopt_nv_start(&dir, true));
    let t_test = std::time::Instant::now();
    let tested = crate::controller::startup::self_test(
        &mut backends,
        &mut watcher,
        &mut signals,
        &mut notify,
    )
    .await;
    let test_ms = t_test.elapsed().as_millis();
    if let Some(d) = discovery {
        for line in watcher.adopt_nv_finish(d) {
            eprintln!("gpreempt-ebpf run: {line}");
        }
    }
    tested?;
    eprintln!(
        "gpreempt-ebpf run: started in {} ms (observer {observer_ms} ms, self-tests {test_ms} ms; \
         driver scans of processes already running went on beside them)",
        t_start.elapsed().as_millis()
    );
    run_loop::run(Setup {
        policy,
        policy_path: args.policy.clone(),
        reload_on_change: args.reload_on_change,
        dry_run: args.dry_run,
        audit: args.audit.clone(),
        audit_max_size: args.audit_max_size,
        tick: Duration::from_millis(args.tick),
        dir,
        metrics,
        alarm,
        backends: Holder::new(lock, backends, "run"),
        watcher,
        signals,
        notify,
    })
    .await
}
