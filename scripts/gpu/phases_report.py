"""The table of a scripts/gpu-phases.sh run: per phase (column), the median (min-max) over rounds.

Usage: phases_report.py PREFIX      (PREFIX = OUT/PAIR; writes PREFIX-phases.md and .json)
Per phase window (from PREFIX-phases.jsonl): online p50/p99/max over the requests that arrived
in it, the probe's p50/p99 (launch -> tiny kernel done: how long a newcomer waits for the GPU),
offline throughput (iterations that ended in it x items per iteration / window), and from the
audit log the pauses (suspend records) and their call time, and the timeslice changes made
from the phase's switch on (they happen at the policy reload, before the window). "pooled p99" is
the p99 of all of a column's requests together. Ratios: p99 against the alone column's median
p99, offline against the colo column's median. Real GPU, not emulated.
"""
import json, statistics, sys

prefix = sys.argv[1]
load = lambda name: json.load(open(f"{prefix}-{name}.json"))
phases = [json.loads(l) for l in open(f"{prefix}-phases.jsonl")]
on, probe, off = load("on"), load("probe"), load("off")
try:
    offset = float(open(f"{prefix}-clock").read())  # epoch - monotonic
except OSError:
    offset = None
audit = []
try:
    for line in open(f"{prefix}-audit.jsonl"):
        try:
            audit.append(json.loads(line))
        except ValueError:
            pass
except OSError:
    pass


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def window(samples, t0, t1):
    return [l for a, l in zip(samples["arrivals"], samples["lat_ms"]) if t0 <= a < t1]


rows = {}
for w in phases:
    t0, t1 = w["start"], w["end"]
    lat, pr = window(on, t0, t1), window(probe, t0, t1)
    ends = [e for e in off.get("ends", []) if t0 <= e < t1]
    m = {"round": w["round"], "requests": len(lat), "lat": lat, "probe": pr,
         "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat, default=float("nan")),
         "probe_p50": pct(pr, 0.5), "probe_p99": pct(pr, 0.99),
         "offline": len(ends) * off["items_per_iteration"] / (t1 - t0)}
    if offset is not None:
        inw = [r for r in audit if t0 <= r.get("ts_ns", 0) / 1e9 + offset < t1]
        sus = [r for r in inw if r.get("action") == "suspend"]
        m["pauses"] = len(sus)
        m["pause_ms"] = [(r["returned_ns"] - r["issued_ns"]) / 1e6 for r in sus
                         if "returned_ns" in r and "issued_ns" in r]
        # The audit's clock is mapped to the epoch through one reading at start: allow 50 ms.
        ts0 = w.get("switched", t0) - 0.05
        m["timeslice"] = sum(1 for r in audit if r.get("action") == "timeslice"
                             and ts0 <= r.get("ts_ns", 0) / 1e9 + offset < t1)
    rows.setdefault(w["phase"], []).append(m)


def med(col, key):
    v = [m[key] for m in rows[col] if key in m and m[key] == m[key]]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


def fmt(t, nd=2):
    return "-" if t[0] is None else f"{t[0]:.{nd}f} ({t[1]:.{nd}f}-{t[2]:.{nd}f})"


alone_p99 = med("alone", "p99")[0] if "alone" in rows else None
colo_off = med("colo", "offline")[0] if "colo" in rows else None
out = {"prefix": prefix, "unit": off.get("unit"), "model_on": on.get("model"),
       "rate": on.get("rate"), "model_off": off.get("model"), "columns": {}}
lines = ["| column | rounds | requests | p50 ms | p99 ms | pooled p99 | p99 / alone | max ms | "
         "probe p50 / p99 ms | offline " + str(off.get("unit")) + "/s | offline / colo | "
         "pauses | pause call ms p50 / p99 | timeslice changes |",
         "|" + "---|" * 14]
for col, ms in rows.items():
    allat = [l for m in ms for l in m["lat"]]
    allpr = [l for m in ms for l in m["probe"]]
    p99, off_m = med(col, "p99"), med(col, "offline")
    calls = [c for m in ms for c in m.get("pause_ms", [])]
    c = {"rounds": len(ms), "requests": sum(m["requests"] for m in ms),
         "p50": med(col, "p50"), "p99": p99, "pooled_p99": pct(allat, 0.99),
         "max": max((m["max"] for m in ms), default=None),
         "probe_p50": pct(allpr, 0.5), "probe_p99": pct(allpr, 0.99),
         "offline": off_m, "pauses": sum(m.get("pauses", 0) for m in ms),
         "pause_call_p50": pct(calls, 0.5) if calls else None,
         "pause_call_p99": pct(calls, 0.99) if calls else None,
         "timeslice": sum(m.get("timeslice", 0) for m in ms)}
    c["p99_vs_alone"] = p99[0] / alone_p99 if alone_p99 and p99[0] else None
    c["offline_vs_colo"] = off_m[0] / colo_off if colo_off and col != "alone" else None
    out["columns"][col] = c
    r = lambda v, nd=2: "-" if v is None else f"{v:.{nd}f}"
    lines.append(
        f"| {col} | {c['rounds']} | {c['requests']} | {fmt(c['p50'])} | {fmt(p99)} | "
        f"{r(c['pooled_p99'])} | {r(c['p99_vs_alone'])} | {r(c['max'], 1)} | "
        f"{r(c['probe_p50'], 3)} / {r(c['probe_p99'], 3)} | {fmt(off_m, 0)} | "
        f"{r(c['offline_vs_colo'])} | {c['pauses']} | "
        f"{r(c['pause_call_p50'])} / {r(c['pause_call_p99'])} | {c['timeslice']} |")
head = (f"{prefix}: online {out['model_on']} @{out['rate']}/s vs offline {out['model_off']} "
        "(real GPU, not emulated; median (min-max) over rounds)")
md = head + "\n\n" + "\n".join(lines) + "\n"
open(f"{prefix}-phases.md", "w").write(md)
json.dump(out, open(f"{prefix}-phases.json", "w"), indent=1)
print(md)
