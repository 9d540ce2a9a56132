"""Segment reductions' checks beyond timing (``python -m benchmarks check --families segment``).

- ``routes``: every Triton route of ``provable_kernels.segment.TREE`` against the float64 oracle
  (``provable_kernels.segment.oracle``, per-segment Python loops) at float32, float64, bfloat16 and float16, with
  empty segments, ties (integer data, upstream gradients of both signs) and NaN / inf rows; the route taken is
  checked with ``recording()``. Tolerance ``TOL`` relative to max(1, the largest finite reference value); NaN must
  match NaN and infinities exactly.
- ``large``: float64 references computed here (torch in float64; the first-occurrence arg by an ``amin`` over
  matching rows): one segment of 16M rows (S = 1), empty segments at 4M rows, ties at 4M x 64, every reduction,
  each output and gradient computed twice and bitwise equal.

Compilation (the earlier ``segment_xcompile.py`` compiled the forward kernels for sm_90 on a CPU from hand-written
signatures, which the thin call path's kernels no longer match) is measured on the GPU by the runner: ``compiles``
(Triton compilations per measurement) and ``first_call_s`` (the first call, compilation included).
"""
from __future__ import annotations

import torch

from benchmarks.adapters import Check, Evidence

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 2e-3}
BLOCKED_LONG = (1500, 2500)  # rows of the blocked problem's long segments (chunks of 512 rows and more on a GPU)


def small_problem(regime: str, dtype: torch.dtype, device: torch.device, seed: int):
    """x (N, 3) integer-valued (ties) with a NaN and infinities, and CSR offsets with empty segments. one_block: 12
    rows (no segment can be long); blocked: two segments of ``BLOCKED_LONG`` rows, long enough to span several
    chunks at the Triton sizes. The route each call takes (recorded, and checked against the route tested) says
    whether a problem is in its regime."""
    g = torch.Generator().manual_seed(seed)
    long, longer = BLOCKED_LONG
    lengths = [3, 0, 5, 4] if regime == "one_block" else [3, 0, longer, 0, 1, 17, 0, long, 39]
    N = sum(lengths)
    x = torch.randint(-3, 4, (N, 3), generator=g).double()
    if regime == "blocked":
        x[40, 1], x[41, 1], x[100, 2], x[200, 0] = float("nan"), float("nan"), float("inf"), float("-inf")
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return x.to(dtype).to(device), offsets.to(device)


def close(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float]:
    """(within tolerance, max error); NaN must match NaN, infinities must match exactly."""
    v, r = value.detach().double().cpu(), reference.double().cpu()
    same_nan = torch.equal(torch.isnan(v), torch.isnan(r))
    finite = torch.isfinite(r)
    same_inf = torch.equal(v[~finite & ~torch.isnan(r)], r[~finite & ~torch.isnan(r)])
    err = float((v[finite] - r[finite]).abs().max()) if finite.any() else 0.0
    scale = max(1.0, float(r[finite].abs().max())) if finite.any() else 1.0
    return same_nan and same_inf and err <= TOL[dtype] * scale, err


def routes(out: Evidence, device: torch.device, budget_s: float) -> None:
    """Every Triton route at four dtypes against the oracle, each index form and row regime the route admits;
    upstream gradients of both signs."""
    from provable_kernels.segment import TREE

    for route, path in TREE.paths():
        where = {c.name: o for c, o in path}
        if where["backend"] != "triton":
            continue
        reduce = where.get("reduce", where.get("extreme"))
        forms = (where["index"],) if "index" in where else ("offsets", "ids")
        regimes = (where["rows"],) if "rows" in where else ("one_block", "blocked")
        for dtype_name, dtype in DTYPES.items():
            for regime in regimes:
                for form in forms:
                    x, offsets = small_problem(regime, dtype, device, seed=len(out.rows))
                    S = offsets.numel() - 1
                    ids = torch.repeat_interleave(torch.arange(S, device=device), offsets.diff())
                    index = {"offsets": offsets} if form == "offsets" else {"ids": ids}
                    for sign in (1.0, -1.0):
                        out.record(*check_one(route.id, where, reduce, x, index, S, offsets.tolist(), sign,
                                              dtype_name, regime, form))


def check_one(route_id, where, reduce, x, index, S, bounds, sign, dtype_name, regime, form) -> tuple[bool, dict]:
    """(passed, evidence) of one route on one small problem."""
    from provable_kernels.dispatch import recording
    from provable_kernels.segment import oracle, segment_max_backward, segment_min_backward, segment_reduce

    dtype, device = x.dtype, x.device
    upstream = (sign * torch.rand(S, 3, generator=torch.Generator().manual_seed(7))).to(dtype).to(device)
    leaf = x.clone().requires_grad_(where.get("grad") == "train")
    with recording() as taken:
        if where["op"] == "reduce":
            value = segment_reduce(leaf, reduce, empty=-1.5, **index,
                                   **({"num_segments": S} if "ids" in index else {}))
        else:
            adjoint = segment_max_backward if reduce == "max" else segment_min_backward
            value = adjoint(upstream, x, **index)
    row = {"route": route_id, "dtype": dtype_name, "regime": regime, "form": form, "sign": sign,
           "taken": taken[0] if taken else None}
    if where["op"] == "reduce":
        ok, err = close(value, oracle.segment_reduce(x, reduce, bounds, -1.5), dtype)
        row.update(value_ok=ok, value_err=err)
        if where["grad"] == "train":
            value.backward(upstream)
            ok, err = close(leaf.grad, oracle.segment_grad(x, reduce, bounds, upstream), dtype)
            row.update(grad_ok=ok, grad_err=err)
    else:
        ok, err = close(value, oracle.segment_grad(x, reduce, bounds, upstream), dtype)
        row.update(grad_ok=ok, grad_err=err)
    return row["taken"] == route_id and row.get("value_ok", True) and row.get("grad_ok", True), row


