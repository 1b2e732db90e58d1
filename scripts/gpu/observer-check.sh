#!/bin/bash
# No controller at all (~1 min on the H100): an offline job and an online service already running,
# then `queues --json` and `top` (recorded) must show them, found through the driver; and
# scripts/gpu/wake_latency.c: how long this machine takes to run a thread another one woke (the
# floor of the controller's hand-offs). Everything lands in $OUT/all.tgz.
# Usage (device): OUT=$OUT scripts/gpu/observer-check.sh
set -u
OUT=${OUT:-./gpu-out}; GP=${GP:-.carry/gpreempt-ebpf}
W=$OUT/w; mkdir -p "$W"
trap 'kill $A $B 2>/dev/null; sleep 2; tar czf "$OUT/all.tgz" -C "$W" .' EXIT
gcc -O2 -pthread -o /tmp/wake_latency scripts/gpu/wake_latency.c
rm -f /run/gpreempt-ebpf/nv-objects.json
python3 scripts/gpu/offline.py 600 "$W/off.json" --model gemm > "$W/off.log" 2>&1 & A=$!
python3 scripts/gpu/online.py 600 4 "$W/on.json" --model decode > "$W/on.log" 2>&1 & B=$!
sleep 25
/usr/bin/time -v "$GP" queues --json > "$W/queues.json" 2> "$W/queues.err"
"$GP" queues > "$W/queues.txt" 2>> "$W/queues.err"
cat "$W/queues.txt"
python3 scripts/gpu/top_capture.py "$GP" 8 "$W/top.raw" 160 45
/tmp/wake_latency 300 | tee "$W/wake.txt"
