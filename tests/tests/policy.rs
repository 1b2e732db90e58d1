//! `gpreempt-ebpf policy check` as a user runs it: the built binary on policy files, its exit
//! status, stdout and stderr; and as uid 65534 (root only to drop to it), which shows it needs
//! no privilege, GPU or controller.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Output},
};

use tests::{bin, require_root, TempDir};

const GOOD: &str = r#"[policy]
strategy = "priority"

[[rule]]
class = "online"
comm = "svc"
uid = 990

[[rule]]
class = "offline"
cgroup = "/batch.slice/*"
"#;

const BAD: &str = r#"[policy]
strategy = "priority"
window = "20xs"

[timeslice]
period = "100ms"

[[rule]]
comm = "x"
"#;

const WARNS: &str = r#"[[rule]]
class = "online"
comm = "triton*"

[[rule]]
class = "offline"
pid = 4242

[control]
group = "gpreempt-no-such-group"
"#;

fn check(exe: &Path, files: &[&Path]) -> Output {
    Command::new(exe)
        .args(["policy", "check"])
        .args(files)
        .output()
        .expect("running gpreempt-ebpf policy check")
}

fn lines(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write(dir: &TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.path(name);
    std::fs::write(&p, text).expect("writing a policy");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    p
}

#[test]
fn policy_check_reports_errors_by_line_and_warnings_without_failing() {
    let dir = TempDir::new("policy-check");
    let exe = bin("gpreempt-ebpf");
    let good = write(&dir, "good.toml", GOOD);
    let bad = write(&dir, "bad.toml", BAD);
    let warns = write(&dir, "warns.toml", WARNS);
    let (g, b, w) = (
        good.display().to_string(),
        bad.display().to_string(),
        warns.display().to_string(),
    );

    let out = check(&exe, &[&good]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let stdout = lines(&out.stdout);
    assert_eq!(stdout.len(), 1, "{stdout:#?}");
    assert!(
        stdout[0].starts_with(&format!("{g}: ok, 0 warning(s): priority, window 20ms"))
            && stdout[0].contains("2 rule(s), default ignore"),
        "{}",
        stdout[0]
    );

    // Every error of the bad file, by line; the good file beside it is still checked.
    let out = check(&exe, &[&bad, &good]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        lines(&out.stderr),
        [
            format!("{b}:3: window: invalid duration \"20xs\" (use e.g. 500us, 20ms, 1.5s)"),
            format!(
                "{b}:5: [timeslice] is used only with strategy = \"timeslice\" (set it in \
                 [policy], or remove this table)"
            ),
            format!("{b}:8: rule 1: no class (add class = \"online\", \"offline\" or \"ignore\")"),
        ]
    );
    assert_eq!(lines(&out.stdout).len(), 1, "{out:?}");
    assert!(lines(&out.stdout)[0].starts_with(&format!("{g}: ok")));

    // Warnings: the file is valid (exit 0); the spoofable rule, the pid rule and the group this
    // host lacks, in line order.
    let out = check(&exe, &[&warns]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = lines(&out.stderr);
    assert_eq!(err.len(), 3, "{err:#?}");
    assert!(
        err[0].starts_with(&format!(
            "{w}:1: warning: rule 1 matches only on comm/cmdline"
        )),
        "{err:#?}"
    );
    assert!(
        err[1].starts_with(&format!("{w}:5: warning: rule 2 matches pid 4242")),
        "{err:#?}"
    );
    assert!(
        err[2].starts_with(&format!(
            "{w}:10: warning: [control] group \"gpreempt-no-such-group\" does not exist on this \
             host"
        )),
        "{err:#?}"
    );
    assert!(
        lines(&out.stdout)[0].starts_with(&format!("{w}: ok, 3 warning(s): priority")),
        "{out:?}"
    );

    // A file that cannot be read is an error naming it.
    let missing = dir.path("missing.toml");
    let out = check(&exe, &[&missing]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        lines(&out.stderr),
        [format!(
            "cannot read policy file {}: No such file or directory (os error 2)",
            missing.display()
        )]
    );
    // A directory is refused as `run` refuses it, not read.
    let out = check(&exe, &[&dir.0]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a directory: give a regular file"),
        "{out:?}"
    );

    // No file: a usage error.
    let out = check(&exe, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn policy_check_needs_no_privilege() {
    require_root();
    let dir = TempDir::new("policy-check-nobody");
    // The build tree may not be reachable by uid 65534: a copy of the binary beside the files.
    let exe = dir.path("gp");
    std::fs::copy(bin("gpreempt-ebpf"), &exe).expect("copying the binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let good = write(&dir, "good.toml", GOOD);
    let bad = write(&dir, "bad.toml", BAD);
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&exe)
        .args(["policy", "check"])
        .args([&good, &bad])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = lines(&out.stderr);
    assert_eq!(err.len(), 3, "{err:#?}");
    assert!(
        err[0].starts_with(&format!("{}:3: window:", bad.display())),
        "{err:#?}"
    );
    assert!(
        lines(&out.stdout)[0].starts_with(&format!("{}: ok", good.display())),
        "{out:?}"
    );
}

const EXPLAIN: &str = r#"[policy]
default = "ignore"

[[rule]]
class = "online"
comm = "resnet*"

[[rule]]
class = "offline"
comm = "sleep"
"#;

/// A child `sleep` (`cmd` runs it, or execs it) that is killed when the test ends.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn spawn(cmd: &mut Command) -> Self {
        let s = Self(cmd.arg("60").spawn().expect("spawning sleep"));
        // A wrapper (setpriv) execs sleep: the pid is sleep's once it has.
        let comm = format!("/proc/{}/comm", s.0.id());
        for _ in 0..250 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c == "sleep\n") {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("{comm} never became sleep");
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn explain(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(["policy", "explain"])
        .args(args)
        .output()
        .expect("running gpreempt-ebpf policy explain")
}

#[test]
fn policy_explain_names_the_rule_and_why_earlier_ones_failed() {
    let dir = TempDir::new("policy-explain");
    let exe = bin("gpreempt-ebpf");
    let file = write(&dir, "p.toml", EXPLAIN);
    let f = file.display().to_string();
    let sleep = Sleeper::spawn(&mut Command::new("sleep"));
    let pid = sleep.0.id().to_string();
    let out = explain(&exe, &["--pid", &pid, "--policy", &f]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        lines(&out.stdout),
        [
            format!("pid {pid} (sleep): offline, by rule 2 ({f}:8) [policy {f}]"),
            format!(
                "  rule 1 ({f}:4, online): did not match: comm \"sleep\" does not match \"resnet*\""
            ),
            format!("  rule 2 ({f}:8, offline): matched: comm \"sleep\" matches \"sleep\""),
        ]
    );
    // JSON: the same facts.
    let out = explain(&exe, &["--pid", &pid, "--policy", &f, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["class"], "offline");
    assert_eq!(v["rule"], 2);
    assert_eq!(v["rule_line"], format!("{f}:8"));
    assert_eq!(v["rules"][0]["matched"], false);
    assert_eq!(v["rules"][0]["checks"][0]["matcher"], "comm");
    // No rule matches: the default, every rule tried.
    let other = write(&dir, "q.toml", &EXPLAIN.replace("\"sleep\"", "\"python*\""));
    let out = explain(
        &exe,
        &["--pid", &pid, "--policy", &other.display().to_string()],
    );
    let text = lines(&out.stdout);
    assert!(
        text[0].ends_with(&format!(
            "ignore, the default (no rule matched) [policy {}]",
            other.display()
        )),
        "{text:#?}"
    );
    assert_eq!(text.len(), 3, "{text:#?}");
    // No such process; no controller and no --policy: one clear sentence each, exit status 1.
    let out = explain(&exe, &["--pid", "4194303", "--policy", &f]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no process has pid 4194303"),
        "{out:?}"
    );
    let out = Command::new(&exe)
        .env("GPREEMPT_RUN_DIR", dir.path("no-controller"))
        .args(["policy", "explain", "--pid", &pid])
        .output()
        .expect("running gpreempt-ebpf policy explain");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no controller is running") && err.contains("--policy FILE"),
        "{err}"
    );
}

/// As a user without privilege, for the user's own process.
#[test]
fn policy_explain_works_as_non_root_for_ones_own_process() {
    require_root();
    let dir = TempDir::new("policy-explain-nobody");
    let exe = dir.path("gp");
    std::fs::copy(bin("gpreempt-ebpf"), &exe).expect("copying the binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let file = write(
        &dir,
        "p.toml",
        &EXPLAIN.replace("comm = \"sleep\"", "uid = 65534"),
    );
    let nobody = ["--reuid", "65534", "--regid", "65534", "--clear-groups"];
    let sleep = Sleeper::spawn(Command::new("setpriv").args(nobody).arg("sleep"));
    let pid = sleep.0.id();
    let out = Command::new("setpriv")
        .args(nobody)
        .arg(&exe)
        .args(["policy", "explain", "--pid", &pid.to_string(), "--policy"])
        .arg(&file)
        .output()
        .expect("setpriv (util-linux)");
    assert!(out.status.success(), "{out:?}");
    let text = lines(&out.stdout);
    assert!(
        text[0].contains("offline, by rule 2") && text[2].ends_with("matched: uid 65534 is 65534"),
        "{text:#?}"
    );
}

#[test]
fn policy_check_refuses_a_qos_not_spelled_as_kubernetes_does() {
    let dir = TempDir::new("policy-qos");
    let exe = bin("gpreempt-ebpf");
    let bad = write(
        &dir,
        "bad.toml",
        "[[rule]]\nclass = \"offline\"\nqos = \"besteffort\"\n",
    );
    let out = check(&exe, &[&bad]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        lines(&out.stderr),
        [format!(
            "{}:3: rule 1: qos: \"besteffort\" is not a Kubernetes QoS class (expected \
             \"BestEffort\", \"Burstable\" or \"Guaranteed\", spelled as Kubernetes spells them)",
            bad.display()
        )]
    );
    let good = write(
        &dir,
        "good.toml",
        "[[rule]]\nclass = \"offline\"\nqos = \"BestEffort\"\n\n\
         [[rule]]\nclass = \"online\"\nqos = \"Guaranteed\"\n",
    );
    let out = check(&exe, &[&good]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "no warning: kubelet sets the class: {out:?}"
    );
}
