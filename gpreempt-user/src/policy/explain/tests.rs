use super::*;

const UID: &str = "1a2b3c4d-5e6f-7a8b-9c0d-112233445566";

fn info() -> ProcInfo {
    ProcInfo {
        comm: "python3".into(),
        cmdline: "python3 train.py --epochs 3".into(),
        uid: Some(1000),
        gid: Some(100),
        groups: vec![4, 27],
        cgroup: "/user.slice/user-1000.slice/session-3.scope".into(),
        start_time: 500,
        ..Default::default()
    }
}

fn pod_info(cgroup: &str) -> ProcInfo {
    ProcInfo {
        cgroup: cgroup.into(),
        container: Some("4f1c8a2b9d3e".into()),
        pod: Some(k8s::Pod {
            uid: UID.into(),
            namespace: Some("ml".into()),
            name: Some("trainer-0".into()),
            container: Some("worker".into()),
        }),
        ..info()
    }
}

/// The one check of a one-matcher rule `body` against `info`.
fn one(body: &str, info: &ProcInfo) -> Check {
    let p = Policy::parse(&format!("[[rule]]\nclass = \"online\"\n{body}\n"), "p.toml").unwrap();
    let c = p.rules[0].checks(info, 4242);
    assert_eq!(c.len(), 1, "{c:#?}");
    // What is explained is what classifies.
    assert_eq!(p.rules[0].matches(info, 4242), c[0].ok);
    c[0].clone()
}

#[test]
fn each_matcher_says_the_process_value_when_it_fails_and_passes() {
    let i = info();
    let bes = format!("/kubepods/besteffort/pod{UID}/4f1c8a2b9d3e");
    let p = pod_info(&bes);
    for (body, info, ok, text) in [
        (
            "comm = \"resnet*\"",
            &i,
            false,
            r#"comm "python3" does not match "resnet*""#,
        ),
        (
            "comm = \"py*\"",
            &i,
            true,
            r#"comm "python3" matches "py*""#,
        ),
        ("uid = 0", &i, false, "uid 1000 is not 0"),
        ("uid = 1000", &i, true, "uid 1000 is 1000"),
        (
            "gid = 990",
            &i,
            false,
            "gid 100 and groups [4, 27] do not include 990",
        ),
        (
            "gid = 27",
            &i,
            true,
            "gid 100 and groups [4, 27] include 27",
        ),
        ("pid = 17", &i, false, "pid 4242 is not 17"),
        ("pid = 4242", &i, true, "pid 4242 is 4242"),
        (
            "cgroup = \"/batch.slice/*\"",
            &i,
            false,
            r#"cgroup "/user.slice/user-1000.slice/session-3.scope" does not match "/batch.slice/*""#,
        ),
        (
            "cgroup = \"/user.slice/*\"",
            &i,
            true,
            r#"cgroup "/user.slice/user-1000.slice/session-3.scope" matches "/user.slice/*""#,
        ),
        (
            "cmdline = 'serve'",
            &i,
            false,
            r#"cmdline "python3 train.py --epochs 3" does not match /serve/"#,
        ),
        (
            "cmdline = 'train\\.py'",
            &i,
            true,
            r#"cmdline "python3 train.py --epochs 3" matches /train\.py/"#,
        ),
        (
            "container = \"abc*\"",
            &i,
            false,
            r#"container: none (the rule wants "abc*")"#,
        ),
        (
            "container = \"4f1c*\"",
            &p,
            true,
            r#"container "4f1c8a2b9d3e" matches "4f1c*""#,
        ),
        (
            "k8s_namespace = \"prod\"",
            &p,
            false,
            r#"k8s_namespace "ml" does not match "prod""#,
        ),
        (
            "k8s_namespace = \"prod\"",
            &i,
            false,
            r#"k8s_namespace: none (the rule wants "prod")"#,
        ),
        (
            "pod = \"trainer-*\"",
            &p,
            true,
            r#"pod "trainer-0" matches "trainer-*""#,
        ),
        (
            "qos = \"Guaranteed\"",
            &p,
            false,
            "qos BestEffort is not Guaranteed",
        ),
        (
            "qos = \"BestEffort\"",
            &p,
            true,
            "qos BestEffort is BestEffort",
        ),
        (
            "qos = \"BestEffort\"",
            &i,
            false,
            "qos: not in a Kubernetes pod (the rule wants BestEffort)",
        ),
    ] {
        let c = one(body, info);
        assert_eq!((c.ok, c.text.as_str()), (ok, text), "{body}");
    }
}

#[test]
fn an_unreadable_uid_is_said_as_such() {
    let i = ProcInfo {
        uid: None,
        ..info()
    };
    let c = one("uid = 0", &i);
    assert_eq!(
        c.text,
        "uid unknown (/proc/4242/status unreadable) is not 0"
    );
}