def first_arg_reference(x64: torch.Tensor, offsets: torch.Tensor, reduce: str) -> torch.Tensor:
    """(S, D) first row holding the max / min of each segment (first NaN), from float64 data."""
    N, D = x64.shape
    S = offsets.numel() - 1
    seg = torch.repeat_interleave(torch.arange(S, device=x64.device), offsets.diff(), output_size=N)
    key = x64 if reduce == "max" else -x64
    top = torch.full((S, D), float("-inf"), dtype=torch.float64, device=x64.device)
    top = top.scatter_reduce(0, seg[:, None].expand(N, D), key, "amax")
    has_nan = torch.zeros((S, D), dtype=torch.float64, device=x64.device).scatter_reduce(
        0, seg[:, None].expand(N, D), key.isnan().double(), "amax") > 0
    match = torch.where(has_nan[seg], key.isnan(), key == top[seg])
    rows = torch.arange(N, device=x64.device)[:, None].expand(N, D)
    init = torch.full((S, D), N, dtype=torch.int64, device=x64.device)
    return init.scatter_reduce(0, seg[:, None].expand(N, D), torch.where(match, rows, N), "amin")


def large_guard(out: Evidence, name: str, x: torch.Tensor, offsets: torch.Tensor, device: torch.device) -> None:
    """Every reduction (Triton, offsets form) on a large problem: values against float64 torch, the max / min
    gradient against the first-occurrence reference (upstream -1), sum / mean gradients exactly; twice, bitwise."""
    from provable_kernels.segment import segment_reduce

    x64 = x.double()
    S = offsets.numel() - 1
    counts = offsets.diff()[:, None]
    for reduce in ("sum", "mean", "max", "min"):
        leaf = x.clone().requires_grad_()
        value = segment_reduce(leaf, reduce, offsets=offsets, empty=0.0)
        again = segment_reduce(x, reduce, offsets=offsets, empty=0.0)
        upstream = -torch.ones_like(value)
        (grad,) = torch.autograd.grad(value, leaf, upstream)
        (grad2,) = torch.autograd.grad(segment_reduce(leaf, reduce, offsets=offsets), leaf, upstream)
        if reduce in ("sum", "mean"):
            ref = torch.segment_reduce(x64, "sum", offsets=offsets, axis=0, unsafe=True)
            if reduce == "mean":
                ref = ref / counts.clamp(min=1)
            seg = torch.repeat_interleave(torch.arange(S, device=device), offsets.diff(), output_size=x.shape[0])
            if reduce == "mean":
                gref = (-1.0 / counts.clamp(min=1).double())[seg].expand_as(x64)
            else:
                gref = -torch.ones_like(x64)
        else:
            arg = first_arg_reference(x64, offsets, reduce)
            ref = x64.gather(0, arg.clamp(max=x.shape[0] - 1))
            gref = torch.zeros(x.shape[0] + 1, x.shape[1], dtype=torch.float64, device=device)
            gref = gref.scatter_(0, arg, -1.0)[:-1]
        ref = torch.where(counts > 0, ref, 0.0)
        ok_v, err_v = close(value, ref, x.dtype)
        ok_g, err_g = close(grad, gref, x.dtype)
        repeatable = torch.equal(value, again) and torch.equal(grad, grad2)
        out.record(ok_v and ok_g and repeatable, {"guard": name, "reduce": reduce, "value_ok": ok_v,
                                                  "value_err": err_v, "grad_ok": ok_g, "grad_err": err_g,
                                                  "bitwise_repeatable": repeatable})
        del leaf, value, again, grad, grad2, gref, ref


def large(out: Evidence, device: torch.device, budget_s: float) -> None:
    from benchmarks.adapters.segment import segment_lengths

    g = torch.Generator(device=device).manual_seed(0)
    N = 16 * 2**20
    x = torch.randn(N, 16, generator=g, device=device)
    large_guard(out, "S=1, N=16M, D=16", x, torch.tensor([0, N], device=device), device)
    del x
    N, D, S = 4 * 2**20, 64, 65536
    lengths = segment_lengths(N, S, "random", torch.Generator().manual_seed(1))
    lengths[::7] = 0  # empty segments; the rows go to the last one
    lengths[-1] += N - int(lengths.sum())
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    x = torch.randn(N, D, generator=g, device=device)
    large_guard(out, "empty segments, N=4M, D=64", x, offsets, device)
    x = torch.randint(-2, 3, (N, D), generator=g, device=device).float()
    large_guard(out, "ties (integers in -2..2), N=4M, D=64", x, offsets, device)


CHECKS = (
    Check("routes", routes, "every Triton route within TOL of the float64 oracle, four dtypes, NaN / inf / ties"),
    Check("large", large, "large problems against float64 references, every reduction bitwise repeatable"),
)


