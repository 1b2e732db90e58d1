//! The controller as a service (root): the .deb `cargo xtask package` built (`cargo xtask test`
//! builds it first) is installed with dpkg, the installed binary runs `doctor` and has no
//! emulator (`sim` says so), systemd accepts the unit, and `run` started exactly as the unit's
//! ExecStart says serves metrics that a real Prometheus (Debian's) scrapes inside the test
//! build's `sim`, with one workload in a fake Kubernetes pod; the package is removed again. The
//! maintainer scripts run through dpkg in a scratch root (install, upgrades, logrotate, remove,
//! purge). Nothing here is skipped: a missing package or tool fails loudly.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{assert_nothing_left, bin, deb, require_root, serial, TempDir};

const UID: &str = "1a2b3c4d-5e6f-4a8b-9c0d-112233445566";
const CID: &str = "4f1c8a2b9d3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a";
const UNIT: &str = "/lib/systemd/system/gpreempt-ebpf.service";

fn sh(cmd: &mut Command) -> std::process::Output {
    let shown = format!("{cmd:?}");
    cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"))
}

/// Removes the package and what the test put under /etc and /var/log, however it ends.
struct Installed;
impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "gpreempt-ebpf"])
            .output();
        let _ = std::fs::remove_file("/etc/gpreempt-ebpf/policy.toml");
        let _ = std::fs::remove_dir("/etc/gpreempt-ebpf");
        let _ = std::fs::remove_dir_all("/var/log/gpreempt-ebpf");
    }
}

/// `GET path` on `addr`: the body.
fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "{addr}{path}: {head}");
    body.to_string()
}

/// The unit's ExecStart with its Environment= values substituted.
fn exec_start(unit: &str) -> String {
    let mut env = Vec::new();
    let mut exec = String::new();
    for l in unit.lines() {
        if let Some(v) = l.strip_prefix("Environment=") {
            if let Some((k, v)) = v.split_once('=') {
                env.push((format!("${{{k}}}"), v.to_string()));
            }
        }
        if let Some(v) = l.strip_prefix("ExecStart=") {
            exec = v.to_string();
        }
    }
    assert!(!exec.is_empty(), "no ExecStart in the unit");
    for (k, v) in env {
        exec = exec.replace(&k, &v);
    }
    assert!(!exec.contains('$'), "unexpanded variable in {exec}");
    exec
}

const DOC: &str = "/usr/share/doc/gpreempt-ebpf";

