"""Semi-CRF partition benchmark: this project (Triton route) side by side with flash-semicrf and torch-struct.

    python benchmarks/semicrf.py [--shapes all|quick|tiny] [--device cuda] [--out DIR] [--peers flash,struct]

At the anchor shapes of the semi-CRF targets (B, T, K, C), fp32 inputs, lengths = T, log semiring, for the forward
pass and forward+backward (gradients of logZ.sum() for cum_scores, transition, duration_bias): median time, peak
memory, the speed ratio peer/ours, accuracy against a float64 run of this project's PyTorch reference (logZ
relative error, norm-wise relative error of each gradient) where that run fits the wall-clock budget, and the
fraction of the hardware floor reached (benchmarks/common.py measures the floors in the same run).

Every implementation computes the same model, this project's convention (kernels/semicrf docstrings); each peer
gets inputs mapped to it (differentiably, so its gradients are compared in our parameters):

- flash-semicrf 0.2.0 (``flash_semicrf.streaming.semi_crf_streaming_forward``) has the same cum_scores layout,
  ``transition[src, dst]`` and durations 1..K with ``duration_bias[d-1]``, but its first segment pays
  logsumexp over a free previous label of ``transition[c', c]``; ours pays none. Mapping: ``cum_scores[:, 0, c]
  = logsumexp_c' transition[c', c]`` (row 0 is read only by segments starting at 0). 2-D transitions only.
- torch-struct 0.5 (``torch_struct.SemiMarkov``, exact, pre-built edges): edge (B, T, K+1, C, C) indexed
  ``[b, s, d, c, c_prev]`` (index d = duration, 0 unused), lengths L+1 (boundary points), and a free initial
  label; the first segment's edges carry ``- log C`` in every c_prev row so the sum over the initial label is
  exact. Its memory grows like B * T * (K*C)^3, so it runs only where the estimate fits.

Timed calls get pre-mapped inputs (the mapping is not timed); the first timed call is also the accuracy sample
(gradients pulled back to our parameters through the mapping), so slow peers are called no more than needed.
Warm-up calls run the problem cut to T = 128, the mapping inside autograd included. The run stays inside
``--budget-s`` of wall-clock time: shapes run cheapest first, timing before accuracy, slow calls get fewer
repetitions, and what does not fit is reported as skipped. Exit code 1 when this project's route failed on any
shape (error or OOM), else 0; peers' failures are reported in the results, not in the exit code.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

from benchmarks.common import (  # noqa: E402 - the repository root must be importable first
    Deadline,
    Floors,
    Timer,
    bar_chart,
    environment,
    failure_status,
    fits_in_memory,
    measure_floors,
    normwise_rel_error,
    print_table,
    rel_error,
    release_memory,
    write_csv,
    write_json,
)
from provable_kernels.dispatch import recording  # noqa: E402
from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward  # noqa: E402

GRAD_NAMES = ("cum_scores", "transition", "duration_bias")
PASSES = ("fwd", "fwd+bwd")


# ------------------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    K: int
    C: int
    target: Optional[float] = None  # ANCHORS.md: required speed ratio flash-semicrf / ours

    @property
    def label(self) -> str:
        return f"{self.B},{self.T},{self.K},{self.C}"


ANCHOR_SHAPES = (
    Shape(4, 1024, 16, 12, 10.0),
    Shape(16, 4096, 32, 24, 10.0),
    Shape(64, 1000, 100, 24, 20.0),
    Shape(1, 100000, 64, 8, 10.0),
    Shape(32, 25, 5, 20, 5.0),
)
SHAPE_SETS = {
    "all": ANCHOR_SHAPES,
    "quick": (ANCHOR_SHAPES[0], ANCHOR_SHAPES[4]),
    "tiny": (Shape(2, 12, 4, 3), Shape(4, 6, 3, 2)),
}


@dataclass(frozen=True)
class Problem:
    """fp32 model parameters in this project's convention; lengths = T."""

    shape: Shape
    cum_scores: torch.Tensor  # (B, T+1, C), row 0 = 0
    transition: torch.Tensor  # (C, C), [src, dst]
    duration_bias: torch.Tensor  # (K, C), row d-1 = duration d
    lengths: torch.Tensor  # (B,) int64

    @property
    def params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cum_scores, self.transition, self.duration_bias

    def float64(self) -> "Problem":
        """The same values in float64 (gradients then come back in float64 too)."""
        return Problem(self.shape, *(p.double() for p in self.params), self.lengths)

    def truncated(self, T: int) -> "Problem":
        """The same problem on positions [0, min(T, shape.T)) (for warm-up and cost estimates)."""
        s = self.shape
        T = min(T, s.T)
        return Problem(Shape(s.B, T, s.K, s.C), self.cum_scores[:, : T + 1].contiguous(), self.transition,
                       self.duration_bias, torch.full_like(self.lengths, T))


