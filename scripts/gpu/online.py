"""Online inference service: a request every 1/RATE s; prints latency percentiles (JSON).

Usage: online.py SECS RATE OUT.json [--model resnet18|encoder|probe|resnet50_b8|decode]
                 [--warmup N] [--samples] [--tokens N]
  resnet18     torchvision ResNet-18, batch 1, 3x224x224 (the seeds' service; the default)
  encoder      a BERT-base-sized encoder from torch.nn.TransformerEncoder: 12 layers, d_model 768,
               12 heads, FF 3072, seq 128, batch 1 (many short kernels)
  probe        one tiny kernel (add on one element) per request: its latency is the time from a
               launch to its kernel having run, i.e. how long a newcomer waits for the GPU
  resnet50_b8  torchvision ResNet-50, batch 8, fp16, 3x224x224
  decode       eager LLM decode, GPT-2-small-sized decoder (12 layers, d_model 768, 12 heads,
               FF 3072, vocab 50257), fp16, with a KV cache, batch 1: a request is a prefill of a
               16-token prompt and then greedy generation of --tokens (32) tokens, one `.item()`
               (host sync) on each sampled token; the latency is the whole request
--samples adds every request's arrival (epoch s) and latency (ms) to the JSON ("arrivals",
"lat_ms"), so a caller can take percentiles inside time windows.
After the warm-up it prints "ready" (stdout). It runs for SECS or until SIGINT/SIGTERM and writes
the JSON either way (a caller may start it with a long SECS and stop it when done).
Random weights, built from code (no downloads). Latency counts from the request's arrival
(open loop: a late reply delays the next ones). t_start/t_end (epoch s) bound the measurement.
"""
import argparse, json, os, signal, time

ap = argparse.ArgumentParser()
ap.add_argument("secs", type=float)
ap.add_argument("rate", type=float)
ap.add_argument("out")
ap.add_argument("--model", default="resnet18",
                choices=["resnet18", "encoder", "probe", "resnet50_b8", "decode"])
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--samples", action="store_true")
ap.add_argument("--tokens", type=int, default=32, help="decode: tokens generated per request")
a = ap.parse_args()

stop = False
def _stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGINT, _stop)
signal.signal(signal.SIGTERM, _stop)

import torch  # after the arguments: --help works without torch

if a.model == "resnet18":
    import torchvision
    m = torchvision.models.resnet18().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    def request():
        m(x)
        torch.cuda.synchronize()
elif a.model == "resnet50_b8":
    import torchvision
    m = torchvision.models.resnet50().cuda().eval().half()
    x = torch.randn(8, 3, 224, 224, device="cuda", dtype=torch.half)
    def request():
        m(x)
        torch.cuda.synchronize()
elif a.model == "probe":
    x = torch.zeros(1, device="cuda")
    def request():
        x.add_(1)
        torch.cuda.synchronize()
elif a.model == "encoder":
    layer = torch.nn.TransformerEncoderLayer(768, 12, dim_feedforward=3072, dropout=0.0,
                                             activation="gelu", batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().eval()
    x = torch.randn(1, 128, 768, device="cuda")
    def request():
        m(x)
        torch.cuda.synchronize()
else:  # decode
    import torch.nn.functional as F
    L, D, H, V, PROMPT = 12, 768, 12, 50257, 16
    HD, T = D // H, PROMPT + a.tokens

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
            self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(self, h, kc, vc, pos):
            t = h.shape[1]
            q, k, v = self.qkv(self.ln1(h)).split(D, dim=-1)
            q, k, v = (z.view(1, t, H, HD).transpose(1, 2) for z in (q, k, v))
            kc[:, :, pos:pos + t] = k  # the KV cache: [1, H, T, HD] per layer
            vc[:, :, pos:pos + t] = v
            att = F.scaled_dot_product_attention(q, kc[:, :, :pos + t], vc[:, :, :pos + t],
                                                 is_causal=t > 1)
            h = h + self.proj(att.transpose(1, 2).reshape(1, t, D))
            return h + self.out(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(1024, D)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
            self.lnf = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)

        def forward(self, ids, pos):  # ids [1, t] at positions pos..pos+t-1 -> next-token ids
            t = ids.shape[1]
            h = self.wte(ids) + self.wpe.weight[pos:pos + t]
            for b, kc, vc in zip(self.blocks, kcache, vcache):
                h = b(h, kc, vc, pos)
            return self.head(self.lnf(h[:, -1])).argmax(-1, keepdim=True)  # greedy, [1, 1]

    m = Decoder().cuda().eval().half()
    kcache = [torch.zeros(1, H, T, HD, device="cuda", dtype=torch.half) for _ in range(L)]
    vcache = [torch.zeros(1, H, T, HD, device="cuda", dtype=torch.half) for _ in range(L)]
    prompt = torch.randint(0, V, (1, PROMPT), device="cuda")
    generated = []

    def request():
        nxt = m(prompt, 0)  # prefill -> the first token
        toks = [nxt.item()]  # host sync per token (a server checks for the stop token)
        for i in range(1, a.tokens):
            nxt = m(nxt, PROMPT + i - 1)
            toks.append(nxt.item())
        generated[:] = toks

    if a.warmup > 5:
        a.warmup = 5  # a request is ~30+ launches x 32 tokens: 5 warm everything up

with torch.no_grad():
    for _ in range(a.warmup):
        request()
    torch.cuda.synchronize()
    print("ready", flush=True)
    lat, arr, t0 = [], [], time.time()
    nxt_t = t0
    while not stop and time.time() - t0 < a.secs:
        now = time.time()
        if now < nxt_t:
            time.sleep(nxt_t - now)
            if stop:
                break
        start = nxt_t  # latency from the request's arrival
        request()
        lat.append((time.time() - start) * 1e3)
        arr.append(start)
        nxt_t += 1.0 / a.rate
    t1 = time.time()
samples = {"arrivals": [round(t, 5) for t in arr], "lat_ms": [round(v, 4) for v in lat]}
lat = sorted(lat) or [float("nan")]
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
json.dump({"model": a.model, "pid": os.getpid(), "rate": a.rate, "requests": len(arr), "p50_ms": q(0.5),
           "p95_ms": q(0.95), "p99_ms": q(0.99), "max_ms": lat[-1],
           "mean_ms": sum(lat) / len(lat), "t_start": t0, "t_end": t1,
           **({"tokens": a.tokens} if a.model == "decode" else {}),
           **(samples if a.samples else {})}, open(a.out, "w"))
