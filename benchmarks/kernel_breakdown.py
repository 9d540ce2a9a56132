"""Where a public call's time goes on the GPU: every CUDA kernel it launches, with its device time, against the
call's wall time (run by the lead on an H100 / H200).

    python benchmarks/kernel_breakdown.py --out DIR [--family sinkhorn segment semicrf]

For each family's headline shapes (float32), the public call (forward, and forward+backward where the family
trains) runs a few times to warm up, then ``REPS`` times under ``torch.profiler``; the table lists each kernel's
mean device time per call, their sum, the call's mean wall time (synchronised) and the copy-bandwidth floor
(the bytes of each family's benchmark adapter; none for the launch-bound semi-CRF shape). The
gap between wall time and the kernels' sum is host time that the GPU waited on (validation, dispatch, launches).
Writes ``DIR/kernel_breakdown.json``.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.adapters.segment import floor as segment_floor, segment_lengths  # noqa: E402
from benchmarks.common import Timer, environment, measure_floors, write_json  # noqa: E402

REPS = 20


def _segment_cases(device):
    from provable_kernels.segment import segment_reduce

    for N, D, S in ((16 * 2**20, 16, 2**20), (4 * 2**20, 64, 65536), (2**20, 256, 1024), (16 * 2**20, 16, 1)):
        lengths = segment_lengths(N, S, "random", torch.Generator().manual_seed(0)).to(device)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        x = torch.randn(N, D, device=device)
        for reduce in ("sum", "max"):
            config = {"N": N, "D": D, "S": S, "reduce": reduce, "dtype": "float32"}
            yield (f"segment N={N} D={D} S={S} {reduce} fwd", segment_floor(config, "forward")[0],
                   lambda x=x, o=offsets, r=reduce: segment_reduce(x, r, offsets=o))
            xg = x.detach().requires_grad_()

            def both(xg=xg, o=offsets, r=reduce):
                y = segment_reduce(xg, r, offsets=o)
                torch.autograd.grad(y, xg, torch.ones_like(y))
            yield f"segment N={N} D={D} S={S} {reduce} fwd+bwd", segment_floor(config, "both")[0], both


def _sinkhorn_cases(device):
    from provable_kernels.sinkhorn import sinkhorn

    for B, n in ((262144, 4), (65536, 16), (32, 4)):
        x = torch.randn(B, n, n, device=device)
        xg = x.detach().requires_grad_()
        for domain in ("log", "prob"):
            yield (f"sinkhorn B={B} n={n} {domain} fwd", 2 * x.numel() * 4,
                   lambda x=x, d=domain: sinkhorn(x, 20, d))

            def both(xg=xg, d=domain):
                y = sinkhorn(xg, 20, d)
                torch.autograd.grad(y, xg, torch.ones_like(y))
            yield f"sinkhorn B={B} n={n} {domain} fwd+bwd", 5 * x.numel() * 4, both


def _semicrf_cases(device):
    from provable_kernels.semicrf import semi_crf_streaming_forward

    B, T, K, C = 32, 25, 5, 20
    g = torch.Generator(device=device).manual_seed(0)
    cum = torch.randn(B, T + 1, C, device=device, generator=g).cumsum(1)
    trans = torch.randn(C, C, device=device, generator=g)
    dur = torch.randn(K, C, device=device, generator=g)
    lengths = torch.full((B,), T, device=device)
    yield (f"semicrf B={B} T={T} K={K} C={C} fwd", None,  # launch-bound: no copy floor
           lambda: semi_crf_streaming_forward(cum, trans, dur, lengths, K))


CASES = {"segment": _segment_cases, "sinkhorn": _sinkhorn_cases, "semicrf": _semicrf_cases}


def breakdown(fn, reps: int = REPS) -> dict:
    """Mean wall time per call (synchronised before and after the loop) and each CUDA kernel's mean device time
    per call, from ``torch.profiler``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - start) / reps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[event.name]
            entry[0] += event.device_time / reps
            entry[1] += 1
    rows = sorted(({"kernel": k, "us": v[0], "launches": v[1] / reps} for k, v in kernels.items()),
                  key=lambda r: -r["us"])
    return {"wall_us": wall_us, "kernels_us": sum(r["us"] for r in rows), "kernels": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_breakdown.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    copy = measure_floors(Timer(device)).copy_bytes_per_s
    results = []
    for family in args.family:
        for name, nbytes, fn in CASES[family](device):
            r = breakdown(fn)
            r.update(case=name, floor_us=None if nbytes is None else nbytes / copy * 1e6)
            results.append(r)
            floor = "" if nbytes is None else f", floor {r['floor_us']:.1f} us"
            print(f"{name}: wall {r['wall_us']:.1f} us, kernels {r['kernels_us']:.1f} us{floor}", flush=True)
            for k in r["kernels"]:
                print(f"    {k['us']:9.1f} us  x{k['launches']:.0f}  {k['kernel'][:110]}", flush=True)
            torch.cuda.empty_cache()
    write_json(args.out / "kernel_breakdown.json", {"environment": environment(device), "copy_bytes_per_s": copy,
                                                    "cases": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
