#!/bin/bash
# Evaluation matrix 2 for the NVIDIA levers and the adaptive strategy, phase design (as
# scripts/gpu-phases.sh), one or more workload pairs per invocation, on the device machine (H100s
# or H200s; no network; python3 with torch/torchvision), the release binary carried at
# .carry/gpreempt-ebpf.
# Device command, 4 pairs at once on a 4-GPU host (~6.5 minutes with the defaults):
#   OUT=$OUT scripts/gpu-matrix2.sh E F G H
# or, on one GPU, one pair (~6.5 minutes; two pairs one after the other exceed one 10-minute
# command with the defaults: lower ROUNDS or SETTLE_FIRST_ADAPTIVE):
#   OUT=$OUT scripts/gpu-matrix2.sh E
# PARALLEL (more than one pair, more than one GPU, no more pairs than GPUs): pair i runs on GPU
# i of GPUS (CUDA_VISIBLE_DEVICES=GPUS[i] for its online and offline processes), every pair at
# once under ONE controller (`run`: one per host, it owns /run/gpreempt-ebpf and decides per GPU,
# so pairs on different GPUs do not interact), with one phase schedule: the columns switch for all
# pairs together (every pair's gates, the one policy file + SIGHUP). Right after every process
# printed "ready" a sanity check (scripts/gpu/matrix2_report.py --gpu-check) prints each pid's
# GPU (nvidia-smi --query-compute-apps; /dev/nvidiaN descriptors where nvidia-smi does not list a
# pid), its CUDA_VISIBLE_DEVICES and the controller's class for it (status.json); if two pairs
# share a GPU the run is aborted (workloads and controller stopped, files written, exit 3).
# SEQUENTIAL (one pair, one GPU, GPUS of one entry, or more pairs than GPUs): as before, one pair
# after the other, each with its own controller (pinned to GPUS' first entry only where GPUS is
# given).
# Per group the processes start once: the controller (`run`), the offline job(s) (each gated by
# its own file) and the online service(s). The columns are phases of PHASE seconds, every column
# once per round, rounds interleaved, switched by two things only: the offline gates (a job works
# while its file exists) and the controller's policy (rewritten, then SIGHUP). No probe here.
# A pair is one or more online services (pairs.sh's ons: model@rate each, on the pair's GPU) and
# one or more offline processes (offs: one process per entry, models may differ); every online
# service matches the policy's online rule (cmdline online\.py), every offline one the offline
# rule. After every phase the controller's status file is copied with the time of the copy
# ($G-status.jsonl): its "requests" are the controller's own per-pid request latencies over the
# last 60 s, which the report sets beside the clients' own (the "tool vs client" table).
#
# PAIR  (scripts/gpu/pairs.sh; models of scripts/gpu/online.py, scripts/gpu/offline.py)
#   A-D  as in scripts/gpu-phases.sh
#   E  eager LLM decode (GPT-2-small-sized, KV cache, b1, 32 tokens, .item() per token) @4 req/s
#      vs an fp16 GEMM loop (8192^3 matmuls back to back: kernels of a few ms)
#   F  ResNet-50 b8 fp16 @50 req/s vs TWO ResNet-50 training b128 processes (offline = their sum)
#   G  ResNet-50 b8 fp16 @50 req/s vs ONE ResNet-50 training b128 ("nothing to remove")
#   H  encoder (BERT-base-sized) b1 @50 req/s vs encoder inference b8: an offline job of many
#      short kernels, launch-bound (see "Pair H" below)
#   I  diffusion denoiser (conv UNet, 20 steps, one sync per request, ~60 ms) @2 req/s vs THREE
#      different offline processes: fp16 GEMM loop, ResNet-50 training b128, GPT decoder training
#      (offline: mixed units, so the report's offline figure is relative to colo; see the report)
#   J  TWO online services on one GPU: speech encoder-decoder (Whisper-like, 24 tokens, a sync per
#      token) @3 req/s and ResNet-18 b1 @30 req/s, vs GPT decoder training (the goal is every
#      service's: the report's p99 figures are per service, the verdicts on the worst one)
# Columns (PHASES, in this order each round; policy text: policy() below, the one place):
#   alone       offline gates closed (contexts kept), no offline rule
#   colo        offline working, no offline rule (no control)
#   ts_static   [nvidia] lever = "timeslice", offline_timeslice (200us)
#   ts_dynamic  [nvidia] lever = "dynamic": the offline timeslice shortened only while online work
#               is pending, restored after
#   pause       [nvidia] lever = "pause"
#   adaptive    [policy] strategy = "adaptive", [adaptive] online_p99_budget = 1.1 (no lever: on
#               NVIDIA the controller chooses one per GPU by measurement); SETTLE_ADAPTIVE applies,
#               SETTLE_FIRST_ADAPTIVE to the first adaptive phase under a controller (each group's
#               own: the tuner's first calibration needs up to ~90 s at 1-2 requests/s)
# Pair H: every lever assumes offline work holds the GPU for long stretches that a shorter slice
# or a pause cuts. An offline job of many short kernels (encoder b8: tens of us each, CPU-launch
# bound) leaves gaps in which the GPU switches to online anyway, so colo may already be near
# alone and any control mostly costs offline throughput (a pause stalls its launch stream; a
# shorter slice adds switches for little gain). It tests that the adaptive strategy measures
# "little to remove" on a different mechanism than G (gaps, not a shared-well compute mix), with
# the same online service as B so the two can be compared.
#
# Env: OUT (./gpu-out), GP (.carry/gpreempt-ebpf), PHASE (10), SETTLE (3), SETTLE_ADAPTIVE (8),
#   SETTLE_FIRST_ADAPTIVE (90: the settling of a group's first adaptive phase; in the estimate),
#   ROUNDS (3), PHASES ("alone colo ts_static ts_dynamic pause adaptive"), TIMESLICE (200us),
#   BUDGET (1.1: online_p99_budget), RUNV (-v), START_EST (35: seconds to start a group's
#   processes, for the estimate), DRY (1: print the estimate and the policies, run nothing),
#   GPUS (GPU indices, "0 1 2 3" or "0,1,2,3"; default: every GPU nvidia-smi lists),
#   RUNDIR (/run/gpreempt-ebpf: where the controller publishes status.json; read only),
#   DEADLINE (592: seconds from this script's start; a round that would end after it is not
#   begun, and a group that could not finish one round is skipped, so a 10-minute device command
#   always ends with every started pair's files written and reported).
# Results per pair: $OUT/$PAIR-on.json (the first online service: per-request arrivals/latencies;
#   $OUT/$PAIR-on2.json, -on3.json... the others; logs -on<n>.log/.err likewise),
#   $OUT/$PAIR-off<i>.json (per offline process, i = 1.. in offs' order: iteration end times),
#   $OUT/$PAIR-phases.jsonl (each phase's window and whether its policy reload was applied; the
#   same windows for every pair of a group),
#   $OUT/$PAIR-audit.jsonl (in parallel: the pair's records of the one audit log, split by pid, by
#   GPU for records without a pid; matrix2_report.py --split-audit), $OUT/$PAIR-clock,
#   $OUT/$PAIR-meta.json (with pids, GPU and the sanity check's mapping; "services": model, rate,
#   file, pid of each online service, "offline_models": model, file, pid of each offline process;
#   "online"/"rate"/"offline" = the first entries, "pids": {"online": the first service's,
#   "services": all, "offline": [...]}),
#   $OUT/$PAIR-policy-<column>.toml, and the table from scripts/gpu/matrix2_report.py
#   ($OUT/$PAIR-matrix2.{md,json}). Per group ($G = $OUT/$PAIR alone, $OUT/all-<PAIRS> in parallel):
#   $G-run.err (the controller's stderr), $G-gpus.csv, $G-apps.csv (nvidia-smi at the sanity
#   check), $G-gpucheck.json, $G-status.json (the controller's status then), $G-status.jsonl
#   (after every phase: {"t": epoch s of the copy, "round", "phase", "status": status.json, or
#   null, "mtime": its mtime}; one file for the group: a pair's report reads its own pids); in
#   parallel also $G-audit.jsonl (the whole audit log), $G-audit-unattributed.jsonl,
#   $G-matrix2.json.
# The device tool brings back at most 8 files from $OUT: tar $OUT into one file there.
set -u
[ $# -ge 1 ] || { echo "usage: scripts/gpu-matrix2.sh PAIR... (A-J; env OUT GPUS PHASE SETTLE" \
                       "SETTLE_ADAPTIVE SETTLE_FIRST_ADAPTIVE ROUNDS PHASES TIMESLICE BUDGET DRY" \
                       "DEADLINE)" >&2; exit 2; }
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
PHASE=${PHASE:-10}; SETTLE=${SETTLE:-3}; SETTLE_ADAPTIVE=${SETTLE_ADAPTIVE:-8}; ROUNDS=${ROUNDS:-3}
SETTLE_FIRST_ADAPTIVE=${SETTLE_FIRST_ADAPTIVE:-90}
PHASES=${PHASES:-alone colo ts_static ts_dynamic pause adaptive}
TIMESLICE=${TIMESLICE:-200us}; BUDGET=${BUDGET:-1.1}; RUNV=${RUNV--v}
START_EST=${START_EST:-35}; DRY=${DRY:-}; DEADLINE=${DEADLINE:-592}
RUNDIR=${RUNDIR:-/run/gpreempt-ebpf}
REPORT=scripts/gpu/matrix2_report.py

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
# The first adaptive phase under a controller settles SETTLE_FIRST_ADAPTIVE instead: this much
# more, once per group (0 without an adaptive column or round).
FIRST_EXTRA=0
[[ " $PHASES " == *" adaptive "* ]] && [ "$ROUNDS" -ge 1 ] && \
  FIRST_EXTRA=$((SETTLE_FIRST_ADAPTIVE - SETTLE_ADAPTIVE))

