"""Aggregates scripts/gpu-matrix.sh's measurements: $OUT/<pair>-matrix.json and a markdown table.

Usage: matrix_report.py --pair A --out DIR [--columns "alone solo_off colo timeslice ..."]
       matrix_report.py --brief DIR/A-colo-r1     (one line about one measurement)
A measurement TAG = <pair>-<column>-r<round> has TAG-meta (key=value lines), TAG-on.json,
TAG-off.json, and for a policy column TAG-audit.jsonl and TAG-run.err.
The offline rate of a co-located measurement counts only the iterations that ended while the
online service was measuring (its t_start..t_end); solo_off uses the whole run.
"""
import argparse, glob, json, os, re, statistics

BASE = ("alone", "solo_off", "colo")


def load_json(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def window_rate(off, on):
    """Items/s of the offline job inside the online measurement window (None if it can't)."""
    ends, per = off.get("ends"), off.get("items_per_iteration")
    if not ends or not per or not on or "t_start" not in on:
        return None
    a, b = on["t_start"], on["t_end"]
    inside = [e for e in ends if a < e <= b]
    if len(inside) >= 3:  # between the first and the last end inside: whole iterations only
        return (len(inside) - 1) * per / (inside[-1] - inside[0])
    return len(inside) * per / (b - a) if b > a else None


def measurement(prefix):
    meta = {}
    try:
        for line in open(prefix + "-meta"):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    except OSError:
        pass
    col = meta.get("column", "?")
    m = {"tag": os.path.basename(prefix), "column": col, "round": int(meta.get("round", 0) or 0),
         "elapsed_s": float(meta["elapsed"]) if meta.get("elapsed") else None, "meta": meta}
    on, off = load_json(prefix + "-on.json"), load_json(prefix + "-off.json")
    if on:
        m["online"] = {k: on.get(k) for k in
                       ("requests", "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms", "model", "rate")}
    if off:
        w = window_rate(off, on) if col != "solo_off" else None
        m["offline"] = {"items_per_s": w if w is not None else off.get("items_per_s"),
                        "window": w is not None, "items_per_s_whole": off.get("items_per_s"),
                        "iterations": off.get("iterations"), "unit": off.get("unit"),
                        "model": off.get("model"), "seconds": off.get("seconds")}
    if col not in BASE:
        counts, lines = {"suspend": 0, "resume": 0, "timeslice": 0}, 0
        try:
            for line in open(prefix + "-audit.jsonl"):
                lines += 1
                try:
                    act = json.loads(line).get("action")
                except ValueError:
                    mm = re.search(r'"action"\s*:\s*"(\w+)"', line)
                    act = mm.group(1) if mm else None
                if act in counts:
                    counts[act] += 1
        except OSError:
            pass
        m["audit"] = dict(counts, lines=lines)
        try:
            err = [l.rstrip("\n") for l in open(prefix + "-run.err", errors="replace")
                   if re.search(r"timeslice|error", l, re.I) and "event source" not in l]
        except OSError:
            err = []
        m["run_err"] = err[:40]
        m["run_err_lines"] = len(err)
        if meta.get("run_rc"):
            m["run_rc"] = int(meta["run_rc"])
    need = {"alone": ("online",), "solo_off": ("offline",)}.get(col, ("online", "offline"))
    missing = [n for n in need if n not in m]
    reason = meta.get("failed") or meta.get("error") or (
        "online rc " + meta["online_rc"] if meta.get("online_rc") else None)
    if missing or meta.get("failed"):
        m["status"] = "failed"
        m["reason"] = reason or ("no " + "/".join(missing) + " result")
    else:
        m["status"] = "ok"
        if reason:
            m["note"] = reason
    return m


def brief(m):
    s = [m["status"]]
    if "online" in m:
        o = m["online"]
        s.append("p50 %.2f p99 %.2f max %.2f ms (%d req)" % (o["p50_ms"], o["p99_ms"], o["max_ms"],
                                                            o["requests"]))
    if "offline" in m:
        f = m["offline"]
        s.append("off %.1f %s/s%s" % (f["items_per_s"] or 0, f["unit"], "" if f["window"] or
                                      m["column"] == "solo_off" else " (whole run)"))
    if "audit" in m:
        a = m["audit"]
        s.append("susp %d res %d ts %d" % (a["suspend"], a["resume"], a["timeslice"]))
    if "run_rc" in m:
        s.append("run rc %d" % m["run_rc"])
    if m["status"] != "ok":
        s.append("(" + m.get("reason", "") + ")")
    return "  ".join(s)


def stats(v):
    v = [x for x in v if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(st, digits=2):
    if not st:
        return "-"
    f = "%%.%df" % digits
    if st["n"] == 1 or st["min"] == st["max"]:
        return f % st["median"]
    return (f + " (" + f + "-" + f + ")") % (st["median"], st["min"], st["max"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brief")
    ap.add_argument("--pair")
    ap.add_argument("--out", default=".")
    ap.add_argument("--columns", default="")
    a = ap.parse_args()
    if a.brief:
        print(brief(measurement(a.brief)))
        return
    ms = []
    for p in sorted(glob.glob(os.path.join(a.out, "%s-*-r*-meta" % a.pair))):
        ms.append(measurement(p[: -len("-meta")]))
    cols = a.columns.split() or []
    for m in ms:
        if m["column"] not in cols:
            cols.append(m["column"])
    by = {c: sorted((m for m in ms if m["column"] == c), key=lambda m: m["round"]) for c in cols}
    ok = {c: [m for m in by[c] if m["status"] == "ok"] for c in cols}

    def col_vals(c, f):
        return [f(m) for m in ok[c]]

    def med(c, f):
        st = stats(col_vals(c, f))
        return st["median"] if st else None

    p99 = lambda m: m.get("online", {}).get("p99_ms")
    offr = lambda m: m.get("offline", {}).get("items_per_s")
    alone_p99, colo_off, solo_off = med("alone", p99) if "alone" in by else None, \
        med("colo", offr) if "colo" in by else None, med("solo_off", offr) if "solo_off" in by else None
    summary = {}
    for c in cols:
        s = {"rounds": len(by[c]), "ok": len(ok[c]),
             "p50_ms": stats(col_vals(c, lambda m: m.get("online", {}).get("p50_ms"))),
             "p95_ms": stats(col_vals(c, lambda m: m.get("online", {}).get("p95_ms"))),
             "p99_ms": stats(col_vals(c, p99)),
             "max_ms": stats(col_vals(c, lambda m: m.get("online", {}).get("max_ms"))),
             "offline_items_per_s": stats(col_vals(c, offr)),
             "p99_vs_alone": stats(col_vals(c, lambda m: p99(m) / alone_p99
                                            if p99(m) is not None and alone_p99 else None)),
             "offline_vs_colo": stats(col_vals(c, lambda m: offr(m) / colo_off
                                               if offr(m) is not None and colo_off else None)),
             "offline_vs_solo": stats(col_vals(c, lambda m: offr(m) / solo_off
                                               if offr(m) is not None and solo_off else None))}
        if c not in BASE:
            for k in ("suspend", "resume", "timeslice"):
                s[k] = stats(col_vals(c, lambda m, k=k: m.get("audit", {}).get(k)))
        summary[c] = s
    first = next((m for m in ms if "meta" in m), {"meta": {}})["meta"]
    unit = next((m["offline"]["unit"] for m in ms if m.get("offline")), "items")
    doc = {"pair": a.pair, "online_model": first.get("on_model"), "rate": first.get("rate"),
           "offline_model": first.get("off_model"), "secs": first.get("secs"), "unit": unit,
           "columns": cols, "summary": summary,
           "measurements": {c: by[c] for c in cols}}
    path = os.path.join(a.out, "%s-matrix.json" % a.pair)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)

    print("\n### Pair %s: online %s @%s req/s vs offline %s (SECS=%s; median (min-max) over ok rounds)\n"
          % (a.pair, doc["online_model"], doc["rate"], doc["offline_model"], doc["secs"]))
    print("| column | ok/rounds | p50 ms | p99 ms | max ms | offline %s/s | p99 / alone | "
          "offline / colo | offline / solo | suspends | resumes | timeslice changes |" % unit)
    print("|---" * 12 + "|")
    for c in cols:
        s = summary[c]
        print("| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c, s["ok"], s["rounds"], fmt(s["p50_ms"]), fmt(s["p99_ms"]), fmt(s["max_ms"], 1),
            fmt(s["offline_items_per_s"], 0), fmt(s["p99_vs_alone"]), fmt(s["offline_vs_colo"]),
            fmt(s["offline_vs_solo"]), fmt(s.get("suspend"), 0), fmt(s.get("resume"), 0),
            fmt(s.get("timeslice"), 0)))
    bad = [m for m in ms if m["status"] != "ok"]
    if bad:
        print("\nFailed measurements:")
        for m in bad:
            err = m["meta"].get("error")
            print("- %s: %s%s" % (m["tag"], m.get("reason"), " -- " + err if err and err != m.get("reason") else ""))
    notes = [m for m in ms if m["status"] == "ok" and (m.get("note") or m.get("run_rc") not in (None, 0))]
    if notes:
        print("\nNotes:")
    for m in notes:
        print("- %s: %s%s" % (m["tag"], m.get("note") or "", " run rc %s" % m.get("run_rc")
                              if m.get("run_rc") not in (None, 0) else ""))
    for c in cols:
        if c in BASE:
            continue
        seen = []
        for m in by[c]:
            for l in m.get("run_err", []):
                l = re.sub(r"\d+(\.\d+)?", "N", l)[:200]
                if l not in seen:
                    seen.append(l)
        if seen:
            print("\n%s: run.err lines with timeslice/error (%d kinds, digits as N):" % (c, len(seen)))
            for l in seen[:6]:
                print("    " + l)
    print("\nwritten: %s" % path)


if __name__ == "__main__":
    main()
