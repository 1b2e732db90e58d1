#!/bin/sh
# Start on a busy host, emulated: N GPU processes with Q queues each are running before any
# controller (one online ResNet-18 service at 20 req/s, N-1 offline ResNet-50 jobs), then `run`
# starts, with no journal and nothing known of them. Measures, by CLOCK_MONOTONIC, the time from
# `run`'s start until it has acted on every offline process (its first successful suspend of
# each, from the audit log), then does the same after `kill -9` of `run` and an immediate
# restart; a final SIGTERM must leave nothing suspended. Writes $OUT/summary.json.
#
# Run inside the emulator: gpreempt-ebpf sim -- sh scripts/busy-start-sim.sh
# Environment: GP (the binary), OUT (a directory), N (50), Q (20), RUN_ARGS (extra `run`
# arguments, e.g. --ring-kib 16), FLOOD (KFD ioctls a flooding process issues while `run`
# starts, 0: none; needs POKE, the kfd-poke binary), LIMIT (seconds to wait for control, 60),
# PACE (requests/s of every offline job but the first, which runs back to back; empty: all back
# to back. A paced job is still classed offline by its name: it keeps a 2-vCPU host from being
# only the emulator's).
set -u
: "${GP:?GP: the gpreempt-ebpf binary}" "${OUT:?OUT: a directory}"
N=${N:-50}; Q=${Q:-20}; RUN_ARGS=${RUN_ARGS:-}; FLOOD=${FLOOD:-0}; LIMIT=${LIMIT:-60}; PACE=${PACE:-}
POLICY=$(dirname "$0")/../examples/resnet-online-offline.toml
export GPREEMPT_RUN_DIR=$OUT/run
mkdir -p "$OUT"
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
idle=$((Q - 1))
$GP sim workload --profile resnet18_b1 --rate 20 --duration 600 --priority 15 \
  --idle-queues $idle --report "$OUT/on.json" 2>"$OUT/on.err" &
WL=$!
i=2
while [ $i -le "$N" ]; do
  mode=--offline
  [ -n "$PACE" ] && [ $i -gt 2 ] && mode="--rate $PACE"
  $GP sim workload --profile resnet50_b1024 $mode --duration 600 --priority 0 \
    --idle-queues $idle --report "$OUT/off$i.json" 2>"$OUT/off$i.err" &
  WL="$WL $!"
  i=$((i + 1))
done
# Every queue up before the controller starts.
want=$((N * Q)); have=0; t=0
while [ "$have" -lt "$want" ] && [ $t -lt 600 ]; do
  sleep 1; t=$((t + 1))
  have=$(ls /sys/class/kfd/kfd/proc/*/queues 2>/dev/null | grep -c '^[0-9]')
done
echo "busy host: $have of $want queues in sysfs after ${t}s" >&2
offline_pids() { pgrep -f 'sim workload --profile resnet50_b1024' | sort -n; }
offline_pids > "$OUT/offline.pids"

# Every offline pid has a successful suspend in audit $1 (at or after $2 ns): prints the last
# first-act time, or nothing.
all_acted() { python3 "$(dirname "$0")/acted.py" "$1" "$2" "$OUT/offline.pids" suspend; }
wait_all() { # audit since -> last first-act ns, or empty after LIMIT
  S0=$(date +%s)
  k=0
  while [ $k -lt $((LIMIT * 10)) ] && [ $(( $(date +%s) - S0 )) -lt $LIMIT ]; do
    r=$(all_acted "$1" "$2"); [ -n "$r" ] && { echo "$r"; return; }
    sleep 0.1; k=$((k + 1))
  done
}
FP=
if [ "$FLOOD" -gt 0 ]; then
  # A process flooding the driver while the controller starts: the ring overflows.
  (echo go; sleep 30) | "$POKE" /dev/kfd flood "$FLOOD" > "$OUT/flood.out" 2>&1 &
  FP=$!
fi
T1=$(mono)
$GP run --policy "$POLICY" --audit "$OUT/audit1.jsonl" $RUN_ARGS 2>"$OUT/run1.err" &
R=$!
A1=$(wait_all "$OUT/audit1.jsonl" "$T1")
# kill -9 and an immediate restart: the kernel resumes what the dead controller held.
kill -9 $R; wait $R 2>/dev/null
T2=$(mono)
$GP run --policy "$POLICY" --audit "$OUT/audit2.jsonl" $RUN_ARGS 2>"$OUT/run2.err" &
R=$!
A2=$(wait_all "$OUT/audit2.jsonl" "$T2")
$GP queues --json > "$OUT/queues.json" 2>/dev/null
kill -TERM $R; wait $R; RC=$?
sleep 0.5
$GP queues --json > "$OUT/after.json" 2>/dev/null
[ -n "$FP" ] && kill $FP 2>/dev/null
kill -TERM $WL 2>/dev/null; wait $WL 2>/dev/null
python3 - "$OUT" "$T1" "${A1:-0}" "$T2" "${A2:-0}" "$RC" "$N" "$Q" "$have" <<'EOF'
import json, sys
out, t1, a1, t2, a2, rc, n, q, have = sys.argv[1], *map(int, sys.argv[2:])
after = json.load(open(f"{out}/after.json"))
suspended = sum(1 for p in after["processes"] for x in p["queues"] if x.get("state") == "suspended")
offline = [int(l) for l in open(f"{out}/offline.pids") if l.strip()]
s = {
    "emulated": True, "processes": n, "queues_per_process": q, "queues_before": have,
    "offline": len(offline),
    "first_start_all_acted_ms": (a1 - t1) / 1e6 if a1 else None,
    "restart_all_acted_ms": (a2 - t2) / 1e6 if a2 else None,
    "run_rc": rc, "suspended_after_stop": suspended,
}
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(s))
EOF
