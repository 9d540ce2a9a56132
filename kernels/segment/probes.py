"""Test kernels of the segment registration: one-program Triton kernels that run a ``@triton.jit`` helper of
``triton_segment`` alone, so that a property can hold it against its documented rule (``oracle``). No route runs
them; they are verification code kept in the library so that ``sentinel verify`` can run them on any device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from provable_kernels.segment.triton_segment import chunk_rows


@triton.jit
def _chunk_rows_kernel(lengths_ptr, out_ptr, K: tl.constexpr, MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr,
                       TARGET: tl.constexpr):
    k = tl.arange(0, K)
    tl.store(out_ptr + k, chunk_rows(tl.load(lengths_ptr + k), MIN_CHUNK, DOUBLINGS, TARGET))


def chunk_rows_of(lengths: list[int], min_chunk: int, doublings: int, target: int,
                  device: torch.device) -> list[int]:
    """``triton_segment.chunk_rows`` of each of ``lengths`` (segment rows, ints >= 0) with the given sizes, run in
    one program on ``device``."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lengths):  # verify: unreached (tests)
        raise ValueError(f"lengths must be ints >= 0, got {list(lengths)}")
    K = triton.next_power_of_2(max(len(lengths), 1))
    n = torch.tensor(list(lengths) + [0] * (K - len(lengths)), dtype=torch.int32, device=device)
    out = torch.empty_like(n)
    _chunk_rows_kernel[(1,)](n, out, K=K, MIN_CHUNK=min_chunk, DOUBLINGS=doublings, TARGET=target)
    return out[:len(lengths)].tolist()
