"""Semi-CRF adapter: ``semi_crf_streaming_forward`` (Triton and PyTorch routes) against flash-semicrf and
torch-struct, on the inputs, input mappings and floors of ``benchmarks/semicrf.py`` (which documents them).

Grid axes B, T, K, C and the semiring (Log: partition function, Max: best score); fp32 inputs, lengths = T.
Peers get their inputs mapped to compute this project's model exactly (the mapping is untimed; their gradients
are pulled back through it for the accuracy columns). In the Max semiring, flash-semicrf's free previous label
is cancelled with ``max`` instead of ``logsumexp``, and torch-struct's first segment keeps its score (the max
over a free initial label of equal values is that value).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from benchmarks import semicrf as bench
from benchmarks.adapters import Adapter, Axis, Impl, Prepared, importable

ANCHORS = tuple({"B": s.B, "T": s.T, "K": s.K, "C": s.C, "semiring": "Log"} for s in bench.ANCHOR_SHAPES)
REFERENCE_MAX_STEPS = 4096  # the float64 reference (a loop over T on the PyTorch route) runs up to this T
WARMUP_T = bench.WARMUP_T


def semiring_name(value: str) -> str:
    names = {"log": "Log", "max": "Max"}
    if value.lower() not in names:
        raise ValueError(f"semiring must be Log or Max, got {value!r}")
    return names[value.lower()]


def shape_of(config: dict) -> bench.Shape:
    return bench.Shape(config["B"], config["T"], config["K"], config["C"])


def build(config: dict, device: torch.device, seed: int) -> bench.Problem:
    return bench.make_problem(shape_of(config), device, seed)


def shrink(problem: bench.Problem, config: dict) -> tuple[bench.Problem, float]:
    small = problem.truncated(WARMUP_T)
    return small, problem.shape.T / small.shape.T


def ours(use_triton: bool):
    def prepare(problem: bench.Problem, config: dict) -> Prepared:
        from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward

        semiring, lengths, K = config["semiring"].lower(), problem.lengths, problem.shape.K

        def call(cum, transition, duration_bias):
            return semi_crf_streaming_forward(cum, transition, duration_bias, lengths, K, semiring=semiring,
                                              use_triton=use_triton)
        return Prepared(call, problem.params, (0, 1, 2))
    return prepare


def pullback_through(to_inputs, problem: bench.Problem):
    """Gradients of a peer's inputs -> gradients of (cum_scores, transition, duration_bias) through ``to_inputs``."""
    def pullback(grads: tuple) -> tuple:
        params = tuple(p.detach().clone().requires_grad_() for p in problem.params)
        mapped = to_inputs(*params)
        pulled = torch.autograd.grad(mapped, params, grad_outputs=grads, allow_unused=True)
        return tuple(torch.zeros_like(p) if g is None else g for g, p in zip(pulled, params))
    return pullback


def prepare_flash(problem: bench.Problem, config: dict) -> Prepared:
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


def prepare_struct(problem: bench.Problem, config: dict) -> Prepared:
    from torch_struct import LogSemiring, MaxSemiring, SemiMarkov

    is_log = config["semiring"] == "Log"
    lengths, K, C = problem.lengths, problem.shape.K, problem.shape.C
    model = SemiMarkov(LogSemiring if is_log else MaxSemiring)

    def to_inputs(cum, transition, duration_bias):
        edge = bench.struct_edges(cum, transition, duration_bias, K)
        if not is_log:  # the first segment keeps its score: undo the - log C of the free initial label
            edge = torch.cat([edge[:, :1] + math.log(C), edge[:, 1:]], dim=1)
        return (edge,)

    def call(edge):
        return model.logpartition(edge, lengths=lengths + 1)[0].reshape(-1)

    with torch.no_grad():
        args = to_inputs(*problem.params)
    return Prepared(call, args, (0,), pullback_through(to_inputs, problem))


def reference(problem: bench.Problem, config: dict) -> Optional[Prepared]:
    """This project's PyTorch route on float64 inputs (up to T = REFERENCE_MAX_STEPS: it loops over T)."""
    if config["T"] > REFERENCE_MAX_STEPS:
        return None
    return ours(False)(problem.float64(), config)


def floor(config: dict, phase: str) -> tuple[float, int]:
    """Forward: fp32 inputs read, T dependent steps; backward: inputs read and gradients written, T steps; both:
    the sum (``benchmarks/semicrf.py``'s floor_inputs)."""
    shape = shape_of(config)
    if phase == "forward":
        return bench.floor_inputs(shape, "fwd")
    nbytes, steps = bench.floor_inputs(shape, "fwd+bwd")
    return (nbytes, steps) if phase == "both" else (nbytes, steps // 2)


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
             memory_bytes=lambda c: bench.struct_memory_bytes(shape_of(c)), peer_of="torch-struct"),
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
    overhead_shapes=({"B": 32, "T": 25, "K": 5, "C": 20, "semiring": "Log"},
                     {"B": 4, "T": 1024, "K": 16, "C": 12, "semiring": "Log"}),
    peer="flash-semicrf",
    notes=("fp32 inputs, lengths = T, 2-D transition; peers' inputs mapped to this project's model (untimed)",
           "memory per state-position = peak / (B*T*K*C)",
           "ours (triton) runs its backward recursion inside the forward of a training call (one kernel) and its "
           "backward only scales the saved gradients: compare the 'both' rows, not 'backward'"),
)
