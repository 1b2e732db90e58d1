use std::os::unix::fs::MetadataExt as _;

use tokio::io::AsyncReadExt as _;

use super::*;
use crate::rundir::tests::Scratch;

fn anyone() -> Gate {
    std::sync::Arc::new(|_: &Peer| true)
}

fn nobody() -> Gate {
    std::sync::Arc::new(|_: &Peer| false)
}

/// A server on a fresh run directory, and a task answering every request it hands over.
fn server(s: &Scratch, allow: Gate, limits: Limits) -> mpsc::Receiver<Incoming> {
    crate::rundir::prepare(&s.run()).unwrap();
    serve_with(&s.run(), allow, (SOCKET_MODE, None), "root", limits).unwrap()
}

#[test]
fn root_and_the_named_group_may_steer() {
    let root_only = Access::default();
    let peer = |uid, gid, groups: &[u32]| Peer {
        uid,
        gid,
        groups: groups.to_vec(),
    };
    assert!(root_only.allows(&peer(0, 0, &[])));
    assert!(!root_only.allows(&peer(1000, 990, &[990])));
    let admins = Access { group: Some(990) };
    assert!(admins.allows(&peer(1000, 990, &[])), "primary group");
    assert!(admins.allows(&peer(1000, 100, &[27, 990])), "supplementary");
    assert!(!admins.allows(&peer(1000, 100, &[27])));
    assert_eq!(admins.mode(), 0o660);
    assert_eq!(root_only.mode(), 0o600);
    assert_eq!(admins.who(), "root and members of group 990");
}

fn answer_all(mut rx: mpsc::Receiver<Incoming>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut n = 0;
        while let Some((_, reply)) = rx.recv().await {
            n += 1;
            let _ = reply.send(Response {
                ok: true,
                ..Default::default()
            });
        }
        n
    })
}

/// Sends `data` (as much as the server takes) and reads the one answer line.
async fn exchange(path: &Path, data: &[u8]) -> Response {
    let s = UnixStream::connect(path).await.unwrap();
    let (rd, mut wr) = s.into_split();
    let _ = wr.write_all(data).await;
    read_answer(rd).await
}

async fn read_answer(rd: tokio::net::unix::OwnedReadHalf) -> Response {
    let mut line = String::new();
    BufReader::new(rd).read_line(&mut line).await.unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

const STATUS: &[u8] = b"{\"op\":\"status\"}\n";

#[tokio::test]
async fn a_request_is_answered_and_the_socket_is_roots() {
    let s = Scratch::new("sock-ok");
    let rx = server(&s, anyone(), Limits::default());
    let path = s.run().join("control.sock");
    assert_eq!(
        std::fs::metadata(&path).unwrap().mode() & 0o777,
        0o600,
        "fixed, whatever the umask"
    );
    let served = answer_all(rx);
    let r = exchange(&path, STATUS).await;
    assert!(r.ok, "{r:?}");
    served.abort();
}

#[tokio::test]
async fn a_refused_peer_is_told_why_and_nothing_is_handed_on() {
    let s = Scratch::new("sock-peer");
    let mut rx = server(&s, nobody(), Limits::default());
    let path = s.run().join("control.sock");
    let suspend = b"{\"op\":\"suspend\",\"pid\":1,\"queues\":null,\"grace\":null}\n";
    let r = exchange(&path, suspend).await;
    assert!(!r.ok);
    let e = r.error.unwrap_or_default();
    assert!(e.contains("permission denied: only root"), "{e}");
    // The server task is single: once it answered the next connection, the first was done.
    let _ = exchange(&path, STATUS).await;
    assert!(rx.try_recv().is_err(), "a refused request reached the loop");
}

#[tokio::test]
async fn a_long_request_is_refused_without_buffering_it() {
    let s = Scratch::new("sock-long");
    let rx = server(&s, anyone(), Limits::default());
    let served = answer_all(rx);
    let path = s.run().join("control.sock");
    // No newline, far past the limit: the server stops reading at the limit and answers.
    let s1 = UnixStream::connect(&path).await.unwrap();
    let (rd, mut wr) = s1.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..64 {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let r = read_answer(rd).await;
    assert!(!r.ok);
    let e = r.error.unwrap_or_default();
    assert!(e.contains("request longer than 65536 bytes"), "{e}");
    writer.await.unwrap();
    // One that fits exactly (padding before the JSON) is served.
    let mut fits = vec![b' '; MAX_REQUEST - STATUS.len()];
    fits.extend_from_slice(STATUS);
    assert_eq!(fits.len(), MAX_REQUEST);
    assert!(exchange(&path, &fits).await.ok);
    served.abort();
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_with_a_reason() {
    let s = Scratch::new("sock-many");
    let limits = Limits {
        max_connections: 2,
        idle: Duration::from_secs(600),
        ..Limits::default()
    };
    let rx = server(&s, anyone(), limits);
    let served = answer_all(rx);
    let path = s.run().join("control.sock");
    // Two idle connections hold both slots (accepted in order: the third comes after them).
    let idle1 = UnixStream::connect(&path).await.unwrap();
    let idle2 = UnixStream::connect(&path).await.unwrap();
    let r = exchange(&path, STATUS).await;
    assert!(!r.ok);
    let e = r.error.unwrap_or_default();
    assert!(e.contains("serving 2 connections already"), "{e}");
    // A slot comes back when its connection ends.
    let (mut rd, wr) = idle1.into_split();
    drop(wr);
    let mut rest = Vec::new();
    rd.read_to_end(&mut rest).await.unwrap();
    let r = exchange(&path, STATUS).await;
    assert!(r.ok, "{r:?}");
    drop(idle2);
    served.abort();
}
