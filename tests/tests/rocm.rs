//! Real ROCm userspace against the emulator, as root: Debian 12's ROCm 5.2.3 (rocminfo, libhsakmt,
//! ROCr) runs unmodified inside `gpreempt-ebpf sim`, and the real eBPF tracer sees its calls.
//! `cargo xtask test` installs the packages (`test_packages` in xtask); a missing one fails.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tests::{assert_nothing_left, serial, sim, TempDir};

fn require_rocminfo() {
    assert!(
        Path::new("/usr/bin/rocminfo").exists(),
        "rocminfo is not installed: apt-get install rocminfo (cargo xtask test installs it)"
    );
}

/// The value printed after `key:` in rocminfo's section for the first GPU agent.
fn gpu_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let gpu = text
        .split("*******")
        .find(|s| s.contains("Device Type:             GPU"))?;
    gpu.lines()
        .find_map(|l| l.trim_start().strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// rocminfo (libhsakmt + ROCr 5.2.3) lists the emulated MI210 as an HSA agent with its real
/// properties, read from the emulated topology, the render node stand-in and the KFD ioctls; and
/// `trace`, watching from inside the same `sim`, reports rocminfo's KFD calls with their results.
#[test]
fn rocminfo_lists_the_emulated_mi210_and_trace_sees_its_calls() {
    let _one = serial();
    require_rocminfo();
    let tmp = TempDir::new("rocminfo");
    let (ev, out) = (tmp.path("trace.jsonl"), tmp.path("rocminfo.out"));
    let script = format!(
        "\"$GP\" trace --json --comm rocminfo --output {ev} --duration 60 2>{ev}.err & TP=$!; \
         for i in $(seq 200); do grep -q tracing {ev}.err 2>/dev/null && break; sleep 0.1; done; \
         rocminfo > {out} 2>&1; echo rc $? >> {out}; sleep 0.5; kill -INT $TP; wait",
        ev = ev.display(),
        out = out.display()
    );
    sim(&script, Duration::from_secs(120));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("ROCk module is loaded"), "{text}");
    assert!(text.ends_with("rc 0\n"), "rocminfo failed:\n{text}");
    for (key, want) in [
        ("Name", "gfx90a"),
        ("Marketing Name", "AMD Instinct MI210"),
        ("Vendor Name", "AMD"),
        ("Chip ID", "29711(0x740f)"),
        ("Compute Unit", "104"),
        ("SIMDs per CU", "4"),
        ("Shader Engines", "8"),
        ("Max Clock Freq. (MHz)", "1700"),
        ("Wavefront Size", "64(0x40)"),
        ("Max Waves Per CU", "32(0x20)"),
        ("Max Queue Number", "128(0x80)"),
        ("Node", "1"),
    ] {
        assert_eq!(gpu_field(&text, key), Some(want), "{key}\n{text}");
    }
    // Its memory: the VRAM bank (64 GiB, coarse grained) and the caches ROCr keeps.
    assert!(text.contains("67108864(0x4000000) KB"), "{text}");
    assert!(
        text.contains("L2:                      8192(0x2000) KB"),
        "{text}"
    );
    assert!(text.contains("amdgcn-amd-amdhsa--gfx90a"), "{text}");
    let events: Vec<Value> = std::fs::read_to_string(&ev)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ok = |name: &str| {
        events
            .iter()
            .filter(|e| e["event"] == name && e["ret"] == 0)
            .count()
    };
    for name in [
        "get_version",
        "acquire_vm",
        "alloc_memory_of_gpu",
        "map_memory_to_gpu",
    ] {
        assert!(ok(name) >= 1, "{name} missing: {events:?}");
    }
    assert_nothing_left();
}
