"""The Triton kernels as torch custom ops (namespace ``provable_kernels``), with fake (meta) implementations and
the hand-written backward registered as their autograd formula, so they run under ``torch.compile`` (fullgraph)
and CUDA-graph capture.

- ``provable_kernels::sinkhorn_forward(x, iters, domain, eps) -> out``: ``x`` (..., n, n), ``out`` like ``x``.
- ``provable_kernels::sinkhorn_backward(grad, x, iters, domain, eps) -> grad_x``: the exact gradient of the
  unrolled loop, recomputed from ``x`` (nothing of the forward is saved but ``x``).

The ops do no value checks (no host sync); :func:`provable_kernels.sinkhorn.sinkhorn` validates first.
"""
from __future__ import annotations

import torch

from provable_kernels.sinkhorn import triton_ops


def _as_batch(t: torch.Tensor) -> torch.Tensor:
    n = t.shape[-1]
    return t.reshape(-1, n, n).contiguous()


@torch.library.custom_op("provable_kernels::sinkhorn_forward", mutates_args=())
def sinkhorn_forward(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    return triton_ops.forward(_as_batch(x), iters, domain, eps).reshape(x.shape)


@sinkhorn_forward.register_fake
def _(x, iters, domain, eps):  # verify: unreached (fake-tensor kernel: torch.compile and opcheck, in the tests)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("provable_kernels::sinkhorn_backward", mutates_args=())
def sinkhorn_backward(grad: torch.Tensor, x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    return triton_ops.backward(_as_batch(grad.to(x.dtype)), _as_batch(x), iters, domain, eps).reshape(x.shape)


@sinkhorn_backward.register_fake
def _(grad, x, iters, domain, eps):  # verify: unreached (fake-tensor kernel: torch.compile and opcheck, in the tests)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    x, iters, domain, eps = inputs
    ctx.save_for_backward(x)
    ctx.args = (iters, domain, eps)


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return sinkhorn_backward(grad, x, *ctx.args), None, None, None


torch.library.register_autograd("provable_kernels::sinkhorn_forward", _backward, setup_context=_setup_context)
