"""The tables and verdicts of a scripts/gpu-matrix2.sh run: per pair, per column (phase).

Usage: matrix2_report.py PREFIX... [--noise F] [--json FILE]
  PREFIX = OUT/PAIR; writes PREFIX-matrix2.md and PREFIX-matrix2.json per pair, prints the
  tables; --json FILE also writes all pairs' results in one file.
Inputs per PREFIX: -phases.jsonl (each phase's window: round, phase, switched, start, end,
reload), -on.json (per-request arrivals/latencies), -off<i>.json (per offline process: iteration
end times; -off.json of scripts/gpu-phases.sh is read too), -audit.jsonl and -clock (the audit
clock's offset to the epoch), -meta.json (the pair).
Per window: online p50/p99 over the requests that arrived in it; offline throughput = iterations
of every offline process that ended in it x items per iteration / window (their sum; each one is
also kept). Per column: median (min-max) over rounds; "pooled p99" = the p99 of all of a column's
requests together; p99 / alone = pooled p99 / the alone column's pooled p99; offline / colo and
offline / ts_static = median offline / that column's median offline.
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
import argparse, collections, glob, json, os, re, statistics, sys

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


def report(prefix, noise):
    phases = [json.loads(l) for l in open(f"{prefix}-phases.jsonl") if l.strip()]
    on = json.load(open(f"{prefix}-on.json"))
    offs = offline_files(prefix)
    try:
        meta = json.load(open(f"{prefix}-meta.json"))
    except OSError:
        meta = {}
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
        lat = [l for a, l in zip(on.get("arrivals", []), on.get("lat_ms", [])) if t0 <= a < t1]
        per = [sum(1 for e in o.get("ends", []) if t0 <= e < t1) * o["items_per_iteration"]
               / (t1 - t0) for o in offs]
        m = {"round": w["round"], "lat": lat, "requests": len(lat), "p50": pct(lat, 0.5),
             "p99": pct(lat, 0.99), "offline": sum(per) if per else None, "per": per,
             "reload": w.get("reload", "unknown"), "levers": [], "adapt": 0}
        if offset is not None:
            sw = w.get("switched", t0) - 0.05  # the epoch mapping is one reading: allow 50 ms
            m["pauses"] = sum(1 for x in audit
                              if x.get("action") == "suspend" and t0 <= at(x) < t1)
            since = [x for x in audit if sw <= at(x) < t1]
            m["timeslice"] = sum(1 for x in since if x.get("action") == "timeslice")
            m["levers"] = [x for x in since if x.get("action") == "lever"]
            m["adapt"] = sum(1 for x in since if x.get("action") == "adapt")
        rows.setdefault(w["phase"], []).append(m)

    cols = {}
    for col, ms in rows.items():
        allat = [l for m in ms for l in m["lat"]]
        levers = [x for m in ms for x in m["levers"]]
        c = {"rounds": len(ms), "requests": sum(m["requests"] for m in ms),
             "p50": med3([m["p50"] for m in ms]), "p99": med3([m["p99"] for m in ms]),
             "pooled_p99": pct(allat, 0.99), "max": max(allat, default=None),
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
        if refused[col]:
            c["reloads"]["refused"] = refused[col]
        cols[col] = c
    g = lambda col, k: cols[col][k] if col in cols else None
    alone_p99 = g("alone", "pooled_p99")
    colo_off = (g("colo", "offline") or (None,))[0]
    ts_off = (g("ts_static", "offline") or (None,))[0]
    for col, c in cols.items():
        c["p99_vs_alone"] = ratio(c["pooled_p99"], alone_p99)
        c["offline_vs_colo"] = ratio(c["offline"][0], colo_off) if col != "alone" else None
        c["offline_vs_ts_static"] = ratio(c["offline"][0], ts_off) if col != "alone" else None

    verdict = judge(pair, cols, noise)
    alone_lat = [l for m in rows.get("alone", []) for l in m["lat"]]
    busy = (on.get("rate") or 0) * statistics.mean(alone_lat) / 1e3 if alone_lat else None
    unit = offs[0].get("unit") if offs else None
    n = len(offs)
    head = (f"pair {pair}: online {on.get('model')} @{on.get('rate')}/s vs offline "
            f"{offs[0].get('model') if offs else '?'}{f' x{n}' if n > 1 else ''} "
            f"(real GPU, not emulated; median (min-max) over rounds; p99 / alone from pooled "
            f"p99s; offline in {unit}/s{', the sum over processes' if n > 1 else ''}; online "
            f"busy alone (rate x mean latency) {r(busy)})")
    group = str(meta.get("group") or "").split()
    if len(group) > 1:
        others = " ".join(x for x in group if x != pair)
        head += (f"; run at once with {others} under one controller"
                 + (f", on GPU {meta['gpu']}" if meta.get("gpu") is not None else "")
                 + " (audit records: this pair's, by pid or GPU)")
    hdr = ["column", "rounds", "requests", "p50 ms", "p99 ms", "pooled p99", "p99 / alone",
           f"offline {unit}/s"] + (["per process"] if n > 1 else []) + \
          ["offline / colo", "offline / ts_static", "pauses", "timeslice changes",
           "lever records", "reloads"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for col, c in cols.items():
        nd = 0 if (c["offline"][0] or 0) >= 100 else 2
        cells = [col, str(c["rounds"]), str(c["requests"]), fmt3(c["p50"]), fmt3(c["p99"]),
                 r(c["pooled_p99"]), r(c["p99_vs_alone"]), fmt3(c["offline"], nd)]
        if n > 1:
            cells.append(" + ".join(r(v, nd) for v in c["offline_per_process"]))
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
    md = head + "\n\n" + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes
                                                   else "") + "\n" + verdict["line"] + "\n"
    out = {"prefix": prefix, "pair": pair, "meta": meta, "model_on": on.get("model"),
           "rate": on.get("rate"), "model_off": offs[0].get("model") if offs else None,
           "offline_processes": n, "unit": unit, "online_busy_alone": busy, "columns": cols, "verdict": verdict}
    open(f"{prefix}-matrix2.md", "w").write(md)
    json.dump(out, open(f"{prefix}-matrix2.json", "w"), indent=1)
    print(md)
    return out


def judge(pair, cols, noise):
    """The per-pair verdict: the goals (module docstring), each pass/fail/n/a, with figures."""
    P = lambda c: cols[c]["pooled_p99"] if c in cols else None
    O = lambda c: cols[c]["offline"][0] if c in cols else None
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
            "text": f"vs colo: p99 {pa:.2f} vs {P('colo'):.2f} ms, offline "
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
    p = meta.get("pids") or {}
    out = {}
    if isinstance(p.get("online"), int):
        out[p["online"]] = "online"
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
            if role == "online" and cls is not None and cls != "online":
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
    if any(v["class"] not in (None, "offline") and v["role"] != "online"
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
        print("\n".join(x["verdict"]["line"] for x in res))


if __name__ == "__main__":
    sys.exit(main())
