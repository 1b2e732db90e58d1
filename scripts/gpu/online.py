"""Online inference service: a request every 1/RATE s; prints latency percentiles (JSON).

Usage: online.py SECS RATE OUT.json
                 [--model resnet18|encoder|probe|resnet50_b8|decode|denoise|speech]
                 [--warmup N] [--samples] [--tokens N] [--steps N]
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
  denoise      diffusion-style denoiser: a small conv UNet (fp16, channels_last; 4x64x64 latent;
               128 channels at 64x64, 256 at 32x32 and 16x16 with one self-attention there; six
               GroupNorm/SiLU residual blocks with a timestep embedding, skip connections), batch
               2 (classifier-free guidance: conditional and unconditional), run for --steps (20)
               denoising steps back to back (guidance and a DDIM-like update between them) and ONE
               synchronize at the end: a request is thousands of kernels with no host sync inside
               (launch-bound, eager; p50 ~60 ms alone on an H200)
  speech       speech encoder-decoder (Whisper-base-like, fp16, batch 1): two conv1d over 600 mel
               frames (80 bins) -> 300 frames, an encoder of 6 pre-LN transformer layers (d_model
               512, 8 heads, FF 2048) once per request, then a 4-token prompt and greedy decoding
               of --tokens (24) tokens by a 6-layer decoder (self-attention with a KV cache, cross-
               attention to the encoder output, projected once per request; vocab 51865, tied
               head), one `.item()` (host sync) per token (p50 ~65-85 ms alone on an H200)
--samples adds every request's arrival (epoch s) and latency (ms) to the JSON ("arrivals",
"lat_ms"), so a caller can take percentiles inside time windows.
After the warm-up it prints "ready" (stdout). It runs for SECS or until SIGINT/SIGTERM and writes
the JSON either way (a caller may start it with a long SECS and stop it when done).
Random weights, built from code (no downloads). Latency counts from the request's arrival
(open loop: a late reply delays the next ones). t_start/t_end (epoch s) bound the measurement.
"""
import argparse, json, math, os, signal, time

ap = argparse.ArgumentParser()
ap.add_argument("secs", type=float)
ap.add_argument("rate", type=float)
ap.add_argument("out")
ap.add_argument("--model", default="resnet18",
                choices=["resnet18", "encoder", "probe", "resnet50_b8", "decode", "denoise",
                         "speech"])
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--samples", action="store_true")
ap.add_argument("--tokens", type=int, default=None,
                help="decode, speech: tokens generated per request (decode 32, speech 24)")
