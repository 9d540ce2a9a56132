"""Triton kernels of the segment reductions (``@triton.jit`` code only; host side in ``triton_ops``).

Layout: ``x`` is viewed as (N, D) with row and column strides; outputs are contiguous (S, D); ``offsets`` (S+1,) are
the CSR offsets, given (offsets form) or, with sorted ``ids`` (IDS), found by the chunk kernel itself (a FAN-ary search
per segment bound, :func:`_id_bounds`) and written for the backward. N and S are runtime
arguments (never compiled in); the constexprs depend on D's column block, the dtype and the reduction only
(``triton_ops.Sizes``). D and the strides keep Triton's default specialisation (equal to 1, divisible by 16), which
lets the loads and stores of contiguous rows be vector accesses: a handful of variants per feature size.

A segment's order of operations depends on its own rows alone (batch invariance: the same bits alone or anywhere in
a batch):

- a *short* segment (at most SHORT rows, empty ones included) is reduced by a program of the short part of the
  chunk kernel's grid, which holds SHORT_GROUPS consecutive segments of SHORT_LANES lanes each: lane l reads rows
  l, l + SHORT_LANES, ... of its segment, accumulating in registers, then the lanes are merged (:func:`_reduce_lanes`);
- a *long* segment (more than SHORT rows) is cut from its first row into chunks of :func:`chunk_rows` rows (a power
  of two from its own length). Chunk j of a segment starting at row a is reduced by program a // SHORT + j of the long
  part of the grid (LANES lanes; the long part comes first in the grid, so that its work, or its idling, overlaps the
  short segments') into workspace slot a // SHORT + j (a long segment has at most n // SHORT chunks, so slots of
  different segments never meet): the program finds its segment with a FAN-ary search over the offsets
  (:func:`segment_at`), or as the id of its last row (IDS), no chunk table. The program of the segment's last chunk
  then finishes it (:func:`_combine_segment`): it waits until the programs of the segment's other slots have
  published their partials (:func:`_wait_published`) and reduces the partials in chunk order with a fixed lane
  count. One launch, no atomic arithmetic on data: bitwise repeatable. Each slot publishes by writing the call's
  ``epoch`` (a host counter, never 0) into its flag, with release semantics after a barrier; the waiting program
  reads the flags with acquire semantics, so it reads the partials after they were written. Every long program
  publishes whether or not it found a long segment, so a wait always ends (after the earlier programs: the slots
  waited on belong to lower program ids, which a GPU starts first). The flags persist between calls (zeros when
  allocated, and allocated again when the epochs wrap: ``triton_ops.scratch``), and a flag equal to the epoch is
  one written in this call. The partials
  workspace is one int32 buffer: the partial values (slots, D) in ACC, the partial args (slots, D) for max / min,
  the slots' tags (slots, column blocks) (:func:`_workspace`).

Max and min run as a max of ``SIGN * x`` (negation is exact). Every lane keeps the value and the row of its first
maximum: a later row replaces it only when strictly greater or the first NaN (NaN ranks above every number). Lanes
(and partials) are merged by value with ties to the lowest row, so the arg is the first occurrence whatever the split.
REDUCE: 0 sum, 1 mean, 2 max, 3 min. Sums accumulate in ACC (float32, or float64 for float64 input).

Value checks (device mode, no host read): every kernel clamps what it reads from the index into range, so nothing is
read out of bounds whatever the index holds. A segment whose bounds are not 0 <= offsets[s] <= offsets[s+1] <= N is
NaN, every segment is NaN when offsets[0] != 0 or offsets[S] != N, and with CHECK_IDS (ids given, not checked on
the host) every row a segment reduces must hold its id. A long segment whose workspace slots another segment's
programs wrote (possible only with unsorted offsets) is NaN too (each slot carries the segment id it holds), and so
is one whose last chunk's program finds another segment (the short part writes it: :func:`_finished_by_last_chunk`).
Backward: a row is NaN unless it lies between its segment's bounds.
"""
from __future__ import annotations

import triton
import triton.language as tl

from provable_kernels.triton_math import float_scalar

BIG = tl.constexpr(2147483647)  # larger than every row index and segment id (int32)


FAN = tl.constexpr(32)  # probes per step of a search: log32 of the size dependent loads
POLLS = tl.constexpr(1 << 24)  # flag polls before a waiting program gives up (its segment is then NaN): never on a GPU


