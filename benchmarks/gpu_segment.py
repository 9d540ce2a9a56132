"""GPU check and benchmark of the segment reductions (run by the lead on an H100 / H200).

    python benchmarks/gpu_segment.py --out DIR [--budget-s 300]

1. Correctness of every Triton route of ``provable_kernels.segment.TREE`` against the float64 oracle
   (``provable_kernels.segment.oracle``, per-segment Python loops) at float32, float64, bfloat16 and float16, with
   empty segments, ties (integer data, upstream gradients of both signs) and NaN / inf rows; the route taken is
   checked with ``recording()``.
2. Large guards against float64 references computed here (torch in float64; the first-occurrence arg by an
   ``amin`` over matching rows): one segment of 16M rows (S = 1), empty segments at 4M rows, ties at 4M x 64.
3. Bitwise determinism: every large output and gradient computed twice.
4. Timings (CUDA events, median, L2 flushed; ``benchmarks.common.Timer``): ours (offsets and ids forms) against
   ``torch.segment_reduce`` (offsets and lengths forms) and ``torch.Tensor.scatter_reduce`` (sum, amax) at the
   issue's shapes, float32 first, then bfloat16; sum, mean, max, min; forward, backward alone, forward+backward.
   Floors from the measured copy bandwidth: forward bytes = x read + output written; backward = upstream read
   (+ int32 arg read for max / min) + grad_x written; forward+backward = both (+ the arg written).

Writes ``DIR/segment_gpu.json`` (everything), ``DIR/segment_timings.csv`` and ``DIR/segment_floor_fraction.png``.
Stops starting new timings when ``--budget-s`` is spent (checks run first and always).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.adapters.segment import segment_lengths  # noqa: E402
from benchmarks.common import (Deadline, Timer, bar_chart, environment, measure_floors, write_csv,  # noqa: E402
                               write_json)
from provable_kernels.dispatch import recording  # noqa: E402
from provable_kernels.segment import (TREE, oracle, segment_max_backward, segment_min_backward,  # noqa: E402
                                      segment_reduce)
from provable_kernels.segment.triton_ops import chunk_rows  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 2e-3}
SHAPES = (("4M,64,65536", 4 * 2**20, 64, 65536, "random"), ("1M,256,1024", 2**20, 256, 1024, "random"),
          ("16M,16,1M", 16 * 2**20, 16, 2**20, "random"), ("16M,16,1", 16 * 2**20, 16, 1, "random"),
          ("4M,64,65536 powerlaw", 4 * 2**20, 64, 65536, "powerlaw"))
TARGETS = {("4M,64,65536", "fwd"): 0.8, ("1M,256,1024", "fwd"): 0.8, ("16M,16,1M", "fwd"): 0.8,
           ("16M,16,1", "fwd"): 0.6}


def small_problem(regime: str, dtype: torch.dtype, device, seed: int):
    """x (N, 3) integer-valued (ties) with a NaN and infinities, and CSR offsets with empty segments. one_block:
    N <= the plan's chunk rows; blocked: segments spanning several chunks."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 0, 5, 4] if regime == "one_block" else [3, 0, 150, 0, 1, 17, 0, 90, 39]
    N = sum(lengths)
    x = torch.randint(-3, 4, (N, 3), generator=g).double()
    if regime == "blocked":
        x[40, 1], x[41, 1], x[100, 2], x[200, 0] = float("nan"), float("nan"), float("inf"), float("-inf")
    offsets = torch.tensor([0] + lengths).cumsum(0)
    assert N <= chunk_rows(N, 3) if regime == "one_block" else N > 4 * chunk_rows(N, 3)
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


def check_routes(device) -> list[dict]:
    """Every Triton route at four dtypes against the oracle, each index form and row regime the route admits;
    upstream gradients of both signs."""
    rows = []
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
                    x, offsets = small_problem(regime, dtype, device, seed=len(rows))
                    S = offsets.numel() - 1
                    ids = torch.repeat_interleave(torch.arange(S, device=device), offsets.diff())
                    index = {"offsets": offsets} if form == "offsets" else {"ids": ids}
                    for sign in (1.0, -1.0):
                        rows.append(check_one(route.id, where, reduce, x, index, S, offsets.tolist(), sign,
                                              dtype_name, regime, form))
    return rows


