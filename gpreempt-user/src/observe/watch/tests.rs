//! Unit tests of the live map's pure parts.

use super::controller_line;
use crate::controller::daemon::Status;

#[test]
fn the_title_names_the_unit_and_the_metrics_endpoint() {
    let mut s = Status {
        controller_pid: 42,
        mode: "run".into(),
        held: vec![(7, 0, None)],
        ..Default::default()
    };
    assert_eq!(controller_line(&s), "controller: run pid 42, 1 held");
    s.unit = Some("gpreempt-ebpf.service".into());
    s.metrics = Some("127.0.0.1:9464".into());
    s.fenced = vec![(1, "error".into())];
    assert_eq!(
        controller_line(&s),
        "controller: run pid 42 (systemd gpreempt-ebpf.service), 1 held, 1 GPU(s) fenced, \
         metrics http://127.0.0.1:9464/metrics"
    );
}
