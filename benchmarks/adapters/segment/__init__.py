"""Segment-reduction adapter: ``provable_kernels.segment.segment_reduce`` (offsets and ids forms) against
``torch.segment_reduce`` (offsets and lengths forms) and ``torch.Tensor.scatter_reduce`` (sum, mean, amax, amin,
include_self=False).

Grid axes N (rows), D (columns), S (segments), the segment-length distribution and the reduction, and the dtype.
Lengths: ``random`` = 1 + a uniform multinomial split of the N - S remaining rows over the S segments; ``powerlaw``
= the same split with Pareto(1.2) weights (a few very long segments, many short). No segment is empty (peers
differ from this project on empty segments). x ~ N(0, 1) drawn on the device, fixed seed. Index tensors are int64
and prepared untimed (scatter_reduce gets ids expanded to (N, D) as a view).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from benchmarks.adapters import Adapter, Axis, Impl, Prepared, Target, dtype_of, importable
from benchmarks.adapters.segment.checks import CHECKS

ANCHOR_SHAPES = ((4194304, 64, 65536, "random"), (1048576, 256, 1024, "random"),
                 (16777216, 16, 1048576, "random"), (16777216, 16, 1, "random"), (4194304, 64, 65536, "powerlaw"))
ANCHORS = tuple({"N": N, "D": D, "S": S, "dist": dist, "reduce": r, "dtype": "float32"}
                for N, D, S, dist in ANCHOR_SHAPES for r in ("sum", "max"))
REDUCES = ("sum", "mean", "max", "min")
TARGETS = tuple(Target(f"forward >= {share:.0%} of the copy floor at N,D,S = {N},{D},{S}",
                       {"N": N, "D": D, "S": S, "dist": "random", "dtype": "float32"}, ("forward",), "floor_fraction",
                       share)
                for N, D, S, share in ((4194304, 64, 65536, 0.8), (1048576, 256, 1024, 0.8),
                                       (16777216, 16, 1048576, 0.8), (16777216, 16, 1, 0.6)))
SCATTER = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}
REFERENCE_MAX_ELEMENTS = 2**28
PARETO_ALPHA = 1.2


@dataclass(frozen=True)
class Problem:
    x: torch.Tensor  # (N, D)
    lengths: torch.Tensor  # (S,) int64, all >= 1
    offsets: torch.Tensor  # (S+1,) int64
    ids: torch.Tensor  # (N,) int64, sorted

    @property
    def num_segments(self) -> int:
        return self.lengths.numel()


def choice(name: str, allowed: tuple):
    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        return value
    return parse


def segment_lengths(N: int, S: int, dist: str, g: torch.Generator) -> torch.Tensor:
    """S lengths >= 1 summing to N (see the module docstring)."""
    if not 1 <= S <= N:
        raise ValueError(f"S must be in [1, N], got S={S}, N={N}")
    extra = N - S
    if dist == "random":
        bins = torch.randint(0, S, (extra,), generator=g)
    else:
        weights = torch.rand(S, generator=g, dtype=torch.float64).clamp_min(1e-12) ** (-1.0 / PARETO_ALPHA)
        cdf = weights.cumsum(0) / weights.sum()
        bins = torch.searchsorted(cdf, torch.rand(extra, generator=g, dtype=torch.float64)).clamp_max(S - 1)
    return 1 + torch.bincount(bins, minlength=S)


def build(config: dict, device: torch.device, seed: int) -> Problem:
    N, D, S = config["N"], config["D"], config["S"]
    lengths = segment_lengths(N, S, config["dist"], torch.Generator().manual_seed(seed)).to(device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    ids = torch.repeat_interleave(torch.arange(S, device=device), lengths, output_size=N)
    x = torch.randn(N, D, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    return Problem(x.to(dtype_of(config["dtype"])), lengths, offsets, ids)


def prepare_ours(index_form: str):
    def prepare(p: Problem, config: dict) -> Prepared:
        from provable_kernels.segment import segment_reduce

        reduce = config["reduce"]
        if index_form == "offsets":
            return Prepared(lambda x: segment_reduce(x, reduce, offsets=p.offsets), (p.x,), (0,))
        S = p.num_segments
        return Prepared(lambda x: segment_reduce(x, reduce, ids=p.ids, num_segments=S), (p.x,), (0,))
    return prepare


def prepare_torch(index_form: str):
    def prepare(p: Problem, config: dict) -> Prepared:
        reduce = config["reduce"]
        index = {"offsets": p.offsets} if index_form == "offsets" else {"lengths": p.lengths}
        return Prepared(lambda x: torch.segment_reduce(x, reduce, axis=0, unsafe=True, **index), (p.x,), (0,))
    return prepare


def prepare_scatter(p: Problem, config: dict) -> Prepared:
    reduce, S = SCATTER[config["reduce"]], p.num_segments
    index = p.ids[:, None].expand(p.x.shape)

    def call(x):
        return x.new_zeros(S, x.shape[1]).scatter_reduce(0, index, x, reduce=reduce, include_self=False)
    return Prepared(call, (p.x,), (0,))


def reference(p: Problem, config: dict) -> Optional[Prepared]:
    """float64 scatter_reduce (its max/min gradient splits ties; the random data has none)."""
    if p.x.numel() > REFERENCE_MAX_ELEMENTS:
        return None
    q = Problem(p.x.double(), p.lengths, p.offsets, p.ids)
    return prepare_scatter(q, config)


def floor(config: dict, phase: str) -> tuple[float, int]:
    """Forward: x read, output written, offsets read (+ an int32 argmax written when max/min keep it for
    backward, i.e. in ``both``); backward: upstream gradient (+ argmax) read, grad_x written."""
    N, D, S = config["N"], config["D"], config["S"]
    e = dtype_of(config["dtype"]).itemsize
    argmax = 4.0 * S * D if config["reduce"] in ("max", "min") else 0.0
    forward = float(N * D * e + S * D * e + 8 * (S + 1))
    backward = float(S * D * e + argmax + N * D * e + 8 * (S + 1))
    return {"forward": forward, "backward": backward, "both": forward + argmax + backward}[phase], 0


ours_missing = importable("provable_kernels.segment")
ADAPTER = Adapter(
    name="segment",
    title="Segment reductions",
    axes=(
        Axis("N", (1048576, 4194304, 16777216), int, "rows"),
        Axis("D", (16, 64, 256), int, "columns"),
        Axis("S", (1024, 65536), int, "segments"),
        Axis("dist", ("random", "powerlaw"), choice("dist", ("random", "powerlaw")), "segment-length distribution"),
        Axis("reduce", ("sum", "max"), choice("reduce", REDUCES), "sum, mean, max or min"),
        Axis("dtype", ("float32",), str, "float32, bfloat16 or float16"),
    ),
    anchors=ANCHORS,
    variant_axis="reduce",
    impls=(
        Impl("ours", prepare_ours("offsets"), ours=True, unavailable=ours_missing),
        Impl("ours-ids", prepare_ours("ids"), ours=True, unavailable=ours_missing),
        Impl("torch-offsets", prepare_torch("offsets")),
        Impl("torch-lengths", prepare_torch("lengths")),
        Impl("scatter-reduce", prepare_scatter),
    ),
    default_impls=("ours", "torch-offsets", "torch-lengths", "scatter-reduce"),
    build=build,
    reference=reference,
    floor=floor,
    derived=lambda c: {"avg_length": c["N"] / c["S"], "elements": c["N"] * c["D"]},
    derived_columns=("avg_length", "elements"),
    size_column="elements",
    size_unit="elements (N*D)",
    plot_axes=("N", "D", "avg_length"),
    # cheapest first; one-segment configurations last (torch.segment_reduce takes seconds there)
    order=lambda c: (c["dtype"], c["S"] == 1, c["N"] * c["D"], c["D"], c["S"], c["dist"], c["reduce"]),
    overhead_shapes=({"N": 100000, "D": 16, "S": 1000, "dist": "random", "reduce": "sum", "dtype": "float32"},
                     {"N": 4194304, "D": 64, "S": 65536, "dist": "random", "reduce": "sum", "dtype": "float32"}),
    peer="torch-offsets",
    notes=("no empty segments; int64 indices prepared untimed",
           "floor bytes: x read + output written (+ int32 argmax for max/min with backward); backward: upstream "
           "(+ argmax) read, grad_x written"),
    checks=CHECKS,
    targets=TARGETS,
)
