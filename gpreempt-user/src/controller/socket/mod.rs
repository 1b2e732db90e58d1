//! The control socket (`<run dir>/control.sock`): one JSON request line, one JSON response line.
//!
//! Whoever may send requests can suspend any process, so: the socket is 0600 (root), every
//! connection's peer is checked (SO_PEERCRED: uid 0 only; a refused peer gets one error line and
//! is logged once per uid), a request is at most [`MAX_REQUEST`] bytes, at most
//! [`MAX_CONNECTIONS`] are served at once (more are accepted and closed at once with an error
//! line), and a connection that does not send its request within [`IDLE`] is closed.

use std::{
    collections::HashSet, io::Write as _, os::unix::fs::PermissionsExt as _, path::Path, sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot, Semaphore},
};

use super::daemon::{lock_held, Request, Response};

/// The longest request line (a request names a pid and a few queue ids: far less).
pub const MAX_REQUEST: usize = 64 * 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take to send its request (`ask` sends it at once).
pub const IDLE: Duration = Duration::from_secs(2);
/// The socket file: root's (connecting needs write permission on it).
pub const SOCKET_MODE: u32 = 0o600;

pub type Incoming = (Request, oneshot::Sender<Response>);

/// The bounds a server keeps (tests use smaller ones).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_request: usize,
    pub max_connections: usize,
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request: MAX_REQUEST,
            max_connections: MAX_CONNECTIONS,
            idle: IDLE,
        }
    }
}

/// A connecting process: its uid, its gid and its supplementary groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Who may send requests: root, and the members of the operator's group when one is named
/// (`[control] group` in the policy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub group: Option<u32>,
}

impl Access {
    pub fn allows(&self, p: &Peer) -> bool {
        p.uid == 0
            || self
                .group
                .is_some_and(|g| p.gid == g || p.groups.contains(&g))
    }

    /// "root", or "root and group 1234": for refusals.
    fn who(&self) -> String {
        match self.group {
            Some(g) => format!("root and members of group {g}"),
            None => "root".into(),
        }
    }

    /// The socket's mode: group-writable only when a group may connect.
    fn mode(&self) -> u32 {
        if self.group.is_some() {
            0o660
        } else {
            SOCKET_MODE
        }
    }
}

