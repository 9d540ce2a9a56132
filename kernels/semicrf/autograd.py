"""The semi-CRF kernels as PyTorch custom ops (``torch.library``), with fake implementations and autograd.

Both backends (``"triton"``: :mod:`provable_kernels.semicrf.triton_ops`, ``"torch"``:
:mod:`provable_kernels.semicrf.torch_ops`) run behind the same four ops of the ``provable_kernels`` namespace, so
that ``torch.compile(fullgraph=True)`` sees one opaque node per kernel (no graph break), CUDA graphs capture them,
and meta / fake tensors get the right output shapes without running anything:

- ``semicrf_partition(cum, trans, dur, lengths, ps, pe, K, semiring, backend) -> (B,)``: logZ or the best score,
  no gradient (inference routes).
- ``semicrf_log_forward(cum, trans, dur, lengths, ps, pe, K, backend) -> [logZ (B,), saved]``: logZ with what
  the backward needs (not differentiable itself); differentiable through ``semicrf_log_backward``. Triton: one
  kernel runs the forward and, at once, the backward for grad_logZ = 1, whose per-sequence float64 gradients are
  saved (one flat tensor: g_cum (B, T+1, C), the transition and duration-bias sums per sequence, g_ps, g_pe when
  present), so that the backward is one launch that scales them by grad_logZ: it runs on autograd's device
  thread, where a launch costs about twice the host time of the caller's thread.
  torch: the float64 logZ; the backward recomputes its checkpoints.
- ``semicrf_log_backward(cum, trans, dur, lengths, ps, pe, saved, grad, K, backend) -> [g_cum, g_trans, g_dur,
  (g_ps), (g_pe)]``: the hand-written backward. It is first order only: differentiating it again (a gradient
  penalty, ``create_graph=True`` then ``backward``) raises :class:`SecondOrderError`, never a silent zero.
- ``semicrf_viterbi(cum, trans, dur, lengths, ps, pe, K, backend) -> (scores (B,), durations (B, T) int64,
  labels (B, T) int64)``: the :class:`~provable_kernels.semicrf.structures.ViterbiPath` tensors.

Shapes and conventions as in :mod:`provable_kernels.semicrf.call`; ``ps``/``pe`` may be None. Inputs have
one float dtype (the call's compute dtype); outputs use it, integer outputs are int64.

Route helpers: :func:`log_partition` (logZ with the hand-written backward), :func:`max_partition` (the best
score; its gradient is the indicator of the decoded best path: the autograd of the path's score, zero where the
best score is -inf), :func:`partition`, :func:`viterbi`. Every op is a :class:`provable_kernels.custom_ops.Op`:
plain eager calls skip the custom-op dispatcher (tens of microseconds of host time per call).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from provable_kernels import validate
from provable_kernels.custom_ops import Op, plain_eager
from provable_kernels.semicrf import torch_ops, triton_ops
from provable_kernels.semicrf.call import StreamingCall
from provable_kernels.semicrf.scoring import segmentation_score
from provable_kernels.semicrf.structures import ViterbiPath

BACKENDS = {"triton": triton_ops, "torch": torch_ops}
SECOND_ORDER_HINT = (
    "second-order gradients of the semi-CRF log partition are not implemented: its backward is a hand-written "
    "first-order kernel. For a gradient penalty or Hessian-vector products use the exact backend, which is plain "
    "autograd: SemiMarkov(LogSemiring).logpartition(edges_from_streaming(...), lengths), or "
    "SemiMarkovCRFHead(..., backend='exact') with the head")


class SecondOrderError(RuntimeError):
    """Raised when a semi-CRF hand-written backward is differentiated (see :data:`SECOND_ORDER_HINT`)."""


def _call(backend: str, cum, trans, dur, lengths, ps, pe, K: int, semiring: str) -> StreamingCall:
    return StreamingCall(cum, trans, dur, lengths, K, ps, pe, op="partition", semiring=semiring,
                         use_triton=backend == "triton")


def _module(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")  # verify: unreached (internal)
    return BACKENDS[backend]


def _sizes(cum: Tensor, K: int) -> tuple[int, int, int, int]:
    B, T1, C = cum.shape
    return B, T1 - 1, C, min(K, T1 - 1)


# ----------------------------------------------------------------------------------------------------- ops


def _partition_impl(cum: Tensor, trans: Tensor, dur: Tensor, lengths: Tensor, ps: Optional[Tensor],
                    pe: Optional[Tensor], K: int, semiring: str, backend: str) -> Tensor:
    return _module(backend).partition(_call(backend, cum, trans, dur, lengths, ps, pe, K, semiring))


def _partition_fake(cum, trans, dur, lengths, ps, pe, K, semiring, backend):
    return cum.new_empty(cum.shape[0])


def _log_forward_impl(cum: Tensor, trans: Tensor, dur: Tensor, lengths: Tensor, ps: Optional[Tensor],
                      pe: Optional[Tensor], K: int, backend: str) -> list[Tensor]:
    call = _call(backend, cum, trans, dur, lengths, ps, pe, K, "log")
    if _module(backend) is torch_ops:  # saved: the float64 logZ (the checkpoints' count depends on the lengths' values)
        logZ, (logZ64, _) = torch_ops.forward_checkpointed(call)
        return [logZ.clone() if logZ.dtype == torch.float64 else logZ, logZ64]  # op outputs must not alias
    return list(triton_ops.train_forward(call))  # logZ, saved: the unit gradients, computed now (module docstring)


def _log_forward_fake(cum, trans, dur, lengths, ps, pe, K, backend):
    B, T, C, k = _sizes(cum, K)
    logZ = cum.new_empty(B)
    if backend == "torch":
        return [logZ, cum.new_empty(B, dtype=torch.float64)]
    numel = triton_ops.saved_numel(B, T, C, k, trans.dim() == 3, ps is not None, pe is not None)
    return [logZ, cum.new_empty(numel, dtype=torch.float64)]


def _log_backward_impl(cum: Tensor, trans: Tensor, dur: Tensor, lengths: Tensor, ps: Optional[Tensor],
                       pe: Optional[Tensor], saved: list[Tensor], grad: Tensor, K: int, backend: str) -> list[Tensor]:
    call = _call(backend, cum, trans, dur, lengths, ps, pe, K, "log")
    if _module(backend) is torch_ops:
        grads = torch_ops.backward(call, torch_ops.forward_checkpointed(call)[1], None, grad)
    else:
        grads = triton_ops.backward(call, saved[0], grad)
    return [g.contiguous() for g in grads if g is not None]  # the fake's layout (the torch backend's may be views)


def _log_backward_fake(cum, trans, dur, lengths, ps, pe, saved, grad, K, backend):
    return [x.new_empty(x.shape) for x in (cum, trans, dur, ps, pe) if x is not None]  # contiguous, as the impl


def _viterbi_impl(cum: Tensor, trans: Tensor, dur: Tensor, lengths: Tensor, ps: Optional[Tensor],
                  pe: Optional[Tensor], K: int, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    path = _module(backend).viterbi(_call(backend, cum, trans, dur, lengths, ps, pe, K, "max"))
    return path.scores, path.durations, path.labels


def _viterbi_fake(cum, trans, dur, lengths, ps, pe, K, backend):
    B, T = cum.shape[0], cum.shape[1] - 1
    return cum.new_empty(B), cum.new_empty(B, T, dtype=torch.int64), cum.new_empty(B, T, dtype=torch.int64)


# ------------------------------------------------------------------------------------------------ autograd


def _setup_log_forward(ctx, inputs, output) -> None:
    cum, trans, dur, lengths, ps, pe, K, backend = inputs
    ctx.K, ctx.backend = K, backend
    ctx.save_for_backward(cum, trans, dur, lengths, ps, pe, *output[1:])
    ctx.mark_non_differentiable(*output[1:])  # what the backward needs, not a result
    ctx.set_materialize_grads(False)  # no zero gradient of that size allocated for the backward (host time)


def _log_forward_backward(ctx, grads):
    if grads[0] is None:  # verify: unreached (logZ is the only differentiable output: a backward comes through it)
        return (None,) * 8
    cum, trans, dur, lengths, ps, pe, *saved = ctx.saved_tensors
    found = iter(_log_backward_op(cum, trans, dur, lengths, ps, pe, saved, grads[0], ctx.K, ctx.backend))
    g_cum, g_trans, g_dur = next(found), next(found), next(found)
    g_ps = None if ps is None else next(found)
    g_pe = None if pe is None else next(found)
    return g_cum, g_trans, g_dur, None, g_ps, g_pe, None, None


def _setup_log_backward(ctx, inputs, output) -> None:  # verify: unreached (second order only)
    pass


def _refuse_second_order(ctx, grads):  # verify: unreached (second order only: it raises; tests)
    raise SecondOrderError(SECOND_ORDER_HINT)


_partition_op = Op("semicrf_partition", _partition_impl, _partition_fake)
_viterbi_op = Op("semicrf_viterbi", _viterbi_impl, _viterbi_fake)
_log_backward_op = Op("semicrf_log_backward", _log_backward_impl, _log_backward_fake,
                      setup_context=_setup_log_backward, backward=_refuse_second_order)
_log_forward_op = Op("semicrf_log_forward", _log_forward_impl, _log_forward_fake,
                     setup_context=_setup_log_forward, backward=_log_forward_backward)


# -------------------------------------------------------------------------------------------- route helpers


def _args(call: StreamingCall) -> tuple:
    return (call.cum_scores, call.transition, call.duration_bias, call.lengths, call.proj_start, call.proj_end,
            call.K)


def partition(backend: str, call: StreamingCall) -> Tensor:
    """logZ or the best score (B,) of ``call``, no autograd graph (the inference routes: no input requires grad,
    so a plain eager call runs the backend directly, as the op itself would, without its host time)."""
    if plain_eager(call.cum_scores):
        return _module(backend).partition(call)
    return _partition_op(*_args(call), call.semiring, backend)  # compile, fake tensors, verify's opcheck


def _direct_plan(call: StreamingCall, args: tuple, training: bool):
    """The Triton plan of ``call`` when its tensors are the entry point's arguments ``args`` themselves (no cast to
    the compute dtype, no contiguous copy, K not capped at T), else None: a direct runner takes the arguments as
    they come."""
    cum, trans, dur, lengths, _, _, ps, pe, _ = args
    plan = triton_ops._plan(call, training=training)
    given = (plan.cum, plan.trans, plan.dur, plan.ps, plan.pe, plan.lengths)
    same = all(a is b for a, b in zip(given, (cum, trans, dur, ps, pe, lengths)))
    return plan if same and plan.K == call.K else None


def prepare_partition(call: StreamingCall, args: tuple):
    """The direct runner of :func:`partition` on the Triton backend for every call with ``call``'s signature (a
    function of ``semi_crf_streaming_forward``'s arguments; None to decline, see :func:`_direct_plan`)."""
    plan = _direct_plan(call, args, training=False)
    if plan is None:
        return None
    run = triton_ops.partition_runner(plan, call.semiring == "log")
    return lambda cum, trans, dur, lengths, K, semiring, ps, pe, use_triton: run(cum, trans, dur, ps, pe, lengths)


