"""The Triton kernels as torch custom ops (namespace ``provable_kernels``, through
:class:`provable_kernels.custom_ops.Op`: plain eager calls skip the dispatcher), with fake (meta)
implementations and the hand-written backward registered as their autograd formula, so they run under
``torch.compile`` (fullgraph) and CUDA-graph capture.

- ``provable_kernels::sinkhorn_forward(x, iters, domain, eps) -> out``: ``x`` (..., n, n), ``out`` like ``x``.
- ``provable_kernels::sinkhorn_backward(grad, x, iters, domain, eps) -> grad_x``: the exact gradient of the
  unrolled loop, recomputed from ``x`` (nothing of the forward is saved but ``x``).

The ops do no value checks (no host sync); :func:`provable_kernels.sinkhorn.sinkhorn` validates first.
"""
from __future__ import annotations

import torch

from provable_kernels.custom_ops import Op
from provable_kernels.sinkhorn import triton_ops


def as_batch(t: torch.Tensor) -> torch.Tensor:
    """``t`` (..., n, n) as a contiguous (B, n, n) tensor (a view when it is contiguous)."""
    n = t.shape[-1]
    return t.reshape(-1, n, n).contiguous()


def _forward(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    return triton_ops.forward(as_batch(x), iters, domain, eps).reshape(x.shape)


def prepare_forward(x: torch.Tensor, iters: int, domain: str, eps: float):
    """The forward op's implementation for every ``x`` with this one's signature, as a function of ``x``, its
    launch made once (:func:`triton_ops.prepare_forward`): the eager path of an inference call (no autograd, no
    custom-op dispatcher: :mod:`provable_kernels.runtime`)."""
    forward = triton_ops.prepare_forward(as_batch(x), iters, domain, eps)

    def forward_prepared(x: torch.Tensor) -> torch.Tensor:
        return forward(as_batch(x)).reshape(x.shape)
    return forward_prepared


def _backward(grad: torch.Tensor, x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    return triton_ops.backward(as_batch(grad.to(x.dtype)), as_batch(x), iters, domain, eps).reshape(x.shape)


# verify: unreached (the fake-tensor kernels: torch.compile and opcheck, in the tests)
def _fake_forward(x, iters, domain, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_backward(grad, x, iters, domain, eps):  # verify: unreached (fake tensors only)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


sinkhorn_backward = Op("sinkhorn_backward", _backward, _fake_backward)


def _setup_context(ctx, inputs, output):
    x, iters, domain, eps = inputs
    ctx.save_for_backward(x)
    ctx.args = (iters, domain, eps)


def _gradient(ctx, grad):
    (x,) = ctx.saved_tensors
    return sinkhorn_backward(grad, x, *ctx.args), None, None, None


sinkhorn_forward = Op("sinkhorn_forward", _forward, _fake_forward, setup_context=_setup_context, backward=_gradient)
