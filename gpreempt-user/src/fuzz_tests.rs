//! Property tests: every parser of outside input (policy files, sysfs, debugfs, /proc, ring
//! buffer records, command-line durations) takes arbitrary input without panicking, and
//! structured inputs round-trip. Bounded (a few hundred cases each) so they run in CI.

use proptest::prelude::*;

use crate::observe::events;
use crate::policy::{Class, Policy};

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text shaped like the files it stands for: their keywords, punctuation and numbers mixed with
/// anything.
fn texty(words: &'static [&'static str]) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        proptest::sample::select(words).prop_map(str::to_string),
        "[ \t\n=:,\\[\\]\"'#{}.-]{1,3}",
        "[0-9a-fx]{1,12}",
        any::<String>(),
    ];
    proptest::collection::vec(piece, 0..60).prop_map(|v| v.concat())
}

const POLICY_WORDS: &[&str] = &[
    "[policy]",
    "[[rule]]",
    "[timeslice]",
    "[adaptive]",
    "[nvidia]",
    "strategy",
    "window",
    "class",
    "comm",
    "cmdline",
    "uid",
    "gid",
    "cgroup",
    "container",
    "pid",
    "default",
    "\"online\"",
    "\"offline\"",
    "\"ignore\"",
    "\"priority\"",
    "\"timeslice\"",
    "\"adaptive\"",
    "\"10ms\"",
    "\"1s\"",
    "max_suspend",
    "min_run",
    "resume_after",
    "share",
    "period",
    "gpus",
    "launch_hints",
    "true",
    "online_p99_budget",
    "\n",
];

const DEBUGFS_WORDS: &[&str] = &[
    "Node",
    "Inst",
    "Pipe",
    "Queue",
    "CP Pipe",
    "HQD",
    "Process",
    "pasid",
    "Compute queue on",
    "SDMA queue on",
    "device",
    "0x",
    "CP_HQD_ACTIVE",
    "CP_HQD_PQ_BASE",
    "\n",
    "  ",
    ":",
];

const SYSFS_WORDS: &[&str] = &[
    "gpu_id",
    "simd_count",
    "cpu_cores_count",
    "gfx_target_version",
    "device_id",
    "num_xcc",
    "drm_render_minor",
    "max_waves_per_simd",
    "\n",
    " ",
];

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn policy_text_never_panics(text in texty(POLICY_WORDS)) {
        let _ = Policy::parse(&text, "fuzz.toml");
    }

    #[test]
    fn structured_policies_round_trip(
        rules in proptest::collection::vec(
            (0u8..3, proptest::option::of(0u32..70_000), proptest::option::of("[a-z_][a-z0-9_*]{0,14}")),
            0..12,
        ),
        window_ms in 1u64..500,
    ) {
        let mut text = format!("[policy]\nwindow = \"{window_ms}ms\"\nmax_suspend = \"1s\"\n");
        let mut want = Vec::new();
        for (class, uid, comm) in &rules {
            let (uid, comm) = match (uid, comm) {
                (None, None) => (Some(0), None),
                other => (*other.0, other.1.clone()),
            };
            let class = [Class::Online, Class::Offline, Class::Ignore][*class as usize];
            text += &format!("\n[[rule]]\nclass = \"{}\"\n", class.label());
            if let Some(u) = uid {
                text += &format!("uid = {u}\n");
            }
            if let Some(c) = &comm {
                text += &format!("comm = \"{c}\"\n");
            }
            want.push((class, uid));
        }
        let p = Policy::parse(&text, "gen.toml").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(p.window_ns, window_ms * 1_000_000);
        let got: Vec<(Class, Option<u32>)> = p.rules.iter().map(|r| (r.class, r.uid)).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn durations_never_panic(s in "\\PC{0,24}") {
        let _ = crate::policy::parse_duration(&s);
        let _ = s.parse::<crate::cmd::manual::DurationArg>();
    }

    #[test]
    fn debugfs_dumps_never_panic(text in texty(DEBUGFS_WORDS)) {
        let _ = crate::observe::kfd::debugfs::parse_hqds(&text);
        let _ = crate::observe::kfd::debugfs::parse_mqds(&text);
    }

    #[test]
    fn sysfs_files_never_panic(
        props in texty(SYSFS_WORDS),
        gpu_id in "\\PC{0,12}",
        name in "\\PC{0,12}",
    ) {
        let _ = crate::observe::kfd::sysfs::parse_properties(&props);
        let _ = crate::observe::kfd::sysfs::parse_node(1, &gpu_id, &name, &props);
    }

    #[test]
    fn proc_files_never_panic(text in "\\PC{0,300}") {
        let _ = crate::observe::procinfo::container_id(&text);
        let _ = crate::observe::procinfo::status_field(&text, "Uid");
        let _ = crate::observe::gpufiles::char_major(&text, "kfd");
    }

    #[test]
    fn ring_buffer_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        let _ = events::decode(&bytes);
    }

    #[test]
    fn ring_buffer_records_with_any_payload_decode(
        kind in 1u32..5,
        file_kind in 0u32..4,
        cmd in any::<u32>(),
        ret in any::<i64>(),
        args_len in 0u32..300,
        out_len in 0u32..300,
        payload in proptest::collection::vec(any::<u8>(), 2 * gpreempt_common::record::ARGS_MAX),
    ) {
        use gpreempt_common::record::IoctlRecord;
        let mut r = IoctlRecord::default();
        r.hdr.kind = kind;
        r.hdr.pid = 42;
        r.hdr.file_kind = file_kind;
        r.cmd = cmd;
        r.ret = ret;
        r.args_len = args_len;
        r.out_len = out_len;
        let m = gpreempt_common::record::ARGS_MAX;
        r.args.copy_from_slice(&payload[..m]);
        r.out.copy_from_slice(&payload[m..]);
        let bytes = events::tests::bytes_of(&r);
        // Every kind is long enough: a record of the largest size decodes to something.
        let ev = events::decode(&bytes);
        prop_assert!(ev.is_ok(), "{:?}", ev);
        if kind == gpreempt_common::record::kind::IOCTL {
            match ev.unwrap() {
                events::Event::Ioctl(i) => {
                    prop_assert_eq!(i.origin.pid, 42);
                    prop_assert_eq!(i.ret, ret);
                }
                events::Event::Nv(n) => prop_assert_eq!(n.origin.pid, 42),
                e => prop_assert!(false, "{:?}", e),
            }
        }
    }
}
