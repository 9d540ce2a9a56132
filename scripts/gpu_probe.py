"""Lead's GPU probe: public call vs kernel alone, for the Sinkhorn and segment families."""
import time

import torch
import triton

from provable_kernels.segment import segment_reduce
from provable_kernels.segment import triton_ops as seg_ops
from provable_kernels.sinkhorn import sinkhorn
from provable_kernels.sinkhorn import triton_ops as sk_ops

dev = torch.device("cuda")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def host(fn, n=200):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    cpu = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return cpu


for domain in ("log", "prob"):
    for B, n in ((32, 4), (262144, 4), (262144, 8), (16384, 32)):
        x = torch.randn(B, n, n, device=dev)
        g = torch.randn_like(x)
        print(f"sinkhorn {domain} B={B} n={n}: public fwd {bench(lambda: sinkhorn(x, 20, domain)):.1f}us "
              f"(host {host(lambda: sinkhorn(x, 20, domain)):.1f}us), kernel fwd "
              f"{bench(lambda: sk_ops.forward(x, 20, domain, 1e-6)):.1f}us, kernel bwd "
              f"{bench(lambda: sk_ops.backward(g, x, 20, domain, 1e-6)):.1f}us, plan {sk_ops.plan(B, n, dev)}")

gen = torch.Generator().manual_seed(0)
for N, D, S in ((1 << 22, 64, 65536), (1 << 24, 16, 1)):
    x = torch.randn(N, D, device=dev)
    cuts = torch.sort(torch.randint(0, N + 1, (S - 1,), generator=gen)).values
    off = torch.cat([torch.tensor([0]), cuts, torch.tensor([N])]).to(dev)
    for reduce in ("sum", "max"):
        print(f"segment {reduce} N={N} D={D} S={S}: public {bench(lambda: segment_reduce(x, reduce, offsets=off)):.1f}us "
              f"(host {host(lambda: segment_reduce(x, reduce, offsets=off)):.1f}us), kernel "
              f"{bench(lambda: seg_ops.forward(x, off, None, reduce, 0.0, False)):.1f}us, plan {seg_ops.plan(N, D)}")
