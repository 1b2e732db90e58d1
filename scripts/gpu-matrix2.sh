#!/bin/bash
# Evaluation matrix 2 for the NVIDIA levers and the adaptive strategy, phase design (as
# scripts/gpu-phases.sh), one or more workload pairs per invocation, on the device machine (H100;
# no network; python3 with torch/torchvision), the release binary carried at .carry/gpreempt-ebpf.
# Device command (two pairs fit in one 10-minute command with the defaults), e.g.:
#   OUT=$OUT scripts/gpu-matrix2.sh E F
# Per pair the processes start once: the controller (`run`), the offline job(s) (each gated by
# its own file) and the online service. The columns are phases of PHASE seconds, every column once
# per round, rounds interleaved, switched by two things only: the offline gates (a job works while
# its file exists) and the controller's policy (rewritten, then SIGHUP). No probe here.
#
# PAIR  (scripts/gpu/pairs.sh; models of scripts/gpu/online.py, scripts/gpu/offline.py)
#   A-D  as in scripts/gpu-phases.sh
#   E  eager LLM decode (GPT-2-small-sized, KV cache, b1, 32 tokens, .item() per token) @4 req/s
#      vs an fp16 GEMM loop (8192^3 matmuls back to back: kernels of a few ms)
#   F  ResNet-50 b8 fp16 @50 req/s vs TWO ResNet-50 training b128 processes (offline = their sum)
#   G  ResNet-50 b8 fp16 @50 req/s vs ONE ResNet-50 training b128 ("nothing to remove")
#   H  encoder (BERT-base-sized) b1 @50 req/s vs encoder inference b8: an offline job of many
#      short kernels, launch-bound (see "Pair H" below)
# Columns (PHASES, in this order each round; policy text: policy() below, the one place):
#   alone       offline gates closed (contexts kept), no offline rule
#   colo        offline working, no offline rule (no control)
#   ts_static   [nvidia] lever = "timeslice", offline_timeslice (200us)
#   ts_dynamic  [nvidia] lever = "dynamic": the offline timeslice shortened only while online work
#               is pending, restored after
#   pause       [nvidia] lever = "pause"
#   adaptive    [policy] strategy = "adaptive", [adaptive] online_p99_budget = 1.1 (no lever: on
#               NVIDIA the controller chooses one per GPU by measurement); SETTLE_ADAPTIVE applies
# Pair H: every lever assumes offline work holds the GPU for long stretches that a shorter slice
# or a pause cuts. An offline job of many short kernels (encoder b8: tens of us each, CPU-launch
# bound) leaves gaps in which the GPU switches to online anyway, so colo may already be near
# alone and any control mostly costs offline throughput (a pause stalls its launch stream; a
# shorter slice adds switches for little gain). It tests that the adaptive strategy measures
# "little to remove" on a different mechanism than G (gaps, not a shared-well compute mix), with
# the same online service as B so the two can be compared.
#
# Env: OUT (./gpu-out), GP (.carry/gpreempt-ebpf), PHASE (10), SETTLE (3), SETTLE_ADAPTIVE (8),
#   ROUNDS (3), PHASES ("alone colo ts_static ts_dynamic pause adaptive"), TIMESLICE (200us),
#   BUDGET (1.1: online_p99_budget), RUNV (-v), START_EST (35: seconds to start a pair's
#   processes, for the estimate), DRY (1: print the estimate and the policies, run nothing),
#   DEADLINE (592: seconds from this script's start; a round that would end after it is not
#   begun, and a pair that could not finish one round is skipped, so a 10-minute device command
#   always ends with every started pair's files written and reported).
# Results per pair: $OUT/$PAIR-on.json (per-request arrivals/latencies), $OUT/$PAIR-off<i>.json
#   (per offline process: iteration end times), $OUT/$PAIR-phases.jsonl (each phase's window and
#   whether its policy reload was applied), $OUT/$PAIR-audit.jsonl, $OUT/$PAIR-run.err,
#   $OUT/$PAIR-clock, $OUT/$PAIR-meta.json, $OUT/$PAIR-policy-<column>.toml, and the table from
#   scripts/gpu/matrix2_report.py ($OUT/$PAIR-matrix2.{md,json}).
set -u
[ $# -ge 1 ] || { echo "usage: scripts/gpu-matrix2.sh PAIR... (A-H; env OUT PHASE SETTLE" \
                       "SETTLE_ADAPTIVE ROUNDS PHASES TIMESLICE BUDGET DRY)" >&2; exit 2; }
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
PHASE=${PHASE:-10}; SETTLE=${SETTLE:-3}; SETTLE_ADAPTIVE=${SETTLE_ADAPTIVE:-8}; ROUNDS=${ROUNDS:-3}
PHASES=${PHASES:-alone colo ts_static ts_dynamic pause adaptive}
TIMESLICE=${TIMESLICE:-200us}; BUDGET=${BUDGET:-1.1}; RUNV=${RUNV--v}
START_EST=${START_EST:-35}; DRY=${DRY:-}; DEADLINE=${DEADLINE:-592}