def make_problem(shape: Shape, device: torch.device, seed: int) -> Problem:
    """Random scores (zero-centred over T per label, as flash-semicrf requires at long T), cumsum in float64
    then cast to fp32; transition and duration_bias ~ N(0, 0.5^2)."""
    g = torch.Generator().manual_seed(seed)
    B, T, K, C = shape.B, shape.T, shape.K, shape.C
    scores = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    scores -= scores.mean(dim=1, keepdim=True)
    cum = torch.cat([torch.zeros(B, 1, C, dtype=torch.float64), scores.cumsum(dim=1)], dim=1)
    transition = 0.5 * torch.randn(C, C, generator=g)
    duration_bias = 0.5 * torch.randn(K, C, generator=g)
    return Problem(shape, cum.float().to(device), transition.to(device), duration_bias.to(device),
                   torch.full((B,), T, dtype=torch.int64, device=device))


# ------------------------------------------------------------------------------------------ implementations


def flash_cum_scores(cum_scores: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """flash-semicrf input for our model: row 0 += logsumexp_c' transition[c', c] cancels the transition its
    first segment pays from a free previous label (differentiable; 2-D transitions only)."""
    if transition.dim() != 2:
        raise ValueError(f"transition must be 2-D (C, C) for the flash-semicrf mapping, got {tuple(transition.shape)}")
    first = cum_scores[:, :1] + torch.logsumexp(transition, dim=0)
    return torch.cat([first, cum_scores[:, 1:]], dim=1)


def struct_edges(cum_scores: torch.Tensor, transition: torch.Tensor, duration_bias: torch.Tensor,
                 K: int) -> torch.Tensor:
    """torch-struct SemiMarkov edge (B, T, K+1, C, C) for our model, ``edge[b, s, d, c, c_prev]`` = score of
    segment [s, s+d) labelled c after c_prev; d = 0 and s + d > T are impossible (-1e5, finite so its
    gradients stay finite); at s = 0 every c_prev row holds the segment score - log C (free initial label)."""
    B, T1, C = cum_scores.shape
    T = T1 - 1
    edge = cum_scores.new_full((B, T, K + 1, C, C), -1e5)
    for d in range(1, min(K, T) + 1):
        seg = cum_scores[:, d:] - cum_scores[:, :-d] + duration_bias[d - 1]  # (B, T+1-d, C), starts 0..T-d
        first = (seg[:, :1, :, None] - math.log(C)).expand(B, 1, C, C)
        rest = seg[:, 1:, :, None] + transition.T
        edge[:, : T + 1 - d, d] = torch.cat([first, rest], dim=1)
    return edge


def struct_memory_bytes(shape: Shape) -> float:
    """torch-struct's parallel scan holds about B * 2^ceil(log2 T) * (K*C)^3 fp32 values (4.1 GB at 32,25,5,20)."""
    return shape.B * 2 ** math.ceil(math.log2(max(shape.T, 2))) * (shape.K * shape.C) ** 3 * 4.0


def ours_call(cum, transition, duration_bias, lengths, K):
    """This project's public entry point; on CUDA it dispatches to the Triton routes."""
    return semi_crf_streaming_forward(cum, transition, duration_bias, lengths, K, use_triton=True)


def flash_call(cum, transition, duration_bias, lengths, K):
    """flash-semicrf's streaming API on its own inputs (``flash_cum_scores`` maps ours)."""
    from flash_semicrf.streaming import semi_crf_streaming_forward as flash_forward

    return flash_forward(cum, transition, duration_bias, lengths, K)


def struct_call(edge, lengths, K):
    """torch-struct's exact SemiMarkov log partition on a ``struct_edges`` tensor; lengths count boundary points."""
    from torch_struct import LogSemiring, SemiMarkov

    value, _ = SemiMarkov(LogSemiring).logpartition(edge, lengths=lengths + 1)
    return value.reshape(-1)


@dataclass(frozen=True)
class Impl:
    """``to_inputs(cum, transition, duration_bias, K)`` maps our parameters to the implementation's inputs
    (differentiably); ``call(*inputs, lengths, K)`` returns logZ (B,)."""

    name: str
    to_inputs: Callable[..., tuple[torch.Tensor, ...]]
    call: Callable[..., torch.Tensor]
    memory_bytes: Optional[Callable[[Shape], float]] = None

    def model(self, cum, transition, duration_bias, lengths, K) -> torch.Tensor:
        """logZ of our model computed by this implementation."""
        return self.call(*self.to_inputs(cum, transition, duration_bias, K), lengths, K)


OURS = Impl("ours", lambda c, t, d, K: (c, t, d), ours_call)
PEERS = {
    "flash": Impl("flash-semicrf", lambda c, t, d, K: (flash_cum_scores(c, t), t, d), flash_call),
    "struct": Impl("torch-struct", lambda c, t, d, K: (struct_edges(c, t, d, K),), struct_call,
                   struct_memory_bytes),
}


def reference_model(cum, transition, duration_bias, lengths, K) -> torch.Tensor:
    """This project's PyTorch reference route (run on float64 inputs: ``Problem.float64``)."""
    return semi_crf_streaming_forward(cum, transition, duration_bias, lengths, K, use_triton=False)


# ---------------------------------------------------------------------------------------------- measuring


TIMING_SHARE = 0.85  # of the wall-clock budget for phase 1 (timing); the rest is kept for accuracy
WARMUP_T = 128  # warm-up calls run the problem cut to this many positions
REFERENCE_PROBE_T = 16  # the float64 reference's cost is estimated on this many positions


@dataclass
class Sample:
    """An implementation's logZ (B,) and gradients in our parameters (cum_scores, transition, duration_bias),
    float64 on the CPU, for the accuracy phase; ``routes`` the dispatch routes recorded."""

    logz: torch.Tensor
    grads: Optional[tuple[torch.Tensor, ...]]
    routes: list[str]


def run_forward(fn: Callable[..., torch.Tensor], problem: Problem) -> Sample:
    """``fn(cum, transition, duration_bias, lengths, K)`` without autograd."""
    with torch.no_grad(), recording() as taken:
        z = fn(*problem.params, problem.lengths, problem.shape.K)
    return Sample(z.double().cpu(), None, sorted(set(taken)))


def run_forward_backward(fn: Callable[..., torch.Tensor], problem: Problem) -> Sample:
    """``fn(cum, transition, duration_bias, lengths, K)`` and the gradients of its sum."""
    leaves = tuple(p.detach().clone().requires_grad_() for p in problem.params)
    with recording() as taken:
        z = fn(*leaves, problem.lengths, problem.shape.K)
        grads = torch.autograd.grad(z.sum(), leaves)
    return Sample(z.detach().double().cpu(), tuple(g.double().cpu() for g in grads), sorted(set(taken)))


def grads_in_our_parameters(impl: Impl, problem: Problem, input_grads: tuple[torch.Tensor, ...]) -> tuple:
    """Pull gradients with respect to ``impl``'s inputs back through its mapping (vector-Jacobian product)."""
    params = tuple(p.detach().clone().requires_grad_() for p in problem.params)
    mapped = impl.to_inputs(*params, problem.shape.K)
    grads = torch.autograd.grad(mapped, params, grad_outputs=input_grads, allow_unused=True)
    return tuple((torch.zeros_like(p) if g is None else g).double().cpu() for g, p in zip(grads, params))


def floor_inputs(shape: Shape, pass_name: str) -> tuple[float, int]:
    """(bytes, sequential steps) of the hardware floor: read the fp32 inputs (+ write their gradients), T steps
    forward (+ T backward)."""
    B, T, K, C = shape.B, shape.T, shape.K, shape.C
    params = 4.0 * (B * (T + 1) * C + C * C + K * C)
    nbytes = params + 8.0 * B + 4.0 * B
    if pass_name == "fwd":
        return nbytes, T
    return nbytes + params, 2 * T


def bench_impl(impl: Impl, problem: Problem, timer: Timer, deadline: Deadline, args) -> list[tuple[dict, Optional[Sample]]]:
    """Both passes of one implementation at one shape: (row, accuracy sample from the first timed call)."""
    shape = problem.shape
    K, lengths = shape.K, problem.lengths
    small = problem.truncated(WARMUP_T)
    blocked = None  # the status of both passes when they cannot run at all
    too_big = impl.memory_bytes and fits_in_memory(impl.memory_bytes(shape), timer.device)
    if too_big:
        blocked = f"skipped: {too_big}"
    else:
        try:
            with torch.no_grad():
                inputs = tuple(x.detach() for x in impl.to_inputs(*problem.params, K))
        except Exception as exc:  # noqa: BLE001 - reported
            blocked = failure_status(exc)
    out = []
    for pass_name in PASSES:
        row = {"shape": shape.label, "B": shape.B, "T": shape.T, "K": shape.K, "C": shape.C, "impl": impl.name,
               "pass": pass_name}
        if blocked:
            out.append(({**row, "status": blocked}, None))
            continue
        if pass_name == "fwd":
            def warmup():
                return run_forward(impl.model, small)

            def timed():
                with torch.no_grad():
                    return impl.call(*inputs, lengths, K)
        else:
            leaves = tuple(x.detach().requires_grad_() for x in inputs)

            def warmup():
                return run_forward_backward(impl.model, small)

            def timed():
                z = impl.call(*leaves, lengths, K)
                return z.detach(), torch.autograd.grad(z.sum(), leaves)
        m = timer.measure(warmup, timed, deadline, scale=shape.T / small.shape.T, target_s=args.target_s,
                          min_reps=args.min_reps)
        sample = None
        try:
            if m.status == "ok" and pass_name == "fwd":
                sample = Sample(m.result.double().cpu(), None, m.warmup_result.routes)
            elif m.status == "ok":
                grads = grads_in_our_parameters(impl, problem, m.result[1])
                sample = Sample(m.result[0].double().cpu(), grads, m.warmup_result.routes)
        except Exception as exc:  # noqa: BLE001 - reported
            m.status = failure_status(exc)
        m.result = None
        nbytes, steps = floor_inputs(shape, pass_name)
        floor_s, floor_kind = args.floors.floor(nbytes, steps)
        row.update(
            status=m.status,
            time_ms=None if m.median_s is None else m.median_s * 1e3,
            reps=m.reps,
            first_call_s=m.first_call_s,
            peak_mb=None if m.peak_bytes is None else m.peak_bytes / 2**20,
            route=",".join(sample.routes) if sample and sample.routes else None,
            floor_ms=floor_s * 1e3,
            floor_kind=floor_kind,
            floor_fraction=None if m.median_s is None else floor_s / m.median_s,
            target=shape.target if impl.name == PEERS["flash"].name else None,
            notes="; ".join(m.notes) or None,
        )
        out.append((row, sample))
        release_memory(timer.device)
    return out


def add_ratios(rows: list[dict]) -> None:
    """``ratio`` = this implementation's time / ours at the same shape and pass (> 1: ours is faster)."""
    ours = {(r["shape"], r["pass"]): r.get("time_ms") for r in rows if r["impl"] == OURS.name}
    for r in rows:
        mine, base = r.get("time_ms"), ours.get((r["shape"], r["pass"]))
        r["ratio"] = mine / base if mine and base else None


def reference_sample(problem: Problem, timer: Timer, deadline: Deadline) -> tuple[Optional[Sample], str]:
    """The float64 reference (forward+backward) if its estimated time fits the budget, else why not.

    The estimate times the same problem cut to T0 = min(T, REFERENCE_PROBE_T) and scales linearly in T (the
    recursion is a loop over positions; the probe's one-time costs make the estimate err on the long side)."""
    if deadline.remaining() <= 0:
        return None, "skipped: wall-clock budget spent"
    T = problem.shape.T
    T0 = min(T, REFERENCE_PROBE_T)
    problem = problem.float64()
    try:
        seconds, small = timer.wall(lambda: run_forward_backward(reference_model, problem.truncated(T0)))
        if T0 == T:
            return small, "ok"
        estimate = seconds * T / T0
        if estimate > deadline.remaining():
            return None, (f"skipped: float64 reference would take ~{estimate:.0f} s, "
                          f"{max(deadline.remaining(), 0):.0f} s of the budget left")
        return timer.wall(lambda: run_forward_backward(reference_model, problem))[1], "ok"
    except Exception as exc:  # noqa: BLE001 - reported
        release_memory(timer.device)
        return None, failure_status(exc)


def score_accuracy(entries: list[tuple[dict, Optional[Sample]]], reference: Optional[Sample], ref_status: str) -> None:
    """Fill logz_rel_err / grad_rel_err (worst of the three gradients, named in grad_worst) for each row."""
    for row, sample in entries:
        row["ref_status"] = ref_status
        if reference is None or sample is None:
            continue
        row["logz_rel_err"] = rel_error(sample.logz, reference.logz)
        if sample.grads is not None:
            errors = {name: normwise_rel_error(g, r) for name, g, r in zip(GRAD_NAMES, sample.grads, reference.grads)}
            row["grad_worst"] = max(errors, key=errors.get)
            row["grad_rel_err"] = errors[row["grad_worst"]]
            row.update({f"grad_rel_err_{name}": e for name, e in errors.items()})


# ------------------------------------------------------------------------------------------------ reporting

COLUMNS = ("shape", "B", "T", "K", "C", "impl", "pass", "status", "time_ms", "reps", "first_call_s", "peak_mb",
           "ratio", "target", "floor_ms", "floor_kind", "floor_fraction", "logz_rel_err", "grad_rel_err",
           "grad_worst", "grad_rel_err_cum_scores", "grad_rel_err_transition", "grad_rel_err_duration_bias",
           "ref_status", "route", "notes")
TABLE = (("shape", "B,T,K,C", ""), ("pass", "pass", ""), ("impl", "impl", ""), ("status", "status", ""),
         ("time_ms", "median ms", ".4g"), ("reps", "reps", ""), ("peak_mb", "peak MB", ".3g"),
         ("ratio", "time / ours", ".3g"), ("target", "target", ".3g"), ("floor_fraction", "floor frac", ".3g"),
         ("floor_kind", "floor", ""), ("logz_rel_err", "logZ rel err", ".2e"),
         ("grad_rel_err", "grad rel err", ".2e"), ("route", "route", ""))

RATIO_TABLE = (("shape", "B,T,K,C", ""), ("pass", "pass", ""), ("peer", "peer", ""), ("ratio", "peer / ours", ".3g"),
               ("target", "target", ".3g"), ("meets_target", "meets target", ""))


def report(out_dir: Path, rows: list[dict], meta: dict, final: bool) -> None:
    """Write semicrf.csv and semicrf.json (and, when ``final``, print tables and draw semicrf_ratios.png)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    order = {s: i for i, s in enumerate(meta["settings"]["shapes"])}
    rows = sorted(rows, key=lambda r: (order[r["shape"]], PASSES.index(r["pass"]), r["impl"] != OURS.name))
    ratios = [{"shape": r["shape"], "pass": r["pass"], "peer": r["impl"], "ratio": r.get("ratio"),
               "target": r.get("target"),
               "meets_target": None if r.get("ratio") is None or r.get("target") is None else r["ratio"] >= r["target"]}
              for r in rows if r["impl"] != OURS.name]
    payload = {**meta, "rows": [{k: r.get(k) for k in COLUMNS} for r in rows], "ratios": ratios}
    if final:
        peers = sorted({r["impl"] for r in rows if r["impl"] != OURS.name})
        groups = [f"{s}\n{p}" for s in meta["settings"]["shapes"] for p in PASSES]
        series = {peer: [next((r.get("ratio") for r in rows if r["impl"] == peer and f"{r['shape']}\n{r['pass']}" == g),
                              None) for g in groups] for peer in peers}
        flash = PEERS["flash"].name
        targets = {flash: [next((r.get("target") for r in rows if r["impl"] == flash
                                 and f"{r['shape']}\n{r['pass']}" == g), None) for g in groups]}
        chart_note = bar_chart(out_dir / "semicrf_ratios.png", "semi-CRF: peer time / our time (higher: ours faster)",
                               groups, series, "time / ours", targets) if peers else "no chart: no peers"
        payload["chart"] = chart_note or "semicrf_ratios.png"
    write_csv(out_dir / "semicrf.csv", payload["rows"], COLUMNS)
    write_json(out_dir / "semicrf.json", payload)
    if final:
        print(f"device: {meta['device']['name']}; floors: {meta['floors']['description']}")
        print_table("semi-CRF partition (log), fp32, lengths = T", rows, TABLE)
        print_table("speed ratios: peer time / our time (> 1: ours faster)", ratios, RATIO_TABLE)
        for label in meta["settings"]["shapes"]:
            ref_status = next((r.get("ref_status") for r in rows if r["shape"] == label), None)
            if ref_status != "ok":
                print(f"float64 reference [{label}]: {ref_status}")
        for r in rows:
            for key in ("status", "notes"):
                if r.get(key) and r[key] != "ok":
                    print(f"{key} [{r['shape']} {r['impl']} {r['pass']}]: {r[key]}")
        print(f"wrote {out_dir}/semicrf.csv, semicrf.json; chart: {payload['chart']}; "
              f"elapsed {meta['elapsed_s']:.0f} s of {meta['settings']['budget_s']:.0f} s budget")


# --------------------------------------------------------------------------------------------------- driver


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="all",
                        help="all: the five ANCHORS shapes; quick: two of them; tiny: CPU smoke sizes")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (PyTorch route; for testing)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--peers", default="flash,struct",
                        help=f"comma-separated subset of {sorted(PEERS)}, or 'none'")
    parser.add_argument("--budget-s", type=float, default=360.0, help="wall-clock budget of the whole run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-reps", type=int, default=3, help="timed calls per measurement, at least")
    parser.add_argument("--target-s", type=float, default=1.0, help="timed seconds per measurement, aimed at")
    args = parser.parse_args(argv)
    try:
        args.device = torch.device(args.device)
    except RuntimeError as exc:
        parser.error(f"--device: {exc}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here (use --device cpu)")
    names = [] if args.peers.strip() in ("", "none") else [p.strip() for p in args.peers.split(",")]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {unknown}, expected a subset of {sorted(PEERS)} or 'none'")
    args.peer_impls = [PEERS[n] for n in dict.fromkeys(names)]
    if args.budget_s <= 0 or args.min_reps < 1 or args.target_s <= 0:
        parser.error("--budget-s and --target-s must be > 0, --min-reps >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    deadline = Deadline(args.budget_s)
    timer = Timer(args.device)
    floors: Floors = measure_floors(timer)
    args.floors = floors
    shapes = SHAPE_SETS[args.shapes]
    meta = {
        "benchmark": "semicrf",
        **environment(args.device, ("flash-semicrf", "torch-struct")),
        "settings": {"shapes": [s.label for s in shapes], "peers": [p.name for p in args.peer_impls],
                     "dtype": "float32", "semiring": "log", "lengths": "T", "seed": args.seed,
                     "budget_s": args.budget_s, "min_reps": args.min_reps, "target_s": args.target_s,
                     "timing": "median of CUDA-event timed calls after warm-up, L2 flushed before each call"
                               if args.device.type == "cuda" else "median of perf_counter timed calls (cpu)"},
        "floors": {"copy_bytes_per_s": floors.copy_bytes_per_s, "copy_method": floors.copy_method,
                   "step_s": floors.step_s, "step_method": floors.step_method, "description": floors.describe()},
    }
    print(f"floors: {floors.describe()}", flush=True)

    # Phase 1: timing, cheapest shapes first (T*K sequential work), within TIMING_SHARE of the budget.
    timing_deadline = deadline.share(TIMING_SHARE)
    entries: dict[str, list[tuple[dict, Optional[Sample]]]] = {}
    problems: dict[str, Problem] = {}
    for shape in sorted(shapes, key=lambda s: s.T * s.K):
        problem = make_problem(shape, args.device, args.seed)
        problems[shape.label] = problem
        entries[shape.label] = []
        for impl in [OURS, *args.peer_impls]:
            print(f"[{deadline.elapsed():6.1f} s] {shape.label} {impl.name}", flush=True)
            entries[shape.label] += bench_impl(impl, problem, timer, timing_deadline, args)
        rows = [row for es in entries.values() for row, _ in es]
        add_ratios(rows)
        report(args.out, rows, {**meta, "elapsed_s": deadline.elapsed()}, final=False)

    # Phase 2: accuracy against the float64 reference, cheapest first, while the budget lasts.
    for shape in sorted(shapes, key=lambda s: s.T * s.K):
        print(f"[{deadline.elapsed():6.1f} s] {shape.label} float64 reference", flush=True)
        reference, ref_status = reference_sample(problems[shape.label], timer, deadline)
        score_accuracy(entries[shape.label], reference, ref_status)
        release_memory(args.device)

    rows = [row for es in entries.values() for row, _ in es]
    add_ratios(rows)
    report(args.out, rows, {**meta, "elapsed_s": deadline.elapsed()}, final=True)
    ours_failed = any(r["impl"] == OURS.name and (r["status"] == "oom" or r["status"].startswith("error"))
                      for r in rows)
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
