"""The MI host kit's report: report.md and report.json from a scripts/mi-kit.sh directory.

Usage: mi_report.py DIR            (writes DIR/report.md and DIR/report.json)
       mi_report.py --dispatches TRACE.jsonl [--pid P]   (the dispatch mix of one trace, JSON)

Python 3 standard library only. Every section is reported whatever happened to the others: a
step that failed is "failed" with its exit code and the tail of its stderr, a file that is
missing or unreadable makes its section "failed" or "partial" and says which file. Every section
carries "emulated" (true when the kit ran inside `gpreempt-ebpf sim`): emulated numbers describe
the emulator, not a GPU.

Inputs (all written by scripts/mi-kit.sh): env.txt, steps.jsonl, doctor.out (doctor --json),
queues-idle.out, inv-{cnn,transformer}{.pid,.json,-queues.out,-trace.jsonl}, kfd-cycles.out
(kfd-cycles --json), cyc-on-{without,with}.json, cyc-off.json,
colo-{none,policy}-{on,off}.json, colo-policy-audit.jsonl, and each step's .err.
Workload reports come from scripts/gpu/online.py / offline.py (real GPU) or `sim workload`
(emulated); both forms are read.
"""
import json
import math
import os
import sys
from collections import Counter, defaultdict

TARGET_MS = 10.0
WORKLOADS = {"cnn": "CNN (ResNet-50 b1024)", "transformer": "transformer (encoder b8 s128)"}


