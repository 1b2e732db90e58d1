//! The NVIDIA backend's start-up check: the driver must be one pausing works on (GSP-RM, no MPS,
//! pidfd_getfd allowed), and a CUDA process of our own must stop making progress while paused and
//! start again when resumed, through the very path the controller uses (observer -> model -> the
//! backend's worker thread -> guardian hold -> FIFO_DISABLE_CHANNELS on the target's own client).
//! Otherwise the controller refuses to start: a backend that cannot act is worse than none.

use std::{
    cell::RefCell,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

use crate::{
    backend::nv::selftest::{verify, Target},
    backend::HostBusy,
    doctor::{nvidia, Root, Verdict},
    observe::model::State,
    observe::watch::Watcher,
    outcome::{OpReport, TimesliceChange},
};

/// The controller's NVIDIA control as the self-test reaches it: through the backend's worker
/// thread, the path every later act takes (the methods are [`super::controller::NvControl`]'s).
pub trait SelfTestControl {
    fn act(&mut self, state: &State, pid: u32, tsgs: &[u32], disable: bool) -> Result<OpReport>;
    fn set_timeslices(&mut self, state: &State, pid: u32, us: u64) -> Result<Vec<TimesliceChange>>;
    fn read_timeslice(&mut self, pid: u32, tsg: u32) -> Result<u64>;
    fn restore_timeslices(&mut self, pid: u32) -> Result<Vec<TimesliceChange>>;
    fn forget(&mut self, pid: u32);
}

/// How long the target may take to create its context (first CUDA use loads the driver).
const TARGET_START: Duration = Duration::from_secs(60);
/// How long its RM objects may take to show up in the model.
const SEEN: Duration = Duration::from_secs(10);
/// Each observation window of the pause check.
const WINDOW: Duration = Duration::from_millis(150);

/// Waits until the model holds the target's compute TSGs with their channels (their ids). Records
/// lost meanwhile make a miss [`HostBusy`], naming who filled the ring.
async fn wait_for_channels(w: &mut Watcher, pid: u32) -> Result<Vec<u32>> {
    let deadline = Instant::now() + SEEN;
    let lost0 = w.kernel_lost();
    w.census_start();
    loop {
        let ready = target_tsgs(&w.state, pid);
        if !ready.is_empty() {
            w.census_take(0);
            return Ok(ready);
        }
        if Instant::now() > deadline {
            let lost = w.kernel_lost().saturating_sub(lost0);
            let top = w.census_take(3);
            return Err(unseen(pid, lost, &top, comm));
        }
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(50), w.pump()).await {
            r?;
        }
    }
}

/// Why the target's channels were not seen: [`HostBusy`] when records were lost meanwhile
/// (naming the processes with the most records, `name` giving their names), else the observer is
/// blind to RM escapes here.
fn unseen(pid: u32, lost: u64, top: &[(u32, u64)], name: impl Fn(&u32) -> String) -> anyhow::Error {
    if lost > 0 {
        let who: Vec<String> = top
            .iter()
            .map(|(p, n)| format!("pid {p} ({}): {n} records", name(p)))
            .collect();
        return HostBusy(format!(
            "the observer lost {lost} event records in the kernel while the self-test target \
             (pid {pid}) started, so its channels may be among them; the most records came from {}",
            if who.is_empty() {
                "nobody this controller saw".to_string()
            } else {
                who.join(", ")
            }
        ))
        .into();
    }
    anyhow!(
        "the observer saw no channel of the self-test target (pid {pid}) within {}s and lost no \
         record meanwhile: its RM escapes do not reach the eBPF programs, so no process could be \
         controlled",
        SEEN.as_secs()
    )
}

/// A process's name for a message (`?` once it is gone).
fn comm(pid: &u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_or_else(|_| "?".into(), |c| c.trim_end().escape_debug().to_string())
}

/// The target's TSGs that the model knows with subdevice and channels, once its /proc facts are
/// in (every act names a process by pid and start time).
fn target_tsgs(state: &State, pid: u32) -> Vec<u32> {
    state
        .procs
        .get(&pid)
        .filter(|p| p.info.is_some())
        .map(|p| {
            p.live_queues()
                .filter(|q| {
                    q.nv.as_ref()
                        .is_some_and(|t| t.h_subdevice.is_some() && !t.channels.is_empty())
                })
                .map(|q| q.queue_id)
                .collect()
        })
        .unwrap_or_default()
}

/// The doctor's NVIDIA lines that forbid pausing, as one message (empty: none).
fn blocking_findings() -> Vec<String> {
    let pidfd = nvidia::try_pidfd_getfd();
    nvidia::nvidia_checks(&Root::default(), Some(&pidfd), true)
        .into_iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| match &c.fix {
            Some(fix) => format!("{}: {} (fix: {fix})", c.name, c.finding),
            None => format!("{}: {}", c.name, c.finding),
        })
        .collect()
}

/// The file in the run directory that remembers a passed self-test ([`Memo`]).
pub const MEMO_FILE: &str = "nv-selftest.json";

