"""Semi-CRF dispatch: the conditions, the route bodies, the decision tree (data) and the public entry points.

Arguments and their conventions: :mod:`provable_kernels.semicrf.call` (and the site page "Semi-CRF
conventions"). Both backends (:mod:`~provable_kernels.semicrf.torch_ops`, :mod:`~provable_kernels.semicrf.triton_ops`)
share the autograd glue of :mod:`~provable_kernels.semicrf.autograd`.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from provable_kernels.dispatch import Branch, Condition, Route, Tree
from provable_kernels import validate
from provable_kernels.semicrf import autograd
from provable_kernels.runtime import Entry
from provable_kernels.semicrf.call import OPS, SEMIRINGS, StreamingCall, bind, check, triton_runs
from provable_kernels.semicrf.structures import ViterbiResult, to_result


# ----------------------------------------------------------------------------------------------- conditions


def ask_op(call: StreamingCall) -> str:
    """Which entry point: ``partition`` (semi_crf_streaming_forward) or ``viterbi`` (semi_crf_viterbi)."""
    return call.op


def ask_backend(call: StreamingCall) -> str:
    """``triton`` when the caller allows it (use_triton=True), Triton can run on the tensors' device (CUDA, or
    CPU under TRITON_INTERPRET=1) and there are at most ``TRITON_MAX_LABELS`` (64) labels; otherwise ``torch``."""
    return "triton" if triton_runs(call.use_triton, call.cum_scores.device, call.C) else "torch"


def ask_semiring(call: StreamingCall) -> str:
    """The semiring requested: ``log`` (partition function) or ``max`` (best score)."""
    return call.semiring


def ask_grad(call: StreamingCall) -> str:
    """``train`` when autograd is on and any input requires a gradient, else ``infer``."""
    needs = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in call.tensors)
    return "train" if needs else "infer"


OP = Condition("op", ask_op, OPS)
BACKEND = Condition("backend", ask_backend, ("triton", "torch"))
SEMIRING = Condition("semiring", ask_semiring, SEMIRINGS)
GRAD = Condition("grad", ask_grad, ("infer", "train"))


# ------------------------------------------------------------------------------------------------ route bodies


def torch_partition_infer(call: StreamingCall) -> torch.Tensor:
    """PyTorch ring-buffer recursion, no autograd graph (log or max semiring)."""
    return autograd.partition("torch", call)


def torch_log_train(call: StreamingCall) -> torch.Tensor:
    """PyTorch forward with checkpoints; hand-written backward recomputes from them (log semiring)."""
    return autograd.log_partition("torch", call)


def torch_max_train(call: StreamingCall) -> torch.Tensor:
    """PyTorch Viterbi forward; the gradient is the indicator of the decoded best path (max semiring)."""
    return autograd.max_partition("torch", call)


def torch_viterbi(call: StreamingCall):
    """PyTorch max recursion with backpointers, then backtracking."""
    return autograd.viterbi("torch", call)


def triton_partition_infer(call: StreamingCall) -> torch.Tensor:
    """Triton streaming forward kernel, no autograd graph (log or max semiring)."""
    return autograd.partition("triton", call)


def triton_log_train(call: StreamingCall) -> torch.Tensor:
    """Triton forward keeping alpha, then the hand-written backward kernel for grad_logZ = 1 at once; the
    autograd backward scales those gradients (one launch; log semiring)."""
    return autograd.log_partition("triton", call)


def triton_max_train(call: StreamingCall) -> torch.Tensor:
    """Triton Viterbi kernel; the gradient is the indicator of the decoded best path (max semiring)."""
    return autograd.max_partition("triton", call)


def triton_viterbi(call: StreamingCall):
    """Triton max recursion writing backpointers, then a Triton backtracking kernel."""
    return autograd.viterbi("triton", call)


def _partition_subtree(backend: str, infer, log_train, max_train, prepare_infer=None, prepare_train=None) -> Branch:
    return Branch(
        SEMIRING,
        {
            "log": Branch(GRAD, {"infer": Route(f"semicrf.{backend}.log.infer", infer, prepare_infer),
                                 "train": Route(f"semicrf.{backend}.log.train", log_train, prepare_train)}),
            "max": Branch(GRAD, {"infer": Route(f"semicrf.{backend}.max.infer", infer, prepare_infer),
                                 "train": Route(f"semicrf.{backend}.max.train", max_train)}),
        },
    )


TREE = Tree(
    "semicrf",
    Branch(
        OP,
        {
            "partition": Branch(
                BACKEND,
                {
                    "triton": _partition_subtree("triton", triton_partition_infer, triton_log_train, triton_max_train,
                                                 autograd.prepare_partition, autograd.prepare_log_partition),
                    "torch": _partition_subtree("torch", torch_partition_infer, torch_log_train, torch_max_train),
                },
            ),
            "viterbi": Branch(
                BACKEND,
                {
                    "triton": Route("semicrf.triton.viterbi", triton_viterbi),
                    "torch": Route("semicrf.torch.viterbi", torch_viterbi),
                },
            ),
        },
    ),
)


# ---------------------------------------------------------------------------------------------- entry points


def _entry(op: str, finish) -> Entry:
    return Entry(TREE, functools.partial(check, op), functools.partial(bind, op), finish)


PARTITION = _entry("partition", lambda call, out: validate.poison(call.ok, out))
VITERBI = _entry("viterbi", lambda call, path: to_result(call, path._replace(
    scores=validate.poison(call.ok, path.scores))))


def semi_crf_streaming_forward(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    semiring: str = "log",
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
) -> torch.Tensor:
    """Semi-CRF partition (``semiring="log"``: logZ) or best score (``"max"``) per sequence.

    Arguments (conventions in :mod:`provable_kernels.semicrf.call`):

    - ``cum_scores`` (B, T+1, C), ``transition`` (C, C) or (K, C, C), ``duration_bias`` (K, C), ``proj_start`` /
      ``proj_end`` (B, T, C) or None: float16, bfloat16, float32 or float64, each its own (mixed dtypes allowed,
      e.g. from ``torch.autocast``), all on one device; computed in float64 when any is float64, else float32.
    - ``lengths`` (B,) int32 or int64 in 1..T; ``K`` int >= 1 (durations 1..K); ``semiring`` ``"log"`` or
      ``"max"``; ``use_triton`` bool (False: the PyTorch recursion).

    Returns (B,) in the compute dtype (float32 or float64). Differentiable in every float argument (first order:
    differentiating the gradient again raises ``SecondOrderError``); gradients come back in each argument's dtype.
    ``log``: hand-written backward (marginals); ``max``: the indicator of the decoded best path.

    Edges are computed on the fly from ``cum_scores``; live state is O(K*C) per sequence. Runs the Triton kernels on
    CUDA (or on the CPU under ``TRITON_INTERPRET=1`` set before the first import) when ``use_triton`` and
    C <= 64 (``TRITON_MAX_LABELS``; more labels run the PyTorch recursion). A sequence
    with no segmentation of finite score (e.g. every transition -inf) gets -inf and zero gradients. Works under
    ``torch.compile(fullgraph=True)``, CUDA-graph capture and with meta/fake tensors (custom ops); not under
    ``torch.func`` transforms (a clear error). Value errors (NaN/+inf, lengths out of range) follow the host-sync
    policy (site page "Host syncs and value checks"): a named ``ValueError`` on the CPU; on CUDA and under
    compile/capture NaN outputs and gradients, for the spoiled sequences only on the Triton backend (its kernels
    check each sequence), for the whole batch on the PyTorch one.
    """
    return PARTITION(cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, use_triton)


def semi_crf_viterbi(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    lengths: torch.Tensor,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
    use_triton: bool = True,
) -> ViterbiResult:
    """Best segmentation per sequence, as a :class:`~provable_kernels.semicrf.structures.ViterbiResult`:
    ``scores`` (B,) in the compute dtype (float32, or float64 when any argument is float64) and ``segments[b]`` a
    list of :class:`~provable_kernels.semicrf.structures.Segment` (start, end, label, score; Python values).

    Arguments as for :func:`semi_crf_streaming_forward` (float16/bfloat16/float32/float64 scores, ``lengths`` (B,)
    int32/int64 in 1..T, ``K`` >= 1). No gradient. Ties go to the shorter duration, then the smaller label. It
    reads its results on the host, so value errors are named ``ValueError`` on every device (not under compile or
    capture, where Python segments cannot be built anyway).
    """
    return VITERBI(cum_scores, transition, duration_bias, lengths, K, "max", proj_start, proj_end, use_triton)
