#!/bin/bash
# Evaluation matrix for the NVIDIA levers, phase design: ONE workload pair per invocation, on the
# device machine (H100; no network; python3 with torch/torchvision), the release binary carried
# at .carry/gpreempt-ebpf. Device command, e.g.:
#   OUT=$OUT scripts/gpu-phases.sh B
# Unlike scripts/gpu-matrix.sh (a fresh process per column), the processes start once: `run`,
# the offline job (gated), the online service and a probe. Then the columns are phases of
# PHASE seconds, interleaved round by round, switched by two things only: the offline job's gate
# (a file: it works while the file exists) and the controller's policy (rewritten, then SIGHUP).
# So every column sees the same warm processes and the same GPU, drift spreads over all columns,
# and a column costs PHASE + SETTLE seconds instead of a model load.
#
# PAIR  (online service @ rate vs offline job; scripts/gpu/online.py, scripts/gpu/offline.py)
#   A  resnet18 b1 @20 req/s   vs resnet50 inference b1024 (the seeds' pair)
#   B  encoder (BERT-base-sized, seq 128, b1) @50 req/s vs resnet50 training b128
#   C  encoder @50 req/s       vs GPT decoder training (6 x d1024, seq 512, b8)
#   D  resnet18 b1 @20 req/s   vs resnet50 training b128
# Phases (PHASES, in this order each round):
#   alone       offline idle (its context kept), policy "off"
#   colo        offline working, policy "off" (classifies nothing offline: no control)
#   timeslice   offline working, [nvidia] lever = "timeslice" (200 us)
#   pause       lever "pause" (FIFO_DISABLE_CHANNELS preempting)
#   pause_sched lever "pause", pause = "schedule" (bOnlyDisableScheduling)
#   both        lever "both" (timeslice, pause after pause_after)
#   both_sched  lever "both", pause = "schedule"
# The probe (online.py --model probe @PROBE_RATE/s, classed "ignore": it never triggers the
# controller) measures how long a newcomer's first tiny kernel waits for the GPU.
# Env: OUT (./gpu-out), GP (.carry/gpreempt-ebpf), PHASE (15), SETTLE (3), ROUNDS (4),
#   PHASES ("alone colo timeslice both_sched"), PROBE_RATE (50), RUNV (-v), TIMESLICE (200us),
#   PAUSE_AFTER (5ms).
# Results: $OUT/$PAIR-{on,probe,off}.json (per-request samples / iteration ends),
#   $OUT/$PAIR-phases.jsonl (each phase's window), $OUT/$PAIR-audit.jsonl, $OUT/$PAIR-run.err,
#   and the table from scripts/gpu/phases_report.py ($OUT/$PAIR-phases.{md,json}).
set -u
PAIR=${1:?usage: scripts/gpu-phases.sh A|B|C|D (env OUT PHASE SETTLE ROUNDS PHASES)}
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
PHASE=${PHASE:-15}; SETTLE=${SETTLE:-3}; ROUNDS=${ROUNDS:-4}
PHASES=${PHASES:-alone colo timeslice both_sched}
PROBE_RATE=${PROBE_RATE:-50}; RUNV=${RUNV--v}
TIMESLICE=${TIMESLICE:-200us}; PAUSE_AFTER=${PAUSE_AFTER:-5ms}
. scripts/gpu/pairs.sh "$PAIR"
P="$OUT/$PAIR"
rm -f "$P"-*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
uname -r | tee -a "$OUT/gpu.txt"
mkdir -p /run/gpreempt-ebpf

# policy NAME: the policy file of a phase. One template; only [nvidia] differs.
policy() {
  local lever=timeslice pause=preempt off_rule=1
  case "$1" in
    alone|colo) off_rule= ;;
    timeslice) lever=timeslice ;;
    pause) lever=pause ;;
    pause_sched) lever=pause pause=schedule ;;
    both) lever=both ;;
    both_sched) lever=both pause=schedule ;;
    *) echo "unknown phase $1" >&2; return 1 ;;
  esac
  cat <<EOF
# scripts/gpu-phases.sh, phase $1 (the seeds' [policy] values)
[policy]
strategy = "priority"
window = "10ms"
resume_after = "3ms"
max_suspend = "1s"
min_run = "50ms"
min_interval = "10ms"
default = "ignore"
launch_hints = true

[nvidia]
lever = "$lever"
offline_timeslice = "$TIMESLICE"
pause_after = "$PAUSE_AFTER"
pause = "$pause"

