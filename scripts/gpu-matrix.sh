#!/bin/bash
# Evaluation matrix for the NVIDIA backend: ONE workload pair per invocation, on the device
# machine (H100; no network; python3 with torch/torchvision), the built binary carried at
# .carry/gpreempt-ebpf (carry: [".carry/gpreempt-ebpf"]). Device command, e.g.:
#   OUT=$OUT SECS=15 scripts/gpu-matrix.sh A
# One call must end inside the 10-minute limit: it stops starting rounds (and columns) when the
# rest of BUDGET (seconds from the start) cannot fit them, and says so.
#
# PAIR  (online service @ rate vs offline job; scripts/gpu/online.py, scripts/gpu/offline.py)
#   A  resnet18 b1 @20 req/s   vs resnet50 inference b1024 (the seeds' pair)
#   B  encoder (BERT-base-sized, seq 128, b1) @50 req/s vs resnet50 training b128
#   C  encoder @50 req/s       vs GPT decoder training (6 x d1024, seq 512, b8)
#   D  resnet18 b1 @20 req/s   vs resnet50 training b128
# Columns: alone (online alone), solo_off (offline alone), colo (both, no controller), and one
# per entry of POLICIES: a name N means scripts/gpu/matrix-N.toml, a path ending in .toml is
# taken as it is (column = its base name). Rounds are interleaved (every column in round 1,
# then every column in round 2, ...).
# Env: OUT (./gpu-out), GP (.carry/gpreempt-ebpf), SECS per measurement (15), ROUNDS (3),
#   BUDGET seconds (500), POLICIES ("timeslice pause both"), RUNV (-v: run's verbosity),
#   COLUMNS_ONLY (a subset of columns, e.g. "colo both"), ON_MODEL/RATE/OFF_MODEL (override).
# Results: $OUT/<pair>-<col>-r<k>-{on.json,off.json,off.log,audit.jsonl,run.err,meta}, and at
# the end $OUT/<pair>-matrix.json plus a markdown table (scripts/gpu/matrix_report.py).
set -u
PAIR=${1:?usage: scripts/gpu-matrix.sh A|B|C|D (env OUT SECS ROUNDS BUDGET POLICIES)}
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
SECS=${SECS:-15}; ROUNDS=${ROUNDS:-3}; BUDGET=${BUDGET:-500}
POLICIES=${POLICIES:-timeslice pause both}
RUNV=${RUNV--v}
SETTLE=${SETTLE:-2}   # seconds between the offline job's "ready" and the online start
SECONDS=0
. scripts/gpu/pairs.sh "$PAIR"
ON_MODEL=${ON_MODEL:-$on}; RATE=${RATE:-$rate}; OFF_MODEL=${OFF_MODEL:-$off}
REPORT="python3 scripts/gpu/matrix_report.py"

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
uname -r | tee -a "$OUT/gpu.txt"
[ -x "$GP" ] || echo "warning: $GP is not there or not executable (policy columns will fail)"
mkdir -p /run/gpreempt-ebpf

# Columns and their policy files.
declare -A POL
COLS="alone solo_off colo"
for p in $POLICIES; do
  case "$p" in
    *.toml) c=$(basename "$p" .toml); POL[$c]=$p ;;
    *) c=$p; POL[$c]=scripts/gpu/matrix-$p.toml ;;
  esac
  [ -f "${POL[$c]}" ] || echo "warning: policy file ${POL[$c]} is missing"
  COLS="$COLS $c"
done
if [ -n "${COLUMNS_ONLY:-}" ]; then COLS=$COLUMNS_ONLY; fi
echo "pair $PAIR: online $ON_MODEL @${RATE}/s vs offline $OFF_MODEL; SECS=$SECS ROUNDS=$ROUNDS" \
     "BUDGET=${BUDGET}s; columns: $COLS"
rm -f "$OUT/$PAIR"-*-r*-meta   # a fresh matrix for this pair

# --- the pieces -------------------------------------------------------------------------------
# meta TAG key=value...: one measurement's facts for the report.
meta() { local t=$1; shift; printf '%s\n' "$@" >> "$OUT/$t-meta"; }

online() {  # TAG: the online service, SECS of requests (after its own loading and warm-up)
  timeout $((SECS + 120)) python3 scripts/gpu/online.py "$SECS" "$RATE" "$OUT/$1-on.json" \
      --model "$ON_MODEL" 2>"$OUT/$1-on.err"
  local rc=$?; [ $rc = 0 ] || { meta "$1" "online_rc=$rc"; tail -3 "$OUT/$1-on.err"; }
}

OFFP=
offline_start() {  # TAG: the offline job in the background; waits for its "ready" (warm-up done)
  python3 scripts/gpu/offline.py $((SECS + 150)) "$OUT/$1-off.json" --model "$OFF_MODEL" \
      >"$OUT/$1-off.log" 2>"$OUT/$1-off.err" & OFFP=$!
  local i
  for i in $(seq 900); do
    grep -q ready "$OUT/$1-off.log" 2>/dev/null && { sleep "$SETTLE"; return 0; }
    kill -0 $OFFP 2>/dev/null || break
    sleep 0.1
  done
  echo "offline job not ready (pid $OFFP):"; tail -3 "$OUT/$1-off.err"
  meta "$1" "error=offline not ready: $(tail -1 "$OUT/$1-off.err" | tr -d '\n' | cut -c1-200)"
  return 1
}

