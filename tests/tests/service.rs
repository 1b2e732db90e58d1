//! The controller as a service (root): the .deb `cargo xtask package` built (`cargo xtask test`
//! builds it first) is installed with dpkg, the installed binary runs `doctor` and has no
//! emulator (`sim` says so), systemd accepts the unit, and `run` started exactly as the unit's
//! ExecStart says serves metrics that a real Prometheus (Debian's) scrapes inside the test
//! build's `sim`, with one workload in a fake Kubernetes pod; the package is removed again. Nothing here is skipped: a missing package or tool fails loudly.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{assert_nothing_left, bin, require_root, serial, TempDir};

const UID: &str = "1a2b3c4d-5e6f-4a8b-9c0d-112233445566";
const CID: &str = "4f1c8a2b9d3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a";
const UNIT: &str = "/lib/systemd/system/gpreempt-ebpf.service";

fn deb() -> PathBuf {
    let dir = bin("gpreempt-ebpf").parent().unwrap().join("../debian");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: build it with `cargo xtask package`",
                dir.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}: `cargo xtask package`", dir.display()))
}

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
    shipped.push(repo.join("README.md"));
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
        UNIT,
    ] {
        assert!(Path::new(f).exists(), "{f} not installed");
    }
    assert_docs_installed();
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