class _PreparedTraining(torch.autograd.Function):
    """The eager training path of one signature (:func:`prepare_log_partition`): the training launches made once,
    the same kernels on the same tensors as :data:`_log_forward_op` and its autograd formula, so bitwise the same
    logZ and gradients. Under ``create_graph`` the backward runs the custom op, which refuses second order."""

    @staticmethod
    def forward(ctx, cum, trans, dur, ps, pe, lengths, training, K):
        logZ, saved = training.forward(cum, trans, dur, ps, pe, lengths)
        ctx.save_for_backward(saved, cum, trans, dur, ps, pe, lengths)
        ctx.training, ctx.K = training, K
        return logZ

    @staticmethod
    def backward(ctx, grad):
        saved, cum, trans, dur, ps, pe, lengths = ctx.saved_tensors
        if torch.is_grad_enabled():  # verify: unreached (create_graph: the op refusing second order; tests)
            grads = iter(_log_backward_op(cum, trans, dur, lengths, ps, pe, [saved], grad, ctx.K, "triton"))
            return (next(grads), next(grads), next(grads), None if ps is None else next(grads),
                    None if pe is None else next(grads), None, None, None)
        return (*ctx.training.backward(saved, grad), None, None, None)


def prepare_log_partition(call: StreamingCall, args: tuple):
    """The direct runner of :func:`log_partition` on the Triton backend for every call with ``call``'s signature:
    one autograd function whose forward and backward launches are made once (None to decline)."""
    plan = _direct_plan(call, args, training=True)
    if plan is None:
        return None
    training = triton_ops.training_runner(plan)
    return lambda cum, trans, dur, lengths, K, semiring, ps, pe, use_triton: _PreparedTraining.apply(
        cum, trans, dur, ps, pe, lengths, training, K)


