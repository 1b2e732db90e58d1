"""Online inference service: a request every 1/RATE s, batch 1; prints latency percentiles (JSON).

Usage: online.py SECS RATE OUT.json [--model resnet18|encoder|probe] [--warmup N] [--samples]
  resnet18  torchvision ResNet-18, 3x224x224 (the seeds' service; the default)
  encoder   a BERT-base-sized encoder from torch.nn.TransformerEncoder: 12 layers, d_model 768,
            12 heads, FF 3072, seq 128 (many short kernels)
  probe     one tiny kernel (add on one element) per request: its latency is the time from a
            launch to its kernel having run, i.e. how long a newcomer waits for the GPU
--samples adds every request's arrival (epoch s) and latency (ms) to the JSON ("arrivals",
"lat_ms"), so a caller can take percentiles inside time windows.
After the warm-up it prints "ready" (stdout).
Random weights, built from code (no downloads). Latency counts from the request's arrival
(open loop: a late reply delays the next ones). t_start/t_end (epoch s) bound the measurement.
"""
import argparse, json, time
import torch

ap = argparse.ArgumentParser()
ap.add_argument("secs", type=float)
ap.add_argument("rate", type=float)
ap.add_argument("out")
ap.add_argument("--model", default="resnet18", choices=["resnet18", "encoder", "probe"])
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--samples", action="store_true")
a = ap.parse_args()

if a.model == "resnet18":
    import torchvision
    m = torchvision.models.resnet18().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
elif a.model == "probe":
    x = torch.zeros(1, device="cuda")
    m = lambda t: t.add_(1)
else:
    layer = torch.nn.TransformerEncoderLayer(768, 12, dim_feedforward=3072, dropout=0.0,
                                             activation="gelu", batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().eval()
    x = torch.randn(1, 128, 768, device="cuda")

with torch.no_grad():
    for _ in range(a.warmup):
        m(x)
    torch.cuda.synchronize()
    print("ready", flush=True)
    lat, arr, t0 = [], [], time.time()
    nxt = t0
    while time.time() - t0 < a.secs:
        now = time.time()
        if now < nxt:
            time.sleep(nxt - now)
        start = nxt  # latency from the request's arrival
        m(x)
        torch.cuda.synchronize()
        lat.append((time.time() - start) * 1e3)
        arr.append(start)
        nxt += 1.0 / a.rate
    t1 = time.time()
samples = {"arrivals": [round(t, 5) for t in arr], "lat_ms": [round(v, 4) for v in lat]}
lat = sorted(lat)
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
json.dump({"model": a.model, "rate": a.rate, "requests": len(lat), "p50_ms": q(0.5),
           "p95_ms": q(0.95), "p99_ms": q(0.99), "max_ms": lat[-1],
           "mean_ms": sum(lat) / len(lat), "t_start": t0, "t_end": t1,
           **(samples if a.samples else {})}, open(a.out, "w"))
