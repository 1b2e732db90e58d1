//! Self-test tests: reply parsing and the test's steps against fakes.

use std::cell::Cell;

use super::*;

const W: Duration = Duration::from_millis(4);

/// A fake target: the counter advances by one per read while running; a pause may leave
/// `in_flight` more iterations to complete (seen at the next read).
#[derive(Default)]
struct Fake {
    running: Cell<bool>,
    value: Cell<u64>,
    in_flight: Cell<u64>,
    pauses: Cell<u32>,
    resumes: Cell<u32>,
    reads: Cell<u32>,
}

impl Fake {
    fn new() -> Self {
        let f = Self::default();
        f.running.set(true);
        f
    }
    fn read(&self) -> Result<u64> {
        self.reads.set(self.reads.get() + 1);
        if self.running.get() {
            self.value.set(self.value.get() + 1);
        } else {
            self.value.set(self.value.get() + self.in_flight.take());
        }
        Ok(self.value.get())
    }
    fn pause(&self) -> Result<()> {
        self.pauses.set(self.pauses.get() + 1);
        self.running.set(false);
        Ok(())
    }
    fn resume(&self) -> Result<()> {
        self.resumes.set(self.resumes.get() + 1);
        self.running.set(true);
        Ok(())
    }
}

fn msg(r: Result<Verdict>) -> String {
    format!("{:#}", r.expect_err("verify should have failed"))
}

#[test]
fn verify_passes_when_pause_stops_and_resume_restarts() {
    let f = Fake::new();
    let v = verify(&mut || f.read(), &mut || f.pause(), &mut || f.resume(), W).unwrap();
    assert_eq!(
        (v.before, v.in_flight, v.while_paused, v.after),
        (1, 0, 0, 1)
    );
    assert_eq!((f.pauses.get(), f.resumes.get()), (1, 1));
    assert!(f.running.get());
    assert!(v.to_string().contains("0 while paused"), "{v}");
}

#[test]
fn verify_allows_one_iteration_in_flight_at_pause() {
    let f = Fake::new();
    f.in_flight.set(1);
    let v = verify(&mut || f.read(), &mut || f.pause(), &mut || f.resume(), W).unwrap();
    assert_eq!((v.in_flight, v.while_paused), (1, 0));
}

#[test]
fn verify_fails_when_pause_does_not_stop_the_counter() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || f.read(),
        &mut || Ok(()),
        &mut || f.resume(),
        W,
    ));
    assert!(m.contains("pause did not stop the GPU work"), "{m}");
    assert!(m.contains("advanced by 1"), "{m}");
    assert!(m.contains("the target was resumed"), "{m}");
    assert_eq!(f.resumes.get(), 1);
}

#[test]
fn verify_fails_when_resume_does_not_restart_the_counter() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || f.read(),
        &mut || f.pause(),
        &mut || Ok(()),
        W,
    ));
    assert!(m.contains("resume did not restart the GPU work"), "{m}");
    assert!(m.contains("counter stayed at 2"), "{m}");
    assert_eq!(f.pauses.get(), 1);
}

#[test]
fn verify_fails_without_progress_before_pausing_and_does_not_pause() {
    let f = Fake::new();
    f.running.set(false);
    let m = msg(verify(
        &mut || f.read(),
        &mut || f.pause(),
        &mut || f.resume(),
        W,
    ));
    assert!(m.contains("no progress"), "{m}");
    assert!(m.contains("before pausing"), "{m}");
    assert_eq!((f.pauses.get(), f.resumes.get()), (0, 0));
}

#[test]
fn verify_resumes_when_the_check_while_paused_fails() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || {
            if f.running.get() {
                f.read()
            } else {
                bail!("target went away")
            }
        },
        &mut || f.pause(),
        &mut || f.resume(),
        W,
    ));
    assert!(m.contains("reading the counter while paused"), "{m}");
    assert!(m.contains("target went away"), "{m}");
    assert_eq!((f.pauses.get(), f.resumes.get()), (1, 1));
    assert!(f.running.get());
}

#[test]
fn verify_pause_error_propagates_and_still_resumes() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || f.read(),
        &mut || bail!("RM said no"),
        &mut || f.resume(),
        W,
    ));
    assert!(m.starts_with("pause failed: RM said no"), "{m}");
    assert!(m.contains("resume was called anyway"), "{m}");
    assert_eq!(f.resumes.get(), 1);
    // Nothing is read after a failed pause.
    assert_eq!(f.reads.get(), 2);
}

#[test]
fn verify_reports_both_pause_and_resume_errors() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || f.read(),
        &mut || bail!("RM said no"),
        &mut || bail!("RM still says no"),
        W,
    ));
    assert!(m.contains("pause failed: RM said no"), "{m}");
    assert!(m.contains("failed too: RM still says no"), "{m}");
}

#[test]
fn verify_reports_resume_error() {
    let f = Fake::new();
    let m = msg(verify(
        &mut || f.read(),
        &mut || f.pause(),
        &mut || bail!("ioctl EIO"),
        W,
    ));
    assert!(m.starts_with("resume failed: ioctl EIO"), "{m}");
    assert!(m.contains("may still be paused"), "{m}");
}

#[test]
fn verify_reports_a_counter_going_backwards() {
    let mut values = [5u64, 9, 3].into_iter();
    let m = msg(verify(
        &mut || Ok(values.next().unwrap_or(0)),
        &mut || Ok(()),
        &mut || Ok(()),
        W,
    ));
    assert!(
        m.contains("went backwards across the pause (from 9 to 3)"),
        "{m}"
    );
}

