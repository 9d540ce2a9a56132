"""The Triton kernels as torch custom ops (namespace ``provable_kernels``, through
:class:`provable_kernels.custom_ops.Op`: plain eager calls skip the dispatcher), with fake (meta)
implementations and the hand-written backward registered as their autograd formula, so they run under
``torch.compile`` (fullgraph) and CUDA-graph capture.

- ``provable_kernels::sinkhorn_forward(x, iters, domain, eps) -> out``: ``x`` (..., n, n), ``out`` like ``x``.
- ``provable_kernels::sinkhorn_forward_residual(x, iters, domain, eps) -> (out, residual)``: the same launch also
  stores each matrix's convergence residual, ``residual`` (...) in the compute dtype (no gradient).
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


def _forward_residual(x: torch.Tensor, iters: int, domain: str, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, res = triton_ops.forward(as_batch(x), iters, domain, eps, residual=True)
    return out.reshape(x.shape), res.reshape(x.shape[:-2])


def prepare_forward(x: torch.Tensor, iters: int, domain: str, eps: float, residual: bool = False):
    """The forward op's implementation for every ``x`` with this one's signature, as a function of ``x``, its
    launch made once (:func:`triton_ops.prepare_forward`): the eager path of an inference call (no autograd, no
    custom-op dispatcher: :mod:`provable_kernels.runtime`). With ``residual`` it returns ``(out, residual)``."""
    forward = triton_ops.prepare_forward(as_batch(x), iters, domain, eps, residual)
    if x.dim() == 3 and x.is_contiguous():  # (B, n, n) already: no views to make
        return forward
    if residual:
        def forward_residual_prepared(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out, res = forward(as_batch(x))
            return out.reshape(x.shape), res.reshape(x.shape[:-2])
        return forward_residual_prepared

    def forward_prepared(x: torch.Tensor) -> torch.Tensor:
        return forward(as_batch(x)).reshape(x.shape)
    return forward_prepared


class _Prepared(torch.autograd.Function):
    """The eager training path of one signature: ``forward(x)`` and ``backward(grad, x)`` prepared once
    (:func:`prepare_train`); the same kernels on the same tensors as the custom op's autograd formula."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.save_for_backward(x)
        ctx.backward = backward
        result = forward(x)
        if isinstance(result, tuple):  # (out, residual): the residual has no gradient, and no zeros are made for it
            ctx.mark_non_differentiable(result[1])
            ctx.set_materialize_grads(False)
        return result

    @staticmethod
    def backward(ctx, grad, *residual_grad):
        (x,) = ctx.saved_tensors
        return (None if grad is None else ctx.backward(grad, x)), None, None


def prepare_train(x: torch.Tensor, iters: int, domain: str, eps: float, residual: bool = False):
    """The forward op with its autograd formula for every ``x`` with this one's signature, as a function of ``x``:
    one ``torch.autograd.Function`` whose backward reuses the plan the forward's signature made (both launches
    prepared once). For plain eager calls (:mod:`provable_kernels.runtime`); compile, export and fake tensors take
    the custom op."""
    forward = prepare_forward(x, iters, domain, eps, residual)
    backward = triton_ops.prepare_backward(as_batch(x), iters, domain, eps)

    def gradient(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return backward(as_batch(grad.to(x.dtype)), as_batch(x)).reshape(x.shape)
    return lambda x: _Prepared.apply(x, forward, gradient)


def _backward(grad: torch.Tensor, x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    return triton_ops.backward(as_batch(grad.to(x.dtype)), as_batch(x), iters, domain, eps).reshape(x.shape)


def _fake_forward(x, iters, domain, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_forward_residual(x, iters, domain, eps):
    res_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(x.shape[:-2], dtype=res_dtype))


def _fake_backward(grad, x, iters, domain, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


sinkhorn_backward = Op("sinkhorn_backward", _backward, _fake_backward)


def _setup_context(ctx, inputs, output):
    x, iters, domain, eps = inputs
    ctx.save_for_backward(x)
    ctx.args = (iters, domain, eps)


def _setup_context_residual(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])


def _gradient(ctx, grad, *residual_grad):
    (x,) = ctx.saved_tensors
    return sinkhorn_backward(grad, x, *ctx.args), None, None, None


sinkhorn_forward = Op("sinkhorn_forward", _forward, _fake_forward, setup_context=_setup_context, backward=_gradient)
sinkhorn_forward_residual = Op("sinkhorn_forward_residual", _forward_residual, _fake_forward_residual,
                               setup_context=_setup_context_residual, backward=_gradient)
