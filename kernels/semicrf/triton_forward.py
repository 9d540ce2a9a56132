"""Triton streaming forward of the semi-CRF (log and max semirings), one program per sequence.

Recursion (conventions in :mod:`provable_kernels.semicrf.call`), run for t = 1..L_b:

    alpha[t, c] = ⊕_{d=1..min(K,t)} in(t-d, d)[c] + seg(t-d, d, c),      in(0, ·) = 0,
    in(s, d)[c] = ⊕_{c'} alpha[s, c'] + trans(d)[c', c],
    seg(s, d, c) = cum[s+d, c] - cum[s, c] + dur[d-1, c] + ps[s, c] + pe[s+d-1, c].

Precision scheme (the same in every kernel of this family):

- per position t a float64 offset ``A[t] = max_c alpha[t, c]``; the values ``a[t, c] = alpha[t, c] - A[t]``
  (O(1)) are stored in the input dtype where they are kept (3-D a-ring, the backward's interval buffer);
- a ring of the last K+1 positions in a small per-sequence float64 scratch (L1/L2 resident) holding the *entry*
  ``U[s, c] = A[s] + in(s)[c] + ps[s, c] - cum[s, c]`` (2-D transitions; in(s) computed once per s) or
  ``U[s, c] = A[s] + ps[s, c] - cum[s, c]`` plus ``a[s, ·]`` in a second ring (3-D transitions);
- the ⊕ along the chain (max, exp, sum, log of the terms ``U[s, c] - (A[t-1] - cum[t, c] - pe[t-1, c]) + dur``,
  the difference formed in float64 and then cast) runs in the *chain dtype* ``CT``, a constexpr:
  - float64 (libdevice exp/log) for training (``train_forward``, which keeps every a[t] and A[t]), Viterbi and
    every float64 input: float32 rounding errors add up as a random walk over the T dependent steps (measured:
    ~1.4e-4 norm-wise on the gradients at T = 1e5 with a float32 chain, ~2e-7 with a float64 one);
  - float32 (hardware exp/log) for the inference route with float32 inputs (``triton_ops.partition``): logZ
    stays accurate because the offsets A[t] and the ring entries are float64 (measured at T = 1e5: logZ relative
    error 5.3e-8, i.e. its float32 output rounding).
  Exceptions, both O(1)-valued: the 3-D transition's per-duration reduction in(s, d) over c' (a (DB, C, C) tile per
  chunk) runs in the input dtype, and so do the backward's marginals (outputs, never fed back).

The ring is read in duration order (row d-1 holds s = t-d), so duration-indexed data (dur, trans(d)) and the
backward's per-duration accumulators stay aligned; the new entry is stored and made visible with one
``tl.debug_barrier()`` per step (ring size K+1, so a step never overwrites an entry it reads). Durations are
processed in chunks of DB rows (NCHUNK chunks, merged with an online logsumexp / max).

Register ring (``REG_RING``, the forward kernel only, where the host's ``triton_ops.register_ring`` allows it: 2-D
transitions, every duration in one chunk, a small shift tile): the ring is a (DB, CP) float64 tile held in
registers, row d-1 holding the entry of s = t-d, shifted down by one row per step (:func:`push_row`). No scratch,
and no store, load or barrier per step. It computes the same operations on the same values as the ring in memory
(bitwise equal under the interpreter); compiled, the kernel runs it with one warp, whose reductions may sum in
another order than the memory ring's warps, so float32 results can differ in the last bits (each deterministic).
"""
from __future__ import annotations

import triton
import triton.language as tl

from provable_kernels.triton_math import lse_merge, lse_parts, lse_shift, semiring_sum, span_nonfinite


@triton.jit
def position_inputs(cum, ps, pe, t, T, C, cols, cmask, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
                    CP: tl.constexpr):
    """``cum[t]``, ``ps[t]``, ``pe[t-1]`` of one sequence as float64 (CP,) rows, 0 where the row does not exist."""
    row = t + 0 * cols  # (CP,): t may be a compile-time constant
    cum_t = tl.load(cum + row * C + cols, mask=cmask & (row >= 0) & (row <= T), other=0.0).to(tl.float64)
    if HAS_PS:
        ps_t = tl.load(ps + row * C + cols, mask=cmask & (row >= 0) & (row < T), other=0.0).to(tl.float64)
    else:
        ps_t = tl.zeros((CP,), tl.float64)
    if HAS_PE:
        pe_t = tl.load(pe + (row - 1) * C + cols, mask=cmask & (row >= 1) & (row <= T), other=0.0).to(tl.float64)
    else:
        pe_t = tl.zeros((CP,), tl.float64)
    return cum_t, ps_t, pe_t


