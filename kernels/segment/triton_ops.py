"""Triton host side of the segment reductions: plans, launch configuration, allocation, launches.

``forward(x2, csr, ids, reduce, empty, want_arg) -> (out (S, D), arg)`` and
``backward(grad (S, D), csr, ids, arg, reduce, rows) -> grad_x (N, D)``, on a 2-D view ``x2`` (N, D) of ``x``
(any strides). ``arg`` (S, D) int32 is the row of the first maximum (minimum) per (segment, column), written
for max / min when ``want_arg`` (-1 for empty segments); it is a (0,) placeholder otherwise. Every allocation
goes through :func:`provable_kernels.alloc.empty`.

Forward plan (:func:`plan`, from the shapes only, so no host sync): segments are cut into chunks of at most
``chunk`` rows (a power of two from the row count alone, so that about ``TARGET_PROGRAMS`` chunks of rows exist
whatever the segment lengths: one 16M-row segment fills the GPU like many short ones). The chunk list is built
on the device (:func:`_chunks`: chunks per segment, an exclusive cumsum, a ``searchsorted``): no host sync; the
grid is the static bound S + ceil(N / chunk) chunks. A tile of ``CHUNK_TILE`` elements has ``block_d`` columns
and ``lanes x groups`` rows: ``lanes`` per chunk (the average segment length over ``ROWS_PER_LANE``, a power of
two: each lane reduces a few rows of a chunk, so short chunks do not leave lanes idle), ``groups`` chunks per
program, so short segments share a program and long ones read ``lanes`` rows per step. Both constants were chosen
by a sweep on an H100 (benchmarks/NOTES-segment.md). The combine pass reads
partials the same way (``combine_lanes`` per segment: the average number of chunks per segment). With N <= chunk
no segment spans chunks and the combine pass is not launched. Under the interpreter the tiles hold
``INTERPRETED_LANES`` rows, so that the small verification cases run every path large GPU problems take (several
steps per chunk, several chunks per program, multi-chunk segments).

The backward keeps its own tile (:func:`backward_tile`): one program per (tile of rows, column block).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from provable_kernels import alloc
from provable_kernels.launch import launcher
from provable_kernels.segment.triton_segment import (
    segment_backward_kernel,
    segment_chunk_count_kernel,
    segment_chunk_kernel,
    segment_combine_kernel,
)

TILE = 4096  # elements of one (rows, columns) tile of the combine pass and of the backward
CHUNK_TILE = 1024  # elements of the chunk kernel's tile (4096 held 144 registers for max: 1.4-2.1x slower)
ROWS_PER_LANE = {False: 4, True: 8}  # chunk-kernel lanes = average segment length / this (sum and mean; max, min)
MAX_BLOCK_D = 128
MIN_ROWS = 16  # the shortest chunk (and the backward's shortest tile)
MAX_CHUNK = 4096  # the longest chunk: 16 steps of the widest combine lane count (TILE // 16 at D <= 16)
TARGET_PROGRAMS = 4096  # chunks of rows wanted (per column block): enough to fill a GPU with one long segment
BACKWARD_BLOCKS = 4096  # the backward's row tiles are sized as if for this many row blocks
BOUNDARY_WINDOW = 32  # CSR boundaries compared per step when the backward's rows find their segment
COUNT_SEGMENTS = 1024  # segments per program of the chunk count
INTERPRETED_LANES = 8  # the interpreter's plan: lanes x groups of a tile
INTERPRETED_TILE_ROWS = MIN_ROWS // 2  # the interpreter's backward tile: two tiles per smallest row block
REDUCE_CODE = {"sum": 0, "mean": 1, "max": 2, "min": 3}


@dataclass(frozen=True)
class Plan:
    """Forward launch shape: chunks of at most ``chunk`` rows; tiles of (``lanes`` x ``groups``, ``block_d``):
    ``lanes`` rows of each of ``groups`` chunks per step; the combine pass reads ``combine_lanes`` partials of each
    of ``combine_groups`` segments per step."""

    chunk: int
    lanes: int
    groups: int
    combine_lanes: int
    combine_groups: int
    block_d: int

    def max_chunks(self, N: int, S: int) -> int:
        """The static bound on the number of chunks: one per segment plus one per ``chunk`` rows."""
        return S + triton.cdiv(N, self.chunk)

    def column_blocks(self, D: int) -> int:
        return triton.cdiv(D, self.block_d)


def _block_d(D: int) -> int:
    return min(triton.next_power_of_2(max(D, 1)), MAX_BLOCK_D)


def chunk_rows(N: int, D: int) -> int:
    """Rows per chunk: a power of two with about TARGET_PROGRAMS chunks of rows per column block, in
    [MIN_ROWS, MAX_CHUNK] (the same on every device: it decides the shape regime)."""
    per_column_block = triton.cdiv(max(N, 1) * triton.cdiv(max(D, 1), _block_d(D)), TARGET_PROGRAMS)
    return min(max(triton.next_power_of_2(per_column_block), MIN_ROWS), MAX_CHUNK)


@functools.lru_cache(maxsize=4096)
def plan(N: int, D: int, S: int, extreme: bool = False, interpreted: bool = False) -> Plan:
    """The :class:`Plan` for N rows of D columns in S segments (memoised: host overhead per call); ``extreme``
    for max / min (fewer lanes per chunk: see ``ROWS_PER_LANE``). ``interpreted`` (CPU tensors, the Triton
    interpreter): the same chunks, tiles of INTERPRETED_LANES rows."""
    block_d = _block_d(D)
    chunk = chunk_rows(N, D)
    tile_rows = INTERPRETED_LANES if interpreted else CHUNK_TILE // block_d
    combine_rows = INTERPRETED_LANES if interpreted else TILE // block_d
    average = triton.next_power_of_2(max(triton.cdiv(N, max(S, 1)), 1))
    lanes = max(1, min(average // ROWS_PER_LANE[extreme], tile_rows, chunk))
    combine_lanes = min(triton.next_power_of_2(max(triton.cdiv(N, chunk * max(S, 1)), 1)), combine_rows)
    return Plan(chunk, lanes, tile_rows // lanes, combine_lanes, combine_rows // combine_lanes, block_d)


def one_block(N: int, D: int) -> bool:
    """True when every segment fits one chunk (N <= chunk rows): one pass, no combine (the same on every
    device)."""
    return N <= chunk_rows(N, D)


@functools.lru_cache(maxsize=4096)
def backward_tile(N: int, D: int, interpreted: bool = False) -> tuple[int, int]:
    """(rows, columns) of the backward's tile: TILE elements, fewer rows for small N (as if N were cut into
    BACKWARD_BLOCKS blocks of at least MIN_ROWS rows); INTERPRETED_TILE_ROWS rows under the interpreter."""
    block_d = _block_d(D)
    rows = min(TILE // block_d, max(triton.next_power_of_2(triton.cdiv(max(N, 1), BACKWARD_BLOCKS)), MIN_ROWS))
    return (INTERPRETED_TILE_ROWS if interpreted else rows), block_d


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, object]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _first_segments(csr: Tensor, ids: Optional[Tensor], starts: Tensor) -> Tensor:
    """Segment of each row in ``starts`` (int32): ``ids[start]``, or the last s with ``csr[s] <= start``."""
    if ids is not None:
        return ids[starts].to(torch.int32)
    return (torch.searchsorted(csr, starts.to(csr.dtype), right=True) - 1).to(torch.int32)


def _unit_stride(csr: Tensor, ids: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """``csr`` and ``ids`` contiguous: the kernels read them with stride 1 (a strided or expanded view would be
    read out of bounds)."""
    return csr.contiguous(), None if ids is None else ids.contiguous()


def _chunks(csr: Tensor, S: int, grid_chunks: int, chunk: int) -> tuple[Tensor, Tensor]:
    """On the device, no host sync: ``first`` (S+1,) int32, segment s's first chunk (``first[S]``: the number of
    chunks; a segment has max(1, ceil(len / chunk)) chunks), and ``chunk_seg`` (grid_chunks,) int32, the segment of
    each chunk the grid covers (S past the last real chunk). One counting kernel, an in-place cumsum, a
    searchsorted."""
    first = alloc.empty((S + 1,), dtype=torch.int32, device=csr.device)
    launcher(segment_chunk_count_kernel)[(triton.cdiv(S + 1, COUNT_SEGMENTS),)](
        csr, first, S, R=chunk, BS=COUNT_SEGMENTS, num_warps=4)
    first.cumsum_(0)
    chunk_ids = torch.arange(grid_chunks, dtype=torch.int32, device=csr.device)
    return first, torch.searchsorted(first[1:], chunk_ids, right=True, out_int32=True)


def forward(x2: Tensor, csr: Tensor, ids: Optional[Tensor], reduce: str, empty: float,
            want_arg: bool) -> tuple[Tensor, Tensor]:
    """Reduce the rows of ``x2`` (N, D) per segment: ``(out (S, D) in x2.dtype, arg)`` (see the module doc).
    The forward reads only the CSR offsets (``ids`` was turned into them on the device by the caller)."""
    csr = csr.contiguous()
    N, D = x2.shape
    S = csr.numel() - 1
    device = x2.device
    want_arg = want_arg and reduce in ("max", "min")
    out = alloc.empty((S, D), dtype=x2.dtype, device=device)
    arg = alloc.empty((S, D) if want_arg else (0,), dtype=torch.int32, device=device)
    if S == 0 or D == 0:
        return out, arg
    acc_torch, acc = _acc(x2.dtype)
    code = REDUCE_CODE[reduce]
    p = plan(N, D, S, code >= 2, device.type == "cpu")
    max_chunks, column_blocks = p.max_chunks(N, S), p.column_blocks(D)
    programs = triton.cdiv(max_chunks, p.groups)
    first, chunk_seg = _chunks(csr, S, programs * p.groups, p.chunk)
    split = not one_block(N, D)  # some segment may span chunks: partials and the combine pass
    part_v = alloc.empty((max_chunks, D) if split else (0,), dtype=acc_torch, device=device)
    part_i = alloc.empty((max_chunks, D) if split and code >= 2 else (0,), dtype=torch.int32, device=device)
    empty_value = torch.full((1,), empty, dtype=x2.dtype, device=device)
    launcher(segment_chunk_kernel)[(programs, column_blocks)](
        x2, csr, first, chunk_seg, empty_value, out, arg, part_v, part_i, D, S, x2.stride(0), x2.stride(1),
        R=p.chunk, G=p.groups, L=p.lanes, BD=p.block_d, REDUCE=code, STORE_ARG=want_arg, ACC=acc, num_warps=4)
    if split:
        launcher(segment_combine_kernel)[(triton.cdiv(S, p.combine_groups), column_blocks)](
            csr, first, part_v, part_i, out, arg, D, S, G=p.combine_groups, L=p.combine_lanes, BD=p.block_d,
            REDUCE=code, STORE_ARG=want_arg, ACC=acc, num_warps=4)
    return out, arg


def backward(grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Optional[Tensor], reduce: str,
             rows: int) -> Tensor:
    """grad_x (rows, D) in grad.dtype from the upstream gradient ``grad`` (S, D); max / min need ``arg``."""
    csr, ids = _unit_stride(csr, ids)
    S, D = grad.shape
    gx = alloc.empty((rows, D), dtype=grad.dtype, device=grad.device)
    if rows == 0 or D == 0:
        return gx
    block_n, block_d = backward_tile(rows, D, grad.device.type == "cpu")
    tile_seg = _first_segments(csr, ids, torch.arange(0, rows, block_n, device=grad.device))
    code = REDUCE_CODE[reduce]
    launcher(segment_backward_kernel)[(triton.cdiv(rows, block_n), triton.cdiv(D, block_d))](
        grad, ids if ids is not None else csr, csr, tile_seg, arg if code >= 2 else gx, gx, rows, D, S,
        grad.stride(0), grad.stride(1), BN=block_n, BD=block_d, BK=BOUNDARY_WINDOW, IDS=ids is not None,
        REDUCE=code, ACC=_acc(grad.dtype)[1], num_warps=4)
    return gx
