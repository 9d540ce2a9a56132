"""Autograd glue shared by the semi-CRF backends (written once for ``torch_ops`` and ``triton_ops``).

A backend is a module with ``forward_checkpointed(call) -> (logZ, saved)``, ``backward(call, saved, logZ,
grad_logZ) -> (g_cum, g_trans, g_dur, g_ps, g_pe)`` and ``viterbi(call) -> ViterbiPath``.

- :func:`log_partition`: logZ (B,) with the backend's hand-written backward.
- :func:`max_partition`: the best score (B,); its gradient is the indicator of the decoded best path (the
  gradient of the path's score), zero for a sequence whose best score is -inf.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from provable_kernels.semicrf.call import StreamingCall
from provable_kernels.semicrf.scoring import path_score
from provable_kernels.semicrf.structures import ViterbiPath

_INPUTS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")  # the order of call.tensors


class _LogPartition(torch.autograd.Function):
    """logZ = backend forward; d logZ = backend hand-written backward. Inputs: ``(backend, call, *call.tensors)``."""

    @staticmethod
    def forward(ctx, backend: ModuleType, call: StreamingCall, *inputs):
        logZ, saved = backend.forward_checkpointed(call)
        ctx.backend, ctx.call, ctx.n_saved = backend, call, len(saved)
        ctx.save_for_backward(*inputs, logZ, *saved)  # saving the inputs catches in-place changes before backward
        return logZ

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logZ: Tensor):
        *inputs, logZ = ctx.saved_tensors[: len(_INPUTS) + 1]
        saved = tuple(ctx.saved_tensors[len(_INPUTS) + 1 :])
        call = dataclasses.replace(ctx.call, **dict(zip(_INPUTS, inputs)))
        grads = ctx.backend.backward(call, saved, logZ, grad_logZ)
        wanted = ctx.needs_input_grad[2:]
        return (None, None) + tuple(g if need else None for g, need in zip(grads, wanted))


def log_partition(backend: ModuleType, call: StreamingCall) -> Tensor:
    """logZ (B,) of ``call`` (log semiring), differentiable in each of ``call.tensors`` that requires grad."""
    return _LogPartition.apply(backend, call, *call.tensors)


def path_tensors(path: ViterbiPath, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(starts (B, T) bool, labels (B, T) int64)`` per position, as :func:`~provable_kernels.semicrf.scoring.path_score`
    takes them, from a ViterbiPath (segments marked at their last position). Positions >= lengths[b]: False / 0."""
    ends = path.durations > 0
    B, T = ends.shape
    position = torch.arange(T, device=ends.device).expand(B, T)
    inside = position < lengths[:, None]
    starts = torch.ones_like(ends)
    starts[:, 1:] = ends[:, :-1]  # a segment starts at 0 and right after each end
    # the segment covering t ends at the first end at or after t
    end_of = torch.where(ends, position, T - 1).flip(1).cummin(1).values.flip(1)
    labels = torch.where(inside, path.labels.gather(1, end_of), 0)
    return starts & inside, labels


def max_partition(backend: ModuleType, call: StreamingCall) -> Tensor:
    """The best score (B,) from ``backend.viterbi``; gradient: autograd of ``path_score`` at the decoded path
    (the indicator of its segments and transitions), zero where the best score is -inf. The value is exactly
    the Viterbi score."""
    path = backend.viterbi(call)
    starts, labels = path_tensors(path, call.lengths)
    score = path_score(call.cum_scores, call.transition, call.duration_bias, call.lengths, starts, labels,
                       call.proj_start, call.proj_end)
    score = torch.where(torch.isfinite(path.scores), score, torch.zeros_like(score))
    return path.scores + (score - score.detach())