@triton.jit
def dur_chunk(dur, d, K, C, cols, cmask):
    """duration_bias rows d-1 (DB, CP) for a chunk of durations d (DB,), 0 beyond K or C."""
    return tl.load(dur + (d - 1)[:, None] * C + cols[None, :], mask=(d <= K)[:, None] & cmask[None, :], other=0.0)


@triton.jit
def trans_chunk(trans, d, K, C, cols, cmask):
    """trans(d)[c', c] (DB, CP', CP) of a 3-D transition for a chunk of durations d (DB,), -inf where masked."""
    ptr = trans + (d - 1)[:, None, None] * C * C + cols[None, :, None] * C + cols[None, None, :]
    ok = (d <= K)[:, None, None] & cmask[None, :, None] & cmask[None, None, :]
    return tl.load(ptr, mask=ok, other=float("-inf"))


@triton.jit
def load_constants(trans, dur, K, C, cols, cmask, TRANS_3D: tl.constexpr, DB: tl.constexpr):
    """What stays in registers for the whole sequence: duration_bias chunk 0 (DB, CP) and either the 2-D transition
    (CP', CP) or the 3-D transition's chunk 0 (DB, CP', CP)."""
    d = 1 + tl.arange(0, DB)
    if TRANS_3D:
        trans0 = trans_chunk(trans, d, K, C, cols, cmask)
    else:
        trans0 = tl.load(trans + cols[:, None] * C + cols[None, :], mask=cmask[:, None] & cmask[None, :],
                         other=float("-inf"))
    return dur_chunk(dur, d, K, C, cols, cmask), trans0


@triton.jit
def ring_rows(step, d, kmax, KR, cols, cmask):
    """Ring slots (DB,) of positions ``step`` (a (DB,) tensor, e.g. t - d or s + d) and the (DB, CP) mask of the
    rows with d <= kmax."""
    row_ok = d <= kmax
    slot = tl.where(row_ok, step % KR, 0)
    return slot, row_ok[:, None] & cmask[None, :]


@triton.jit
def push_row(held, row, DB: tl.constexpr):
    """``held`` (DB, CP) shifted down by one row, ``row`` (CP,) on top: row i of the result is a sum over a one-hot
    selection of ``held``'s rows with one term that is not zero, so it is exact."""
    i = tl.arange(0, DB)
    below = (i[:, None] == i[None, :] + 1)[:, :, None]  # (new row, old row, 1)
    shifted = tl.sum(tl.where(below, held[None, :, :], 0.0), 1)
    return tl.where((i == 0)[:, None], row[None, :], shifted)


@triton.jit
def _inside_chunk(t, q, kmax, d, KR, C, ring, ring_a, held, dur_k, trans_k, cols, cmask,
                  LOG: tl.constexpr, TRANS_3D: tl.constexpr, WRITE_BP: tl.constexpr, CT: tl.constexpr,
                  REG_RING: tl.constexpr):
    """The terms in(t-d, d) + seg(t-d, d) - A[t-1] (chain dtype CT) for a chunk of durations d (DB,), reduced over d
    per label: LOG: (max, sum exp(term - max), -, -); max: (max, -, best d, best previous label (3-D, WRITE_BP)).
    The entries come from the ring in memory, or (REG_RING) from the register ring ``held``."""
    s = t - d
    slot, ok = ring_rows(s, d, kmax, KR, cols, cmask)
    if REG_RING:
        entry = held
    else:
        entry = tl.load(ring + slot[:, None] * C + cols[None, :], mask=ok, other=float("-inf"))
    term = (entry - q[None, :]).to(CT) + dur_k.to(CT)
    if TRANS_3D:
        a = tl.load(ring_a + slot[:, None] * C + cols[None, :], mask=ok, other=float("-inf"))
        paths = a[:, :, None] + trans_k  # (DB, CP', CP), relative to A[s]
        term += tl.where((s == 0)[:, None], 0.0, semiring_sum(paths, 1, LOG)).to(CT)
    term = tl.where(ok, term, float("-inf"))
    if LOG:
        top, total = lse_parts(term, 0)
    else:
        top = tl.max(term, 0)
        total = tl.zeros_like(top)
    best_d = tl.zeros(top.shape, tl.int32)
    best_prev = tl.zeros(top.shape, tl.int32)
    if WRITE_BP:
        best_d = tl.argmax(term, 0, tie_break_left=True).to(tl.int32) + tl.min(d, 0)
        if TRANS_3D:
            prev = tl.argmax(paths, 1, tie_break_left=True).to(tl.int32)  # (DB, CP)
            best_prev = tl.sum(tl.where(d[:, None] == best_d[None, :], prev, 0), 0)
    return top, total, best_d, best_prev