def check_one(route_id, where, reduce, x, index, S, bounds, sign, dtype_name, regime, form) -> dict:
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
    row["pass"] = row["taken"] == route_id and row.get("value_ok", True) and row.get("grad_ok", True)
    return row


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


def large_guard(name: str, x: torch.Tensor, offsets: torch.Tensor, device) -> list[dict]:
    """Every reduction (Triton, offsets form) on a large problem: values against float64 torch, the max / min
    gradient against the first-occurrence reference (upstream -1 and +1), sum / mean gradients exactly; twice,
    bitwise."""
    rows = []
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
        rows.append({"guard": name, "reduce": reduce, "value_ok": ok_v, "value_err": err_v, "grad_ok": ok_g,
                     "grad_err": err_g, "bitwise_repeatable": torch.equal(value, again) and torch.equal(grad, grad2),
                     "pass": ok_v and ok_g and torch.equal(value, again) and torch.equal(grad, grad2)})
        del leaf, value, again, grad, grad2, gref, ref
    return rows


def check_large(device) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    N = 16 * 2**20
    x = torch.randn(N, 16, generator=g, device=device)
    rows += large_guard("S=1, N=16M, D=16", x, torch.tensor([0, N], device=device), device)
    del x
    N, D, S = 4 * 2**20, 64, 65536
    lengths = segment_lengths(N, S, "random", torch.Generator().manual_seed(1))
    lengths[::7] = 0  # empty segments; the rows go to the last one
    lengths[-1] += N - int(lengths.sum())
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    x = torch.randn(N, D, generator=g, device=device)
    rows += large_guard("empty segments, N=4M, D=64", x, offsets, device)
    x = torch.randint(-2, 3, (N, D), generator=g, device=device).float()
    rows += large_guard("ties (integers in -2..2), N=4M, D=64", x, offsets, device)
    return rows


# --------------------------------------------------------------------------------------------------- timing


def implementations(reduce: str, x: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, ids: torch.Tensor):
    S = lengths.numel()
    out = {
        "ours offsets": lambda t: segment_reduce(t, reduce, offsets=offsets),
        "ours ids": lambda t: segment_reduce(t, reduce, ids=ids, num_segments=S),
        "torch.segment_reduce offsets": lambda t: torch.segment_reduce(t, reduce, offsets=offsets, axis=0,
                                                                       unsafe=True),
        "torch.segment_reduce lengths": lambda t: torch.segment_reduce(t, reduce, lengths=lengths, axis=0,
                                                                       unsafe=True),
    }
    if reduce in ("sum", "max"):
        scatter = {"sum": "sum", "max": "amax"}[reduce]
        index = ids[:, None].expand(x.shape)
        out[f"scatter_reduce {scatter}"] = lambda t: t.new_zeros(S, t.shape[1]).scatter_reduce(
            0, index, t, reduce=scatter, include_self=False)
    return out


def floor_bytes(N: int, D: int, S: int, dtype: torch.dtype, reduce: str, phase: str) -> float:
    e = torch.empty((), dtype=dtype).element_size()
    arg = 4.0 * S * D if reduce in ("max", "min") else 0.0
    forward = N * D * e + S * D * e
    backward = S * D * e + arg + N * D * e
    return {"fwd": forward, "bwd": backward, "fwd+bwd": forward + arg + backward}[phase]


