"""GPU check of the Triton semi-CRF kernels: correctness against float64 PyTorch, precision at T = 100,000, timings.

Run on a CUDA machine from the repository root::

    python3 benchmarks/semicrf_gpu_check.py --out DIR [--budget SECONDS] [--only precision,timing]

1. compiles the kernel variants used below in parallel processes (filling Triton's cache);
2. correctness: the Triton routes (float32 inputs) against the PyTorch reference route run in float64 on the GPU
   (logZ relative error, gradients norm-wise relative error), 3-D transitions with projections and variable
   lengths, the max semiring, Viterbi paths (float64 inputs, identical to the reference), bitwise determinism;
3. precision at B=1, T=100,000, K=64, C=8 (zero-mean and biased scores, with projections);
4. timings (triton.testing.do_bench, median, L2 flushed between runs) at the anchor shapes of the semi-CRF targets:
   forward and forward+backward through the public API and through the backend alone, Viterbi, peak memory, per-step
   time; a warps sweep; and the sequential-step floor (a kernel doing only one ring load, one column reduction, one
   store and one barrier per step).

Prints a table last and writes everything to DIR/gpu_check.json. Numbers go to benchmarks/NOTES-semicrf.md.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from provable_kernels.semicrf import torch_ops, triton_ops  # noqa: E402
from provable_kernels.semicrf.dispatch import make_call, semi_crf_streaming_forward  # noqa: E402

ANCHORS = {  # B, T, K, C -> flash-semicrf fwd ms, fwd+bwd ms (H200, measured before this project)
    (4, 1024, 16, 12): (16.9, 131.0),
    (16, 4096, 32, 24): (159.0, 1887.0),
    (64, 1000, 100, 24): (130.0, 1430.0),
    (1, 100000, 64, 8): (4800.0, 37900.0),
    (32, 25, 5, 20): (0.71, 4.3),
}
PRECISION = (1, 100000, 64, 8)
SWEEP = {  # (forward warps, backward warps) tried besides the default of triton_ops.config
    (64, 1000, 100, 24): ((8, 16), (16, 16)), (1, 100000, 64, 8): ((4, 4), (8, 8)),
    (16, 4096, 32, 24): ((4, 8), (8, 16)), (4, 1024, 16, 12): ((4, 8), (2, 8)), (32, 25, 5, 20): ((4, 8),)}
START = time.time()


def inputs(B, T, K, C, *, dtype=torch.float32, trans3d=False, proj=False, variable=False, bias=0.0, seed=0,
           device="cuda"):
    """Random model (cum_scores from float64 prefix sums, rounded once to ``dtype``)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    cum = torch.cat([torch.zeros(B, 1, C, dtype=torch.float64), (r(B, T, C) + bias).cumsum(1)], 1)
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g) if variable else torch.full((B,), T)
    lengths[0] = T
    out = dict(cum_scores=cum, transition=0.5 * (r(K, C, C) if trans3d else r(C, C)), duration_bias=0.5 * r(K, C),
               lengths=lengths, K=K, proj_start=0.3 * r(B, T, C) if proj else None,
               proj_end=0.3 * r(B, T, C) if proj else None)
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) if torch.is_tensor(v) else v
            for k, v in out.items()}


FLOATS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")


def with_grad(kw, dtype=None):
    return {k: (v.detach().to(dtype or v.dtype).requires_grad_() if k in FLOATS and v is not None else v)
            for k, v in kw.items()}


def run_api(kw, use_triton=True, semiring="log"):
    return semi_crf_streaming_forward(kw["cum_scores"], kw["transition"], kw["duration_bias"], kw["lengths"],
                                      kw["K"], semiring, kw["proj_start"], kw["proj_end"], use_triton=use_triton)


def call_of(kw, semiring="log", op="partition"):
    return make_call(op, kw["cum_scores"], kw["transition"], kw["duration_bias"], kw["lengths"], kw["K"], semiring,
                     kw["proj_start"], kw["proj_end"], True)