@triton.jit
def _inside(t, q, kmax, K, KR, C, ring, ring_a, held, trans, dur, dur0, trans0, cols, cmask,
            LOG: tl.constexpr, TRANS_3D: tl.constexpr, WRITE_BP: tl.constexpr, DB: tl.constexpr,
            NCHUNK: tl.constexpr, CT: tl.constexpr, REG_RING: tl.constexpr):
    """alpha[t] - A[t-1] (CP,) in the chain dtype CT from the ring, ``q = A[t-1] - cum[t] - pe[t-1]`` (float64);
    chunk 0 from the register constants, further chunks loaded. With WRITE_BP also the best duration (shortest among ties) and,
    for 3-D transitions, the best previous label (smallest among ties) per label."""
    d = 1 + tl.arange(0, DB)
    top, total, best_d, best_prev = _inside_chunk(t, q, kmax, d, KR, C, ring, ring_a, held, dur0, trans0, cols,
                                                  cmask, LOG, TRANS_3D, WRITE_BP, CT, REG_RING)
    for k in range(1, NCHUNK):
        d = k * DB + 1 + tl.arange(0, DB)
        if TRANS_3D:
            trans_k = trans_chunk(trans, d, K, C, cols, cmask)
        else:
            trans_k = trans0
        c_top, c_total, c_d, c_prev = _inside_chunk(t, q, kmax, d, KR, C, ring, ring_a, held,
                                                    dur_chunk(dur, d, K, C, cols, cmask), trans_k, cols, cmask,
                                                    LOG, TRANS_3D, WRITE_BP, CT, REG_RING)  # (with REG_RING, one chunk: no k)
        if LOG:
            top, total = lse_merge(top, total, c_top, c_total)
        else:
            better = c_top > top  # strict: the earlier chunk (shorter duration) wins ties
            best_d = tl.where(better, c_d, best_d)
            best_prev = tl.where(better, c_prev, best_prev)
            top = tl.maximum(top, c_top)
    if LOG:
        value = lse_shift(top) + tl.log(total)
    else:
        value = top
    return value, best_d, best_prev


@triton.jit
def _advance(t, R, value, cum_t, ps_t, KR, C, ring, ring_a, held, trans0, bp_prev, cols, cmask,
             LOG: tl.constexpr, TRANS_3D: tl.constexpr, WRITE_BP: tl.constexpr, FT: tl.constexpr,
             CT: tl.constexpr, REG_RING: tl.constexpr, DB: tl.constexpr):
    """From ``value = alpha[t] - A[t-1]`` (chain dtype CT): the new offset A[t] = max_c alpha[t, c] (float64) and
    a[t] = alpha[t] - A[t] (CT); pushes the ring entry of t (2-D: with in(t) = ⊕_c' alpha[t, c'] + trans[c', c]
    and, with WRITE_BP, its best previous label per c, smallest among ties, at ``bp_prev[t]``) and makes it
    visible to the whole program; REG_RING: onto the register ring ``held`` instead. Returns (A, a, held)."""
    shift = lse_shift(tl.max(value, 0))
    A = R + shift
    a = value - shift
    slot = t % KR
    if TRANS_3D:
        entry = A + ps_t - cum_t
        tl.store(ring_a + slot * C + cols, a.to(FT), mask=cmask)
    else:
        paths = a[:, None] + trans0.to(CT)  # (CP', CP)
        entry = A + semiring_sum(paths, 0, LOG) + ps_t - cum_t
        if WRITE_BP:
            tl.store(bp_prev + t * C + cols, tl.argmax(paths, 0, tie_break_left=True).to(tl.int32), mask=cmask)
    if REG_RING:
        held = push_row(held, entry, DB)
    else:
        tl.store(ring + slot * C + cols, entry, mask=cmask)
        tl.debug_barrier()
    return A, a, held


