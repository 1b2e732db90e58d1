#!/bin/bash
# What the observer costs the rest of the host (real GPU host, not emulated): the mean time of an
# ioctl no GPU driver sees (TCGETS on a pty) and of an RM escape, bare, with `run` attached, with
# `run` + `trace`, each with the NVIDIA source the host gives (the nvidia_unlocked_ioctl pair)
# and forced to the syscall tracepoints (--ioctl-source tracepoint), side by side in one run.
# Also: doctor's ioctl-source lines and the banner of each `trace`.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
GP=${GP:-.carry/gpreempt-ebpf}
ROUNDS=${ROUNDS:-5}; N=${N:-300000}
gcc -O2 -o /tmp/ioctl_tax scripts/gpu/ioctl_tax.c || exit 1
"$GP" doctor 2>&1 | grep -E "ioctl-source|btf|kprobes|nvidia" | cut -c1-220
cat > /tmp/empty.toml <<'T'
[policy]
strategy = "priority"
default = "ignore"
T
measure() {  # LABEL: one ioctl_tax run, lines prefixed
  /tmp/ioctl_tax "$ROUNDS" "$N" | sed "s/^/$1 /"
}
start_run() {  # SOURCE
  "$GP" run --policy /tmp/empty.toml --ioctl-source "$1" 2> "$OUT/run-$1.err" &
  RUNP=$!
  for i in $(seq 300); do grep -q "gpreempt-ebpf run:" "$OUT/run-$1.err" 2>/dev/null && break; sleep 0.1; done
  sleep 1
}
stop() { kill -INT "$@" 2>/dev/null; wait "$@" 2>/dev/null; }
SOURCES=${SOURCES:-auto tracepoint}
for round in 1 2; do
  measure bare
  for src in $SOURCES; do
    start_run "$src"
    measure "run-$src"
    "$GP" trace --ioctl-source "$src" --json > /dev/null 2> "$OUT/trace-$src.err" & TRP=$!
    sleep 2
    measure "run+trace-$src"
    stop $TRP; stop $RUNP
    sleep 1
  done
done | tee "$OUT/tax.txt"
for src in $SOURCES; do
  echo "== $src"; head -3 "$OUT/trace-$src.err" | cut -c1-400
  grep -m2 -iE "self-test|refus|error|source" "$OUT/run-$src.err" | cut -c1-300
done
python3 - "$OUT/tax.txt" <<'PY'
import sys, statistics as st
d = {}
for l in open(sys.argv[1]):
    f = l.split()
    d.setdefault((f[0], f[1]), []).append(float(f[2]))
bare = {k[1]: st.median(v) for k, v in d.items() if k[0] == "bare"}
for (lab, what), v in sorted(d.items()):
    print(f"{lab:24s} {what:6s} median {st.median(v):8.1f} ns  min {min(v):8.1f}  max {max(v):8.1f}  x{st.median(v) / bare[what]:.3f} of bare")
PY