@triton.jit
def _count_below(ptr, targets, size, STRICT: tl.constexpr):
    """For each target of the block ``targets`` (M,): how many of ``ptr[0 .. size - 1]`` (sorted; ``size`` a scalar
    or one per target) lie below it (STRICT: ``<``) or at or below it (``<=``): a FAN-ary search, FAN probes per
    step, log_FAN(size + 1) dependent loads (a binary search takes five times as many). Whatever the memory holds
    (unsorted values in device mode) it reads nothing outside ``ptr[0 .. size - 1]``, ends, and returns a count in
    0 .. size. int32 (M,)."""
    j = tl.arange(0, FAN)
    lo = (targets * 0).to(tl.int32)  # every element below lo counts, none from hi on
    hi = lo + size
    while tl.max(hi - lo, axis=0) > 0:
        step = (hi - lo + FAN - 1) // FAN
        at = lo[:, None] + j[None, :] * step[:, None]
        live = at < hi[:, None]
        value = tl.load(ptr + at, mask=live, other=0)
        if STRICT:
            below = live & (value < targets[:, None])
        else:
            below = live & (value <= targets[:, None])
        c = tl.sum(below.to(tl.int32), axis=1)
        last = lo + (c - 1) * step  # the last probe that counts
        lo, hi = tl.where(c > 0, last + 1, lo), tl.where(c > 0, tl.minimum(last + step, hi), lo)
    return lo


@triton.jit
def segment_at(offsets_ptr, S, row):
    """The last segment s in 0..S with ``offsets[s] <= row`` (0 when there is none): a FAN-ary search
    (:func:`_count_below`), never out of bounds whatever the offsets hold (for sorted offsets: the segment holding
    ``row``, or S past the end)."""
    count = _count_below(offsets_ptr, tl.zeros([1], tl.int32) + row, S + 1, False)
    return tl.maximum(tl.max(count, axis=0) - 1, 0)


@triton.jit
def _bounds(offsets_ptr, s, live, N):
    """(start, end, valid) of segments ``s`` (where ``live``): valid when 0 <= offsets[s] <= offsets[s+1] <= N;
    start = end = 0 (no rows) otherwise. int32."""
    a = tl.load(offsets_ptr + s, mask=live, other=0)
    b = tl.load(offsets_ptr + s + 1, mask=live, other=0)
    valid = live & (a >= 0) & (a <= b) & (b <= N)
    return tl.where(valid, a, 0).to(tl.int32), tl.where(valid, b, 0).to(tl.int32), valid


@triton.jit
def _id_bounds(ids_ptr, k, N):
    """(first row whose id is >= k, first row whose id is >= k + 1) for each segment of the block ``k`` (M,), from
    sorted ``ids`` (:func:`_count_below`), never out of bounds whatever the ids hold. int32."""
    return _count_below(ids_ptr, k, N, True), _count_below(ids_ptr, k, N, False)


@triton.jit
def _segment_bounds(offsets_ptr, ids_ptr, s, live, N, IDS: tl.constexpr):
    """(start, end, valid) of segments ``s`` (where ``live``), from the offsets or (IDS) the sorted ids; start = end
    = 0 where not valid."""
    if IDS:
        a, b = _id_bounds(ids_ptr, s, N)
        valid = live & (a <= b)
        a, b = tl.where(valid, a, 0), tl.where(valid, b, 0)
    else:
        a, b, valid = _bounds(offsets_ptr, s, live, N)
    return a, b, valid


@triton.jit
def _workspace(ws_ptr, slots, D, ACC: tl.constexpr, REDUCE: tl.constexpr):
    """The long chunks' workspace, one int32 buffer: (partial values (slots, D) in ACC, partial args (slots, D)
    int32 (max / min only; sums get none), tags (slots, column blocks) int32)."""
    values = ws_ptr.to(tl.pointer_type(ACC), bitcast=True)
    args = ws_ptr + slots.to(tl.int64) * D * (2 if ACC == tl.float64 else 1)
    tags = args
    if REDUCE >= 2:
        tags = args + slots.to(tl.int64) * D
    return values, args, tags


