"""Triton host side of the segment reductions: sizes, allocation, launches.

``forward(x2, offsets, ids, S, reduce, empty, want_arg, host_checked) -> (out (S, D), arg, csr)`` and
``backward(grad (S, D), csr, ids, arg, reduce, rows) -> grad_x (N, D)``, on a 2-D view ``x2`` (N, D) of ``x``
(any strides). ``arg`` (S, D) int32 is the row of the first maximum (minimum) per (segment, column), written
for max / min when ``want_arg`` (-1 for empty segments); it is a (0,) placeholder otherwise. ``csr`` is the (S+1,)
int32 offsets the forward built from ``ids`` (ids form; the backward reads them), a (0,) placeholder with
``offsets``. ``host_checked``: the index values were checked on the host (host mode), so the forward skips the
per-row id check. Every allocation goes through :func:`provable_kernels.alloc.empty`.

Launches per call: forward 1 (offsets, N <= SHORT rows) or 2 (the combine pass, N > SHORT rows: some segment may be
long), plus 1 with ids (:func:`segment_offsets_kernel` builds the offsets); backward 1. No torch op runs on the
device: the value checks are inside the kernels (``triton_segment`` module doc), ``empty`` reaches the kernel as
two float32 halves, and there is no chunk table (a long chunk's program finds its segment by a binary search).

Sizes (:class:`Sizes`, from D's column block only, so that N and S never compile a kernel and a segment's reduction
order depends on its own length alone: see ``triton_segment``): tiles of ``CHUNK_TILE`` elements, ``block_d``
columns by ``lanes`` rows. A short segment (<= ``short_rows`` rows) gets ``short_lanes`` of them (``lanes //
short_lanes`` segments per program); a long one is cut into chunks of ``triton_segment.chunk_rows`` rows, a power
of two in [``min_chunk``, ``min_chunk * 2**doublings``] from its length (about ``target`` chunks), one program of
``lanes`` lanes per chunk. The combine pass reduces a segment's partials with ``combine_lanes`` lanes (TILE
elements), the backward writes tiles of ``backward_rows`` rows. Under the interpreter (CPU tensors) the sizes are small
(:data:`INTERPRETED`), so that small verification cases run every path large GPU problems take (several steps per
segment, several segments per program, long segments of one and of many chunks, several combine steps).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from provable_kernels import alloc
from provable_kernels.launch import float_halves, launcher
from provable_kernels.segment.triton_segment import (
    segment_backward_kernel,
    segment_chunk_kernel,
    segment_combine_kernel,
    segment_offsets_kernel,
)

CHUNK_TILE = 1024  # elements of the chunk kernel's tile (4096 held 144 registers for max: 1.4-2.1x slower)
TILE = 4096  # elements of the combine pass's and the backward's tiles
MAX_BLOCK_D = 128
BOUNDARY_WINDOW = 32  # CSR boundaries compared per step when the backward's rows find their segment
OFFSETS_BLOCK = 1024  # offsets per program of the ids form's offsets kernel
REDUCE_CODE = {"sum": 0, "mean": 1, "max": 2, "min": 3}


@dataclass(frozen=True)
class Sizes:
    """The constexprs of one column block width (module docstring)."""

    lanes: int
    short_lanes: int
    short_rows: int
    min_chunk: int
    doublings: int
    target: int
    combine_lanes: int
    combine_group: int
    backward_rows: int
    block_d: int

    @property
    def short_groups(self) -> int:
        return self.lanes // self.short_lanes

    @property
    def max_chunk(self) -> int:
        return self.min_chunk << self.doublings


# a GPU: short segments of <= 256 rows, 8 lanes each (a program's steps follow its longest segment: at an average
# length of 16, 8 lanes x 8 segments waste no more lanes than the old sweep's 4 x 16, and 100-row segments take half
# the steps), long ones in chunks of 512 .. 4096 rows (about 4096 chunks per segment: one 16M-row segment fills the
# GPU like many short ones)
COMPILED = dict(short_lanes=8, short_rows=256, min_chunk=512, doublings=3, target=4096, combine_group=256)
# the interpreter: 8-row tiles; segments over 8 rows are long, in chunks of 16 or 32 rows (2 chunks at 17-32 rows)
INTERPRETED = Sizes(lanes=8, short_lanes=2, short_rows=8, min_chunk=16, doublings=1, target=2, combine_lanes=4,
                    combine_group=4, backward_rows=8, block_d=0)


def _block_d(D: int) -> int:
    return min(triton.next_power_of_2(max(D, 1)), MAX_BLOCK_D)


@functools.lru_cache(maxsize=256)
def sizes(D: int, interpreted: bool = False) -> Sizes:
    """The :class:`Sizes` of D columns (memoised); ``interpreted``: CPU tensors under the Triton interpreter."""
    block_d = _block_d(D)
    if interpreted:
        return replace(INTERPRETED, block_d=block_d)
    # verify: unreached (compiled kernels only: CUDA; tests/test_segment.py)
    return Sizes(lanes=CHUNK_TILE // block_d, combine_lanes=TILE // block_d, backward_rows=TILE // block_d,
                 block_d=block_d, **COMPILED)


def short_rows(device: torch.device) -> int:
    """The most rows of a short segment on ``device`` (every D)."""
    return sizes(1, device.type == "cpu").short_rows


def spanning_rows(device: torch.device) -> int:
    """Rows of a segment cut into two chunks on ``device``, the second of one row (verification cases)."""
    return sizes(1, device.type == "cpu").min_chunk + 1


def one_block(N: int, device: torch.device) -> bool:
    """True when no segment can be long (N <= short rows): one pass, no combine."""
    return N <= short_rows(device)


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, object]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _offsets_from_ids(ids: Tensor, S: int) -> Tensor:
    """(S+1,) int32 offsets from sorted ``ids``: one launch."""
    csr = alloc.empty((S + 1,), dtype=torch.int32, device=ids.device)
    launcher(segment_offsets_kernel)[(triton.cdiv(S + 1, OFFSETS_BLOCK),)](ids, csr, ids.numel(), S,
                                                                          BLOCK=OFFSETS_BLOCK)
    return csr


def forward(x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor], S: int, reduce: str, empty: float,
            want_arg: bool, host_checked: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Reduce the rows of ``x2`` (N, D) per segment: ``(out (S, D) in x2.dtype, arg, csr)`` (module doc)."""
    N, D = x2.shape
    device = x2.device
    want_arg = want_arg and reduce in ("max", "min")
    out = alloc.empty((S, D), dtype=x2.dtype, device=device)
    arg = alloc.empty((S, D) if want_arg else (0,), dtype=torch.int32, device=device)
    if ids is not None:
        ids = ids.contiguous()
        csr = csr_out = _offsets_from_ids(ids, S)
    else:
        csr, csr_out = offsets.contiguous(), alloc.empty((0,), dtype=torch.int32, device=device)
    if S == 0 or D == 0:
        return out, arg, csr_out
    acc_torch, acc = _acc(x2.dtype)
    code = REDUCE_CODE[reduce]
    z = sizes(D, device.type == "cpu")
    short_programs = triton.cdiv(S, z.short_groups)
    slots = N // z.short_rows if N > z.short_rows else 0  # long chunks' workspace slots (programs)
    column_blocks = triton.cdiv(D, z.block_d)
    part_v = alloc.empty((slots, D), dtype=acc_torch, device=device)
    part_i = alloc.empty((slots, D) if code >= 2 else (0,), dtype=torch.int32, device=device)
    tags = alloc.empty((slots,), dtype=torch.int32, device=device)
    sizes_kw = dict(SHORT=z.short_rows, MIN_CHUNK=z.min_chunk, DOUBLINGS=z.doublings, TARGET=z.target,
                    BD=z.block_d, REDUCE=code, STORE_ARG=want_arg, ACC=acc)
    launcher(segment_chunk_kernel)[(short_programs + slots, column_blocks)](
        x2, csr, ids if ids is not None else csr, out, arg, part_v, part_i, tags, N, S, D, short_programs,
        x2.stride(0), x2.stride(1), *float_halves(empty), SHORT_LANES=z.short_lanes, SHORT_GROUPS=z.short_groups,
        LANES=z.lanes, CHECK_IDS=ids is not None and not host_checked, num_warps=4, **sizes_kw)
    if slots:
        launcher(segment_combine_kernel)[(triton.cdiv(S, z.combine_group), column_blocks)](
            csr, part_v, part_i, tags, out, arg, N, S, D, GROUP=z.combine_group, LANES=z.combine_lanes,
            num_warps=4, **sizes_kw)
    return out, arg, csr_out


