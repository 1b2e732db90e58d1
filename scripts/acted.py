"""Whether a controller has acted on every process of a list, from its audit log.

Usage: acted.py AUDIT SINCE_NS PIDS_FILE [ACTION,...]
Prints the CLOCK_MONOTONIC ns of the last first act (the time by which every pid in PIDS_FILE,
one a line, had a successful act of one of ACTIONS, default "suspend", at or after SINCE_NS),
or nothing when some pid has none yet. Used by scripts/busy-start-sim.sh and
scripts/gpu/busy-start.sh.
"""
import json
import sys

audit, since = sys.argv[1], int(sys.argv[2])
pids = {int(l) for l in open(sys.argv[3]) if l.strip()}
actions = set((sys.argv[4] if len(sys.argv) > 4 else "suspend").split(","))
first = {}
try:
    for line in open(audit):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        t = r.get("returned_ns") or r.get("ts_ns") or 0
        # A suspend acted when it names queues it did; a timeslice when it did not fail.
        ok = r.get("done") if r.get("action") == "suspend" else not r.get("failed")
        if r.get("action") in actions and ok and r.get("pid") in pids and t >= since:
            first.setdefault(r["pid"], t)
except FileNotFoundError:
    pass
if pids and set(first) >= pids:
    print(max(first.values()))
