//! The systemd unit as installed, under a real systemd (root): `systemd-nspawn --boot` boots
//! the Debian 12 root `cargo xtask deploy-setup` makes (`.tools/unit-root`, systemd as init;
//! `--volatile=overlay`, so every boot starts from it unchanged), the .deb `cargo xtask package`
//! built is installed there with `dpkg -i`, and a driver unit inside runs the scenario:
//! - the emulator (`gpreempt-ebpf sim` of the workspace's build; the package has none) outside
//!   the controller's unit, its driver mounted where every unit sees it (`--shared-mounts`),
//!   with an online workload, an offline one, and an offline one whose runtime never enables
//!   the KFD debug API (in a cgroup of its own);
//! - `systemctl start`, which returns once the controller said READY=1 (after its self-test):
//!   the unit is active and its status line is the policy's; under the unit's sandbox launch
//!   hints attach and kernel names are read (opened as the processes themselves: setfsuid,
//!   setgroups, openat2), the offline work is suspended and the legacy one's cgroup frozen
//!   (`no_debug_api = "freeze"`), and the watchdog is pinged;
//! - `systemctl reload` loads the changed policy; `systemctl stop` thaws and resumes everything.
//!
//! A drop-in adds `-v` to the installed ExecStart and shortens WatchdogSec= (so pings show
//! within the test); the sandbox is the installed unit's. Nothing here is skipped: a missing
//! tool, root or package fails loudly.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{bin, deb, require_root, serial, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The root file system with systemd (xtask/src/deploy.rs).
fn unit_root() -> PathBuf {
    let r = repo().join(".tools/unit-root");
    assert!(
        r.join(".gpreempt-unit-root").is_file() && r.join("lib/systemd/systemd").is_file(),
        "{} has no systemd root: sudo -E cargo xtask deploy-setup (cargo xtask test runs it)",
        r.display()
    );
    r
}

const POLICY: &str = r#"[policy]
strategy = "priority"
window = "50ms"
resume_after = "20ms"
max_suspend = "60s"
min_run = "50ms"
default = "ignore"
no_debug_api = "freeze"

[[rule]]
class = "online"
cmdline = '--profile resnet18_b1\b'
uid = 0

[[rule]]
class = "offline"
cmdline = '--offline'
uid = 0
"#;

