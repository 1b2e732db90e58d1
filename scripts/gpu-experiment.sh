#!/bin/bash
# GPU experiment kit for the NVIDIA backend, run on the device machine (H100) with the built
# binary carried at .carry/gpreempt-ebpf. Usage: scripts/gpu-experiment.sh observe
# Results go to $OUT (or ./gpu-out).
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
step=${1:-observe}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
uname -r | tee -a "$OUT/gpu.txt"

# A PyTorch process: matmuls in a loop, printing iterations/s once a second.
cat > /tmp/load.py <<'PY'
import sys, time, torch
secs = float(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
torch.cuda.synchronize(); t0 = time.time(); last = t0; it = 0
while time.time() - t0 < secs:
    c = a @ b; torch.cuda.synchronize(); it += 1
    now = time.time()
    if now - last >= 0.25:
        print(f"{now:.3f} {it/(now-last):.1f}", flush=True); it = 0; last = now
PY

case "$step" in
seeds)
  # (c) online ResNet-18 b1 at 20 req/s next to offline ResNet-50 b1024, without then with
  # `run --policy` (launch hints trigger the pause; the guardian holds the way back).
  S=${SECS:-60}
  if [ -z "${SKIP_BASE:-}" ]; then
    python3 scripts/gpu/online.py "$S" 20 "$OUT/on-solo.json" 2>/dev/null
    python3 scripts/gpu/offline.py "$((S + 15))" "$OUT/off0.json" 2>/dev/null & B=$!
    sleep 8
    python3 scripts/gpu/online.py "$S" 20 "$OUT/on0.json" 2>/dev/null
    wait $B
  fi
  mkdir -p /run/gpreempt-ebpf
  "$GP" ${RUNV:--v} run --policy scripts/gpu/policy.toml --audit "$OUT/audit.jsonl" 2>"$OUT/run.err" & R=$!
  # The observer knows only objects allocated after it attached: start the workloads after.
  # (It first pauses and resumes a CUDA process of its own: the self-test.)
  for i in $(seq 1200); do grep -q "gpreempt-ebpf run:" "$OUT/run.err" 2>/dev/null && break; sleep 0.1; done
  grep "self-test" "$OUT/run.err"
  sleep 1
  if [ -n "${DEBUG:-}" ]; then "$GP" trace --json --output "$OUT/dbg.json" --duration $((S + 25)) 2>/dev/null & fi
  python3 scripts/gpu/offline.py "$((S + 15))" "$OUT/off1.json" 2>/dev/null & B=$!
  echo "offline pid $B"
  sleep 8
  python3 scripts/gpu/online.py "$S" 20 "$OUT/on1.json" 2>/dev/null &
  A=$!; sleep $((S / 2)); cp /run/gpreempt-ebpf/status.json "$OUT/status.json" 2>/dev/null; wait $A
  wait $B
  kill -INT $R; wait $R; echo "run rc=$?"
  for f in on-solo on0 on1 off0 off1; do echo "$f $(cat $OUT/$f.json)"; done
  echo "suspends: $(grep -c '"action":"suspend"' $OUT/audit.jsonl) resumes: $(grep -c '"action":"resume"' $OUT/audit.jsonl)"
  grep '"action":"suspend"' "$OUT/audit.jsonl" | head -2
  grep -v "event source" "$OUT/run.err" | grep -E "pid $B|offline|online|gone|run:|error|warn" | head -30
  head -c 1500 "$OUT/status.json"; echo
  if [ -n "${DEBUG:-}" ]; then
    echo "trace: events of the offline pid: $(grep -c "\"pid\":$B," "$OUT/dbg.json")"
    grep "\"pid\":$B," "$OUT/dbg.json" | grep -E "KEPLER|ROOT" | head -5
  fi
  ;;
