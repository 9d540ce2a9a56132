"""Triton kernels of the segment reductions (``@triton.jit`` code only; host side in ``triton_ops``).

Layout: ``x`` is viewed as (N, D) with row and column strides; outputs are contiguous (S, D). Rows are cut into
blocks of ``ROWS`` consecutive rows, one program per (row block, column block), so every program reads the same
number of elements whatever the segment lengths. A program walks its block in tiles of (BN rows, BD columns):

- each row's segment id comes from ``ids`` (IDS) or from the CSR ``offsets`` (:func:`row_segments`);
- a segmented inclusive scan along the rows (``tl.associative_scan`` on (segment, value[, row])) reduces every
  segment inside the tile; the running value of the segment still open at the end of a tile is carried into the
  next one;
- at the last row of a segment the result is stored: into the output when the segment started inside the block,
  else into slot 0 ("head") of the block's two workspace slots; a segment still open at the end of the block
  goes to slot 1 ("tail", it started in the block) or slot 0 (it covers the whole block).

A segment spanning several blocks is finished by :func:`segment_combine_kernel`, which reads its pieces in row
order (tail of its first block, heads of the next ones) tile by tile: a fixed order, no atomics. Empty segments
are written by :func:`segment_fill_kernel`. Max and min run as a max of ``SIGN * x`` (negation is exact) with the
row of the first occurrence as the arg; NaN ranks above every number, so the first NaN wins.

REDUCE: 0 sum, 1 mean, 2 max, 3 min. Sums accumulate in ACC (float32, or float64 for float64 input).
"""
from __future__ import annotations

import triton
import triton.language as tl

BIG = tl.constexpr(2147483647)  # larger than every row index and segment id (int32)


@triton.jit
def row_segments(ids_ptr, offsets_ptr, rows, base, last_row, S, IDS: tl.constexpr, BK: tl.constexpr):
    """Segment id of each row in ``rows`` (int32). IDS: ``ids[row]``. Else ``base`` (the segment of the tile's
    first row) plus the number of boundaries ``offsets[base+1 ..]`` at or below the row, counted BK boundaries at a
    time until one lies past ``last_row``."""
    if IDS:
        seg = tl.load(ids_ptr + rows, mask=rows <= last_row, other=0).to(tl.int32)
    else:
        count = tl.zeros(rows.shape, tl.int32)
        k0 = base + 1
        more = k0 <= S
        while more:
            ks = k0 + tl.arange(0, BK)
            bounds = tl.load(offsets_ptr + ks, mask=ks <= S, other=BIG).to(tl.int32)
            count += tl.sum((bounds[None, :] <= rows[:, None]).to(tl.int32), axis=1)
            more = tl.max(bounds, axis=0) <= last_row
            k0 += BK
        seg = base + count
    return seg


@triton.jit
def _beats(va, vb):
    """True where ``vb`` (a later row) replaces ``va`` as the maximum: strictly greater, or the first NaN."""
    return (vb > va) | ((vb != vb) & (va == va))


@triton.jit
def _scan_sum(sa, va, sb, vb):
    return sb, tl.where(sa == sb, va + vb, vb)


@triton.jit
def _scan_max(sa, va, ia, sb, vb, ib):
    keep = (sa == sb) & ~((vb > va) | ((vb != vb) & (va == va)))  # _beats inlined (called per element)
    return sb, tl.where(keep, va, vb), tl.where(keep, ia, ib)


@triton.jit
def _tile_max(v, i, mask):
    """(value, first row) of the maximum of each column of a (P, BD) tile, NaN first; rows ``i`` increase."""
    isnan = (v != v) & mask
    has_nan = tl.max(isnan.to(tl.int32), axis=0) > 0
    finite_part = tl.where(isnan | ~mask, float("-inf"), v)
    m = tl.max(finite_part, axis=0)
    match = mask & tl.where(has_nan[None, :], isnan, finite_part == m[None, :])
    first = tl.min(tl.where(match, i, BIG), axis=0)
    return tl.where(has_nan, float("nan"), m), first


@triton.jit
def _finish(v, count, REDUCE: tl.constexpr):
    """Turn a reduced value (sum, or max of SIGN * x) into the output value."""
    if REDUCE == 1:
        v = v / count
    if REDUCE == 3:
        v = -v
    return v