def backward(grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Optional[Tensor], reduce: str,
             rows: int) -> Tensor:
    """grad_x (rows, D) in grad.dtype from the upstream gradient ``grad`` (S, D) and the offsets ``csr`` (given, or
    the forward's from ids); max / min need ``arg``."""
    csr = csr.contiguous()
    ids = None if ids is None else ids.contiguous()
    S, D = grad.shape
    gx = alloc.empty((rows, D), dtype=grad.dtype, device=grad.device)
    if rows == 0 or D == 0:
        return gx
    if S == 0:  # rows but no segment: a bad index (host mode raised already)
        # verify: unreached (device mode: CUDA by default; tests/test_segment.py)
        return gx.fill_(float("nan"))
    z = sizes(D, grad.device.type == "cpu")
    code = REDUCE_CODE[reduce]
    launcher(segment_backward_kernel)[(triton.cdiv(rows, z.backward_rows), triton.cdiv(D, z.block_d))](
        grad, ids if ids is not None else csr, csr, arg if code >= 2 else gx, gx, rows, D, S,
        grad.stride(0), grad.stride(1), BN=z.backward_rows, BD=z.block_d, BK=BOUNDARY_WINDOW, IDS=ids is not None,
        REDUCE=code, ACC=_acc(grad.dtype)[1], num_warps=4)
    return gx
