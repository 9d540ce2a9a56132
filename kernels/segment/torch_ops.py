"""PyTorch backend of the segment reductions (same conventions as the Triton one, differentiable by autograd).

- sum / mean: ``torch.segment_reduce(..., "sum")`` in float32 (float64 for float64), deterministic;
  mean divides by max(count, 1).
- max / min: the first-occurrence arg per (segment, column) from a segment maximum of ``SIGN * x`` (NaN made
  the top of its segment explicitly, not by torch's NaN ordering)
  and an ``amin`` of the matching row numbers; the value is ``x`` gathered there, so autograd sends the whole
  upstream gradient to that row (each row receives from at most one segment: no summation order to vary).
- empty segments are replaced by ``empty`` with ``torch.where``: no gradient flows to them.
"""
from __future__ import annotations

import torch
from torch import Tensor

from provable_kernels.segment.call import SegmentCall, require_call


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def row_segments(csr: Tensor, rows: int) -> Tensor:
    """The segment of every row (N,) int64, from CSR offsets (no host sync: the output size is known)."""
    counts = csr.diff()
    return torch.repeat_interleave(torch.arange(counts.numel(), device=csr.device), counts, output_size=rows)


def first_arg(x2: Tensor, csr: Tensor, reduce: str) -> Tensor:
    """(S, D) int64: the first row of each segment holding its maximum (``max``) or minimum (``min``) per column,
    the first NaN when there is one; ``N`` for empty segments."""
    N, D = x2.shape
    S = csr.numel() - 1
    key = (x2 if reduce == "max" else -x2).to(_acc(x2.dtype))
    nan = torch.isnan(key)
    # NaN ordering written out, not left to segment_reduce: a segment holding a NaN has top NaN in that column
    top = torch.segment_reduce(key.masked_fill(nan, float("-inf")), "max", offsets=csr, axis=0, unsafe=True)
    has_nan = torch.segment_reduce(nan.to(key.dtype), "sum", offsets=csr, axis=0, unsafe=True) > 0
    top = top.masked_fill(has_nan, float("nan"))
    seg = row_segments(csr, N)
    at = top[seg]
    match = (key == at) | nan  # a NaN row's segment has top NaN there (has_nan)
    rows = torch.arange(N, device=x2.device)[:, None].expand(N, D)
    cand = torch.where(match, rows, N)
    init = torch.full((S, D), N, dtype=torch.int64, device=x2.device)
    return init.scatter_reduce(0, seg[:, None].expand(N, D), cand, "amin", include_self=True)


def segment_reduce(call: SegmentCall) -> Tensor:
    """(S, D) in x.dtype, differentiable in ``x``."""
    call = require_call(call, "reduce")
    x2 = call.x.reshape(call.rows, call.columns)
    csr = call.csr
    counts = csr.diff()[:, None]
    fill = torch.full((), call.empty, dtype=x2.dtype, device=x2.device)
    if call.reduce in ("sum", "mean"):
        total = torch.segment_reduce(x2.to(_acc(x2.dtype)), "sum", offsets=csr, axis=0, unsafe=True)
        if call.reduce == "mean":
            total = total / counts.clamp(min=1)
        value = total.to(x2.dtype)
    else:
        arg = first_arg(x2.detach(), csr, call.reduce)
        if call.rows:
            value = x2.gather(0, arg.clamp(max=call.rows - 1))
        else:
            value = x2.sum(0, keepdim=True).expand(arg.shape)  # no rows: every segment is empty
    return torch.where(counts > 0, value, fill)


def extreme_backward(call: SegmentCall) -> Tensor:
    """The standalone adjoint: grad_x (N, D) with ``grad_output`` at the recomputed first-occurrence arg."""
    call = require_call(call, "adjoint")
    x2 = call.x.reshape(call.rows, call.columns)
    g = call.grad_output.reshape(call.num_segments, call.columns)
    arg = first_arg(x2, call.csr, call.reduce)
    grad = torch.zeros((call.rows + 1, call.columns), dtype=x2.dtype, device=x2.device)
    return grad.scatter_(0, arg, g)[: call.rows]  # empty segments write the discarded row N