/// What a passed self-test proved holds for: this boot, this driver build on these GPUs, this
/// binary. A restart with all four unchanged (a crash, `kill -9`, a pod restart) needs no new
/// CUDA process of our own to know that pausing works, and acts about a second sooner.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    pub boot_id: String,
    /// /proc/driver/nvidia/version, whole (version and build).
    pub driver: String,
    /// The GPUs' bus ids (/proc/driver/nvidia/gpus).
    pub gpus: Vec<String>,
    /// Our executable: device, inode, size, mtime (s, ns).
    pub exe: (u64, u64, u64, i64, i64),
}

impl Fingerprint {
    pub fn now() -> Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let read = |p: &str| std::fs::read_to_string(p).with_context(|| format!("reading {p}"));
        let mut gpus: Vec<String> = std::fs::read_dir("/proc/driver/nvidia/gpus")
            .context("listing /proc/driver/nvidia/gpus")?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        gpus.sort();
        let m = std::fs::metadata("/proc/self/exe").context("our own executable")?;
        Ok(Self {
            boot_id: read("/proc/sys/kernel/random/boot_id")?.trim().to_string(),
            driver: read("/proc/driver/nvidia/version")?,
            gpus,
            exe: (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()),
        })
    }
}

/// A passed self-test as remembered (mode 0600, ours or root's, never read through a link).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Memo {
    pub fingerprint: Fingerprint,
    /// The line the test printed.
    pub line: String,
    /// CLOCK_REALTIME seconds when it passed.
    pub passed_s: u64,
}

/// The remembered pass in `dir` if it holds for `now` (None: none, another boot, driver or
/// binary, or a file that is not root's regular file).
pub fn remembered(dir: &Path, now: &Fingerprint) -> Option<Memo> {
    use std::os::unix::fs::MetadataExt as _;
    let f = crate::rundir::open_read(&dir.join(MEMO_FILE)).ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file()
        || !crate::rundir::trusted_owner(m.uid())
        || m.mode() & 0o077 != 0
        || m.len() > 64 << 10
    {
        return None;
    }
    let memo: Memo = serde_json::from_reader(f).ok()?;
    (memo.fingerprint == *now).then_some(memo)
}