/// Runs inside the container as a unit of its own; writes what the host checks under /out.
const DRIVER: &str = r#"#!/bin/sh
exec > /out/driver.log 2>&1
PS4='+ $(cut -d" " -f1 /proc/uptime) '
set -x
GP=/opt/gp/gpreempt-ebpf
U=gpreempt-ebpf
dpkg -i /deb/*.deb; echo $? > /out/dpkg.rc
# What the package's maintainer scripts do once they exist: load the new unit.
systemctl daemon-reload
cp /lib/systemd/system/$U.service /out/installed.service
mkdir -p /etc/gpreempt-ebpf /etc/systemd/system/$U.service.d
cp /policy.toml /etc/gpreempt-ebpf/policy.toml
{ echo '[Service]'; echo 'ExecStart='
  sed -n 's|^ExecStart=/usr/bin/gpreempt-ebpf |ExecStart=/usr/bin/gpreempt-ebpf -v |p' /lib/systemd/system/$U.service
  echo 'WatchdogSec=2s'; } > /etc/systemd/system/$U.service.d/test.conf
systemctl daemon-reload
CG=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
mkdir $CG/gp-legacy
cat > /tmp/w.sh <<W
#!/bin/sh
$GP sim workload --profile resnet18_b1 --rate 50 --priority 15 --duration 90 >/dev/null 2>&1 & A=\$!
$GP sim workload --profile resnet50_b8 --offline --priority 0 --duration 90 >/dev/null 2>&1 & B=\$!
sh -c 'echo \$\$ > $CG/gp-legacy/cgroup.procs; exec $GP sim workload --profile resnet50_b1024 --offline --no-debug-api --priority 0 --duration 90' >/dev/null 2>&1 & C=\$!
echo \$C > /out/legacy.pid
touch /tmp/sim-ready
while [ ! -e /tmp/sim-stop ]; do sleep 0.2; done
kill \$A \$B \$C; wait
W
chmod +x /tmp/w.sh
$GP sim --seed 3 --shared-mounts -- /tmp/w.sh > /out/sim.log 2>&1 & S=$!
for i in $(seq 300); do [ -e /tmp/sim-ready ] && break; sleep 0.1; done
sleep 1
timeout 60 systemctl start $U; echo $? > /out/start.rc
systemctl show $U -p ActiveState -p Type -p StatusText -p WatchdogUSec > /out/started.show
sleep 5
cat $CG/gp-legacy/cgroup.freeze > /out/freeze.held
cp /run/gpreempt-ebpf/status.json /out/status.held.json
systemctl show $U -p WatchdogTimestampMonotonic --value > /out/wd1
sleep 2.5
systemctl show $U -p WatchdogTimestampMonotonic --value > /out/wd2
sed -i 's/resume_after = "20ms"/resume_after = "30ms"/' /etc/gpreempt-ebpf/policy.toml
timeout 30 systemctl reload $U; echo $? > /out/reload.rc
for i in $(seq 100); do systemctl show $U -p StatusText --value | grep -q 'resume_after 30ms' && break; sleep 0.1; done
systemctl show $U -p ActiveState -p StatusText > /out/reloaded.show
timeout 60 systemctl stop $U; echo $? > /out/stop.rc
systemctl show $U -p ActiveState -p Result > /out/stopped.show
cat $CG/gp-legacy/cgroup.freeze > /out/freeze.after
$GP queues --json > /out/queues.after.json 2> /out/queues.err
journalctl -u $U --no-pager > /out/journal.txt
touch /tmp/sim-stop
wait $S
echo done > /out/done
systemctl poweroff
"#;

const DRIVER_UNIT: &str = "[Unit]\nDescription=gpreempt-ebpf unit test driver\n\
    After=multi-user.target\n[Service]\nType=oneshot\nExecStart=/driver.sh\n";

/// `KEY=VALUE` lines of `systemctl show`.
fn show(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_installed_unit_controls_under_its_own_sandbox() {
    let _one = serial();
    require_root();
    let root = unit_root();
    let deb = deb();
    let t = TempDir::new("unit");
    let out = t.path("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(t.path("driver.sh"), DRIVER).unwrap();
    std::fs::set_permissions(
        t.path("driver.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(t.path("driver.service"), DRIVER_UNIT).unwrap();
    std::fs::write(t.path("policy.toml"), POLICY).unwrap();
    let bind_ro = |src: &Path, dst: &str| format!("--bind-ro={}:{dst}", src.display());
    let started = Instant::now();
    let mut nspawn = Command::new("systemd-nspawn");
    nspawn
        .arg("-D")
        .arg(&root)
        .args([
            "--quiet",
            "--volatile=overlay",
            "--boot",
            // No machined, no scope of its own: nothing of systemd's is needed on the host.
            "--register=no",
            "--keep-unit",
            "--console=pipe",
            // The controller's eBPF programs and perf events, and the emulator's pidfd_getfd
            // (the debugger's event fd): outside nspawn's default filter.
            "--capability=CAP_BPF,CAP_PERFMON",
            "--system-call-filter=bpf perf_event_open pidfd_getfd",
            // The emulator is a FUSE file system.
            "--bind=/dev/fuse",
        ])
        .arg(format!("--bind={}:/out", out.display()))
        .arg(bind_ro(&t.path("driver.sh"), "/driver.sh"))
        .arg(bind_ro(&t.path("policy.toml"), "/policy.toml"))
        .arg(bind_ro(
            &t.path("driver.service"),
            "/etc/systemd/system/driver.service",
        ))
        .arg(bind_ro(deb.parent().unwrap(), "/deb"))
        .arg(bind_ro(&bin("gpreempt-ebpf"), "/opt/gp/gpreempt-ebpf"))
        .args([
            "systemd.unit=multi-user.target",
            "systemd.wants=driver.service",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = nspawn
        .spawn()
        .expect("systemd-nspawn (apt-get install systemd-container)");
    let deadline = Instant::now() + Duration::from_secs(240);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let nspawn_out = child.wait_with_output().unwrap();
    println!(
        "booted, ran and powered off in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let read = |n: &str| std::fs::read_to_string(out.join(n)).unwrap_or_default();
    let journal = read("journal.txt");
    let ctx = || {
        format!(
            "nspawn: {}\ndriver: {}\nsim: {}\njournal:\n{journal}",
            String::from_utf8_lossy(&nspawn_out.stderr),
            read("driver.log"),
            read("sim.log")
        )
    };
    assert_eq!(
        read("done").trim(),
        "done",
        "the driver did not finish\n{}",
        ctx()
    );
    assert_eq!(read("dpkg.rc").trim(), "0", "{}", ctx());
    // The unit as shipped is the one systemd ran.
    let shipped = std::fs::read_to_string(repo().join("packaging/gpreempt-ebpf.service")).unwrap();
    assert_eq!(read("installed.service"), shipped);

    // Active only once READY=1 came: `start` returned with the policy's status line, which the
    // controller sends with READY=1 after its self-test.
    let st = read("started.show");
    assert_eq!(read("start.rc").trim(), "0", "{st}\n{}", ctx());
    assert_eq!(show(&st, "Type"), "notify", "{st}");
    assert_eq!(show(&st, "ActiveState"), "active", "{st}");
    assert!(
        show(&st, "StatusText").contains("policy.toml: priority")
            && show(&st, "StatusText").contains("resume_after 20ms"),
        "not ready when `systemctl start` returned: {st}"
    );
    let self_test = journal
        .find("gpreempt-ebpf run: started in")
        .unwrap_or(usize::MAX);
    let started_line = journal.find("Started gpreempt-ebpf.service").unwrap_or(0);
    assert!(
        self_test < started_line,
        "active before the self-test ended:\n{journal}"
    );

    // Under the unit's sandbox: launch hints attach, kernel names are read, no file a GPU
    // process names is refused to it.
    assert!(
        journal.contains("launch hints from 4 entry point(s)"),
        "{}",
        ctx()
    );
    assert!(journal.contains("kernel names read from"), "{}", ctx());
    assert!(!journal.contains("cannot read"), "{}", ctx());

    // Offline work suspended, the legacy runtime's cgroup frozen.
    let held: Value = serde_json::from_str(&read("status.held.json"))
        .unwrap_or_else(|e| panic!("status: {e}\n{}", ctx()));
    let legacy: u64 = read("legacy.pid").trim().parse().unwrap_or(0);
    assert!(
        held["held"].as_array().is_some_and(|h| !h.is_empty()),
        "nothing suspended: {held}"
    );
    assert!(
        held["frozen"][legacy.to_string()]
            .as_str()
            .is_some_and(|c| c.ends_with("/gp-legacy")),
        "pid {legacy} not frozen: {held}\n{}",
        ctx()
    );
    assert_eq!(read("freeze.held").trim(), "1", "{}", ctx());
    assert!(journal.contains("froze its cgroup"), "{}", ctx());

    // The watchdog: pinged from the loop (the drop-in's 2 s: a ping a second).
    let wd = |n: &str| read(n).trim().parse::<u64>().unwrap_or(0);
    assert!(
        wd("wd1") > 0 && wd("wd2") > wd("wd1"),
        "no watchdog pings: {} {}\n{}",
        wd("wd1"),
        wd("wd2"),
        ctx()
    );
    assert!(!journal.contains("Watchdog timeout"), "{}", ctx());

    // Reload: the new policy is the controller's (its status line says so) and it stays up.
    let rl = read("reloaded.show");
    assert_eq!(read("reload.rc").trim(), "0", "{rl}\n{}", ctx());
    assert_eq!(show(&rl, "ActiveState"), "active", "{rl}");
    assert!(
        show(&rl, "StatusText").contains("resume_after 30ms"),
        "{rl}\n{}",
        ctx()
    );
    assert!(journal.contains("policy reloaded: "), "{}", ctx());

    // Stop: thawed, every queue resumed.
    let sp = read("stopped.show");
    assert_eq!(read("stop.rc").trim(), "0", "{sp}");
    assert_eq!(show(&sp, "ActiveState"), "inactive", "{sp}");
    assert_eq!(show(&sp, "Result"), "success", "{sp}");
    assert_eq!(read("freeze.after").trim(), "0", "{}", ctx());
    assert!(journal.contains("nothing is left suspended"), "{}", ctx());
    let q: Value = serde_json::from_str(&read("queues.after.json"))
        .unwrap_or_else(|e| panic!("queues --json: {e}: {}", read("queues.err")));
    let queues: Vec<&Value> = q["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("{q}"))
        .iter()
        .flat_map(|p| p["queues"].as_array().into_iter().flatten())
        .collect();
    assert!(queues.len() >= 3, "{q}");
    for qu in queues {
        assert_eq!(qu["state"], "active", "left suspended: {qu}");
    }
}