def value_and_grads(kw, use_triton=True, dtype=None):
    kw = with_grad(kw, dtype)
    value = run_api(kw, use_triton)
    present = [k for k in FLOATS if kw[k] is not None]
    grads = torch.autograd.grad(value.sum(), [kw[k] for k in present])
    return value.detach(), dict(zip(present, grads))


def integers(*shape):
    return torch.randint(-1, 2, shape, device="cuda").double()


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def compare(kw, tag):
    """Triton (inputs as given) against the reference route in float64: logZ max relative error, gradient norm-wise
    relative errors."""
    v, g = value_and_grads(kw)
    rv, rg = value_and_grads(kw, use_triton=False, dtype=torch.float64)
    out = {"case": tag, "logZ_rel": float(((v.double() - rv) / rv.abs()).abs().max()),
           **{f"grad_{k}": rel(g[k], rg[k]) for k in g}}
    out["nan"] = bool(any(torch.isnan(x).any() for x in list(g.values()) + [v]))
    return out


# ------------------------------------------------------------------------------------------- compile in parallel


def _compile_one(spec):
    """Run every op once at a tiny length with the same compile-time constants as ``spec``."""
    (B, T, K, C), opts = spec
    kw = inputs(1, K, K, C, dtype=opts.get("dtype", torch.float32), trans3d=opts.get("trans3d", False),
                proj=opts.get("proj", False))
    if "warps" in opts:
        base = triton_ops.config
        triton_ops.config = lambda *a: (base(*a)[0], *opts["warps"])
    value_and_grads(kw)
    triton_ops.partition(call_of(kw, "max"))
    triton_ops.partition(call_of(kw, "log"))
    triton_ops.viterbi(call_of(kw, "max", "viterbi"))
    torch.cuda.synchronize()
    return spec[0]


def precompile(specs, workers=12):
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.map(_compile_one, specs)
    return time.time() - t0


# ------------------------------------------------------------------------------------------------------ timing


