#!/bin/bash
# Start on a busy host (NVIDIA; ~6 min on an H200): for P = 2, 4 and 8 GPU processes started
# before any controller (one online CNN service at 30 req/s, one offline encoder job launching
# thousands of kernels a second, the rest offline GEMM / ResNet-50 training jobs), with no journal
# and no remembered self-test:
#   1. `run` starts: time until it has acted on every offline process (first start);
#   2. `kill -9`, immediate restart (journal present): time until all are acted on again;
#   3. `kill -9`, journal removed, restart: the same;
#   4. 10 x (`kill -9`, restart, wait for every act); then SIGTERM.
# Checks: every act's `original_us` is a driver default (never the lever's 200 us: no lost restore
# by a dead controller's guardian), the guardian journals are empty after the final stop, and no
# self-test failed. Times are CLOCK_MONOTONIC from `run`'s exec to its audit's last first act.
# Usage (device): OUT=$OUT GP=.carry/gpreempt-ebpf scripts/gpu/busy-start.sh [P...]
set -u
OUT=${OUT:-./gpu-out}; GP=${GP:-.carry/gpreempt-ebpf}
RUNDIR=/run/gpreempt-ebpf
W=${W:-/tmp/busy-start}; rm -rf "$W"; mkdir -p "$W" "$OUT"
COUNTS=${*:-2 4 8}
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
cat > "$W/policy.toml" <<EOF
[policy]
strategy = "priority"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
default = "ignore"

[nvidia]
lever = "timeslice"

[[rule]]
class = "online"
cmdline = 'online\.py'
uid = 0

[[rule]]
class = "offline"
cmdline = 'offline\.py'
uid = 0
EOF
# Every offline pid in $W/offline-pids.txt has a successful act in audit $1 at or after $2:
# prints the last first act (ns), else nothing.
all_acted() { python3 scripts/acted.py "$1" "$2" "$W/offline-pids.txt" suspend,timeslice; }
wait_all() { # audit since -> ms from since to all acted, or NEVER after 30 s
  for _ in $(seq 300); do
    r=$(all_acted "$1" "$2"); [ -n "$r" ] && { echo $(( (r - $2) / 1000000 )); return; }
    sleep 0.1
  done
  echo NEVER
}
start_run() { # tag -> R (pid), T (start ns)
  echo "$(date +%T) run $1 (mem avail $(awk '/MemAvailable/{print $2}' /proc/meminfo) kB)" >> "$OUT/progress.txt"
  T=$(mono)
  "$GP" -v run --policy "$W/policy.toml" --audit "$W/audit-$1.jsonl" 2> "$W/run-$1.err" &
  R=$!
}
kill9() { kill -9 "$R"; wait "$R" 2>/dev/null; }
echo "P first-start restart-journal restart-no-journal restarts(10:min/median/max) lost-records own-skipped" > "$W/table.txt"
for P in $COUNTS; do
  # Nothing of an earlier run: no controller, no GPU process of ours.
  pkill -9 -x gpreempt-ebpf 2>/dev/null; pkill -9 -f 'scripts/gpu/o[nf]+line\.py' 2>/dev/null; sleep 1
  rm -rf "$RUNDIR"
  pids=()
  python3 scripts/gpu/online.py 900 30 "$W/on-$P.json" --model resnet18 > "$W/on-$P.log" 2>&1 & pids+=($!)
  python3 scripts/gpu/offline.py 900 "$W/enc-$P.json" --model encoder > "$W/enc-$P.log" 2>&1 & pids+=($!)
  : > "$W/offline-pids.txt"; echo "${pids[1]}" >> "$W/offline-pids.txt"
  for i in $(seq 3 "$P"); do
    if [ $((i % 2)) -eq 1 ]; then m=gemm; else m=resnet50_train; fi
    python3 scripts/gpu/offline.py 900 "$W/off-$P-$i.json" --model $m > "$W/off-$P-$i.log" 2>&1 & pids+=($!)
    echo "${pids[-1]}" >> "$W/offline-pids.txt"
  done
  # Every process past its warm-up (it prints "ready").
  for _ in $(seq 120); do
    n=$(cat "$W"/on-$P.log "$W"/enc-$P.log $(ls "$W"/off-$P-*.log 2>/dev/null) 2>/dev/null | grep -c '^ready')
    [ "$n" -ge "$P" ] && break; sleep 1
  done
  echo "P=$P: $n of $P ready"
  start_run "$P-first"; first=$(wait_all "$W/audit-$P-first.jsonl" "$T")
  kill9; start_run "$P-journal"; journal=$(wait_all "$W/audit-$P-journal.jsonl" "$T")
  kill9; rm -f "$RUNDIR/nv-objects.json"
  start_run "$P-nojournal"; nojournal=$(wait_all "$W/audit-$P-nojournal.jsonl" "$T")
  reps=()
  for k in $(seq 10); do
    kill9; start_run "$P-r$k"; reps+=($(wait_all "$W/audit-$P-r$k.jsonl" "$T"))
  done
  own=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['events'].get('kernel_own_skipped', '-'))" "$RUNDIR/status.json" 2>/dev/null)
  kill -TERM "$R"; wait "$R"; echo "P=$P final run exit $?" >> "$W/exits.txt"
  sleep 1
  stats=$(printf '%s\n' "${reps[@]}" | python3 -c '
import sys
v = [l.strip() for l in sys.stdin if l.strip()]
n = sorted(int(x) for x in v if x != "NEVER")
never = len(v) - len(n)
print(f"{n[0]}/{n[len(n)//2]}/{n[-1]}" + (f" ({never} NEVER)" if never else "") if n else "NEVER")')
  lost=$(grep -ho 'event records lost[^(]*([0-9]* since start' "$W"/run-$P-*.err | grep -o '[0-9]* since' | sort -n | tail -1)
  echo "$P ${first}ms ${journal}ms ${nojournal}ms ${stats}ms ${lost:-0} ${own:--}" >> "$W/table.txt"
  # No lost restore: every act read a driver default as the original.
  python3 - "$W" "$P" <<'EOF' >> "$W/checks.txt"
import glob, json, sys
w, p = sys.argv[1], sys.argv[2]
orig = {}
for f in glob.glob(f"{w}/audit-{p}-*.jsonl"):
    for l in open(f):
        try: r = json.loads(l)
        except ValueError: continue
        if r.get("action") == "timeslice" and "original_us" in r:
            orig[r["original_us"]] = orig.get(r["original_us"], 0) + 1
print(f"P={p}: originals read by every controller: {orig} (200 would be a lost restore)")
EOF
  { echo "P=$P guardian journals after SIGTERM:"; for f in "$RUNDIR"/nv-journal*; do echo "== $f: $(cat "$f" 2>/dev/null | head -c 300)"; done; } >> "$W/checks.txt"
  grep -h "self-test\|refusing\|inconclusive\|found through the driver\|adopted" "$W"/run-$P-*.err | sort | uniq -c | sort -rn | head -12 >> "$W/checks.txt"
  kill -TERM "${pids[@]}" 2>/dev/null; sleep 3; kill -9 "${pids[@]}" 2>/dev/null; wait 2>/dev/null
  cp "$W/table.txt" "$W/checks.txt" "$OUT/" 2>/dev/null
  tar czf "$OUT/all.tgz" -C "$W" .
done
cat "$W/table.txt" "$W/checks.txt" "$W/exits.txt"
