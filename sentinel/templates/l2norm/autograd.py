"""The Triton kernels as torch custom ops (``provable_kernels.custom_ops.Op``: what ``torch.compile`` and the
``opcheck`` check see; plain eager calls skip the dispatcher), with fake implementations and the backward kernel
registered as the forward's autograd formula; and :func:`prepare`, the direct runner of one call signature.

- ``l2norm_forward(x) -> out``: ``x`` (..., cols), ``out`` like ``x``.
- ``l2norm_backward(grad, x) -> grad_x``: the gradient of ``sum(grad * l2norm_forward(x))``.
"""
from __future__ import annotations

from typing import Callable

import torch

from provable_kernels.custom_ops import Op

from . import triton_ops


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` (..., cols) as a contiguous (rows, cols) tensor (a view when it is contiguous)."""
    return t.reshape(-1, t.shape[-1]).contiguous()


def _forward(x: torch.Tensor) -> torch.Tensor:
    return triton_ops.forward(as_rows(x)).reshape(x.shape)


def _backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return triton_ops.backward(as_rows(grad.to(x.dtype)), as_rows(x)).reshape(x.shape)


def _like_x(*args: torch.Tensor) -> torch.Tensor:  # the fake implementations: a new tensor like x (the last one)
    return torch.empty_like(args[-1], memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _gradient(ctx, grad):
    return l2norm_backward(grad, ctx.saved_tensors[0])


l2norm_backward = Op("l2norm_backward", _backward, _like_x)
l2norm_forward = Op("l2norm_forward", _forward, _like_x, setup_context=_setup_context, backward=_gradient)


class _Prepared(torch.autograd.Function):
    """The eager training path of one signature: prepared ``forward(x)`` and ``backward(grad, x)``; the same
    kernels on the same tensors as the custom op's autograd formula."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.save_for_backward(x)
        ctx.backward = backward
        return forward(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward(grad, ctx.saved_tensors[0]), None, None


def prepare(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """What ``l2norm_forward`` computes for every ``x`` with this one's signature (dtype, shape, strides,
    ``requires_grad``, grad mode), as a function of ``x``, its launches made once: the forward alone, or with
    autograd recording one ``torch.autograd.Function`` over both launches."""
    rows = as_rows(x)
    forward_rows = triton_ops.prepare_forward(rows)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return forward_rows(as_rows(x)).reshape(x.shape)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return forward
    backward_rows = triton_ops.prepare_backward(rows)

    def backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return backward_rows(as_rows(grad.to(x.dtype)), as_rows(x)).reshape(x.shape)
    return lambda x: _Prepared.apply(x, forward, backward)
