#!/bin/bash
# One pair of the request-steered tuner's GPU matrix (issue: "steers by what users feel") on the
# device machine, with a recording of `top` while the controller runs:
#   OUT=$OUT scripts/gpu/steer-matrix.sh PAIR [TOP_AT_S]
# Runs scripts/gpu-matrix2.sh PAIR on GPU 0 (3 rounds of 10 s phases, the first adaptive phase
# settling 75 s: the tuner's first calibration at 2 requests/s), records `top` for 12 s from
# TOP_AT_S (default 240) seconds in (scripts/gpu/top_capture.py; replay with
# scripts/gpu/top_render.sh), then `queues`, `queues --json` and `doctor`, and tars everything
# into $OUT/PAIR.tgz (the device tool brings back a few files only). Env passed through: ROUNDS PHASE SETTLE_FIRST_ADAPTIVE BUDGET.
set -u
pair=$1; top_at=${2:-240}
OUT=${OUT:-./gpu-out}; M="$OUT/$pair-m"; mkdir -p "$M"
GP=${GP:-.carry/gpreempt-ebpf}
( sleep "$top_at"; python3 scripts/gpu/top_capture.py "$GP" 12 "$M/top.raw" 160 45 \
    > "$M/top.log" 2>&1
  # What an operator sees on this host, while the controller runs: queues and doctor.
  "$GP" queues > "$M/queues.txt" 2>&1; "$GP" queues --json > "$M/queues.json" 2>&1
  "$GP" doctor > "$M/doctor.txt" 2>&1 ) &
TOPP=$!
OUT="$M" GPUS=0 ROUNDS=${ROUNDS:-3} PHASE=${PHASE:-10} \
  SETTLE_FIRST_ADAPTIVE=${SETTLE_FIRST_ADAPTIVE:-75} DEADLINE=${DEADLINE:-585} \
  scripts/gpu-matrix2.sh "$pair" 2>&1 | tee "$M/matrix.log" | grep -vE '^\s*$' | tail -60
kill "$TOPP" 2>/dev/null; wait "$TOPP" 2>/dev/null
tar czf "$OUT/$pair.tgz" -C "$OUT" "$pair-m"
ls -la "$OUT/$pair.tgz"
