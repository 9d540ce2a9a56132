"""Segment-reduction dispatch: conditions, route bodies, the decision tree (data) and the public entry points.

Conventions are in :mod:`provable_kernels.segment.call`. The tree asks, in order: which entry point (``reduce``:
segment_reduce, ``adjoint``: segment_max_backward / segment_min_backward), the backend, the reduction; for
Triton, whether a gradient is wanted, then for inference the shape regime (no segment can be long: one pass; or
long segments cut into chunks, combined by their last chunk's program) and for training the index form (offsets or
ids). The PyTorch backend runs the same code with or without a gradient, and both index forms through CSR offsets.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree
from provable_kernels.runtime import Entry
from provable_kernels.segment import torch_ops, triton_ops
from provable_kernels.segment.autograd import segment_backward, segment_forward
from provable_kernels.segment.call import REDUCTIONS, SegmentCall, bind, check, require_call, runs_triton


# ----------------------------------------------------------------------------------------------- conditions


def ask_op(call: SegmentCall) -> str:
    """Which entry point: ``reduce`` (segment_reduce) or ``adjoint`` (segment_max_backward /
    segment_min_backward)."""
    return call.op


def ask_backend(call: SegmentCall) -> str:
    """``triton`` when the caller allows it (use_triton=True), Triton can run on the device of ``x`` (CUDA, or CPU
    under TRITON_INTERPRET=1) and rows and segments fit int32 indices (N, S < 2**31); otherwise ``torch``."""
    return "triton" if runs_triton(call.use_triton, call.x.device, call.rows, call.num_segments) else "torch"


def ask_reduce(call: SegmentCall) -> str:
    """The reduction requested: ``sum``, ``mean``, ``max`` or ``min``."""
    return call.reduce


def ask_extreme(call: SegmentCall) -> str:
    """Which adjoint: ``max`` (segment_max_backward) or ``min`` (segment_min_backward)."""
    return call.reduce


def ask_grad(call: SegmentCall) -> str:
    """``train`` when autograd is on and ``x`` requires a gradient, else ``infer``."""
    return "train" if torch.is_grad_enabled() and call.x.requires_grad else "infer"


def ask_index(call: SegmentCall) -> str:
    """The index form the caller gave: ``offsets`` (CSR) or ``ids`` (sorted segment id per row)."""
    return call.form


def ask_rows(call: SegmentCall) -> str:
    """``one_block`` when no segment can be long (N <= the Triton sizes' short rows: every segment is reduced by
    one program, one pass, no workspace), else ``blocked`` (long segments are cut into chunks; the program
    of a segment's last chunk reduces their partials in chunk order)."""
    return "one_block" if triton_ops.one_block(call.rows, call.x.device) else "blocked"


OP = Condition("op", ask_op, ("reduce", "adjoint"))
BACKEND = Condition("backend", ask_backend, ("triton", "torch"))
REDUCE = Condition("reduce", ask_reduce, REDUCTIONS)
EXTREME = Condition("extreme", ask_extreme, ("max", "min"))
GRAD = Condition("grad", ask_grad, ("infer", "train"))
INDEX = Condition("index", ask_index, ("offsets", "ids"))
ROWS = Condition("rows", ask_rows, ("one_block", "blocked"))


# ------------------------------------------------------------------------------------------------ route bodies


def _shape(call: SegmentCall, out: torch.Tensor) -> torch.Tensor:
    return out.reshape(call.num_segments, *call.x.shape[1:])


def _x2(call: SegmentCall) -> torch.Tensor:
    return call.x.reshape(call.rows, call.columns)


def _forward(call: SegmentCall, want_arg: bool, detach: bool = False):
    """The forward custom op on the call's index form: ``(out, arg, csr)`` (see ``autograd``)."""
    x2 = _x2(call).detach() if detach else _x2(call)
    return segment_forward(x2, call.offsets, call.ids, call.num_segments, call.reduce, call.empty, want_arg,
                           call.host_checked)


def triton_infer(call: SegmentCall) -> torch.Tensor:
    """Triton forward kernel (segments cut into chunks, register accumulation per chunk), no arg saved, no autograd
    graph."""
    call = require_call(call, "reduce")
    out, _, _ = _forward(call, False)
    return _shape(call, out)


def triton_train(call: SegmentCall) -> torch.Tensor:
    """Triton forward as a custom op whose autograd runs the Triton backward kernel; max / min save the int32
    first-occurrence arg (S, D) for it."""
    call = require_call(call, "reduce")
    out, _, _ = _forward(call, call.reduce in ("max", "min"))
    return _shape(call, out)


def _plan(call: SegmentCall, want_arg: bool):
    """The forward plan of ``call``'s signature for a direct runner, or None (decline) when an index tensor is not
    contiguous (the kernels read contiguous ones: the full path copies it)."""
    if any(t is not None and not t.is_contiguous() for t in (call.offsets, call.ids)):
        return None
    x2 = _x2(call)
    return triton_ops.forward_plan(call.rows, call.columns, call.num_segments, x2.dtype, x2.device, call.reduce,
                                   want_arg and call.reduce in ("max", "min"), call.form == "ids",
                                   call.form == "ids" and not call.host_checked, x2.stride(), call.empty)


def prepare_triton_infer(call: SegmentCall, args: tuple):
    """The direct runner of :func:`triton_infer` for every call with ``call``'s signature (a function of
    :func:`segment_reduce`'s arguments): its plan made once, then one allocation and the launches per call."""
    plan = _plan(call, False)
    if plan is None:
        return None
    if call.x.dim() == 2:  # (N, D) already: no views to make
        return lambda x, reduce, offsets, ids, *rest: plan.infer(x, offsets, ids)
    shape = (call.num_segments, *call.x.shape[1:])
    return lambda x, reduce, offsets, ids, *rest: plan.infer(x.reshape(plan.rows, plan.D), offsets,
                                                             ids).reshape(shape)


class _Prepared(torch.autograd.Function):
    """The eager training path of one signature: the forward plan, then the backward plan of its upstream
    gradient's signature (:func:`prepare_triton_train`); the same kernels on the same tensors as the custom ops
    and their autograd formula, so bitwise the same results."""

    @staticmethod
    def forward(ctx, x, offsets, ids, plan, reduce):
        out, arg, csr = plan(x.reshape(plan.rows, plan.D), offsets, ids)
        ctx.save_for_backward(offsets if ids is None else csr, ids, arg)
        ctx.plan, ctx.reduce, ctx.x_shape = plan, reduce, x.shape
        return out

    @staticmethod
    def backward(ctx, grad):
        csr, ids, arg = ctx.saved_tensors
        plan = ctx.plan
        grad = grad.contiguous()
        backward = triton_ops.backward_plan(plan.S, plan.D, ctx.x_shape[0], grad.dtype, grad.device,
                                            ctx.reduce, ids is not None, grad.stride())
        return backward(grad, csr, ids, arg).reshape(ctx.x_shape), None, None, None, None


def prepare_triton_train(call: SegmentCall, args: tuple):
    """The direct runner of :func:`triton_train` for every call with ``call``'s signature: one autograd function
    whose forward plan is made once."""
    plan = _plan(call, True)
    if plan is None:
        return None
    reduce = call.reduce
    if call.x.dim() == 2:
        return lambda x, _, offsets, ids, *rest: _Prepared.apply(x, offsets, ids, plan, reduce)
    shape = (call.num_segments, *call.x.shape[1:])
    return lambda x, _, offsets, ids, *rest: _Prepared.apply(x, offsets, ids, plan, reduce).reshape(shape)


def triton_adjoint(call: SegmentCall) -> torch.Tensor:
    """Triton forward recomputing the first-occurrence arg (nothing saved by the caller), then the Triton backward
    kernel: the same two custom ops as the autograd path, so bitwise equal to it."""
    call = require_call(call, "adjoint")
    _, arg, csr = _forward(call, True, detach=True)
    grad = call.grad_output.reshape(call.num_segments, call.columns).contiguous()
    csr = call.offsets if call.offsets is not None else csr
    return segment_backward(grad, csr, call.ids, arg, call.reduce, call.rows).reshape(call.x.shape)


def torch_reduce(call: SegmentCall) -> torch.Tensor:
    """PyTorch backend (segment_reduce sums; first-occurrence gather for max / min); autograd when training."""
    return _shape(call, torch_ops.segment_reduce(call))


def torch_adjoint(call: SegmentCall) -> torch.Tensor:
    """PyTorch backend: recompute the first-occurrence arg, scatter the upstream gradient there."""
    return torch_ops.extreme_backward(call).reshape(call.x.shape)


def _triton_reduce_subtree() -> Branch:
    """Inference branches on the shape regime (the forward is the whole cost; the regime decides the passes: the
    forward reads CSR offsets in both index forms); training branches on the index form (the backward kernel looks
    rows' segments up by form)."""
    def grads(reduce: str) -> Branch:
        return Branch(GRAD, {
            "infer": Branch(ROWS, {rows: Route(f"segment.triton.{reduce}.infer.{rows}", triton_infer,
                                               prepare_triton_infer) for rows in ROWS.outcomes}),
            "train": Branch(INDEX, {index: Route(f"segment.triton.{reduce}.train.{index}", triton_train,
                                                 prepare_triton_train) for index in INDEX.outcomes}),
        })

    return Branch(REDUCE, {reduce: grads(reduce) for reduce in REDUCTIONS})


TREE = Tree(
    "segment",
    Branch(OP, {
        "reduce": Branch(BACKEND, {
            "triton": _triton_reduce_subtree(),
            "torch": Branch(REDUCE, {reduce: Route(f"segment.torch.{reduce}", torch_reduce) for reduce in REDUCTIONS}),
        }),
        "adjoint": Branch(BACKEND, {
            "triton": Branch(EXTREME, {extreme: Route(f"segment.triton.{extreme}_backward", triton_adjoint)
                                       for extreme in EXTREME.outcomes}),
            "torch": Branch(EXTREME, {extreme: Route(f"segment.torch.{extreme}_backward", torch_adjoint)
                                      for extreme in EXTREME.outcomes}),
        }),
    }),
)


# ---------------------------------------------------------------------------------------------- entry points


def _entry(op: str, finish=None) -> Entry:
    return Entry(TREE, functools.partial(check, op), functools.partial(bind, op), finish)


REDUCE = _entry("reduce", lambda call, out: validate.poison(call.flag, out))
ADJOINT = _entry("adjoint")


def segment_reduce(
    x: torch.Tensor,
    reduce: str,
    *,
    offsets: Optional[torch.Tensor] = None,
    ids: Optional[torch.Tensor] = None,
    num_segments: Optional[int] = None,
    empty: float = 0.0,
    use_triton: bool = True,
) -> torch.Tensor:
    """Reduce the rows of ``x`` (N, ...) over sorted segments: (S, *x.shape[1:]) in ``x.dtype``.

    ``reduce``: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``. Exactly one of ``offsets`` (CSR, (S+1,), starting
    at 0, ending at N, non-decreasing) and ``ids`` (sorted, (N,), in [0, num_segments)); without
    ``num_segments`` the ids form reads S = ids[-1] + 1 (one host sync). Empty segments give ``empty`` (0, +-inf,
    NaN or a float in float32's normal range) and no gradient. max / min send the whole upstream gradient to the
    first row holding the extreme value, whatever its sign; NaN propagates and the first NaN is the arg. Sums
    accumulate in float32 (float64 for float64). Runs the Triton kernels when ``use_triton`` and Triton can run on
    the device, else PyTorch.
    """
    if ids is not None and num_segments is None:  # S read from the ids' values: not a signature of metadata
        return REDUCE.uncached(x, reduce, offsets, ids, num_segments, empty, use_triton)
    return REDUCE(x, reduce, offsets, ids, num_segments, empty, use_triton)


def _adjoint(reduce, grad_output, x, offsets, ids, use_triton) -> torch.Tensor:
    sized = ids is not None and isinstance(grad_output, torch.Tensor) and grad_output.dim()
    num_segments = grad_output.shape[0] if sized else None  # the ids form takes S from grad_output
    if ids is not None and num_segments is None:  # grad_output is not a tensor: the full path names the error
        return ADJOINT.uncached(x, reduce, offsets, ids, None, 0.0, use_triton, grad_output)
    return ADJOINT(x, reduce, offsets, ids, num_segments, 0.0, use_triton, grad_output)


def segment_max_backward(grad_output: torch.Tensor, x: torch.Tensor, *, offsets: Optional[torch.Tensor] = None,
                         ids: Optional[torch.Tensor] = None, use_triton: bool = True) -> torch.Tensor:
    """The gradient of ``segment_reduce(x, "max", ...)`` for upstream ``grad_output`` (S, *x.shape[1:]):
    grad_x (N, ...) in x.dtype, recomputing the first-occurrence arg from ``x`` (nothing saved). S is
    ``grad_output.shape[0]``. Bitwise equal to the autograd gradient of the same backend."""
    return _adjoint("max", grad_output, x, offsets, ids, use_triton)


def segment_min_backward(grad_output: torch.Tensor, x: torch.Tensor, *, offsets: Optional[torch.Tensor] = None,
                         ids: Optional[torch.Tensor] = None, use_triton: bool = True) -> torch.Tensor:
    """The gradient of ``segment_reduce(x, "min", ...)``; see :func:`segment_max_backward`."""
    return _adjoint("min", grad_output, x, offsets, ids, use_triton)
