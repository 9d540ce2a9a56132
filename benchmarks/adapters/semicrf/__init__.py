"""Semi-CRF adapter: ``semi_crf_streaming_forward`` (Triton and PyTorch routes) against flash-semicrf and
torch-struct (benchmarks/README.md, "Semi-CRF", documents the model, the peers' conventions and the mappings).

Grid axes B, T, K, C and the semiring (Log: partition function, Max: best score); fp32 inputs, lengths = T.
Scores ~ N(0, 1) zero-centred over T per label (flash-semicrf needs this at long T), cumsum in float64 then cast to
fp32; transition, duration_bias ~ N(0, 0.5^2); fixed seed.
Peers get their inputs mapped to compute this project's model exactly (the mapping is untimed; their gradients
are pulled back through it for the accuracy columns). In the Max semiring, flash-semicrf's free previous label
is cancelled with ``max`` instead of ``logsumexp``, and torch-struct's first segment keeps its score (the max
over a free initial label of equal values is that value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from benchmarks.adapters import Adapter, Axis, Impl, Prepared, Target, importable
from benchmarks.adapters.semicrf.checks import CHECKS

REFERENCE_MAX_STEPS = 4096  # the float64 reference (a loop over T on the PyTorch route) runs up to this T
WARMUP_T = 128  # warm-up calls run the problem cut to this many positions


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    K: int
    C: int


# the anchor shapes and the speed ratio over flash-semicrf each must reach (the family's targets)
ANCHOR_TARGETS = {Shape(4, 1024, 16, 12): 10.0, Shape(16, 4096, 32, 24): 10.0, Shape(64, 1000, 100, 24): 20.0,
                  Shape(1, 100000, 64, 8): 10.0, Shape(32, 25, 5, 20): 5.0}
ANCHORS = tuple({"B": s.B, "T": s.T, "K": s.K, "C": s.C, "semiring": "Log"} for s in ANCHOR_TARGETS)
TARGETS = tuple(Target(f">= {ratio:g}x flash-semicrf at {s.B},{s.T},{s.K},{s.C}", anchor, ("forward", "both"),
                       "speedup:flash-semicrf", ratio) for (s, ratio), anchor in zip(ANCHOR_TARGETS.items(), ANCHORS))


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


def semiring_name(value: str) -> str:
    names = {"log": "Log", "max": "Max"}
    if value.lower() not in names:
        raise ValueError(f"semiring must be Log or Max, got {value!r}")
    return names[value.lower()]


def shape_of(config: dict) -> Shape:
    return Shape(config["B"], config["T"], config["K"], config["C"])


def build(config: dict, device: torch.device, seed: int) -> Problem:
    return make_problem(shape_of(config), device, seed)


def shrink(problem: Problem, config: dict) -> tuple[Problem, float]:
    small = problem.truncated(WARMUP_T)
    return small, problem.shape.T / small.shape.T


def ours(use_triton: bool):
    def prepare(problem: Problem, config: dict) -> Prepared:
        from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward

        semiring, lengths, K = config["semiring"].lower(), problem.lengths, problem.shape.K

        def call(cum, transition, duration_bias):
            return semi_crf_streaming_forward(cum, transition, duration_bias, lengths, K, semiring=semiring,
                                              use_triton=use_triton)
        return Prepared(call, problem.params, (0, 1, 2))
    return prepare


def pullback_through(to_inputs, problem: Problem):
    """Gradients of a peer's inputs -> gradients of (cum_scores, transition, duration_bias) through ``to_inputs``."""
    def pullback(grads: tuple) -> tuple:
        params = tuple(p.detach().clone().requires_grad_() for p in problem.params)
        mapped = to_inputs(*params)
        pulled = torch.autograd.grad(mapped, params, grad_outputs=grads, allow_unused=True)
        return tuple(torch.zeros_like(p) if g is None else g for g, p in zip(pulled, params))
    return pullback


def prepare_flash(problem: Problem, config: dict) -> Prepared:
    from flash_semicrf.streaming import semi_crf_streaming_forward as flash_forward

    semiring, lengths, K = config["semiring"].lower(), problem.lengths, problem.shape.K
    first_pays = torch.logsumexp if semiring == "log" else (lambda t, dim: t.amax(dim=dim))

    def to_inputs(cum, transition, duration_bias):
        return torch.cat([cum[:, :1] + first_pays(transition, dim=0), cum[:, 1:]], dim=1), transition, duration_bias

    def call(cum, transition, duration_bias):
        return flash_forward(cum, transition, duration_bias, lengths, K, semiring=semiring)

    with torch.no_grad():
        args = to_inputs(*problem.params)
    return Prepared(call, args, (0, 1, 2), pullback_through(to_inputs, problem))


