"""One allocation helper for every family's outputs and workspaces.

Kernels allocate with :func:`empty` (never ``torch.empty`` directly), so that a verifier can switch on
:func:`poisoned`: inside it, float allocations are filled with NaN and integer ones with :data:`POISON_INT`
instead of left uninitialised, and a kernel that forgets to write an element produces a visible wrong result
instead of whatever the allocator handed back. Workspaces that a launch writes before it reads are kept between
calls (:func:`workspace`: no allocation per call) and poisoned afresh inside :func:`poisoned` like every other
allocation. Where NaN is itself a correct output (a bad input in device
mode), a second, finite poison (``poisoned(alternate=True)``) tells an unwritten element from a written NaN: two
runs under the two poisons give the same bits exactly when every element is written.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional, Sequence

import torch

POISON_INT = -0x5EED  # a value no index, count or backpointer can hold
POISONS = ((float("nan"), POISON_INT, True),  # (float, integer, bool) fills of poisoned() and poisoned(alternate=True)
           (float(POISON_INT), -POISON_INT, False))

_POISON: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("_POISON", default=None)


def empty(shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape)``, or inside :func:`poisoned` a tensor filled with its poison (:data:`POISONS`;
    unsigned integers modulo their range)."""
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    fill = _POISON.get()
    if fill is not None:
        number, integer, flag = fill
        if out.is_floating_point():
            out.fill_(number)
        elif dtype == torch.bool:
            out.fill_(flag)
        else:
            out.fill_(integer if torch.iinfo(dtype).min < 0 else integer % (torch.iinfo(dtype).max + 1))
    return out


def empty_like(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`empty` with the shape and device of ``x`` (and its dtype unless ``dtype`` is given), contiguous."""
    if dtype is not None or _POISON.get() is not None:
        return empty(x.shape, dtype=x.dtype if dtype is None else dtype, device=x.device)
    return torch.empty_like(x, memory_format=torch.contiguous_format)  # the fastest allocation: host time per call


_KEPT: dict[tuple, torch.Tensor] = {}


def workspace(numel: int, *, dtype: torch.dtype, device: torch.device, name: str,
              zeroed: bool = False) -> torch.Tensor:
    """A 1-D buffer of at least ``numel`` elements (at least 1) for one launch, kept per (``name``, dtype, device,
    current stream) between calls and replaced by a larger one when too small. Kernels on one stream run one after
    another, so the calls on a stream share it; each stream has its own. Without ``zeroed`` it is scratch, which
    every launch writes before it reads: uninitialised, and inside :func:`poisoned` a fresh poisoned allocation at
    every call (a read before a write shows). With ``zeroed`` it is state that carries from call to call (zeros when
    new), never poisoned. While a CUDA graph is captured: a fresh buffer (the graph's own, zeroed at every replay
    with ``zeroed``)."""
    size = max(numel, 1)
    stream = 0
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros((size,), dtype=dtype, device=device) if zeroed else empty((size,), dtype=dtype,
                                                                                         device=device)
        stream = torch._C._cuda_getCurrentRawStream(device.index)
    if not zeroed and _POISON.get() is not None:
        return empty((size,), dtype=dtype, device=device)
    key = name, dtype, device, stream
    found = _KEPT.get(key)
    if found is None or found.numel() < size:
        found = _KEPT[key] = (torch.zeros if zeroed else torch.empty)((size,), dtype=dtype, device=device)
    return found


def drop_workspaces(name: str) -> None:
    """Forget every kept :func:`workspace` of ``name`` (the next call gets a new one)."""
    for key in [key for key in _KEPT if key[0] == name]:
        del _KEPT[key]


@contextlib.contextmanager
def poisoned(alternate: bool = False) -> Iterator[None]:
    """Poison every :func:`empty` allocation made inside the block (used by ``sentinel verify``): NaN,
    :data:`POISON_INT` and ``True``, or with ``alternate`` the finite second poison of :data:`POISONS`."""
    token = _POISON.set(POISONS[alternate])
    try:
        yield
    finally:
        _POISON.reset(token)
