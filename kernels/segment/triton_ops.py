"""Triton host side of the segment reductions: plan, launch configuration, allocation, launches.

``forward(x2, csr, ids, reduce, empty, want_arg) -> (out (S, D), arg)`` and
``backward(grad (S, D), csr, ids, arg, reduce, rows) -> grad_x (N, D)``, on a 2-D view ``x2`` (N, D) of ``x``
(any strides). ``arg`` (S, D) int32 is the row of the first maximum (minimum) per (segment, column), written
for max / min when ``want_arg`` (-1 for empty segments); it is a (0,) placeholder otherwise. Every allocation
goes through :func:`provable_kernels.alloc.empty`.

Plan (:func:`plan`, from the shapes only, so no host sync): row blocks of ``rows`` consecutive rows, about
``TARGET_BLOCKS`` of them (``MIN_ROWS`` .. ``MAX_TILES`` tiles), tiles of at most ``TILE`` elements with
``block_d`` columns (at most ``MAX_BLOCK_D``, a power of two for vector loads). The first segment of each block
(``block_seg``) is found on the device by ``searchsorted`` (offsets form) or read from ``ids``. With one block
(N <= rows) no segment spans blocks and the combine pass is not launched. Under the interpreter the tiles are
shorter than the smallest row block and the combine pass steps over two pieces at a time (see :func:`plan`).
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
from provable_kernels.segment.triton_segment import (
    segment_backward_kernel,
    segment_combine_kernel,
    segment_fill_kernel,
    segment_forward_kernel,
)

TILE = 4096  # elements of one (rows, columns) tile
MAX_BLOCK_D = 128
MIN_ROWS = 16
MAX_TILES = 16  # tiles per row block at most
TARGET_BLOCKS = 4096  # row blocks wanted: enough programs to fill a GPU with long and short segments alike
BOUNDARY_WINDOW = 32  # CSR boundaries compared per step when rows find their segment
FILL_SEGMENTS = 128  # segments per program of the empty-segment fill
COMBINE_PIECES = 4096  # elements of one tile of pieces in the combine pass
INTERPRETED_TILE_ROWS = MIN_ROWS // 2  # the interpreter's plan: two tiles per smallest row block
INTERPRETED_PIECES = 2  # the interpreter's plan: two pieces per combine step
REDUCE_CODE = {"sum": 0, "mean": 1, "max": 2, "min": 3}


@dataclass(frozen=True)
class Plan:
    """Launch shape for N rows of D columns: ``rows`` per block (a multiple of ``block_n``), tiles of
    (``block_n``, ``block_d``), and ``pieces`` block pieces per step of the combine pass."""

    rows: int
    block_n: int
    block_d: int
    pieces: int

    def blocks(self, N: int) -> int:
        return triton.cdiv(N, self.rows)

    def column_blocks(self, D: int) -> int:
        return triton.cdiv(D, self.block_d)


@functools.lru_cache(maxsize=4096)
def plan(N: int, D: int, interpreted: bool = False) -> Plan:
    """The :class:`Plan` for N rows of D columns (memoised: host overhead per call). ``interpreted`` (CPU tensors,
    the Triton interpreter): the same row blocks, but tiles of ``INTERPRETED_TILE_ROWS`` rows and
    ``INTERPRETED_PIECES`` pieces per combine step, so that the small verification cases run every path that
    large GPU problems take (a tile carry inside a row block, a combine over several steps)."""
    block_d = min(triton.next_power_of_2(max(D, 1)), MAX_BLOCK_D)
    tile_rows = TILE // block_d
    rows = min(max(triton.next_power_of_2(triton.cdiv(max(N, 1), TARGET_BLOCKS)), MIN_ROWS), tile_rows * MAX_TILES)
    if interpreted:
        return Plan(rows, INTERPRETED_TILE_ROWS, block_d, INTERPRETED_PIECES)
    return Plan(rows, min(tile_rows, rows), block_d, max(1, COMBINE_PIECES // block_d))


def one_block(N: int, D: int) -> bool:
    """True when every row lies in one row block: one pass, no workspace, no combine (the same on every
    device)."""
    return N <= plan(N, D).rows


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


def forward(x2: Tensor, csr: Tensor, ids: Optional[Tensor], reduce: str, empty: float,
            want_arg: bool) -> tuple[Tensor, Tensor]:
    """Reduce the rows of ``x2`` (N, D) per segment: ``(out (S, D) in x2.dtype, arg)`` (see the module doc)."""
    csr, ids = _unit_stride(csr, ids)
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
    if N:
        p = plan(N, D, device.type == "cpu")
        blocks, column_blocks = p.blocks(N), p.column_blocks(D)
        block_seg = _first_segments(csr, ids, torch.arange(0, N, p.rows, device=device))
        part_v = alloc.empty((blocks, 2, D), dtype=acc_torch, device=device)
        part_i = alloc.empty((blocks, 2, D) if code >= 2 else (0,), dtype=torch.int32, device=device)
        index = ids if ids is not None else csr
        segment_forward_kernel[(blocks, column_blocks)](
            x2, index, csr, block_seg, out, arg, part_v, part_i, N, D, S, x2.stride(0), x2.stride(1),
            ROWS=p.rows, BN=p.block_n, BD=p.block_d, BK=BOUNDARY_WINDOW, IDS=ids is not None, REDUCE=code,
            STORE_ARG=want_arg, ACC=acc, num_warps=4)
        if blocks > 1:
            segment_combine_kernel[(blocks - 1, column_blocks)](
                csr, block_seg, part_v, part_i, out, arg, D, ROWS=p.rows, BP=p.pieces,
                BD=p.block_d, REDUCE=code, STORE_ARG=want_arg, ACC=acc, num_warps=4)
    fill_d = min(triton.next_power_of_2(D), MAX_BLOCK_D)
    empty_value = torch.full((1,), empty, dtype=x2.dtype, device=device)
    segment_fill_kernel[(triton.cdiv(S, FILL_SEGMENTS),)](csr, empty_value, out, arg, S, D, BS=FILL_SEGMENTS,
                                                          BD=fill_d, STORE_ARG=want_arg, num_warps=4)
    return out, arg


def backward(grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Optional[Tensor], reduce: str,
             rows: int) -> Tensor:
    """grad_x (rows, D) in grad.dtype from the upstream gradient ``grad`` (S, D); max / min need ``arg``."""
    csr, ids = _unit_stride(csr, ids)
    S, D = grad.shape
    gx = alloc.empty((rows, D), dtype=grad.dtype, device=grad.device)
    if rows == 0 or D == 0:
        return gx
    p = plan(rows, D, grad.device.type == "cpu")
    tile_seg = _first_segments(csr, ids, torch.arange(0, rows, p.block_n, device=grad.device))
    code = REDUCE_CODE[reduce]
    segment_backward_kernel[(triton.cdiv(rows, p.block_n), p.column_blocks(D))](
        grad, ids if ids is not None else csr, csr, tile_seg, arg if code >= 2 else gx, gx, rows, D, S,
        grad.stride(0), grad.stride(1), BN=p.block_n, BD=p.block_d, BK=BOUNDARY_WINDOW, IDS=ids is not None,
        REDUCE=code, ACC=_acc(grad.dtype)[1], num_warps=4)
    return gx