top)
  # (a) `top` and launch hints on an NVIDIA host: the PyTorch process's TSGs and channels live,
  # and cuLaunchKernel hints from `trace --launches`.
  python3 /tmp/load.py 12 > "$OUT/load-top.txt" 2>&1 &
  P=$!
  "$GP" trace --launches --json --output "$OUT/launch.json" --duration 10 2>"$OUT/launch.err" &
  T=$!
  sleep 1
  python3 /tmp/load.py 8 > "$OUT/load-top2.txt" 2>&1 &
  # `top` on a pseudo-terminal (160x40) for 8 s, then Ctrl-C.
  GP="$GP" OUTF="$OUT/top.raw" python3 - <<'PY'
import fcntl, os, pty, select, signal, struct, termios, time
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm-256color"
    os.execv(os.environ["GP"], [os.environ["GP"], "top", "--interval", "500"])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
os.kill(pid, signal.SIGWINCH)
out, t0, sent = b"", time.time(), False
while True:
    if not sent and time.time() - t0 > 8:
        os.write(fd, b"q"); sent = True
    if time.time() - t0 > 15:
        os.kill(pid, signal.SIGKILL); break
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            b = os.read(fd, 65536)
        except OSError:
            break
        if not b:
            break
        out += b
open(os.environ["OUTF"], "wb").write(out)
PY
  wait $T; wait $P
  tail -4 "$OUT/launch.err"
  grep -c '"source":"uprobe"' "$OUT/launch.json"; head -3 "$OUT/launch.json"
  # The last frame, without escape sequences.
  wc -c "$OUT/top.raw"
  ;;
pause)
  # (b) pause / resume cycles of a PyTorch process through the guardian, throughput around them;
  # (d) the pauser killed (-9) while the target is paused: the guardian re-enables it.
  mkdir -p /run/gpreempt-ebpf
  "$GP" nv-pause-test --comm python3 --run 1.5 --pause 1 --cycles 4 \
      > "$OUT/pause.json" 2>"$OUT/pause.err" &
  X=$!
  sleep 2
  python3 /tmp/load.py 16 > "$OUT/load-pause.txt" 2>&1 &
  P=$!
  wait $X; echo "pause-test rc=$?"
  wait $P
  cat "$OUT/pause.json"; tail -5 "$OUT/pause.err"
  echo "--- throughput (t it/s) around the pauses:"; cat "$OUT/load-pause.txt" | head -80
  echo "--- (d) kill -9 while paused"
  "$GP" nv-pause-test --comm python3 --run 1.5 --pause 30 --cycles 1 --die-while-paused \
      > "$OUT/die.json" 2>"$OUT/die.err" &
  X=$!
  sleep 2
  python3 /tmp/load.py 10 > "$OUT/load-die.txt" 2>&1 &
  P=$!
  wait $X; echo "pause-test (killed) rc=$?"
  wait $P
  cat "$OUT/die.json"; tail -5 "$OUT/die.err"
  echo "--- throughput after the kill:"; cat "$OUT/load-die.txt" | head -60
  ;;
control)
  # The controller's own safety paths on an NVIDIA process (scripts/gpu/hold.toml, max_suspend
  # 3 s): a manual suspend through `run` that its watchdog ends; a hung controller (SIGSTOP)
  # whose guardian lease runs out; (d) kill -9 of `run` while the target is paused.
  mkdir -p /run/gpreempt-ebpf
  "$GP" ${RUNV:--v} run --policy scripts/gpu/hold.toml --audit "$OUT/ctl-audit.jsonl" 2>"$OUT/ctl.err" & R=$!
  for i in $(seq 1200); do grep -q "gpreempt-ebpf run:" "$OUT/ctl.err" 2>/dev/null && break; sleep 0.1; done
  grep -E "self-test|error" "$OUT/ctl.err"
  if [ -n "${DEBUG:-}" ]; then "$GP" trace --json --output "$OUT/ctl-trace.json" --duration 30 2>/dev/null & fi
  python3 /tmp/load.py 28 > "$OUT/load-ctl.txt" 2>&1 & P=$!
  echo "load pid $P"
  # Its first CUDA work comes after a few seconds (driver and library loading).
  sleep 8
  cp /run/gpreempt-ebpf/status.json "$OUT/ctl-status.json"
  echo "$(date +%s.%N) suspend (watchdog ends it)"; "$GP" suspend --pid $P
  sleep 4.5
  echo "$(date +%s.%N) suspend, then SIGSTOP the controller"; "$GP" suspend --pid $P
  sleep 0.3; kill -STOP $R; sleep 4.5; kill -CONT $R; echo "$(date +%s.%N) SIGCONT"
  sleep 2
  echo "$(date +%s.%N) suspend, then kill -9 the controller"; "$GP" suspend --pid $P
  sleep 0.5; cp /run/gpreempt-ebpf/status.json "$OUT/ctl-status2.json"
  kill -9 $R; wait $R 2>/dev/null; echo "$(date +%s.%N) killed"
  wait $P
  grep -vE "event source|kprobe|/sys/" "$OUT/ctl.err" | tail -25
  echo "--- load (t it/s):"; awk '{print $1, $2}' "$OUT/load-ctl.txt" | tr '\n' ';' ; echo
  pgrep -af nv-guardian || echo "no guardian left"
  ;;
