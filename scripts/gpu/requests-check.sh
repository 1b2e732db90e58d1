#!/bin/bash
# Device check of request latency (real GPU, not emulated): does the controller's measure of an
# online service's requests (uprobes on its launches and its blocking waits: first launch after
# idleness to the last wait's return) match what the service measured itself?
# Two online services share one GPU with an offline job under `run` (static timeslice lever):
#   resnet18  ResNet-18 b1 at 20 req/s: one torch.cuda.synchronize() per request
#   decode    eager LLM decode at 2 req/s: 32 tokens, one .item() (host sync) per token
# Near the end `queues --json` and the metrics page are read; the report prints, per service,
# the client's p50/p99 (from its arrival) beside the tool's (requests that ended in the last
# minute). Files in $OUT. Env: OUT (./gpu-out), GP (.carry/gpreempt-ebpf), SECS (45).
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
SECS=${SECS:-45}
cat > "$OUT/policy.toml" <<'EOF'
[policy]
strategy = "priority"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
min_run = "50ms"
min_interval = "10ms"
default = "ignore"

[nvidia]
lever = "timeslice"
offline_timeslice = "200us"

[[rule]]
class = "online"
cmdline = 'online\.py'
uid = 0

[[rule]]
class = "offline"
cmdline = 'offline\.py'
uid = 0
EOF
"$GP" run --policy "$OUT/policy.toml" --metrics 127.0.0.1:9477 2> "$OUT/run.err" &
R=$!
sleep 5
python3 scripts/gpu/offline.py $((SECS + 30)) "$OUT/off.json" --model gemm > "$OUT/off.out" 2>&1 &
OFF=$!
python3 scripts/gpu/online.py "$SECS" 20 "$OUT/resnet18.json" --model resnet18 > "$OUT/resnet18.out" 2>&1 &
A=$!
python3 scripts/gpu/online.py "$SECS" 2 "$OUT/decode.json" --model decode > "$OUT/decode.out" 2>&1 &
B=$!
# Both services ready, then most of their run.
for i in $(seq 1 120); do
  grep -q ready "$OUT/resnet18.out" 2>/dev/null && grep -q ready "$OUT/decode.out" 2>/dev/null && break
  sleep 1
done
sleep $((SECS - 8))
"$GP" queues --json > "$OUT/queues.json" 2> "$OUT/queues.err"
python3 - "$OUT/metrics.txt" <<'PY'
import sys, urllib.request
open(sys.argv[1], "w").write(urllib.request.urlopen("http://127.0.0.1:9477/metrics").read().decode())
PY
"$GP" trace --launches --json --duration 3 --comm python3 > "$OUT/launches.jsonl" 2> "$OUT/launches.err" || true
wait $A $B
kill -INT $R; wait $R; echo "run rc $?" >> "$OUT/run.err"
kill -INT $OFF; wait $OFF
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
q = json.load(open(f"{out}/queues.json"))
by_pid = {p["pid"]: p for p in q["processes"]}
for name in ["resnet18", "decode"]:
    c = json.load(open(f"{out}/{name}.json"))
    lat = c
    pid = c.get("pid")
    tool = by_pid.get(pid, {}).get("requests")
    print(f"{name}: pid {pid} client p50 {lat.get('p50_ms')} p99 {lat.get('p99_ms')} ms; tool {tool}")
PY
grep -c online_request_duration_seconds_bucket "$OUT/metrics.txt"
tail -3 "$OUT/run.err"
