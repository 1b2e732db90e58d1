//! The deployment recipes in packaging/: the Kubernetes manifests (packaging/k8s/*.yaml) pass
//! kubernetes-validate against the schemas it bundles (no cluster, no network) and give the
//! controller what it needs on each vendor's nodes; the image (packaging/Containerfile) builds
//! with buildah, without a daemon, from the .deb `cargo xtask test` built, on a Debian base made
//! by mmdebstrap, and its binary runs `doctor --json` inside. `cargo xtask test` installs the
//! validator and makes the base (xtask/src/deploy.rs); without them these tests fail, never skip.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use clap::Parser as _;
use gpreempt_user::cli::Cli;
use gpreempt_user::cmd::policy::{check_text, host_group};
use gpreempt_user::policy::LintKind;
use serde_json::Value;
use tests::{bin, require_root, TempDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn validator() -> PathBuf {
    let dir = repo().join(".tools/k8s-validate");
    assert!(
        dir.join("kubernetes_validate").is_dir(),
        "{} missing: `cargo xtask test` installs it (xtask/src/deploy.rs)",
        dir.display()
    );
    dir
}

/// Debian's python3 with the validator's packages (PyYAML among them) on its path.
fn python(args: &[&str]) -> Output {
    Command::new("/usr/bin/python3")
        .args(args)
        .env("PYTHONPATH", validator())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running /usr/bin/python3")
}

/// The oldest and newest Kubernetes versions whose schemas kubernetes-validate 1.37 bundles.
const VERSIONS: [&str; 2] = ["1.25.0", "1.37.0"];

fn validate(file: &Path, version: &str) -> Output {
    python(&[
        "-m",
        "kubernetes_validate",
        "--strict",
        "-k",
        version,
        &file.to_string_lossy(),
    ])
}

fn manifests() -> BTreeMap<String, PathBuf> {
    std::fs::read_dir(repo().join("packaging/k8s"))
        .expect("packaging/k8s")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect()
}

/// A manifest's documents as JSON (PyYAML's safe loader).
fn documents(file: &Path) -> Vec<Value> {
    let out = python(&[
        "-c",
        "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        &file.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from the YAML loader")
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let files = manifests();
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        ["amd.yaml", "nvidia.yaml"],
        "packaging/k8s: one manifest per vendor"
    );
    for (name, path) in &files {
        for v in VERSIONS {
            let out = validate(path, v);
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} against {v}: {text}");
            // One "passed" line per document: nothing was skipped as unknown.
            let passed = text.lines().filter(|l| l.contains(" passed for ")).count();
            assert_eq!(passed, documents(path).len(), "{name} against {v}: {text}");
        }
    }
    // The validator is strict and really reads the file: a misspelt field and a wrong type fail.
    let t = TempDir::new("k8s-validate");
    let amd = std::fs::read_to_string(&files["amd.yaml"]).unwrap();
    for (what, from, to) in [
        ("a misspelt field", "hostPID: true", "hostPid: true"),
        (
            "a wrong type",
            "containerPort: 9464",
            "containerPort: \"x\"",
        ),
    ] {
        assert!(amd.contains(from), "{from}");
        let bad = t.path("bad.yaml");
        std::fs::write(&bad, amd.replacen(from, to, 1)).unwrap();
        let out = validate(&bad, VERSIONS[1]);
        assert!(
            !out.status.success(),
            "{what} passed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// (host path, type, mount path, read-only) of every hostPath volume the container mounts.
fn host_mounts(pod: &Value, c: &Value) -> Vec<(String, String, String, bool)> {
    let volumes = pod["volumes"].as_array().expect("volumes");
    c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .filter_map(|m| {
            let v = volumes.iter().find(|v| v["name"] == m["name"])?;
            let h = v.get("hostPath")?;
            Some((
                h["path"].as_str()?.to_string(),
                h["type"].as_str().unwrap_or("").to_string(),
                m["mountPath"].as_str()?.to_string(),
                m["readOnly"].as_bool().unwrap_or(false),
            ))
        })
        .collect()
}

#[test]
fn the_manifests_give_the_controller_what_it_needs_per_vendor() {
    for (name, path) in manifests() {
        let docs = documents(&path);
        let of =
            |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
        let (ns, cms, dss) = (of("Namespace"), of("ConfigMap"), of("DaemonSet"));
        assert!(ns.len() == 1 && cms.len() == 1 && dss.len() == 1, "{name}");
        let namespace = ns[0]["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            ns[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
            "{name}: Pod Security Admission would refuse the privileged pod"
        );
        let (cm, ds) = (cms[0], dss[0]);
        for d in [cm, ds] {
            assert_eq!(d["metadata"]["namespace"], namespace, "{name}");
        }
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostPID"], true, "{name}: host pids");
        assert_eq!(pod["containers"].as_array().unwrap().len(), 1, "{name}");
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["privileged"], true, "{name}");

        // The command: the image's binary, in the host's cgroup namespace, with arguments
        // that `run` accepts.
        let command: Vec<&str> = c["command"]
            .as_array()
            .expect("command")
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(
            command,
            [
                "nsenter",
                "--cgroup=/proc/1/ns/cgroup",
                "--",
                "/usr/bin/gpreempt-ebpf"
            ],
            "{name}"
        );
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        let parsed = Cli::try_parse_from(std::iter::once("gpreempt-ebpf").chain(args.clone()));
        assert!(
            matches!(
                parsed.as_ref().map(|c| &c.command),
                Ok(gpreempt_user::cli::Command::Run(_))
            ),
            "{name}: {args:?}: {:?}",
            parsed.err()
        );
        let arg = |flag: &str| -> &str {
            args.iter()
                .skip_while(|a| **a != flag)
                .nth(1)
                .unwrap_or_else(|| panic!("{name}: no {flag}"))
        };

        // The policy: the ConfigMap's, mounted where --policy reads it, and as the docs teach:
        // no errors, no rule a process can claim by renaming itself.
        let policy_path = Path::new(arg("--policy"));
        let policy_vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["configMap"]["name"] == cm["metadata"]["name"])
            .unwrap_or_else(|| panic!("{name}: the ConfigMap is no volume"));
        let mounted = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == policy_vol["name"])
            .unwrap_or_else(|| panic!("{name}: the policy volume is not mounted"));
        assert_eq!(
            Path::new(mounted["mountPath"].as_str().unwrap()),
            policy_path.parent().unwrap(),
            "{name}"
        );
        let key = policy_path.file_name().unwrap().to_str().unwrap();
        let text = cm["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: the ConfigMap has no {key}"));
        let source = format!("{name}:{key}");
        let report = check_text(text, &source, &host_group);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let policy = report.policy.expect("a policy");
        let spoofable: Vec<String> = policy
            .lints()
            .iter()
            .filter(|l| matches!(l.kind, LintKind::Spoofable | LintKind::NeverActs))
            .map(|l| l.located(&source))
            .collect();
        assert!(spoofable.is_empty(), "{spoofable:?}");
        assert!(
            text.contains("k8s_namespace"),
            "{name}: the example rules match pods"
        );

        // Production-shaped: node-critical like the device plugins, ready after the
        // self-test, alive while the loop turns (the paths the metrics server answers), and a
        // Service for the metrics.
        assert_eq!(pod["priorityClassName"], "system-node-critical", "{name}");
        // A ConfigMap change reloads the policy (no kubectl exec).
        assert!(
            matches!(parsed.as_ref().map(|c| &c.command), Ok(gpreempt_user::cli::Command::Run(r)) if r.reload_on_change),
            "{name}: run without --reload-on-change"
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        let labels = &ds["spec"]["template"]["metadata"]["labels"];
        assert!(
            of("Service").iter().any(|svc| {
                let sel = svc["spec"]["selector"].as_object();
                sel.is_some_and(|m| m.iter().all(|(k, v)| &labels[k] == v))
                    && svc["spec"]["ports"][0]["targetPort"] == "metrics"
            }),
            "{name}: no Service selects the pods' metrics port"
        );

        // Metrics: on the port the pod declares and Prometheus is told to scrape.
        let port = arg("--metrics")
            .rsplit_once(':')
            .map(|(_, p)| p.parse::<u64>().unwrap())
            .unwrap();
        assert_eq!(c["ports"][0]["containerPort"], port, "{name}");
        assert_eq!(
            ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
            port.to_string(),
            "{name}"
        );

        // Host paths, each at the path the tool reads by default.
        let mounts = host_mounts(pod, c);
        for (host, _, inside, _) in &mounts {
            assert_eq!(host, inside, "{name}: the tool reads the host's paths");
        }
        let has = |p: &str, ty: &str, ro: bool| {
            mounts
                .iter()
                .any(|(h, t, _, r)| h == p && t == ty && *r == ro)
        };
        let rundir = gpreempt_user::rundir::run_dir();
        assert_eq!(
            rundir,
            Path::new("/run/gpreempt-ebpf"),
            "GPREEMPT_RUN_DIR is set"
        );
        for (p, ty, ro) in [
            ("/run/gpreempt-ebpf", "DirectoryOrCreate", false),
            ("/sys/kernel/btf", "Directory", true),
            ("/sys/kernel/tracing", "Directory", false),
            ("/var/log/pods", "Directory", true),
            ("/var/log/containers", "Directory", true),
        ] {
            assert!(
                has(p, ty, ro),
                "{name}: {p} ({ty}, read-only {ro}): {mounts:?}"
            );
        }
        let audit = Path::new(arg("--audit"));
        // No logrotate in a pod: the controller's own cap keeps the node's disk bounded.
        let cap = match parsed.as_ref().map(|c| &c.command) {
            Ok(gpreempt_user::cli::Command::Run(r)) => r.audit_max_size,
            _ => None,
        };
        assert!(
            cap.is_some_and(|c| c <= 1 << 30),
            "{name}: --audit-max-size {cap:?}"
        );
        assert!(
            mounts
                .iter()
                .any(|(h, _, _, ro)| Path::new(h) == audit.parent().unwrap() && !ro),
            "{name}: the audit file is on the host"
        );
        let selector = pod["nodeSelector"].as_object().expect("nodeSelector");
        let env = |k: &str| {
            c["env"]
                .as_array()
                .and_then(|e| e.iter().find(|x| x["name"] == k))
                .and_then(|x| x["value"].as_str())
                .map(str::to_owned)
        };
        match name.as_str() {
            "amd.yaml" => {
                assert_eq!(
                    selector["feature.node.kubernetes.io/pci-1002.present"], "true",
                    "{name}"
                );
                assert!(has("/dev/kfd", "CharDevice", false), "{mounts:?}");
                assert!(has("/dev/dri", "Directory", false), "{mounts:?}");
                assert!(has("/sys/kernel/debug", "Directory", false), "{mounts:?}");
                assert!(pod.get("runtimeClassName").is_none(), "{name}");
            }
            "nvidia.yaml" => {
                assert_eq!(
                    selector["feature.node.kubernetes.io/pci-10de.present"], "true",
                    "{name}"
                );
                // The self-test's CUDA context: libcuda and the device nodes from the toolkit.
                assert_eq!(pod["runtimeClassName"], "nvidia", "{name}");
                assert_eq!(env("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("all"));
                assert!(env("NVIDIA_DRIVER_CAPABILITIES")
                    .is_some_and(|c| c.split(',').any(|x| x == "compute" || x == "all")));
                assert!(!mounts.iter().any(|m| m.0 == "/dev/kfd"), "{name}");
                assert!(text.contains("[nvidia]"), "{name}: the lever written out");
            }
            other => panic!("{other}: which vendor?"),
        }
    }
}

/// buildah with its own storage under `dir` (vfs: no overlay inside a container), chroot
/// isolation (no daemon, no runtime namespaces needed).
fn buildah(dir: &Path, args: &[&str]) -> Output {
    let shown = format!("buildah {}", args.join(" "));
    Command::new("buildah")
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--runroot")
        .arg(dir.join("runroot"))
        .args(["--storage-driver", "vfs"])
        .args(args)
        .env("BUILDAH_ISOLATION", "chroot")
        .env("TMPDIR", dir.join("tmp"))
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{shown}: {e}"))
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes what buildah made (its storage holds read-only layers).
struct Storage(PathBuf);
impl Drop for Storage {
    fn drop(&mut self) {
        let _ = buildah(&self.0, &["rm", "--all"]);
        let _ = buildah(&self.0, &["rmi", "--all", "--force"]);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_image_builds_from_the_package_and_runs_doctor() {
    require_root();
    let base = repo().join(".tools/image-base/debian-bookworm.tar");
    assert!(
        base.is_file(),
        "{} missing: `cargo xtask test` makes it (xtask/src/deploy.rs)",
        base.display()
    );
    let debs = bin("gpreempt-ebpf").parent().unwrap().join("../debian");
    let deb = std::fs::read_dir(&debs)
        .unwrap_or_else(|e| panic!("{}: {e}: `cargo xtask package`", debs.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}", debs.display()));
    // On disk, not in /tmp (a tmpfs in CI): the vfs driver copies every layer.
    let dir = repo().join("target/image-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let s = Storage(dir.clone());

    let c = ok("from scratch", buildah(&s.0, &["from", "scratch"]));
    ok(
        "add the base",
        buildah(&s.0, &["add", &c, &base.to_string_lossy(), "/"]),
    );
    ok(
        "commit the base",
        buildah(&s.0, &["commit", "--quiet", &c, "localhost/gpreempt-base"]),
    );
    ok("rm", buildah(&s.0, &["rm", &c]));
    ok(
        "build packaging/Containerfile",
        buildah(
            &s.0,
            &[
                "build",
                "--quiet",
                "--pull=never",
                "--build-arg",
                "BASE=localhost/gpreempt-base",
                "-f",
                "packaging/Containerfile",
                "-t",
                "localhost/gpreempt-ebpf-test",
                &debs.to_string_lossy(),
            ],
        ),
    );
    let inspect: Value = serde_json::from_str(&ok(
        "inspect",
        buildah(
            &s.0,
            &["inspect", "--type", "image", "localhost/gpreempt-ebpf-test"],
        ),
    ))
    .expect("inspect JSON");
    assert_eq!(
        inspect["OCIv1"]["config"]["Entrypoint"],
        serde_json::json!(["/usr/bin/gpreempt-ebpf"]),
        "{}",
        inspect["OCIv1"]["config"]
    );
    let c = ok(
        "from the image",
        buildah(&s.0, &["from", "localhost/gpreempt-ebpf-test"]),
    );
    let run = |args: &[&str]| {
        let mut a = vec!["run", c.as_str(), "--"];
        a.extend_from_slice(args);
        buildah(&s.0, &a)
    };
    // The package's version, installed by dpkg in the image.
    let version = ok("--version", run(&["gpreempt-ebpf", "--version"]));
    let deb_version = deb
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split('_')
        .nth(1)
        .unwrap()
        .to_string();
    assert_eq!(version, format!("gpreempt-ebpf {deb_version}"));
    // doctor: a JSON report (exit 1 here: no GPU and, in a buildah container, no BPF).
    let out = run(&["gpreempt-ebpf", "doctor", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json in the image: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = doc["checks"].as_array().expect("checks");
    assert!(checks.len() > 10, "{doc}");
    assert_eq!(checks[0]["name"], "privileges", "{doc}");
    for name in ["btf", "kfd", "controller"] {
        assert!(checks.iter().any(|c| c["name"] == name), "{name}: {doc}");
    }
    // The packaged binary: no emulator.
    let out = run(&["gpreempt-ebpf", "sim", "--", "true"]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("has no emulator"),
        "{:?}: {said}",
        out.status
    );
    // The DaemonSets start the controller through nsenter (util-linux).
    ok("nsenter", run(&["nsenter", "--version"]));
}
