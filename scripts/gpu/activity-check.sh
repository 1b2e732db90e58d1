#!/bin/bash
# Device check of NVIDIA channel activity (real GPU, not emulated): `trace --dispatches --json`
# samples each TSG's GP_GET / GP_PUT sums while a CUDA process alternates idle and busy phases on
# two streams, and `trace --json` records its channel allocations (gpFifoOffset, USERD). The
# analysis (activity_check.py) asserts backlog while busy, none while idle, and ids that advance.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
"$GP" trace --json --comm python3 --duration 14 > "$OUT/trace.jsonl" 2> "$OUT/trace.err" &
T1=$!
sleep 1
"$GP" trace --dispatches --json --sample-interval 2 --duration 14 > "$OUT/disp.jsonl" 2> "$OUT/disp.err" &
T2=$!
sleep 2  # the first trace mounts tracefs where the machine has not
PYTHONUNBUFFERED=1 python3 - > "$OUT/phases.txt" <<'PY'
import time, torch
a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
s2 = torch.cuda.Stream(); torch.cuda.synchronize()
import os; print("pid", os.getpid())
def phase(name, fn):
    t0 = time.monotonic(); fn(); torch.cuda.synchronize(); print(name, t0, time.monotonic())
time.sleep(1.0); phase("idle", lambda: time.sleep(1.0))
def busy():
    for _ in range(4000): a @ b
phase("busy", busy)
phase("idle", lambda: time.sleep(1.0))
def busy2():
    with torch.cuda.stream(s2):
        for _ in range(4000): a @ b
phase("busy2", busy2)
phase("idle", lambda: time.sleep(1.0))
PY
wait $T1 $T2
tail -2 "$OUT/disp.err"; tail -2 "$OUT/trace.err"
python3 scripts/gpu/activity_check.py "$OUT"