/// Which peers may send requests (tests use closures).
pub(crate) type Gate = std::sync::Arc<dyn Fn(&Peer) -> bool + Send + Sync>;

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+); empty when unavailable.
fn peer_groups(s: &UnixStream) -> Vec<u32> {
    use std::os::fd::AsRawFd as _;
    let mut buf = vec![0u32; 256];
    let mut len = (buf.len() * 4) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`, which is that large, and sets
    // `len` to what it wrote (or what it needs, with ERANGE).
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Vec::new();
    }
    buf.truncate(len as usize / 4);
    buf
}

/// Distinct refused uids logged (each once); more are refused without a log line.
const REFUSALS_LOGGED: usize = 1024;

/// Serves the socket: each request is handed to the owner's loop through the returned channel.
pub fn serve(dir: &Path, access: Access) -> Result<mpsc::Receiver<Incoming>> {
    let who = access.who();
    serve_with(
        dir,
        std::sync::Arc::new(move |p: &Peer| access.allows(p)),
        (access.mode(), access.group),
        &who,
        Limits::default(),
    )
}

pub(crate) fn serve_with(
    dir: &Path,
    allow: Gate,
    (mode, group): (u32, Option<u32>),
    who: &str,
    limits: Limits,
) -> Result<mpsc::Receiver<Incoming>> {
    let who = who.to_string();
    let path = dir.join("control.sock");
    let fresh = dir.join("control.sock.new");
    // Stale sockets of a dead controller (we hold the lock, so no live one owns them).
    let _ = std::fs::remove_file(&fresh);
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&fresh).with_context(|| format!("listening on {}", fresh.display()))?;
    // bind honours the umask: the mode is fixed before the socket is reachable at its name.
    if let Some(g) = group {
        std::os::unix::fs::chown(&fresh, Some(0), Some(g))
            .with_context(|| format!("chgrp {g} {}", fresh.display()))?;
    }
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", fresh.display()))?;
    std::fs::rename(&fresh, &path).with_context(|| format!("renaming to {}", path.display()))?;
    let (tx, rx) = mpsc::channel(16);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        let mut refused = HashSet::new();
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and the like: do not spin.
                    log::warn!("control socket: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let cred = match stream.peer_cred() {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("control socket: no peer credentials: {e}");
                    continue;
                }
            };
            let uid = cred.uid();
            let peer = Peer {
                uid,
                gid: cred.gid(),
                groups: peer_groups(&stream),
            };
            if !allow(&peer) {
                if refused.len() < REFUSALS_LOGGED && refused.insert(uid) {
                    log::warn!(
                        "control socket: refused uid {uid} (pid {}): only {who} may send \
                         requests (logged once per uid)",
                        cred.pid().map_or("?".into(), |p| p.to_string())
                    );
                }
                turn_away(
                    stream,
                    format!(
                        "permission denied: only {who} may send requests to the gpreempt-ebpf \
                         controller (you are uid {uid})"
                    ),
                );
                continue;
            }
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                turn_away(
                    stream,
                    format!(
                        "the controller is serving {} connections already: try again",
                        limits.max_connections
                    ),
                );
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, tx, limits).await {
                    log::debug!("control socket: {e:#}");
                }
                drop(slot);
            });
        }
    });
    Ok(rx)
}

fn line(r: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(r).unwrap_or_default();
    out.push(b'\n');
    out
}

/// One error line and close, without waiting: a fresh connection's buffer takes a short line
/// (what does not fit is dropped, never waited for).
fn turn_away(stream: UnixStream, why: String) {
    if let Ok(s) = stream.into_std() {
        let _ = (&s).write(&line(&Response::err(why)));
    }
}

async fn answer(stream: UnixStream, tx: mpsc::Sender<Incoming>, limits: Limits) -> Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut buf = Vec::new();
    // One byte past the limit tells a long line from one that fits exactly.
    let mut rd = BufReader::new(rd.take(limits.max_request as u64 + 1));
    let read = tokio::time::timeout(limits.idle, rd.read_until(b'\n', &mut buf)).await;
    let resp = match read {
        Err(_) => Response::err(format!(
            "no request line within {} ms: closing",
            limits.idle.as_millis()
        )),
        Ok(r) => {
            r?;
            if buf.len() > limits.max_request && !buf.ends_with(b"\n") {
                Response::err(format!(
                    "request longer than {} bytes: refused",
                    limits.max_request
                ))
            } else {
                match serde_json::from_slice::<Request>(&buf) {
                    Ok(req) => {
                        let (rtx, rrx) = oneshot::channel();
                        tx.send((req, rtx)).await?;
                        rrx.await
                            .unwrap_or_else(|_| Response::err("the controller is shutting down"))
                    }
                    Err(e) => Response::err(format!("bad request: {e}")),
                }
            }
        }
    };
    // A peer that never reads does not hold the connection either.
    tokio::time::timeout(limits.idle, wr.write_all(&line(&resp)))
        .await
        .context("the peer does not read its answer")??;
    Ok(())
}

/// Sends a request to the running controller; None when no controller is running.
pub async fn ask(dir: &Path, req: &Request) -> Result<Option<Response>> {
    if !lock_held(dir) {
        return Ok(None);
    }
    // A socket in a directory others can write may be anyone's.
    crate::rundir::check(dir)?;
    let path = dir.join("control.sock");
    let stream = match UnixStream::connect(&path).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => anyhow::bail!(
            "permission denied on {}: only root may send requests to the gpreempt-ebpf \
             controller",
            path.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "a controller holds the lock but {} does not answer",
                    path.display()
                )
            })
        }
    };
    let (rd, mut wr) = stream.into_split();
    let mut out = serde_json::to_vec(req)?;
    out.push(b'\n');
    // A refused peer is answered and closed at once: the answer may be there before our
    // request is written (then the write fails and the answer says why).
    let sent = wr.write_all(&out).await;
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(rd).read_line(&mut line),
    )
    .await
    .context("the controller did not answer within 10 s")?;
    if line.trim().is_empty() {
        sent.context("sending the request")?;
        read?;
        anyhow::bail!("the controller closed the connection without an answer");
    }
    Ok(Some(
        serde_json::from_str(&line).context("the controller's answer")?,
    ))
}

#[cfg(test)]
mod tests;