[[rule]]
class = "ignore"
cmdline = '--model probe'

[[rule]]
class = "online"
cmdline = 'online\.py'
uid = 0
EOF
  [ -n "$off_rule" ] && printf '\n[[rule]]\nclass = "offline"\ncmdline = %s\n' "'offline\\.py'"
  return 0
}

now() { date +%s.%N; }
# The audit log's clock (CLOCK_MONOTONIC) against the epoch, for the report.
python3 -c 'import time; print(time.time() - time.monotonic())' > "$P-clock"

for ph in $PHASES; do policy "$ph" > "$OUT/policy-$ph.toml" || exit 2; done
first=${PHASES%% *}
cp "$OUT/policy-$first.toml" "$OUT/policy.toml"

"$GP" $RUNV run --policy "$OUT/policy.toml" --audit "$P-audit.jsonl" 2>"$P-run.err" &
RUNP=$!
for i in $(seq 600); do
  grep -q "gpreempt-ebpf run:" "$P-run.err" 2>/dev/null && break
  kill -0 $RUNP 2>/dev/null || { echo "run exited:"; tail -5 "$P-run.err"; exit 1; }
  sleep 0.1
done
grep -E "self-test" "$P-run.err" | tail -1

TOTAL=$(( ROUNDS * $(echo $PHASES | wc -w) * (PHASE + SETTLE) + 15 ))
GATE="$OUT/gate"; rm -f "$GATE"
python3 scripts/gpu/offline.py $((TOTAL + 200)) "$P-off.json" --model "$off" --gate "$GATE" \
    >"$P-off.log" 2>"$P-off.err" & OFFP=$!
# The offline job warms up with the gate open, then idles.
touch "$GATE"
for i in $(seq 1200); do
  grep -q ready "$P-off.log" 2>/dev/null && break
  kill -0 $OFFP 2>/dev/null || { echo "offline died:"; tail -3 "$P-off.err"; break; }
  sleep 0.1
done
rm -f "$GATE"
python3 scripts/gpu/online.py "$TOTAL" "$rate" "$P-on.json" --model "$on" --samples \
    2>"$P-on.err" & ONP=$!
python3 scripts/gpu/online.py "$TOTAL" "$PROBE_RATE" "$P-probe.json" --model probe --samples \
    2>"$P-probe.err" & PRP=$!
sleep 8   # both warmed up (20 requests each) and measuring

reloads=0
echo "pair $PAIR: online $on @$rate/s vs offline $off; $ROUNDS round(s) of: $PHASES;" \
     "${PHASE}s each after ${SETTLE}s settling"
for k in $(seq "$ROUNDS"); do
  for ph in $PHASES; do
    cp "$OUT/policy-$ph.toml" "$OUT/policy.tmp" && mv "$OUT/policy.tmp" "$OUT/policy.toml"
    kill -HUP $RUNP; reloads=$((reloads + 1))
    case "$ph" in alone) rm -f "$GATE" ;; *) touch "$GATE" ;; esac
    ts=$(now); sleep "$SETTLE"
    t0=$(now); sleep "$PHASE"; t1=$(now)
    printf '{"round":%d,"phase":"%s","switched":%s,"start":%s,"end":%s}\n' "$k" "$ph" "$ts" \
        "$t0" "$t1" \
        >> "$P-phases.jsonl"
    echo "  round $k $ph done"
  done
done
rm -f "$GATE"
wait $ONP; echo "online rc=$?"; wait $PRP; echo "probe rc=$?"
kill -TERM $OFFP; wait $OFFP; echo "offline rc=$?"
kill -INT $RUNP
for i in $(seq 200); do kill -0 $RUNP 2>/dev/null || break; sleep 0.1; done
kill -0 $RUNP 2>/dev/null && { echo "run did not stop on SIGINT: kill -9"; kill -9 $RUNP; }
wait $RUNP; echo "run rc=$?"
echo "reloads sent $reloads; reloaded: $(grep -c '^policy reloaded: ' "$P-run.err")," \
     "refused: $(grep -c 'NOT reloaded' "$P-run.err")"
grep -iE "nothing is left|left suspended|guardian|lease|silent" "$P-run.err" | tail -5 | cut -c1-240
pgrep -af "scripts/gpu/(online|offline)\.py" && echo "warning: workloads left running"
python3 scripts/gpu/phases_report.py "$P"
