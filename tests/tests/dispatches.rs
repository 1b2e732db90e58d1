//! Dispatch-level visibility end to end, as root inside `sim`: `trace --dispatches` decodes the
//! AQL packets the emulated workloads write, and they are the kernels of the timelines the
//! workloads replay (emulated).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;
use tests::{assert_nothing_left, serial, sim, TempDir};

/// (work-items per dimension, work-group size) of each kernel of a profile, as a HIP launch
/// of `grid` blocks of `block` threads puts them in the packet.
fn geometries(profile: &str) -> BTreeMap<([u64; 3], [u64; 3]), BTreeSet<String>> {
    let p = gpreempt_sim::workload::profile(profile).expect("profile");
    let mut m: BTreeMap<([u64; 3], [u64; 3]), BTreeSet<String>> = BTreeMap::new();
    for k in &p.kernels {
        let block = k.block.map(|b| u64::from(b.clamp(1, u32::from(u16::MAX))));
        let grid = [0, 1, 2].map(|i| u64::from(k.grid[i].saturating_mul(k.block[i].max(1))));
        m.entry((grid, block)).or_default().insert(k.name.clone());
    }
    m
}

fn triple(v: &Value) -> [u64; 3] {
    let a = v.as_array().expect("array of 3");
    [0, 1, 2].map(|i| a[i].as_u64().expect("number"))
}

#[test]
fn trace_dispatches_shows_the_kernels_of_the_workloads_timelines() {
    let _one = serial();
    let tmp = TempDir::new("dispatches");
    let out = tmp.path("dispatches.jsonl");
    let (on, off) = (tmp.path("online.json"), tmp.path("offline.json"));
    let script = format!(
        "\"$GP\" trace --dispatches --json --output {out} --duration 6 2>{out}.err & TP=$!; \
         for i in $(seq 100); do grep -q 'tracing AQL' {out}.err 2>/dev/null && break; sleep 0.1; done; \
         \"$GP\" sim workload --profile resnet18_b1 --rate 20 --duration 3 --report {on} & WP=$!; \
         \"$GP\" sim workload --profile transformer_b8_s128 --offline --duration 3 --report {off}; \
         wait $WP; sleep 0.3; kill -INT $TP; wait",
        out = out.display(),
        on = on.display(),
        off = off.display(),
    );
    sim(&script, Duration::from_secs(90));
    let report = |p: &std::path::Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("report")).expect("report JSON")
    };
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .expect("trace output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    for (rep, profile) in [(on, "resnet18_b1"), (off, "transformer_b8_s128")] {
        let pid = report(&rep)["pid"].as_u64().expect("pid");
        let want = geometries(profile);
        let mine: Vec<&Value> = lines
            .iter()
            .filter(|l| l["pid"].as_u64() == Some(pid))
            .collect();
        let dispatches: Vec<&&Value> = mine.iter().filter(|l| l["type"] == "dispatch").collect();
        assert!(
            dispatches.len() >= 50,
            "{profile}: {} packets decoded",
            dispatches.len()
        );
        let mut seen = BTreeSet::new();
        let mut named = 0;
        let mut last: HashMap<u64, u64> = HashMap::new();
        for d in &dispatches {
            assert_eq!(d["packet"], "kernel_dispatch", "{d}");
            let geo = (triple(&d["grid"]), triple(&d["workgroup"]));
            assert!(
                want.contains_key(&geo),
                "{profile}: {d} is no kernel of the timeline"
            );
            seen.insert(geo);
            // Names come from the workload's code object, read through _amdgpu_r_debug (the
            // first packets may precede the first read).
            if let Some(k) = d["kernel"].as_str() {
                assert!(
                    want[&geo].contains(k),
                    "{profile}: {k:?} is not {geo:?}'s kernel"
                );
                named += 1;
            }
            let work: u64 = geo.0.iter().map(|&g| g.max(1)).product();
            assert_eq!(d["work_items"].as_u64(), Some(work), "{d}");
            // Each packet once, in queue order.
            let q = d["queue_id"].as_u64().expect("queue_id");
            let id = d["dispatch_id"].as_u64().expect("dispatch_id");
            if let Some(prev) = last.insert(q, id) {
                assert!(id > prev, "{profile}: dispatch {id} after {prev}");
            }
        }
        // Most of the timeline's distinct kernels show up (packets consumed between two ticks
        // are not seen, so not necessarily all).
        assert!(
            named * 2 >= dispatches.len(),
            "{profile}: {named} of {} packets named",
            dispatches.len()
        );
        assert!(
            seen.len() * 2 >= want.len(),
            "{profile}: {} of {} kernel geometries seen",
            seen.len(),
            want.len()
        );
        let summary = mine
            .iter()
            .find(|l| l["type"] == "dispatch_summary")
            .unwrap_or_else(|| panic!("{profile}: no dispatch_summary"));
        let (decoded, consumed) = (
            summary["decoded"].as_u64().unwrap(),
            summary["consumed"].as_u64().unwrap(),
        );
        assert_eq!(decoded as usize, dispatches.len(), "{summary}");
        assert!(consumed > 0, "{summary}");
        let samples: Vec<&&Value> = mine.iter().filter(|l| l["type"] == "aql_sample").collect();
        assert!(
            samples.len() >= 100,
            "{profile}: {} aql samples",
            samples.len()
        );
        for s in samples {
            assert!(
                s["read_dispatch_id"].as_u64() <= s["write_dispatch_id"].as_u64(),
                "{s}"
            );
        }
        eprintln!(
            "{profile}: {decoded} packets decoded of {consumed} consumed, {named} named, {} of {} geometries (emulated)",
            seen.len(),
            want.len()
        );
    }
    assert_nothing_left();
}