def log_partition(backend: str, call: StreamingCall) -> Tensor:
    """logZ (B,) of ``call`` (log semiring), differentiable in each of ``call.tensors`` that requires grad
    (first order)."""
    return _log_forward_op(*_args(call), backend)[0]


def viterbi(backend: str, call: StreamingCall) -> ViterbiPath:
    """The best segmentation per sequence as a :class:`ViterbiPath` (no gradient)."""
    return ViterbiPath(*_viterbi_op(*_args(call), backend))


def path_tensors(path: ViterbiPath, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(starts (B, T) bool, labels (B, T) int64)`` per position, as
    :func:`~provable_kernels.semicrf.scoring.path_score` takes them, from a ViterbiPath (segments marked at their last position). Positions >= lengths[b]: False / 0."""
    ends = path.durations > 0
    B, T = ends.shape
    position = torch.arange(T, device=ends.device).expand(B, T)
    inside = position < lengths[:, None]
    starts = torch.cat([torch.ones_like(ends[:, :1]), ends[:, :-1]], 1)  # a segment starts at 0 and after each end
    # the segment covering t ends at the first end at or after t
    end_of = torch.where(ends, position, T - 1).flip(1).cummin(1).values.flip(1)
    labels = torch.where(inside, path.labels.gather(1, end_of), 0)
    return starts & inside, labels


def max_partition(backend: str, call: StreamingCall) -> Tensor:
    """The best score (B,) from the Viterbi op; gradient: autograd of the decoded path's score (the indicator of
    its segments and transitions), zero where the best score is -inf. The value is exactly the Viterbi score;
    second-order gradients are exact (zero: the score is linear in the inputs). A sequence whose best score is
    NaN (its values failed the Triton kernel's checks) gets NaN gradients too."""
    path = viterbi(backend, call)
    lengths = call.lengths.clamp(1, call.T)  # device mode: the kernels clamp a bad length and return NaN
    starts, labels = path_tensors(path, lengths)
    score = segmentation_score(call.cum_scores, call.transition, call.duration_bias, lengths, starts, labels,
                               call.proj_start, call.proj_end)
    best = path.scores.detach()  # the op has no autograd formula: the gradient is the path score's
    score = torch.where(best == float("-inf"), torch.zeros_like(score), score)
    return validate.poison(~torch.isnan(best), best + (score - score.detach()))
