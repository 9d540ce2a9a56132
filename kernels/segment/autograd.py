"""The Triton segment kernels as torch custom ops (through :class:`provable_kernels.custom_ops.Op`: plain eager
calls skip the dispatcher), with their fake (meta) implementations and autograd.

- ``provable_kernels::segment_forward(x2, offsets, ids, num_segments, reduce, empty, want_arg, host_checked) ->
  (out, arg, csr)``: ``x2`` (N, D); exactly one of ``offsets`` (S+1,) and ``ids`` (N,); ``out`` (S, D) in x2.dtype;
  ``arg`` (S, D) int32 (the first-occurrence row) for max / min when ``want_arg``, else (0,); ``csr`` the (S+1,)
  int32 offsets built from ``ids`` (ids form; unwritten without segments or columns, when the backward reads
  nothing), else (0,). ``host_checked``: the index values were checked on the
  host (see ``triton_ops``).
- ``provable_kernels::segment_backward(grad, csr, ids, arg, reduce, rows) -> grad_x`` (rows, D).

The autograd formula of ``segment_forward`` is ``segment_backward`` with the offsets (given, or the forward's
``csr``) and the saved int32 ``arg`` (max / min); ``arg`` and ``csr`` are not differentiable. The standalone adjoints
run the same two ops (forward with ``want_arg``, then backward), so they are bitwise equal to this autograd path.
Shapes depend only on input shapes, so the ops work under ``torch.compile`` and CUDA-graph capture.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from provable_kernels.custom_ops import Op
from provable_kernels.segment import triton_ops


def _forward(x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor], num_segments: int, reduce: str,
             empty: float, want_arg: bool, host_checked: bool) -> tuple[Tensor, Tensor, Tensor]:
    return triton_ops.forward(x2, offsets, ids, num_segments, reduce, empty, want_arg, host_checked)


def _forward_fake(x2, offsets, ids, num_segments, reduce, empty, want_arg, host_checked):
    S, D = num_segments, x2.shape[1]
    with_arg = want_arg and reduce in ("max", "min")
    return (x2.new_empty((S, D)), x2.new_empty((S, D) if with_arg else (0,), dtype=torch.int32),
            x2.new_empty((S + 1,) if ids is not None else (0,), dtype=torch.int32))


def _backward_impl(grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Tensor, reduce: str, rows: int) -> Tensor:
    return triton_ops.backward(grad, csr, ids, arg, reduce, rows)


def _backward_fake(grad, csr, ids, arg, reduce, rows):
    return grad.new_empty((rows, grad.shape[1]))


segment_backward = Op("segment_backward", _backward_impl, _backward_fake)


def _setup_context(ctx, inputs, output) -> None:
    x2, offsets, ids, _, reduce, _, want_arg, _ = inputs
    if reduce in ("max", "min") and not want_arg:  # verify: unreached (internal guard: training routes ask for the arg)
        raise ValueError("want_arg must be True for a differentiable max / min (the backward reads arg)")
    ctx.save_for_backward(offsets if offsets is not None else output[2], ids, output[1])
    ctx.set_materialize_grads(False)  # no zero gradients made for arg and csr (integers: a launch each on CUDA)
    ctx.reduce, ctx.rows = reduce, x2.shape[0]


def _gradient(ctx, grad_out: Tensor, _grad_arg: Optional[Tensor], _grad_csr: Optional[Tensor]):
    csr, ids, arg = ctx.saved_tensors
    grad_x = segment_backward(grad_out.contiguous(), csr, ids, arg, ctx.reduce, ctx.rows)
    return grad_x, None, None, None, None, None, None, None


segment_forward = Op("segment_forward", _forward, _forward_fake, setup_context=_setup_context, backward=_gradient)