const POLICY: &str = "[policy]\ndefault = \"ignore\"\n\n\
                      [[rule]]\nclass = \"online\"\ncomm = \"resnet*\"\nuid = 0\n\n\
                      [[rule]]\nclass = \"offline\"\nuid = 1000\ncomm = \"py*\"\n\n\
                      [[rule]]\nclass = \"online\"\nuid = 1000\n";

#[test]
fn the_first_matching_rule_is_named_with_its_line_and_earlier_ones_say_why_not() {
    let p = Policy::parse(POLICY, "p.toml").unwrap();
    let e = p.explain(&info(), 4242);
    assert_eq!(p.classify(&info(), 4242), (Class::Offline, Some(1)));
    assert_eq!(
        (e.class, e.rule, e.rule_line.as_deref()),
        (Class::Offline, Some(2), Some("p.toml:9"))
    );
    // Rule 3 also matches, but the first match decides: it is not tried.
    assert_eq!(e.rules.len(), 2);
    assert_eq!(
        e.text(),
        "pid 4242 (python3): offline, by rule 2 (p.toml:9) [policy p.toml]\n  \
         rule 1 (p.toml:4, online): did not match: uid 1000 is not 0; comm \"python3\" does \
         not match \"resnet*\"\n  \
         rule 2 (p.toml:9, offline): matched: uid 1000 is 1000; comm \"python3\" matches \
         \"py*\"\n"
    );
}

#[test]
fn no_match_is_the_default_with_every_rule_tried() {
    let p = Policy::parse(POLICY, "p.toml").unwrap();
    let i = ProcInfo {
        uid: Some(7),
        ..info()
    };
    let e = p.explain(&i, 4242);
    assert_eq!(
        (e.class, e.rule, e.rule_line.as_deref()),
        (Class::Ignore, None, None)
    );
    assert_eq!(e.rules.len(), 3);
    assert!(e.rules.iter().all(|t| !t.matched));
    assert!(
        e.text()
            .starts_with("pid 4242 (python3): ignore, the default (no rule matched)"),
        "{}",
        e.text()
    );
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["rule"], serde_json::Value::Null);
    assert_eq!(json["rules"][2]["checks"][0]["matcher"], "uid");
    assert_eq!(json["rules"][2]["checks"][0]["text"], "uid 7 is not 1000");
    // No rules at all.
    let e = Policy::parse("", "e.toml").unwrap().explain(&i, 1);
    assert!(
        e.text().ends_with("  (the policy has no rules)\n"),
        "{}",
        e.text()
    );
}

#[test]
fn qos_rules_class_pods_by_either_cgroup_driver() {
    let p = Policy::parse(
        "[policy]\ndefault = \"ignore\"\n\n\
         [[rule]]\nclass = \"offline\"\nqos = \"BestEffort\"\n\n\
         [[rule]]\nclass = \"online\"\nqos = \"Guaranteed\"\n",
        "k.toml",
    )
    .unwrap();
    let u = UID.replace('-', "_");
    let id = "4f1c8a2b9d3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a";
    for (cg, want) in [
        (
            format!("/kubepods/besteffort/pod{UID}/{id}"),
            Class::Offline,
        ),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/\
                 cri-containerd-{id}.scope"
            ),
            Class::Offline,
        ),
        (format!("/kubepods/pod{UID}/{id}"), Class::Online),
        (
            format!("/kubepods.slice/kubepods-pod{u}.slice/crio-{id}.scope"),
            Class::Online,
        ),
        (format!("/kubepods/burstable/pod{UID}/{id}"), Class::Ignore),
        // A user's delegated cgroup named like a pod is no pod.
        (
            format!("/user.slice/user-1000.slice/kubepods-besteffort-pod{u}.slice"),
            Class::Ignore,
        ),
    ] {
        assert_eq!(p.classify(&pod_info(&cg), 1).0, want, "{cg}");
        assert_eq!(p.explain(&pod_info(&cg), 1).class, want, "{cg}");
    }
    // kubelet sets it, not the process: no spoofing warning.
    assert!(p.trust_warnings().is_empty(), "{:#?}", p.trust_warnings());
}

#[test]
fn a_qos_value_not_spelled_as_kubernetes_spells_it_is_an_error() {
    for bad in ["besteffort", "Best-Effort", "BURSTABLE", ""] {
        let e = Policy::parse(
            &format!("[[rule]]\nclass = \"offline\"\nqos = \"{bad}\"\n"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            format!(
                "p.toml:3: rule 1: qos: {bad:?} is not a Kubernetes QoS class (expected \
                 \"BestEffort\", \"Burstable\" or \"Guaranteed\", spelled as Kubernetes spells \
                 them)"
            )
        );
    }
    let e = Policy::parse("[[rule]]\nclass = \"offline\"\nqos = 3\n", "p.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.toml:3: rule 1: qos:"), "{e}");
}