timeslice-safety)
  # Every way the controller can end leaves an offline process's timeslice as it found it.
  # Three rounds, each: a controller with the timeslice lever (scripts/gpu/ts-safety.toml), then
  # a fresh offline process (load.py; the observer only knows objects allocated after it
  # started), its GR TSG set to 200 us, then the controller ends: 1 SIGINT (the controller
  # restores), 2 kill -9 (the guardian restores), 3 SIGSTOP past the lease (the guardian
  # restores), then SIGCONT and SIGINT. The guardian reads every restored value back.
  mkdir -p /run/gpreempt-ebpf
  for k in 1 2 3; do
    "$GP" ${RUNV:--v} run --policy scripts/gpu/ts-safety.toml --audit "$OUT/ts$k-audit.jsonl" \
        2>"$OUT/ts$k.err" & R=$!
    for i in $(seq 300); do grep -q "gpreempt-ebpf run:" "$OUT/ts$k.err" 2>/dev/null && break; sleep 0.1; done
    python3 /tmp/load.py 40 > "$OUT/load-ts$k.txt" 2>&1 & P=$!
    for i in $(seq 300); do grep -q '"action":"timeslice"' "$OUT/ts$k-audit.jsonl" 2>/dev/null && break; sleep 0.1; done
    echo "[$k] load pid $P: $(grep -o '"from_us":[0-9]*,"original_us":[0-9]*,"pid":[0-9]*,"reason":"[^"]*","to_us":[0-9]*' "$OUT/ts$k-audit.jsonl" | head -1)"
    sleep 1
    case $k in
      1) kill -INT $R; wait $R; echo "[1] SIGINT: rc=$?" ;;
      2) kill -9 $R; wait $R 2>/dev/null; echo "[2] kill -9"; sleep 1 ;;
      3) kill -STOP $R; sleep 3; kill -CONT $R; sleep 1; kill -INT $R; wait $R
         echo "[3] SIGSTOP 3 s, SIGCONT, SIGINT: rc=$?" ;;
    esac
    grep -E "timeslice .*->|guardian|silent|restor" "$OUT/ts$k.err" | grep -v "event source" | tail -3 | cut -c1-260
    kill $P 2>/dev/null; wait $P 2>/dev/null
  done
  pgrep -af nv-guardian || echo "no guardian left"
  ;;
observe)
  # (a) the observer sees a PyTorch process's clients, TSGs and channels.
  "$GP" trace --json --output "$OUT/trace.json" --duration 25 2>"$OUT/trace.err" &
  T=$!
  for i in $(seq 100); do grep -q tracing "$OUT/trace.err" 2>/dev/null && break; sleep 0.1; done
  python3 /tmp/load.py 5 > "$OUT/load.txt" 2>&1 &
  P=$!; echo "$P" > "$OUT/load.pid"
  wait $P
  sleep 1; kill -INT $T; wait $T
  grep -c rm_alloc "$OUT/trace.json"
  grep '"pid":'"$P" "$OUT/trace.json" | grep -E 'KEPLER_CHANNEL_GROUP|GPFIFO' | head -40
  tail -3 "$OUT/trace.err"
  ;;
esac
