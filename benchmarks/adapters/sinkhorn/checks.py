"""Sinkhorn's GPU checks beyond timing (``python -m benchmarks check --families sinkhorn``).

- ``routes``: every Triton route (log / prob x infer / train) against the float64 loop of the convention
  (``provable_kernels.sinkhorn.oracle.sinkhorn_oracle``, run on the device in float64) at float32, float64, bfloat16
  and float16, n = 1..64 (powers of two and not), B from 1 to 1M, iters 1 and 20; the route taken is checked with
  ``recording()``. Outputs: max abs error (``OUT_TOL``); gradients for a random upstream: norm-wise relative error
  (``GRAD_TOL``).
- ``guards``: at B = 4096, logits of +-1e4, -inf entries, all -inf rows and columns, rows spanning 29.9 (the scaling
  form's limit), float32 and float64, against the same float64 loop.
- ``determinism``: outputs and gradients bitwise equal when computed twice, at B = 262144, n = 4 and B = 4096, n = 32.
"""
from __future__ import annotations

import torch

from benchmarks.adapters import Check, Evidence

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
OUT_TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1.6e-2, "float16": 2e-3}  # max abs (outputs <= 1)
GRAD_TOL = {"float32": 1e-4, "float64": 1e-10, "bfloat16": 2e-2, "float16": 4e-3}  # norm-wise relative
EPS = 1e-3
CHECK_SHAPES = [(B, n, it) for n in (1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64)
                for B, it in ((1, 20), (37, 1), (1000, 20))]
CHECK_SHAPES += [(1048576, 4, 20), (262144, 8, 20), (65536, 16, 20)]
ORACLE_MAX_ELEMENTS = 2**24


def logits(B: int, n: int, device: torch.device, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(B, n, n, generator=g, device=device, dtype=torch.float64) * scale


def compare(out: Evidence, x64: torch.Tensor, dtype_name: str, iters: int, domain: str, train: bool,
            **extra) -> None:
    """Run the route on ``x64`` cast to the dtype; record its errors against the float64 loop and the route."""
    from provable_kernels.dispatch import recording
    from provable_kernels.sinkhorn import sinkhorn
    from provable_kernels.sinkhorn.oracle import sinkhorn_oracle

    dtype = DTYPES[dtype_name]
    x = x64.detach().to(dtype).clone().requires_grad_(train)  # a fresh leaf (float64 .to() returns x64 itself)
    with recording() as taken:
        result = sinkhorn(x, iters, domain, EPS)
    row = {**extra, "route": taken[0] if taken else None, "dtype": dtype_name, "B": x.shape[0], "n": x.shape[-1],
           "iters": iters, "domain": domain}
    leaf = x.detach().double().requires_grad_(train)
    with torch.enable_grad():
        ref = sinkhorn_oracle(leaf, iters, domain, EPS)
    row["out_err"] = float((result.detach().double() - ref.detach()).abs().max()) if result.numel() else 0.0
    ok = row["out_err"] <= OUT_TOL[dtype_name] and bool(torch.isfinite(result).all())
    if train:
        w = torch.randn(result.shape, generator=torch.Generator(device=x.device).manual_seed(1), device=x.device,
                        dtype=torch.float64)
        (g,) = torch.autograd.grad(result, x, w.to(dtype))
        (g_ref,) = torch.autograd.grad(ref, leaf, w)
        row["grad_err"] = float((g.double() - g_ref).norm() / g_ref.norm().clamp_min(1e-30))
        ok = ok and row["grad_err"] <= GRAD_TOL[dtype_name] and bool(torch.isfinite(g).all())
    out.record(ok and row["route"] == f"sinkhorn.triton.{domain}.{'train' if train else 'infer'}", row)


def routes(out: Evidence, device: torch.device, budget_s: float) -> None:
    for B, n, iters in CHECK_SHAPES:
        if B * n * n > ORACLE_MAX_ELEMENTS * 2:
            continue
        x64 = logits(B, n, device, seed=n)
        for dtype_name in DTYPES:
            for domain in ("log", "prob"):
                for train in (False, True):
                    compare(out, x64, dtype_name, iters, domain, train)


def guards(out: Evidence, device: torch.device, budget_s: float) -> None:
    x = logits(4096, 5, device, seed=3)
    cases = {"logits of +-1e4": x * 1e4, "rows spanning 29.9": torch.where(x > 0, 0.0, -29.9)}
    for name, index in (("-inf entries", (slice(None, None, 3), 0, 1)), ("all -inf rows", (slice(None, None, 2), 2)),
                        ("all -inf columns", (slice(None, None, 2), slice(None), 3))):
        cases[name] = x.clone()
        cases[name][index] = float("-inf")
    for name, values in cases.items():
        for dtype_name in ("float32", "float64"):
            for domain in ("log", "prob"):
                compare(out, values, dtype_name, 20, domain, True, guard=name)


def determinism(out: Evidence, device: torch.device, budget_s: float) -> None:
    from provable_kernels.sinkhorn import sinkhorn

    for B, n in ((262144, 4), (4096, 32)):
        x = logits(B, n, device, seed=5).float()
        w = logits(B, n, device, seed=6).float()
        for domain in ("log", "prob"):
            runs = []
            for _ in range(2):
                leaf = x.clone().requires_grad_()
                result = sinkhorn(leaf, 20, domain, EPS)
                runs.append((result, *torch.autograd.grad(result, leaf, w)))
            out.record(all(torch.equal(a, b) for a, b in zip(*runs)), {"B": B, "n": n, "domain": domain})


CHECKS = (
    Check("routes", routes, "every Triton route within OUT_TOL / GRAD_TOL of the float64 loop, four dtypes"),
    Check("guards", guards, "extreme and -inf logits within tolerance of the float64 loop"),
    Check("determinism", determinism, "outputs and gradients bitwise equal when computed twice"),
)