offline_stop() {  # TAG: SIGTERM (it writes its JSON), then -9 after 30 s
  [ -n "$OFFP" ] || return
  kill -TERM $OFFP 2>/dev/null
  local i
  for i in $(seq 300); do kill -0 $OFFP 2>/dev/null || break; sleep 0.1; done
  if kill -0 $OFFP 2>/dev/null; then
    echo "offline pid $OFFP did not stop: kill -9"; kill -9 $OFFP; meta "$1" "offline_killed=1"
  fi
  wait $OFFP 2>/dev/null; OFFP=
}

RUNP=
run_stop() {  # TAG: SIGINT to `run`, its exit code (SIGTERM after 20 s, -9 after 10 more)
  [ -n "$RUNP" ] || return
  kill -INT $RUNP 2>/dev/null
  local i rc
  for i in $(seq 200); do kill -0 $RUNP 2>/dev/null || break; sleep 0.1; done
  if kill -0 $RUNP 2>/dev/null; then
    echo "run pid $RUNP did not stop on SIGINT: SIGTERM"; kill -TERM $RUNP; meta "$1" "run_sigterm=1"
    for i in $(seq 100); do kill -0 $RUNP 2>/dev/null || break; sleep 0.1; done
  fi
  if kill -0 $RUNP 2>/dev/null; then
    echo "run pid $RUNP did not stop on SIGTERM: kill -9"; kill -9 $RUNP; meta "$1" "run_killed=1"
  fi
  wait $RUNP 2>/dev/null; rc=$?; RUNP=
  meta "$1" "run_rc=$rc"; echo "run rc=$rc"
}

column() {  # COL ROUND
  local col=$1 k=$2 tag="$PAIR-$1-r$2" t0=$SECONDS
  rm -f "$OUT/$tag"-*
  meta "$tag" "pair=$PAIR" "column=$col" "round=$k" "secs=$SECS" "on_model=$ON_MODEL" \
       "rate=$RATE" "off_model=$OFF_MODEL"
  case "$col" in
    alone) online "$tag" ;;
    solo_off)
      if offline_start "$tag"; then sleep "$SECS"; fi
      offline_stop "$tag" ;;
    colo)
      if offline_start "$tag"; then online "$tag"; fi
      offline_stop "$tag" ;;
    *)
      local pol=${POL[$col]}
      meta "$tag" "policy=$pol"
      "$GP" $RUNV run --policy "$pol" --audit "$OUT/$tag-audit.jsonl" 2>"$OUT/$tag-run.err" &
      RUNP=$!
      # The observer knows only GPU objects allocated after it attached: workloads start after
      # its "gpreempt-ebpf run:" line (which follows the self-test).
      local i ok=
      for i in $(seq 600); do
        grep -q "gpreempt-ebpf run:" "$OUT/$tag-run.err" 2>/dev/null && { ok=1; break; }
        kill -0 $RUNP 2>/dev/null || break
        sleep 0.1
      done
      if [ -z "$ok" ]; then
        local why="no 'gpreempt-ebpf run:' line within 60 s"
        kill -0 $RUNP 2>/dev/null || why="run exited before its 'gpreempt-ebpf run:' line"
        echo "column $col failed: $why; run.err ends:"
        tail -5 "$OUT/$tag-run.err" | sed 's/^/  /'
        meta "$tag" "failed=$why" \
             "error=$(tail -3 "$OUT/$tag-run.err" | tr '\n' '|' | cut -c1-600)"
        run_stop "$tag"
      else
        grep -E "self-test" "$OUT/$tag-run.err" | tail -1
        sleep 1
        if offline_start "$tag"; then online "$tag"; fi
        offline_stop "$tag"
        run_stop "$tag"
        grep -iE "timeslice|error" "$OUT/$tag-run.err" | grep -v "event source" | head -4 | cut -c1-240
      fi ;;
  esac
  meta "$tag" "elapsed=$((SECONDS - t0))"
  DUR[$col]=$((SECONDS - t0))
  echo "[$(printf '%4d' $SECONDS)s] $tag: $((SECONDS - t0)) s  $($REPORT --brief "$OUT/$tag" 2>&1)"
}

# --- the rounds -------------------------------------------------------------------------------
declare -A DUR
HARD=$((BUDGET + 30))   # a column is not started unless its estimate ends before this
done_rounds=0; maxround=0
for k in $(seq "$ROUNDS"); do
  if [ "$k" -gt 1 ] && [ $((SECONDS + maxround)) -gt "$BUDGET" ]; then
    echo "stopping after $done_rounds round(s): ${SECONDS}s elapsed, a round takes ~${maxround}s," \
         "the budget is ${BUDGET}s (BUDGET=...; or fewer SECS)"
    break
  fi
  echo "=== round $k (${SECONDS}s elapsed)"
  rs=$SECONDS; cut_short=
  for col in $COLS; do
    est=${DUR[$col]:-$((SECS + 45))}
    if [ $((SECONDS + est)) -gt "$HARD" ]; then
      echo "skipping $col in round $k and what follows: ~${est}s would pass ${HARD}s"
      cut_short=1; break
    fi
    column "$col" "$k"
  done
  [ -n "$cut_short" ] && break
  done_rounds=$k
  [ $((SECONDS - rs)) -gt "$maxround" ] && maxround=$((SECONDS - rs))
done
echo "=== $done_rounds full round(s) in ${SECONDS}s"
pgrep -af "scripts/gpu/(online|offline)\.py" && echo "warning: workloads left running"
$REPORT --pair "$PAIR" --out "$OUT" --columns "$COLS"