def time_all(device, timer: Timer, floors, deadline: Deadline) -> list[dict]:
    rows = []
    for dtype_name in ("float32", "bfloat16"):
        dtype = DTYPES[dtype_name]
        for label, N, D, S, dist in SHAPES:
            if deadline.remaining() <= 0:
                return rows
            lengths = segment_lengths(N, S, dist, torch.Generator().manual_seed(0)).to(device)
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
            ids = torch.repeat_interleave(torch.arange(S, device=device), lengths, output_size=N)
            x = torch.randn(N, D, generator=torch.Generator(device=device).manual_seed(0), device=device).to(dtype)
            for reduce in (("sum", "max", "mean", "min") if dtype_name == "float32" else ("sum", "max")):
                for impl, fn in implementations(reduce, x, offsets, lengths, ids).items():
                    leaf = x.detach().requires_grad_()
                    upstream = torch.ones(S, D, device=device, dtype=dtype)

                    def setup(fn=fn, leaf=leaf):
                        return fn(leaf)

                    def backward(out, leaf=leaf, upstream=upstream):
                        return torch.autograd.grad(out, leaf, upstream)

                    phases = {
                        "fwd": (lambda fn=fn: fn(x), None),
                        "bwd": (backward, setup),
                        "fwd+bwd": (lambda fn=fn, leaf=leaf, upstream=upstream:
                                    torch.autograd.grad(fn(leaf), leaf, upstream), None),
                    }
                    for phase, (timed, state) in phases.items():
                        if deadline.remaining() <= 0:
                            return rows
                        m = timer.measure(lambda fn=fn: fn(x), timed, deadline, setup=state, target_s=0.3,
                                          max_reps=50)
                        nbytes = floor_bytes(N, D, S, dtype, reduce, phase)
                        floor_s = floors.bandwidth_floor(nbytes)
                        rows.append({"dtype": dtype_name, "shape": label, "N": N, "D": D, "S": S, "dist": dist,
                                     "reduce": reduce, "impl": impl, "phase": phase, "status": m.status,
                                     "median_ms": None if m.median_s is None else m.median_s * 1e3,
                                     "reps": m.reps, "peak_mb": None if m.peak_bytes is None else m.peak_bytes / 2**20,
                                     "floor_ms": floor_s * 1e3,
                                     "floor_fraction": None if m.median_s is None else floor_s / m.median_s,
                                     "target": TARGETS.get((label, phase)) if impl.startswith("ours")
                                     and dtype_name == "float32" else None})
                        print(f"{dtype_name} {label} {reduce} {impl} {phase}: {m.status} "
                              f"{rows[-1]['median_ms']} ms, floor {floor_s * 1e3:.3f} ms", flush=True)
                    del leaf
            del x, ids
            torch.cuda.empty_cache()
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """ours / peer speed ratios per (dtype, shape, reduce, phase)."""
    out = []
    key = lambda r: (r["dtype"], r["shape"], r["reduce"], r["phase"])  # noqa: E731
    groups: dict = {}
    for r in rows:
        if r["median_ms"] is not None:
            groups.setdefault(key(r), {})[r["impl"]] = r["median_ms"]
    for k, times in groups.items():
        ours = times.get("ours offsets")
        for impl, t in times.items():
            if ours and not impl.startswith("ours"):
                out.append(dict(zip(("dtype", "shape", "reduce", "phase"), k), peer=impl, speedup=t / ours))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_segment.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(args.budget_s)
    started = time.time()
    routes = check_routes(device)
    failed = [r for r in routes if not r["pass"]]
    print(f"routes: {len(routes) - len(failed)}/{len(routes)} checks pass", flush=True)
    for r in failed:
        print("  FAIL", r, flush=True)
    large = check_large(device)
    for r in large:
        print(("  ok  " if r["pass"] else "  FAIL"), r, flush=True)
    timer = Timer(device)
    floors = measure_floors(timer)
    print(f"copy bandwidth {floors.copy_bytes_per_s / 1e12:.3f} TB/s", flush=True)
    timings = time_all(device, timer, floors, deadline)
    payload = {"environment": environment(device), "copy_bytes_per_s": floors.copy_bytes_per_s,
               "route_checks": routes, "large_checks": large, "timings": timings, "ratios": ratios(timings),
               "wall_s": time.time() - started}
    write_json(args.out / "segment_gpu.json", payload)
    write_csv(args.out / "segment_timings.csv", timings,
              ("dtype", "shape", "N", "D", "S", "dist", "reduce", "impl", "phase", "status", "median_ms", "reps",
               "peak_mb", "floor_ms", "floor_fraction", "target"))
    ours = [r for r in timings if r["impl"] == "ours offsets" and r["dtype"] == "float32" and r["reduce"] in
            ("sum", "max")]
    groups = sorted({f"{r['shape']} {r['reduce']}" for r in ours})
    series = {phase: [next((r["floor_fraction"] for r in ours if f"{r['shape']} {r['reduce']}" == g
                            and r["phase"] == phase), None) for g in groups] for phase in ("fwd", "bwd", "fwd+bwd")}
    bar_chart(args.out / "segment_floor_fraction.png", "Segment reductions (float32): fraction of the copy floor",
              groups, series, "floor time / measured time")
    ok = not failed and all(r["pass"] for r in large)
    print("checks pass" if ok else "CHECKS FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