def prepare_struct(problem: Problem, config: dict) -> Prepared:
    from torch_struct import LogSemiring, MaxSemiring, SemiMarkov

    is_log = config["semiring"] == "Log"
    lengths, K, C = problem.lengths, problem.shape.K, problem.shape.C
    model = SemiMarkov(LogSemiring if is_log else MaxSemiring)

    def to_inputs(cum, transition, duration_bias):
        edge = struct_edges(cum, transition, duration_bias, K)
        if not is_log:  # the first segment keeps its score: undo the - log C of the free initial label
            edge = torch.cat([edge[:, :1] + math.log(C), edge[:, 1:]], dim=1)
        return (edge,)

    def call(edge):
        return model.logpartition(edge, lengths=lengths + 1)[0].reshape(-1)

    with torch.no_grad():
        args = to_inputs(*problem.params)
    return Prepared(call, args, (0,), pullback_through(to_inputs, problem))


def reference(problem: Problem, config: dict) -> Optional[Prepared]:
    """This project's PyTorch route on float64 inputs (up to T = REFERENCE_MAX_STEPS: it loops over T)."""
    if config["T"] > REFERENCE_MAX_STEPS:
        return None
    return ours(False)(problem.float64(), config)


def floor(config: dict, phase: str) -> tuple[float, int]:
    """(bytes, sequential steps) of the hardware floor: the fp32 inputs and int64 lengths read, plus the fp32
    gradients written when a backward runs; T dependent steps per recursion (forward T, backward T, both 2T)."""
    B, T, K, C = config["B"], config["T"], config["K"], config["C"]
    params = 4.0 * (B * (T + 1) * C + C * C + K * C)
    nbytes = params + 8.0 * B + 4.0 * B
    return {"forward": (nbytes, T), "backward": (nbytes + params, T), "both": (nbytes + params, 2 * T)}[phase]


def derived(config: dict) -> dict:
    B, T, K, C = config["B"], config["T"], config["K"], config["C"]
    return {"KC": K * C, "positions": B * T, "state_positions": B * T * K * C}


ADAPTER = Adapter(
    name="semicrf",
    title="Semi-CRF partition",
    axes=(
        Axis("B", (4,), int, "batch size"),
        Axis("T", (128, 256, 512, 1024), int, "sequence length (lengths = T)"),
        Axis("K", (4, 8, 12, 16), int, "maximum segment duration"),
        Axis("C", (3, 6, 9, 12), int, "number of labels"),
        Axis("semiring", ("Log",), semiring_name, "Log (partition function) or Max (best score)"),
    ),
    anchors=ANCHORS,
    variant_axis="semiring",
    impls=(
        Impl("triton", ours(True), ours=True),
        Impl("torch", ours(False), ours=True),
        Impl("flash-semicrf", prepare_flash, unavailable=importable("flash_semicrf"), peer_of="flash-semicrf",
             no_gradient=lambda c: "flash-semicrf's Max semiring has no gradient" if c["semiring"] == "Max" else None),
        Impl("torch-struct", prepare_struct, unavailable=importable("torch_struct"),
             memory_bytes=lambda c: struct_memory_bytes(shape_of(c)), peer_of="torch-struct"),
    ),
    default_impls=("triton", "flash-semicrf", "torch-struct"),
    build=build,
    shrink=shrink,
    reference=reference,
    floor=floor,
    derived=derived,
    derived_columns=("KC", "positions", "state_positions"),
    size_column="positions",
    size_unit="positions (B*T)",
    plot_axes=("T", "KC"),
    memory_column="state_positions",
    order=lambda c: (c["semiring"], c["T"] * c["K"], c["B"] * c["C"]),
    packages=("flash-semicrf", "torch-struct"),
    # launch-bound (the kernel under a trivial op's time), the 25-step chain of the table, the headline
    overhead_shapes=({"B": 32, "T": 4, "K": 4, "C": 8, "semiring": "Log"},
                     {"B": 32, "T": 25, "K": 5, "C": 20, "semiring": "Log"},
                     {"B": 4, "T": 1024, "K": 16, "C": 12, "semiring": "Log"}),
    peer="flash-semicrf",
    notes=("fp32 inputs, lengths = T, 2-D transition; peers' inputs mapped to this project's model (untimed)",
           "memory per state-position = peak / (B*T*K*C)",
           "ours (triton) runs its backward recursion inside the forward of a training call (one kernel) and its "
           "backward only scales the saved gradients: compare the 'both' rows, not 'backward'"),
    checks=CHECKS,
    targets=TARGETS,
)
