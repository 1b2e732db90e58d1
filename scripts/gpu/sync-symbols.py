"""Which libcuda functions a CUDA program's blocking waits reach: the exported symbols named like
a sync or a copy to the host, and what cuGetProcAddress (how libcudart finds driver functions)
returns for each, against the exported symbol's own address (a uprobe sits on the latter).
Prints one line per name: exported address, proc address, same or not. Run on the GPU machine."""
import ctypes, subprocess, re

lib = ctypes.CDLL("libcuda.so.1")
path = [l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l][0]
names = sorted({m for m in re.findall(r"\b(cu\w*(?:Synchronize|MemcpyDtoH|Memcpy|Query)\w*)\b",
                subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                               text=True).stdout)})
cu_init = lib.cuInit; cu_init(0)
gpa = lib.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.c_void_p]
ver = ctypes.c_int(); lib.cuDriverGetVersion(ctypes.byref(ver))
print("libcuda", path, "driver API version", ver.value)
for n in names:
    exported = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
    for flags, what in [(0, "default"), (2, "ptds")]:
        p = ctypes.c_void_p()
        base = re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n)
        r = gpa(base.encode(), ctypes.byref(p), ver.value, flags, None)
        if r == 0:
            print(f"{n:40s} exported {exported:#x}  cuGetProcAddress({base}, {what}) {p.value or 0:#x}"
                  f"  {'SAME' if p.value == exported else 'differs'}")