@triton.jit
def alpha_step(t, R, cum_t, ps_t, pe_t, K, KR, C, ring, ring_a, held, trans, dur, dur0, trans0, bp_dur, bp_prev,
               cols, cmask, LOG: tl.constexpr, TRANS_3D: tl.constexpr, WRITE_BP: tl.constexpr,
               FT: tl.constexpr, DB: tl.constexpr, NCHUNK: tl.constexpr, CT: tl.constexpr, REG_RING: tl.constexpr):
    """One step of the recursion: (A[t] float64, a[t] in the chain dtype CT, the register ring) from A[t-1] = ``R``
    and the ring (REG_RING: ``held``); pushes the entry of t."""
    q = R - cum_t - pe_t
    value, best_d, best_prev = _inside(t, q, tl.minimum(K, t), K, KR, C, ring, ring_a, held, trans, dur, dur0,
                                       trans0, cols, cmask, LOG, TRANS_3D, WRITE_BP, DB, NCHUNK, CT, REG_RING)
    if WRITE_BP:
        tl.store(bp_dur + t * C + cols, best_d, mask=cmask)
        if TRANS_3D:
            tl.store(bp_prev + t * C + cols, best_prev, mask=cmask)
    return _advance(t, R, value, cum_t, ps_t, KR, C, ring, ring_a, held, trans0, bp_prev, cols, cmask,
                    LOG, TRANS_3D, WRITE_BP, FT, CT, REG_RING, DB)


@triton.jit
def sequence_nonfinite(cum, trans, dur, ps, pe, T, K, C, TRANS_3D: tl.constexpr, HAS_PS: tl.constexpr,
                       HAS_PE: tl.constexpr):
    """The value checks of one sequence (``cum``, ``ps``, ``pe`` at its rows): True when its cumulative scores
    hold NaN or +-inf or do not start with a zero row (``cum[0] = 0``), or its projections, the transitions or the
    duration biases NaN or +inf (padding past its length included)."""
    first_row = tl.arange(0, 1024)
    bad = tl.max((tl.load(cum + first_row, mask=first_row < C, other=0.0) != 0).to(tl.int32), 0) != 0
    bad = bad | span_nonfinite(cum, (T + 1) * C, False, 1024)
    bad = bad | span_nonfinite(trans, K * C * C if TRANS_3D else C * C, True, 1024)
    bad = bad | span_nonfinite(dur, K * C, True, 1024)
    if HAS_PS:
        bad = bad | span_nonfinite(ps, T * C, True, 1024)
    if HAS_PE:
        bad = bad | span_nonfinite(pe, T * C, True, 1024)
    return bad


SIZES = ["T", "K", "KR", "C"]  # integer arguments not specialised: one compilation serves every length


