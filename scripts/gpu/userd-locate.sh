#!/bin/bash
# Device experiment: how libcuda places each channel's GPFIFO ring and USERD (real GPU, not
# emulated). Builds scripts/gpu/rmspy.c, runs scripts/gpu/userd_probe.py with the shim preloaded
# into its CUDA child, and leaves $OUT/rmspy.log (RM escapes and mmaps) next to the probe's
# evidence ($OUT/userd.json: which 512-byte chunks move like Hopper USERD GP_GET/GP_PUT).
set -eu
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
gcc -shared -fPIC -O1 -o /tmp/rmspy.so scripts/gpu/rmspy.c -ldl
rm -f "$OUT/rmspy.log"
RMSPY_LOG="$OUT/rmspy.log" CHILD_PRELOAD=/tmp/rmspy.so python3 scripts/gpu/userd_probe.py "$OUT/userd.json" \
  > "$OUT/userd.txt" 2>&1 || { tail -20 "$OUT/userd.txt"; exit 1; }
grep -E "^[0-9]+ nvidia|chunk\(s\)" "$OUT/userd.txt"
grep -A40 "chunk(s)" "$OUT/userd.txt" | grep -E "chunk 0x[0-9a-f]*000:" | head -20
grep -cE "^ALLOC" "$OUT/rmspy.log"
grep -A1 -E "^ALLOC.*class (c86f|a06c)" "$OUT/rmspy.log" | head -24
grep -E "^MMAP" "$OUT/rmspy.log" | head -12
grep -A1 -E "^MAPMEM" "$OUT/rmspy.log" | head -12
