//! `gpreempt-ebpf queues`: the PID -> queue -> HQD map once, as a table or JSON (schema in
//! docs/observability.md, "queues --json").

use crate::term::clean;
use std::{fmt::Write as _, io::Write as _, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};

use serde::Serialize;

use crate::{
    observe::model::{DebugApi, Gpu, Queue, State, Uncontrollable},
    observe::nv::gpus::NvGpu,
    observe::procinfo::ProcInfo,
    observe::requests::RequestStats,
};

#[derive(Serialize)]
struct ProcOut<'a> {
    pid: u32,
    #[serde(flatten)]
    info: Option<&'a ProcInfo>,
    class: Option<&'a str>,
    /// The running controller cannot act on it: `{"kind": "traced", "reason": "..."}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    uncontrollable: Option<&'a Uncontrollable>,
    /// It got out of the running controller's hold (and was held again): kind, count, reason,
    /// answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    escaped: Option<&'a crate::observe::model::Escape>,
    debugger: Option<u32>,
    /// Why the tool cannot manage this GPU process (absent when it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    unmanaged: Option<&'a str>,
    /// Whether its queues can be suspended (its runtime enabled the debug API), when its ioctls
    /// said so.
    #[serde(skip_serializing_if = "Option::is_none")]
    debug_api: Option<&'a DebugApi>,
    /// Its request latency, where the running controller (or this observer) watches its
    /// launches and waits: online processes.
    #[serde(skip_serializing_if = "Option::is_none")]
    requests: Option<RequestsOut>,
    /// Why it has its class by the running controller's policy (docs/policy.md, "Why a process
    /// has its class"), when one runs from a policy file.
    #[serde(skip_serializing_if = "Option::is_none")]
    explain: Option<crate::policy::Explanation>,
    queues: Vec<&'a Queue>,
}

/// A process's requests over the last minute (docs/observability.md, "Request latency").
#[derive(Serialize)]
pub struct RequestsOut {
    /// Timed requests that ended in the window.
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Timed requests since it was first watched.
    pub total: u64,
    /// Busy periods without a blocking wait inside (no measurable end).
    pub untimed: u64,
}

impl From<RequestStats> for RequestsOut {
    fn from(s: RequestStats) -> Self {
        let ms = |ns: u64| (ns as f64 / 1e3).round() / 1e3;
        Self {
            count: s.count,
            p50_ms: ms(s.p50_ns),
            p99_ms: ms(s.p99_ns),
            max_ms: ms(s.max_ns),
            total: s.total,
            untimed: s.untimed,
        }
    }
}

/// One entry of `gpus`: `"vendor"` says whose, then that vendor's fields.
#[derive(Serialize)]
#[serde(tag = "vendor", rename_all = "lowercase")]
enum GpuOut<'a> {
    Amd(&'a Gpu),
    Nvidia(&'a NvGpu),
}

#[derive(Serialize)]
struct Out<'a> {
    gpus: Vec<GpuOut<'a>>,
    processes: Vec<ProcOut<'a>>,
    warnings: &'a [String],
}

/// The JSON document.
pub fn to_json(state: &State, warnings: &[String]) -> serde_json::Result<String> {
    to_json_explained(state, warnings, None)
}

/// The JSON document, each process explained by `policy` where given.
pub fn to_json_explained(
    state: &State,
    warnings: &[String],
    policy: Option<&crate::policy::Policy>,
) -> serde_json::Result<String> {
    let now = crate::clock::monotonic_ns();
    let processes = state
        .procs
        .values()
        .filter(|p| p.exited_ns.is_none())
        .map(|p| ProcOut {
            pid: p.pid,
            info: p.info.as_ref(),
            class: p.class.as_deref(),
            uncontrollable: p.uncontrollable.as_ref(),
            escaped: p.escaped.as_ref(),
            debugger: p.debugger,
            unmanaged: p.unmanaged.as_deref(),
            debug_api: p.debug_api.as_ref(),
            requests: state.request_stats(p, now).map(Into::into),
            explain: policy
                .zip(p.info.as_ref())
                .map(|(y, i)| y.explain(i, p.pid)),
            queues: p.live_queues().collect(),
        })
        .collect();
    let gpus = state
        .gpus
        .iter()
        .map(GpuOut::Amd)
        .chain(state.nv_gpus.iter().map(GpuOut::Nvidia))
        .collect();
    serde_json::to_string_pretty(&Out {
        gpus,
        processes,
        warnings,
    })
}

