"""Quick GPU smoke of the Sinkhorn and segment Triton routes (lead's early check, not a benchmark of record):
correctness against the float64 PyTorch backend, determinism, and rough timings with floor fractions."""
import json
import sys
import time

import torch
import triton

from provable_kernels.segment import segment_max_backward, segment_reduce
from provable_kernels.sinkhorn import sinkhorn

dev = torch.device("cuda")
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
rows = []


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # us


big = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
copy_us = bench(lambda: big.clone())
bw = 2 * big.numel() / (copy_us * 1e-6)
out["copy_TBps"] = bw / 1e12
del big


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ---------------- sinkhorn correctness
for domain in ("log", "prob"):
    for n in (1, 2, 3, 4, 5, 8, 16, 17, 32, 64):
        for B in (1, 7, 1000):
            for dtype in (torch.float32, torch.bfloat16, torch.float64):
                try:
                    x = (3 * torch.randn(B, n, n, device=dev)).to(dtype).requires_grad_(True)
                    y = sinkhorn(x, 20, domain)
                    g = torch.randn_like(y)
                    (gx,) = torch.autograd.grad(y, x, g)
                    xr = x.detach().double().requires_grad_(True)
                    yr = sinkhorn(xr, 20, domain, use_triton=False)
                    (gr,) = torch.autograd.grad(yr, xr, g.double())
                    y2 = sinkhorn(x, 20, domain)
                    (gx2,) = torch.autograd.grad(y2, x, g)
                    rows.append(dict(fam="sinkhorn", domain=domain, n=n, B=B, dtype=str(dtype), fwd_rel=rel(y, yr),
                                     bwd_rel=rel(gx, gr), bitwise=bool(torch.equal(y, y2) and torch.equal(gx, gx2))))
                except Exception as exc:  # noqa: BLE001
                    rows.append(dict(fam="sinkhorn", domain=domain, n=n, B=B, dtype=str(dtype), error=repr(exc)[:300]))
bad = [r for r in rows if r["fam"] == "sinkhorn" and ("error" in r or r["fwd_rel"] > 5e-2 or r["bwd_rel"] > 5e-2
                                                        or not r["bitwise"])]
print("sinkhorn problems:", json.dumps(bad[:20], indent=0))
worst = {}
for r in rows:
    if r["fam"] == "sinkhorn" and "error" not in r:
        k = r["dtype"]
        worst[k] = max(worst.get(k, 0), r["fwd_rel"], r["bwd_rel"])
print("sinkhorn worst rel per dtype", worst)

# ---------------- sinkhorn timing
timing = []
for domain in ("log", "prob"):
    for B, n in ((32, 4), (4096, 4), (262144, 4), (1048576, 4), (262144, 8), (65536, 16), (16384, 32)):
        x = torch.randn(B, n, n, device=dev)
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)
        ours_f = bench(lambda: sinkhorn(x, 20, domain))
        ours_fb = bench(lambda: torch.autograd.grad(sinkhorn(xg, 20, domain), xg, g))
        naive_f = bench(lambda: sinkhorn(x, 20, domain, use_triton=False))
        naive_fb = bench(lambda: torch.autograd.grad(sinkhorn(xg, 20, domain, use_triton=False), xg, g))
        nbytes = x.numel() * 4
        floor_f = 2 * nbytes / bw * 1e6
        floor_fb = 5 * nbytes / bw * 1e6
        timing.append(dict(domain=domain, B=B, n=n, ours_fwd_us=ours_f, ours_fb_us=ours_fb, naive_fwd_us=naive_f,
                           naive_fb_us=naive_fb, floor_fwd=floor_f / ours_f, floor_fb=floor_fb / ours_fb,
                           speedup_fb=naive_fb / ours_fb))
for t in timing:
    print("sinkhorn {domain} B={B} n={n}: fwd {ours_fwd_us:.1f}us ({floor_fwd:.0%} floor) fwd+bwd {ours_fb_us:.1f}us "
          "({floor_fb:.0%}) naive fb {naive_fb_us:.0f}us -> {speedup_fb:.1f}x".format(**t))
out["sinkhorn_timing"] = timing