@triton.jit
def segment_forward_kernel(
    x_ptr, ids_ptr, offsets_ptr, block_seg_ptr, out_ptr, arg_ptr, part_v_ptr, part_i_ptr,
    N, D, S, stride_xn, stride_xd,
    ROWS: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    IDS: tl.constexpr, REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr,
):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    row_start = b * ROWS
    row_end = tl.minimum(row_start + ROWS, N)
    seg0 = tl.load(block_seg_ptr + b).to(tl.int32)
    head_open = tl.load(offsets_ptr + seg0).to(tl.int32) < row_start  # seg0 began in an earlier block
    head_seg = tl.where(head_open, seg0, -1)  # the segment whose ending piece goes to slot 0, or none
    base = seg0
    carry_seg = seg0 * 0 - 1
    carry_v = tl.zeros([BD], ACC)
    carry_i = tl.zeros([BD], tl.int32)
    for r0 in range(row_start, row_end, BN):
        rows = r0 + tl.arange(0, BN)
        rmask = rows < row_end
        last_row = tl.minimum(r0 + BN, row_end) - 1
        seg = row_segments(ids_ptr, offsets_ptr, rows, base, last_row, S, IDS, BK)
        seg = tl.where(rmask, seg, S)
        m2 = rmask[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xn + cols64[None, :] * stride_xd, mask=m2,
                    other=0.0).to(ACC)
        seg2 = tl.broadcast_to(seg[:, None], [BN, BD])
        cont = seg2 == carry_seg
        if REDUCE >= 2:
            if REDUCE == 3:
                x = -x
            idx2 = tl.broadcast_to(rows[:, None], [BN, BD])
            _, v, i = tl.associative_scan((seg2, x, idx2), 0, _scan_max)
            keep = cont & ~_beats(carry_v[None, :], v)
            v = tl.where(keep, carry_v[None, :], v)
            i = tl.where(keep, carry_i[None, :], i)
        else:
            _, v = tl.associative_scan((seg2, x), 0, _scan_sum)
            v = tl.where(cont, carry_v[None, :] + v, v)
        end = tl.load(offsets_ptr + seg + 1, mask=rmask, other=0).to(tl.int32)
        is_last = rmask & (rows + 1 == end)
        before = seg == head_seg
        final = (is_last & ~before)[:, None] & cmask[None, :]
        count = 1
        if REDUCE == 1:
            start = tl.load(offsets_ptr + seg, mask=rmask, other=0).to(tl.int32)
            count = tl.maximum(end - start, 1).to(ACC)[:, None]
        out_at = seg.to(tl.int64)[:, None] * D + cols64[None, :]
        tl.store(out_ptr + out_at, _finish(v, count, REDUCE).to(out_ptr.dtype.element_ty), mask=final)
        if STORE_ARG:
            tl.store(arg_ptr + out_at, i, mask=final)
        head = (is_last & before)[:, None] & cmask[None, :]
        part_at = tl.broadcast_to((b * 2).to(tl.int64) * D + cols64[None, :], [BN, BD])
        tl.store(part_v_ptr + part_at, v, mask=head)
        if REDUCE >= 2:
            tl.store(part_i_ptr + part_at, i, mask=head)
        # carry the last valid row of the tile
        sel = rows == last_row
        carry_v = tl.sum(tl.where(sel[:, None], v, 0.0), axis=0)
        if REDUCE >= 2:
            carry_i = tl.max(tl.where(sel[:, None], i, -1), axis=0)
        carry_seg = tl.max(tl.where(sel, seg, -1), axis=0)
        base = carry_seg
    # a segment still open at the end of the block leaves its piece in a slot
    open_tail = tl.load(offsets_ptr + carry_seg + 1).to(tl.int32) > row_end
    slot = tl.where(carry_seg == head_seg, 0, 1)
    tail_at = (b * 2 + slot).to(tl.int64) * D + cols64
    tail_mask = cols < tl.where(open_tail, D, 0)
    tl.store(part_v_ptr + tail_at, carry_v, mask=tail_mask)
    if REDUCE >= 2:
        tl.store(part_i_ptr + tail_at, carry_i, mask=tail_mask)


