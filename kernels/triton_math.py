"""-inf-safe reductions, value checks and float scalars for Triton kernels (``@triton.jit`` helpers any family's
kernels can call).

Log-space kernels hold -inf for forbidden choices, and a slice can be all -inf. A naive logsumexp
``max + log(sum(exp(x - max)))`` then computes ``-inf - -inf = NaN``. Every helper here shifts by
:func:`lse_shift` (the max with -inf replaced by 0), so an all -inf slice gives ``-inf`` (``log(0)``), never NaN,
and its (max, sum) pair is ``(-inf, 0)``. All arithmetic is in the dtype of the input block.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lse_shift(m):
    """``m`` with -inf replaced by 0: the shift of a logsumexp (never -inf - -inf)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def lse_parts(x, axis: tl.constexpr):
    """(max, sum of exp(x - max)) of ``x`` along ``axis``, in x's dtype; an all -inf slice gives (-inf, 0)."""
    top = tl.max(x, axis)
    return top, tl.sum(tl.exp(x - tl.expand_dims(lse_shift(top), axis)), axis)


@triton.jit
def lse_merge(top, total, chunk_top, chunk_total):
    """Merge two (max, sum exp) pairs of an online logsumexp (e.g. over chunks of a long axis)."""
    new = tl.maximum(top, chunk_top)
    shift = lse_shift(new)
    return new, total * tl.exp(top - shift) + chunk_total * tl.exp(chunk_top - shift)


@triton.jit
def logsumexp(x, axis: tl.constexpr):
    """log(sum(exp(x))) along ``axis``; -inf for an all -inf slice."""
    top, total = lse_parts(x, axis)
    return lse_shift(top) + tl.log(total)


@triton.jit
def semiring_sum(x, axis: tl.constexpr, LOG: tl.constexpr):
    """The semiring sum along ``axis``: :func:`logsumexp` (``LOG``) or max, in x's dtype."""
    if LOG:
        out = logsumexp(x, axis)
    else:
        out = tl.max(x, axis)
    return out


@triton.jit
def nonfinite(x, ALLOW_NEG_INF: tl.constexpr):
    """Elementwise: ``x`` is NaN or +inf (or -inf unless ``ALLOW_NEG_INF``)."""
    bad = (x != x) | (x == float("inf"))
    if not ALLOW_NEG_INF:
        bad = bad | (x == float("-inf"))
    return bad


@triton.jit
def span_nonfinite(ptr, n, ALLOW_NEG_INF: tl.constexpr, BLOCK: tl.constexpr):
    """True (a scalar) when one of the ``n`` contiguous elements at ``ptr`` is :func:`nonfinite`; reads them
    ``BLOCK`` at a time."""
    bad = tl.zeros((BLOCK,), tl.int32)
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(ptr + offs, mask=offs < n, other=0.0)
        bad = bad | nonfinite(x, ALLOW_NEG_INF).to(tl.int32)
    return tl.max(bad, 0) != 0


@triton.jit
def float_scalar(HI, LO, F64: tl.constexpr):
    """A float argument in the compute dtype from its two float32 halves (a Python float reaches a kernel as
    float32; :func:`provable_kernels.launch.float_halves` splits it on the host): float64 adds them (about 48 bits of
    the value), float32 takes ``HI``."""
    if F64:
        value = (HI + tl.zeros((), tl.float64)) + (LO + tl.zeros((), tl.float64))
    else:
        value = HI + tl.zeros((), tl.float32)
    return value