# ---------------- segment correctness
seg_rows = []
def offsets_for(N, S, gen):
    cuts = torch.sort(torch.randint(0, N + 1, (S - 1,), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([N])]).to(dev)

gen = torch.Generator().manual_seed(0)
for N, D, S in ((0, 4, 3), (1, 1, 1), (100, 3, 7), (5000, 64, 50), (100000, 16, 3), (300000, 8, 1), (4096, 130, 4000)):
    off = offsets_for(N, S, gen) if N else torch.zeros(S + 1, dtype=torch.int64, device=dev)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randint(-3, 4, (N, D), generator=gen).to(dev, dtype)  # ties
        for reduce in ("sum", "mean", "max", "min"):
            try:
                xg = x.clone().requires_grad_(True)
                y = segment_reduce(xg, reduce, offsets=off)
                g = torch.randn_like(y)
                (gx,) = torch.autograd.grad(y, xg, g) if N else (torch.zeros_like(x),)
                xr = x.double().requires_grad_(True)
                yr = segment_reduce(xr, reduce, offsets=off, use_triton=False)
                (gr,) = torch.autograd.grad(yr, xr, g.double()) if N else (torch.zeros_like(xr),)
                y2 = segment_reduce(xg, reduce, offsets=off)
                r = dict(fam="segment", N=N, D=D, S=S, dtype=str(dtype), reduce=reduce, fwd_rel=rel(y, yr) if y.numel() else 0,
                         bwd_rel=rel(gx, gr) if gx.numel() and gr.norm() > 0 else float((gx.double() - gr).abs().max()) if gx.numel() else 0.0,
                         bitwise=bool(torch.equal(y, y2)))
                if reduce in ("max", "min") and N:
                    adj = (segment_max_backward if reduce == "max" else torch.nn.Module)  # noqa
                    if reduce == "max":
                        ga = segment_max_backward(g, x, offsets=off)
                        r["adjoint_bitwise"] = bool(torch.equal(ga, gx))
                seg_rows.append(r)
            except Exception as exc:  # noqa: BLE001
                seg_rows.append(dict(fam="segment", N=N, D=D, S=S, dtype=str(dtype), reduce=reduce, error=repr(exc)[:300]))
bad = [r for r in seg_rows if "error" in r or r["fwd_rel"] > 2e-2 or r["bwd_rel"] > 2e-2 or not r["bitwise"]
       or r.get("adjoint_bitwise") is False]
print("segment problems:", json.dumps(bad[:20], indent=0))

# ---------------- segment timing
seg_t = []
for N, D, S in ((1 << 22, 64, 65536), (1 << 20, 256, 1024), (1 << 24, 16, 1 << 20), (1 << 24, 16, 1)):
    x = torch.randn(N, D, device=dev)
    off = offsets_for(N, S, gen)
    lengths = off.diff()
    nbytes = x.numel() * 4
    for reduce in ("sum", "max"):
        ours = bench(lambda: segment_reduce(x, reduce, offsets=off))
        torch_f = bench(lambda: torch.segment_reduce(x, reduce, offsets=off, axis=0)) if S > 1 else float("nan")
        floor = (nbytes + S * D * 4) / bw * 1e6
        row = dict(N=N, D=D, S=S, reduce=reduce, ours_fwd_us=ours, torch_fwd_us=torch_f, floor_fwd=floor / ours)
        if reduce == "max":
            xg = x.clone().requires_grad_(True)
            gy = torch.randn(S, D, device=dev)
            row["ours_fb_us"] = bench(lambda: torch.autograd.grad(segment_reduce(xg, "max", offsets=off), xg, gy))
            if S > 1:
                row["torch_fb_us"] = bench(lambda: torch.autograd.grad(torch.segment_reduce(xg, "max", offsets=off, axis=0), xg, gy))
            fb_bytes = nbytes + S * D * 4 + S * D * 4 + S * D * 4 + nbytes  # x, y, argmax, grad_y, grad_x
            row["floor_fb"] = fb_bytes / bw * 1e6 / row["ours_fb_us"]
        seg_t.append(row)
        print("segment", row)
out["segment_timing"] = seg_t
out["rows"] = rows + seg_rows
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("copy TB/s", out["copy_TBps"])
