"""Where a CUDA process's channel USERD lives, and whether root can read it (device experiment).

Usage (root, on the GPU host): python3 scripts/gpu/userd_probe.py OUT.json
A child CUDA process (torch) alternates idle and busy phases on command. The parent lists the
child's mappings of NVIDIA device files (/proc/PID/maps), tries reading each through
/proc/PID/mem and process_vm_readv, snapshots every readable one while idle, while busy, and idle
again, and reports (a) which mappings are readable and how, (b) every 512-byte chunk whose words
at 0x88/0x8c (Hopper USERD GP_GET/GP_PUT, clc86f.h) moved, and (c) every changed u32 word per
mapping (bounded), so the USERD layout is found from evidence, not assumed.
Real GPU, not emulated.
"""
import ctypes, json, os, struct, subprocess, sys, time

out = sys.argv[1]
CHILD = r'''
import sys, time, torch
a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
s2 = torch.cuda.Stream()
torch.cuda.synchronize(); print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "busy":
        for _ in range(int(cmd[1])):
            a @ b
        print("queued", flush=True)
        torch.cuda.synchronize(); print("done", flush=True)
    elif cmd[0] == "busy2":
        with torch.cuda.stream(s2):
            for _ in range(int(cmd[1])):
                a @ b
        print("queued", flush=True)
        torch.cuda.synchronize(); print("done", flush=True)
    elif cmd[0] == "quit":
        break
'''
env = dict(os.environ)
if os.environ.get("CHILD_PRELOAD"):
    env["LD_PRELOAD"] = os.environ["CHILD_PRELOAD"]
p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     text=True, bufsize=1, env=env)
assert p.stdout.readline().strip() == "ready"
pid = p.pid

def maps():
    r = []
    for l in open(f"/proc/{pid}/maps"):
        f = l.split()
        path = f[5] if len(f) > 5 else ""
        if "nvidia" not in path:
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        r.append({"lo": lo, "hi": hi, "size": hi - lo, "perms": f[1], "pgoff": int(f[2], 16),
                  "path": path})
    return r

libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def vm_read(addr, n):
    buf = ctypes.create_string_buffer(n)
    l = iovec(ctypes.cast(buf, ctypes.c_void_p), n); r = iovec(addr, n)
    got = libc.process_vm_readv(pid, ctypes.byref(l), 1, ctypes.byref(r), 1, 0)
    return (buf.raw[:got] if got > 0 else None), (0 if got > 0 else ctypes.get_errno())

memfd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
def mem_read(addr, n):
    try:
        return os.pread(memfd, n, addr), 0
    except OSError as e:
        return None, e.errno

CAP = 4 << 20
ms = maps()
readable = []
for m in ms:
    n = min(m["size"], 4096)
    d, e = mem_read(m["lo"], n); m["procmem"] = "ok" if d is not None else os.strerror(e)
    d2, e2 = vm_read(m["lo"], n); m["vm_readv"] = "ok" if d2 is not None else os.strerror(e2)
    if d is not None and m["size"] <= CAP:
        readable.append(m)

def snap():
    t = time.time()
    s = {}
    for m in readable:
        d, _ = mem_read(m["lo"], m["size"])
        s[m["lo"]] = d
    return s, time.time() - t

A, tA = snap()
p.stdin.write("busy 3000\n"); p.stdin.flush()
assert p.stdout.readline().strip() == "queued"
B, tB = snap()
assert p.stdout.readline().strip() == "done"
time.sleep(0.2)
C, tC = snap()
p.stdin.write("busy2 3000\n"); p.stdin.flush()
assert p.stdout.readline().strip() == "queued"
B2, _ = snap()
assert p.stdout.readline().strip() == "done"
time.sleep(0.2)
C2, _ = snap()

u32 = lambda d, o: struct.unpack_from("<I", d, o)[0] if d is not None and o + 4 <= len(d) else None
chunks, words = [], {}
for m in readable:
    lo = m["lo"]
    a, b, c, b2, c2 = A[lo], B[lo], C[lo], B2[lo], C2[lo]
    if a is None or c is None:
        continue
    n = min(len(a), len(c))
    ch = [o for o in range(0, n, 4) if a[o:o + 4] != c[o:o + 4] or (b and b[o:o + 4] != a[o:o + 4])]
    words[hex(lo)] = {"changed": len(ch), "first": [
        {"off": hex(o), "A": u32(a, o), "B": u32(b, o), "C": u32(c, o), "B2": u32(b2, o),
         "C2": u32(c2, o)} for o in ch[:64]]}
    for base in range(0, n - 512 + 1, 512):
        g = [u32(x, base + 0x88) for x in (a, b, c, b2, c2)]
        pp = [u32(x, base + 0x8c) for x in (a, b, c, b2, c2)]
        if len(set(g)) > 1 or len(set(pp)) > 1:
            chunks.append({"vma": hex(lo), "pgoff": hex(m["pgoff"]), "path": m["path"],
                           "chunk": hex(base), "gp_get": g, "gp_put": pp,
                           "head": [u32(c, base + o) for o in range(0, 0x100, 4)]})
p.stdin.write("quit\n"); p.stdin.flush(); p.wait()
res = {"pid": pid, "maps": [{k: (hex(v) if k in ("lo", "hi", "pgoff") else v) for k, v in m.items()}
                            for m in ms],
       "snapshot_s": [tA, tB, tC], "chunks": chunks, "words": words}
json.dump(res, open(out, "w"), indent=1)
print(f"{len(ms)} nvidia mappings, {len(readable)} readable through /proc/PID/mem (<= 4 MiB),"
      f" {sum(1 for m in ms if m['vm_readv'] == 'ok')} through process_vm_readv")
for m in ms:
    print(f"  {m['lo']:#x} {m['size']:>9} {m['perms']} pgoff {m['pgoff']:#x} {m['path']}"
          f" mem:{m['procmem']} vm_readv:{m['vm_readv']}")
print(f"{len(chunks)} chunk(s) whose 0x88/0x8c words moved (A idle, B busy, C idle, B2/C2 stream 2):")
for c in chunks[:40]:
    print(f"  vma {c['vma']} {c['path']} chunk {c['chunk']}: GP_GET {c['gp_get']} GP_PUT {c['gp_put']}")
for k, w in words.items():
    if w["changed"]:
        print(f"  vma {k}: {w['changed']} words changed; first: " +
              ", ".join(f"{x['off']}:{x['A']}/{x['B']}/{x['C']}" for x in w['first'][:8]))
