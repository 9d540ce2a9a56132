"""Triton kernels of l2norm (``@triton.jit`` code only; the host side is in ``triton_ops``).

One program per row of a contiguous (rows, cols) tensor, walking the row in blocks of ``BLOCK`` columns (the last
one masked); sums accumulate in the input's dtype. With ``r = 1 / sqrt(sum(x**2) + EPS)`` the forward stores
``x * r`` and the backward ``r * (g - (x * r) * (r * sum(g * x)))`` (no ``r**3``, which
underflows in float32 for rows of large entries).
"""
import triton
import triton.language as tl


@triton.jit
def _sums(x_ptr, g_ptr, row, cols, BLOCK: tl.constexpr, WITH_G: tl.constexpr):
    """``sum(x**2)`` over the row, and ``sum(g * x)`` when ``WITH_G``."""
    squares = tl.zeros((BLOCK,), x_ptr.dtype.element_ty)
    dots = tl.zeros((BLOCK,), x_ptr.dtype.element_ty)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row + offs, mask=offs < cols, other=0.0)
        squares += x * x
        if WITH_G:
            dots += tl.load(g_ptr + row + offs, mask=offs < cols, other=0.0) * x
    return tl.sum(squares), tl.sum(dots)


@triton.jit
def l2norm_forward_kernel(x_ptr, out_ptr, cols, EPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * cols
    squares, _ = _sums(x_ptr, x_ptr, row, cols, BLOCK, False)
    r = 1.0 / tl.sqrt(squares + EPS)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row + offs, mask=offs < cols, other=0.0)
        tl.store(out_ptr + row + offs, x * r, mask=offs < cols)


@triton.jit
def l2norm_backward_kernel(x_ptr, g_ptr, gx_ptr, cols, EPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * cols
    squares, dots = _sums(x_ptr, g_ptr, row, cols, BLOCK, True)
    r = 1.0 / tl.sqrt(squares + EPS)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row + offs, mask=offs < cols, other=0.0)
        g = tl.load(g_ptr + row + offs, mask=offs < cols, other=0.0)
        tl.store(gx_ptr + row + offs, r * (g - (x * r) * (r * dots)), mask=offs < cols)