# policy COLUMN: the policy file of a column, from one template. Change a column's policy here.
#   strategy   [policy] strategy
#   lever      [nvidia] lever ("" = no lever key: the controller's default or, adaptive, its choice)
#   off_rule   1 = the offline rule is present (the controller controls offline)
#   extra      more TOML appended (e.g. the [adaptive] section)
policy() {
  local strategy=priority lever= off_rule=1 extra= lever_line=
  case "$1" in
    alone|colo) off_rule= ;;
    ts_static) lever=timeslice ;;
    ts_dynamic) lever=dynamic ;;
    pause) lever=pause ;;
    adaptive) strategy=adaptive extra=$'\n[adaptive]\n'"online_p99_budget = $BUDGET" ;;
    *) echo "unknown column $1 (alone colo ts_static ts_dynamic pause adaptive)" >&2; return 1 ;;
  esac
  [ -n "$lever" ] && lever_line="lever = \"$lever\""$'\n'
  cat <<EOF
# scripts/gpu-matrix2.sh, column $1 (the seeds' [policy] values)
[policy]
strategy = "$strategy"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
min_run = "50ms"
min_interval = "10ms"
default = "ignore"
launch_hints = true

[nvidia]
${lever_line}offline_timeslice = "$TIMESLICE"

[[rule]]
class = "online"
cmdline = 'online\.py'
uid = 0
EOF
  [ -n "$off_rule" ] && printf '\n[[rule]]\nclass = "offline"\ncmdline = %s\n' "'offline\\.py'"
  [ -n "$extra" ] && printf '%s\n' "$extra"
  return 0
}

settle_of() { [ "$1" = adaptive ] && echo "$SETTLE_ADAPTIVE" || echo "$SETTLE"; }

