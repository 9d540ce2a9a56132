"""l2norm dispatch: the backend condition, the route bodies, the decision tree (data) and the entry point.

:func:`l2norm` is a ``provable_kernels.runtime.Entry``: the first call of a signature validates, walks
:data:`TREE` (which records the route taken) and lets the route prepare a direct runner; a repeat call is a
dictionary lookup and that runner.
"""
from __future__ import annotations

import torch

from provable_kernels.dispatch import Branch, Condition, Route, Tree, triton_usable
from provable_kernels.runtime import Entry

from . import autograd, torch_ops
from .call import L2normCall, bind, check, require_call


def ask_backend(call: L2normCall) -> str:
    """``triton`` when the caller allows it (``use_triton=True``) and Triton runs on ``x``'s device (CUDA, or the
    CPU under ``TRITON_INTERPRET=1``); otherwise ``torch``."""
    return "triton" if call.use_triton and triton_usable(call.x.device) else "torch"


def triton_rows(call: L2normCall) -> torch.Tensor:
    """The forward kernel as a custom op, one program per row; the backward kernel is its gradient."""
    return autograd.l2norm_forward(require_call(call).x)


def prepare_triton_rows(call: L2normCall, args: tuple):
    """The direct runner of :func:`triton_rows` for every call with ``call``'s signature (a function of
    :func:`l2norm`'s arguments), its launches made once."""
    run = autograd.prepare(call.x)
    return lambda x, use_triton: run(x)


def torch_rows(call: L2normCall) -> torch.Tensor:
    """The PyTorch formula, differentiated by autograd."""
    return torch_ops.l2norm(call)


TREE = Tree("l2norm", Branch(Condition("backend", ask_backend, ("triton", "torch")), {
    "triton": Route("l2norm.triton.rows", triton_rows, prepare_triton_rows),
    "torch": Route("l2norm.torch.rows", torch_rows),
}))

ENTRY = Entry(TREE, check, bind)


def l2norm(x: torch.Tensor, *, use_triton: bool = True) -> torch.Tensor:
    """Each row of ``x`` (..., cols) divided by ``sqrt(sum(x**2) + 1e-6)``; float32 or float64, differentiable.
    ``use_triton=False`` forces the PyTorch backend."""
    return ENTRY(x, use_triton)