@triton.jit
def segment_combine_kernel(
    offsets_ptr, block_seg_ptr, part_v_ptr, part_i_ptr, out_ptr, arg_ptr, D,
    ROWS: tl.constexpr, BP: tl.constexpr, BD: tl.constexpr,
    REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr,
):
    """Program j finishes the segment that starts in row block j and continues past it, if there is one: its
    pieces (slot 1 of block j, then slot 0 of each later block it covers) combined in row order."""
    j = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    s = tl.load(block_seg_ptr + j + 1).to(tl.int32)  # the segment holding the first row of block j + 1
    start = tl.load(offsets_ptr + s).to(tl.int32)
    if (start < (j + 1) * ROWS) & (start >= j * ROWS):
        end = tl.load(offsets_ptr + s + 1).to(tl.int32)
        pieces = (end - 1) // ROWS - j + 1
        acc_v = tl.zeros([BD], ACC)
        acc_i = tl.full([BD], BIG, tl.int32)
        if REDUCE >= 2:
            acc_v = tl.full([BD], float("-inf"), ACC)
        for p0 in range(0, pieces, BP):
            p = p0 + tl.arange(0, BP)
            m2 = (p < pieces)[:, None] & cmask[None, :]
            at = ((j + p) * 2 + tl.where(p == 0, 1, 0)).to(tl.int64)[:, None] * D + cols64[None, :]
            v = tl.load(part_v_ptr + at, mask=m2, other=0.0)
            if REDUCE >= 2:
                i = tl.load(part_i_ptr + at, mask=m2, other=BIG)
                tv, ti = _tile_max(v, i, m2)
                take = _beats(acc_v, tv) | (acc_i == BIG)
                acc_v = tl.where(take, tv, acc_v)
                acc_i = tl.where(take, ti, acc_i)
            else:
                acc_v += tl.sum(v, axis=0)
        count = tl.maximum(end - start, 1).to(ACC)
        out_at = s.to(tl.int64) * D + cols64
        tl.store(out_ptr + out_at, _finish(acc_v, count, REDUCE).to(out_ptr.dtype.element_ty), mask=cmask)
        if STORE_ARG:
            tl.store(arg_ptr + out_at, acc_i, mask=cmask)


@triton.jit
def segment_fill_kernel(offsets_ptr, empty_ptr, out_ptr, arg_ptr, S, D, BS: tl.constexpr, BD: tl.constexpr,
                        STORE_ARG: tl.constexpr):
    """Write ``empty[0]`` (and arg -1) into every column of each empty segment (the only outputs the other kernels
    skip)."""
    s = tl.program_id(0) * BS + tl.arange(0, BS)
    smask = s < S
    lo = tl.load(offsets_ptr + s, mask=smask, other=0)
    hi = tl.load(offsets_ptr + s + 1, mask=smask, other=0)
    hollow = smask & (lo == hi)
    value = tl.zeros([BS, BD], out_ptr.dtype.element_ty) + tl.load(empty_ptr)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        at = s.to(tl.int64)[:, None] * D + cols[None, :]
        mask = hollow[:, None] & (cols < D)[None, :]
        tl.store(out_ptr + at, value, mask=mask)
        if STORE_ARG:
            tl.store(arg_ptr + at, tl.full([BS, BD], -1, tl.int32), mask=mask)


@triton.jit
def segment_backward_kernel(
    g_ptr, ids_ptr, offsets_ptr, tile_seg_ptr, arg_ptr, gx_ptr,
    N, D, S, stride_gs, stride_gd,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    IDS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
):
    """grad_x (N, D) for one tile of rows: the upstream gradient of the row's segment (sum), divided by the
    segment's length (mean), or only at the saved arg row (max, min); zero elsewhere."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    rows = t * BN + tl.arange(0, BN)
    rmask = rows < N
    last_row = tl.minimum(t * BN + BN, N) - 1
    seg = row_segments(ids_ptr, offsets_ptr, rows, tl.load(tile_seg_ptr + t).to(tl.int32), last_row, S, IDS, BK)
    seg64 = seg.to(tl.int64)[:, None]
    m2 = rmask[:, None] & cmask[None, :]
    g = tl.load(g_ptr + seg64 * stride_gs + cols64[None, :] * stride_gd, mask=m2, other=0.0).to(ACC)
    if REDUCE == 1:
        start = tl.load(offsets_ptr + seg, mask=rmask, other=0).to(tl.int32)
        end = tl.load(offsets_ptr + seg + 1, mask=rmask, other=1).to(tl.int32)
        g = g / (end - start).to(ACC)[:, None]
    if REDUCE >= 2:
        arg = tl.load(arg_ptr + seg64 * D + cols64[None, :], mask=m2, other=-1)
        g = tl.where(arg == rows[:, None], g, 0.0)
    tl.store(gx_ptr + rows.to(tl.int64)[:, None] * D + cols64[None, :], g.to(gx_ptr.dtype.element_ty), mask=m2)