/// An NVIDIA TSG's GPU by its index (nvidia-smi's) where the RM said which GPU its device
/// instance is; a KFD queue's by its gpu_id.
fn gpu_label(state: &State, q: &Queue) -> String {
    match q.nv.as_ref().and_then(|_| state.nv_gpu(q.gpu_id)) {
        Some(g) => g.index.to_string(),
        None => q.gpu_id.to_string(),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// One line per GPU, either vendor's.
fn gpu_lines(state: &State, s: &mut String) {
    if state.gpus.is_empty() && state.nv_gpus.is_empty() {
        s.push_str("no GPUs in /sys/class/kfd/kfd/topology\n");
    }
    for g in &state.gpus {
        let _ = writeln!(
            *s,
            "GPU {} {} ({}) {} CUs, HQDs used {}/{}{}",
            g.node.gpu_id,
            g.gfx_target,
            g.node.name,
            g.node.cu_count,
            opt(g.hqds_used),
            g.hqds_total,
            if g.stopped { ", scheduler stopped" } else { "" }
        );
    }
    for g in &state.nv_gpus {
        let _ = writeln!(
            *s,
            "NVIDIA GPU {} {} {} {}{}",
            g.index,
            clean(&g.name),
            g.pci_bus_id,
            clean(g.uuid.as_deref().unwrap_or("(no UUID)")),
            g.device_node().map(|d| format!(" {d}")).unwrap_or_default()
        );
    }
}

/// The readable table: GPUs, then one line per queue (processes without queues get one line).
/// What processes name themselves is [`clean`]ed: one line per row, nothing a terminal obeys.
pub fn to_table(state: &State, warnings: &[String]) -> String {
    let mut s = String::new();
    gpu_lines(state, &mut s);
    // Queue ids whole: an NVIDIA TSG's is a 10-digit RM handle.
    let qw = state
        .procs
        .values()
        .flat_map(|p| p.live_queues())
        .map(|q| q.queue_id.checked_ilog10().unwrap_or(0) as usize + 1)
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(
        s,
        "\n{:>7} {:>6} {:<15} {:<12} {:>6} {:>qw$} {:<7} {:>4} {:<7} {:<9} {:>8} {:>7}",
        "PID",
        "NSPID",
        "COMM",
        "CONTAINER",
        "GPU",
        "QID",
        "TYPE",
        "PRIO",
        "HQD",
        "STATE",
        "DISP/S",
        "BACKLOG"
    );
    let mut rows = 0;
    for p in state.procs.values().filter(|p| p.exited_ns.is_none()) {
        let info = p.info.as_ref();
        let head = format!(
            "{:>7} {:>6} {:<15} {:<12}",
            p.pid,
            opt(info.and_then(|i| i.ns_pid)),
            clean(p.comm()),
            clean(
                &info
                    .and_then(|i| i.container.clone())
                    .unwrap_or_else(|| "-".into())
            ),
        );
        let mut any = false;
        for q in p.live_queues() {
            any = true;
            rows += 1;
            let _ = writeln!(
                s,
                "{head} {:>6} {:>qw$} {:<7} {:>4} {:<7} {:<9} {:>8} {:>7}",
                gpu_label(state, q),
                q.queue_id,
                q.kind.label(),
                opt(q.priority),
                opt(q.hqd),
                q.state.label(),
                opt(q.activity.dispatches_per_s.map(|d| format!("{d:.1}"))),
                opt(q.activity.backlog),
            );
        }
        if let Some(d) = p.debug_api.as_ref().filter(|d| !d.enabled) {
            let _ = writeln!(s, "{head} (not suspendable: {})", clean(&d.why));
        }
        if !any {
            rows += 1;
            match &p.unmanaged {
                Some(why) => {
                    let _ = writeln!(s, "{head} (unmanaged: {})", clean(why));
                }
                None => {
                    let _ = writeln!(s, "{head} {:>6}", "(no queues)");
                }
            }
        }
    }
    if rows == 0 {
        s.push_str("no GPU processes\n");
    }
    for p in state.procs.values().filter(|p| p.exited_ns.is_none()) {
        if let Some(u) = &p.uncontrollable {
            let _ = writeln!(
                s,
                "uncontrollable ({}): pid {} ({}): {}",
                u.kind,
                p.pid,
                clean(p.comm()),
                clean(&u.reason)
            );
        }
        if let Some(e) = &p.escaped {
            let _ = writeln!(
                s,
                "escaped ({}, {} time(s)): {}: {}",
                e.kind,
                e.count,
                clean(&e.reason),
                clean(&e.answer)
            );
        }
    }
    for w in warnings {
        let _ = writeln!(s, "warning: {}", clean(w));
    }
    s
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON document (schema in docs/observability.md).
    #[arg(long)]
    pub json: bool,
    /// Time between the two reads of dispatch ids that give dispatch rates (ms).
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub sample_gap: u64,
}

pub fn main(args: &Args) -> Result<ExitCode> {
    let (state, warnings) = crate::observe::watch::Watcher::snapshot(
        &crate::observe::kfd::Paths::default(),
        Duration::from_millis(args.sample_gap),
    )?;
    let text = if args.json {
        // The running controller's policy, to explain its classes; none: no explanations.
        let running = crate::policy::running(&crate::rundir::run_dir()).ok();
        to_json_explained(&state, &warnings, running.as_ref().map(|r| &r.policy))
            .context("serialising the map")?
            + "\n"
    } else {
        to_table(&state, &warnings)
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        return crate::cmd::trace::write_failed(e);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{observe::model::Update, tui::app::tests::known_state};

    /// A process the running controller cannot act on carries `uncontrollable` (kind and
    /// reason) in the JSON and a line of its own under the table; the others carry nothing.
    #[test]
    fn an_uncontrollable_process_says_so_in_json_and_the_table() {
        let mut st = known_state();
        st.apply(Update::Uncontrollable {
            pid: 200,
            why: Some(Uncontrollable {
                kind: "traced".into(),
                reason: "already traced by pid 4321 (strace)".into(),
            }),
        });
        let v: serde_json::Value = serde_json::from_str(&to_json(&st, &[]).unwrap()).unwrap();
        let procs = v["processes"].as_array().unwrap();
        let of = |pid: u64| procs.iter().find(|p| p["pid"] == pid).unwrap();
        assert_eq!(of(200)["uncontrollable"]["kind"], "traced");
        assert_eq!(
            of(200)["uncontrollable"]["reason"],
            "already traced by pid 4321 (strace)"
        );
        assert!(of(100).get("uncontrollable").is_none(), "{}", of(100));
        let t = to_table(&st, &[]);
        assert!(
            t.contains(
                "uncontrollable (traced): pid 200 (train): already traced by pid 4321 (strace)"
            ),
            "{t}"
        );
    }

    /// With the controller's policy, each process carries why it has its class; without one,
    /// no `explain` key.
    #[test]
    fn each_process_is_explained_by_the_running_policy() {
        let st = known_state();
        let p = crate::policy::Policy::parse(
            "[[rule]]\nclass = \"online\"\ncomm = \"python\"\ncontainer = \"abc*\"\n\n\
             [[rule]]\nclass = \"offline\"\ncomm = \"train\"\ncgroup = \"/*\"\n",
            "p.toml",
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&to_json_explained(&st, &[], Some(&p)).unwrap()).unwrap();
        let procs = v["processes"].as_array().unwrap();
        let of = |pid: u64| procs.iter().find(|p| p["pid"] == pid).unwrap();
        let e = &of(200)["explain"];
        assert_eq!(
            (&e["class"], &e["rule"]),
            (&"offline".into(), &2.into()),
            "{e}"
        );
        assert_eq!(e["rule_line"], "p.toml:6");
        assert_eq!(
            e["rules"][0]["checks"][0]["text"],
            "comm \"train\" does not match \"python\""
        );
        assert_eq!(of(300)["explain"]["rule"], serde_json::Value::Null);
        let v: serde_json::Value = serde_json::from_str(&to_json(&st, &[]).unwrap()).unwrap();
        assert!(v["processes"][0].get("explain").is_none(), "{v}");
    }

    /// A process that escaped the controller's hold carries `escaped` in the JSON and a line
    /// under the table.
    #[test]
    fn an_escaped_process_says_so_in_json_and_the_table() {
        let mut st = known_state();
        st.apply(Update::Escaped {
            pid: 200,
            escape: Some(crate::observe::model::Escape {
                kind: "resumed".into(),
                count: 2,
                reason: "pid 200 (train) resumed its own suspended queues".into(),
                answer: "held again (queues [0])".into(),
                first_ns: 1,
                last_ns: 2,
            }),
        });
        let v: serde_json::Value = serde_json::from_str(&to_json(&st, &[]).unwrap()).unwrap();
        let procs = v["processes"].as_array().unwrap();
        let of = |pid: u64| procs.iter().find(|p| p["pid"] == pid).unwrap();
        assert_eq!(of(200)["escaped"]["kind"], "resumed");
        assert_eq!(of(200)["escaped"]["count"], 2);
        assert!(of(100).get("escaped").is_none(), "{}", of(100));
        let t = to_table(&st, &[]);
        assert!(
            t.contains(
                "escaped (resumed, 2 time(s)): pid 200 (train) resumed its own suspended queues: \
                 held again (queues [0])"
            ),
            "{t}"
        );
    }

    /// A process naming itself with a screen clear and a newline gets one escaped line in the
    /// table, no forged row; the JSON keeps the name as it is (escaped by JSON).
    #[test]
    fn the_table_shows_control_characters_escaped() {
        let mut st = known_state();
        st.apply(Update::ProcInfo {
            pid: 300,
            info: crate::tui::app::tests::info("b\x1b[2J\nroot", "x", None),
        });
        let t = to_table(&st, &[]);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("b\\x1b[2J\\nroot"), "{t}");
        assert!(!t.lines().any(|l| l.starts_with("root")), "{t}");
        let v: serde_json::Value = serde_json::from_str(&to_json(&st, &[]).unwrap()).unwrap();
        assert!(v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["comm"] == "b\x1b[2J\nroot"));
    }

    /// `gpus` lists NVIDIA GPUs with their vendor and ids (the AMD ones say `"vendor": "amd"`),
    /// and the table shows a TSG's 10-digit id whole, on the GPU named by its index.
    #[test]
    fn nvidia_gpus_are_listed_and_tsg_ids_shown_whole() {
        let st = crate::tui::app::tests::nvidia_host();
        let v: serde_json::Value = serde_json::from_str(&to_json(&st, &[]).unwrap()).unwrap();
        let gpus = v["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 2, "{v}");
        assert_eq!(gpus[0]["vendor"], "nvidia");
        assert_eq!(gpus[0]["index"], 0);
        assert_eq!(gpus[0]["name"], "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[0]["pci_bus_id"], "00000000:19:00.0");
        assert_eq!(gpus[0]["uuid"], "GPU-11111111-2222-3333-4444-555555555555");
        assert_eq!(gpus[0]["minor"], 0);
        assert_eq!(gpus[0]["device_instance"], 1);
        assert_eq!(v["processes"][0]["queues"][0]["gpu_id"], 1);
        let t = to_table(&st, &[]);
        assert!(
            t.contains(
                "NVIDIA GPU 0 NVIDIA H100 80GB HBM3 00000000:19:00.0 \
                 GPU-11111111-2222-3333-4444-555555555555 /dev/nvidia0"
            ),
            "{t}"
        );
        assert!(!t.contains("no GPUs in /sys/class/kfd"), "{t}");
        let row = t.lines().find(|l| l.contains("tsg-gr")).unwrap();
        let w: Vec<&str> = row.split_whitespace().collect();
        // pid, nspid, comm, container, GPU (index 0), QID (whole), type.
        assert_eq!(w[4..7], ["0", "1543503893", "tsg-gr"], "{row}");
        // The AMD entries say whose they are.
        let v: serde_json::Value =
            serde_json::from_str(&to_json(&known_state(), &[]).unwrap()).unwrap();
        assert_eq!(v["gpus"][0]["vendor"], "amd", "{v}");
        assert!(v["gpus"][0]["gpu_id"].is_number(), "{v}");
    }
}