# Validate the pairs and columns.
for pair in "$@"; do ( . scripts/gpu/pairs.sh "$pair" ) || exit 2; done
for ph in $PHASES; do policy "$ph" >/dev/null || exit 2; done
[ "$(printf '%s\n' "$@" | sort | uniq -d)" ] && { echo "a pair is named twice: $*" >&2; exit 2; }

# The GPUs, and whether the pairs run at once (one per GPU) or one after the other.
GPUS_GIVEN=${GPUS:+1}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)}
read -ra GPU_LIST <<<"$(echo ${GPUS//,/ })"
NG=${#GPU_LIST[@]}
for g in "${GPU_LIST[@]}"; do
  [[ "$g" =~ ^[0-9]+$ ]] || { echo "GPUS: not a GPU index: '$g' (GPUS='$GPUS')" >&2; exit 2; }
done
[ "$(printf '%s\n' "${GPU_LIST[@]}" | sort | uniq -d)" ] && { echo "GPUS names a GPU twice:" \
    "${GPU_LIST[*]}" >&2; exit 2; }
PARALLEL=
[ $# -gt 1 ] && [ "$NG" -gt 1 ] && [ $# -le "$NG" ] && PARALLEL=1

# The estimate: the phases of one group, its start and stop.
round_s=0
for ph in $PHASES; do round_s=$((round_s + PHASE + $(settle_of "$ph"))); done
TOTAL=$((ROUNDS * round_s + FIRST_EXTRA)) # the phases of one group
PAIR_EST=$((START_EST + 1 + TOTAL + 8))   # start, online settling, phases, stop + report
echo "gpu-matrix2: pairs $*; $ROUNDS round(s) of [$PHASES], ${PHASE}s each after ${SETTLE}s" \
     "(adaptive ${SETTLE_ADAPTIVE}s, the first adaptive phase ${SETTLE_FIRST_ADAPTIVE}s) settling"
for pair in "$@"; do
  ( . scripts/gpu/pairs.sh "$pair"; echo "  $pair: online ${ons// / + }; offline ${offs// / + }" )
done
if [ -n "$PARALLEL" ]; then
  # Once: start (all processes load at once), the sanity check, the phases; per extra pair a few
  # seconds of stopping its processes and reporting.
  ALL_EST=$((START_EST + 1 + 3 + TOTAL + 8 + 3 * ($# - 1)))
  echo "parallel: ONE controller; pair i on GPU i of GPUS:" \
       "$(i=0; for p in "$@"; do printf '%s->%s ' "$p" "${GPU_LIST[$i]}"; i=$((i + 1)); done)"
  echo "estimate: ${TOTAL}s of phases + ~$((ALL_EST - TOTAL))s start/check/stop = ~${ALL_EST}s" \
       "($((ALL_EST / 60))m$((ALL_EST % 60))s) for all $# pairs at once"
  [ "$ALL_EST" -gt "$DEADLINE" ] && echo "warning: over DEADLINE=${DEADLINE}s: the last" \
      "round(s) will be cut (lower ROUNDS/PHASE)"
else
  ALL_EST=$(($# * PAIR_EST))
  if [ $# -eq 1 ]; then why="one pair"
  elif [ "$NG" -eq 0 ]; then why="no GPU list (GPUS unset, nvidia-smi lists none)"
  elif [ "$NG" -eq 1 ]; then why="one GPU (${GPU_LIST[0]})"
  else why="$# pairs > $NG GPUs"; fi
  echo "sequential ($why): one pair after the other, a controller each$([ -n "$GPUS_GIVEN" ] \
       && echo " (pinned to GPU ${GPU_LIST[0]})")"
  echo "estimate: ${TOTAL}s of phases + ~$((PAIR_EST - TOTAL))s start/stop = ~${PAIR_EST}s" \
       "($((PAIR_EST / 60))m$((PAIR_EST % 60))s) per pair; ~${ALL_EST}s for all $# pair(s)"
  [ "$ALL_EST" -gt "$DEADLINE" ] && echo "warning: over DEADLINE=${DEADLINE}s: rounds of the last" \
      "pair(s) will be cut (run fewer pairs per command, or lower ROUNDS/PHASE)"
fi

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

# run_group GPU PAIR...: one controller, the pairs' processes (pair j pinned to GPU j of the
# space-separated list GPU, "-" = not pinned), the rounds, the stop, the reports. Returns 3 when
# the sanity check found two pairs on one GPU (after a clean stop).
run_group() {
  local -a gpus pairs=("${@:2}")
  read -ra gpus <<<"$1"
  local np=${#pairs[@]} PAIR P G j i k ph est
  if [ "$np" -gt 1 ]; then G="$OUT/all-$(printf '%s' "${pairs[@]}")"; est=$ALL_EST
  else G="$OUT/${pairs[0]}"; est=$PAIR_EST; fi
  if [ $((SECONDS + START_EST + round_s + FIRST_EXTRA + 10)) -gt "$DEADLINE" ]; then
    echo "=== pair(s) ${pairs[*]} skipped: not even one round fits before DEADLINE=${DEADLINE}s" \
         "(now ${SECONDS}s)"
    return 0
  fi
  local grp_t0=$SECONDS audit="$G-audit.jsonl"
  [ "$np" -gt 1 ] && rm -f "$G"-*
  local -A ON RATE OFF NOFF ONS OFFS GPU ONPIDS=() OFFPIDS=()
  local on rate off noff ons offs e m ontxt offtxt
  for j in "${!pairs[@]}"; do
    PAIR=${pairs[$j]}; P="$OUT/$PAIR"
    . scripts/gpu/pairs.sh "$PAIR"
    ON[$PAIR]=$on RATE[$PAIR]=$rate OFF[$PAIR]=$off NOFF[$PAIR]=$noff GPU[$PAIR]=${gpus[$j]:--}
    ONS[$PAIR]=$ons OFFS[$PAIR]=$offs
    rm -f "$P"-*
    ontxt=; for e in $ons; do ontxt+="${ontxt:+ + }${e%%@*} @${e#*@}/s"; done
    offtxt="$off x$noff"  # one model (the old pairs' form), else every process's model
    for m in $offs; do [ "$m" = "$off" ] || { offtxt=${offs// / + }; break; }; done
    echo "=== pair $PAIR: online $ontxt vs offline $offtxt$([ "${GPU[$PAIR]}" != - ] \
         && echo " on GPU ${GPU[$PAIR]}") ($(date +%T))"
  done
  # on_sfx N: the file suffix of online service N (1: "$P-on.json", as before; N: "$P-onN.json").
  on_sfx() { [ "$1" -gt 1 ] && echo "$1"; }
  write_meta() {  # PAIR [more JSON members, each starting with ","]
    local p=$1 g=${GPU[$1]} e m i sep pid
    local -a pids
    printf '{"pair":"%s","online":"%s","rate":%s,"offline":"%s","offline_processes":%d,' \
      "$p" "${ON[$p]}" "${RATE[$p]}" "${OFF[$p]}" "${NOFF[$p]}" > "$OUT/$p-meta.json"
    # Every service and offline process, with its pid once started (null before).
    read -ra pids <<<"${ONPIDS[$p]:-}"; i=0 sep=
    printf '"services":[' >> "$OUT/$p-meta.json"
    for e in ${ONS[$p]}; do
      i=$((i + 1)); pid=${pids[$((i - 1))]:-null}
      printf '%s{"model":"%s","rate":%s,"file":"%s","pid":%s}' "$sep" "${e%%@*}" "${e#*@}" \
        "$p-on$(on_sfx $i).json" "$pid" >> "$OUT/$p-meta.json"; sep=,
    done
    read -ra pids <<<"${OFFPIDS[$p]:-}"; i=0 sep=
    printf '],"offline_models":[' >> "$OUT/$p-meta.json"
    for m in ${OFFS[$p]}; do
      i=$((i + 1)); pid=${pids[$((i - 1))]:-null}
      printf '%s{"model":"%s","file":"%s","pid":%s}' "$sep" "$m" "$p-off$i.json" "$pid" \
        >> "$OUT/$p-meta.json"; sep=,
    done
    printf '],"phase_s":%s,"settle_s":%s,"settle_adaptive_s":%s,"settle_first_adaptive_s":%s,' \
      "$PHASE" "$SETTLE" "$SETTLE_ADAPTIVE" "$SETTLE_FIRST_ADAPTIVE" >> "$OUT/$p-meta.json"
    printf '"rounds":%s,"phases":"%s",' "$ROUNDS" "$PHASES" >> "$OUT/$p-meta.json"
    printf '"timeslice":"%s","budget":%s,"gpu":%s,"group":"%s"%s}\n' "$TIMESLICE" "$BUDGET" \
      "$([ "$g" = - ] && echo null || echo "$g")" "${pairs[*]}" "${2:-}" >> "$OUT/$p-meta.json"
  }
  # status_line ROUND PHASE: the controller's status file now, with the wall-clock time of the
  # copy, as one JSON line of $G-status.jsonl (status null where it cannot be read). Its
  # "requests" (pid -> count, p50_ns, p99_ns...) cover the requests that ended in the 60 s before
  # the controller wrote it (at most ~1 s before "t": it rewrites the file every second).
  status_line() {
    python3 - "$RUNDIR/status.json" "$1" "$2" >> "$G-status.jsonl" <<'PY'
import json, os, sys, time
path, k, ph = sys.argv[1:]
t, st, mtime, err = time.time(), None, None, None
try:
    with open(path) as f:  # the controller replaces it by rename: one open, one version
        mtime, st = os.fstat(f.fileno()).st_mtime, json.load(f)
except (OSError, ValueError) as e:
    err = str(e)[:200]
print(json.dumps({"t": round(t, 4), "round": int(k), "phase": ph, "status": st, "mtime": mtime,
                  **({"error": err} if err else {})}, separators=(",", ":")))
PY
  }
  for PAIR in "${pairs[@]}"; do write_meta "$PAIR"; done
  [ "$np" -gt 1 ] && echo "=== ${pairs[*]} at once under one controller ($G-*)"
  # The audit log's clock (CLOCK_MONOTONIC) against the epoch, for the report.
  python3 -c 'import time; print(time.time() - time.monotonic())' > "$G-clock.tmp"
  for PAIR in "${pairs[@]}"; do
    cp "$G-clock.tmp" "$OUT/$PAIR-clock"
    for ph in $PHASES; do policy "$ph" > "$OUT/$PAIR-policy-$ph.toml"; done
  done
  rm -f "$G-clock.tmp"
  local first=${PHASES%% *}
  policy "$first" > "$OUT/policy.toml"

  "$GP" $RUNV run --policy "$OUT/policy.toml" --audit "$audit" 2>"$G-run.err" &
  local RUNP=$!
  for i in $(seq 600); do
    grep -q "gpreempt-ebpf run:" "$G-run.err" 2>/dev/null && break
    kill -0 $RUNP 2>/dev/null || { echo "run exited:"; tail -5 "$G-run.err"; return 1; }
    sleep 0.1
  done
  grep -E "self-test" "$G-run.err" | tail -1

  # All workloads start at once (loads overlap); each offline job warms up with its gate open,
  # then idles. They run until stopped (SIGTERM) and write their JSON then.
  local LONG=$((TOTAL + 900))
  local -a PID=() NAME=() LOG=() ERR=() GATES=() envv
  local sfx
  for PAIR in "${pairs[@]}"; do
    P="$OUT/$PAIR"; envv=()
    [ "${GPU[$PAIR]}" != - ] && envv=("CUDA_VISIBLE_DEVICES=${GPU[$PAIR]}")
    i=0
    for m in ${OFFS[$PAIR]}; do  # one process per entry, each with its own gate
      i=$((i + 1))
      touch "$OUT/gate-$PAIR-$i"; GATES+=("$OUT/gate-$PAIR-$i")
      env "${envv[@]}" python3 scripts/gpu/offline.py "$LONG" "$P-off$i.json" \
          --model "$m" --gate "$OUT/gate-$PAIR-$i" >"$P-off$i.log" 2>"$P-off$i.err" &
      PID+=($!) NAME+=("$PAIR offline $i") LOG+=("$P-off$i.log") ERR+=("$P-off$i.err")
      OFFPIDS[$PAIR]="${OFFPIDS[$PAIR]:-}${OFFPIDS[$PAIR]:+ }$!"
    done
    i=0
    for e in ${ONS[$PAIR]}; do  # every online service of the pair, on the pair's GPU
      i=$((i + 1)); sfx=$(on_sfx $i)
      env "${envv[@]}" python3 scripts/gpu/online.py "$LONG" "${e#*@}" "$P-on$sfx.json" \
          --model "${e%%@*}" --samples >"$P-on$sfx.log" 2>"$P-on$sfx.err" &
      PID+=($!) NAME+=("$PAIR online${sfx:+ $sfx}") LOG+=("$P-on$sfx.log") ERR+=("$P-on$sfx.err")
      ONPIDS[$PAIR]="${ONPIDS[$PAIR]:-}${ONPIDS[$PAIR]:+ }$!"
    done
  done
  local t_start=$SECONDS ok n
  local -A DEAD=()
  for i in $(seq 1800); do
    ok=1
    for n in "${!PID[@]}"; do
      grep -q ready "${LOG[$n]}" 2>/dev/null && continue
      if ! kill -0 "${PID[$n]}" 2>/dev/null; then
        [ -z "${DEAD[$n]:-}" ] && { echo "${NAME[$n]} died:"; tail -3 "${ERR[$n]}"; DEAD[$n]=1; }
        continue
      fi
      ok=
    done
    [ -n "$ok" ] && break
    sleep 0.1
  done
  [ -n "$ok" ] && [ ${#DEAD[@]} -eq 0 ] || echo "warning: not every workload reported ready"
  rm -f "${GATES[@]}"
  echo "workloads ready after $((SECONDS - t_start))s"

  # Sanity check: which GPU each process is on (nvidia-smi, as the controller would see them),
  # and how the controller classified it. Two pairs on one GPU: abort.
  local onp offp pj
  for PAIR in "${pairs[@]}"; do
    onp=${ONPIDS[$PAIR]} offp=${OFFPIDS[$PAIR]:-}
    pj="\"online\":${onp%% *},\"services\":[${onp// /,}],\"offline\":[${offp// /,}]"
    write_meta "$PAIR" ",\"pids\":{$pj}"
  done
  sleep 1   # the online service runs alone a moment (the first phase settles too); status.json
  nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader > "$G-gpus.csv" 2>&1
  nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader > "$G-apps.csv" 2>&1
  cp "$RUNDIR/status.json" "$G-status.json" 2>/dev/null || echo "(no $RUNDIR/status.json)"
  local abort= crc
  python3 "$REPORT" --gpu-check "$G" "${pairs[@]/#/$OUT/}"; crc=$?
  [ "$crc" -eq 3 ] && abort=3
  [ "$crc" -ne 0 ] && [ "$crc" -ne 3 ] && echo "warning: the sanity check could not run (rc $crc)"

  local reloads=0 rc0 rc1 r0 r1 rs ts t0 t1 st first_extra=$FIRST_EXTRA
  [ -n "$abort" ] && echo "ABORT: the sanity check failed (rc $abort): no rounds; stopping"
  for k in $(seq "$ROUNDS"); do
    [ -n "$abort" ] && break
    # first_extra: the first adaptive phase's longer settling, until it has run.
    if [ $((SECONDS + round_s + first_extra + 10)) -gt "$DEADLINE" ]; then
      echo "  warning: round $k not begun: it would end after DEADLINE=${DEADLINE}s" \
           "(now ${SECONDS}s); $((k - 1)) round(s) done"
      break
    fi
    for ph in $PHASES; do
      read -r r0 rs <<<"$(reload_counts "$G-run.err")"
      cp "$OUT/${pairs[0]}-policy-$ph.toml" "$OUT/policy.tmp" && mv "$OUT/policy.tmp" "$OUT/policy.toml"
      kill -HUP $RUNP; reloads=$((reloads + 1))
      case "$ph" in alone) rm -f "${GATES[@]}" ;; *) touch "${GATES[@]}" ;; esac
      st=$(settle_of "$ph")
      if [ "$ph" = adaptive ] && [ "$first_extra" != 0 ]; then
        st=$SETTLE_FIRST_ADAPTIVE first_extra=0
      fi
      ts=$(now); sleep "$st"
      # Was this phase's policy applied? (the reload is answered within the settling)
      read -r r1 rc1 <<<"$(reload_counts "$G-run.err")"
      if [ "$rc1" -gt "$rs" ]; then rc0=refused; echo "  warning: $ph policy NOT reloaded:" \
          "$(grep 'NOT reloaded' "$G-run.err" | tail -1 | cut -c1-200)"
      elif [ "$r1" -gt "$r0" ]; then rc0=ok; else rc0=unknown; fi
      t0=$(now); sleep "$PHASE"; t1=$(now)
      for PAIR in "${pairs[@]}"; do
        printf '{"round":%d,"phase":"%s","switched":%s,"start":%s,"end":%s,"reload":"%s"}\n' \
            "$k" "$ph" "$ts" "$t0" "$t1" "$rc0" >> "$OUT/$PAIR-phases.jsonl"
      done
      status_line "$k" "$ph"
      echo "  round $k $ph done (reload $rc0)"
    done
  done
  rm -f "${GATES[@]}"
  # Stop: every workload at once (each writes its JSON), then the controller.
  for n in "${!PID[@]}"; do kill -TERM "${PID[$n]}" 2>/dev/null; done
  for n in "${!PID[@]}"; do wait "${PID[$n]}"; echo "${NAME[$n]} rc=$?"; done
  kill -INT $RUNP
  for i in $(seq 200); do kill -0 $RUNP 2>/dev/null || break; sleep 0.1; done
  kill -0 $RUNP 2>/dev/null && { echo "run did not stop on SIGINT: kill -9"; kill -9 $RUNP; }
  wait $RUNP; echo "run rc=$?"
  echo "reloads sent $reloads; reloaded: $(grep -c '^policy reloaded: ' "$G-run.err")," \
       "refused: $(grep -c 'NOT reloaded' "$G-run.err")"
  grep -iE "nothing is left|left suspended|guardian|lease|silent" "$G-run.err" | tail -5 | cut -c1-240
  pgrep -af "scripts/gpu/(online|offline)\.py" && echo "warning: workloads left running"
  if [ "$np" -gt 1 ]; then
    # The one audit log, split per pair: by pid, by GPU for records without a pid.
    python3 "$REPORT" --split-audit "$audit" "${pairs[@]/#/$OUT/}"
  fi
  if [ -n "$abort" ]; then
    echo "=== ${pairs[*]} ABORTED ($(date +%T), $((SECONDS - grp_t0))s): see $G-gpucheck.json"
    return 3
  fi
  if [ "$np" -gt 1 ]; then
    python3 "$REPORT" "${pairs[@]/#/$OUT/}" --json "$G-matrix2.json"
  else
    python3 "$REPORT" "$OUT/${pairs[0]}"
  fi
  echo "=== pair(s) ${pairs[*]} done ($(date +%T), $((SECONDS - grp_t0))s; estimate ${est}s)"
}

if [ -n "$PARALLEL" ]; then
  run_group "${GPU_LIST[*]:0:$#}" "$@"
  exit $?
fi
rc=0
for pair in "$@"; do
  run_group "$([ -n "$GPUS_GIVEN" ] && echo "${GPU_LIST[0]}" || echo -)" "$pair" || rc=$?
  [ "$rc" -eq 3 ] && exit 3
done
exit "$rc"
