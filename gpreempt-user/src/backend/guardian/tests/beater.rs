//! The heartbeat from another thread ([`Beater`]) against a scripted guardian: it never waits
//! on the handle's request in progress, and closing the pipe is the guardian's EOF.

use std::time::{Duration, Instant};

use super::{entry, script, tmpdir};
use crate::backend::guardian::*;

/// The guardian's log so far.
fn log(d: &std::path::Path) -> String {
    std::fs::read_to_string(d.join("log")).unwrap_or_default()
}

#[test]
fn a_beater_beats_while_the_handle_waits_for_a_reply_and_close_is_eof() {
    let d = tmpdir("beater");
    // A guardian that takes a second to answer a hold.
    let exe = script(
        &d,
        r#"echo ready
while read l; do case "$l" in "") echo beat >> "$(dirname "$0")/log";; *hold*) echo hold >> "$(dirname "$0")/log"; sleep 1; echo ok;; esac; done
echo eof >> "$(dirname "$0")/log""#,
    );
    let mut h = GuardianHandle::spawn(&exe, &d.join("j")).unwrap();
    let b = h.beater();
    let holder = std::thread::spawn(move || {
        let r = h.hold(&entry(1, 2, &[3]));
        (h, r)
    });
    let end = Instant::now() + Duration::from_secs(10);
    while log(&d) != "hold\n" {
        assert!(Instant::now() < end, "{:?}", log(&d));
        std::thread::sleep(Duration::from_millis(5));
    }
    // The handle's owner is waiting for the reply: the beat goes all the same.
    b.beat().unwrap();
    let (h, r) = holder.join().unwrap();
    r.unwrap();
    assert!(b.close());
    // Closed: the guardian read its EOF and ended.
    h.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(log(&d), "hold\nbeat\neof\n");
    assert!(b.beat().is_err(), "nothing to beat once closed");
    std::fs::remove_dir_all(&d).unwrap();
}
