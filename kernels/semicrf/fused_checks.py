"""The value checks of a call in one Triton launch: finiteness of up to five float tensors and the range of one
integer tensor, fused into one flag.

:class:`provable_kernels.validate.DataChecks` queues one small reduction per check (about fifteen launches for a
semi-CRF call), which costs more host time than a launch-bound kernel itself. :func:`check_values` reads every
element once in one kernel of ``cdiv(max numel, BLOCK)`` programs, each writing whether its block failed (so
that an element no program wrote, poisoned with True under ``sentinel verify``, fails), and returns the fused
flag (two more launches: ``any`` and ``logical_not``). The semi-CRF reads it on the host (host mode of
:class:`~provable_kernels.validate.DataChecks`: on a failure the caller checks again per argument for the named
error); in device mode its Triton kernels check the values themselves.

It runs where Triton runs (:func:`usable`): CUDA tensors, or CPU tensors under the Triton interpreter; not while
``torch.compile`` traces (the per-check reductions compile into one fused kernel there) nor for meta or fake
tensors.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from provable_kernels import alloc
from provable_kernels.dispatch import triton_usable
from provable_kernels.launch import launcher
from provable_kernels.triton_math import nonfinite
from provable_kernels.validate import symbolic

MAX_FLOATS = 5
BLOCK = 4096  # elements of each tensor per program


@triton.jit
def _block_bad(ptr, n, offs, ALLOW_NEG_INF: tl.constexpr):
    """1 when an element ``offs`` (< n) of ``ptr`` holds NaN or +inf (or -inf unless ALLOW_NEG_INF), else 0."""
    x = tl.load(ptr + offs, mask=offs < n, other=0.0)
    return tl.max(nonfinite(x, ALLOW_NEG_INF).to(tl.int32), 0)


@triton.jit(do_not_specialize=("n0", "n1", "n2", "n3", "n4", "n_ints", "low", "high"))
def value_checks_kernel(f0, f1, f2, f3, f4, n0, n1, n2, n3, n4, ints, n_ints, low, high, block_bad,
                        NEG0: tl.constexpr, NEG1: tl.constexpr, NEG2: tl.constexpr, NEG3: tl.constexpr,
                        NEG4: tl.constexpr, BLOCK: tl.constexpr):
    """Program p checks elements [p*BLOCK, (p+1)*BLOCK) of each float tensor f_i (n_i elements, -inf allowed
    when NEG_i) and of ``ints`` (in low..high) and writes ``block_bad[p]``: True when a check of its block
    failed."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bad = _block_bad(f0, n0, offs, NEG0) | _block_bad(f1, n1, offs, NEG1) | _block_bad(f2, n2, offs, NEG2)
    bad = bad | _block_bad(f3, n3, offs, NEG3) | _block_bad(f4, n4, offs, NEG4)
    v = tl.load(ints + offs, mask=offs < n_ints, other=low)
    bad = bad | tl.max(((v < low) | (v > high)).to(tl.int32), 0)
    tl.store(block_bad + pid, bad != 0)


def usable(x: torch.Tensor) -> bool:
    """Whether :func:`check_values` can run on ``x``'s device now (module docstring). On the CPU the kernel must
    have been built under the interpreter (``TRITON_INTERPRET=1`` before this module was imported)."""
    # verify: unreached (compile, meta/fake tensors, torch.func, no Triton on the device: per-check path; tests)
    if symbolic(x) or not triton_usable(x.device):
        return False
    return x.is_cuda or not isinstance(value_checks_kernel, triton.runtime.JITFunction)


def check_values(floats: Sequence[tuple[Optional[torch.Tensor], bool]], ints: torch.Tensor, low: int,
                 high: int) -> torch.Tensor:
    """One launch: ``floats`` is up to five ``(tensor or None, allow_neg_inf)`` (float32/float64, any shape; None
    is skipped) that must hold no NaN, no +inf and, unless allowed, no -inf; ``ints`` (any shape, int32/int64)
    must lie in ``low..high``. Every tensor on one device. Returns ``ok``, a 0-d bool tensor: True when every
    check passed. Reads nothing on the host."""
    present = [(x.contiguous(), neg) for x, neg in floats if x is not None and x.numel() > 0]
    if len(floats) > MAX_FLOATS:  # verify: unreached (callers pass at most five)
        raise ValueError(f"floats must hold at most {MAX_FLOATS} tensors, got {len(floats)}")
    ints = ints.contiguous()
    largest = max([ints.numel()] + [x.numel() for x, _ in present])
    programs = max(1, triton.cdiv(largest, BLOCK))
    block_bad = alloc.empty((programs,), dtype=torch.bool, device=ints.device)
    slots = present + [(present[0][0] if present else ints, True)] * (MAX_FLOATS - len(present))
    sizes = [x.numel() for x, _ in present] + [0] * (MAX_FLOATS - len(present))
    launcher(value_checks_kernel)[(programs,)](
        *(x for x, _ in slots), *sizes, ints, ints.numel(), low, high, block_bad,
        *(neg for _, neg in slots), BLOCK=BLOCK)
    return block_bad.any().logical_not()
