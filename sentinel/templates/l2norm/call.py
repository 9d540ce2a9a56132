"""The l2norm call every route receives, and its validation (imports no backend).

``l2norm(x, *, use_triton=True)``: ``x`` is (..., cols) float32 or float64, at least 1-D, cols >= 1; ``use_triton`` a bool.
NaN or +inf in ``x`` follows the host-sync policy (``provable_kernels.validate.host_reads_allowed``): in host mode
(CPU tensors) a ``ValueError`` naming ``x``; in device mode (CUDA) no check, and a row holding one comes out NaN.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from provable_kernels import validate

EPS = 1e-6  # added to each row's sum of squares: a zero row gives zeros, never NaN


@dataclass(slots=True)
class L2normCall:
    """A validated call: ``x`` (..., cols) and ``use_triton``. Read-only by convention."""

    x: torch.Tensor
    use_triton: bool


def check(x: object, use_triton: object = True) -> None:
    """The metadata checks of a call (types, rank, dtype; no values read), naming the argument on error."""
    x = validate.tensor("x", x, dtypes=validate.FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dim (..., cols), got a 0-D tensor")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have cols >= 1 in its last dim, got shape {tuple(x.shape)}")
    if not isinstance(use_triton, bool):
        raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")


def bind(meta: None, x: torch.Tensor, use_triton: bool) -> L2normCall:
    """The call of arguments that passed :func:`check`, after the value checks of the host-sync policy."""
    if validate.host_reads_allowed(x):
        validate.finite("x", x)
    return L2normCall(x, use_triton)


def make_call(x: object, use_triton: object = True) -> L2normCall:
    """Validate the arguments (:func:`check`, then :func:`bind`) and return the call."""
    return bind(check(x, use_triton), x, use_triton)


require_call = validate.requirer(L2normCall, f"{__name__}.make_call")
