"""Offline batch inference: ResNet-50, batch 1024, back to back; prints images/s (JSON)."""
import json, sys, time
import torch, torchvision

secs, out = float(sys.argv[1]), sys.argv[2]
m = torchvision.models.resnet50().cuda().eval()
x = torch.randn(1024, 3, 224, 224, device="cuda")
with torch.no_grad():
    m(x)
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < secs:
        m(x)
        torch.cuda.synchronize()
        n += 1
    dt = time.time() - t0
json.dump({"iterations": n, "images_per_s": n * 1024 / dt, "seconds": dt}, open(out, "w"))
