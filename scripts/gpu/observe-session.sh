#!/bin/bash
# One device command for the NVIDIA observer/activity checks that need a live pair (H100, ~4 min):
# pair E (eager LLM decode vs an fp16 GEMM loop; scripts/gpu/pairs.sh) under the dynamic, pause
# and adaptive columns of scripts/gpu-matrix2.sh (1 round, 30 s each: their audit gives the
# decision latency by stage), `top` recorded on a pty twice while it runs
# (scripts/gpu/top_capture.py; render here with scripts/gpu/top_render.sh), `queues --json`,
# and scripts/gpu/handle_scan.c on every process holding /dev/nvidiactl (which RM clients and
# objects a duplicated fd can see: the research behind adopting running processes).
# Usage (device): OUT=$OUT scripts/gpu/observe-session.sh
set -u
OUT=${OUT:-./gpu-out}; GP=${GP:-.carry/gpreempt-ebpf}
mkdir -p "$OUT"
gcc -O2 -o /tmp/handle_scan scripts/gpu/handle_scan.c || exit 1
OUT=$OUT GP=$GP PHASES="ts_dynamic pause adaptive" ROUNDS=1 PHASE=30 SETTLE_ADAPTIVE=8 DEADLINE=300 \
  scripts/gpu-matrix2.sh E > "$OUT/matrix.log" 2>&1 &
M=$!
sleep 65
python3 scripts/gpu/top_capture.py "$GP" 12 "$OUT/top-1.raw" 160 45
"$GP" queues --json > "$OUT/queues.json" 2> "$OUT/queues.err"
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$(cat "$p/comm" 2>/dev/null)" = gpreempt-ebpf ] && continue
  ls -l "$p/fd" 2>/dev/null | grep -q nvidiactl || continue
  echo "== pid $pid $(tr '\0' ' ' < "$p/cmdline" | cut -c1-120)"
  timeout 20 /tmp/handle_scan "$pid" 0x5c000000 0x4000 0xcaf00000 0x4000 0xbeef0000 0x1000
done > "$OUT/handle-scan.txt" 2>&1
sleep 20
python3 scripts/gpu/top_capture.py "$GP" 12 "$OUT/top-2.raw" 160 45
wait $M
echo "matrix rc $?"
tail -5 "$OUT/matrix.log"
