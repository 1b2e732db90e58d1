//! The HTTP side of `run --metrics`: serves `GET /metrics` from the page the control loop
//! renders, and the probes an orchestrator asks (`/readyz`: the self-test passed and the loop
//! published; `/healthz`: the loop still turns), nothing else; a slow or hostile client never
//! reaches the loop.

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The text the server hands out, replaced by the control loop.
pub type Page = Arc<RwLock<Rendered>>;

/// The page and when the loop rendered it: the loop renders only after the start-up self-test,
/// then every second while it turns.
#[derive(Clone, Debug, Default)]
pub struct Rendered {
    pub text: String,
    pub at: Option<std::time::Instant>,
}

impl From<String> for Rendered {
    fn from(text: String) -> Self {
        Self {
            text,
            at: Some(std::time::Instant::now()),
        }
    }
}

impl From<&str> for Rendered {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

/// `/healthz` fails once the loop has not rendered for this long (it renders every second; a
/// busy host's slow driver reads stretch a turn, not to this).
pub const LIVE_LIMIT: Duration = Duration::from_secs(30);

/// The answer to a GET of `path`: status line and body.
fn page_for(path: &[u8], page: &Rendered, now: std::time::Instant) -> (&'static str, String) {
    match (path, page.at) {
        (b"/metrics", _) => ("200 OK", page.text.clone()),
        (b"/readyz", Some(_)) => ("200 OK", "ready\n".into()),
        (b"/readyz", None) => (
            "503 Service Unavailable",
            "starting: the self-test has not passed yet\n".into(),
        ),
        (b"/healthz", None) => ("200 OK", "starting\n".into()),
        (b"/healthz", Some(at)) if now.saturating_duration_since(at) <= LIVE_LIMIT => {
            ("200 OK", "alive\n".into())
        }
        (b"/healthz", Some(at)) => (
            "503 Service Unavailable",
            format!(
                "the control loop has not turned for {} s\n",
                now.saturating_duration_since(at).as_secs()
            ),
        ),
        _ => (
            "404 Not Found",
            "try /metrics, /readyz or /healthz\n".into(),
        ),
    }
}

/// Longest request head read.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request head, and the whole exchange.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once, and from one peer address. Every connection is accepted at once
/// (none waits in the kernel's backlog behind idle ones); past a bound the oldest connection
/// still sending its head (idle, and at least [`EVICT_MIN_AGE`] old) is closed to make room,
/// else the new one is. A scrape sends its head within milliseconds and is then never closed:
/// idle connections, however many, cannot keep it out.
const MAX_CONNECTIONS: usize = 64;
const MAX_PER_PEER: usize = 8;
const EVICT_MIN_AGE: Duration = Duration::from_millis(100);

/// One connection being served.
struct Conn {
    peer: std::net::IpAddr,
    since: std::time::Instant,
    /// Its request head is in: it is being answered.
    answering: Arc<std::sync::atomic::AtomicBool>,
    abort: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Conns {
    next: u64,
    live: std::collections::HashMap<u64, Conn>,
}

impl Conns {
    /// Makes room for a connection from `peer`: None when there is none; else the idle
    /// connection taken out of the table for it, to abort once the table is unlocked (its task's
    /// [`Leave`] locks the table).
    fn room_for(&mut self, peer: std::net::IpAddr) -> Option<Option<tokio::task::AbortHandle>> {
        let now = std::time::Instant::now();
        let of_peer = self.live.values().filter(|c| c.peer == peer).count();
        let same_peer = of_peer >= MAX_PER_PEER;
        if !same_peer && self.live.len() < MAX_CONNECTIONS {
            return Some(None);
        }
        let oldest_idle = self
            .live
            .iter()
            .filter(|(_, c)| !same_peer || c.peer == peer)
            .filter(|(_, c)| {
                !c.answering.load(std::sync::atomic::Ordering::SeqCst)
                    && now.duration_since(c.since) >= EVICT_MIN_AGE
            })
            .min_by_key(|(_, c)| c.since)
            .map(|(id, _)| *id);
        oldest_idle
            .and_then(|id| self.live.remove(&id))
            .map(|c| Some(c.abort))
    }
}

/// Takes a connection out of the table when its task ends (or is aborted).
struct Leave(Arc<std::sync::Mutex<Conns>>, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .remove(&self.1);
    }
}

/// Binds `addr` and serves `GET /metrics` from `page` until the runtime ends.
pub async fn serve(addr: SocketAddr, page: Page) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let bound = listener.local_addr()?;
    let conns = Arc::new(std::sync::Mutex::new(Conns::default()));
    tokio::spawn(async move {
        loop {
            let (conn, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    log::debug!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let mut table = conns.lock().unwrap_or_else(|e| e.into_inner());
            let Some(evicted) = table.room_for(peer.ip()) else {
                // Closed at once: every connection is young or being answered.
                log::debug!("metrics: no room for a connection from {peer}");
                continue;
            };
            let id = table.next;
            table.next += 1;
            let answering = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (page, flag, leave) = (page.clone(), answering.clone(), Leave(conns.clone(), id));
            let task = tokio::spawn(async move {
                let _leave = leave;
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(conn, page, &flag)).await;
            });
            // The task cannot end before this is in: its Leave waits for the lock held here.
            table.live.insert(
                id,
                Conn {
                    peer: peer.ip(),
                    since: std::time::Instant::now(),
                    answering,
                    abort: task.abort_handle(),
                },
            );
            drop(table);
            if let Some(idle) = evicted {
                idle.abort();
            }
        }
    });
    Ok(bound)
}