@triton.jit
def _block(flag, like):
    """The scalar boolean ``flag`` as a boolean block shaped like ``like`` (block & scalar gives integers under the
    interpreter, which a mask must not be)."""
    return (like.to(tl.int32) * 0 + flag.to(tl.int32)) != 0


@triton.jit
def _ends_ok(offsets_ptr, N, S):
    """The offsets start at 0 and end at N."""
    return (tl.load(offsets_ptr) == 0) & (tl.load(offsets_ptr + S) == N)


@triton.jit
def _index_ends_ok(offsets_ptr, ids_ptr, N, S, IDS: tl.constexpr):
    """The index covers rows 0 .. N - 1: the offsets start at 0 and end at N, or (IDS) no row's id lies below 0
    or at S and above (the sorted ids' first and last)."""
    if IDS:
        first = tl.load(ids_ptr, mask=N > 0, other=0)
        last = tl.load(ids_ptr + tl.maximum(N - 1, 0), mask=N > 0, other=0)
        return (N == 0) | ((first >= 0) & (last < S))
    else:
        return _ends_ok(offsets_ptr, N, S)


@triton.jit
def chunk_rows(n, MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr, TARGET: tl.constexpr):
    """Rows per chunk of a long segment of ``n`` rows: the least power of two >= MIN_CHUNK holding n in at most
    TARGET chunks, capped at MIN_CHUNK * 2**DOUBLINGS (``triton_ops.Sizes``)."""
    r = tl.full(n.shape, MIN_CHUNK, tl.int32)
    for _ in tl.static_range(DOUBLINGS):
        r = tl.where(r * TARGET < n, r * 2, r)
    return r


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
def _reduce_lanes(src_ptr, src_i_ptr, ids_ptr, seg, start, stop, cols64, cmask, stride_r, stride_c,
                  G: tl.constexpr, L: tl.constexpr, BD: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
                  PARTIALS: tl.constexpr, CHECK_IDS: tl.constexpr):
    """Reduce runs of source rows: lane k (of G x L) reads rows ``start[k]``, ``start[k] + L``, ... below
    ``stop[k]`` (columns ``cols64``), then the L lanes of each group are merged: ``(value (G, BD), arg (G, BD),
    wrong (G,))``. Sums: the value (arg unused). Max: the max of ``SIGN * x`` (NaN first) and the lowest row holding
    it (BIG for a group without rows). PARTIALS: the rows are workspace partials (raw value, arg), else rows of x
    (arg = row). CHECK_IDS: ``wrong`` is 1 for a group that read a row whose id (``ids_ptr``) is not ``seg``."""
    steps = tl.max((stop - start + (L - 1)) // L, axis=0)
    acc_v = tl.zeros([G * L, BD], ACC)
    acc_i = tl.full([G * L, BD], BIG, tl.int32)
    wrong = tl.zeros([G * L], tl.int32)
    if REDUCE >= 2:
        acc_v = tl.full([G * L, BD], float("-inf"), ACC)
    for t in range(0, steps):
        rows = start + t * L
        live = rows < stop
        if CHECK_IDS:
            wrong = wrong | (live & (tl.load(ids_ptr + rows, mask=live, other=0) != seg)).to(tl.int32)
        m2 = live[:, None] & cmask[None, :]
        at = rows.to(tl.int64)[:, None] * stride_r + cols64[None, :] * stride_c
        if PARTIALS:  # written by other programs in this launch: read from L2
            x = tl.load(src_ptr + at, mask=m2, other=0.0, cache_modifier=".cg").to(ACC)
        else:
            x = tl.load(src_ptr + at, mask=m2, other=0.0).to(ACC)
        if REDUCE >= 2:
            if PARTIALS:
                i = tl.load(src_i_ptr + at, mask=m2, other=BIG, cache_modifier=".cg")
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
    return value, first, tl.max(tl.reshape(wrong, [G, L]), axis=1)


@triton.jit
def _finished_by_last_chunk(offsets_ptr, ids_ptr, s, a, b, long, N, S, SHORT: tl.constexpr,
                            MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr, TARGET: tl.constexpr,
                            IDS: tl.constexpr):
    """For the long segments ``s`` (rows a .. b - 1, where ``long``): whether the long program of the segment's last
    chunk exists and finds ``s`` (the search :func:`_long_chunk` runs), so that it writes the output. Always so for a
    valid index; where not, the short part writes NaN instead, and every output is written exactly once."""
    q = a // SHORT + tl.cdiv(b - a, chunk_rows(b - a, MIN_CHUNK, DOUBLINGS, TARGET)) - 1
    row = tl.where(long, (q + 1) * SHORT - 1, 0)
    exists = long & (q < N // SHORT)
    if IDS:
        found = tl.load(ids_ptr + row, mask=exists, other=0).to(tl.int32)
        found = tl.minimum(tl.maximum(found, 0), tl.maximum(S - 1, 0))
    else:
        # size 0 where not long: a group without long segments searches nothing
        found = tl.maximum(_count_below(offsets_ptr, row, tl.where(long, S + 1, 0), False) - 1, 0)
    return exists & (found == s)


@triton.jit
def _short_segments(x_ptr, offsets_ptr, ids_ptr, out_ptr, arg_ptr, pid, N, S, D, stride_xn, stride_xd, empty,
                    ends_ok, cols64, cmask, SHORT: tl.constexpr, SHORT_LANES: tl.constexpr,
                    SHORT_GROUPS: tl.constexpr, BD: tl.constexpr, REDUCE: tl.constexpr, STORE_ARG: tl.constexpr,
                    MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr, TARGET: tl.constexpr,
                    ACC: tl.constexpr, IDS: tl.constexpr, CHECK_IDS: tl.constexpr):
    """Segments pid G .. pid G + G - 1 (G = SHORT_GROUPS): the short ones write their output, the invalid ones NaN;
    the long ones are written by the program of their last chunk (:func:`_finished_by_last_chunk`; NaN here where
    that program would find another segment, possible only with a bad index). IDS: the group's bounds are written
    to the offsets (column block 0; segment 0's start by program 0)."""
    sg = pid * SHORT_GROUPS + tl.arange(0, SHORT_GROUPS)
    ag, bg, valid_g = _segment_bounds(offsets_ptr, ids_ptr, sg, sg < S, N, IDS)
    if IDS:
        writes = (sg < S) & _block(tl.program_id(1) == 0, sg)
        tl.store(offsets_ptr + sg + 1, bg, mask=writes)
        tl.store(offsets_ptr + sg, ag, mask=writes & (sg == 0))
    lane = tl.arange(0, SHORT_GROUPS * SHORT_LANES)  # each group's bounds in each of its lanes:
    a = tl.reshape(tl.broadcast_to(ag[:, None], [SHORT_GROUPS, SHORT_LANES]), [SHORT_GROUPS * SHORT_LANES])
    b = tl.reshape(tl.broadcast_to(bg[:, None], [SHORT_GROUPS, SHORT_LANES]), [SHORT_GROUPS * SHORT_LANES])
    start = a + lane % SHORT_LANES
    stop = tl.where(b - a <= SHORT, b, start)
    v, i, wrong = _reduce_lanes(x_ptr, x_ptr, ids_ptr, pid * SHORT_GROUPS + lane // SHORT_LANES, start, stop,
                                cols64, cmask, stride_xn, stride_xd, SHORT_GROUPS, SHORT_LANES, BD, REDUCE, ACC,
                                False, CHECK_IDS)
    length = bg - ag
    long = valid_g & (length > SHORT)
    finished = _finished_by_last_chunk(offsets_ptr, ids_ptr, sg, ag, bg, long, N, S, SHORT, MIN_CHUNK, DOUBLINGS,
                                       TARGET, IDS)
    bad = ~valid_g | (wrong != 0) | ~_block(ends_ok, sg) | long  # a long segment here: one nobody else finishes
    mine = ((sg < S) & ~finished)[:, None] & cmask[None, :]
    value = _finish(v, tl.maximum(length, 1).to(ACC)[:, None], REDUCE)
    value = tl.where((length == 0)[:, None], empty, value)
    value = tl.where(bad[:, None], float("nan"), value)
    out_at = sg.to(tl.int64)[:, None] * D + cols64[None, :]
    tl.store(out_ptr + out_at, value.to(out_ptr.dtype.element_ty), mask=mine)
    if STORE_ARG:
        tl.store(arg_ptr + out_at, tl.where(((length == 0) | bad)[:, None], -1, i), mask=mine)


@triton.jit
def _slot_word(ptr, slot):
    """The address of workspace slot ``slot``'s word for this column block, in a (slots, column blocks) int32 array
    (the tags, the flags)."""
    return ptr + slot.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)


@triton.jit
def _wait_published(flags_ptr, first, stop, epoch, LANES: tl.constexpr):
    """Wait until the programs of slots ``first .. stop - 1`` (this column block) have published their partials in
    this call (flag == ``epoch``, read with acquire semantics, LANES slots at a time), then a barrier; at most POLLS
    polls. True when they all have."""
    lane = tl.arange(0, LANES)
    t = first
    polls = 0
    while (t < stop) & (polls < POLLS):
        slot = t + lane
        live = slot < stop
        seen = tl.atomic_or(_slot_word(flags_ptr, slot), 0, mask=live, sem="acquire", scope="gpu")
        t = tl.where(tl.max((live & (seen != epoch)).to(tl.int32), axis=0) == 0, t + LANES, t)
        polls += 1
    tl.debug_barrier()
    return t >= stop


@triton.jit
def _publish(flags_ptr, q, epoch):
    """Slot q's partial (this column block) is written: a barrier (every thread's stores are done), then the flag
    set to ``epoch`` with release semantics."""
    tl.debug_barrier()
    tl.atomic_xchg(_slot_word(flags_ptr, q), epoch, sem="release", scope="gpu")


@triton.jit
def _long_chunk(x_ptr, offsets_ptr, ids_ptr, out_ptr, arg_ptr, part_v_ptr, part_i_ptr, tag_ptr, flags_ptr, epoch, q,
                N, S, D, stride_xn, stride_xd, cols64, cmask, SHORT: tl.constexpr, LANES: tl.constexpr,
                COMBINE_LANES: tl.constexpr, MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr, TARGET: tl.constexpr,
                BD: tl.constexpr, REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr, IDS: tl.constexpr,
                CHECK_IDS: tl.constexpr):
    """Workspace slot q: chunk j = q - start // SHORT of the long segment holding row (q + 1) SHORT - 1, when there
    is one, reduced by LANES lanes into partial row q; the slot's tag is that segment's id, or -1 (every slot's tag
    is written by every call, so no stale one is read), and the slot is published (:func:`_publish`). The program
    of the segment's last chunk then finishes the segment (:func:`_combine_segment`). The segment: a FAN-ary search
    over the offsets, or (IDS) the row's id, clamped into 0 .. S - 1 (its bounds are then checked like any other)."""
    row = (q + 1) * SHORT - 1
    if IDS:
        s = tl.load(ids_ptr + row).to(tl.int32)  # row < N: the grid has N // SHORT long programs
        s = tl.minimum(tl.maximum(s, 0), tl.maximum(S - 1, 0))
        a_block, b_block = _id_bounds(ids_ptr, tl.zeros([1], tl.int32) + s, N)
        a, b = tl.max(a_block, axis=0), tl.max(b_block, axis=0)
        valid = (s < S) & (a <= b)
        a, b = tl.where(valid, a, 0), tl.where(valid, b, 0)
    else:
        s = segment_at(offsets_ptr, S, row)
        a, b, valid = _bounds(offsets_ptr, s, s < S, N)
    length = b - a
    rows = chunk_rows(length, MIN_CHUNK, DOUBLINGS, TARGET)
    j = q - a // SHORT
    chunks = tl.cdiv(length, rows)
    real = valid & (length > SHORT) & (j >= 0) & (j < chunks)  # j * rows could overflow
    lo = tl.where(real, a + j * rows, 0)
    hi = tl.where(real, tl.minimum(lo + rows, b), 0)
    lane = tl.arange(0, LANES)
    v, i, wrong = _reduce_lanes(x_ptr, x_ptr, ids_ptr, s + lane * 0, lo + lane, hi + lane * 0, cols64, cmask,
                                stride_xn, stride_xd, 1, LANES, BD, REDUCE, ACC, False, CHECK_IDS)
    real = real & (tl.max(wrong, axis=0) == 0)
    part_at = q.to(tl.int64) * D + cols64[None, :]
    keep = cmask[None, :] & _block(real, cmask)[None, :]
    tl.store(part_v_ptr + part_at, v, mask=keep)
    if REDUCE >= 2:
        tl.store(part_i_ptr + part_at, i, mask=keep)
    tl.store(_slot_word(tag_ptr, q), tl.where(real, s, -1))
    _publish(flags_ptr, q, epoch)
    if valid & (length > SHORT) & (j == chunks - 1):  # the last chunk (the short part leaves the segment to it)
        first = a // SHORT
        ready = _wait_published(flags_ptr, first, q, epoch, COMBINE_LANES)
        _combine_segment(part_v_ptr, part_i_ptr, tag_ptr, out_ptr, arg_ptr, s, first, q + 1, length, D,
                         ready & _index_ends_ok(offsets_ptr, ids_ptr, N, S, IDS), cols64, cmask, COMBINE_LANES, BD,
                         REDUCE, STORE_ARG, ACC)


@triton.jit(do_not_specialize=("N", "S", "long_programs", "short_programs", "epoch"))  # per-call values: runtime
def segment_chunk_kernel(
    x_ptr, offsets_ptr, ids_ptr, out_ptr, arg_ptr, ws_ptr, flags_ptr, epoch,
    N, S, D, long_programs, short_programs, stride_xn, stride_xd, EMPTY_HI, EMPTY_LO,
    SHORT: tl.constexpr, SHORT_LANES: tl.constexpr, SHORT_GROUPS: tl.constexpr, LANES: tl.constexpr,
    COMBINE_LANES: tl.constexpr, MIN_CHUNK: tl.constexpr, DOUBLINGS: tl.constexpr, TARGET: tl.constexpr,
    BD: tl.constexpr, REDUCE: tl.constexpr, STORE_ARG: tl.constexpr, ACC: tl.constexpr, IDS: tl.constexpr,
    CHECK_IDS: tl.constexpr,
):
    """``long_programs`` programs (N // SHORT workspace slots) reduce one chunk of a long segment each, the last
    chunk's program finishing the segment (:func:`_long_chunk`), ``short_programs`` the short segments
    (:func:`_short_segments`); column block ``program_id(1)``. The two kinds alternate in the grid (the longer
    list's rest last), so that the long programs' searches, idle ones included, overlap the short ones' streaming.
    ``empty`` arrives as two float32 halves (:func:`provable_kernels.launch.float_halves`), ``flags_ptr`` holds the
    slots' flags (long_programs, column blocks) and ``epoch`` is this call's flag value (module doc)."""
    pid = tl.program_id(0)
    both = tl.minimum(long_programs, short_programs)
    alternating = pid < 2 * both
    is_long = tl.where(alternating, pid % 2 == 0, long_programs > short_programs)
    index = tl.where(alternating, pid // 2, pid - both)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    if is_long:
        part_v_ptr, part_i_ptr, tag_ptr = _workspace(ws_ptr, long_programs, D, ACC, REDUCE)
        _long_chunk(x_ptr, offsets_ptr, ids_ptr, out_ptr, arg_ptr, part_v_ptr, part_i_ptr, tag_ptr, flags_ptr, epoch,
                    index, N, S, D, stride_xn, stride_xd, cols64, cmask, SHORT, LANES, COMBINE_LANES, MIN_CHUNK,
                    DOUBLINGS, TARGET, BD, REDUCE, STORE_ARG, ACC, IDS, CHECK_IDS)
    else:
        empty = float_scalar(EMPTY_HI, EMPTY_LO, ACC == tl.float64)
        _short_segments(x_ptr, offsets_ptr, ids_ptr, out_ptr, arg_ptr, index, N, S, D, stride_xn,
                        stride_xd, empty, _index_ends_ok(offsets_ptr, ids_ptr, N, S, IDS), cols64, cmask, SHORT,
                        SHORT_LANES, SHORT_GROUPS, BD, REDUCE, STORE_ARG, MIN_CHUNK, DOUBLINGS, TARGET, ACC, IDS,
                        CHECK_IDS)


@triton.jit
def _combine_segment(part_v_ptr, part_i_ptr, tag_ptr, out_ptr, arg_ptr, s, first, stop, length, D, ok, cols64,
                     cmask, LANES: tl.constexpr, BD: tl.constexpr, REDUCE: tl.constexpr, STORE_ARG: tl.constexpr,
                     ACC: tl.constexpr):
    """Long segment s of ``length`` rows: its partials, in slots ``first .. stop - 1``, reduced by LANES lanes (lane
    l reads partials l, l + LANES, ...), as a program of short segments reduces rows. NaN when a slot's tag (this
    column block) is not s or not ``ok`` (the index's ends, and every slot published)."""
    lane = tl.arange(0, LANES)
    v, i, _ = _reduce_lanes(part_v_ptr, part_i_ptr, tag_ptr, s, first + lane, stop + lane * 0, cols64, cmask,
                            D, 1, 1, LANES, BD, REDUCE, ACC, True, False)
    foreign = tl.zeros([LANES], tl.int32)
    for t in range(0, tl.cdiv(stop - first, LANES)):
        slot = first + t * LANES + lane
        tag = tl.load(_slot_word(tag_ptr, slot), mask=slot < stop, other=s, cache_modifier=".cg")
        foreign = foreign | (tag != s).to(tl.int32)
    bad = (tl.max(foreign, axis=0) != 0) | ~ok
    value = tl.where(bad, float("nan"), _finish(v, length.to(ACC), REDUCE))
    out_at = s.to(tl.int64) * D + cols64[None, :]
    tl.store(out_ptr + out_at, value.to(out_ptr.dtype.element_ty), mask=cmask[None, :])
    if STORE_ARG:
        tl.store(arg_ptr + out_at, tl.where(bad, -1, i), mask=cmask[None, :])


@triton.jit
def row_segments(ids_ptr, offsets_ptr, rows, base, last_row, S, IDS: tl.constexpr, BK: tl.constexpr):
    """Segment id of each row in ``rows`` (int32, clamped into 0..S-1). IDS: ``ids[row]``. Else ``base`` (the last
    segment starting at or before the tile's first row) plus the number of boundaries ``offsets[base+1 ..]`` at or
    below the row, counted BK boundaries at a time until one lies past ``last_row``."""
    if IDS:
        seg = tl.load(ids_ptr + rows, mask=rows <= last_row, other=0)
        seg = tl.minimum(tl.maximum(seg, 0), S - 1).to(tl.int32)
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
        seg = tl.minimum(base + count, S - 1)
    return seg


@triton.jit(do_not_specialize=("N", "S"))  # sizes that change per batch compile nothing
def segment_backward_kernel(
    g_ptr, ids_ptr, offsets_ptr, arg_ptr, gx_ptr,
    N, D, S, stride_gs, stride_gd,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    IDS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
):
    """grad_x (N, D) for one tile of rows: the upstream gradient of the row's segment (sum), divided by the
    segment's length (mean), or only at the saved arg row (max, min); zero elsewhere. NaN for a row outside its
    segment's bounds (a bad index in device mode)."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    rows = t * BN + tl.arange(0, BN)
    rmask = rows < N
    last_row = tl.minimum(t * BN + BN, N) - 1
    base = tl.full((), 0, tl.int32)
    if not IDS:
        base = segment_at(offsets_ptr, S, t * BN)
    seg = row_segments(ids_ptr, offsets_ptr, rows, base, last_row, S, IDS, BK)
    start = tl.load(offsets_ptr + seg, mask=rmask, other=0)
    end = tl.load(offsets_ptr + seg + 1, mask=rmask, other=1)
    inside = (start <= rows) & (rows < end) & _block(_ends_ok(offsets_ptr, N, S), rows)
    if IDS:
        inside = inside & (tl.load(ids_ptr + rows, mask=rmask, other=0) == seg)
    seg64 = seg.to(tl.int64)[:, None]
    m2 = rmask[:, None] & cmask[None, :]
    g = tl.load(g_ptr + seg64 * stride_gs + cols64[None, :] * stride_gd, mask=m2, other=0.0).to(ACC)
    if REDUCE == 1:
        g = g / tl.maximum(end - start, 1).to(ACC)[:, None]
    if REDUCE >= 2:
        arg = tl.load(arg_ptr + seg64 * D + cols64[None, :], mask=m2, other=-1)
        g = tl.where(arg == rows[:, None], g, 0.0)
    g = tl.where(inside[:, None], g, float("nan"))
    tl.store(gx_ptr + rows.to(tl.int64)[:, None] * D + cols64[None, :], g.to(gx_ptr.dtype.element_ty), mask=m2)
