"""Triton host side of the segment reductions: sizes, plans, allocation, launches.

``forward(x2, offsets, ids, S, reduce, empty, want_arg, host_checked) -> (out (S, D), arg, csr)`` and
``backward(grad (S, D), csr, ids, arg, reduce, rows) -> grad_x (N, D)``, on a 2-D view ``x2`` (N, D) of ``x``
(any strides). ``arg`` (S, D) int32 is the row of the first maximum (minimum) per (segment, column), written
for max / min when ``want_arg`` (-1 for empty segments); it is a (0,) placeholder otherwise. ``csr`` is the (S+1,)
int32 offsets the forward found from ``ids`` (ids form; the backward reads them), left unwritten when there is no
segment or no column (no launch: the backward then launches nothing either), a (0,) placeholder with ``offsets``. ``host_checked``: the index values were checked on the host (host mode), so the forward skips the
per-row id check. Every allocation goes through :func:`provable_kernels.alloc.empty`.

Each launch configuration is a plan made once per signature (:func:`forward_plan`, :func:`backward_plan`:
sizes, grids, constexprs and :class:`provable_kernels.launch.Bound` launches), so that a repeat call only allocates
and launches; the public call's direct runners (``dispatch``) hold their plan.

Launches per call: forward 1 in either index form (with ids the chunk kernel finds the offsets itself and writes
them; a long segment is finished by its last chunk's program), backward 1. No torch op runs on the device: the value
checks are inside the kernels (``triton_segment`` module doc), ``empty`` reaches the kernel as two float32 halves,
there is no chunk table (a long chunk's program finds its segment by a FAN-ary search, or by its row's id) and the
long chunks' workspace and flags are kept between calls (:func:`scratch`): no allocation but the outputs.

Sizes (:class:`Sizes`, from D's column block only, so that N and S never compile a kernel and a segment's reduction
order depends on its own length alone: see ``triton_segment``): ``block_d`` columns by some lanes (rows). A short
segment (<= ``short_rows`` rows) gets ``short_lanes`` lanes, ``short_groups`` segments per program (a tile of
``CHUNK_TILE`` elements); a long one is cut into chunks of ``triton_segment.chunk_rows`` rows, a power of two in
[``min_chunk``, ``min_chunk * 2**doublings``] from its length (about ``target`` chunks), one program of ``lanes``
lanes per chunk (a tile of ``LONG_TILE`` elements), whose last chunk's program reduces the segment's partials with
``combine_lanes`` lanes; the backward writes tiles of ``TILE`` elements, ``backward_rows`` rows. Under the
interpreter (CPU tensors) the sizes are small (:data:`INTERPRETED`), so that small verification cases run every path
large GPU problems take (several steps per segment, several segments per program, long segments of one and of many
chunks, several combine steps).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from provable_kernels import alloc
from provable_kernels.launch import float_halves, launcher, options
from provable_kernels.segment.triton_segment import (
    segment_backward_kernel,
    segment_chunk_kernel,
)

CHUNK_TILE = 1024  # elements of a short-segment program's tile (4096 held 144 registers for max: 1.4-2.1x slower)
LONG_TILE = 1024  # elements of a long chunk's tile
TILE = 4096  # elements of the backward's tiles
MAX_BLOCK_D = 128
BOUNDARY_WINDOW = 32  # CSR boundaries compared per step when the backward's rows find their segment
WARPS = 4
REDUCE_CODE = {"sum": 0, "mean": 1, "max": 2, "min": 3}


@dataclass(frozen=True)
class Sizes:
    """The constexprs of one column block width (module docstring)."""

    lanes: int  # of a long chunk
    short_lanes: int
    short_groups: int
    short_rows: int
    min_chunk: int
    doublings: int
    target: int
    combine_lanes: int
    backward_rows: int
    block_d: int

    @property
    def max_chunk(self) -> int:
        return self.min_chunk << self.doublings


# a GPU: short segments of <= 256 rows, 8 lanes each (a program's steps follow its longest segment: at an average
# length of 16, 8 lanes x 8 segments waste no more lanes than the old sweep's 4 x 16, and 100-row segments take half
# the steps), long ones in chunks of 512 .. 4096 rows (about 4096 chunks per segment: one 16M-row segment fills the
# GPU like many short ones)
COMPILED = dict(short_lanes=8, short_rows=256, min_chunk=512, doublings=3, target=4096)
# the interpreter: 8-row tiles; segments over 8 rows are long, in chunks of 16 or 32 rows (2 chunks at 17-32 rows)
INTERPRETED = Sizes(lanes=8, short_lanes=2, short_groups=4, short_rows=8, min_chunk=16, doublings=1, target=2,
                    combine_lanes=4, backward_rows=8, block_d=0)


def _block_d(D: int) -> int:
    return min(triton.next_power_of_2(max(D, 1)), MAX_BLOCK_D)


@functools.lru_cache(maxsize=256)
def sizes(D: int, device: torch.device) -> Sizes:
    """The :class:`Sizes` of D columns on ``device`` (memoised); CPU tensors run under the Triton interpreter."""
    block_d = _block_d(D)
    if device.type == "cpu":
        return replace(INTERPRETED, block_d=block_d)
    # verify: unreached (compiled kernels only: CUDA; tests/test_segment.py)
    return Sizes(lanes=LONG_TILE // block_d, short_groups=CHUNK_TILE // block_d // COMPILED["short_lanes"],
                 combine_lanes=LONG_TILE // block_d, backward_rows=TILE // block_d, block_d=block_d, **COMPILED)


def short_rows(device: torch.device) -> int:
    """The most rows of a short segment on ``device`` (every D)."""
    return sizes(1, device).short_rows


def one_block(N: int, device: torch.device) -> bool:
    """True when no segment can be long (N <= short rows): no workspace."""
    return N <= short_rows(device)


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, object]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a JIT function: a call from Python costs microseconds


_EPOCHS = itertools.count()
EPOCH_LIMIT = 2**31 - 1
PARTIALS, FLAGS = "segment.partials", "segment.flags"  # the forward's kept workspaces


def restart_epochs(calls_made: int) -> None:
    """Number the next forward launches as if ``calls_made`` (an int >= 0) had run before them in this process: the
    next call's epoch is ``calls_made % EPOCH_LIMIT + 1`` (:func:`scratch`; ``EPOCH_LIMIT`` makes the next call the
    one at the wrap, which drops the kept flags). For verifying the wrap; the epochs otherwise count from the
    process's first call."""
    global _EPOCHS
    if isinstance(calls_made, bool) or not isinstance(calls_made, int):  # verify: unreached (tests/test_segment.py)
        raise TypeError(f"calls_made must be an int, got {type(calls_made).__name__}")
    if calls_made < 0:  # verify: unreached (tests/test_segment.py)
        raise ValueError(f"calls_made must be >= 0, got {calls_made}")
    _EPOCHS = itertools.count(calls_made)


