//! The guardian: nothing in the NVIDIA driver resumes channels that a dead controller paused
//! (unlike KFD, which drops the debug trap with the debugger's mm), so a separate process does.
//!
//! The controller spawns `gpreempt-ebpf nv-guardian --journal PATH` ([`GuardianHandle::spawn`])
//! with a pipe as its stdin, in its own process group (a Ctrl-C to the controller's group does
//! not reach it; it also ignores SIGINT/SIGHUP/SIGQUIT). Protocol, one JSON line per request,
//! one reply line (`ok` or `err <reason>`) per request, `ready` once at start:
//!
//! - `{"op":"hold","pid":P,"fd":F,"h_client":C,"h_subdevice":S,"channels":[..]}` before a pause:
//!   the guardian takes its own duplicate of the target's fd, resumes the listed channels once
//!   through it (they are running: this proves it can undo the pause), journals the entry
//!   (fsync) and replies `ok`. Only then may the controller pause. A repeated hold of the same
//!   (pid, client, subdevice) adds channels.
//! - A hold may also carry `"timeslices":[{"h_tsg":T,"original_us":U},..]` (absent: none; a hold
//!   may have channels, timeslices or both) before the controller lowers those TSGs' timeslices
//!   (`NVA06C_CTRL_CMD_SET_TIMESLICE`, which outlives the controller as a pause does). `U` is
//!   the TSG's timeslice before the change: the guardian sets each new one once through its
//!   duplicate (a no-op that proves it can undo the change), journals and replies `ok`. A
//!   repeated hold merges by TSG and the first original recorded wins: a later hold's
//!   "original" may be a value the controller already lowered.
//! - `{"op":"release","pid":P,"h_client":C}` after the resume: the entries go (journal
//!   rewritten) and so do the duplicates. A hold may also span many pause/resume cycles:
//!   resuming channels that run is harmless.
//! - An empty line is a heartbeat, with no reply. EOF catches a controller that dies, not one
//!   that hangs (its event loop stuck) with channels paused and its stdin still open. With
//!   `--lease-ms N` ([`GuardianHandle::spawn_with_lease`]) the controller owes a line (a request
//!   or [`GuardianHandle::beat`]) at least every N ms; after a longer silence the guardian resumes
//!   everything held, once until the next line, but keeps the holds and the journal: a
//!   controller that wakes up carries on with them (and may pause again).
//!
//! - `{"op":"freeze","cgroup":DIR,"pid":P}` before the controller freezes cgroup DIR (the KFD
//!   path's fallback for processes whose queues cannot be suspended): journaled in
//!   `<journal>-frozen`; `{"op":"thaw","cgroup":DIR}` after it thawed it. Every case below that
//!   resumes held entries also thaws these cgroups ([`frozen`]).
//!
//! Resuming an entry (on lease expiry above; on EOF, SIGTERM and from a leftover journal below)
//! also puts back the original timeslice of each of its TSGs ([`undo`]), one TSG at a time (a
//! failure does not stop the others, and keeps the entry journaled; a TSG the target freed has
//! nothing left to restore). A release restores nothing: the controller did before releasing.
//!
//! On EOF of stdin (the controller exited or was killed, any way) or SIGTERM, it resumes every
//! held entry through its own duplicates, says so on stderr, empties the journal and exits (0 if
//! everything was resumed). A target that exits is dropped at once: our duplicate of its fd
//! would keep its RM client, and so its GPU memory, alive. If the guardian itself dies, the
//! journal remains: [`recover`] (and every guardian at start) resumes what it lists.

use std::{
    io::{self, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use nix::sys::{
    signal::{SigHandler, SigSet, Signal},
    signalfd::{SfdFlags, SignalFd},
};

/// How long a starting guardian waits for its predecessor to finish undoing (well within the
/// controller's 30 s wait for `ready`).
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

mod frozen;
mod handle;
mod holds;
mod journal;
mod protocol;
mod say;
mod serve;
mod stopper;
mod targets;

pub use frozen::{set_frozen, FrozenEntry};
pub use handle::{Beater, GuardianHandle};
pub use holds::Guardian;
pub use journal::{recover, Journal};
use protocol::one_line;
pub use protocol::{HoldEntry, TsgTimeslice};
use serve::Input;
pub use serve::{serve, Event, Source};
pub use stopper::Stopper;
pub use targets::{enable_entry, undo, Rm, TargetFd, Targets};

/// `gpreempt-ebpf nv-guardian` (hidden; started by the controller).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The re-enable journal (in the run dir; the controller names it).
    #[arg(long, value_name = "FILE")]
    pub journal: PathBuf,
    /// Resume what is held when the controller sends no line for this long (0: no lease).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub lease_ms: u64,
    /// When the lease runs out, also SIGKILL this process (the controller on the KFD path:
    /// the kernel resumes a dead debugger's queues, never a stopped one's).
    #[arg(long, value_name = "PID")]
    pub kill_on_expiry: Option<u32>,
}

/// `gpreempt-ebpf nv-guardian --journal PATH [--lease-ms N]`.
pub fn main(args: &Args) -> Result<ExitCode> {
    // Job control too: a Ctrl-Z (or SIGTSTP) meant for the controller must not stop its guardian.
    for s in [
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        // SAFETY: SIG_IGN installs no handler code; nothing else in this process handles these.
        unsafe { nix::sys::signal::signal(s, SigHandler::SigIgn) }
            .with_context(|| format!("ignoring {s}"))?;
    }
    // Out of the controller's session too, when not already a group leader (spawn makes us one).
    let _ = nix::unistd::setsid();
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.thread_block().context("blocking SIGTERM")?;
    let sigterm = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).context("signalfd")?;

    let mut out = io::stdout().lock();
    let journal = Journal::new(&args.journal);
    // A predecessor's guardian may still be undoing its holds: wait for it (bounded).
    let started = journal
        .lock_within(LOCK_WAIT)
        .and_then(|lock| Ok((lock, Guardian::new(Rm, journal.clone())?)));
    let started = started.and_then(|(lock, mut g)| {
        if let Some(pid) = args.kill_on_expiry {
            g.kill_on_expiry(Stopper::new(pid)?);
        }
        Ok((lock, g))
    });
    let (_lock, mut g) = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(out, "err {}", one_line(&e)).and_then(|_| out.flush());
            return Err(e);
        }
    };
    writeln!(out, "ready")
        .and_then(|_| out.flush())
        .context("answering the controller")?;
    let lease = (args.lease_ms > 0).then(|| Duration::from_millis(args.lease_ms));
    Ok(
        if serve(Input::new(sigterm, io::stdin()), out, &mut g, lease) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

#[cfg(test)]
mod tests;
