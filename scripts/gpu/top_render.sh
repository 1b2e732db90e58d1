#!/bin/bash
# Replays a raw `top` recording (scripts/gpu/top_capture.py) into a tmux pane of the same size
# and prints the last screen as text. Usage: top_render.sh RAW [COLS ROWS]
set -euo pipefail
raw=$1; cols=${2:-160}; rows=${3:-45}
s=toprender$$
tmux new-session -d -s "$s" -x "$cols" -y "$rows" "cat '$raw'; sleep 30"
sleep 2
tmux capture-pane -p -t "$s"
tmux kill-session -t "$s"
