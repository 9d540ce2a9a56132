"""One allocation helper for every family's outputs and workspaces.

Kernels allocate with :func:`empty` (never ``torch.empty`` directly), so that a verifier can switch on
:func:`poisoned`: inside it, float allocations are filled with NaN and integer ones with :data:`POISON_INT`
instead of left uninitialised, and a kernel that forgets to write an element produces a visible wrong result
instead of whatever the allocator handed back.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Sequence

import torch

POISON_INT = -0x5EED  # a value no index, count or backpointer can hold

_POISON: contextvars.ContextVar[bool] = contextvars.ContextVar("_POISON", default=False)


def empty(shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape)``, or a poisoned tensor (NaN / :data:`POISON_INT`; ``True`` for bool) inside
    :func:`poisoned`."""
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    if _POISON.get():
        if out.is_floating_point():
            out.fill_(float("nan"))
        elif dtype == torch.bool:
            out.fill_(True)
        else:
            out.fill_(POISON_INT if torch.iinfo(dtype).min < 0 else torch.iinfo(dtype).max)
    return out


def empty_like(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`empty` with the shape and device of ``x`` (and its dtype unless ``dtype`` is given), contiguous."""
    if dtype is not None or _POISON.get():
        return empty(x.shape, dtype=x.dtype if dtype is None else dtype, device=x.device)
    return torch.empty_like(x, memory_format=torch.contiguous_format)  # the fastest allocation: host time per call


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Poison every :func:`empty` allocation made inside the block (used by ``sentinel verify``)."""
    token = _POISON.set(True)
    try:
        yield
    finally:
        _POISON.reset(token)