# Validate the pairs and columns, and estimate the wall time.
for pair in "$@"; do ( . scripts/gpu/pairs.sh "$pair" ) || exit 2; done
for ph in $PHASES; do policy "$ph" >/dev/null || exit 2; done
round_s=0
for ph in $PHASES; do round_s=$((round_s + PHASE + $(settle_of "$ph"))); done
TOTAL=$((ROUNDS * round_s))           # the phases of one pair
PAIR_EST=$((START_EST + 1 + TOTAL + 8)) # start, online settling, phases, stop + report
ALL_EST=$(($# * PAIR_EST))
echo "gpu-matrix2: pairs $*; $ROUNDS round(s) of [$PHASES], ${PHASE}s each after ${SETTLE}s" \
     "(adaptive ${SETTLE_ADAPTIVE}s) settling"
echo "estimate: ${TOTAL}s of phases + ~$((PAIR_EST - TOTAL))s start/stop = ~${PAIR_EST}s" \
     "($((PAIR_EST / 60))m$((PAIR_EST % 60))s) per pair; ~${ALL_EST}s for all $# pair(s)"
[ "$ALL_EST" -gt "$DEADLINE" ] && echo "warning: over DEADLINE=${DEADLINE}s: rounds of the last" \
    "pair(s) will be cut (run fewer pairs per command, or lower ROUNDS/PHASE)"

if [ -n "$DRY" ]; then
  for ph in $PHASES; do echo "--- $ph"; policy "$ph"; done
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
uname -r | tee -a "$OUT/gpu.txt"
mkdir -p /run/gpreempt-ebpf
now() { date +%s.%N; }

# The number of "policy reloaded"/"NOT reloaded" lines in the controller's stderr so far.
reload_counts() { echo "$(grep -c '^policy reloaded: ' "$1") $(grep -c 'NOT reloaded' "$1")"; }

run_pair() {
  local PAIR=$1 on rate off noff
  . scripts/gpu/pairs.sh "$PAIR"
  if [ $((SECONDS + START_EST + round_s + 10)) -gt "$DEADLINE" ]; then
    echo "=== pair $PAIR skipped: not even one round fits before DEADLINE=${DEADLINE}s" \
         "(now ${SECONDS}s)"
    return 0
  fi
  local pair_t0=$SECONDS
  local P="$OUT/$PAIR" i ph k
  rm -f "$P"-*
  printf '{"pair":"%s","online":"%s","rate":%s,"offline":"%s","offline_processes":%d,' \
    "$PAIR" "$on" "$rate" "$off" "$noff" > "$P-meta.json"
  printf '"phase_s":%s,"settle_s":%s,"settle_adaptive_s":%s,"rounds":%s,"phases":"%s",' \
    "$PHASE" "$SETTLE" "$SETTLE_ADAPTIVE" "$ROUNDS" "$PHASES" >> "$P-meta.json"
  printf '"timeslice":"%s","budget":%s}\n' "$TIMESLICE" "$BUDGET" >> "$P-meta.json"
  echo "=== pair $PAIR: online $on @$rate/s vs offline $off x$noff ($(date +%T))"
  # The audit log's clock (CLOCK_MONOTONIC) against the epoch, for the report.
  python3 -c 'import time; print(time.time() - time.monotonic())' > "$P-clock"
  for ph in $PHASES; do policy "$ph" > "$P-policy-$ph.toml"; done
  local first=${PHASES%% *}
  cp "$P-policy-$first.toml" "$OUT/policy.toml"

  "$GP" $RUNV run --policy "$OUT/policy.toml" --audit "$P-audit.jsonl" 2>"$P-run.err" &
  local RUNP=$!
  for i in $(seq 600); do
    grep -q "gpreempt-ebpf run:" "$P-run.err" 2>/dev/null && break
    kill -0 $RUNP 2>/dev/null || { echo "run exited:"; tail -5 "$P-run.err"; return 1; }
    sleep 0.1
  done
  grep -E "self-test" "$P-run.err" | tail -1

  # All workloads start at once (loads overlap); each offline job warms up with its gate open,
  # then idles. They run until stopped (SIGTERM) and write their JSON then.
  local LONG=$((TOTAL + 900)) OFFP=() ONP
  for i in $(seq "$noff"); do
    touch "$OUT/gate$i"
    python3 scripts/gpu/offline.py "$LONG" "$P-off$i.json" --model "$off" --gate "$OUT/gate$i" \
        >"$P-off$i.log" 2>"$P-off$i.err" & OFFP+=($!)
  done
  python3 scripts/gpu/online.py "$LONG" "$rate" "$P-on.json" --model "$on" --samples \
      >"$P-on.log" 2>"$P-on.err" & ONP=$!
  local t_start=$SECONDS ok
  for i in $(seq 1800); do
    ok=1
    for k in $(seq "$noff"); do grep -q ready "$P-off$k.log" 2>/dev/null || ok=; done
    grep -q ready "$P-on.log" 2>/dev/null || ok=
    [ -n "$ok" ] && break
    for k in $(seq "$noff"); do
      kill -0 "${OFFP[$((k - 1))]}" 2>/dev/null || { echo "offline $k died:"; tail -3 "$P-off$k.err"; }
    done
    kill -0 $ONP 2>/dev/null || { echo "online died:"; tail -3 "$P-on.err"; break; }
    sleep 0.1
  done
  [ -n "$ok" ] || echo "warning: not every workload reported ready"
  for i in $(seq "$noff"); do rm -f "$OUT/gate$i"; done
  echo "workloads ready after $((SECONDS - t_start))s"
  sleep 1   # the online service runs alone a moment (the first phase settles too)

  local reloads=0 rc0 rc1 r0 r1 rs ts t0 t1 st
  for k in $(seq "$ROUNDS"); do
    if [ $((SECONDS + round_s + 10)) -gt "$DEADLINE" ]; then
      echo "  warning: round $k not begun: it would end after DEADLINE=${DEADLINE}s" \
           "(now ${SECONDS}s); $((k - 1)) round(s) done"
      break
    fi
    for ph in $PHASES; do
      read -r r0 rs <<<"$(reload_counts "$P-run.err")"
      cp "$P-policy-$ph.toml" "$OUT/policy.tmp" && mv "$OUT/policy.tmp" "$OUT/policy.toml"
      kill -HUP $RUNP; reloads=$((reloads + 1))
      for i in $(seq "$noff"); do
        case "$ph" in alone) rm -f "$OUT/gate$i" ;; *) touch "$OUT/gate$i" ;; esac
      done
      ts=$(now); st=$(settle_of "$ph"); sleep "$st"
      # Was this phase's policy applied? (the reload is answered within the settling)
      read -r r1 rc1 <<<"$(reload_counts "$P-run.err")"
      if [ "$rc1" -gt "$rs" ]; then rc0=refused; echo "  warning: $ph policy NOT reloaded:" \
          "$(grep 'NOT reloaded' "$P-run.err" | tail -1 | cut -c1-200)"
      elif [ "$r1" -gt "$r0" ]; then rc0=ok; else rc0=unknown; fi
      t0=$(now); sleep "$PHASE"; t1=$(now)
      printf '{"round":%d,"phase":"%s","switched":%s,"start":%s,"end":%s,"reload":"%s"}\n' \
          "$k" "$ph" "$ts" "$t0" "$t1" "$rc0" >> "$P-phases.jsonl"
      echo "  round $k $ph done (reload $rc0)"
    done
  done
  for i in $(seq "$noff"); do rm -f "$OUT/gate$i"; done
  kill -TERM $ONP; wait $ONP; echo "online rc=$?"
  for i in $(seq "$noff"); do
    kill -TERM "${OFFP[$((i - 1))]}"; wait "${OFFP[$((i - 1))]}"; echo "offline $i rc=$?"
  done
  kill -INT $RUNP
  for i in $(seq 200); do kill -0 $RUNP 2>/dev/null || break; sleep 0.1; done
  kill -0 $RUNP 2>/dev/null && { echo "run did not stop on SIGINT: kill -9"; kill -9 $RUNP; }
  wait $RUNP; echo "run rc=$?"
  echo "reloads sent $reloads; reloaded: $(grep -c '^policy reloaded: ' "$P-run.err")," \
       "refused: $(grep -c 'NOT reloaded' "$P-run.err")"
  grep -iE "nothing is left|left suspended|guardian|lease|silent" "$P-run.err" | tail -5 | cut -c1-240
  pgrep -af "scripts/gpu/(online|offline)\.py" && echo "warning: workloads left running"
  python3 scripts/gpu/matrix2_report.py "$P"
  echo "=== pair $PAIR done ($(date +%T), $((SECONDS - pair_t0))s; estimate ${PAIR_EST}s)"
}

for pair in "$@"; do run_pair "$pair"; done
