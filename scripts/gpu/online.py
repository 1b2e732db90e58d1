"""Online inference: ResNet-18, batch 1, a request every 1/RATE s; prints latency percentiles (JSON)."""
import json, sys, time
import torch, torchvision

secs, rate = float(sys.argv[1]), float(sys.argv[2])
out = sys.argv[3]
m = torchvision.models.resnet18().cuda().eval()
x = torch.randn(1, 3, 224, 224, device="cuda")
with torch.no_grad():
    for _ in range(20):
        m(x)
    torch.cuda.synchronize()
    lat, t0 = [], time.time()
    nxt = t0
    while time.time() - t0 < secs:
        now = time.time()
        if now < nxt:
            time.sleep(nxt - now)
        start = nxt  # latency from the request's arrival
        m(x)
        torch.cuda.synchronize()
        lat.append((time.time() - start) * 1e3)
        nxt += 1.0 / rate
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
json.dump({"requests": len(lat), "p50_ms": q(0.5), "p95_ms": q(0.95), "p99_ms": q(0.99),
           "max_ms": lat[-1], "mean_ms": sum(lat) / len(lat)}, open(out, "w"))
