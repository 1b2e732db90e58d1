#!/usr/bin/env python3
"""Records `gpreempt-ebpf top` on a pseudo-terminal of a fixed size for a while, raw.

Usage: top_capture.py BINARY SECONDS OUT.raw [COLS ROWS]
The raw stream (escape sequences included) is replayed into a terminal of the same size to
get the screen (scripts/gpu/top_render.sh uses tmux); no terminal emulator is needed where
top runs (the GPU machine has none). Ends top with 'q', then SIGTERM if it is still there.
"""
import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time


def main() -> int:
    binary, secs, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    cols = int(sys.argv[4]) if len(sys.argv) > 4 else 160
    rows = int(sys.argv[5]) if len(sys.argv) > 5 else 45
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.execv(binary, [binary, "top"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.kill(pid, signal.SIGWINCH)
    end = time.monotonic() + secs
    with open(out, "wb") as f:
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    f.write(os.read(fd, 65536))
                except OSError:
                    break
        os.write(fd, b"q")
        quit_by = time.monotonic() + 3
        while time.monotonic() < quit_by:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return 0
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    os.read(fd, 65536)  # after the screen we keep: not recorded
                except OSError:
                    pass
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    return 1


if __name__ == "__main__":
    sys.exit(main())
