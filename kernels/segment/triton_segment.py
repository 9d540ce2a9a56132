"""Triton kernels of the segment reductions (``@triton.jit`` code only; host side in ``triton_ops``).

Forward layout: ``x`` is viewed as (N, D) with row and column strides; outputs are contiguous (S, D). Each segment is
cut into chunks of at most ``R`` consecutive rows (an empty segment is one empty chunk), listed in segment order:
``first[s]`` is segment s's first chunk (an exclusive cumsum, ``first[S]`` the number of chunks) and
``chunk_seg[c]`` the segment of chunk c, both built on the device by ``triton_ops``. :func:`segment_chunk_kernel`
runs one program per (G chunks, column block): its tile has G x L lanes of BD columns, L lanes per chunk, and lane
l of a chunk reads rows l, l + L, l + 2 L, ... of it, accumulating in registers (no scan, no segment search).
At the end the L lanes of each chunk are reduced (:func:`_reduce_lanes`). A segment of one chunk writes its output
directly (``empty`` for an empty one); the chunks of a longer segment write raw partials (value, arg) to a
workspace row per chunk, and :func:`segment_combine_kernel` reduces them with the same lane code, one group of
lanes per segment: a fixed order, no atomics, bitwise repeatable.

Max and min run as a max of ``SIGN * x`` (negation is exact). Every lane keeps the value and the row of its first
maximum: a later row replaces it only when strictly greater or the first NaN (NaN ranks above every number). The
lanes of a chunk (and the partials of a segment) are merged by value with ties to the lowest row, so the arg is
the first occurrence whatever the lane or chunk split. REDUCE: 0 sum, 1 mean, 2 max, 3 min. Sums accumulate in ACC
(float32, or float64 for float64 input).

Backward: one program per tile of rows finds each row's segment (:func:`row_segments`) and writes grad_x.
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
def _first_max(va, ia, vb, ib):
    """Combine of (value, arg) pairs: the later pair (b) wins when a holds no row (arg BIG), or when b holds a row
    and ranks higher (NaN above every number, then the larger value, then on equal values the lower arg). A total
    order, so any reduction order gives the same pair."""
    tie = (va == vb) | ((va != va) & (vb != vb))
    higher = _beats(va, vb) | (tie & (ib < ia))
    b_wins = (ia == BIG) | ((ib < BIG) & higher)
    return tl.where(b_wins, vb, va), tl.where(b_wins, ib, ia)


@triton.jit
def _finish(v, count, REDUCE: tl.constexpr):
    """Turn a reduced value (sum, or max of SIGN * x) into the output value."""
    if REDUCE == 1:
        v = v / count
    if REDUCE == 3:
        v = -v
    return v


@triton.jit
def _reduce_lanes(src_ptr, src_i_ptr, start, stop, cols64, cmask, stride_r, stride_c,
                  G: tl.constexpr, L: tl.constexpr, BD: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
                  PARTIALS: tl.constexpr):
    """Reduce runs of source rows: lane k (of G x L) reads rows ``start[k]``, ``start[k] + L``, ... below
    ``stop[k]`` (columns ``cols64``), then the L lanes of each group are merged: ``(value (G, BD), arg (G, BD))``.
    Sums: the value (arg unused). Max: the max of ``SIGN * x`` (NaN first) and the lowest row holding it (BIG for a
    group without rows). PARTIALS: the rows are workspace partials (raw value, arg), else rows of x (arg = row)."""
    steps = tl.max((stop - start + (L - 1)) // L, axis=0)
    acc_v = tl.zeros([G * L, BD], ACC)
    acc_i = tl.full([G * L, BD], BIG, tl.int32)
    if REDUCE >= 2:
        acc_v = tl.full([G * L, BD], float("-inf"), ACC)
    for t in range(0, steps):
        rows = start + t * L
        m2 = (rows < stop)[:, None] & cmask[None, :]
        at = rows.to(tl.int64)[:, None] * stride_r + cols64[None, :] * stride_c
        x = tl.load(src_ptr + at, mask=m2, other=0.0).to(ACC)
        if REDUCE >= 2:
            if PARTIALS:
                i = tl.load(src_i_ptr + at, mask=m2, other=BIG)
            else:
                if REDUCE == 3:
                    x = -x
                i = tl.broadcast_to(rows[:, None], [G * L, BD])
            take = m2 & (_beats(acc_v, x) | (acc_i == BIG))
            acc_v = tl.where(take, x, acc_v)
            acc_i = tl.where(take, i, acc_i)
        else:
            acc_v += x
    v3 = tl.reshape(acc_v, [G, L, BD])
    if REDUCE >= 2:
        value, first = tl.reduce((v3, tl.reshape(acc_i, [G, L, BD])), 1, _first_max)
    else:
        value = tl.sum(v3, axis=1)
        first = tl.zeros([G, BD], tl.int32)
    return value, first


@triton.jit(do_not_specialize=("S",))  # sizes that change per batch compile nothing
def segment_chunk_count_kernel(offsets_ptr, first_ptr, S, R: tl.constexpr, BS: tl.constexpr):
    """``first[k]`` = the chunk count of segment k - 1 (max(1, ceil(len / R)); 0 for k = 0): an inclusive cumsum
    of it (done by the host side) is the first chunk of every segment. One pass over the offsets."""
    k = tl.program_id(0) * BS + tl.arange(0, BS)
    m = (k >= 1) & (k <= S)
    lo = tl.load(offsets_ptr + k - 1, mask=m, other=0)
    hi = tl.load(offsets_ptr + k, mask=m, other=0)
    count = tl.where(m, tl.maximum((hi - lo + (R - 1)) // R, 1), 0)
    tl.store(first_ptr + k, count.to(tl.int32), mask=k <= S)


@triton.jit(do_not_specialize=("S",))  # sizes that change per batch compile nothing
def segment_chunk_kernel(
    x_ptr, offsets_ptr, first_ptr, chunk_seg_ptr, empty_ptr, out_ptr, arg_ptr, part_v_ptr, part_i_ptr,
    D, S, stride_xn, stride_xd,
    R: tl.constexpr, G: tl.constexpr, L: tl.constexpr, BD: tl.constexpr,
    REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr,
):
    """Program (p, q) reduces chunks p G .. p G + G - 1 over column block q. A chunk of a one-chunk segment writes
    the output (and arg; ``empty`` and -1 for an empty segment); a chunk of a longer segment writes its raw
    partial to workspace row c. ``chunk_seg`` covers the whole grid: S past the last chunk (the grid is a static
    upper bound), where programs find no rows and store nothing."""
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    lane = tl.arange(0, G * L)
    c = tl.program_id(0) * G + lane // L
    s = tl.load(chunk_seg_ptr + c)
    live = s < S
    lo = tl.load(offsets_ptr + s).to(tl.int32) + (c - tl.load(first_ptr + s)) * R
    lo = tl.where(live, lo, 0)
    hi = lo + tl.minimum(tl.load(offsets_ptr + s + 1, mask=live, other=0).to(tl.int32) - lo, R)  # no overflow
    v, i = _reduce_lanes(x_ptr, x_ptr, lo + lane % L, hi, cols64, cmask, stride_xn, stride_xd,
                         G, L, BD, REDUCE, ACC, False)
    # the same descriptors per chunk (G of them) for the stores
    cg = tl.program_id(0) * G + tl.arange(0, G)
    sg = tl.load(chunk_seg_ptr + cg)
    live_g = sg < S
    chunks = tl.load(first_ptr + sg + 1, mask=live_g, other=0) - tl.load(first_ptr + sg)
    length = (tl.load(offsets_ptr + sg + 1, mask=live_g, other=0) - tl.load(offsets_ptr + sg)).to(tl.int32)
    alone = (live_g & (chunks == 1))[:, None] & cmask[None, :]
    hollow = (length == 0)[:, None]
    value = _finish(v, tl.maximum(length, 1).to(ACC)[:, None], REDUCE).to(out_ptr.dtype.element_ty)
    value = tl.where(hollow, tl.load(empty_ptr), value)
    out_at = sg.to(tl.int64)[:, None] * D + cols64[None, :]
    tl.store(out_ptr + out_at, value, mask=alone)
    if STORE_ARG:
        tl.store(arg_ptr + out_at, tl.where(hollow, -1, i), mask=alone)
    split = (live_g & (chunks > 1))[:, None] & cmask[None, :]
    part_at = cg.to(tl.int64)[:, None] * D + cols64[None, :]
    tl.store(part_v_ptr + part_at, v, mask=split)
    if REDUCE >= 2:
        tl.store(part_i_ptr + part_at, i, mask=split)


@triton.jit(do_not_specialize=("S",))  # sizes that change per batch compile nothing
def segment_combine_kernel(
    offsets_ptr, first_ptr, part_v_ptr, part_i_ptr, out_ptr, arg_ptr, D, S,
    G: tl.constexpr, L: tl.constexpr, BD: tl.constexpr,
    REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr,
):
    """Program (p, q) finishes segments p G .. p G + G - 1 that span several chunks: their partials (workspace
    rows first[s] .. first[s + 1] - 1, in chunk order) are reduced by L lanes each, as the chunk kernel reduces
    rows. One-chunk segments (already written) are skipped."""
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    s = tl.program_id(0) * G + tl.arange(0, G * L) // L
    live = s < S
    lo = tl.load(first_ptr + s, mask=live, other=0)
    hi = tl.load(first_ptr + s + 1, mask=live, other=0)
    hi = tl.where(hi - lo > 1, hi, lo)
    v, i = _reduce_lanes(part_v_ptr, part_i_ptr, lo + tl.arange(0, G * L) % L, hi, cols64, cmask, D, 1,
                         G, L, BD, REDUCE, ACC, True)
    sg = tl.program_id(0) * G + tl.arange(0, G)
    live_g = sg < S
    split = tl.load(first_ptr + sg + 1, mask=live_g, other=0) - tl.load(first_ptr + sg, mask=live_g, other=0) > 1
    length = tl.maximum(tl.load(offsets_ptr + sg + 1, mask=live_g, other=0)
                        - tl.load(offsets_ptr + sg, mask=live_g, other=0), 1).to(ACC)
    mask = split[:, None] & cmask[None, :]
    out_at = sg.to(tl.int64)[:, None] * D + cols64[None, :]
    tl.store(out_ptr + out_at, _finish(v, length[:, None], REDUCE).to(out_ptr.dtype.element_ty), mask=mask)
    if STORE_ARG:
        tl.store(arg_ptr + out_at, i, mask=mask)


@triton.jit(do_not_specialize=("N", "S"))  # sizes that change per batch compile nothing
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