ap.add_argument("--steps", type=int, default=20, help="denoise: denoising steps per request")
a = ap.parse_args()
if a.tokens is None:
    a.tokens = 24 if a.model == "speech" else 32

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
elif a.model == "decode":
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
elif a.model == "denoise":
    import torch.nn.functional as F
    nn = torch.nn
    # Sized for ~50-60 ms per request on an H200 (measured alone, 4 req/s: p50 60 ms; with two
    # residual blocks per down level and NCHW it was 92-100 ms). The GPU work is a fraction of
    # that (~20 ms of kernels in the NCHW version): the request is launch-bound like an eager
    # diffusion server at small batch, thousands of kernels and no host sync until the end, so
    # a request's delay under colocation is its kernels queueing behind offline work.
    CL, C0, C1, E, S, B = 4, 128, 256, 512, 64, 2  # latent ch, channels, time emb, size, batch
    torch.backends.cudnn.benchmark = True  # fixed shapes: pick the fastest convs once (warm-up)

    class Res(nn.Module):  # GroupNorm-SiLU-conv twice, the time embedding added in between
        def __init__(self, cin, cout):
            super().__init__()
            self.cout = cout
            self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, te):  # te [B, cout]: this block's projection of the time embedding
            h = self.c1(F.silu(self.n1(x))) + te[:, :, None, None]
            return self.skip(x) + self.c2(F.silu(self.n2(h)))

    class Attn(nn.Module):  # self-attention over the 16x16 positions
        def __init__(self, c, heads=8):
            super().__init__()
            self.h, self.n = heads, nn.GroupNorm(32, c)
            self.qkv, self.o = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

        def forward(self, x):
            b, c, hh, ww = x.shape
            q, k, v = self.qkv(self.n(x)).view(b, 3, self.h, c // self.h, hh * ww) \
                .transpose(-1, -2).unbind(1)
            y = F.scaled_dot_product_attention(q, k, v)  # [b, heads, hw, c / heads]
            return x + self.o(y.transpose(-1, -2).reshape(b, c, hh, ww))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            half = C0 // 2  # sinusoidal timestep features: C0 of them
            self.register_buffer("freqs", torch.exp(-math.log(1e4) * torch.arange(half) / half))
            self.temb = nn.Sequential(nn.Linear(C0, E), nn.SiLU(), nn.Linear(E, E))
            self.cin = nn.Conv2d(CL, C0, 3, padding=1)
            self.d1 = Res(C0, C0)                                               # 64x64
            self.down1 = nn.Conv2d(C0, C0, 3, stride=2, padding=1)              # -> 32x32
            self.d2 = Res(C0, C1)                                               # 32x32
            self.down2 = nn.Conv2d(C1, C1, 3, stride=2, padding=1)              # -> 16x16
            self.mid1, self.attn, self.mid2 = Res(C1, C1), Attn(C1), Res(C1, C1)  # 16x16
            self.up2, self.u2 = nn.Conv2d(C1, C1, 3, padding=1), Res(2 * C1, C1)  # 32x32
            self.up1, self.u1 = nn.Conv2d(C1, C0, 3, padding=1), Res(2 * C0, C0)  # 64x64
            self.nout, self.cout = nn.GroupNorm(32, C0), nn.Conv2d(C0, CL, 3, padding=1)
            # Every block's time projection in one GEMM (as fused UNet servers do), split per block
            # in forward order.
            self.res = [self.d1, self.d2, self.mid1, self.mid2, self.u2, self.u1]
            self.tproj = nn.Linear(E, sum(b.cout for b in self.res))

        def forward(self, x, t):  # x [B, CL, S, S], t: the step's timestep (a tensor, [1])
            f = t[:, None] * self.freqs[None]
            e = self.tproj(F.silu(self.temb(torch.cat([f.sin(), f.cos()], -1))))
            te = e.expand(x.shape[0], -1).split([b.cout for b in self.res], 1)
            s64 = self.d1(self.cin(x), te[0])
            s32 = self.d2(self.down1(s64), te[1])
            h = self.mid2(self.attn(self.mid1(self.down2(s32), te[2])), te[3])
            h = self.u2(torch.cat([self.up2(F.interpolate(h, scale_factor=2.0)), s32], 1), te[4])
            h = self.u1(torch.cat([self.up1(F.interpolate(h, scale_factor=2.0)), s64], 1), te[5])
            return self.cout(F.silu(self.nout(h)))

    # channels_last: cuDNN's fp16 convolutions run NHWC; NCHW tensors would cost a layout
    # conversion kernel around every convolution (measured: ~30% of the request on an H200).
    cl = torch.channels_last
    m = UNet().cuda().eval().half().to(memory_format=cl)
    noise = torch.randn(1, CL, S, S, device="cuda", dtype=torch.half).to(memory_format=cl)
    # A DDIM-like schedule: timesteps and the update's two coefficients per step (host floats);
    # the cosine schedule's alpha-bar is kept >= 0.01 so that the latent of a random network
    # stays well inside fp16 over the steps.
    steps = torch.linspace(999, 0, a.steps).round()
    abar = lambda tt: max(0.01, math.cos((tt / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2)
    tsteps = [steps[i:i + 1].to("cuda", torch.half) for i in range(a.steps)]
    coef = []
    for i, tt in enumerate(steps.tolist()):
        a0, a1 = abar(tt), abar(steps[i + 1].item()) if i + 1 < a.steps else 1.0
        coef.append(((a1 / a0) ** 0.5, (1 - a1) ** 0.5 - (a1 * (1 - a0) / a0) ** 0.5))

    def request():
        x = noise.clone()
        for i in range(a.steps):
            eps_c, eps_u = m(torch.cat([x, x]), tsteps[i]).chunk(2)  # B = 2: guided pair
            eps = eps_u + 7.5 * (eps_c - eps_u)
            x = coef[i][0] * x + coef[i][1] * eps
        torch.cuda.synchronize()  # the one host sync: the latent is ready

    if a.warmup > 5:
        a.warmup = 5  # ~2k launches per request: 5 warm everything up (cudnn's choice included)
else:  # speech
    import torch.nn.functional as F
    nn = torch.nn
    # Sized for ~60-90 ms per request on an H200 (measured alone, 4 req/s: p50 67-84 ms on two
    # machines): the encoder once, then per token ~110 launches (6 layers x ~18: self- and
    # cross-attention, MLP) and one host sync, x 24 tokens; ~8 ms of kernels per request.
    L, D, H, FF, V, MEL, FRAMES, PROMPT = 6, 512, 8, 2048, 51865, 80, 300, 4
    HD, T = D // H, PROMPT + a.tokens
    heads = lambda z: z.view(1, z.shape[1], H, HD).transpose(1, 2)  # [1, t, D] -> [1, H, t, HD]
    merge = lambda z: z.transpose(1, 2).reshape(1, z.shape[2], D)    # and back

    class EncBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc, self.out = nn.Linear(D, FF), nn.Linear(FF, D)

        def forward(self, h):
            q, k, v = (heads(z) for z in self.qkv(self.ln1(h)).split(D, dim=-1))
            h = h + self.proj(merge(F.scaled_dot_product_attention(q, k, v)))
            return h + self.out(F.gelu(self.fc(self.ln2(h))))

    class DecBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2, self.ln3 = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.cq, self.ckv, self.cproj = nn.Linear(D, D), nn.Linear(D, 2 * D), nn.Linear(D, D)
            self.fc, self.out = nn.Linear(D, FF), nn.Linear(FF, D)

        def cross(self, enc):  # the encoder output's keys and values, once per request
            return tuple(heads(z) for z in self.ckv(enc).split(D, dim=-1))

        def forward(self, h, kc, vc, ck, cv, pos):
            t = h.shape[1]
            q, k, v = (heads(z) for z in self.qkv(self.ln1(h)).split(D, dim=-1))
            kc[:, :, pos:pos + t] = k  # the KV cache: [1, H, T, HD] per layer
            vc[:, :, pos:pos + t] = v
            h = h + self.proj(merge(F.scaled_dot_product_attention(
                q, kc[:, :, :pos + t], vc[:, :, :pos + t], is_causal=t > 1)))
            h = h + self.cproj(merge(F.scaled_dot_product_attention(
                heads(self.cq(self.ln2(h))), ck, cv)))
            return h + self.out(F.gelu(self.fc(self.ln3(h))))

    class Speech(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(MEL, D, 3, padding=1)
            self.conv2 = nn.Conv1d(D, D, 3, stride=2, padding=1)  # 600 mel frames -> 300
            self.epos = nn.Parameter(torch.randn(FRAMES, D) * 0.02)
            self.enc = nn.ModuleList(EncBlock() for _ in range(L))
            self.eln = nn.LayerNorm(D)
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(448, D)
            self.dec = nn.ModuleList(DecBlock() for _ in range(L))
            self.dln = nn.LayerNorm(D)

        def encode(self, mel):  # [1, MEL, 2 FRAMES] -> [1, FRAMES, D]
            h = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2) + self.epos
            for b in self.enc:
                h = b(h)
            return self.eln(h)

        def forward(self, ids, pos, cross):  # ids [1, t] at pos..pos+t-1 -> next-token ids
            t = ids.shape[1]
            h = self.wte(ids) + self.wpe.weight[pos:pos + t]
            for b, kc, vc, (ck, cv) in zip(self.dec, kcache, vcache, cross):
                h = b(h, kc, vc, ck, cv, pos)
            # Greedy over the tied head, [1, 1].
            return F.linear(self.dln(h[:, -1]), self.wte.weight).argmax(-1, keepdim=True)

    m = Speech().cuda().eval().half()
    kcache = [torch.zeros(1, H, T, HD, device="cuda", dtype=torch.half) for _ in range(L)]
    vcache = [torch.zeros(1, H, T, HD, device="cuda", dtype=torch.half) for _ in range(L)]
    mel = torch.randn(1, MEL, 2 * FRAMES, device="cuda", dtype=torch.half)
    prompt = torch.randint(0, V, (1, PROMPT), device="cuda")  # start, language, task, no stamps
    generated = []

    def request():
        enc = m.encode(mel)
        cross = [b.cross(enc) for b in m.dec]
        nxt = m(prompt, 0, cross)  # prefill -> the first token
        toks = [nxt.item()]  # host sync per token (a server checks for the end token)
        for i in range(1, a.tokens):
            nxt = m(nxt, PROMPT + i - 1, cross)
            toks.append(nxt.item())
        generated[:] = toks

    if a.warmup > 5:
        a.warmup = 5

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
           **({"tokens": a.tokens} if a.model in ("decode", "speech") else {}),
           **({"steps": a.steps} if a.model == "denoise" else {}),
           **(samples if a.samples else {})}, open(a.out, "w"))
