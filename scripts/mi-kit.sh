#!/bin/bash
# The MI host kit: the seeds' proof of concept on an AMD Instinct host with ROCm PyTorch, in one
# command, into one report directory (report.md + report.json, and every raw file behind them).
# docs/mi-kit.md says how to run it and what to send back.
#
#   sudo scripts/mi-kit.sh [--emulated] [--short] [--out DIR] [--gp PATH] [--colo-secs S]
#                          [--inv-secs S] [--cycles N] [--hold-ms MS] [--gap-ms MS]
#
# Steps (each one's failure is reported with its stderr tail; the others still run):
#   doctor      `gpreempt-ebpf doctor --json`
#   inventory   a CNN (ResNet-50 b1024) and a transformer (encoder b8 s128), one at a time:
#               `queues --json` (queues, rings, HQD slots) and `trace --dispatches --json`
#               (dispatch mix, RPTR/WPTR behaviour)
#   cycles      `kfd-cycles` on a busy offline ResNet-50 while an online ResNet-18 b1 at 20 req/s
#               runs, and the same online run without cycling (its p99 with vs without)
#   colocation  online ResNet-18 b1 @20 req/s + offline ResNet-50 b1024 for --colo-secs
#               (default 180): no control, then `run --policy examples/mi-kit.toml`
# --emulated runs all of it inside `gpreempt-ebpf sim` with its emulated workloads
# (resnet18_b1, resnet50_b1024, transformer_b8_s128); every number is then labelled emulated.
# --short shrinks every duration (CI).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

EMULATED=0 SHORT=0 OUT="" GP=${GP:-}
COLO_SECS="" INV_SECS="" CYCLES="" HOLD_MS="" GAP_MS=""
ARGS=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --emulated) EMULATED=1 ;;
    --short) SHORT=1 ;;
    --out) OUT=${2:?--out needs a directory}; shift ;;
    --gp) GP=${2:?--gp needs a path}; shift ;;
    --colo-secs) COLO_SECS=${2:?}; shift ;;
    --inv-secs) INV_SECS=${2:?}; shift ;;
    --cycles) CYCLES=${2:?}; shift ;;
    --hold-ms) HOLD_MS=${2:?}; shift ;;
    --gap-ms) GAP_MS=${2:?}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "mi-kit: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
for v in COLO_SECS INV_SECS CYCLES HOLD_MS GAP_MS; do
  if [ -n "${!v}" ] && ! [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]]; then
    echo "mi-kit: --$(echo "$v" | tr 'A-Z_' 'a-z-') must be a positive integer" >&2; exit 2
  fi
done
if [ "$SHORT" = 1 ]; then
  COLO_SECS=${COLO_SECS:-8} INV_SECS=${INV_SECS:-3} CYCLES=${CYCLES:-10}
else
  COLO_SECS=${COLO_SECS:-180} INV_SECS=${INV_SECS:-10} CYCLES=${CYCLES:-100}
fi
HOLD_MS=${HOLD_MS:-50} GAP_MS=${GAP_MS:-100}

KIT=$(cd "$(dirname "$0")/.." && pwd)
refuse() { echo "mi-kit: cannot run: $*" >&2; exit 2; }

if [ "$(id -u)" != 0 ]; then
  refuse "run it as root (it loads eBPF programs and becomes a debugger of the workloads): sudo $0 ${ARGS[*]}"
fi
if [ -z "$GP" ]; then
  for c in "$KIT/target/release/gpreempt-ebpf" "$KIT/target/debug/gpreempt-ebpf" \
           "$(command -v gpreempt-ebpf || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then GP=$c; break; fi
  done
fi
if [ -z "$GP" ] || [ ! -x "$GP" ]; then
  refuse "no gpreempt-ebpf binary: build it (\`cargo xtask build\`, then target/release/gpreempt-ebpf) or pass --gp PATH"
fi
GP=$(realpath "$GP")

if [ "$EMULATED" = 1 ] && [ -z "${MIKIT_IN_SIM:-}" ]; then
  # Everything below runs inside the emulator: its /dev/kfd, sysfs and debugfs.
  export MIKIT_IN_SIM=1
  exec "$GP" sim --seed 1 -- bash "$0" "${ARGS[@]}" --gp "$GP"
fi