def scratch(workspaces: alloc.Workspaces) -> tuple[Tensor, Tensor, int]:
    """``(workspace, flags, epoch)`` for one forward launch: the plan's :class:`provable_kernels.alloc.Workspaces`
    (an int32 workspace, scratch, and int32 flags, state that is zeros when new, kept per device and stream) and
    this call's epoch (1 .. 2**31 - 1, never 0: a flag equal to it was written in this call; ``triton_segment``
    module doc). When the epochs wrap, the kept flags are dropped: a flag a slot kept from 2**31 - 1 calls ago would
    equal the new epochs."""
    epoch = next(_EPOCHS) % EPOCH_LIMIT + 1
    if epoch == 1:  # the first call, or a wrap: no kept flag may hold an epoch this round of calls will use
        alloc.drop_workspaces(FLAGS)
    workspace, flags = workspaces()
    return workspace, flags, epoch


def workspaces(device: torch.device, words: int, flag_words: int) -> alloc.Workspaces:
    """The forward's :class:`provable_kernels.alloc.Workspaces` on ``device``: ``words`` int32 words of partials
    (scratch) and ``flag_words`` int32 flags (state)."""
    return alloc.Workspaces(device, (PARTIALS, words, torch.int32, False), (FLAGS, flag_words, torch.int32, True))