/// Remembers a pass (best effort: a failure only costs the next start its test).
fn remember(dir: &Path, fingerprint: Fingerprint, line: &str) {
    let memo = Memo {
        fingerprint,
        line: line.to_string(),
        passed_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let r = serde_json::to_vec(&memo)
        .map_err(anyhow::Error::from)
        .and_then(|b| {
            crate::rundir::write_atomic(&dir.join(MEMO_FILE), &b, crate::rundir::PRIVATE_MODE)
        });
    if let Err(e) = r {
        log::warn!("NVIDIA self-test: not remembered for the next start: {e:#}");
    }
}

/// Runs the check, or (`memo`: the run directory) takes a pass remembered there for this boot,
/// driver and binary; Ok: one line saying what was proven.
pub async fn self_test(
    nv: &mut dyn SelfTestControl,
    w: &mut Watcher,
    memo: Option<&Path>,
) -> Result<String> {
    let blocking = blocking_findings();
    ensure!(blocking.is_empty(), "{}", blocking.join("; "));
    let fingerprint = memo.and_then(|_| Fingerprint::now().ok());
    if let (Some(dir), Some(fp)) = (memo, fingerprint.as_ref()) {
        if let Some(m) = remembered(dir, fp) {
            return Ok(format!(
                "{} [remembered: passed {} s ago by this binary on this driver since boot; not \
                 repeated (remove {} to repeat it)]",
                m.line,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
                    .saturating_sub(m.passed_s),
                dir.join(MEMO_FILE).display()
            ));
        }
    }
    let line = run_test(nv, w).await?;
    if let (Some(dir), Some(fp)) = (memo, fingerprint) {
        remember(dir, fp, &line);
    }
    Ok(line)
}

/// Spawns our own CUDA process and pauses and resumes it through the controller's path.
async fn run_test(nv: &mut dyn SelfTestControl, w: &mut Watcher) -> Result<String> {
    let exe = std::env::current_exe().context("locating our own binary")?;
    let mut target = Target::spawn(&exe, TARGET_START)
        .context("starting the self-test target (a CUDA process of our own)")?;
    let pid = target.pid();

    // Its channels, seen the way every target's are: through the RM escapes it made.
    let tsgs = wait_for_channels(w, pid).await?;
    let channels: usize = w.state.procs.get(&pid).map_or(0, |p| {
        p.live_queues()
            .filter_map(|q| q.nv.as_ref())
            .map(|t| t.channels.len())
            .sum()
    });

    let state = &w.state;
    let nv = RefCell::new(nv);
    let act = |disable: bool| -> Result<()> {
        let r = nv.borrow_mut().act(state, pid, &tsgs, disable)?;
        ensure!(
            !r.done().is_empty(),
            "the driver acted on none of TSGs {tsgs:?}: {:?}",
            r.queues
        );
        Ok(())
    };
    let mut verdict = verify(
        &mut || target.count(),
        &mut || act(true),
        &mut || act(false),
        WINDOW,
    );
    // Once on the H100 (after minutes of heavy work by others) one iteration completed while
    // paused and the next try was clean: a counter that moved once is tried once more; a second
    // failure refuses, as any other.
    if let Err(e) = &verdict {
        if format!("{e:#}").contains("did not stop the GPU work") {
            log::warn!("NVIDIA self-test: {e:#}; trying once more");
            verdict = verify(
                &mut || target.count(),
                &mut || act(true),
                &mut || act(false),
                WINDOW,
            );
        }
    }
    let nv = nv.into_inner();
    // The timeslice lever on the same process: set, read back, put back. A driver that refuses
    // it is not a reason to refuse `run` (the policy then pauses instead): it is said.
    let lever = match timeslice_check(nv, state, pid) {
        Ok(line) => line,
        Err(e) => format!("timeslice lever NOT available ({e:#}): offline work will be paused"),
    };
    nv.forget(pid);
    drop(target);
    let v = verdict.context("pausing our own CUDA process")?;
    Ok(format!(
        "NVIDIA self-test: paused our own CUDA process (pid {pid}, {} TSG(s), {channels} \
         channel(s)) in {:.2} ms and resumed it in {:.2} ms; iterations: {} before, {} while \
         paused, {} after; {lever}",
        tsgs.len(),
        v.pause.as_secs_f64() * 1e3,
        v.resume.as_secs_f64() * 1e3,
        v.before,
        v.while_paused,
        v.after
    ))
}

/// The self-test's timeslice step, through the controller's own path.
fn timeslice_check(nv: &mut dyn SelfTestControl, state: &State, pid: u32) -> Result<String> {
    const PROBE_US: u64 = 200;
    let changes = nv.set_timeslices(state, pid, PROBE_US)?;
    let Some(c) = changes.first().cloned() else {
        bail!("our process has no compute TSG to set a timeslice on");
    };
    let read = nv.read_timeslice(pid, c.queue_id)?;
    let restored = nv.restore_timeslices(pid);
    let back = nv.read_timeslice(pid, c.queue_id)?;
    restored?;
    ensure!(
        read == PROBE_US,
        "SET_TIMESLICE {PROBE_US} us read back as {read} us"
    );
    ensure!(
        back == c.original_us,
        "the original timeslice {} us read back as {back} us after the restore",
        c.original_us
    );
    Ok(format!(
        "timeslice {} -> {PROBE_US} -> {back} us (read back each time)",
        c.original_us
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_unseen_while_records_were_lost_is_a_busy_host_naming_who_filled_the_ring() {
        let e = unseen(42, 10_117, &[(7, 17_286), (8, 16_901)], |p| {
            format!("job{p}")
        });
        let busy = e.downcast_ref::<HostBusy>().expect("HostBusy");
        assert!(busy.0.contains("lost 10117 event records"), "{}", busy.0);
        assert!(
            busy.0
                .contains("pid 7 (job7): 17286 records, pid 8 (job8): 16901"),
            "{}",
            busy.0
        );
    }

    #[test]
    fn channels_unseen_with_no_loss_is_a_blind_observer_and_refused() {
        let e = unseen(42, 0, &[(7, 3)], |_| String::new());
        assert!(e.downcast_ref::<HostBusy>().is_none());
        assert!(
            format!("{e}").contains("do not reach the eBPF programs"),
            "{e}"
        );
    }

    #[test]
    fn a_remembered_pass_holds_only_for_the_same_boot_driver_gpus_and_binary() {
        let dir = std::env::temp_dir().join(format!("gp-memo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fp = Fingerprint {
            boot_id: "b".into(),
            driver: "NVRM version: 580.159.04".into(),
            gpus: vec!["0000:00:06.0".into()],
            exe: (1, 2, 3, 4, 5),
        };
        assert!(remembered(&dir, &fp).is_none(), "nothing remembered yet");
        remember(
            &dir,
            fp.clone(),
            "NVIDIA self-test: paused our own CUDA process",
        );
        let m = remembered(&dir, &fp).expect("remembered");
        assert_eq!(m.line, "NVIDIA self-test: paused our own CUDA process");
        for other in [
            Fingerprint {
                boot_id: "c".into(),
                ..fp.clone()
            },
            Fingerprint {
                driver: "NVRM version: 580.160".into(),
                ..fp.clone()
            },
            Fingerprint {
                gpus: vec![],
                ..fp.clone()
            },
            Fingerprint {
                exe: (1, 2, 3, 4, 6),
                ..fp.clone()
            },
        ] {
            assert!(remembered(&dir, &other).is_none(), "{other:?}");
        }
        // Never a file others may read or write.
        let f = dir.join(MEMO_FILE);
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
        assert!(
            remembered(&dir, &fp).is_none(),
            "a group/other-readable memo is not trusted"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
