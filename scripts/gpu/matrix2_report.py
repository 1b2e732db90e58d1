"""The tables and verdicts of a scripts/gpu-matrix2.sh run: per pair, per column (phase).

Usage: matrix2_report.py PREFIX... [--noise F] [--json FILE]
  PREFIX = OUT/PAIR; writes PREFIX-matrix2.md and PREFIX-matrix2.json per pair, prints the
  tables; --json FILE also writes all pairs' results in one file.
Inputs per PREFIX: -phases.jsonl (each phase's window: round, phase, switched, start, end,
reload), -on.json (the first online service's per-request arrivals/latencies) and -on2.json,
-on3.json... (the others), -off<i>.json (per offline process: iteration end times; -off.json of
scripts/gpu-phases.sh is read too), -audit.jsonl and -clock (the audit clock's offset to the
epoch), -meta.json (the pair), and the group's -status.jsonl (G = PREFIX alone, OUT/all-<PAIRS>
for pairs run at once: meta "group"; the controller's status after every phase).
Per window: each online service's p50/p99 over its requests that arrived in it; offline
throughput = iterations of every offline process that ended in it x items per iteration /
window (their sum; each one, and each model's sum where the models differ, is also kept).
Offline processes of different units (pair I) are not summed: the offline figure is then the
mean over processes of each one's throughput / its median in colo (1.00 = colo). Per column:
median (min-max) over rounds; "pooled p99" = the p99 of all of a column's requests together;
p99 / alone = pooled p99 / the alone column's pooled p99, per service; with several services
"worst p99 / alone" = the largest, which the verdicts use in place of the pooled p99 (ms);
offline / colo and offline / ts_static = median offline / that column's median offline.
A window whose policy reload was refused (it ran the previous column's policy) is left out.
Audit, per column: pauses (suspend records inside the measurement windows), timeslice changes,
lever records ("action":"lever", e.g. the adaptive strategy's choice), adapt notes ("action":
"adapt") from each phase's switch on (they happen at the policy reload, before the window). A
record without ts_ns takes the time of the record before it in the file.
Verdict (per pair; the adaptive column against the others, pooled p99 and median offline):
  1. adaptive is not worse than colo on BOTH online pooled p99 and offline (worse = beyond
     --noise, default 0: strict)
  2. where a static lever (ts_static, ts_dynamic, pause) reaches pooled p99 <= 1.10x alone,
     adaptive does too, with offline >= 0.90x of the best-offline such lever's
  3. elsewhere (none reaches it): adaptive within 10% of the oracle, the static lever with the
     lowest pooled p99 (ties: higher offline), on both: p99 <= 1.10x and offline >= 0.90x its
  4. pair G only: adaptive's offline >= 0.98x colo's
Adaptive against no control and the oracle (on the worst service's pooled p99 / alone and the
median offline): "worse than no control on both" where its p99 ratio is above colo's AND its
offline below colo's; the oracle = among ts_static, ts_dynamic, pause and colo, the one with the
most offline whose every service's p99 is within the meta's budget (BUDGET; 1.10) x alone, else
the one with the best worst-service p99; whether adaptive is within 10% of it on both (p99
ratio <= 1.10x the oracle's, offline >= 0.90x).
Tool vs client: per line of G-status.jsonl ({"t", "round", "phase", "status"}) and per online
service of this pair (its pid; other pairs' pids are ignored), the controller's p50/p99
(status.requests[pid], ns) beside the client's over the requests that ENDED (arrival + latency)
in [t - 60 s, t], nearest-rank on both sides, the ratios tool / client and the counts; per
service the median and worst |ratio - 1| of p50 and p99 over the windows with >= 20 client
requests.
Real GPU, not emulated.

Two helpers of scripts/gpu-matrix2.sh's parallel mode (several pairs at once, one per GPU, under
one controller):
  matrix2_report.py --gpu-check G PREFIX...   the sanity check after every process is ready:
      each pair's pids (PREFIX-meta.json "pids") against nvidia-smi's compute apps (G-apps.csv:
      pid, gpu_bus_id; G-gpus.csv: index, pci.bus_id, uuid), or, for a pid nvidia-smi does not
      list, the /dev/nvidiaN it holds open (minor -> bus from /proc/driver/nvidia/gpus); prints
      the per-pid mapping, CUDA_VISIBLE_DEVICES and the controller's class (G-status.json
      "classes"); writes G-gpucheck.json and each pair's GPU identifiers into its meta
      ("gpu_check"). Exit 3 when nvidia-smi shows two pairs on one GPU (the caller aborts).
  matrix2_report.py --split-audit AUDIT PREFIX...   the one audit log, per pair: a record goes to
      the pair of its "pid"; one without a pid of ours goes by its GPU ("gpu_id" or "gpu"): the
      pair whose pids' records name that GPU, else the pair whose GPU identifiers (index, minor,
      bus, uuid from --gpu-check) match it; a record with neither goes to every pair (global);
      the rest to AUDIT's -unattributed.jsonl. A record without ts_ns gets the one before it in
      AUDIT (ts_inherited). Writes PREFIX-audit.jsonl.
"""
import argparse, bisect, collections, glob, json, os, re, statistics, sys

STATIC = ("ts_static", "ts_dynamic", "pause")
BUDGET, KEEP, ORACLE_TOL, G_KEEP = 1.10, 0.90, 0.10, 0.98


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else None


def med3(v):
    v = [x for x in v if x is not None and x == x]
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)


def fmt3(t, nd=2):
    return "-" if t[0] is None else f"{t[0]:.{nd}f} ({t[1]:.{nd}f}-{t[2]:.{nd}f})"