/// One HTTP/1.x exchange: the request head (within [`HEAD_TIMEOUT`]; then `answering` is set),
/// then the page (or 404 / 405), then close.
async fn answer(
    mut conn: tokio::net::TcpStream,
    page: Page,
    answering: &std::sync::atomic::AtomicBool,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let Ok(n) = tokio::time::timeout_at(deadline, conn.read(&mut buf)).await else {
            return Ok(());
        };
        let n = n?;
        if n == 0 || head.len() + n > MAX_REQUEST {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    answering.store(true, std::sync::atomic::Ordering::SeqCst);
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, body) = match method {
        b"GET" => {
            let now = std::time::Instant::now();
            let rendered = page.read().map(|p| p.clone()).unwrap_or_default();
            page_for(path, &rendered, now)
        }
        _ => ("405 Method Not Allowed", String::new()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ready once the loop has rendered a page (after the self-test); alive while it renders;
    /// a loop stuck past the limit fails the liveness probe, not the readiness one.
    #[test]
    fn the_probes_follow_the_loop() {
        let t0 = std::time::Instant::now();
        let none = Rendered::default();
        assert_eq!(page_for(b"/readyz", &none, t0).0, "503 Service Unavailable");
        assert_eq!(page_for(b"/healthz", &none, t0).0, "200 OK");
        let fresh = Rendered::from("gpreempt_up 1\n");
        let at = fresh.at.unwrap();
        assert_eq!(page_for(b"/readyz", &fresh, at).0, "200 OK");
        assert_eq!(page_for(b"/healthz", &fresh, at + LIVE_LIMIT).0, "200 OK");
        let (st, body) = page_for(
            b"/healthz",
            &fresh,
            at + LIVE_LIMIT + Duration::from_secs(5),
        );
        assert_eq!(st, "503 Service Unavailable", "{body}");
        assert!(body.contains("has not turned for 35 s"), "{body}");
        assert_eq!(page_for(b"/metrics", &fresh, at).1, "gpreempt_up 1\n");
        assert_eq!(page_for(b"/", &fresh, at).0, "404 Not Found");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_server_answers_metrics_and_nothing_else() {
        let page = Page::default();
        *page.write().unwrap() = "gpreempt_up 1\n".into();
        let addr = serve("127.0.0.1:0".parse().unwrap(), page).await.unwrap();
        let ask = |req: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\ngpreempt_up 1\n"),
            "{ok}"
        );
        assert!(ask("GET / HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 404"));
        assert!(ask("POST /metrics HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 405"));
        // A head that never ends is cut off at the size limit, without an answer.
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}", "a".repeat(MAX_REQUEST));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = c.write_all(huge.as_bytes()).await;
        let mut out = String::new();
        let _ = c.read_to_string(&mut out).await;
        assert!(out.is_empty(), "{out}");
    }

    /// Many idle connections (more than the server serves at once, all from one address, as a
    /// local user's would be) cannot keep a real scrape out: it is answered at once, and the
    /// server keeps at most its per-peer bound of them open.
    #[tokio::test(flavor = "current_thread")]
    async fn idle_connections_cannot_keep_a_scrape_out() {
        let page = Page::default();
        *page.write().unwrap() = "gpreempt_up 1\n".into();
        let addr = serve("127.0.0.1:0".parse().unwrap(), page).await.unwrap();
        let mut idle = Vec::new();
        for i in 0..200 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            if i % 2 == 0 {
                // Half of them start a head and never finish it.
                c.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
            }
            idle.push(c);
        }
        tokio::time::sleep(EVICT_MIN_AGE + Duration::from_millis(50)).await;
        let scrape = async {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        let out = tokio::time::timeout(Duration::from_secs(1), scrape)
            .await
            .expect("the scrape waited behind idle connections");
        assert!(out.ends_with("\r\n\r\ngpreempt_up 1\n"), "{out}");

        // The server closed all but its per-peer bound of the idle ones.
        let mut open = 0;
        for c in &mut idle {
            let mut b = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(20), c.read(&mut b)).await {
                Err(_) => open += 1,         // still waiting for its head
                Ok(Ok(0)) | Ok(Err(_)) => {} // closed by the server
                Ok(Ok(_)) => panic!("an idle connection got an answer"),
            }
        }
        assert!(open <= MAX_PER_PEER, "{open} idle connections still open");
    }
}
