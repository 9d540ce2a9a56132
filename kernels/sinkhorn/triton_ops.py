"""Triton host side: launch plan, allocation (through :mod:`provable_kernels.alloc`) and launches.

Inputs are (B, n, n) contiguous tensors; outputs and input gradients are fresh (B, n, n) tensors of the input's
dtype, residuals fresh (B,) tensors of the compute dtype (float32, or float64 for float64 inputs). ``MAX_N`` is the
largest n the kernels hold (one 64 x 64 matrix per program); larger n take the PyTorch route of the dispatch tree.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton

from provable_kernels import alloc, launch
from provable_kernels.sinkhorn import triton_sinkhorn as kernels

MAX_N = 64
TILE = 1024  # entries per program (BM * NB * NB) when several matrices share one program
ENTRIES_PER_THREAD = 16  # fewer split each matrix over more threads: 3-15x slower on an H100 (n = 4, B = 262144)
# At NB = 64 (one matrix per program) 32 entries per thread, 4 warps: on an H200 at B = 777 the forward 2.1x (log)
# and 1.9x (prob) faster than with 16, the backward 2.6x and 1.7x.
ENTRIES_PER_THREAD_64 = 32
# Largest span of a row of L = max(x, -1e5) - rowmax that the scaling form takes: exp(-RMAX) stays a normal
# number and the scalings (bounded by exp(RMAX) times powers of n) stay far from overflow. Wider rows run the
# log-domain loop for their block.
RMAX = {torch.float32: 30.0, torch.float64: 300.0}


@dataclass(frozen=True)
class Plan:
    """Matrices per program ``BM``, padded size ``NB``, grid and warps for ``B`` matrices of size ``n``."""

    BM: int
    NB: int
    grid: int
    num_warps: int


@functools.lru_cache(maxsize=1024)
def plan(B: int, n: int) -> Plan:
    """Pack ``TILE`` entries per program (``BM = TILE // NB**2`` matrices, at least one), with
    ``ENTRIES_PER_THREAD`` entries of the tile per thread. At NB <= 4 the kernels' row-by-row loads put whole
    matrices in one thread (one 4 x 4 matrix per thread at n = 3, 4): row and column sums are additions in
    registers. At NB >= 8 a thread holds one row of a matrix and the column sums cross the lanes of a warp. One
    packing for every batch size: the tile's layout, and with it the order of every sum, is then the same for a
    matrix alone and for one inside any batch (batch invariance; a smaller packing for small batches gave other
    layouts and other bits), and a batch size that changes every step compiles nothing new (B is a runtime
    argument)."""
    NB = triton.next_power_of_2(n)
    BM = max(1, TILE // (NB * NB))
    per_thread = ENTRIES_PER_THREAD_64 if NB == 64 else ENTRIES_PER_THREAD
    return Plan(BM, NB, triton.cdiv(B, BM), min(8, max(1, BM * NB * NB // (32 * per_thread))))


def _stride(iters: int, nb: int) -> int:
    """Steps between the scalings the backward keeps. Each group selects its kept vectors once (a ``where`` over
    all CP slots) and each reverse step replays (stride - 1) / 2 steps on average. With a matrix per thread (NB <= 4) a slot costs
    about 2 NB instructions and a step about 25 NB, so at most 8 slots (stride ceil(iters / 8): at iters = 20, 7
    slots and one replayed step on average, against 4 slots and two with ceil(sqrt(iters))). At NB >= 8,
    ceil(sqrt(iters))."""
    if nb <= 4:
        return triton.cdiv(iters, 8)
    return math.isqrt(iters - 1) + 1


def _checked(x: torch.Tensor) -> tuple[int, int]:
    if x.dim() != 3 or x.shape[1] != x.shape[2] or not x.is_contiguous():  # verify: unreached (internal guard)
        raise ValueError(f"x must be a contiguous (B, n, n) tensor, got shape {tuple(x.shape)}")
    if x.shape[1] > MAX_N:  # verify: unreached (the size condition routes n > MAX_N to PyTorch)
        raise ValueError(f"x must have n <= {MAX_N} on the Triton route, got n = {x.shape[1]}")
    return x.shape[0], x.shape[1]


class Launch:
    """One kernel launch of a given shape and setting: ``Launch(kernels, B, n, dtype, iters, domain, eps,
    residual)(*tensors)`` launches the log or prob kernel of the pair ``kernels`` (forward or backward) on
    ``tensors`` (its leading arguments: ``x, out, res`` or ``x, grad, gx``; the forward stores the residuals in
    ``res`` only with ``residual``, and ``res`` may be ``out`` without it). The plan, options and launcher are made once, so that a
    public call with a signature seen before only allocates and launches (:mod:`provable_kernels.runtime`,
    :class:`provable_kernels.launch.Bound`)."""

    __slots__ = ("bound",)

    def __init__(self, kernels_pair: tuple, B: int, n: int, dtype: torch.dtype, iters: int,
                 domain: str, eps: float, residual: bool = False):
        log_kernel, prob_kernel = kernels_pair
        p = plan(B, n)
        f64 = dtype == torch.float64
        common = dict(N=n, NB=p.NB, BM=p.BM, F64=f64, num_warps=p.num_warps)
        steps: tuple = (iters,)
        if log_kernel is kernels.log_forward_kernel:
            common.update(RESIDUAL=residual)
        if log_kernel is kernels.log_backward_kernel:  # the scalings of every STRIDE-th step are kept in CP slots
            stride = _stride(iters, p.NB)
            common.update(CP=triton.next_power_of_2(triton.cdiv(iters, stride)))
            steps = (iters, stride)
        if domain == "log":
            opts = launch.options(RMAX=RMAX[torch.float64 if f64 else torch.float32], **common)
            self.bound = launch.launcher(log_kernel).bind((p.grid,), (B, *steps), opts)
        else:
            tail = (B, *steps, *launch.float_halves(eps))
            self.bound = launch.launcher(prob_kernel).bind((p.grid,), tail, launch.options(**common))

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.bound(*tensors)


FORWARD = (kernels.log_forward_kernel, kernels.prob_forward_kernel)
BACKWARD = (kernels.log_backward_kernel, kernels.prob_backward_kernel)


def forward(x: torch.Tensor, iters: int, domain: str, eps: float, residual: bool = False):
    """Sinkhorn of every matrix of ``x`` (B, n, n) contiguous: a fresh (B, n, n) in ``x``'s dtype, and with
    ``residual`` the pair ``(out, res)`` with each matrix's convergence residual ``res`` (B,) from the same launch."""
    return prepare_forward(x, iters, domain, eps, residual)(x)


def prepare_forward(x: torch.Tensor, iters: int, domain: str, eps: float, residual: bool = False) -> Callable:
    """:func:`forward` for every ``x`` with this one's shape, strides, dtype and device, as a function of ``x``
    (its launch made once: :class:`Launch`)."""
    B, n = _checked(x)
    run = Launch(FORWARD, B, n, x.dtype, iters, domain, eps, residual) if B else None
    res_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32

    def forward_prepared(x: torch.Tensor):
        out = alloc.empty_like(x)
        res = alloc.empty((x.shape[0],), dtype=res_dtype, device=x.device) if residual else out
        if run is not None:
            run(x, out, res)
        return (out, res) if residual else out
    return forward_prepared


def prepare_backward(x: torch.Tensor, iters: int, domain: str,
                     eps: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`backward` for every ``(grad, x)`` with this ``x``'s signature (``grad`` contiguous like it), as a
    function of ``(grad, x)``, its launch made once."""
    B, n = _checked(x)
    run = Launch(BACKWARD, B, n, x.dtype, iters, domain, eps) if B else None

    def backward_prepared(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gx = alloc.empty_like(x)
        if run is not None:
            run(x, grad, gx)
        return gx
    return backward_prepared


def backward(grad: torch.Tensor, x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    """Gradient with respect to ``x`` of ``sum(grad * forward(x))``, replaying the forward on chip; ``grad`` is
    (B, n, n) contiguous; returns a fresh (B, n, n) in ``x``'s dtype."""
    B, _ = _checked(x)
    if grad.shape != x.shape or not grad.is_contiguous():  # verify: unreached (internal guard)
        raise ValueError(f"grad must be contiguous with shape {tuple(x.shape)}, got {tuple(grad.shape)}")
    gx = alloc.empty_like(x)
    if B:
        Launch(BACKWARD, B, x.shape[1], x.dtype, iters, domain, eps)(x, grad, gx)
    return gx
