#!/bin/bash
# Restart check on the H100 (the NVIDIA observer's adoption; ~3 min): an offline job started
# before any controller (found through the driver, then under the lever), then `run` with the dynamic lever, an offline
# fp16 GEMM loop and an online eager LLM decode service (scripts/gpu/{offline,online}.py, pair E
# of pairs.sh). Once the lever acts on the offline process: `kill -9` of `run` (its guardian
# undoes what it held), an immediate restart, and the time from the restart until the offline
# process is under the lever again (the new controller's first act on it, from its audit log:
# CLOCK_MONOTONIC). Meanwhile `top` is recorded (scripts/gpu/top_capture.py) and
# scripts/gpu/handle_scan.c asks the driver what a duplicated fd sees. A final SIGTERM must
# leave nothing held (the guardian's journal empty). Everything lands in $OUT/all.tgz.
# Usage (device): OUT=$OUT scripts/gpu/restart-check.sh
set -u
OUT=${OUT:-./gpu-out}; GP=${GP:-.carry/gpreempt-ebpf}; LEVER=${LEVER:-dynamic}
RUNDIR=/run/gpreempt-ebpf
W=$OUT/w; mkdir -p "$W"
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
finish() {
  kill -TERM ${R2:-} ${ONP:-} ${OFFP:-} ${EARLY:-} 2>/dev/null
  sleep 3
  kill -9 ${R2:-} ${ONP:-} ${OFFP:-} ${EARLY:-} 2>/dev/null
  tar czf "$OUT/all.tgz" -C "$W" .
}
trap finish EXIT
gcc -O2 -o /tmp/handle_scan scripts/gpu/handle_scan.c
cat > "$W/policy.toml" <<EOF
[policy]
strategy = "priority"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
default = "ignore"
launch_hints = true

[nvidia]
lever = "$LEVER"

[[rule]]
class = "online"
cmdline = 'online\.py'
uid = 0

[[rule]]
class = "offline"
cmdline = 'offline\.py'
uid = 0
EOF
# An offline job older than any controller: found through the driver (no journal names it).
python3 scripts/gpu/offline.py 600 "$W/early.json" --model gemm > "$W/early.log" 2>&1 &
EARLY=$!
sleep 25
"$GP" -v run --policy "$W/policy.toml" --audit "$W/audit1.jsonl" 2> "$W/run1.err" &
R1=$!
sleep 5
python3 scripts/gpu/offline.py 600 "$W/off.json" --model gemm > "$W/off.log" 2>&1 &
OFFP=$!
python3 scripts/gpu/online.py 600 4 "$W/on.json" --model decode > "$W/on.log" 2>&1 &
ONP=$!
acted() { # audit pid -> 0 once a successful act on pid is in the audit
  python3 - "$1" "$2" <<'EOF'
import json, sys
for l in open(sys.argv[1]):
    try: r = json.loads(l)
    except ValueError: continue
    if r.get("pid") == int(sys.argv[2]) and r.get("action") in ("suspend", "timeslice") and not r.get("failed"):
        print(r["ts_ns"]); sys.exit(0)
sys.exit(1)
EOF
}
ok=
for _ in $(seq 120); do acted "$W/audit1.jsonl" $OFFP > /dev/null 2>&1 && { ok=1; break; }; sleep 1; done
echo "first controller acting on offline pid $OFFP: ${ok:-NO}"
sleep 4
cp "$RUNDIR/nv-objects.json" "$W/nv-objects-before.json" 2>/dev/null
cp "$RUNDIR/status.json" "$W/status1.json" 2>/dev/null
T0=$(mono)
kill -9 $R1
for _ in $(seq 100); do pgrep -f nv-guardian > /dev/null || break; sleep 0.05; done
T0g=$(mono)
"$GP" -v run --policy "$W/policy.toml" --audit "$W/audit2.jsonl" 2> "$W/run2.err" &
R2=$!
T1=$(mono)
T2=
for _ in $(seq 300); do T2=$(acted "$W/audit2.jsonl" $OFFP 2>/dev/null) && break; T2=; sleep 0.1; done
python3 - "$T0" "$T0g" "$T1" "${T2:-0}" <<'EOF' | tee "$W/restart.txt"
import sys
t0, t0g, t1, t2 = map(int, sys.argv[1:])
print(f"kill -9 -> old guardian gone: {(t0g - t0) / 1e6:.0f} ms")
print(f"restart -> offline under the lever again: " + (f"{(t2 - t1) / 1e6:.0f} ms" if t2 else "NEVER (within 30 s)"))
print(f"kill -9 -> offline under the lever again: " + (f"{(t2 - t0) / 1e6:.0f} ms" if t2 else "-"))
EOF
grep -h "adopted\|unmanaged\|not adopted\|guardian\|through the driver" "$W/run1.err" "$W/run2.err" | head -20
echo "acts on the early offline job (pid $EARLY): run 1 $(grep -c "\"pid\":$EARLY," "$W/audit1.jsonl"), run 2 $(grep -c "\"pid\":$EARLY," "$W/audit2.jsonl")"
sleep 6
"$GP" queues --json > "$W/queues.json" 2> "$W/queues.err"
python3 scripts/gpu/top_capture.py "$GP" 10 "$W/top.raw" 160 45
for p in $EARLY $ONP $OFFP; do
  echo "== pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-100)"
  timeout 20 /tmp/handle_scan "$p" 0x5c000000 0x4000 0xcaf00000 0x4000
done > "$W/handle-scan.txt" 2>&1
cp "$RUNDIR/nv-objects.json" "$W/nv-objects-after.json" 2>/dev/null
kill -TERM $R2; wait $R2; echo "run 2 exit $?"
R2=
ls -la "$RUNDIR" > "$W/rundir.txt" 2>&1
for f in "$RUNDIR"/nv-journal*; do echo "== $f"; cat "$f"; done >> "$W/rundir.txt" 2>&1
tail -5 "$W/run2.err"