#[test]
fn parse_reply_lines() {
    assert_eq!(parse_reply("ready 1234"), Some(Reply::Ready(1234)));
    assert_eq!(parse_reply("ready 1234\r"), Some(Reply::Ready(1234)));
    assert_eq!(parse_reply("42"), Some(Reply::Count(42)));
    assert_eq!(parse_reply("0"), Some(Reply::Count(0)));
    assert_eq!(
        parse_reply("err cuInit failed: CUDA_ERROR_NO_DEVICE (100)"),
        Some(Reply::Err(
            "cuInit failed: CUDA_ERROR_NO_DEVICE (100)".into()
        ))
    );
    assert_eq!(
        parse_reply("err"),
        Some(Reply::Err("(no reason given)".into()))
    );
    assert_eq!(
        parse_reply("err   "),
        Some(Reply::Err("(no reason given)".into()))
    );
    for bad in [
        "",
        "ready",
        "ready ",
        "ready 0",
        "ready x",
        "ready -5",
        "ready +5",
        "ready 99999999999",
        "-1",
        "+1",
        "1 2",
        "99999999999999999999999",
        "hello",
        "errand",
    ] {
        assert_eq!(parse_reply(bad), None, "{bad:?}");
    }
}

#[test]
fn load_of_a_missing_library_says_so() {
    let e = load("libgpreempt-selftest-does-not-exist.so.1")
        .err()
        .expect("loading a missing library must fail");
    let m = format!("{e:#}");
    assert!(
        m.starts_with("libgpreempt-selftest-does-not-exist.so.1 not found (dlopen: "),
        "{m}"
    );
    assert!(m.contains("user-space library is not installed"), "{m}");
}

#[test]
fn load_of_a_library_without_cuda_names_the_missing_symbol() {
    let e = load("libc.so.6").err().expect("libc is not libcuda");
    let m = format!("{e:#}");
    assert!(m.starts_with("libc.so.6 has no cuInit (dlsym: "), "{m}");
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(script);
    c
}

const T: Duration = Duration::from_secs(10);

/// A stand-in target in sh: `ready`, then one count per `count` line.
const SH_TARGET: &str = r#"echo "ready $$"; n=0; while read l; do n=$((n+1)); echo $n; done"#;

#[test]
fn target_spawn_count_and_drop() {
    let mut t = Target::spawn_command(sh(SH_TARGET), T).unwrap();
    let pid = t.pid();
    assert_eq!(t.count().unwrap(), 1);
    assert_eq!(t.count().unwrap(), 2);
    drop(t);
    // Reaped: the pid is gone (or, very unlikely, reused by something that is not ours).
    let ours =
        std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("ready"));
    assert!(!ours, "target {pid} outlived its Target");
}

#[test]
fn target_skips_a_late_reply_to_a_timed_out_count() {
    let script = r#"echo "ready $$"; n=0; read l; sleep 0.3; echo 100; while read l; do n=$((n+1)); echo $n; done"#;
    let mut t = Target::spawn_command(sh(script), T).unwrap();
    t.reply_timeout = Duration::from_millis(50);
    let m = format!("{:#}", t.count().unwrap_err());
    assert!(m.contains("did not answer `count` within 50ms"), "{m}");
    t.reply_timeout = T;
    assert_eq!(t.count().unwrap(), 1);
}

#[test]
fn target_err_line_is_the_spawn_error() {
    let script =
        "echo 'warming up' >&2; echo 'err cuInit failed: CUDA_ERROR_NO_DEVICE (100)'; exit 1";
    let m = format!("{:#}", Target::spawn_command(sh(script), T).err().unwrap());
    assert!(
        m.contains("it failed: cuInit failed: CUDA_ERROR_NO_DEVICE (100)"),
        "{m}"
    );
    assert!(m.contains("its stderr: warming up"), "{m}");
}

#[test]
fn target_exit_before_ready_is_reported() {
    let script = "echo 'Segmentation fault' >&2; exit 3";
    let m = format!("{:#}", Target::spawn_command(sh(script), T).err().unwrap());
    assert!(
        m.contains("exited (exit status: 3) before it was ready"),
        "{m}"
    );
    assert!(m.contains("its stderr: Segmentation fault"), "{m}");
}

#[test]
fn target_ready_timeout_is_reported() {
    let t0 = Instant::now();
    let m = format!(
        "{:#}",
        Target::spawn_command(sh("exec sleep 30"), Duration::from_millis(50))
            .err()
            .unwrap()
    );
    assert!(m.contains("did not report `ready` within 50ms"), "{m}");
    // Dropping it killed the sleeper rather than waiting for it.
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn target_wrong_pid_is_refused() {
    let m = format!(
        "{:#}",
        Target::spawn_command(sh("echo 'ready 1'; cat"), T)
            .err()
            .unwrap()
    );
    assert!(m.contains("reported `ready 1`, but its pid is"), "{m}");
}

#[test]
fn target_exit_after_ready_fails_count() {
    let mut t = Target::spawn_command(sh(r#"echo "ready $$"; read l; exit 4"#), T).unwrap();
    let m = format!("{:#}", t.count().unwrap_err());
    assert!(
        m.contains("exited (exit status: 4) instead of answering `count`"),
        "{m}"
    );
}

#[test]
fn target_missing_executable_is_reported() {
    let m = format!(
        "{:#}",
        Target::spawn(Path::new("/nonexistent/gpreempt-ebpf"), T)
            .err()
            .unwrap()
    );
    assert!(
        m.contains("/nonexistent/gpreempt-ebpf nv-selftest-target"),
        "{m}"
    );
    assert!(m.contains("starting it"), "{m}");
}
