//! The fallback for processes whose queues cannot be suspended: freezing their cgroup.
//!
//! amdkfd refuses SUSPEND_QUEUES on a process whose GPU runtime never enabled the debug API
//! (ROCm before 5.7: docs/kfd.md). With `[policy] no_debug_api = "freeze"` the KFD backend
//! freezes such a process's cgroup v2 (`cgroup.freeze`, kernel/cgroup/freezer.c) while the
//! policy would hold it: it then submits no new GPU work. What it cannot stop: packets already
//! in its queues run to completion, its GPU memory stays allocated, and a frozen process does
//! nothing else either (no I/O, no heartbeats). Nothing in the kernel thaws a cgroup when the
//! controller dies, so the guardian journals every freeze before it happens and thaws on the
//! controller's exit, death or silence (`guardian::frozen`).
//!
//! A cgroup is frozen only when freezing it stops nobody else: not the root cgroup, and every
//! process in it and below it runs as the target's user, is not online, and is not this
//! controller or its guardian. A process the user moves out of the frozen cgroup (possible in a
//! delegated subtree) runs again: the freeze is an honest brake, not a security boundary.

use std::{
    collections::BTreeSet,
    path::{Component, Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::kfd::lease::KfdLease;
use crate::{
    backend::guardian::FrozenEntry,
    clock::monotonic_ns,
    observe::model::State,
    outcome::{EscapeKind, Notice, OpReport, QueueOutcome, QueueResult},
};

/// Processes looked at below one cgroup before giving up (a larger subtree is refused).
const MAX_MEMBERS: usize = 4096;
/// Cgroups below one to freeze, at most: every freeze checks each of them for members, on the
/// loop, so a subtree of thousands of empty cgroups (which a delegated user can make) would
/// stall decisions for as long; past this it is refused, the count read in O(1) from
/// `cgroup.stat`'s `nr_descendants` where the kernel has it.
const MAX_DESCENDANTS: usize = 256;

/// Where cgroup v2 is mounted and where /proc is (fakes in tests).
#[derive(Clone, Debug)]
pub struct Freezer {
    cgroup_root: PathBuf,
    proc_root: PathBuf,
}

/// Who else must not be frozen.
#[derive(Debug, Default)]
pub struct Spare {
    /// Online processes.
    pub online: BTreeSet<u32>,
    /// The controller and its helpers.
    pub own: BTreeSet<u32>,
}

impl Freezer {
    /// The host's cgroup v2 mount, from /proc/self/mountinfo.
    pub fn host() -> Result<Self> {
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .context("reading /proc/self/mountinfo")?;
        let root = cgroup2_mount(&info).context(
            "no cgroup v2 file system is mounted: the freeze fallback needs the unified hierarchy",
        )?;
        Ok(Self::new(root, PathBuf::from("/proc")))
    }

    pub fn new(cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            cgroup_root,
            proc_root,
        }
    }

    /// The cgroup v2 directory of `pid`. Stricter than `procinfo::cgroup_path`, which falls back
    /// to a v1 hierarchy's line: only the unified hierarchy has `cgroup.freeze`.
    pub fn cgroup_of(&self, pid: u32) -> Result<PathBuf> {
        let text = std::fs::read_to_string(self.proc_root.join(format!("{pid}/cgroup")))
            .with_context(|| format!("reading the cgroup of pid {pid}"))?;
        let rel = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .with_context(|| format!("pid {pid} is in no cgroup v2 (no 0:: line)"))?;
        let cg = self
            .under_root(rel)
            .with_context(|| format!("pid {pid}'s cgroup {rel:?}"))?;
        Ok(self.domain_of(cg))
    }

    /// The cgroup that holds every thread of a process in `cg`: `cg` itself, or, for a threaded
    /// cgroup, the threaded domain above it. A process whose leader sits in a threaded child
    /// may run its other threads anywhere in the domain: freezing the child alone would leave
    /// them running.
    pub fn domain_of(&self, mut cg: PathBuf) -> PathBuf {
        while std::fs::read_to_string(cg.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded")
        {
            match cg.parent() {
                Some(up) if up.starts_with(&self.cgroup_root) && up != self.cgroup_root => {
                    cg = up.to_path_buf()
                }
                _ => break,
            }
        }
        cg
    }

    /// The cgroups of `pid`'s threads that are not `cg` or below it.
    fn threads_outside(&self, pid: u32, cg: &Path) -> Vec<PathBuf> {
        let Ok(tasks) = std::fs::read_dir(self.proc_root.join(format!("{pid}/task"))) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(t.path().join("cgroup")) else {
                continue; // the thread ended
            };
            let Some(at) = text
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .and_then(|rel| self.under_root(rel).ok())
            else {
                continue;
            };
            if !at.starts_with(cg) && !out.contains(&at) {
                out.push(at);
            }
        }
        out
    }

    /// `rel` (as /proc/PID/cgroup writes it) under the mount, refusing anything that is not a
    /// plain descendant: the root itself, `..`, or a path the kernel would not print.
    fn under_root(&self, rel: &str) -> Result<PathBuf> {
        let rel = Path::new(rel.trim_end());
        let mut out = self.cgroup_root.clone();
        let mut depth = 0;
        for c in rel.components() {
            match c {
                Component::RootDir => {}
                Component::Normal(n) => {
                    out.push(n);
                    depth += 1;
                }
                _ => bail!("not a plain cgroup path"),
            }
        }
        if depth == 0 {
            bail!("the root cgroup: freezing it would stop the whole host");
        }
        Ok(out)
    }

    /// Why freezing `cg` for `target` (running as `uid`) would stop someone it must not, if so.
    pub fn check(&self, cg: &Path, target: u32, uid: u32, spare: &Spare) -> Result<()> {
        if let Some(n) = descendants(cg).filter(|&n| n > MAX_DESCENDANTS) {
            bail!(
                "{} has {n} cgroups below it (more than {MAX_DESCENDANTS}: too many to check at \
                 each freeze)",
                cg.display()
            );
        }
        let mut members = Vec::new();
        collect_members(cg, &mut members, &mut 0)?;
        if !members.contains(&target) {
            bail!("pid {target} is no longer in {}", cg.display());
        }
        for pid in members {
            if spare.own.contains(&pid) {
                bail!(
                    "{} also holds pid {pid}, this controller or its guardian",
                    cg.display()
                );
            }
            if spare.online.contains(&pid) {
                bail!("{} also holds pid {pid}, an online process", cg.display());
            }
            match self.uid_of(pid) {
                Some(u) if u == uid => {}
                Some(u) => bail!(
                    "{} also holds pid {pid} of uid {u} (the target runs as uid {uid})",
                    cg.display()
                ),
                None => {} // exited meanwhile
            }
        }
        Ok(())
    }

    fn uid_of(&self, pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(self.proc_root.join(format!("{pid}/status"))).ok()?;
        crate::observe::procinfo::status_field(&status, "Uid")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

pub use crate::backend::guardian::set_frozen;

/// Waits up to `limit` for `cgroup.events` to say `frozen 1` (the kernel freezes tasks
/// asynchronously); true when it did.
pub fn wait_frozen(cg: &Path, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let frozen = std::fs::read_to_string(cg.join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"));
        if frozen || Instant::now() >= end {
            return frozen;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The fallback of one backend: the freezer and the cgroups it froze, by pid.
pub struct Fallback {
    freezer: Freezer,
    frozen: std::collections::BTreeMap<u32, PathBuf>,
    /// Processes whose first freeze was said (later ones are logged at info level).
    said: BTreeSet<u32>,
    /// When the frozen cgroups were last looked at for escapes.
    checked_ns: u64,
}

/// How often the frozen cgroups are looked at for escapes (a thaw, a thread outside).
const ESCAPE_CHECK_NS: u64 = 50_000_000;

impl Fallback {
    pub fn new(freezer: Freezer) -> Self {
        Self {
            freezer,
            frozen: Default::default(),
            said: BTreeSet::new(),
            checked_ns: 0,
        }
    }

    /// The frozen processes that got out (their cgroup thawed, a thread of theirs outside
    /// it), each frozen again: one notice per process and way out. At most every 50 ms.
    pub fn escapes(&mut self, lease: &mut KfdLease, state: &State, now_ns: u64) -> Vec<Notice> {
        if now_ns.saturating_sub(self.checked_ns) < ESCAPE_CHECK_NS || self.frozen.is_empty() {
            return Vec::new();
        }
        self.checked_ns = now_ns;
        let mut out = Vec::new();
        let frozen: Vec<(u32, PathBuf)> =
            self.frozen.iter().map(|(p, c)| (*p, c.clone())).collect();
        for (pid, cg) in frozen {
            if !self.freezer.proc_root.join(pid.to_string()).exists() {
                continue; // gone: thawed when the controller hears of it
            }
            let thawed =
                std::fs::read_to_string(cg.join("cgroup.freeze")).is_ok_and(|t| t.trim() == "0");
            if thawed {
                let answer = match set_frozen(&cg, true) {
                    Ok(()) => "frozen again".to_string(),
                    Err(e) => format!("could not freeze it again: {e}"),
                };
                out.push(escaped(pid, EscapeKind::Thawed, &cg, answer));
            }
            let Some(away) = self.freezer.threads_outside(pid, &cg).into_iter().next() else {
                continue;
            };
            let answer = match self.move_freeze(lease, state, pid, &cg, away.clone()) {
                Ok(to) => format!("froze {} instead", to.display()),
                Err(e) => format!("could not freeze {}: {e:#}", away.display()),
            };
            out.push(escaped(pid, EscapeKind::Moved, &away, answer));
        }
        out
    }

    /// Freezes the domain of `away` (where a thread of `pid` runs now) in place of `old`.
    fn move_freeze(
        &mut self,
        lease: &mut KfdLease,
        state: &State,
        pid: u32,
        old: &Path,
        away: PathBuf,
    ) -> Result<PathBuf> {
        let to = self.freezer.domain_of(away);
        if to.starts_with(old) {
            // A thread in a threaded child of the frozen cgroup is frozen with it.
            return Ok(old.to_path_buf());
        }
        self.freezer
            .check(&to, pid, uid_of(state, pid)?, &spare(state, lease))?;
        lease.freeze(&FrozenEntry {
            cgroup: to.clone(),
            pid,
        })?;
        if let Err(e) = set_frozen(&to, true) {
            let _ = lease.thaw(&to);
            return Err(e).with_context(|| format!("freezing {}", to.display()));
        }
        self.frozen.insert(pid, to.clone());
        // The cgroup it left holds only the target's user's own processes (checked when it
        // was frozen): it runs again.
        if set_frozen(old, false).is_ok() {
            let _ = lease.thaw(old);
        }
        Ok(to)
    }

    /// Freezes `pid`'s cgroup (unless it is frozen already) once the guardian answers for it;
    /// the report names the cgroup and counts every live queue of `pid` as held.
    /// `escaped`: frozen because it escaped its suspension (else: it cannot be suspended).
    pub fn freeze(
        &mut self,
        lease: &mut KfdLease,
        state: &State,
        pid: u32,
        escaped: bool,
    ) -> Result<OpReport> {
        let issued_ns = monotonic_ns();
        let cg = match self.frozen.get(&pid) {
            Some(cg) => cg.clone(),
            None => {
                let cg = self.freezer.cgroup_of(pid)?;
                self.freezer
                    .check(&cg, pid, uid_of(state, pid)?, &spare(state, lease))?;
                lease.freeze(&FrozenEntry {
                    cgroup: cg.clone(),
                    pid,
                })?;
                if let Err(e) = set_frozen(&cg, true) {
                    let _ = lease.thaw(&cg);
                    return Err(e).with_context(|| format!("freezing {}", cg.display()));
                }
                // Said once per process: the policy freezes it again every episode.
                let first = self.said.insert(pid);
                if first && escaped {
                    log::warn!(
                        "pid {pid}: kept escaping the suspension of its queues: froze its cgroup \
                         {} too (escape = \"freeze\"; work it queued already still runs)",
                        cg.display()
                    );
                } else if first {
                    log::warn!(
                        "pid {pid}: its GPU runtime never enabled the KFD debug API, so its \
                         queues cannot be suspended: froze its cgroup {} instead (no_debug_api = \
                         \"freeze\"; work it queued already still runs; said once per process)",
                        cg.display()
                    );
                } else {
                    log::info!("pid {pid}: froze its cgroup {}", cg.display());
                }
                if !wait_frozen(&cg, Duration::from_millis(100)) {
                    log::info!("{}: not frozen within 100 ms (it will be)", cg.display());
                }
                self.frozen.insert(pid, cg.clone());
                cg
            }
        };
        Ok(report(state, pid, issued_ns, &cg))
    }

    /// Thaws `pid`'s cgroup if the fallback froze it (None: it did not).
    pub fn thaw(&mut self, lease: &mut KfdLease, state: &State, pid: u32) -> Option<OpReport> {
        let issued_ns = monotonic_ns();
        let cg = self.frozen.remove(&pid)?;
        match set_frozen(&cg, false) {
            Ok(()) => {}
            // The process and its cgroup are gone: nothing is left frozen.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                // The guardian still answers for it: it thaws it when this controller goes.
                log::warn!("pid {pid}: thawing {}: {e}", cg.display());
                self.frozen.insert(pid, cg);
                return None;
            }
        }
        if let Err(e) = lease.thaw(&cg) {
            log::warn!("{e:#}");
        }
        Some(report(state, pid, issued_ns, &cg))
    }

    /// Thaws everything (the controller stops, or the policy no longer asks for it).
    pub fn thaw_all(&mut self, lease: &mut KfdLease, state: &State) {
        let pids: Vec<u32> = self.frozen.keys().copied().collect();
        for pid in pids {
            if let Some(r) = self.thaw(lease, state, pid) {
                if let crate::outcome::Effect::Frozen(cg) = &r.effect {
                    log::info!("pid {pid}: thawed {cg}");
                }
            }
        }
    }

    pub fn is_frozen(&self, pid: u32) -> bool {
        self.frozen.contains_key(&pid)
    }
}

/// The user `pid` runs as, from the model.
fn uid_of(state: &State, pid: u32) -> Result<u32> {
    state
        .procs
        .get(&pid)
        .and_then(|p| p.info.as_ref())
        .and_then(|i| i.uid)
        .context("its user is not known yet")
}

/// Who a freeze must not stop: online processes, this controller and its guardian.
fn spare(state: &State, lease: &KfdLease) -> Spare {
    Spare {
        online: state
            .procs
            .values()
            .filter(|p| p.class.as_deref() == Some("online"))
            .map(|p| p.pid)
            .collect(),
        own: std::iter::once(std::process::id())
            .chain(lease.guardian_pid())
            .collect(),
    }
}

fn escaped(pid: u32, kind: EscapeKind, cg: &Path, answer: String) -> Notice {
    Notice::Escaped {
        pid,
        kind,
        text: format!("{} ({})", kind.what(), cg.display()),
        answer,
    }
}

fn report(state: &State, pid: u32, issued_ns: u64, cg: &Path) -> OpReport {
    let queues = state
        .procs
        .get(&pid)
        .map(|p| {
            p.live_queues()
                .map(|q| QueueResult {
                    queue_id: q.queue_id,
                    gpu_id: Some(q.gpu_id),
                    outcome: QueueOutcome::Done,
                })
                .collect()
        })
        .unwrap_or_default();
    OpReport {
        pid,
        ret: None,
        queues,
        issued_ns,
        returned_ns: monotonic_ns(),
        effect: crate::outcome::Effect::Frozen(cg.display().to_string()),
    }
}

/// `nr_descendants` of `cg`'s `cgroup.stat`: the live cgroups below it.
fn descendants(cg: &Path) -> Option<usize> {
    std::fs::read_to_string(cg.join("cgroup.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("nr_descendants ")?.trim().parse().ok())
}

/// The processes of `cg` and of every cgroup below it (bounded in processes and in cgroups:
/// `seen` counts the cgroups walked).
fn collect_members(cg: &Path, out: &mut Vec<u32>, seen: &mut usize) -> Result<()> {
    *seen += 1;
    if *seen > MAX_DESCENDANTS + 1 {
        bail!(
            "more than {MAX_DESCENDANTS} cgroups below the one to freeze (too many to check at \
             each freeze)"
        );
    }
    // A threaded cgroup has no processes of its own (reading its cgroup.procs is EOPNOTSUPP):
    // its threads' processes are listed by the threaded domain above it.
    let threaded =
        std::fs::read_to_string(cg.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded");
    if !threaded {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs"))
            .with_context(|| format!("reading {}/cgroup.procs", cg.display()))?;
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if out.len() > MAX_MEMBERS {
        bail!("{} holds more than {MAX_MEMBERS} processes", cg.display());
    }
    let dir = std::fs::read_dir(cg).with_context(|| format!("listing {}", cg.display()))?;
    for e in dir.flatten() {
        // Child cgroups are directories; a link is never followed.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_members(&e.path(), out, seen)?;
        }
    }
    Ok(())
}

/// The mount point of the cgroup v2 file system in a mountinfo text.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        dir: PathBuf,
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    impl Fake {
        fn new() -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("gp-freezer-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self { dir }
        }
        fn freezer(&self) -> Freezer {
            Freezer::new(self.dir.join("cg"), self.dir.join("proc"))
        }
        fn cgroup(&self, rel: &str, pids: &[u32]) -> PathBuf {
            let d = self.dir.join("cg").join(rel);
            std::fs::create_dir_all(&d).unwrap();
            let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(d.join("cgroup.procs"), text).unwrap();
            d
        }
        fn process(&self, pid: u32, uid: u32, cgroup: &str) {
            let d = self.dir.join(format!("proc/{pid}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Name:\tjob\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
        }
    }

    /// 20,000 empty cgroups below the job's (a delegated subtree): refused at once from
    /// `cgroup.stat`, and, where there is none, after walking at most the bound, never all.
    #[test]
    fn a_subtree_of_too_many_cgroups_is_refused_without_walking_it() {
        let f = Fake::new();
        let cg = f.cgroup("user.slice/job.scope", &[10]);
        f.process(10, 1000, "/user.slice/job.scope");
        let fr = f.freezer();
        std::fs::write(
            cg.join("cgroup.stat"),
            "nr_descendants 20000\nnr_dying_descendants 0\n",
        )
        .unwrap();
        let e = fr.check(&cg, 10, 1000, &Spare::default()).unwrap_err();
        assert!(
            format!("{e:#}").contains("has 20000 cgroups below it"),
            "{e:#}"
        );
        std::fs::remove_file(cg.join("cgroup.stat")).unwrap();
        for i in 0..=MAX_DESCENDANTS {
            std::fs::create_dir_all(cg.join(format!("c{i}"))).unwrap();
            std::fs::write(cg.join(format!("c{i}/cgroup.procs")), "").unwrap();
        }
        let e = fr.check(&cg, 10, 1000, &Spare::default()).unwrap_err();
        assert!(format!("{e:#}").contains("more than 256 cgroups"), "{e:#}");
        // At the bound it is checked as before.
        std::fs::remove_dir_all(cg.join("c0")).unwrap();
        fr.check(&cg, 10, 1000, &Spare::default()).unwrap();
    }

    #[test]
    fn a_cgroup_of_the_targets_own_processes_may_be_frozen() {
        let f = Fake::new();
        let cg = f.cgroup("user.slice/job.scope", &[10, 11]);
        f.cgroup("user.slice/job.scope/sub", &[12]);
        for p in [10, 11, 12] {
            f.process(p, 1000, "/user.slice/job.scope");
        }
        let fr = f.freezer();
        assert_eq!(fr.cgroup_of(10).unwrap(), cg);
        fr.check(&cg, 10, 1000, &Spare::default()).unwrap();
    }

    #[test]
    fn a_cgroup_shared_with_others_is_refused_saying_whom_it_would_stop() {
        let f = Fake::new();
        let cg = f.cgroup("shared", &[10, 20, 30]);
        f.cgroup("shared/child", &[40]);
        f.process(10, 1000, "/shared");
        f.process(20, 1000, "/shared");
        f.process(30, 1000, "/shared");
        f.process(40, 0, "/shared/child");
        let fr = f.freezer();
        let e = fr.check(&cg, 10, 1000, &Spare::default()).unwrap_err();
        assert!(e.to_string().contains("pid 40 of uid 0"), "{e}");
        let spare = Spare {
            online: BTreeSet::from([20]),
            own: BTreeSet::new(),
        };
        let e = fr.check(&cg, 10, 1000, &spare).unwrap_err();
        assert!(e.to_string().contains("pid 20, an online process"), "{e}");
        let spare = Spare {
            online: BTreeSet::new(),
            own: BTreeSet::from([30]),
        };
        let e = fr.check(&cg, 10, 1000, &spare).unwrap_err();
        assert!(e.to_string().contains("pid 30, this controller"), "{e}");
        // Not there any more: nothing to freeze.
        let e = fr.check(&cg, 99, 1000, &Spare::default()).unwrap_err();
        assert!(e.to_string().contains("no longer in"), "{e}");
    }

    /// A process whose leader sits in a threaded child cgroup is frozen by its threaded domain
    /// (freezing the child alone left its other threads running), and a thread of a frozen
    /// process outside the frozen cgroup is found.
    #[test]
    fn a_threaded_child_freezes_its_domain_and_threads_outside_are_found() {
        let f = Fake::new();
        let cg = f.cgroup("job", &[]);
        let t = f.cgroup("job/t", &[]);
        std::fs::write(t.join("cgroup.type"), "threaded\n").unwrap();
        std::fs::write(cg.join("cgroup.type"), "domain threaded\n").unwrap();
        f.process(10, 1000, "/job/t");
        let fr = f.freezer();
        assert_eq!(
            fr.cgroup_of(10).unwrap(),
            cg,
            "the domain, not the threaded child"
        );
        // A nested threaded cgroup climbs to the same domain.
        let tt = f.cgroup("job/t/u", &[]);
        std::fs::write(tt.join("cgroup.type"), "threaded\n").unwrap();
        assert_eq!(fr.domain_of(tt.clone()), cg);
        // Threads: one in the domain, one in its threaded child, one elsewhere.
        let task = |tid: u32, at: &str| {
            let d = f.dir.join(format!("proc/10/task/{tid}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), format!("0::{at}\n")).unwrap();
        };
        task(10, "/job/t");
        task(11, "/job");
        assert!(fr.threads_outside(10, &cg).is_empty());
        assert_eq!(fr.threads_outside(10, &t), vec![cg.clone()]);
        task(12, "/elsewhere");
        assert_eq!(
            fr.threads_outside(10, &cg),
            vec![f.dir.join("cg/elsewhere")]
        );
    }

    #[test]
    fn the_root_cgroup_and_odd_paths_are_refused() {
        let f = Fake::new();
        f.process(10, 1000, "/");
        f.process(11, 1000, "/a/../b");
        let fr = f.freezer();
        let e = fr.cgroup_of(10).unwrap_err();
        assert!(format!("{e:#}").contains("root cgroup"), "{e:#}");
        let e = fr.cgroup_of(11).unwrap_err();
        assert!(
            format!("{e:#}").contains("not a plain cgroup path"),
            "{e:#}"
        );
    }

    #[test]
    fn set_frozen_writes_the_freeze_file_and_wait_reads_the_events() {
        let f = Fake::new();
        let cg = f.cgroup("job", &[10]);
        std::fs::write(cg.join("cgroup.freeze"), "0").unwrap();
        set_frozen(&cg, true).unwrap();
        assert_eq!(
            std::fs::read_to_string(cg.join("cgroup.freeze")).unwrap(),
            "1"
        );
        std::fs::write(cg.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(!wait_frozen(&cg, Duration::from_millis(10)));
        std::fs::write(cg.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        assert!(wait_frozen(&cg, Duration::from_millis(10)));
        // Never through a link.
        std::fs::remove_file(cg.join("cgroup.freeze")).unwrap();
        std::os::unix::fs::symlink("/dev/null", cg.join("cgroup.freeze")).unwrap();
        assert!(set_frozen(&cg, false).is_err());
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let info = "22 1 0:21 / /proc rw - proc proc rw\n\
                    30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup2_mount(info), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("22 1 0:21 / /proc rw - proc proc rw\n"), None);
    }
}
