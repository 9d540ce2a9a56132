"""One allocation helper for every family's outputs and workspaces.

Kernels allocate with :func:`empty` (never ``torch.empty`` directly), so that a verifier can switch on
:func:`poisoned`: inside it, float allocations are filled with NaN and integer ones with :data:`POISON_INT`
instead of left uninitialised, and a kernel that forgets to write an element produces a visible wrong result
instead of whatever the allocator handed back. A launch's workspaces are kept between calls (:class:`Workspaces`:
no allocation per call); scratch, which the launch writes before it reads, is poisoned afresh inside
:func:`poisoned` like every other allocation. Where NaN is itself a correct output (a bad input in device
mode), a second, finite poison (``poisoned(alternate=True)``) tells an unwritten element from a written NaN: two
runs under the two poisons give the same bits exactly when every element is written.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
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
KEEP_BYTES = 16 * 2**20  # scratch above this is allocated per call: its launch runs far longer than an allocation,
                         # and a kept buffer would hold the memory from the caller's other tensors for good


class Workspaces:
    """The buffers one launch uses besides its outputs, made once per launch configuration:
    ``Workspaces(device, (name, numel, dtype, zeroed), ...)()`` returns one 1-D buffer of at least ``numel``
    elements (at least 1) per need, in order. Each is kept per (``name``, dtype, device, current stream) between
    calls and replaced by a larger one when too small. Kernels on one stream run one after another, so the calls on
    a stream share it; each stream has its own (on the CPU, each thread). Without ``zeroed`` a buffer is scratch,
    which every launch writes before it reads: uninitialised, and inside :func:`poisoned` a fresh poisoned
    allocation at every call (a read before a write shows); scratch over :data:`KEEP_BYTES` is never kept. With
    ``zeroed`` it is state that carries from call to call (zeros when new), never poisoned. While a CUDA graph is
    captured: fresh buffers (the graph's own, zeroed at every replay with ``zeroed``)."""

    __slots__ = ("device", "cuda", "needs")

    def __init__(self, device: torch.device, *needs: tuple[str, int, torch.dtype, bool]):
        self.device, self.cuda = device, device.type == "cuda"
        self.needs = tuple((max(numel, 1), dtype, (name, dtype, device), zeroed,
                            zeroed or max(numel, 1) * dtype.itemsize <= KEEP_BYTES)
                           for name, numel, dtype, zeroed in needs)

    def __call__(self) -> list[torch.Tensor]:
        # on the CPU (the interpreter) threads, not streams, run launches side by side
        stream = self._stream() if self.cuda else threading.get_ident()
        if stream is None:  # verify: unreached (CUDA-graph capture: tests/test_gpu_call_path.py)
            return [self._new(size, dtype, zeroed) for size, dtype, _, zeroed, _ in self.needs]
        poisoning = _POISON.get() is not None
        buffers = []
        for size, dtype, key, zeroed, kept in self.needs:
            if not kept or (poisoning and not zeroed):
                buffers.append(empty((size,), dtype=dtype, device=self.device))
                continue
            found = _KEPT.get((key, stream))
            if found is None or found.numel() < size:
                found = _KEPT[key, stream] = self._new(size, dtype, zeroed)
            buffers.append(found)
        return buffers

    def _stream(self) -> Optional[int]:  # verify: unreached (CUDA only: the GPU records, tests/test_gpu_call_path.py)
        """The current CUDA stream of the device, None while a CUDA graph is captured on it."""
        if torch._C._cuda_isCurrentStreamCapturing():
            return None
        return torch._C._cuda_getCurrentRawStream(self.device.index)

    def _new(self, size: int, dtype: torch.dtype, zeroed: bool) -> torch.Tensor:
        if zeroed:
            return torch.zeros((size,), dtype=dtype, device=self.device)
        return empty((size,), dtype=dtype, device=self.device)


def drop_workspaces(name: str) -> None:
    """Forget every kept :class:`Workspaces` buffer of ``name`` (the next call gets a new one)."""
    for key in [key for key in _KEPT if key[0][0] == name]:
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