class ForwardPlan:
    """The forward launches of one signature (:func:`forward_plan`): ``plan(x2, offsets, ids) -> (out, arg,
    csr)`` as :func:`forward` returns them, ``plan.infer(x2, offsets, ids) -> out`` without the arg and the
    placeholders (inference)."""

    __slots__ = ("rows", "S", "D", "dtype", "device", "want_arg", "ids_form", "workspaces", "chunk")

    def __init__(self, N: int, D: int, S: int, dtype: torch.dtype, device: torch.device, reduce: str,
                 want_arg: bool, ids_form: bool, check_ids: bool, strides: tuple[int, int], empty: float):
        self.rows, self.S, self.D, self.dtype, self.device = N, S, D, dtype, device
        self.want_arg, self.ids_form = want_arg, ids_form
        code = REDUCE_CODE[reduce]
        acc_torch, acc = _acc(dtype)
        z = sizes(D, device)
        slots = N // z.short_rows if N > z.short_rows else 0  # long chunks' workspace slots (programs)
        column_blocks = _cdiv(D, z.block_d)
        # int32 words: partial values (2 per float64), partial args (max / min), tags; a flag per slot and block
        self.workspaces = workspaces(device, slots * (D * ((acc_torch.itemsize // 4) + (code >= 2)) + column_blocks),
                                     slots * column_blocks)
        self.chunk = None
        if S and D:
            short_programs = _cdiv(S, z.short_groups)
            self.chunk = launcher(segment_chunk_kernel).bind(
                (slots + short_programs, column_blocks),
                (N, S, D, slots, short_programs, *strides, *float_halves(empty)),
                options(SHORT=z.short_rows, SHORT_LANES=z.short_lanes, SHORT_GROUPS=z.short_groups, LANES=z.lanes,
                        COMBINE_LANES=z.combine_lanes, MIN_CHUNK=z.min_chunk, DOUBLINGS=z.doublings,
                        TARGET=z.target, BD=z.block_d, REDUCE=code, STORE_ARG=want_arg, ACC=acc, IDS=ids_form,
                        CHECK_IDS=check_ids, num_warps=WARPS))

    def _launch(self, x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor], out: Tensor,
                arg: Tensor) -> Tensor:
        """Run the launch into ``out`` (and ``arg``); returns the offsets the kernel used (``csr`` with ids: written
        here)."""
        csr = offsets
        if self.ids_form:
            csr = alloc.empty((self.S + 1,), dtype=torch.int32, device=self.device)  # written by the launch
        if self.chunk is not None:
            self.chunk(x2, csr, ids if self.ids_form else csr, out, arg, *scratch(self.workspaces))
        return csr

    def __call__(self, x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        out = alloc.empty((self.S, self.D), dtype=self.dtype, device=self.device)
        arg = alloc.empty((self.S, self.D) if self.want_arg else (0,), dtype=torch.int32, device=self.device)
        csr = self._launch(x2, offsets, ids, out, arg)
        return out, arg, csr if self.ids_form else alloc.empty((0,), dtype=torch.int32, device=self.device)

    def infer(self, x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor]) -> Tensor:
        out = alloc.empty((self.S, self.D), dtype=self.dtype, device=self.device)
        self._launch(x2, offsets, ids, out, out)
        return out


@functools.lru_cache(maxsize=256)
def forward_plan(N: int, D: int, S: int, dtype: torch.dtype, device: torch.device, reduce: str, want_arg: bool,
                 ids_form: bool, check_ids: bool, strides: tuple[int, int], empty: float) -> ForwardPlan:
    """The :class:`ForwardPlan` of a signature (memoised): ``want_arg`` for max / min only, ``check_ids``: the
    kernels check every row's id (ids form, not checked on the host), ``strides`` those of ``x2``."""
    return ForwardPlan(N, D, S, dtype, device, reduce, want_arg, ids_form, check_ids, strides, empty)


def forward(x2: Tensor, offsets: Optional[Tensor], ids: Optional[Tensor], S: int, reduce: str, empty: float,
            want_arg: bool, host_checked: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Reduce the rows of ``x2`` (N, D) per segment: ``(out (S, D) in x2.dtype, arg, csr)`` (module doc)."""
    N, D = x2.shape
    ids_form = ids is not None
    plan = forward_plan(N, D, S, x2.dtype, x2.device, reduce, want_arg and reduce in ("max", "min"), ids_form,
                        ids_form and not host_checked, x2.stride(), empty)
    return plan(x2, None if ids_form else offsets.contiguous(), ids.contiguous() if ids_form else None)


class BackwardPlan:
    """The backward launch of one signature (:func:`backward_plan`): ``plan(grad, csr, ids, arg) -> grad_x``."""

    __slots__ = ("rows", "D", "dtype", "device", "max_min", "ids_form", "launch")

    def __init__(self, S: int, D: int, rows: int, dtype: torch.dtype, device: torch.device, reduce: str,
                 ids_form: bool, strides: tuple[int, int]):
        self.rows, self.D, self.dtype, self.device = rows, D, dtype, device
        code = REDUCE_CODE[reduce]
        self.max_min, self.ids_form = code >= 2, ids_form
        self.launch = None
        if rows and D and S:
            z = sizes(D, device)
            self.launch = launcher(segment_backward_kernel).bind(
                (_cdiv(rows, z.backward_rows), _cdiv(D, z.block_d)), (rows, D, S, *strides),
                options(BN=z.backward_rows, BD=z.block_d, BK=BOUNDARY_WINDOW, IDS=ids_form, REDUCE=code,
                        ACC=_acc(dtype)[1], num_warps=WARPS))

    def __call__(self, grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Optional[Tensor]) -> Tensor:
        gx = alloc.empty((self.rows, self.D), dtype=self.dtype, device=self.device)
        if self.launch is not None:
            self.launch(grad, ids if self.ids_form else csr, csr, arg if self.max_min else gx, gx)
        elif self.rows and self.D:  # rows but no segment: a bad index (host mode raised already)
            # verify: unreached (device mode: CUDA by default; tests/test_segment.py)
            gx.fill_(float("nan"))
        return gx


@functools.lru_cache(maxsize=256)
def backward_plan(S: int, D: int, rows: int, dtype: torch.dtype, device: torch.device, reduce: str, ids_form: bool,
                  strides: tuple[int, int]) -> BackwardPlan:
    """The :class:`BackwardPlan` of a signature (memoised); ``strides`` those of the upstream gradient."""
    return BackwardPlan(S, D, rows, dtype, device, reduce, ids_form, strides)


def backward(grad: Tensor, csr: Tensor, ids: Optional[Tensor], arg: Optional[Tensor], reduce: str,
             rows: int) -> Tensor:
    """grad_x (rows, D) in grad.dtype from the upstream gradient ``grad`` (S, D) and the offsets ``csr`` (given, or
    the forward's from ids); max / min need ``arg``."""
    S, D = grad.shape
    plan = backward_plan(S, D, rows, grad.dtype, grad.device, reduce, ids is not None, grad.stride())
    return plan(grad, csr.contiguous(), None if ids is None else ids.contiguous(), arg)
