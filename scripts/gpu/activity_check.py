"""Checks scripts/gpu-activity-check.sh's output (real GPU): per TSG of the CUDA process, the
GPFIFO entries pending (gp_put_total - gp_get_total) and consumed in each phase. Passes when the
busy phases show a backlog and consumption on some TSG and the idle phases show neither."""
import json, sys
out = sys.argv[1]
ph, pid = [], None
for l in open(f"{out}/phases.txt"):
    f = l.split()
    if f[0] == "pid":
        pid = int(f[1])
    else:
        ph.append((f[0], float(f[1]) * 1e9, float(f[2]) * 1e9))
samples = {}
for l in open(f"{out}/disp.jsonl"):
    try:
        r = json.loads(l)
    except ValueError:
        continue
    if r.get("type") == "gpfifo_sample" and r["pid"] == pid:
        samples.setdefault(r["tsg"], []).append((r["ts_ns"], r["gp_get_total"], r["gp_put_total"]))
allocs = [json.loads(l) for l in open(f"{out}/trace.jsonl") if '"rm_alloc"' in l]
chans = [a for a in allocs if a.get("pid") == pid and "gpFifoOffset" in a]
print(f"pid {pid}: {len(chans)} channel allocations with ring/USERD fields, e.g.",
      {k: chans[0][k] for k in ("hObjectNew", "gpFifoOffset", "gpFifoEntries", "hUserdMemory", "userdOffset")} if chans else None)
print(f"TSGs sampled: {len(samples)}; samples: {sum(len(v) for v in samples.values())}")
ok = True
for name, t0, t1 in ph:
    busy_any = False
    line = []
    for tsg, s in sorted(samples.items()):
        w = [x for x in s if t0 <= x[0] < t1]
        if len(w) < 2:
            continue
        consumed = w[-1][1] - w[0][1]
        maxbk = max(x[2] - x[1] for x in w)
        line.append(f"{tsg:#x}: consumed {consumed}, max backlog {maxbk}")
        busy_any |= consumed > 0 and maxbk > 0
    want = name.startswith("busy")
    verdict = "ok" if busy_any == want else "UNEXPECTED"
    ok &= busy_any == want
    print(f"  {name:6s} {(t1 - t0) / 1e6:7.0f} ms  {verdict}: " + "; ".join(line))
print("activity check:", "PASS" if ok else "FAIL")