def bench(fn, quick_ms=None):
    """Median milliseconds (do_bench, L2 flushed); repetitions scaled to the call's duration."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = (time.perf_counter() - t0) * 1e3
    rep = min(max(20 * once, 30.0), 3000.0 if quick_ms is None else quick_ms)
    return float(triton.testing.do_bench(fn, warmup=min(once, 100.0), rep=rep, return_mode="median"))


def peak_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


@triton.jit(do_not_specialize=["T"])
def _floor_kernel(ring, out, T, KR, DB: tl.constexpr, CP: tl.constexpr):
    """Per step: load a (DB, CP) float64 ring tile, reduce over rows, store a row, barrier: the least a step of a
    ring recursion does."""
    d = 1 + tl.arange(0, DB)
    cols = tl.arange(0, CP)
    ring += tl.program_id(0).to(tl.int64) * KR * CP
    R = tl.zeros((), tl.float64)
    for t in range(1, T + 1):
        slot = (t - d + 2 * KR) % KR
        x = tl.load(ring + slot[:, None] * CP + cols[None, :], mask=(d <= t)[:, None], other=0.0)
        top = tl.max((x - R).to(tl.float32), 0)
        tl.store(ring + (t % KR) * CP + cols, top.to(tl.float64) + R)
        R += tl.max(top, 0).to(tl.float64) * 1e-9
        tl.debug_barrier()
    tl.store(out + tl.program_id(0), R)


def floor_ms(B, T, K, C):
    DB, warps, _ = triton_ops.config(K, C, False)
    CP = triton.next_power_of_2(C)
    ring = torch.zeros(B, K + 1, CP, dtype=torch.float64, device="cuda")
    out = torch.empty(B, dtype=torch.float64, device="cuda")
    fn = lambda: _floor_kernel[(B,)](ring, out, T, K + 1, DB=DB, CP=CP, num_warps=warps, num_stages=1)  # noqa: E731
    return bench(fn)


def time_shape(shape, warps=None):
    B, T, K, C = shape
    base = triton_ops.config
    if warps is not None:
        triton_ops.config = lambda *a: (base(*a)[0], *warps)
    try:
        kw = inputs(B, T, K, C)
        row = {"shape": list(shape), "warps": "%d/%d" % (warps or base(min(K, T), C, False)[1:])}
        call = call_of(kw)
        row["fwd_raw_ms"] = bench(lambda: triton_ops.partition(call))
        if warps is None:
            row["fwd_api_ms"] = bench(lambda: run_api(kw))
        kg = with_grad(kw)
        leaves = [kg[k] for k in ("cum_scores", "transition", "duration_bias")]

        def fwd_bwd():
            run_api(kg).sum().backward()
            for x in leaves:
                x.grad = None

        def fwd_bwd_raw():
            logz, saved = triton_ops.train_forward(call)
            triton_ops.backward(call, saved, torch.ones_like(logz))

        row["fwdbwd_raw_ms"] = bench(fwd_bwd_raw)
        if warps is None:
            row["fwdbwd_api_ms"] = bench(fwd_bwd)
            vcall = call_of(kw, "max", "viterbi")
            row["viterbi_raw_ms"] = bench(lambda: triton_ops.viterbi(vcall))
            row["fwd_peak_mb"] = peak_mb(lambda: run_api(kw))
            row["fwd_raw_peak_mb"] = peak_mb(lambda: triton_ops.partition(call))
            row["fwdbwd_peak_mb"] = peak_mb(fwd_bwd)
            row["floor_ms"] = floor_ms(B, T, min(K, T), C)
            flash = ANCHORS[shape]
            row["x_flash_fwd"] = flash[0] / row["fwd_api_ms"]
            row["x_flash_fwdbwd"] = flash[1] / row["fwdbwd_api_ms"]
        row["us_per_step_fwd"] = row["fwd_raw_ms"] * 1e3 / T
        return row
    finally:
        triton_ops.config = base


# --------------------------------------------------------------------------------------------------- sections


def correctness(report):
    rows = []
    for shape in [(4, 1024, 16, 12), (32, 25, 5, 20), (16, 4096, 32, 24), (64, 1000, 100, 24)]:
        rows.append(compare(inputs(*shape), f"{shape} 2d"))
    rows.append(compare(inputs(4, 300, 16, 12, trans3d=True, proj=True, variable=True), "(4,300,16,12) 3d proj var"))
    rows.append(compare(inputs(3, 200, 40, 5, trans3d=True, proj=True, variable=True), "(3,200,40,5) 3d multi-chunk"))
    rows.append(compare(inputs(4, 500, 7, 3, proj=True, variable=True), "(4,500,7,3) 2d proj var"))
    rows.append(compare(inputs(2, 300, 8, 4, dtype=torch.float64, trans3d=True, proj=True, variable=True),
                        "(2,300,8,4) float64 3d"))
    report["correctness"] = rows
    # max semiring and Viterbi (float64 inputs: no near-ties broken differently by rounding)
    checks = {}
    for tag, kw in [("2d", inputs(4, 1024, 16, 12, dtype=torch.float64, variable=True, proj=True)),
                    ("3d", inputs(4, 256, 16, 12, dtype=torch.float64, trans3d=True, variable=True)),
                    ("int-ties", {**inputs(3, 200, 6, 3, dtype=torch.float64, variable=True),
                                  "cum_scores": integers(3, 201, 3).cumsum(1) * (torch.arange(201, device="cuda")
                                                                                 > 0)[None, :, None],
                                  "transition": integers(3, 3), "duration_bias": integers(6, 3)})]:
        call = call_of(kw, "max", "viterbi")
        a, r = triton_ops.viterbi(call), torch_ops.viterbi(call)
        checks[f"viterbi_path_{tag}"] = bool(torch.equal(a.durations, r.durations) and torch.equal(a.labels, r.labels))
        checks[f"viterbi_score_{tag}_abs"] = float((a.scores - r.scores).abs().max())
        checks[f"max_{tag}_abs"] = float((triton_ops.partition(call_of(kw, "max")) - r.scores).abs().max())
    kw = inputs(16, 4096, 32, 24)
    _, g1 = value_and_grads(kw)
    _, g2 = value_and_grads(kw)
    checks["bitwise_deterministic"] = all(torch.equal(g1[k], g2[k]) for k in g1)
    report["checks"] = checks


def precision(report, budget_s):
    rows = []
    for tag, bias in [("zero-mean", 0.0), ("biased -2", -2.0)]:
        kw = inputs(*PRECISION, proj=True, bias=bias, seed=1)
        short = {**kw, "cum_scores": kw["cum_scores"][:, :2001], "proj_start": kw["proj_start"][:, :2000],
                 "proj_end": kw["proj_end"][:, :2000], "lengths": torch.full_like(kw["lengths"], 2000)}
        t0 = time.time()
        value_and_grads(short, use_triton=False, dtype=torch.float64)
        predicted = (time.time() - t0) * PRECISION[1] / 2000
        use_ref = predicted < min(budget_s - (time.time() - START) - 20, 120)
        v, g = value_and_grads(kw)
        rv, rg = value_and_grads(kw, use_triton=not use_ref, dtype=torch.float64)
        rows.append({"case": tag, "reference": "torch float64" if use_ref else "triton float64 (torch too slow: "
                     f"{predicted:.0f} s predicted)", "logZ": float(rv[0]),
                     "logZ_rel": float(((v.double() - rv) / rv.abs()).abs().max()),
                     **{f"grad_{k}": rel(g[k], rg[k]) for k in g}})
    report["precision_T100k"] = rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--budget", type=float, default=320.0, help="seconds for the whole run")
    parser.add_argument("--only", default="correctness,precision,timing,sweep", help="comma-separated sections")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(report, flush=True)
    specs = [(s, {}) for s in ANCHORS] + [((4, 300, 16, 12), {"trans3d": True, "proj": True}),
                                           ((3, 200, 40, 5), {"trans3d": True, "proj": True}),
                                           ((4, 500, 7, 3), {"proj": True}), (PRECISION, {"proj": True}),
                                           ((2, 300, 8, 4), {"trans3d": True, "proj": True, "dtype": torch.float64}),
                                           ((4, 1024, 16, 12), {"proj": True, "dtype": torch.float64}),
                                           ((4, 256, 16, 12), {"trans3d": True, "dtype": torch.float64}),
                                           ((3, 200, 6, 3), {"dtype": torch.float64}),
                                           (PRECISION, {"proj": True, "dtype": torch.float64})]
    specs += [(s, {"warps": w}) for s, ws in SWEEP.items() for w in ws]
    report["compile_s"] = precompile(specs)
    print(f"compiled {len(specs)} variant sets in {report['compile_s']:.0f} s", flush=True)

    sections = [("correctness", lambda: correctness(report)),
                ("precision", lambda: precision(report, args.budget)),
                ("timing", lambda: report.__setitem__("timing", [time_shape(s) for s in ANCHORS])),
                ("sweep", lambda: report.__setitem__("sweep", [time_shape(s, w) for s, ws in SWEEP.items()
                                                                for w in ws]))]
    for name, run in sections:
        if name not in args.only.split(","):
            continue
        if time.time() - START > args.budget:
            report[name] = "skipped: out of time"
            continue
        t0 = time.time()
        try:
            run()
        except Exception as exc:  # report and go on: the other sections still tell something
            report[name] = f"FAILED: {type(exc).__name__}: {exc}"
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)

    print(json.dumps({k: v for k, v in report.items() if k not in ("timing", "sweep")}, indent=1, default=str))
    for name in ("timing", "sweep"):
        rows = report.get(name)
        if not isinstance(rows, list):
            print(name, rows)
            continue
        keys = [k for k in rows[0] if k != "shape"]
        print(f"\n{name}\n{'shape':22s}" + "".join(f"{k:>15s}" for k in keys))
        for row in rows:
            cells = "".join(f"{row.get(k, float('nan')):>15.4g}" if isinstance(row.get(k), (int, float))
                            else f"{str(row.get(k)):>15s}" for k in keys)
            print(f"{str(tuple(row['shape'])):22s}{cells}")
    print(f"total {time.time() - START:.0f} s")
    return 0 if math.isfinite(report.get("compile_s", 0)) else 1


if __name__ == "__main__":
    sys.exit(main())