def r(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def load_audit(prefix):
    recs, last = [], 0
    try:
        lines = open(f"{prefix}-audit.jsonl").read().splitlines()
    except OSError:
        return recs
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("ts_ns"), (int, float)):
            last = rec["ts_ns"]
        else:
            rec = dict(rec, ts_ns=last, ts_inherited=True)
        recs.append(rec)
    return recs


def offline_files(prefix):
    fs = sorted(glob.glob(f"{glob.escape(prefix)}-off[0-9]*.json"),
                key=lambda f: int(re.search(r"-off(\d+)\.json$", f).group(1)))
    if not fs and os.path.exists(f"{prefix}-off.json"):
        fs = [f"{prefix}-off.json"]
    return [json.load(open(f)) for f in fs]


def online_files(prefix):
    """The pair's online services: PREFIX-on.json (the first), then -on2.json, -on3.json..."""
    more = [f for f in glob.glob(f"{glob.escape(prefix)}-on[0-9]*.json")
            if re.search(r"-on(\d+)\.json$", f)]
    more.sort(key=lambda f: int(re.search(r"-on(\d+)\.json$", f).group(1)))
    return [f"{prefix}-on.json"] + more


def nearest_rank(v, p):
    """The controller's percentile (observe/requests.rs): the ceil(p/100 n)-th smallest."""
    v = sorted(v)
    return v[max(0, -(-p * len(v) // 100) - 1)] if v else None


def group_prefix(prefix, meta):
    """Where the group's files are: OUT/all-<PAIRS> for pairs run at once, else the prefix."""
    group = str(meta.get("group") or "").split()
    if len(group) > 1:
        return os.path.join(os.path.dirname(prefix), "all-" + "".join(group))
    return prefix


def report(prefix, noise):
    phases = [json.loads(l) for l in open(f"{prefix}-phases.jsonl") if l.strip()]
    try:
        meta = json.load(open(f"{prefix}-meta.json"))
    except OSError:
        meta = {}
    svcs = []  # the online services: the JSON, a label, its pid
    meta_svcs = meta.get("services") or []
    for i, f in enumerate(online_files(prefix)):
        on = json.load(open(f))
        pid = on.get("pid") or (meta_svcs[i].get("pid") if i < len(meta_svcs) else None)
        if i == 0 and pid is None:
            pid = (meta.get("pids") or {}).get("online")
        svcs.append({"on": on, "model": on.get("model"), "rate": on.get("rate"), "pid": pid,
                     "file": os.path.basename(f)})
    models = [s["model"] for s in svcs]
    for i, s in enumerate(svcs):  # a model twice: "#n" by file order
        s["label"] = (str(s["model"]) if models.count(s["model"]) == 1
                      else f"{s['model']} #{models[:i + 1].count(s['model'])}")
    on = svcs[0]["on"]
    multi = len(svcs) > 1
    offs = offline_files(prefix)
    off_models = [o.get("model") for o in offs]
    units = sorted(set(str(o.get("unit")) for o in offs))
    mixed = len(units) > 1  # different units: a sum means nothing (see below)
    by_model = len(set(off_models)) > 1
    pair = meta.get("pair") or os.path.basename(prefix)
    try:
        offset = float(open(f"{prefix}-clock").read())  # epoch - monotonic
    except (OSError, ValueError):
        offset = None
    audit = load_audit(prefix)
    at = lambda rec: rec.get("ts_ns", 0) / 1e9 + offset

    rows, refused = {}, collections.Counter()
    for w in phases:
        if w.get("reload") == "refused":  # the window ran the previous column's policy
            refused[w["phase"]] += 1
            rows.setdefault(w["phase"], [])
            continue
        t0, t1 = w["start"], w["end"]
        sv = []
        for s in svcs:
            lat = [l for a, l in zip(s["on"].get("arrivals", []), s["on"].get("lat_ms", []))
                   if t0 <= a < t1]
            sv.append({"lat": lat, "requests": len(lat), "p50": pct(lat, 0.5),
                       "p99": pct(lat, 0.99)})
        per = [sum(1 for e in o.get("ends", []) if t0 <= e < t1) * o["items_per_iteration"]
               / (t1 - t0) for o in offs]
        m = {"round": w["round"], "svc": sv, **{k: sv[0][k] for k in ("lat", "requests", "p50",
                                                                          "p99")},
             "offline": sum(per) if per else None, "per": per,
             "reload": w.get("reload", "unknown"), "levers": [], "adapt": 0}
        if by_model:
            m["per_model"] = {x: sum(v for v, y in zip(per, off_models) if y == x)
                              for x in dict.fromkeys(off_models)}
        if offset is not None:
            sw = w.get("switched", t0) - 0.05  # the epoch mapping is one reading: allow 50 ms
            m["pauses"] = sum(1 for x in audit
                              if x.get("action") == "suspend" and t0 <= at(x) < t1)
            since = [x for x in audit if sw <= at(x) < t1]
            m["timeslice"] = sum(1 for x in since if x.get("action") == "timeslice")
            m["levers"] = [x for x in since if x.get("action") == "lever"]
            m["adapt"] = sum(1 for x in since if x.get("action") == "adapt")
        rows.setdefault(w["phase"], []).append(m)

    # Offline processes of different units (pair I: TFLOP/s, images/s, tokens/s): a window's
    # offline figure is the mean over processes of each one's throughput relative to its median
    # in colo (the reference of no control; where there is no colo column: its best column's
    # median), so 1.00 = colo's throughput for every process.
    ref = None
    if mixed:
        def col_med(col, i):
            return med3([m["per"][i] for m in rows.get(col, [])])[0]
        ref = []
        for i in range(len(offs)):
            x = col_med("colo", i)
            if not x:
                x = max((col_med(c, i) or 0 for c in rows if c != "alone"), default=0)
            ref.append(x or None)
        for ms in rows.values():
            for m in ms:
                rel = [v / x for v, x in zip(m["per"], ref) if x]
                m["offline"] = sum(rel) / len(rel) if rel else None

    cols = {}
    for col, ms in rows.items():
        levers = [x for m in ms for x in m["levers"]]
        sc = []
        for i, s in enumerate(svcs):
            allat = [l for m in ms for l in m["svc"][i]["lat"]]
            sc.append({"label": s["label"], "model": s["model"], "rate": s["rate"],
                       "requests": sum(m["svc"][i]["requests"] for m in ms),
                       "p50": med3([m["svc"][i]["p50"] for m in ms]),
                       "p99": med3([m["svc"][i]["p99"] for m in ms]),
                       "pooled_p99": pct(allat, 0.99), "max": max(allat, default=None)})
        c = {"rounds": len(ms), "requests": sc[0]["requests"], "p50": sc[0]["p50"],
             "p99": sc[0]["p99"], "pooled_p99": sc[0]["pooled_p99"], "max": sc[0]["max"],
             "offline": med3([m["offline"] for m in ms]),
             "offline_per_process": [med3([m["per"][i] for m in ms])[0]
                                     for i in range(len(offs))],
             "pauses": sum(m.get("pauses", 0) for m in ms),
             "timeslice_changes": sum(m.get("timeslice", 0) for m in ms),
             "lever_records": len(levers),
             "levers": dict(collections.Counter(str(x.get("lever", x.get("to"))) for x in levers)),
             "lever_by_round": {str(m["round"]): [str(x.get("lever", x.get("to"))) for x in m["levers"]]
                                for m in ms if m["levers"]},
             "lever_reasons": [str(x.get("reason", ""))[:160] for x in levers[:6]],
             "adapt_notes": sum(m["adapt"] for m in ms),
             "reloads": dict(collections.Counter(m["reload"] for m in ms))}
        if multi:
            c["services"] = sc
        if by_model:
            c["offline_per_model"] = {x: med3([m["per_model"][x] for m in ms])[0]
                                      for x in dict.fromkeys(off_models)}
        if refused[col]:
            c["reloads"]["refused"] = refused[col]
        c["_sc"] = sc
        cols[col] = c
    g = lambda col, k: cols[col][k] if col in cols else None
    colo_off = (g("colo", "offline") or (None,))[0]
    ts_off = (g("ts_static", "offline") or (None,))[0]
    for col, c in cols.items():
        for i, s in enumerate(c["_sc"]):
            s["p99_vs_alone"] = ratio(s["pooled_p99"],
                                      cols["alone"]["_sc"][i]["pooled_p99"] if "alone" in cols
                                      else None)
        rs = [s["p99_vs_alone"] for s in c["_sc"]]
        c["p99_vs_alone"] = rs[0]
        # The worst service's (None where one has no figure: a service without requests is no
        # better than the worst).
        c["worst_p99_vs_alone"] = None if None in rs else max(rs)
        c["offline_vs_colo"] = ratio(c["offline"][0], colo_off) if col != "alone" else None
        c["offline_vs_ts_static"] = ratio(c["offline"][0], ts_off) if col != "alone" else None
        # judge()'s p99: the pooled p99 (ms) of the one service, or the worst service's p99 /
        # alone where there are several (their latencies differ by orders of magnitude).
        c["judge_p99"] = c["worst_p99_vs_alone"] if multi else c["pooled_p99"]
    for c in cols.values():
        del c["_sc"]

    verdict = judge(pair, cols, noise, multi)
    budget = meta.get("budget") if isinstance(meta.get("budget"), (int, float)) else BUDGET
    vs = versus(pair, cols, budget)
    busy = []
    for i, s in enumerate(svcs):
        alone_lat = [l for m in rows.get("alone", []) for l in m["svc"][i]["lat"]]
        s["busy_alone"] = ((s["rate"] or 0) * statistics.mean(alone_lat) / 1e3 if alone_lat
                           else None)
        busy.append(s["busy_alone"])
    unit = offs[0].get("unit") if offs else None
    n = len(offs)
    offname = (" + ".join(str(x) for x in off_models) if by_model else
               f"{off_models[0] if offs else '?'}{f' x{n}' if n > 1 else ''}")
    if mixed:
        offunit = (f"offline relative to colo (units differ: "
                   + ", ".join(f"{o.get('model')} {o.get('unit')}/s" for o in offs)
                   + "; the mean over processes of each one's throughput / its colo median; "
                   "per model in its own unit)")
    else:
        offunit = (f"offline in {unit}/s{', the sum over processes' if n > 1 else ''}"
                   + ("; per model" if by_model else ""))
    if multi:
        onname = " + ".join(f"{s['label']} @{s['rate']}/s" for s in svcs)
        busytxt = (" + ".join(r(b) for b in busy) + " = "
                   + r(sum(busy) if None not in busy else None))
        p99txt = ("p99 / alone per service from pooled p99s (each service against its own "
                  "alone); verdicts on the worst service")
    else:
        onname, busytxt = f"{on.get('model')} @{on.get('rate')}/s", r(busy[0])
        p99txt = "p99 / alone from pooled p99s"
    head = (f"pair {pair}: online {onname} vs offline {offname} (real GPU, not emulated; median "
            f"(min-max) over rounds; {p99txt}; {offunit}; online busy alone (rate x mean "
            f"latency) {busytxt})")
    group = str(meta.get("group") or "").split()
    if len(group) > 1:
        others = " ".join(x for x in group if x != pair)
        head += (f"; run at once with {others} under one controller"
                 + (f", on GPU {meta['gpu']}" if meta.get("gpu") is not None else "")
                 + " (audit records: this pair's, by pid or GPU)")
    offhdr = "offline x colo" if mixed else f"offline {unit}/s"
    if multi:
        onhdr = [f"{s['label']} {k}" for s in svcs for k in
                 ("requests", "p50 ms", "p99 ms", "pooled p99", "p99 / alone")] + \
                ["worst p99 / alone"]
    else:
        onhdr = ["requests", "p50 ms", "p99 ms", "pooled p99", "p99 / alone"]
    # Per process where it says more than per model (processes of one model: pair F).
    per_proc = n > 1 and not (by_model and len(set(off_models)) == n)
    hdr = ["column", "rounds"] + onhdr + [offhdr] + (["per process"] if per_proc else []) + \
          (["per model"] if by_model else []) + \
          ["offline / colo", "offline / ts_static", "pauses", "timeslice changes",
           "lever records", "reloads"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for col, c in cols.items():
        nd = 0 if (c["offline"][0] or 0) >= 100 else 2
        ndv = lambda v: 0 if (v or 0) >= 100 else 2
        cells = [col, str(c["rounds"])]
        for s in (c["services"] if multi else [c]):
            cells += [str(s["requests"]), fmt3(s["p50"]), fmt3(s["p99"]), r(s["pooled_p99"]),
                      r(s["p99_vs_alone"])]
        if multi:
            cells.append(r(c["worst_p99_vs_alone"]))
        cells.append(fmt3(c["offline"], nd))
        if per_proc:
            cells.append(" + ".join(r(v, ndv(v) if mixed else nd)
                                    for v in c["offline_per_process"]))
        if by_model:
            um = {o.get("model"): o.get("unit") for o in offs}
            cells.append("; ".join(f"{k} {r(v, ndv(v))} {um.get(k)}/s"
                                   for k, v in c["offline_per_model"].items()))
        rl = c["reloads"]
        cells += [r(c["offline_vs_colo"]), r(c["offline_vs_ts_static"]), str(c["pauses"]),
                  str(c["timeslice_changes"]),
                  (f"{c['lever_records']}: " + ", ".join(f"{k} x{v}" for k, v in
                                                          c["levers"].items())
                   if c["lever_records"] else "0"),
                  "ok" if set(rl) == {"ok"} else ", ".join(f"{k} x{v}" for k, v in rl.items())]
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for col, c in cols.items():
        if c["lever_records"]:
            notes.append(f"- {col}: lever records by round "
                         + "; ".join(f"{k}: {', '.join(v)}" for k, v in
                                     c["lever_by_round"].items())
                         + (f" (reasons: {' | '.join(c['lever_reasons'])})"
                            if any(c["lever_reasons"]) else ""))
        elif col == "adaptive":
            notes.append(f"- adaptive: no lever record ({c['adapt_notes']} adapt notes)")
        if "refused" in c["reloads"]:
            notes.append(f"- {col}: the policy reload was REFUSED in {c['reloads']['refused']} "
                         "round(s): those windows ran the previous column's policy and are left "
                         "out of every figure")
    tvc = tool_vs_client(group_prefix(prefix, meta), svcs)
    md = head + "\n\n" + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes
                                                   else "") + "\n" + verdict["line"] + "\n" + \
        "\n".join(vs["lines"]) + "\n\n" + tvc["md"]
    out = {"prefix": prefix, "pair": pair, "meta": meta, "model_on": on.get("model"),
           "rate": on.get("rate"), "model_off": offs[0].get("model") if offs else None,
           "offline_processes": n, "unit": unit, "online_busy_alone": busy[0],
           "services": [{k: s[k] for k in ("label", "model", "rate", "pid", "file",
                                           "busy_alone")} for s in svcs],
           "models_off": off_models, "offline_mixed_units": mixed,
           "offline_reference": ref, "columns": cols, "verdict": verdict, "versus": vs,
           "tool_vs_client": {k: v for k, v in tvc.items() if k != "md"}}
    open(f"{prefix}-matrix2.md", "w").write(md)
    json.dump(out, open(f"{prefix}-matrix2.json", "w"), indent=1)
    print(md)
    return out


def judge(pair, cols, noise, multi=False):
    """The per-pair verdict: the goals (module docstring), each pass/fail/n/a, with figures.
    With several online services the p99 is the worst service's p99 / its alone ("judge_p99")."""
    P = lambda c: cols[c]["judge_p99"] if c in cols else None
    O = lambda c: cols[c]["offline"][0] if c in cols else None
    u = "x alone (worst service)" if multi else " ms"
    goals, ok = {}, True
    if "adaptive" not in cols:
        return {"pass": None, "goals": {}, "line": f"verdict {pair}: n/a (no adaptive column)"}
    pa, oa = P("adaptive"), O("adaptive")
    if "refused" in cols["adaptive"]["reloads"]:
        goals["policy"] = {"pass": False, "text": "the adaptive policy was refused on reload"}
    if pa is None or oa is None:
        return {"pass": None, "goals": goals, "line": f"verdict {pair}: n/a (adaptive: no data)"}
    if "colo" in cols and P("colo") is not None and O("colo"):
        worse_p = pa > P("colo") * (1 + noise)
        worse_o = oa < O("colo") * (1 - noise)
        goals["not_worse_than_colo"] = {
            "pass": not (worse_p and worse_o),
            "text": f"vs colo: p99 {pa:.2f} vs {P('colo'):.2f}{u}, offline "
                    f"{oa / O('colo'):.2f}x"}
    statics = [s for s in STATIC if s in cols and P(s) is not None and O(s) is not None]
    alone = P("alone")
    if statics and alone:
        reach = [s for s in statics if P(s) <= BUDGET * alone]
        if reach:
            ref = max(reach, key=O)
            goals["budget"] = {
                "pass": pa <= BUDGET * alone and oa >= KEEP * O(ref),
                "text": f"{'/'.join(reach)} reach{'es' if len(reach) == 1 else ''} "
                        f"<= {BUDGET:.2f}x alone ({ref} {P(ref) / alone:.2f}x, offline "
                        f"{O(ref):.4g}); adaptive {pa / alone:.2f}x, offline "
                        f"{oa / O(ref):.2f}x {ref}'s (needs <= {BUDGET:.2f}x, >= {KEEP:.2f}x)"}
        else:
            orc = min(statics, key=lambda s: (P(s), -O(s)))
            goals["oracle"] = {
                "pass": pa <= (1 + ORACLE_TOL) * P(orc) and oa >= (1 - ORACLE_TOL) * O(orc),
                "text": f"no static lever reaches {BUDGET:.2f}x alone; oracle {orc} "
                        f"({P(orc) / alone:.2f}x alone); adaptive p99 {pa / P(orc):.2f}x, "
                        f"offline {oa / O(orc):.2f}x the oracle's (needs <= "
                        f"{1 + ORACLE_TOL:.2f}x, >= {1 - ORACLE_TOL:.2f}x)"}
    if pair == "G" and O("colo"):
        goals["G_offline"] = {"pass": oa >= G_KEEP * O("colo"),
                              "text": f"offline {oa / O('colo'):.3f}x colo (needs >= {G_KEEP})"}
    ok = all(v["pass"] for v in goals.values()) if goals else None
    line = (f"verdict {pair}: {'PASS' if ok else 'FAIL' if ok is not None else 'n/a'} -- "
            + "; ".join(f"{k} {'ok' if v['pass'] else 'FAILED'} ({v['text']})"
                        for k, v in goals.items()))
    return {"pass": ok, "goals": goals, "noise": noise, "line": line}


def versus(pair, cols, budget):
    """The adaptive column against no control (colo) and against the oracle (module docstring),
    on the worst service's pooled p99 / alone and the median offline throughput."""
    W = lambda c: cols[c]["worst_p99_vs_alone"] if c in cols else None
    O = lambda c: cols[c]["offline"][0] if c in cols else None
    out, lines = {}, []
    if W("adaptive") is None or O("adaptive") is None:
        why = "no adaptive column" if "adaptive" not in cols else "adaptive: no data or no alone"
        return {"lines": [f"adaptive vs no control / oracle {pair}: n/a ({why})"]}
    wa, oa = W("adaptive"), O("adaptive")
    if W("colo") is not None and O("colo"):
        worse = wa > W("colo") and oa < O("colo")
        out["vs_colo"] = {"worse_on_both": worse, "worst_p99_vs_alone": [wa, W("colo")],
                          "offline_vs_colo": oa / O("colo")}
        lines.append(f"adaptive vs no control (colo) {pair}: "
                     f"{'WORSE than' if worse else 'not worse than'} no control on both"
                     f" (worst service p99 {wa:.2f}x alone vs colo's {W('colo'):.2f}x; offline "
                     f"{oa / O('colo'):.2f}x colo's)")
    else:
        lines.append(f"adaptive vs no control (colo) {pair}: n/a (colo: no data)")
    cands = [c for c in ("ts_static", "ts_dynamic", "pause", "colo")
             if W(c) is not None and O(c) is not None]
    if cands:
        within = [c for c in cands if W(c) <= budget]  # every service's p99 within budget
        orc = (max(within, key=O) if within else min(cands, key=lambda c: (W(c), -O(c))))
        rp, ro = ratio(wa, W(orc)), ratio(oa, O(orc))
        ok = rp is not None and ro is not None and rp <= 1 + ORACLE_TOL and ro >= 1 - ORACLE_TOL
        how = (f"the most offline among {'/'.join(within)}: every service's p99 <= "
               f"{budget:.2f}x alone" if within else
               f"none of {'/'.join(cands)} has every service's p99 <= {budget:.2f}x alone: the "
               "best worst-service p99")
        out["vs_oracle"] = {"oracle": orc, "within_budget": within, "budget": budget,
                            "p99_vs_oracle": rp, "offline_vs_oracle": ro, "within_10pct": ok}
        lines.append(f"adaptive vs the oracle {pair}: {orc} ({how}; {W(orc):.2f}x alone, offline "
                     f"{r(O(orc), 0 if O(orc) >= 100 else 2)}); adaptive p99 {r(rp)}x, offline "
                     f"{r(ro)}x the oracle's: {'within' if ok else 'NOT within'} "
                     f"{ORACLE_TOL:.0%} on both")
    else:
        lines.append(f"adaptive vs the oracle {pair}: n/a (no static column with data)")
    out["lines"] = lines
    return out


def tool_vs_client(gprefix, svcs, min_requests=20):
    """The controller's request latency (G-status.jsonl: status.requests[pid], over the 60 s
    before each phase end) beside each service's own over the same window [t - 60 s, t] (its
    requests that ended in it: arrival + latency), per status line and service."""
    path = f"{gprefix}-status.jsonl"
    res = {"source": path, "rows": [], "summary": {}}
    try:
        recs = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError) as e:
        res["md"] = f"tool vs client: no status lines ({path}: {e})\n"
        return res
    ends = []
    for s in svcs:
        e = sorted((a + l / 1e3, l) for a, l in zip(s["on"].get("arrivals", []),
                                                    s["on"].get("lat_ms", [])))
        ends.append(e)
    ms = lambda ns: ns / 1e6
    for rec in recs:
        t = rec.get("t")
        req = ((rec.get("status") or {}).get("requests") or {}) if isinstance(
            rec.get("status"), dict) else {}
        for s, e in zip(svcs, ends):
            if s["pid"] is None or t is None:
                continue
            lo = bisect.bisect_left(e, (t - 60.0, -1.0))
            hi = bisect.bisect_right(e, (t, float("inf")))
            cl = [l for _, l in e[lo:hi]]
            tool = req.get(str(s["pid"]))
            tn = tool.get("count") if isinstance(tool, dict) else None
            t50 = ms(tool["p50_ns"]) if tn else None
            t99 = ms(tool["p99_ns"]) if tn else None
            c50, c99 = nearest_rank(cl, 50), nearest_rank(cl, 99)
            res["rows"].append({"t": t, "round": rec.get("round"), "phase": rec.get("phase"),
                                "service": s["label"], "pid": s["pid"], "tool_count": tn,
                                "tool_p50_ms": t50, "tool_p99_ms": t99, "client_count": len(cl),
                                "client_p50_ms": c50, "client_p99_ms": c99,
                                "p50_ratio": ratio(t50, c50), "p99_ratio": ratio(t99, c99),
                                "in_status": tool is not None})
    hdr = ["round", "phase", "service", "pid", "tool n", "client n", "tool p50 ms",
           "client p50 ms", "p50 tool / client", "tool p99 ms", "client p99 ms",
           "p99 tool / client"]
    lines = [f"tool vs client ({os.path.basename(path)}: the controller's per-pid request "
             f"latency over the 60 s before each phase end; the client's over the requests that "
             f"ended in [t - 60 s, t]; nearest-rank percentiles on both sides)", "",
             "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for x in res["rows"]:
        lines.append("| " + " | ".join([
            str(x["round"]), str(x["phase"]), x["service"], str(x["pid"]),
            "not in status" if not x["in_status"] else str(x["tool_count"]),
            str(x["client_count"]), r(x["tool_p50_ms"]), r(x["client_p50_ms"]),
            r(x["p50_ratio"]), r(x["tool_p99_ms"]), r(x["client_p99_ms"]),
            r(x["p99_ratio"])]) + " |")
    if not res["rows"]:
        lines.append("(no status line names this pair's services)")
    lines.append("")
    for s in svcs:
        ok = [x for x in res["rows"] if x["pid"] == s["pid"] and x["client_count"] >= min_requests
              and x["p50_ratio"] is not None and x["p99_ratio"] is not None]
        d50 = [abs(x["p50_ratio"] - 1) for x in ok]
        d99 = [abs(x["p99_ratio"] - 1) for x in ok]
        sm = {"pid": s["pid"], "windows": len(ok), "min_client_requests": min_requests,
              "p50_dev_median": statistics.median(d50) if d50 else None,
              "p50_dev_worst": max(d50, default=None),
              "p99_dev_median": statistics.median(d99) if d99 else None,
              "p99_dev_worst": max(d99, default=None)}
        res["summary"][s["label"]] = sm
        lines.append(f"- {s['label']} (pid {s['pid']}): " + (
            f"{len(ok)} window(s) with >= {min_requests} client requests: |tool / client - 1| "
            f"p50 median {sm['p50_dev_median']:.3f}, worst {sm['p50_dev_worst']:.3f}; p99 "
            f"median {sm['p99_dev_median']:.3f}, worst {sm['p99_dev_worst']:.3f}" if ok else
            f"no window with >= {min_requests} client requests and a tool figure"))
    res["md"] = "\n".join(lines) + "\n"
    return res


def norm_bus(b):
    """A PCI bus id in one spelling: "00000000:1B:00.0" and "0000:1b:00.0" -> "0000:1b:00.0"."""
    parts = str(b).strip().lower().split(":")
    try:
        if len(parts) == 3:
            return f"{int(parts[0], 16):04x}:{int(parts[1], 16):02x}:{parts[2]}"
        if len(parts) == 2:
            return f"0000:{int(parts[0], 16):02x}:{parts[1]}"
    except ValueError:
        pass
    return str(b).strip().lower()


def csv_rows(path):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    return [[c.strip() for c in l.split(",")] for l in lines if l.strip()]


def read_meta(prefix):
    try:
        return json.load(open(f"{prefix}-meta.json"))
    except (OSError, ValueError):
        return {}


def meta_pids(meta):
    """pid -> role: "online" (the first service), "online 2"..., "offline 1"..."""
    p = meta.get("pids") or {}
    out = {}
    svc = p.get("services") or ([p["online"]] if isinstance(p.get("online"), int) else [])
    for i, x in enumerate(svc, 1):
        if isinstance(x, int):
            out[x] = "online" if i == 1 else f"online {i}"
    for i, x in enumerate(p.get("offline") or [], 1):
        out[x] = f"offline {i}"
    return out


def driver_minors(root="/proc/driver/nvidia/gpus"):
    """bus id -> device minor (/dev/nvidiaN), from the driver's per-GPU information files."""
    out = {}
    for f in glob.glob(f"{root}/*/information"):
        txt = open(f).read()
        m = re.search(r"Device Minor:\s*(\d+)", txt)
        if m:
            out[norm_bus(os.path.basename(os.path.dirname(f)))] = int(m.group(1))
    return out


def proc_minors(pid):
    """The /dev/nvidiaN (N: minor) a process holds open; None if unreadable."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    out = set()
    for fd in fds:
        try:
            m = re.fullmatch(r"/dev/nvidia(\d+)", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            out.add(int(m.group(1)))
    return out


def proc_env(pid, key="CUDA_VISIBLE_DEVICES"):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return "?"
    for e in env:
        if e.startswith(key.encode() + b"="):
            return e.split(b"=", 1)[1].decode(errors="replace")
    return "(unset)"


def gpu_check(group, prefixes):
    """The parallel mode's sanity check (module docstring): 0 ok, 3 two pairs share a GPU."""
    gpus = {}  # bus -> {index, uuid, minor}
    for row in csv_rows(f"{group}-gpus.csv"):
        if len(row) >= 3 and row[0].isdigit():
            gpus[norm_bus(row[1])] = {"index": int(row[0]), "bus": norm_bus(row[1]),
                                      "uuid": row[2]}
    minors = driver_minors()
    for bus, mi in minors.items():
        gpus.setdefault(bus, {"index": None, "bus": bus, "uuid": None})["minor"] = mi
    by_minor = {g["minor"]: bus for bus, g in gpus.items() if g.get("minor") is not None}
    apps = collections.defaultdict(set)  # pid -> buses
    for row in csv_rows(f"{group}-apps.csv"):
        if len(row) >= 2 and row[0].isdigit():
            apps[int(row[0])].add(norm_bus(row[1]))
    try:
        classes = json.load(open(f"{group}-status.json")).get("classes") or {}
    except (OSError, ValueError, AttributeError):
        classes = None
    name = lambda bus: (f"GPU {gpus[bus]['index']} ({bus})" if bus in gpus and
                        gpus[bus]["index"] is not None else bus)

    pairs, rows, warnings = {}, [], []
    for prefix in prefixes:
        meta = read_meta(prefix)
        pair = meta.get("pair") or os.path.basename(prefix)
        want = meta.get("gpu")
        want_bus = next((b for b, g in gpus.items() if g["index"] == want), None)
        smi, fdb, pids = set(), set(), {}
        for pid, role in meta_pids(meta).items():
            buses, source = set(apps.get(pid, ())), "nvidia-smi"
            if buses:
                smi |= buses
            else:
                mins = proc_minors(pid)
                buses = {by_minor.get(m, f"minor {m}") for m in (mins or ())}
                source = ("/dev/nvidiaN" if buses else "unknown" if mins is not None
                          else "exited")
                fdb |= buses
            cls = None if classes is None else classes.get(str(pid), "(not classified)")
            pids[pid] = {"role": role, "gpus": sorted(buses), "source": source,
                         "cuda_visible_devices": proc_env(pid), "class": cls}
            rows.append((pair, pid, role, pids[pid]["cuda_visible_devices"],
                         ", ".join(name(b) for b in sorted(buses)) or "-", source,
                         cls if cls is not None else "(no status.json)"))
            if role.startswith("online") and cls is not None and cls != "online":
                warnings.append(f"pair {pair}: online pid {pid} is classified {cls!r}, "
                                "not 'online'")
            if source == "exited":
                warnings.append(f"pair {pair}: pid {pid} ({role}) has exited")
            elif source == "unknown":
                warnings.append(f"pair {pair}: pid {pid} ({role}): GPU unknown (not listed by "
                                "nvidia-smi, no /dev/nvidiaN open): cannot verify")
        if want_bus and smi and smi != {want_bus}:
            warnings.append(f"pair {pair}: expected on GPU {want} ({want_bus}), nvidia-smi "
                            f"shows {', '.join(name(b) for b in sorted(smi))}")
        if len(smi | fdb) > 1:
            warnings.append(f"pair {pair}: its processes are on several GPUs: "
                            f"{', '.join(name(b) for b in sorted(smi | fdb))}")
        pairs[pair] = {"prefix": prefix, "gpu": want, "smi": smi, "fd": fdb, "pids": pids}

    shared, unsure = [], []
    names = list(pairs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = pairs[a]["smi"] & pairs[b]["smi"]
            if both:
                shared.append(f"pairs {a} and {b} share {', '.join(name(x) for x in both)} "
                              "(nvidia-smi)")
            loose = ((pairs[a]["smi"] | pairs[a]["fd"]) & (pairs[b]["smi"] | pairs[b]["fd"])) - both
            if loose:
                unsure.append(f"pairs {a} and {b} both hold {', '.join(name(x) for x in loose)} "
                              "open (/dev/nvidiaN; nvidia-smi did not list them): not proven")
    w = max([len(str(r[3])) for r in rows] + [20])
    print(f"GPU check ({len(names)} pair(s); {len(gpus)} GPU(s) listed; nvidia-smi lists "
          f"{len(apps)} compute pid(s)):")
    print(f"  {'pair':4} {'pid':>8} {'role':10} {'CUDA_VISIBLE_DEVICES':{w}} {'gpu':28} "
          f"{'source':13} class")
    for r_ in rows:
        print(f"  {r_[0]:4} {r_[1]:>8} {r_[2]:10} {r_[3]:{w}} {r_[4]:28} {r_[5]:13} {r_[6]}")
    if any(v["class"] not in (None, "offline") and not v["role"].startswith("online")
           for p in pairs.values() for v in p["pids"].values()):
        print("  (an offline pid's class is what the first column's policy gives it: alone and "
              "colo have no offline rule)")
    for x in warnings + unsure:
        print(f"  warning: {x}")
    for x in shared:
        print(f"  SHARED GPU: {x}")
    ok = not shared
    print(f"GPU check: {'ok: every pair on its own GPU' if ok and not unsure and all(p['smi'] for p in pairs.values()) else 'ok (not every pid verified by nvidia-smi)' if ok else 'FAILED: two pairs on one GPU'}")
    for pair, p in pairs.items():
        ids = [gpus.get(b, {"bus": b}) for b in sorted(p["smi"] | p["fd"])]
        meta = read_meta(p["prefix"])
        meta["gpu_check"] = {
            "pids": {str(k): v for k, v in p["pids"].items()},
            "bus_ids": [g.get("bus") for g in ids], "indices": [g.get("index") for g in ids],
            "uuids": [g.get("uuid") for g in ids], "minors": [g.get("minor") for g in ids]}
        json.dump(meta, open(f"{p['prefix']}-meta.json", "w"))
    json.dump({"ok": ok, "shared": shared, "warnings": warnings + unsure,
               "gpus": list(gpus.values()),
               "pairs": {k: {"gpu": v["gpu"], "nvidia_smi": sorted(v["smi"]),
                             "dev_nvidia": sorted(v["fd"]),
                             "pids": {str(a): b for a, b in v["pids"].items()}}
                         for k, v in pairs.items()}},
              open(f"{group}-gpucheck.json", "w"), indent=1)
    return 0 if ok else 3


def gpu_value(rec):
    """A record's GPU as an int where it reads as one (the controller writes gpu_id numbers)."""
    v = rec.get("gpu_id", rec.get("gpu"))
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return v.strip().lower()
    return v


def id_candidates(meta):
    """What a pair's GPU may be called in a record: index, minor, PCI bus number, bus:dev.fn as
    one number, bus id, uuid."""
    gc = meta.get("gpu_check") or {}
    out = set()
    for x in (gc.get("indices") or []) + (gc.get("minors") or []) + [meta.get("gpu")]:
        if isinstance(x, int):
            out.add(x)
    for b in gc.get("bus_ids") or []:
        if not b:
            continue
        out.add(str(b).lower())
        m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-7])", str(b).lower())
        if m:
            bus, dev, fn = int(m.group(2), 16), int(m.group(3), 16), int(m.group(4))
            out |= {bus, (bus << 8) | (dev << 3) | fn}
    for u in gc.get("uuids") or []:
        if u:
            out.add(str(u).lower())
    return out


def split_audit(audit, prefixes):
    """One audit log per pair (module docstring)."""
    metas = {p: read_meta(p) for p in prefixes}
    pid2p = {pid: p for p, m in metas.items() for pid in meta_pids(m)}
    recs, last = [], 0
    try:
        lines = open(audit).read().splitlines()
    except OSError as e:
        print(f"audit split: {e}")
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("ts_ns"), (int, float)):
            last = rec["ts_ns"]
        else:
            rec = dict(rec, ts_ns=last, ts_inherited=True)
        recs.append(rec)
    learned = collections.defaultdict(set)  # GPU value -> prefixes, from records with our pids
    for rec in recs:
        g = gpu_value(rec)
        if g is not None and rec.get("pid") in pid2p:
            learned[g].add(pid2p[rec["pid"]])
    for g, ps in learned.items():
        if len(ps) > 1:
            print(f"audit split: warning: GPU {g!r} carries records of the pids of "
                  f"{', '.join(os.path.basename(p) for p in sorted(ps))}: pairs share a GPU?")
    cands = {p: id_candidates(m) for p, m in metas.items()}
    out = {p: [] for p in prefixes}
    unattributed, how = [], collections.Counter()
    for rec in recs:
        pid, g = rec.get("pid"), gpu_value(rec)
        dest = None
        if pid in pid2p:
            dest, why = [pid2p[pid]], "pid"
        elif g is not None:
            ps = learned.get(g, set())
            if len(ps) != 1:
                ps = {p for p, c in cands.items() if g in c}
            if len(ps) != 1 and len(prefixes) == 1:
                ps = set(prefixes)
            dest, why = (sorted(ps), "gpu") if len(ps) == 1 else (None, None)
        elif pid is None:
            dest, why = list(prefixes), "global"
        if dest is None:
            unattributed.append(rec)
            continue
        how[why] += 1
        for p in dest:
            out[p].append(rec)
    for p, rs in out.items():
        with open(f"{p}-audit.jsonl", "w") as f:
            for rec in rs:
                f.write(json.dumps(rec) + "\n")
    base = audit[:-len(".jsonl")] if audit.endswith(".jsonl") else audit
    with open(f"{base}-unattributed.jsonl", "w") as f:
        for rec in unattributed:
            f.write(json.dumps(rec) + "\n")
    print(f"audit split: {len(recs)} record(s) of {audit}: "
          + ", ".join(f"{os.path.basename(p)} {len(rs)}" for p, rs in out.items())
          + f" (by pid {how['pid']}, by GPU {how['gpu']}, global {how['global']} to every pair)"
          + (f"; {len(unattributed)} unattributed (GPUs "
             f"{sorted(set(str(gpu_value(x)) for x in unattributed))[:8]}, pids "
             f"{sorted(set(str(x.get('pid')) for x in unattributed))[:8]}) -> "
             f"{base}-unattributed.jsonl" if unattributed else ""))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefix", nargs="+")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="goal 1: 'worse' means beyond this relative margin (default 0)")
    ap.add_argument("--json", default=None, help="also write all pairs' results to this file")
    ap.add_argument("--gpu-check", metavar="G", default=None,
                    help="gpu-matrix2.sh's sanity check for group prefix G (exit 3: shared GPU)")
    ap.add_argument("--split-audit", metavar="AUDIT", default=None,
                    help="split this audit log into PREFIX-audit.jsonl per pair")
    a = ap.parse_args()
    if a.gpu_check:
        return gpu_check(a.gpu_check, a.prefix)
    if a.split_audit:
        return split_audit(a.split_audit, a.prefix)
    res = [report(p, a.noise) for p in a.prefix]
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    if len(res) > 1:
        print("\n".join(line for x in res for line in [x["verdict"]["line"]] + x["versus"]["lines"]))


if __name__ == "__main__":
    sys.exit(main())