@triton.jit
def forward_sequence(b, cum, trans, dur, ps, pe, lengths, ring, ring_a, alpha_a, alpha_A, bp_dur, bp_prev,
                     T, K, KR, C, LOG: tl.constexpr, TRANS_3D: tl.constexpr, HAS_PS: tl.constexpr,
                     HAS_PE: tl.constexpr, SAVE_ALPHA: tl.constexpr, WRITE_BP: tl.constexpr, FT: tl.constexpr,
                     CT: tl.constexpr, CP: tl.constexpr, DB: tl.constexpr, NCHUNK: tl.constexpr,
                     REG_RING: tl.constexpr):
    """The forward recursion of sequence ``b`` over t = 1..L_b (module docstring; arguments as
    :func:`semicrf_forward_kernel`'s, whole-batch pointers). Returns (⊕_c alpha[L_b, c] as float64, NaN when a
    value check fails; the last a (CP,) in the chain dtype). The sequence's values are checked first
    (:func:`sequence_nonfinite`, and 1 <= L_b <= T; L_b is clamped into 1..T for the recursion). SAVE_ALPHA: keeps
    a[t] (input dtype FT) and A[t] (float64) at every position t >= 1 for the backward (not read here). REG_RING:
    the ring in registers (module docstring; ``ring`` and ``ring_a`` unused)."""
    length = tl.load(lengths + b)
    L = tl.minimum(tl.maximum(length, 1), T).to(tl.int32)  # clamped: a bad length never indexes out of bounds
    cum += b * (T + 1) * C
    if not REG_RING:
        ring += b * KR * C
    if HAS_PS:
        ps += b * T * C
    if HAS_PE:
        pe += b * T * C
    if TRANS_3D:
        ring_a += b * KR * C
    if WRITE_BP:
        bp_dur += b * (T + 1) * C
        bp_prev += b * (T + 1) * C
    if SAVE_ALPHA:
        alpha_a += b * (T + 1) * C
        alpha_A += b * (T + 1)
    bad = sequence_nonfinite(cum, trans, dur, ps, pe, T, K, C, TRANS_3D, HAS_PS, HAS_PE) | (L != length)
    cols = tl.arange(0, CP)
    cmask = cols < C
    dur0, trans0 = load_constants(trans, dur, K, C, cols, cmask, TRANS_3D, DB)

    # position 0: A[0] = 0 and in(0) = 0, so the entry is ps[0] - cum[0]
    cum_t, ps_t, pe_t = position_inputs(cum, ps, pe, 0, T, C, cols, cmask, HAS_PS, HAS_PE, CP)
    if REG_RING:
        held = tl.where((tl.arange(0, DB) == 0)[:, None], (ps_t - cum_t)[None, :], float("-inf"))
    else:
        held = tl.zeros((), tl.float64)  # unused
        tl.store(ring + cols, ps_t - cum_t, mask=cmask)
        if TRANS_3D:
            tl.store(ring_a + cols, tl.zeros((CP,), FT), mask=cmask)
        tl.debug_barrier()
    R = tl.zeros((), tl.float64)
    a = tl.zeros((CP,), CT)
    cum_t, ps_t, pe_t = position_inputs(cum, ps, pe, 1, T, C, cols, cmask, HAS_PS, HAS_PE, CP)
    for t in range(1, L + 1):
        cum_n, ps_n, pe_n = position_inputs(cum, ps, pe, t + 1, T, C, cols, cmask, HAS_PS, HAS_PE, CP)  # prefetch
        R, a, held = alpha_step(t, R, cum_t, ps_t, pe_t, K, KR, C, ring, ring_a, held, trans, dur, dur0, trans0,
                                bp_dur, bp_prev, cols, cmask, LOG, TRANS_3D, WRITE_BP, FT, DB, NCHUNK, CT, REG_RING)
        if SAVE_ALPHA:
            tl.store(alpha_a + t * C + cols, a.to(FT), mask=cmask)
            tl.store(alpha_A + t, R)
        cum_t, ps_t, pe_t = cum_n, ps_n, pe_n
    return tl.where(bad, float("nan"), R + semiring_sum(a, 0, LOG)), a


@triton.jit(do_not_specialize=SIZES)
def semicrf_forward_kernel(
    cum, trans, dur, ps, pe, lengths,  # inputs: (B, T+1, C), (C, C) | (K, C, C), (K, C), (B, T, C) x2, (B,)
    out,  # (B,): ⊕_c alpha[L_b, c], stored in out's dtype
    ring, ring_a,  # scratch (B, KR, C): float64 entries, a-values (3-D transitions only); None with REG_RING
    bp_dur, bp_prev, last_label,  # WRITE_BP: (B, T+1, C) int32 x2, (B,) int32
    # (a pointer whose flag is off, e.g. ps without HAS_PS, may be None: fewer arguments, less launch time)
    T, K, KR, C,  # K = min(K, T), KR = K + 1
    LOG: tl.constexpr, TRANS_3D: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
    WRITE_BP: tl.constexpr,
    FT: tl.constexpr, CT: tl.constexpr, CP: tl.constexpr, DB: tl.constexpr, NCHUNK: tl.constexpr,
    REG_RING: tl.constexpr,
):
    """One program per sequence: :func:`forward_sequence`; ``CT`` is the chain dtype (float64, or float32 on the
    inference route with float32 inputs); REG_RING: the ring in registers (module docstring). When a value check
    fails, ``out[b]`` is NaN, so no value error turns into a number."""
    b = tl.program_id(0).to(tl.int64)
    result, a = forward_sequence(b, cum, trans, dur, ps, pe, lengths, ring, ring_a, None, None, bp_dur, bp_prev,
                                 T, K, KR, C, LOG, TRANS_3D, HAS_PS, HAS_PE, False, WRITE_BP, FT, CT, CP, DB,
                                 NCHUNK, REG_RING)
    tl.store(out + b, result.to(out.dtype.element_ty))
    if WRITE_BP:
        tl.store(last_label + b, tl.argmax(a, 0, tie_break_left=True).to(tl.int32))