def pct(values, p):
    """Nearest-rank percentile; None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return v[min(len(v), max(1, math.ceil(p * len(v)))) - 1]


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    t = read_text(path)
    if t is None:
        return None
    try:
        return json.loads(t)
    except ValueError:
        return None


def read_jsonl(path):
    t = read_text(path)
    if t is None:
        return None
    out = []
    for line in t.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut short by a killed writer
    return out


def tail(path, n=15):
    t = read_text(path)
    if not t:
        return ""
    return "\n".join(t.rstrip().splitlines()[-n:])


class Kit:
    def __init__(self, d):
        self.d = d
        self.env = {}
        for line in (read_text(self.p("env.txt")) or "").splitlines():
            k, _, v = line.partition("=")
            if k:
                self.env[k.strip()] = v.strip()
        self.emulated = self.env.get("emulated") == "1"
        self.steps = {}
        for s in read_jsonl(self.p("steps.jsonl")) or []:
            self.steps[s.get("step")] = s

    def p(self, name):
        return os.path.join(self.d, name)

    def step_failure(self, name):
        """None if the step ran and exited 0; else a dict saying what happened."""
        s = self.steps.get(name)
        if s is None:
            return {"step": name, "error": "did not run (no record in steps.jsonl)"}
        if s.get("rc") != 0:
            return {"step": name, "rc": s.get("rc"), "note": s.get("note") or None,
                    "stderr_tail": tail(self.p(name + ".err"))}
        return None

    def section(self, status, **kw):
        return dict(status=status, emulated=self.emulated, **kw)


# --- workloads -----------------------------------------------------------------------------

def online_latency(doc):
    """{p50_ms, p95_ms, p99_ms, max_ms, mean_ms, requests} from online.py or `sim workload`."""
    if not isinstance(doc, dict):
        return None
    lat = doc.get("latency") if isinstance(doc.get("latency"), dict) else doc
    if lat.get("p99_ms") is None:
        return None
    out = {k: lat.get(k) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")}
    out["requests"] = doc.get("requests")
    return out


def offline_throughput(doc):
    if not isinstance(doc, dict) or doc.get("items_per_s") is None:
        return None
    return {"items_per_s": doc.get("items_per_s"),
            "iterations_per_s": doc.get("iterations_per_s")
            or (doc["iterations"] / doc["seconds"] if doc.get("seconds") else None),
            "iterations": doc.get("iterations"),
            "unit": doc.get("unit") or "items"}


# --- dispatches ----------------------------------------------------------------------------

def dispatch_mix(lines, pid=None):
    """The dispatch mix and RPTR/WPTR behaviour of `trace --dispatches --json` lines."""
    mine = [l for l in lines if pid is None or l.get("pid") == pid]
    samples = [l for l in mine if l.get("type") == "aql_sample"]
    disp = [l for l in mine if l.get("type") == "dispatch"]
    summ = [l for l in mine if l.get("type") == "dispatch_summary"]
    ts = [l["ts_ns"] for l in samples + disp if isinstance(l.get("ts_ns"), int)]
    span_s = (max(ts) - min(ts)) / 1e9 if len(ts) > 1 else None
    backlog = [max(0, s["write_dispatch_id"] - s["read_dispatch_id"]) for s in samples
               if "write_dispatch_id" in s and "read_dispatch_id" in s]
    kern = [d for d in disp if d.get("packet") == "kernel_dispatch"]
    work = [d.get("work_items") for d in kern if isinstance(d.get("work_items"), int)]
    grid_hist = Counter()
    for w in work:
        b = max(0, w).bit_length() - 1 if w > 0 else -1
        grid_hist["0" if b < 0 else "2^%d" % b] += 1
    wg_hist = Counter()
    for d in kern:
        wg = d.get("workgroup") or []
        if len(wg) == 3 and all(isinstance(x, int) for x in wg):
            wg_hist[str(wg[0] * wg[1] * wg[2])] += 1
    names = defaultdict(list)
    for d in kern:
        name = d.get("kernel") or ("0x%x" % d["kernel_object"] if d.get("kernel_object")
                                   else "unknown")
        names[name].append(d.get("work_items"))
    top = sorted(names.items(), key=lambda kv: -len(kv[1]))[:10]
    per_queue = defaultdict(lambda: {"samples": 0, "read_eq_write": 0})
    for s in samples:
        q = per_queue[s.get("queue_id")]
        q["samples"] += 1
        q["read_eq_write"] += s.get("read_dispatch_id") == s.get("write_dispatch_id")
    consumed = sum(s.get("consumed", 0) for s in summ)
    decoded = sum(s.get("decoded", 0) for s in summ)
    return {
        "aql_samples": len(samples),
        "read_eq_write_fraction": (sum(b == 0 for b in backlog) / len(backlog)) if backlog else None,
        "backlog_mean": (sum(backlog) / len(backlog)) if backlog else None,
        "backlog_max": max(backlog) if backlog else None,
        "per_queue": {str(k): dict(v, read_eq_write_fraction=v["read_eq_write"] / v["samples"])
                      for k, v in sorted(per_queue.items(), key=lambda kv: str(kv[0]))},
        "packets": dict(Counter(d.get("packet") for d in disp)),
        "kernel_dispatches": len(kern),
        "seconds": span_s,
        "kernels_per_s": len(kern) / span_s if span_s else None,
        "work_items": {"p10": pct(work, 0.1), "p50": pct(work, 0.5), "p90": pct(work, 0.9),
                       "max": max(work) if work else None},
        "grid_histogram": dict(sorted(grid_hist.items(),
                                      key=lambda kv: int(kv[0][2:]) if kv[0] != "0" else -1)),
        "workgroup_sizes": dict(sorted(wg_hist.items(), key=lambda kv: int(kv[0]))),
        "top_kernels": [{"kernel": n, "count": len(w), "work_items_p50": pct(w, 0.5)}
                        for n, w in top],
        "consumed": consumed if summ else None,
        "decoded": decoded if summ else None,
        "coverage": decoded / consumed if summ and consumed else None,
    }


# --- sections ------------------------------------------------------------------------------

def doctor_section(kit):
    doc = read_json(kit.p("doctor.out"))
    if not isinstance(doc, dict) or "checks" not in doc:
        f = kit.step_failure("doctor") or {"step": "doctor", "error": "doctor.out is not JSON",
                                           "stderr_tail": tail(kit.p("doctor.err"))}
        return kit.section("failed", failure=f)
    rc = kit.steps.get("doctor", {}).get("rc")
    return kit.section("ok", exit_code=rc, ok=doc.get("ok"), warn=doc.get("warn"),
                       fail=doc.get("fail"), checks=doc["checks"])


def inventory_section(kit):
    out = {"workloads": []}
    failed = 0
    trace_lines = {}
    for w, label in WORKLOADS.items():
        entry = {"workload": w, "label": label}
        pid_t = read_text(kit.p("inv-%s.pid" % w))
        pid = int(pid_t) if pid_t and pid_t.strip().isdigit() else None
        entry["pid"] = pid
        fails = [f for f in (kit.step_failure("inv-" + w), kit.step_failure("inv-%s-queues" % w),
                             kit.step_failure("inv-%s-trace" % w)) if f]
        doc = read_json(kit.p("inv-%s-queues.out" % w))
        proc = None
        if isinstance(doc, dict) and pid is not None:
            proc = next((p for p in doc.get("processes", []) if p.get("pid") == pid), None)
        if proc:
            entry["process"] = {k: proc.get(k) for k in ("pid", "comm", "cmdline", "uid",
                                                          "container", "class")}
            entry["queues"] = [{k: q.get(k) for k in (
                "queue_id", "gpu_id", "type", "priority", "ring_base_address", "ring_size",
                "read_pointer_address", "write_pointer_address", "doorbell_offset", "hqd",
                "state")} for q in proc.get("queues", [])]
        else:
            fails.append({"step": "inv-%s-queues" % w,
                          "error": "pid %s not in inv-%s-queues.out" % (pid, w)})
        lines = read_jsonl(kit.p("inv-%s-trace.jsonl" % w))
        if lines is not None:
            trace_lines[w] = lines
            entry["dispatch"] = dispatch_mix(lines, pid)
        elif not any(x.get("step") == "inv-%s-trace" % w for x in fails):
            fails.append({"step": "inv-%s-trace" % w, "error": "no inv-%s-trace.jsonl" % w,
                          "stderr_tail": tail(kit.p("inv-%s-trace.err" % w))})
        entry["workload_report"] = read_json(kit.p("inv-%s.json" % w))
        if fails:
            entry["failures"] = fails
        ok = proc is not None and "dispatch" in entry
        entry["status"] = "ok" if ok and not fails else ("partial" if proc or lines else "failed")
        failed += entry["status"] != "ok"
        out["workloads"].append(entry)
    idle = read_json(kit.p("queues-idle.out"))
    if isinstance(idle, dict):
        out["gpus"] = idle.get("gpus")
        if out["gpus"] and "gpu" not in kit.env:
            kit.env["gpu"] = "; ".join("%s %s, %s CUs" % (g.get("name"), g.get("gfx_target"),
                                                          g.get("cu_count"))
                                       for g in out["gpus"]) + (" (emulated)" if kit.emulated
                                                                 else "")
    status = "ok" if failed == 0 else ("failed" if failed == len(WORKLOADS) else "partial")
    return kit.section(status, **out)


def cycles_section(kit):
    lines = read_jsonl(kit.p("kfd-cycles.out")) or []
    cycles = [l for l in lines if l.get("type") == "cycle"]
    summary = next((l for l in lines if l.get("type") == "summary"), None)
    without = online_latency(read_json(kit.p("cyc-on-without.json")))
    with_ = online_latency(read_json(kit.p("cyc-on-with.json")))
    impact = {"without_cycling": without, "with_cycling": with_}
    if without and with_ and without.get("p99_ms"):
        impact["p99_ratio"] = with_["p99_ms"] / without["p99_ms"]
    fails = [f for f in (kit.step_failure("cycles"), kit.step_failure("kfd-cycles")) if f]
    if not cycles:
        return kit.section("failed", failure=fails or [{"step": "kfd-cycles",
                                                        "error": "no cycles in kfd-cycles.out"}],
                           online_impact=impact)

    def stat(key):
        v = [c.get(key) for c in cycles if c.get(key) is not None]
        return {"n": len(v), "p50": pct(v, 0.5), "p99": pct(v, 0.99),
                "max": max(v) if v else None,
                "over_target": sum(x > TARGET_MS for x in v)}

    s = {k: stat(k) for k in ("suspend_ms", "resume_ms", "quiesce_ms", "progress_ms")}
    verdict = {k: (s[k]["p99"] is not None and s[k]["p99"] <= TARGET_MS)
               for k in ("suspend_ms", "resume_ms", "quiesce_ms")}
    return kit.section(
        "ok" if not fails else "partial",
        cycles=len(cycles),
        cycles_asked=int(kit.env["cycles"]) if kit.env.get("cycles", "").isdigit() else None,
        hold_ms=kit.env.get("hold_ms"), gap_ms=kit.env.get("gap_ms"),
        target_ms=TARGET_MS, meets_target_p99=verdict, **s,
        cycles_with_progress_while_held=sum(bool(c.get("progress_while_held")) for c in cycles),
        sample_interval_us=(summary or {}).get("sample_interval_us"),
        ended=(summary or {}).get("ended", "no summary line (killed?)"),
        online_impact=impact, per_cycle=cycles, **({"failures": fails} if fails else {}))


def colo_section(kit):
    cols = {}
    bad = 0
    for col in ("none", "policy"):
        on = online_latency(read_json(kit.p("colo-%s-on.json" % col)))
        off = offline_throughput(read_json(kit.p("colo-%s-off.json" % col)))
        c = {"online": on, "offline": off}
        f = kit.step_failure("colo-" + col)
        if f:
            c["failure"] = f
        if col == "policy":
            audit = read_jsonl(kit.p("colo-policy-audit.jsonl")) or []
            c["suspends"] = sum(a.get("action") == "suspend" for a in audit)
            c["resumes"] = sum(a.get("action") == "resume" for a in audit)
        c["status"] = "ok" if on and off and not f else ("partial" if on or off else "failed")
        bad += c["status"] != "ok"
        cols[col] = c
    out = {"duration_s": int(kit.env["colo_secs"]) if kit.env.get("colo_secs", "").isdigit()
           else None, "columns": cols}
    n, p = cols["none"], cols["policy"]
    if n["online"] and p["online"] and n["online"].get("p99_ms"):
        out["online_p99_ratio"] = p["online"]["p99_ms"] / n["online"]["p99_ms"]
    if n["offline"] and p["offline"] and n["offline"].get("items_per_s"):
        out["offline_ratio"] = p["offline"]["items_per_s"] / n["offline"]["items_per_s"]
    return kit.section("ok" if bad == 0 else ("failed" if bad == 2 else "partial"), **out)


def build(d):
    kit = Kit(d)
    sections = {}
    for name, fn in (("doctor", doctor_section), ("inventory", inventory_section),
                     ("suspend_resume", cycles_section), ("colocation", colo_section)):
        try:
            sections[name] = fn(kit)
        except Exception as e:  # a section's own bug must not lose the others
            sections[name] = kit.section("failed", failure={"error": "report generator: %r" % e})
    return {"kit": "gpreempt-ebpf MI host kit", "emulated": kit.emulated,
            "short": kit.env.get("short") == "1", "env": kit.env,
            "steps": list(kit.steps.values()), "sections": sections}


# --- markdown ------------------------------------------------------------------------------

def f(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "%.*f" % (nd, v)
    return str(v)


def failure_md(fl):
    if not fl:
        return []
    if isinstance(fl, dict):
        fl = [fl]
    out = []
    for x in fl:
        what = x.get("error") or "exit code %s%s" % (x.get("rc"), ", " + x["note"]
                                                       if x.get("note") else "")
        out.append("- **failed** `%s`: %s" % (x.get("step", "?"), what))
        if x.get("stderr_tail"):
            out.append("\n```\n%s\n```" % x["stderr_tail"])
    return out


def markdown(r):
    em = r["emulated"]
    tag = " (emulated)" if em else ""
    L = ["# gpreempt-ebpf MI host kit report" + tag, ""]
    if em:
        L += ["**EMULATED**: this run used `gpreempt-ebpf sim` and its emulated workloads; every "
              "number below describes the emulator, not a GPU.", ""]
    e = r["env"]
    L += ["| | |", "|---|---|"]
    for k in ("date", "gpreempt_ebpf", "git", "gpu", "kernel", "os", "rocm", "python", "torch"):
        if k in e:
            L.append("| %s | %s |" % (k, e[k]))
    S = r["sections"]

    d = S["doctor"]
    L += ["", "## (a) doctor" + tag, ""]
    if d["status"] == "ok":
        L.append("%s ok, %s warn, %s fail (exit code %s)" % (d["ok"], d["warn"], d["fail"],
                                                            d["exit_code"]))
        L += ["", "| check | verdict | finding |", "|---|---|---|"]
        for c in d["checks"]:
            finding = str(c.get("finding", "")).replace("|", "/")
            L.append("| %s | %s | %s |" % (c.get("name"), c.get("verdict"),
                                           finding[:200] + ("..." if len(finding) > 200 else "")))
    L += failure_md(d.get("failure"))

    inv = S["inventory"]
    L += ["", "## (b) queue inventory and dispatch mix" + tag, ""]
    for g in inv.get("gpus") or []:
        L.append("GPU %s: %s %s, %s CUs, %s HQD slots" % (
            g.get("gpu_id"), g.get("gfx_target"), g.get("name"), g.get("cu_count"),
            g.get("hqds_total")))
    for w in inv.get("workloads", []):
        L += ["", "### %s: pid %s (%s)" % (w["label"], w.get("pid"), w["status"]), ""]
        pr = w.get("process")
        if pr:
            L.append("comm `%s`, %d queue(s)" % (pr.get("comm"), len(w.get("queues", []))))
            L += ["", "| queue | gpu | type | prio | ring | ring size | HQD | state |",
                  "|---|---|---|---|---|---|---|---|"]
            for q in w.get("queues", []):
                h = q.get("hqd")
                hqd = "%s.%s.%s" % (h["inst"], h["pipe"], h["queue"]) if isinstance(h, dict) \
                    else "-"
                ring = "0x%x" % q["ring_base_address"] if q.get("ring_base_address") else "-"
                L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    q.get("queue_id"), q.get("gpu_id"), q.get("type"), f(q.get("priority")),
                    ring, q.get("ring_size"), hqd, q.get("state")))
        m = w.get("dispatch")
        if m:
            L += ["", "- RPTR == WPTR in %s of %s samples (backlog mean %s, max %s)" % (
                f(m["read_eq_write_fraction"] * 100 if m["read_eq_write_fraction"] is not None
                  else None, 1) + "%", m["aql_samples"], f(m["backlog_mean"]),
                f(m["backlog_max"])),
                "- %s kernel dispatches in %s s: %s kernels/s; packets %s; decoded/consumed %s" % (
                m["kernel_dispatches"], f(m["seconds"], 1), f(m["kernels_per_s"], 0),
                m["packets"], f(m["coverage"])),
                "- work-items per grid p10/p50/p90/max: %s / %s / %s / %s" % (
                m["work_items"]["p10"], m["work_items"]["p50"], m["work_items"]["p90"],
                m["work_items"]["max"]),
                "- grid histogram (work-items): %s" % ", ".join(
                    "%s: %d" % kv for kv in m["grid_histogram"].items()),
                "- work-group sizes: %s" % ", ".join(
                    "%s: %d" % kv for kv in m["workgroup_sizes"].items()),
                "", "| top kernels | count | work-items p50 |", "|---|---|---|"]
            for k in m["top_kernels"]:
                L.append("| `%s` | %d | %s |" % (k["kernel"], k["count"], f(k["work_items_p50"])))
        L += failure_md(w.get("failures"))

    c = S["suspend_resume"]
    L += ["", "## (c) suspend / resume of a busy offline process" + tag, ""]
    if c.get("cycles"):
        L += ["%s cycles (%s ms held, %s ms running); target %s ms each" % (
            c["cycles"], c.get("hold_ms"), c.get("gap_ms"), f(c["target_ms"], 0)), "",
            "| | p50 ms | p99 ms | max ms | over target | p99 meets target |",
            "|---|---|---|---|---|---|"]
        for k, label in (("suspend_ms", "SUSPEND ioctl"), ("resume_ms", "RESUME ioctl"),
                         ("quiesce_ms", "time to quiesce"), ("progress_ms", "time to progress")):
            s = c[k]
            L.append("| %s | %s | %s | %s | %s | %s |" % (
                label, f(s["p50"], 3), f(s["p99"], 3), f(s["max"], 3), s["over_target"],
                {True: "yes", False: "no"}.get(c["meets_target_p99"].get(k), "-")))
        L += ["", "Cycles where the read id moved while held: **%d** (must be 0). "
              "Sample interval %s us. Ended: %s." % (
                  c["cycles_with_progress_while_held"], f(c.get("sample_interval_us"), 0),
                  c.get("ended"))]
    im = c.get("online_impact") or {}
    if im.get("without_cycling") or im.get("with_cycling"):
        L += ["", "Online ResNet-18 b1 @20 req/s beside it:", "",
              "| | requests | p50 ms | p99 ms |", "|---|---|---|---|"]
        for k, label in (("without_cycling", "without cycling"), ("with_cycling", "with cycling")):
            o = im.get(k) or {}
            L.append("| %s | %s | %s | %s |" % (label, f(o.get("requests")), f(o.get("p50_ms")),
                                               f(o.get("p99_ms"))))
        L += ["", "p99 with / without: %s" % f(im.get("p99_ratio"))]
    L += failure_md(c.get("failure") or c.get("failures"))

    co = S["colocation"]
    L += ["", "## (d) co-location: online ResNet-18 b1 @20 req/s + offline ResNet-50 b1024%s, "
          "%s s" % (tag, f(co.get("duration_s"))), "",
          "| column | requests | online p50 ms | p95 ms | p99 ms | offline items/s | suspends |",
          "|---|---|---|---|---|---|---|"]
    for col, label in (("none", "no control"), ("policy", "run --policy")):
        x = co["columns"][col]
        on, off = x.get("online") or {}, x.get("offline") or {}
        L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, f(on.get("requests")), f(on.get("p50_ms")), f(on.get("p95_ms")),
            f(on.get("p99_ms")), f(off.get("items_per_s"), 1), f(x.get("suspends"))))
    L += ["", "online p99 policy / none: %s; offline throughput policy / none: %s" % (
        f(co.get("online_p99_ratio")), f(co.get("offline_ratio")))]
    for col in ("none", "policy"):
        L += failure_md(co["columns"][col].get("failure"))

    L += ["", "## steps", "", "| step | exit code | seconds |", "|---|---|---|"]
    for s in r["steps"]:
        L.append("| %s | %s | %s |" % (s.get("step"), s.get("rc"),
                                        f((s.get("end") or 0) - (s.get("start") or 0), 1)))
    return "\n".join(L) + "\n"


def main(argv):
    if len(argv) >= 3 and argv[1] == "--dispatches":
        pid = int(argv[4]) if len(argv) >= 5 and argv[3] == "--pid" else None
        print(json.dumps(dispatch_mix(read_jsonl(argv[2]) or [], pid), indent=1))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    r = build(argv[1])
    with open(os.path.join(argv[1], "report.json"), "w") as fh:
        json.dump(r, fh, indent=1)
    md = markdown(r)
    with open(os.path.join(argv[1], "report.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