if [ "$EMULATED" = 0 ]; then
  if [ ! -e /dev/kfd ] || ! grep -qsv '^0$' /sys/class/kfd/kfd/topology/nodes/*/gpu_id; then
    refuse "no AMD GPU with a KFD here (/dev/kfd and a GPU node in /sys/class/kfd/kfd/topology): \
install ROCm's kernel driver (amdgpu-dkms, https://rocm.docs.amd.com/projects/install-on-linux) \
and reboot; or run the emulated kit: $0 --emulated"
  fi
  if ! python3 -c 'import torch, torchvision, sys; sys.exit(0 if torch.version.hip else 1)' 2>/dev/null; then
    refuse "no ROCm PyTorch for python3 (torch with torch.version.hip, and torchvision): \
pip3 install torch torchvision --index-url https://download.pytorch.org/whl/rocm6.2 \
(pick the ROCm version of this host), then check: python3 -c 'import torch; print(torch.version.hip, torch.cuda.is_available())'"
  fi
fi

OUT=${OUT:-./mi-kit-report-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
chmod 755 "$OUT"
rm -f "$OUT"/steps.jsonl
# The kit's controllers (kfd-cycles, run) use a run directory of their own, so a controller
# already running on this host is not disturbed (root-owned, under the sticky /tmp).
RUNDIR=$(mktemp -d /tmp/mi-kit-run.XXXXXX)
chmod 755 "$RUNDIR"
export GPREEMPT_RUN_DIR=$RUNDIR/run

# On any exit: what this shell started and is still running (workloads, the controller) gets
# SIGTERM (the workloads write their reports, the controller resumes what it holds).
cleanup() {
  local p
  for p in $(jobs -pr); do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUNDIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { echo "mi-kit: $*" >&2; }
now() { date +%s.%N; }

# record STEP RC T0 [NOTE]: one line of steps.jsonl, which the report reads.
record() {
  printf '{"step":"%s","rc":%s,"start":%s,"end":%s,"note":"%s"}\n' "$1" "$2" "$3" "$(now)" \
    "${4:-}" >> "$OUT/steps.jsonl"
}

# run_step STEP CMD...: stdout to STEP.out, stderr to STEP.err, recorded.
run_step() {
  local s=$1 t0 rc=0; shift
  t0=$(now)
  "$@" > "$OUT/$s.out" 2> "$OUT/$s.err" || rc=$?
  record "$s" "$rc" "$t0"
  return 0
}

# start_workload NAME ROLE SECS: a workload in the background, its output in NAME.log and its
# report in NAME.json; sets WPID. ROLE: online (ResNet-18 b1 @20/s), cnn (ResNet-50 b1024),
# transformer (encoder b8 s128).
start_workload() {
  local name=$1 role=$2 secs=$3
  rm -f "$OUT/$name.json" "$OUT/$name.log"
  if [ "$EMULATED" = 1 ]; then
    local a
    case "$role" in
      online) a=(--profile resnet18_b1 --rate 20 --priority 15) ;;
      cnn) a=(--profile resnet50_b1024 --offline --priority 0) ;;
      transformer) a=(--profile transformer_b8_s128 --offline --priority 0) ;;
    esac
    "$GP" sim workload "${a[@]}" --duration "$secs" --report "$OUT/$name.json" \
      > "$OUT/$name.log" 2>&1 &
  else
    case "$role" in
      online) python3 "$KIT/scripts/gpu/online.py" "$secs" 20 "$OUT/$name.json" \
                --model resnet18 --samples > "$OUT/$name.log" 2>&1 & ;;
      cnn) python3 "$KIT/scripts/gpu/offline.py" "$secs" "$OUT/$name.json" \
             --model resnet50 > "$OUT/$name.log" 2>&1 & ;;
      transformer) python3 "$KIT/scripts/gpu/offline.py" "$secs" "$OUT/$name.json" \
                     --model encoder > "$OUT/$name.log" 2>&1 & ;;
    esac
  fi
  WPID=$!
  echo "$WPID" > "$OUT/$name.pid"
}

# wait_ready NAME PID: until the workload says "ready" (model loaded, warmed up; 300 s at most).
wait_ready() {
  local _
  for _ in $(seq 3000); do
    grep -qs ready "$OUT/$1.log" && return 0
    kill -0 "$2" 2>/dev/null || { log "$1 exited before it was ready: $(tail -3 "$OUT/$1.log")"; return 1; }
    sleep 0.1
  done
  log "$1 not ready after 300 s"; return 1
}

# stop_workload PID: SIGTERM (the workloads write their report on it), then wait.
stop_workload() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
log "report in $OUT ($([ "$EMULATED" = 1 ] && echo emulated || echo real GPU)$([ "$SHORT" = 1 ] && echo ", short"))"
{
  echo "emulated=$EMULATED"
  echo "short=$SHORT"
  echo "colo_secs=$COLO_SECS"
  echo "inv_secs=$INV_SECS"
  echo "cycles=$CYCLES"
  echo "hold_ms=$HOLD_MS"
  echo "gap_ms=$GAP_MS"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "gpreempt_ebpf=$("$GP" --version 2>/dev/null || echo unknown)"
  echo "git=$(git -C "$KIT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "kernel=$(uname -r)"
  # shellcheck disable=SC1091
  echo "os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")"
  echo "rocm=$(cat /opt/rocm/.info/version 2>/dev/null || echo none)"
  echo "python=$(python3 --version 2>&1 || echo none)"
  if [ "$EMULATED" = 0 ]; then
    echo "torch=$(python3 -c 'import torch; print(torch.__version__, "hip", torch.version.hip)' 2>/dev/null || echo none)"
    echo "gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || echo unknown)"
  else
    echo "torch=none (emulated workloads)"
  fi
} > "$OUT/env.txt"
run_step queues-idle "$GP" queues --json

# (a) doctor: exit 1 means a check failed, which the report shows; the step itself ran.
log "doctor"
run_step doctor "$GP" doctor --json

# (b) inventory: each workload alone, its queues and its dispatches.
for w in cnn transformer; do
  log "inventory: $w (${INV_SECS} s of dispatches)"
  t0=$(now)
  start_workload "inv-$w" "$w" $((INV_SECS + 600))
  P=$WPID
  if wait_ready "inv-$w" "$P"; then
    sleep 1
    run_step "inv-$w-queues" "$GP" queues --json
    run_step "inv-$w-trace" "$GP" trace --dispatches --json --pid "$P" --duration "$INV_SECS" \
      --output "$OUT/inv-$w-trace.jsonl"
    stop_workload "$P"
    record "inv-$w" 0 "$t0"
  else
    stop_workload "$P"
    cp "$OUT/inv-$w.log" "$OUT/inv-$w.err" 2>/dev/null || true
    record "inv-$w" 1 "$t0" "workload not ready"
  fi
done

# (c) suspend / resume cycles of a busy offline job, and the online service's latency beside it.
CYC_SECS=$(( (CYCLES * (HOLD_MS + GAP_MS) + GAP_MS) / 1000 + 2 ))
log "cycles: $CYCLES x (${HOLD_MS} ms held, ${GAP_MS} ms running), online p99 with and without"
t0=$(now)
start_workload cyc-off cnn $((2 * CYC_SECS + 900))
OFF=$WPID
if wait_ready cyc-off "$OFF"; then
  start_workload cyc-on-without online "$CYC_SECS"
  ON=$WPID
  wait_ready cyc-on-without "$ON" || true
  wait "$ON" 2>/dev/null || true
  start_workload cyc-on-with online "$CYC_SECS"
  ON=$WPID
  wait_ready cyc-on-with "$ON" || true
  run_step kfd-cycles "$GP" kfd-cycles --pid "$OFF" --cycles "$CYCLES" --hold "${HOLD_MS}ms" \
    --gap "${GAP_MS}ms" --json
  wait "$ON" 2>/dev/null || true
  stop_workload "$OFF"
  record cycles 0 "$t0"
else
  stop_workload "$OFF"
  cp "$OUT/cyc-off.log" "$OUT/cycles.err" 2>/dev/null || true
  record cycles 1 "$t0" "offline workload not ready"
fi

# (d) co-location: no control, then the controller with the kit's policy.
colo() {
  local col=$1 t0 off on run="" _
  t0=$(now)
  if [ "$col" = policy ]; then
    "$GP" run --policy "$KIT/examples/mi-kit.toml" --audit "$OUT/colo-policy-audit.jsonl" \
      > "$OUT/colo-policy-run.out" 2> "$OUT/colo-policy-run.err" &
    run=$!
    for _ in $(seq 600); do
      grep -qs "gpreempt-ebpf run:" "$OUT/colo-policy-run.err" && break
      kill -0 "$run" 2>/dev/null || break
      sleep 0.1
    done
    if ! kill -0 "$run" 2>/dev/null; then
      wait "$run" 2>/dev/null || true
      cp "$OUT/colo-policy-run.err" "$OUT/colo-$col.err"
      record "colo-$col" 1 "$t0" "the controller did not start"
      return 0
    fi
  fi
  start_workload "colo-$col-off" cnn $((COLO_SECS + 900))
  off=$WPID
  if ! wait_ready "colo-$col-off" "$off"; then
    stop_workload "$off"
    [ -n "$run" ] && stop_workload "$run"
    cp "$OUT/colo-$col-off.log" "$OUT/colo-$col.err" 2>/dev/null || true
    record "colo-$col" 1 "$t0" "offline workload not ready"
    return 0
  fi
  sleep 1
  start_workload "colo-$col-on" online "$COLO_SECS"
  on=$WPID
  wait "$on" 2>/dev/null || true
  stop_workload "$off"
  local rc=0
  if [ -n "$run" ]; then
    kill -INT "$run" 2>/dev/null || true
    wait "$run" 2>/dev/null || rc=$?
    tail -20 "$OUT/colo-policy-run.err" > "$OUT/colo-$col.err"
  fi
  record "colo-$col" "$rc" "$t0"
}
log "co-location: no control (${COLO_SECS} s)"
colo none
log "co-location: run --policy examples/mi-kit.toml (${COLO_SECS} s)"
colo policy

log "report"
python3 "$KIT/scripts/gpu/mi_report.py" "$OUT"
log "done: $OUT/report.md and $OUT/report.json (send the whole directory: tar czf mi-kit-report.tgz -C $(dirname "$OUT") $(basename "$OUT"))"
