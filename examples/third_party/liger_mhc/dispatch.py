"""An entry point over Liger's mHC Sinkhorn kernels: ``x`` (N, n, n) becomes Liger's ``mix`` (N, n*n + 2n) with
zero pre and post logits, bias 0 and scales 1, so that ``h_res`` is the Sinkhorn of ``x``; the backward is Liger's
(recomputing, or from the stored history). No validation of its own: what the checks see is Liger's."""
from __future__ import annotations

from typing import NamedTuple

import torch
from liger_kernel.ops import mhc

from provable_kernels.dispatch import Branch, Condition, Route, Tree


class SinkhornCall(NamedTuple):
    x: torch.Tensor
    iters: int
    eps: float
    keep_history: bool


def _mix(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Liger's ``mix`` (N, n*n + 2n), bias (n*n + 2n,) and unit scale (1,) for the logits ``x`` (N, n, n)."""
    N, n = x.shape[0], x.shape[-1]
    mix = torch.cat([x.new_zeros(N, 2 * n), x.reshape(N, n * n)], 1).contiguous()
    return mix, x.new_zeros(n * n + 2 * n), x.new_ones(1)


class _LigerSinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, iters, eps, keep_history):
        mix, b, one = _mix(x.detach())
        out = mhc.mhc_split_sinkhorn_fwd(mix, b, one, one, one, tmax=iters, pre_eps=0.0, sinkhorn_eps=eps,
                                         post_mult=1.0, return_hist=keep_history)
        ctx.save_for_backward(mix, b, one, *out[3:])
        ctx.settings = iters, eps
        return out[2]

    @staticmethod
    def backward(ctx, grad):
        mix, b, one, *history = ctx.saved_tensors
        iters, eps = ctx.settings
        return mhc.mhc_sinkhorn_bwd(mix, b, one, grad.contiguous(), tmax=iters, sinkhorn_eps=eps,
                                    hist=history[0] if history else None), None, None, None


def ask_backward(call: SinkhornCall) -> str:
    """``history`` when the caller keeps the forward's iterations for the backward (``keep_history=True``: Liger's
    ``_mhc_sinkhorn_bwd_hist_kernel``), else ``recompute`` (``_mhc_sinkhorn_bwd_kernel`` replays them)."""
    return "history" if call.keep_history else "recompute"


def liger_route(call: SinkhornCall) -> torch.Tensor:
    """Liger's forward kernel; its backward kernel of the route's kind as the gradient."""
    return _LigerSinkhorn.apply(call.x, call.iters, call.eps, call.keep_history)


TREE = Tree("liger_sinkhorn", Branch(Condition("backward", ask_backward, ("recompute", "history")), {
    "recompute": Route("liger_mhc.liger.recompute", liger_route),
    "history": Route("liger_mhc.liger.history", liger_route)}))


def liger_sinkhorn(x: torch.Tensor, iters: int = 3, eps: float = 1e-3, keep_history: bool = False) -> torch.Tensor:
    """Liger's ``h_res`` for the logits ``x`` (N, n, n): softmax rows + eps, a column division, then ``iters -
    1`` row and column divisions (each by the sum + eps); float32 (N, n, n)."""
    return TREE.dispatch(SinkhornCall(x, iters, eps, keep_history))
