"""Triton host side: launch configuration, allocation (``provable_kernels.alloc``) and launches
(``provable_kernels.launch``) on contiguous (rows, cols) tensors; outputs are fresh tensors of the input's dtype."""
from __future__ import annotations

from typing import Callable

import torch
import triton

from provable_kernels import alloc, launch

from .call import EPS
from .triton_l2norm import l2norm_backward_kernel, l2norm_forward_kernel

MAX_BLOCK = 1024  # columns per step of a program's walk along its row


class Launch:
    """One kernel's launch for a (rows, cols) shape, its grid and options made once: ``Launch(kernel, rows,
    cols)(*tensors)`` launches ``kernel`` on ``tensors`` (its leading arguments), nothing when ``rows`` is 0."""

    __slots__ = ("bound",)

    def __init__(self, kernel, rows: int, cols: int):
        opts = launch.options(EPS=EPS, BLOCK=min(triton.next_power_of_2(cols), MAX_BLOCK), num_warps=4)
        self.bound = launch.launcher(kernel).bind((rows,), (cols,), opts) if rows else None

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.bound is not None:
            self.bound(*tensors)


def prepare_forward(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The forward for every ``x`` (rows, cols) contiguous with this one's shape, as a function of ``x``."""
    run = Launch(l2norm_forward_kernel, *x.shape)

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = alloc.empty_like(x)
        run(x, out)
        return out
    return forward


def prepare_backward(x: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The gradient of ``sum(grad * forward(x))`` for every ``(grad, x)`` shaped like this ``x`` (both contiguous),
    as a function of ``(grad, x)``."""
    run = Launch(l2norm_backward_kernel, *x.shape)

    def backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gx = alloc.empty_like(x)
        run(x, grad, gx)
        return gx
    return backward


def forward(x: torch.Tensor) -> torch.Tensor:
    return prepare_forward(x)(x)


def backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return prepare_backward(x)(grad, x)
