"""Semi-CRF dispatch: the decision tree (data), the call it routes, and the public entry points.

Conventions (shared/DESIGN.md, one everywhere):

- ``cum_scores`` (B, T+1, C), ``cum_scores[:, 0] = 0``: prefix sums of per-position label scores (only
  differences enter a score, so a constant offset per label changes nothing).
- ``transition`` (C, C) or duration-dependent (K, C, C), oriented ``transition[src, dst]``.
- ``duration_bias`` (K, C): row ``d-1`` for duration ``d``; durations are 1..K, **K inclusive**.
- ``proj_start``, ``proj_end`` (B, T, C), each optional: scores for a segment starting / ending at a position.
- ``transition``, ``duration_bias``, ``proj_start`` and ``proj_end`` may hold -inf to forbid a choice; NaN and
  +inf are rejected everywhere, and ``cum_scores`` must be finite.
- ``lengths`` (B,) integers with 1 <= L <= T.
- A segment [s, s+d) with label c scores ``cum[s+d, c] - cum[s, c] + duration_bias[d-1, c] + proj_start[s, c]
  + proj_end[s+d-1, c]``; every segment after the first also pays ``trans(d)[c_prev, c]``.
- ``semiring="log"`` gives logZ (logsumexp over all segmentations), ``"max"`` the best score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree, triton_usable
from provable_kernels.semicrf.structures import ViterbiResult, to_result

SEMIRINGS = ("log", "max")


@dataclass(frozen=True)
class StreamingCall:
    """A validated semi-CRF call: what every route receives."""

    op: str  # "partition" | "viterbi"
    cum_scores: torch.Tensor
    transition: torch.Tensor
    duration_bias: torch.Tensor
    lengths: torch.Tensor
    K: int
    semiring: str
    proj_start: Optional[torch.Tensor]
    proj_end: Optional[torch.Tensor]
    use_triton: bool

    @property
    def batch(self) -> int:
        return self.cum_scores.shape[0]

    @property
    def T(self) -> int:
        return self.cum_scores.shape[1] - 1

    @property
    def C(self) -> int:
        return self.cum_scores.shape[2]

    @property
    def tensors(self) -> tuple[Optional[torch.Tensor], ...]:
        """The five differentiable inputs, in a fixed order."""
        return (self.cum_scores, self.transition, self.duration_bias, self.proj_start, self.proj_end)


def require_call(call: object, semiring: Optional[str] = None) -> StreamingCall:
    """``call`` itself, after checking it is a :class:`StreamingCall` (and of ``semiring`` when given): the guard
    every backend function runs first."""
    if not isinstance(call, StreamingCall):
        raise TypeError(f"call must be a StreamingCall (built by provable_kernels.semicrf.dispatch.make_call), "
                        f"got {type(call).__name__}")
    if semiring is not None and call.semiring != semiring:
        raise ValueError(f"call.semiring must be {semiring!r} here, got {call.semiring!r}")
    return call


# ----------------------------------------------------------------------------------------------- conditions


def ask_op(call: StreamingCall) -> str:
    """Which entry point: ``partition`` (semi_crf_streaming_forward) or ``viterbi`` (semi_crf_viterbi)."""
    return call.op


def ask_backend(call: StreamingCall) -> str:
    """``triton`` when the caller allows it (use_triton=True) and Triton can run on the tensors' device (CUDA, or
    CPU under TRITON_INTERPRET=1); otherwise ``torch``."""
    return "triton" if call.use_triton and triton_usable(call.cum_scores.device) else "torch"


def ask_semiring(call: StreamingCall) -> str:
    """The semiring requested: ``log`` (partition function) or ``max`` (best score)."""
    return call.semiring


def ask_grad(call: StreamingCall) -> str:
    """``train`` when autograd is on and any input requires a gradient, else ``infer``."""
    needs = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in call.tensors)
    return "train" if needs else "infer"


OP = Condition("op", ask_op, ("partition", "viterbi"))
BACKEND = Condition("backend", ask_backend, ("triton", "torch"))
SEMIRING = Condition("semiring", ask_semiring, SEMIRINGS)
GRAD = Condition("grad", ask_grad, ("infer", "train"))


# ------------------------------------------------------------------------------------------------ route bodies


def _backend(name: str):
    if name == "triton":
        from provable_kernels.semicrf import triton_ops

        return triton_ops
    from provable_kernels.semicrf import reference

    return reference


def torch_partition_infer(call: StreamingCall) -> torch.Tensor:
    """PyTorch ring-buffer recursion, no autograd graph (log or max semiring)."""
    return _backend("torch").partition(call)


def torch_log_train(call: StreamingCall) -> torch.Tensor:
    """PyTorch forward with checkpoints; hand-written backward recomputes from them (log semiring)."""
    from provable_kernels.semicrf.autograd import log_partition

    return log_partition(_backend("torch"), call)


def torch_max_train(call: StreamingCall) -> torch.Tensor:
    """PyTorch Viterbi forward; the gradient is the indicator of the decoded best path (max semiring)."""
    from provable_kernels.semicrf.autograd import max_partition

    return max_partition(_backend("torch"), call)


def torch_viterbi(call: StreamingCall):
    """PyTorch max recursion with backpointers, then backtracking."""
    return _backend("torch").viterbi(call)


def triton_partition_infer(call: StreamingCall) -> torch.Tensor:
    """Triton streaming forward kernel, no autograd graph (log or max semiring)."""
    return _backend("triton").partition(call)


def triton_log_train(call: StreamingCall) -> torch.Tensor:
    """Triton forward saving ring-buffer checkpoints; hand-written Triton backward (log semiring)."""
    from provable_kernels.semicrf.autograd import log_partition

    return log_partition(_backend("triton"), call)


def triton_max_train(call: StreamingCall) -> torch.Tensor:
    """Triton Viterbi kernel; the gradient is the indicator of the decoded best path (max semiring)."""
    from provable_kernels.semicrf.autograd import max_partition

    return max_partition(_backend("triton"), call)


def triton_viterbi(call: StreamingCall):
    """Triton max recursion writing backpointers, then a Triton backtracking kernel."""
    return _backend("triton").viterbi(call)


def _partition_subtree(backend: str, infer, log_train, max_train) -> Branch:
    return Branch(
        SEMIRING,
        {
            "log": Branch(GRAD, {"infer": Route(f"semicrf.{backend}.log.infer", infer),
                                 "train": Route(f"semicrf.{backend}.log.train", log_train)}),
            "max": Branch(GRAD, {"infer": Route(f"semicrf.{backend}.max.infer", infer),
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
                    "triton": _partition_subtree("triton", triton_partition_infer, triton_log_train, triton_max_train),
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


def make_call(op, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end, use_triton):
    """Validate every argument (naming it on error) and bundle them into a :class:`StreamingCall`."""
    cum_scores = validate.tensor("cum_scores", cum_scores, ndim=3, dtypes=validate.FLOAT_DTYPES)
    device, dtype = cum_scores.device, cum_scores.dtype
    B, T1, C = cum_scores.shape
    if T1 < 2:
        raise ValueError(f"cum_scores must have shape (B, T+1, C) with T >= 1, got {tuple(cum_scores.shape)}")
    if C < 1:
        raise ValueError(f"cum_scores must have at least one label (C >= 1), got shape {tuple(cum_scores.shape)}")
    K = validate.positive_int("K", K)
    semiring = validate.choice("semiring", semiring, SEMIRINGS)
    if not isinstance(use_triton, bool):
        raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")
    checks = validate.DataChecks()
    checks.finite("cum_scores", cum_scores)
    transition = validate.tensor("transition", transition, ndim=(2, 3), dtypes=(dtype,), device=device)
    if transition.dim() == 2:
        validate.shape("transition", transition, (C, C), "(C, C)")
    else:
        validate.shape("transition", transition, (K, C, C), "(K, C, C)")
    checks.finite("transition", transition, allow_neg_inf=True)
    duration_bias = validate.tensor("duration_bias", duration_bias, ndim=2, dtypes=(dtype,), device=device)
    validate.shape("duration_bias", duration_bias, (K, C), "(K, C)")
    checks.finite("duration_bias", duration_bias, allow_neg_inf=True)
    lengths = validate.lengths("lengths", lengths, B, T1 - 1, device, checks)
    for name, proj in (("proj_start", proj_start), ("proj_end", proj_end)):
        if proj is not None:
            validate.tensor(name, proj, ndim=3, dtypes=(dtype,), device=device)
            validate.shape(name, proj, (B, T1 - 1, C), "(B, T, C)")
            checks.finite(name, proj, allow_neg_inf=True)
    checks.verify()
    return StreamingCall(op, cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                         use_triton)


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
    """Semi-CRF partition (``semiring="log"``: logZ) or best score (``"max"``) per sequence, shape (B,).

    Edges are computed on the fly from ``cum_scores``; live state is O(K*C) per sequence. Differentiable in all
    five tensors (hand-written backward). Runs the Triton kernels on CUDA (or under the Triton interpreter) when
    ``use_triton``, otherwise the PyTorch recursion. Output dtype is the input dtype. A sequence with no
    segmentation of finite score (e.g. every transition -inf) gets -inf and zero gradients.
    """
    call = make_call("partition", cum_scores, transition, duration_bias, lengths, K, semiring, proj_start, proj_end,
                     use_triton)
    return TREE.dispatch(call)


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
    """Best segmentation per sequence: ``(scores (B,), segments)`` with ``segments[b]`` a list of
    :class:`~provable_kernels.semicrf.structures.Segment`. Ties go to the shorter duration, then the smaller label."""
    call = make_call("viterbi", cum_scores, transition, duration_bias, lengths, K, "max", proj_start, proj_end,
                     use_triton)
    return to_result(call, TREE.dispatch(call))
