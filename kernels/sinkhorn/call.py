"""The Sinkhorn call every route receives, and its validation (imports no backend).

``sinkhorn(x, iters=20, domain="log", eps=1e-6, *, use_triton=True, return_residual=False)``: ``x`` is (..., n, n)
float32, float64, bfloat16 or float16, any number of leading dims (none included), n >= 1; ``iters`` an int >= 1;
``domain`` ``"log"`` or ``"prob"``; ``eps`` 0 or a real number in float32's normal range 2**-126 .. 2**127 (used by
``"prob"`` only); ``use_triton`` and ``return_residual`` bools. -inf entries are allowed. NaN or +inf in ``x``
follows the host-sync policy (:func:`validate.host_reads_allowed`): in host mode a ``ValueError`` (one host read,
before any work); in device mode no check here: every backend returns NaN for each matrix that holds one, and NaN
gradients for it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
import torch

from provable_kernels import validate

DOMAINS = ("log", "prob")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1.5 us more host time per construction
class SinkhornCall:
    """A validated call: ``x`` (..., n, n), ``iters`` >= 1, ``domain``, ``eps`` >= 0, ``use_triton``,
    ``residual`` (the routes return ``(out, residual)``). Read-only by convention."""

    x: torch.Tensor
    iters: int
    domain: str
    eps: float
    use_triton: bool
    residual: bool = False

    @property
    def n(self) -> int:
        return self.x.shape[-1]


def check(x: object, iters: object = 20, domain: object = "log", eps: object = 1e-6,
          use_triton: object = True, return_residual: object = False) -> tuple[int, str, float]:
    """The metadata checks of a call (shapes, dtypes and types; no values read), naming the argument on error;
    returns ``(iters, domain, eps)`` normalised."""
    x = validate.tensor("x", x, dtypes=DTYPES)
    if x.dim() < 2:
        raise ValueError(f"x must have at least 2 dims (..., n, n), got shape {tuple(x.shape)}")
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"x must be square in its last two dims (..., n, n), got shape {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have n >= 1 in its last two dims (..., n, n), got shape {tuple(x.shape)}")
    iters = validate.positive_int("iters", iters)
    domain = validate.choice("domain", domain, DOMAINS)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number >= 0, got {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    if eps and not 2.0 ** -126 <= eps <= 2.0 ** 127:  # the kernels take eps as float32 halves
        raise ValueError(f"eps must be 0 or lie in 2**-126 .. 2**127 (float32's normal range), got {eps}")
    for name, flag in (("use_triton", use_triton), ("return_residual", return_residual)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return iters, domain, eps


def bind(meta: tuple[int, str, float], x: torch.Tensor, iters: object, domain: object, eps: object,
         use_triton: bool, return_residual: bool = False) -> SinkhornCall:
    """The call of arguments that passed :func:`check` (``meta``: its result), after the value checks of the
    host-sync policy (NaN/+inf in ``x``: one host read in host mode only, see the module docstring)."""
    if validate.host_reads_allowed(x):  # host mode: one host read, a named error before any work
        validate.finite("x", x, allow_neg_inf=True)
    return SinkhornCall(x, *meta, use_triton, return_residual)


def make_call(x: object, iters: object = 20, domain: object = "log", eps: object = 1e-6,
              use_triton: object = True, return_residual: object = False) -> SinkhornCall:
    """Validate the arguments (:func:`check`, then :func:`bind`) and return the call."""
    meta = check(x, iters, domain, eps, use_triton, return_residual)
    return bind(meta, x, iters, domain, eps, use_triton, return_residual)


require_call = validate.requirer(SinkhornCall, "provable_kernels.sinkhorn.call.make_call")
