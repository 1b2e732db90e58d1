use super::*;

#[test]
fn messages_are_key_value_lines() {
    assert_eq!(
        Message::Ready {
            status: "controlling 2 GPUs"
        }
        .text(),
        "READY=1\nSTATUS=controlling 2 GPUs\n"
    );
    assert_eq!(
        Message::Reloading { monotonic_us: 42 }.text(),
        "RELOADING=1\nMONOTONIC_USEC=42\nSTATUS=reloading the policy\n"
    );
    // A newline in a status cannot smuggle in a field of its own.
    assert_eq!(
        Message::Stopping {
            status: "stopping\nREADY=1"
        }
        .text(),
        "STOPPING=1\nSTATUS=stopping READY=1\n"
    );
    assert_eq!(Message::Watchdog.text(), "WATCHDOG=1\n");
    assert_eq!(
        Message::ExtendTimeout {
            by: Duration::from_millis(1500)
        }
        .text(),
        "EXTEND_TIMEOUT_USEC=1500000\n"
    );
    assert_eq!(Message::Status("a\r\nb").text(), "STATUS=a  b\n");
}

#[test]
fn notify_socket_addresses() {
    use std::os::linux::net::SocketAddrExt as _;
    let a = parse_address("/run/systemd/notify").unwrap();
    assert_eq!(
        a.as_pathname(),
        Some(std::path::Path::new("/run/systemd/notify"))
    );
    let a = parse_address("@/org/systemd/notify/1").unwrap();
    assert_eq!(a.as_abstract_name(), Some(&b"/org/systemd/notify/1"[..]));
    assert!(a.as_pathname().is_none());
    for bad in ["", "relative/sock", "vsock:2:1234"] {
        let e = parse_address(bad).unwrap_err().to_string();
        assert!(e.contains("neither an absolute path"), "{bad}: {e}");
    }
    assert!(parse_address(&format!("/{}", "x".repeat(200))).is_err());
}

#[test]
fn the_watchdog_is_this_processs_only() {
    let s = Some("30000000");
    assert_eq!(watchdog_interval(s, None, 7), Some(Duration::from_secs(30)));
    assert_eq!(
        watchdog_interval(s, Some("7"), 7),
        Some(Duration::from_secs(30))
    );
    // Another process's (inherited from a parent), disabled, or malformed: none.
    assert_eq!(watchdog_interval(s, Some("8"), 7), None);
    assert_eq!(watchdog_interval(s, Some("x"), 7), None);
    assert_eq!(watchdog_interval(Some("0"), None, 7), None);
    assert_eq!(watchdog_interval(Some("-5"), None, 7), None);
    assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    assert_eq!(watchdog_interval(None, Some("7"), 7), None);
}

#[test]
fn watchdog_pings_at_half_the_interval() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut p = Pacer::new(Duration::from_secs(10));
    assert!(p.due(t0), "the first ping goes at once");
    assert!(!p.due(t0 + ms(1)));
    assert!(!p.due(t0 + ms(4999)));
    assert!(p.due(t0 + ms(5000)));
    assert!(!p.due(t0 + ms(9999)));
    // Late turns: the next is due half an interval after the late one, not before.
    assert!(p.due(t0 + ms(12_000)));
    assert!(!p.due(t0 + ms(16_999)));
    assert!(p.due(t0 + ms(17_000)));
    // A clock that seems to go back (another thread's earlier Instant) pings nothing.
    assert!(!p.due(t0));
}

/// What systemd receives: one datagram per message, at a path and at an abstract name; the
/// watchdog paced; nothing sent without a watchdog.
#[test]
fn datagrams_reach_the_socket() {
    let dir = std::env::temp_dir().join(format!("gpreempt-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify");
    let rx = UnixDatagram::bind(&path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let recv = |rx: &UnixDatagram| {
        let mut buf = [0u8; 512];
        let n = rx.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    };
    let mut n = Notifier::to(path.to_str().unwrap(), Some(Duration::from_secs(20))).unwrap();
    n.send(&Message::Ready { status: "up" });
    assert_eq!(recv(&rx), "READY=1\nSTATUS=up\n");
    let t0 = Instant::now();
    n.alive(t0);
    n.alive(t0 + Duration::from_secs(1));
    n.alive(t0 + Duration::from_secs(10));
    n.send(&Message::Stopping { status: "bye" });
    assert_eq!(recv(&rx), "WATCHDOG=1\n");
    assert_eq!(recv(&rx), "WATCHDOG=1\n");
    assert_eq!(recv(&rx), "STOPPING=1\nSTATUS=bye\n");

    use std::os::linux::net::SocketAddrExt as _;
    let name = format!("gpreempt-notify-test-{}", std::process::id());
    let rx2 =
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    rx2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut n = Notifier::to(&format!("@{name}"), None).unwrap();
    n.alive(t0);
    n.send(&Message::Reloading { monotonic_us: 1 });
    assert!(
        recv(&rx2).starts_with("RELOADING=1\n"),
        "no watchdog ping first"
    );

    // Without $NOTIFY_SOCKET every call does nothing.
    let mut quiet = Notifier::default();
    quiet.send(&Message::Watchdog);
    quiet.alive(t0);
    std::fs::remove_dir_all(&dir).unwrap();
}
