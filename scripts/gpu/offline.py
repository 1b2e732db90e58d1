"""Offline job, back to back; prints throughput (JSON: iterations, items_per_s, seconds).

Usage: offline.py SECS OUT.json [--model resnet50|resnet50_train|gpt_train|encoder|gemm] [--batch N]
  resnet50        ResNet-50 inference, batch 1024 (the seeds' job; the default), images/s
  encoder         BERT-base-sized encoder inference (12 layers, d_model 768, seq 128), batch 8:
                  the seeds' transformer case (many small-grid kernels), sequences/s
  resnet50_train  ResNet-50 training step (forward, backward, SGD), batch 128, images/s
  gpt_train       GPT-style decoder training step: 6 layers, d_model 1024, 16 heads, seq 512,
                  batch 8, vocab 32000, causal mask, AdamW; tokens/s
  gemm            fp16 GEMM loop: --batch (8) matmuls of 8192x8192 by 8192x8192 back to back per
                  iteration (each ~1.1 TFLOP, a few ms: long kernels); TFLOP/s
Random weights and data, built from code. After the warm-up it prints "ready" (stdout), then
runs for SECS or until SIGINT/SIGTERM, and writes the JSON either way. `ends` lists the
iterations' end times (epoch s), so a caller can take the throughput inside a window.
--gate FILE: work only while FILE exists, idle (context kept, nothing launched) otherwise, so a
caller can switch the offline load on and off without reloading the model.
"""
import argparse, json, os, signal, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("secs", type=float)
ap.add_argument("out")
ap.add_argument("--model", default="resnet50", choices=["resnet50", "resnet50_train", "gpt_train", "encoder", "gemm"])
ap.add_argument("--batch", type=int, default=0)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--gate", default=None)
a = ap.parse_args()

stop = False
def _stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGINT, _stop)
signal.signal(signal.SIGTERM, _stop)

import torch  # after the arguments: --help works without torch

if a.model == "resnet50":
    import torchvision
    B = a.batch or 1024
    m = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(B, 3, 224, 224, device="cuda")
    per_it, unit = B, "images"
    def step():
        with torch.no_grad():
            m(x)
elif a.model == "resnet50_train":
    import torchvision
    B = a.batch or 128
    m = torchvision.models.resnet50().cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(B, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (B,), device="cuda")
    per_it, unit = B, "images"
    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
elif a.model == "encoder":
    B = a.batch or 8
    layer = torch.nn.TransformerEncoderLayer(768, 12, dim_feedforward=3072, dropout=0.0,
                                             activation="gelu", batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().eval()
    x = torch.randn(B, 128, 768, device="cuda")
    per_it, unit = B, "sequences"
    def step():
        with torch.no_grad():
            m(x)
elif a.model == "gemm":
    B, N = a.batch or 8, 8192
    ga = torch.randn(N, N, device="cuda", dtype=torch.half)
    gb = torch.randn(N, N, device="cuda", dtype=torch.half)
    gc = torch.empty(N, N, device="cuda", dtype=torch.half)
    per_it, unit = B * 2 * N ** 3 / 1e12, "TFLOP"
    def step():
        for _ in range(B):
            torch.matmul(ga, gb, out=gc)
else:
    B, S, D, V = a.batch or 8, 512, 1024, 32000
    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(V, D)
            self.pos = torch.nn.Embedding(S, D)
            layer = torch.nn.TransformerEncoderLayer(D, 16, dim_feedforward=4 * D, dropout=0.0,
                                                     activation="gelu", batch_first=True,
                                                     norm_first=True)
            self.body = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.norm = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(S))
        def forward(self, t):
            h = self.tok(t) + self.pos.weight[: t.shape[1]]
            h = self.body(h, mask=self.mask, is_causal=True)
            return self.head(self.norm(h))
    m = GPT().cuda().train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    t = torch.randint(0, V, (B, S + 1), device="cuda")
    per_it, unit = B * S, "tokens"
    def step():
        opt.zero_grad(set_to_none=True)
        logits = m(t[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, V), t[:, 1:].reshape(-1)).backward()
        opt.step()

for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
print("ready", flush=True)
ends, t0 = [], time.time()
while not stop and time.time() - t0 < a.secs:
    if a.gate and not os.path.exists(a.gate):
        time.sleep(0.002)
        continue
    step()
    torch.cuda.synchronize()
    ends.append(time.time())
dt = time.time() - t0
n = len(ends)
r = {"model": a.model, "batch": B, "unit": unit, "iterations": n, "items_per_s": n * per_it / dt,
     "seconds": dt, "items_per_iteration": per_it, "t_start": t0, "ends": [round(e, 4) for e in ends]}
if unit == "images":
    r["images_per_s"] = r["items_per_s"]
json.dump(r, open(a.out, "w"))
