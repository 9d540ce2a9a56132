"""Argument checks shared by every public function.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device, range, values)
with a message that names the argument and says what was expected.
"""
from __future__ import annotations

import operator
from typing import Iterable, Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)


def tensor(
    name: str,
    x: object,
    *,
    ndim: Optional[int | Sequence[int]] = None,
    dtypes: Optional[Iterable[torch.dtype]] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Check that ``x`` is a tensor with the given rank, one of ``dtypes``, on ``device``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(f"{n}-D" for n in allowed)
            raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if x.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs, got {x.device}")
    return x


def shape(name: str, x: torch.Tensor, expected: Sequence[int], meaning: str) -> None:
    """Check ``x.shape == expected``; ``meaning`` spells the expected shape, e.g. ``"(B, T+1, C)"``."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {meaning} = {tuple(expected)}, got {tuple(x.shape)}")


def positive_int(name: str, value: object) -> int:
    """An integer >= 1: a Python int, a NumPy integer or a 0-d integer tensor (bool is rejected)."""
    try:
        if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def choice(name: str, value: object, options: Sequence[str]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")
    return value  # type: ignore[return-value]


def lengths(name: str, x: object, batch: int, max_length: int, device: torch.device) -> torch.Tensor:
    """Integer lengths (B,) with 1 <= L <= max_length, on ``device``."""
    x = tensor(name, x, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    shape(name, x, (batch,), "(B,)")
    if batch and (int(x.min()) < 1 or int(x.max()) > max_length):
        raise ValueError(f"{name} must lie in 1..{max_length}, got min {int(x.min())}, max {int(x.max())}")
    return x


def finite(name: str, x: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    """Reject NaN (and +inf; -inf too unless ``allow_neg_inf``)."""
    bad = torch.isnan(x) | (x == float("inf"))
    if not allow_neg_inf:
        bad |= x == float("-inf")
    if bool(bad.any()):
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name} contains {what} (at index {tuple(bad.nonzero()[0].tolist())})")