/// Every file of docs/ and every example policy of the tree is installed under DOC as it is
/// here; the links of the installed README and docs reach installed files (but those into the
/// source tree, which the package does not ship); the installed binary accepts every installed
/// example; the main man page names the vendors and where the docs are.
fn assert_docs_installed() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut shipped = Vec::new();
    walk(&repo.join("docs"), &mut shipped);
    let mut examples = Vec::new();
    walk(&repo.join("examples"), &mut examples);
    examples.retain(|p| p.extension().is_some_and(|x| x == "toml"));
    assert!(shipped.len() > 10 && examples.len() >= 5);
    for f in [
        "README.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "LICENSE-GPL-2.0",
    ] {
        shipped.push(repo.join(f));
    }
    shipped.extend(examples.iter().cloned());
    for src in &shipped {
        let rel = src.strip_prefix(repo).unwrap();
        let installed = Path::new(DOC).join(rel);
        let got = std::fs::read(&installed)
            .unwrap_or_else(|e| panic!("{} not installed: {e}", installed.display()));
        assert_eq!(got, std::fs::read(src).unwrap(), "{}", installed.display());
    }

    const SOURCE_ONLY: [&str; 3] = ["packaging/", "gpreempt-user/", "scripts/"];
    let mut broken = Vec::new();
    let mut md: Vec<PathBuf> = vec![Path::new(DOC).join("README.md")];
    md.extend(
        std::fs::read_dir(Path::new(DOC).join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    for f in &md {
        let text = std::fs::read_to_string(f).unwrap();
        for (line, link) in tests::md_links(&text) {
            let file = link.split('#').next().unwrap_or("");
            if file.is_empty() {
                continue;
            }
            let target = tests::join_lexically(f.parent().unwrap(), file);
            let in_doc = target.strip_prefix(DOC).map(|r| r.display().to_string());
            if in_doc
                .as_ref()
                .is_ok_and(|r| SOURCE_ONLY.iter().any(|s| r.starts_with(s)))
            {
                continue;
            }
            if in_doc.is_err() || !target.is_file() {
                broken.push(format!("{}:{line}: {link}", f.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dead links once installed:\n{}",
        broken.join("\n")
    );

    let installed_examples: Vec<PathBuf> = examples
        .iter()
        .map(|e| Path::new(DOC).join(e.strip_prefix(repo).unwrap()))
        .collect();
    let out = sh(Command::new("/usr/bin/gpreempt-ebpf")
        .args(["policy", "check"])
        .args(&installed_examples));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "installed examples: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        installed_examples.len()
    );

    let out = sh(Command::new("zcat").arg("/usr/share/man/man1/gpreempt-ebpf.1.gz"));
    // roff escapes every '-'.
    let page = String::from_utf8_lossy(&out.stdout).replace("\\-", "-");
    assert!(
        page.contains("NVIDIA") && page.contains("amdkfd") && page.contains(DOC),
        "{page}"
    );
}

#[test]
fn the_package_installs_and_its_unit_serves_metrics_prometheus_scrapes() {
    let _one = serial();
    require_root();
    let deb = deb();
    let out = sh(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(
        out.status.success(),
        "dpkg -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _installed = Installed;

    // The installed binary: doctor (exit 1 here: no GPU), man pages, completions.
    let out = sh(Command::new("/usr/bin/gpreempt-ebpf").args(["doctor", "--json"]));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert!(
        doc["checks"].as_array().is_some_and(|c| c.len() > 10),
        "{doc}"
    );
    assert_eq!(doc["checks"][0]["name"], "privileges", "{doc}");
    // Built without the emulator: `sim` says so and how to get one, and no code of the emulator
    // or its FUSE library is linked (the package strips debug info, not the symbol table).
    let out = sh(Command::new("/usr/bin/gpreempt-ebpf").args(["sim", "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && err.contains("this build of gpreempt-ebpf has no emulator")
            && err.contains("cargo xtask demo"),
        "{:?} {err}",
        out.status
    );
    let out = sh(Command::new("nm").arg("/usr/bin/gpreempt-ebpf"));
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && syms.lines().count() > 1000,
        "nm: {syms:.200}"
    );
    let emulator: Vec<&str> = syms
        .lines()
        .filter(|l| l.contains("gpreempt_sim") || l.contains("fuser"))
        .take(5)
        .collect();
    assert!(
        emulator.is_empty(),
        "the packaged binary links the emulator: {emulator:?}"
    );
    // The tests' own build has it (the demo's).
    let out = sh(Command::new("nm").arg(bin("gpreempt-ebpf")));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("gpreempt_sim"),
        "the test build lacks the emulator"
    );
    for f in [
        "/usr/share/man/man1/gpreempt-ebpf.1.gz",
        "/usr/share/man/man1/gpreempt-ebpf-run.1.gz",
        "/usr/share/bash-completion/completions/gpreempt-ebpf",
        "/usr/share/zsh/vendor-completions/_gpreempt-ebpf",
        "/usr/share/doc/gpreempt-ebpf/examples/resnet-online-offline.toml",
        "/usr/share/man/man1/gpreempt-ebpf-policy-check.1.gz",
        "/usr/share/man/man1/gpreempt-ebpf-policy-explain.1.gz",
        UNIT,
    ] {
        assert!(Path::new(f).exists(), "{f} not installed");
    }
    assert_docs_installed();
    // Every page says how it exits (clap writes no such section; cli.rs adds it).
    let page =
        sh(Command::new("sh").args(["-c", "zcat /usr/share/man/man1/gpreempt-ebpf-run.1.gz"]));
    assert!(
        String::from_utf8_lossy(&page.stdout).contains(".SH \"EXIT STATUS\""),
        "gpreempt-ebpf-run(1) has no EXIT STATUS"
    );
    // Under systemd (JOURNAL_STREAM set) log lines carry their syslog priority, no colour.
    let out = sh(Command::new("/usr/bin/gpreempt-ebpf")
        .args(["-v", "trace", "--duration", "0.3", "--output", "/dev/null"])
        .env("JOURNAL_STREAM", "8:1234"));
    let err = String::from_utf8_lossy(&out.stderr);
    let logged: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("gpreempt_user::"))
        .collect();
    assert!(
        !logged.is_empty()
            && logged
                .iter()
                .all(|l| l.starts_with("<6>") || l.starts_with("<4>")),
        "{err}"
    );
    assert!(!err.contains('\x1b'), "{err}");
    let out = sh(Command::new("systemd-analyze").arg("verify").arg(UNIT));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // `run` exactly as the unit starts it, inside sim, with an online workload in a fake pod.
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let exec = exec_start(&unit);
    let metrics = exec
        .split_whitespace()
        .skip_while(|w| *w != "--metrics")
        .nth(1)
        .expect("--metrics in ExecStart")
        .to_string();
    std::fs::create_dir_all("/etc/gpreempt-ebpf").unwrap();
    std::fs::write(
        "/etc/gpreempt-ebpf/policy.toml",
        "[policy]\nstrategy = \"priority\"\nresume_after = \"3ms\"\ndefault = \"ignore\"\n\
         [[rule]]\nclass = \"online\"\nk8s_namespace = \"ml\"\npod = \"trainer-*\"\n\
         [[rule]]\nclass = \"offline\"\ncmdline = '--offline'\nuid = 0\n",
    )
    .unwrap();
    // What systemd's LogsDirectory= makes.
    std::fs::create_dir_all("/var/log/gpreempt-ebpf").unwrap();
    let t = TempDir::new("service");
    let logs = t.path("log");
    std::fs::create_dir_all(logs.join("containers")).unwrap();
    std::fs::create_dir_all(logs.join(format!("pods/ml_trainer-0_{UID}/worker"))).unwrap();
    std::fs::write(
        logs.join(format!("containers/trainer-0_ml_worker-{CID}.log")),
        b"",
    )
    .unwrap();
    let prom = t.path("prometheus.yml");
    std::fs::write(
        &prom,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n- job_name: gpreempt\n  static_configs: [{{targets: ['{metrics}']}}]\n"
        ),
    )
    .unwrap();
    let cg2 = tests::cgroup2_root().expect("a cgroup v2 hierarchy");
    let cg = format!(
        "{cg2}/kubepods.slice/kubepods-pod{}.slice",
        UID.replace('-', "_")
    );
    let d = t.0.display();
    let script = format!(
        r#"set -e
export GPREEMPT_K8S_LOG_ROOT={logs}
{exec} 2> {d}/run.err & R=$!
prometheus --config.file={prom} --storage.tsdb.path={d}/tsdb --web.listen-address=127.0.0.1:19190 > {d}/prom.log 2>&1 & P=$!
sleep 2
mkdir -p {cg}/cri-containerd-{CID}.scope
# In the pod's container cgroup before it opens the GPU, as a container runtime would place it.
sh -c 'echo $$ > {cg}/cri-containerd-{CID}.scope/cgroup.procs && exec "$@"' pod \
  $GP sim workload --profile resnet18_b1 --rate 20 --priority 15 --duration 40 > /dev/null 2>&1 & A=$!
$GP sim workload --profile resnet50_b1024 --offline --priority 0 --duration 40 > /dev/null 2>&1 & B=$!
touch {d}/ready
while [ ! -e {d}/done ]; do sleep 0.2; done
kill $A $B 2>/dev/null || true
wait $A $B || true
kill -TERM $R; wait $R || true
kill $P; wait $P || true
for i in $(seq 50); do rmdir {cg}/cri-containerd-{CID}.scope {cg} {cg2}/kubepods.slice 2>/dev/null && break; sleep 0.1; done
"#,
        logs = logs.display(),
        prom = prom.display(),
    );
    let mut sim = Command::new(bin("gpreempt-ebpf"))
        .args(["sim", "--seed", "3", "--", "sh", "-c", &script])
        .env("GP", bin("gpreempt-ebpf"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting sim");
    let finish = |sim: &mut std::process::Child| {
        let _ = std::fs::write(t.path("done"), b"");
        let deadline = Instant::now() + Duration::from_secs(60);
        while sim.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = sim.kill();
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !t.path("ready").exists() {
        if Instant::now() > deadline || sim.try_wait().unwrap().is_some() {
            finish(&mut sim);
            panic!(
                "sim did not start: {}",
                std::fs::read_to_string(t.path("run.err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Prometheus answers once it has scraped the online pod's process a few times.
    let query = "gpreempt_process_queues{class=\"online\",namespace=\"ml\",pod=\"trainer-0\",pod_container=\"worker\"}";
    let url = format!(
        "/api/v1/query?query={}",
        query
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    let mut answer = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        if let Ok(body) = std::panic::catch_unwind(|| get("127.0.0.1:19190", &url)) {
            answer = serde_json::from_str(&body).unwrap_or(Value::Null);
            if answer["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                break;
            }
        }
    }
    let page = std::panic::catch_unwind(|| get(&metrics, "/metrics")).unwrap_or_default();
    let offline = std::panic::catch_unwind(|| {
        get(
            "127.0.0.1:19190",
            "/api/v1/query?query=sum(gpreempt_process_suspends_total%7Bclass%3D%22offline%22%7D)",
        )
    })
    .unwrap_or_default();
    finish(&mut sim);
    let err = sim.wait_with_output().map(|o| o.stderr).unwrap_or_default();
    let run_err = std::fs::read_to_string(t.path("run.err")).unwrap_or_default();
    let why = format!(
        "sim: {}\nrun: {run_err}\nprometheus: {}",
        String::from_utf8_lossy(&err),
        std::fs::read_to_string(t.path("prom.log")).unwrap_or_default()
    );
    println!("emulated: {answer}\n{offline}");
    let r = &answer["data"]["result"][0];
    assert_eq!(r["value"][1], "1", "{answer}\n{why}");
    assert_eq!(r["metric"]["comm"], "resnet18_b1", "{answer}");
    let pid: u32 = r["metric"]["pid"].as_str().unwrap().parse().unwrap();
    assert!(pid > 1, "{answer}");
    // The controller acted for the online pod: offline was suspended (emulated).
    let off: Value = serde_json::from_str(&offline).unwrap_or(Value::Null);
    let n: f64 = off["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(n > 0.0, "no suspends scraped: {offline}\n{why}");
    // The page passes promtool's checks.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        page.contains("gpreempt_decision_latency_seconds_bucket"),
        "{page}"
    );
    assert!(run_err.contains("nothing is left suspended"), "{run_err}");
    assert!(!Path::new(&format!("{cg2}/kubepods.slice")).exists());
    assert_nothing_left();
}

/// The stub `systemctl` in the scratch root: records every call and models one unit's state
/// (/stub/active while it runs; starts and restarts are logged in /stub/events).
const STUB_SYSTEMCTL: &str = r#"#!/bin/sh
echo "systemctl $*" >> /stub/calls
verb=""; for a in "$@"; do case "$a" in -*) ;; *) [ -z "$verb" ] && verb=$a ;; esac; done
case "$verb" in
is-active) [ -e /stub/active ] ;;
start) touch /stub/active; echo start >> /stub/events ;;
stop) rm -f /stub/active; echo stop >> /stub/events ;;
restart) touch /stub/active; echo restart >> /stub/events ;;
try-restart) if [ -e /stub/active ]; then echo restart >> /stub/events; fi ;;
reload) if [ -e /stub/active ]; then echo reload >> /stub/events; else exit 1; fi ;;
daemon-reload) ;;
*) echo "stub systemctl: unexpected $*" >&2; exit 1 ;;
esac
"#;

/// The stub `deb-systemd-invoke`: recorded, then what the real one does (systemctl).
const STUB_INVOKE: &str =
    "#!/bin/sh\necho \"deb-systemd-invoke $*\" >> /stub/calls\nexec systemctl \"$@\"\n";

/// After a step of the life cycle in the scratch root: what was called, the unit's state and
/// starts/stops, which of the package's paths exist, and dpkg's status line and version.
struct Step {
    calls: Vec<String>,
    active: bool,
    events: Vec<String>,
    files: Vec<String>,
    status: String,
}

/// The maintainer scripts as dpkg runs them, without touching the host's dpkg database or
/// files: `dpkg --root` over an overlay of `/` (writes go to a tmpfs, in a private mount
/// namespace; dpkg chroots into it for the scripts), with `systemctl` and `deb-systemd-invoke`
/// stubbed there, and `/run/systemd/system` present as on a host booted with systemd (last, absent:
/// nothing is called). Install starts nothing; an upgrade restarts a running unit and leaves a
/// stopped one stopped (never stopping it in between); logrotate's postrotate reloads it; remove
/// stops it and keeps the configuration and logs; purge removes them all. `dpkg-deb` shows the
/// control fields, conffiles, scripts, copyright and logrotate files.
#[test]
fn the_package_life_cycle_restarts_stops_and_purges_as_debian_expects() {
    let _one = serial();
    require_root();
    let deb = deb();
    let info = |args: &[&str]| -> String {
        let out = sh(Command::new("dpkg-deb").args(args).arg(&deb));
        assert!(out.status.success(), "dpkg-deb {args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let version = info(&["-f"])
        .lines()
        .find_map(|l| l.strip_prefix("Version: ").map(str::to_owned))
        .expect("Version");
    let fields = info(&["-I"]);
    for want in [
        "Package: gpreempt-ebpf",
        "Maintainer: gpreempt-ebpf developers <gpreempt-ebpf@users.noreply.github.com>",
        "Section: admin",
    ] {
        assert!(
            fields.contains(want),
            "no {want:?} in dpkg-deb -I:\n{fields}"
        );
    }
    for script in ["postinst", "prerm", "postrm"] {
        assert!(
            fields
                .lines()
                .any(|l| l.contains(script) && l.contains("#!/bin/sh")),
            "no {script} in dpkg-deb -I:\n{fields}"
        );
    }
    let conffiles = sh(Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(
        String::from_utf8_lossy(&conffiles.stdout),
        "/etc/logrotate.d/gpreempt-ebpf\n/etc/default/gpreempt-ebpf\n"
    );
    let contents = info(&["-c"]);
    for f in [
        "./usr/share/doc/gpreempt-ebpf/copyright",
        "./etc/logrotate.d/gpreempt-ebpf",
        "./etc/default/gpreempt-ebpf",
    ] {
        assert!(
            contents
                .lines()
                .any(|l| l.starts_with("-rw-r--r-- root/root") && l.ends_with(f)),
            "{f} (0644 root) not in dpkg-deb -c:\n{contents}"
        );
    }
    // Every third-party crate the copyright file lists has the licence files it ships under
    // third-party/NAME-VERSION/.
    let out = sh(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -xO ./usr/share/doc/gpreempt-ebpf/copyright",
        deb.display()
    )));
    let copyright = String::from_utf8_lossy(&out.stdout).into_owned();
    let listed: Vec<String> = copyright
        .lines()
        .filter_map(|l| {
            let (p, _) = l.strip_prefix(' ')?.split_once(": ")?;
            let (name, v) = p.split_once(" v")?;
            (!name.contains(' ') && !v.contains(' ')).then(|| format!("{name}-{v}"))
        })
        .collect();
    assert!(listed.len() > 50, "{copyright}");
    for c in &listed {
        let prefix = format!("./usr/share/doc/gpreempt-ebpf/third-party/{c}/");
        assert!(
            contents
                .lines()
                .any(|l| l.starts_with("-rw-r--r-- root/root") && l.contains(&prefix)),
            "no licence file of {c} in the package"
        );
    }

    let t = TempDir::new("lifecycle");
    std::fs::write(t.path("systemctl"), STUB_SYSTEMCTL).unwrap();
    std::fs::write(t.path("deb-systemd-invoke"), STUB_INVOKE).unwrap();
    // Two packages of higher versions, the same contents (uncompressed: quicker to make).
    for (n, v) in [(2, "+upgrade1"), (3, "+upgrade2")] {
        let x = t.path(&format!("x{n}"));
        let out = sh(Command::new("dpkg-deb").arg("-R").arg(&deb).arg(&x));
        assert!(out.status.success());
        let control = x.join("DEBIAN/control");
        let text = std::fs::read_to_string(&control).unwrap();
        std::fs::write(
            &control,
            text.replace(
                &format!("Version: {version}\n"),
                &format!("Version: {version}{v}\n"),
            ),
        )
        .unwrap();
        let out = sh(Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Znone", "-b"])
            .arg(&x)
            .arg(t.path(&format!("v{n}.deb"))));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let d = t.0.display();
    let deb1 = deb.display();
    let script = format!(
        r#"set -eu
mkdir -p {d}/ovl {d}/out
mount -t tmpfs -o mode=0755 lifecycle {d}/ovl
mkdir {d}/ovl/upper {d}/ovl/work {d}/ovl/root
R={d}/ovl/root
mount -t overlay overlay -o lowerdir=/,upperdir={d}/ovl/upper,workdir={d}/ovl/work $R
mount --rbind /dev $R/dev
mount -t proc proc $R/proc
mkdir -p $R/stub $R/run/systemd/system
install -m 0755 {d}/systemctl $R/usr/bin/systemctl
install -m 0755 {d}/deb-systemd-invoke $R/usr/bin/deb-systemd-invoke
dpkg --root=$R --purge gpreempt-ebpf > /dev/null 2>&1 || true
step() {{
  name=$1; shift
  : > $R/stub/calls; : > $R/stub/events
  if ! "$@" > {d}/out/$name.log 2>&1; then echo "FAILED: $*" >> {d}/out/$name.log; fi
  cp $R/stub/calls {d}/out/$name.calls; cp $R/stub/events {d}/out/$name.events
  if [ -e $R/stub/active ]; then echo active; else echo inactive; fi > {d}/out/$name.state
  for f in usr/bin/gpreempt-ebpf usr/share/doc/gpreempt-ebpf/copyright etc/logrotate.d/gpreempt-ebpf \
      etc/default/gpreempt-ebpf etc/gpreempt-ebpf/policy.toml var/log/gpreempt-ebpf \
      etc/systemd/system/multi-user.target.wants/gpreempt-ebpf.service; do
    if [ -e $R/$f ] || [ -L $R/$f ]; then echo /$f; fi
  done > {d}/out/$name.files
  dpkg --root=$R -s gpreempt-ebpf 2>/dev/null | sed -n 's/^Status: //p;s/^Version: //p' > {d}/out/$name.status || true
}}
# --no-triggers: man-db re-indexing the scratch root is not under test, and was most of the time.
step install dpkg --root=$R --no-triggers -i {deb1}
step upgrade-stopped dpkg --root=$R --no-triggers -i {d}/v2.deb
touch $R/stub/active
step upgrade-running dpkg --root=$R --no-triggers -i {d}/v3.deb
# What an operator and the controller leave: a policy, audit logs, the unit enabled.
mkdir -p $R/etc/gpreempt-ebpf $R/var/log/gpreempt-ebpf $R/etc/systemd/system/multi-user.target.wants
echo '[policy]' > $R/etc/gpreempt-ebpf/policy.toml
echo '{{"action":"adapt"}}' > $R/var/log/gpreempt-ebpf/audit.jsonl
echo '{{"action":"adapt"}}' > $R/var/log/gpreempt-ebpf/audit.jsonl.1
chmod 0750 $R/var/log/gpreempt-ebpf
ln -sf /lib/systemd/system/gpreempt-ebpf.service $R/etc/systemd/system/multi-user.target.wants/gpreempt-ebpf.service
step logrotate chroot $R logrotate -v -f -s /stub/logrotate.state /etc/logrotate.d/gpreempt-ebpf
ls $R/var/log/gpreempt-ebpf > {d}/out/logrotate.ls
step remove dpkg --root=$R --no-triggers -r gpreempt-ebpf
step purge dpkg --root=$R --no-triggers -P gpreempt-ebpf
rmdir $R/run/systemd/system
step install-nosystemd dpkg --root=$R --no-triggers -i {deb1}
step purge-nosystemd dpkg --root=$R --no-triggers -P gpreempt-ebpf
"#
    );
    let out = sh(Command::new("unshare").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |name: &str, ext: &str| -> Vec<String> {
        std::fs::read_to_string(t.path(&format!("out/{name}.{ext}")))
            .unwrap_or_else(|e| panic!("{name}.{ext}: {e}"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let step = |name: &str| -> Step {
        let log = read(name, "log").join("\n");
        assert!(!log.contains("FAILED"), "{name}:\n{log}");
        Step {
            calls: read(name, "calls"),
            active: read(name, "state") == ["active"],
            events: read(name, "events"),
            files: read(name, "files"),
            status: read(name, "status").join(" "),
        }
    };
    const UNIT_NAME: &str = "gpreempt-ebpf.service";
    let reload = "systemctl --system daemon-reload".to_string();
    let try_restart = [
        format!("deb-systemd-invoke try-restart {UNIT_NAME}"),
        format!("systemctl try-restart {UNIT_NAME}"),
    ];
    let everything = |s: &Step| {
        [
            "/usr/bin/gpreempt-ebpf",
            "/usr/share/doc/gpreempt-ebpf/copyright",
            "/etc/logrotate.d/gpreempt-ebpf",
            "/etc/default/gpreempt-ebpf",
        ]
        .iter()
        .all(|f| s.files.iter().any(|x| x == f))
    };

    // First install: systemd learns of the unit, nothing is started (no policy yet).
    let s = step("install");
    assert_eq!(s.calls, std::slice::from_ref(&reload));
    assert!(!s.active && s.events.is_empty());
    assert!(everything(&s), "{:?}", s.files);
    assert_eq!(s.status, format!("install ok installed {version}"));
    // Upgrade of a stopped unit: asked to restart only if running, so it stays stopped.
    let s = step("upgrade-stopped");
    let mut want = vec![reload.clone()];
    want.extend(try_restart.iter().cloned());
    assert_eq!(s.calls, want);
    assert!(!s.active && s.events.is_empty(), "{:?}", s.events);
    assert_eq!(s.status, format!("install ok installed {version}+upgrade1"));
    // Upgrade of a running unit: restarted on the new binary, never stopped by the old prerm.
    let s = step("upgrade-running");
    assert_eq!(s.calls, want);
    assert!(s.active);
    assert_eq!(s.events, ["restart"]);
    // logrotate: the shipped file parses, rotates to a dated name (never FILE.1, the
    // controller's), creates nothing (the controller does, reopening), and reloads the unit.
    let s = step("logrotate");
    let log = read("logrotate", "log").join("\n");
    assert!(!log.to_lowercase().contains("error"), "{log}");
    assert_eq!(
        s.calls,
        [
            "systemctl -q is-active gpreempt-ebpf.service".to_string(),
            format!("systemctl reload {UNIT_NAME}")
        ],
        "{log}"
    );
    assert_eq!(s.events, ["reload"]);
    let ls = read("logrotate", "ls");
    assert_eq!(ls.len(), 2, "{ls:?}");
    assert!(ls.contains(&"audit.jsonl.1".to_string()), "{ls:?}");
    let dated = ls
        .iter()
        .find(|f| f.starts_with("audit.jsonl-"))
        .unwrap_or_else(|| panic!("{ls:?}"));
    let stamp = dated.trim_start_matches("audit.jsonl-");
    assert!(
        stamp.len() > 10 && stamp.chars().all(|c| c.is_ascii_digit() || c == '-'),
        "{dated}"
    );
    // Remove: stopped before the binary goes; the configuration and logs stay.
    let s = step("remove");
    assert_eq!(
        s.calls,
        [
            format!("deb-systemd-invoke stop {UNIT_NAME}"),
            format!("systemctl stop {UNIT_NAME}"),
            reload.clone()
        ]
    );
    assert!(!s.active);
    assert_eq!(s.events, ["stop"]);
    assert_eq!(
        s.files,
        [
            "/etc/logrotate.d/gpreempt-ebpf",
            "/etc/default/gpreempt-ebpf",
            "/etc/gpreempt-ebpf/policy.toml",
            "/var/log/gpreempt-ebpf",
            "/etc/systemd/system/multi-user.target.wants/gpreempt-ebpf.service",
        ]
    );
    assert_eq!(
        s.status,
        format!("deinstall ok config-files {version}+upgrade2")
    );
    // Purge: nothing of it is left.
    let s = step("purge");
    assert_eq!(s.calls, std::slice::from_ref(&reload));
    assert!(s.files.is_empty(), "{:?}", s.files);
    assert_eq!(s.status, "");
    // Without a running systemd (a chroot, an image build): no systemctl at all.
    let s = step("install-nosystemd");
    assert!(s.calls.is_empty(), "{:?}", s.calls);
    assert!(everything(&s));
    let s = step("purge-nosystemd");
    assert!(
        s.calls.is_empty() && s.files.is_empty(),
        "{:?} {:?}",
        s.calls,
        s.files
    );
}
