"""Triton training kernels of the semi-CRF log partition: the forward recursion and the hand-written backward in
one launch, one program per sequence, then the scaling by grad_logZ.

Outside recursion (beta[L, ·] = 0):

    beta[s, c'] = ⊕_{d, c: s+d <= L} trans(d)[c', c] + seg(s, d, c) + beta[s+d, c],

segment marginals P(s, d, c', c) = exp(alpha[s, c'] + trans(d)[c', c] + seg(s, d, c) + beta[s+d, c] - logZ)
(s = 0: exp(seg + beta - logZ)) and from them:

    g_cum[t, c] = ends(t, c) - starts(t, c),  g_ps[s, c] = starts(s, c),  g_pe[t-1, c] = ends(t, c),
    g_dur[d-1, c] = Σ_s Σ_c' P(s, d, c', c),  g_trans = Σ_s Σ_d P (2-D) or Σ_s P per d (3-D),

with ends(t, c) = exp(alpha[t, c] + beta[t, c] - logZ) and starts(s, c) = Σ_d Σ_c' P(s, d, c', c).

:func:`semicrf_train_kernel`: the program runs the forward recursion of
:func:`~provable_kernels.semicrf.triton_forward.forward_sequence` (float64 chain), keeping every position's
a[t] = alpha[t] - A[t] and float64 offset A[t], then the outside recursion from s = L-1 down to 0 over them, with a
ring of float64 entries ``W[e, c] = beta[e, c] + cum[e, c] + pe[e-1, c]`` (K+1 slots, the forward's ring reused).
It writes logZ and the sequence's gradients of its own logZ (grad_logZ = 1), which :func:`semicrf_scale_kernel`
multiplies by grad_logZ in the autograd backward (one launch: little host time on autograd's thread).

Precision: as in :mod:`provable_kernels.semicrf.triton_forward`: the outside recursion's logsumexps run in float64 on
``X = W[s+d] + ps[s] - cum[s] - M + dur`` (M = max beta[s+1], the carried float64 reference). The marginals are
exponentials of working-dtype (``FT``: float64 on the training route) numbers that are O(1) for the terms that
matter (X, a[s] = alpha relative to its max A[s], ``G = A[s] + M - logZ``). The duration / transition sums
accumulate in float64.

Determinism: each program writes only its own rows of g_cum / g_ps / g_pe and its own (b, ...) float64 partial
sums for duration_bias and transition (from registers, or for duration chunks >= 1 / 3-D transitions a
per-sequence buffer updated by the thread that owns each element); the scaling kernel sums them over b in a
fixed order. No atomics.
"""
from __future__ import annotations

import triton
import triton.language as tl

from provable_kernels.triton_math import logsumexp, lse_merge, lse_parts, lse_shift

from provable_kernels.semicrf.triton_forward import (
    SIZES,
    dur_chunk,
    forward_sequence,
    load_constants,
    position_inputs,
    ring_rows,
    trans_chunk,
)


@triton.jit
def _accumulate(ptr, value, mask):
    """ptr[...] += value in float64, each element read and written by the thread that owns it (deterministic, no
    atomics)."""
    tl.store(ptr, tl.load(ptr, mask=mask, other=0.0) + value.to(tl.float64), mask=mask)


@triton.jit
def _outside_chunk(s, M, G, g, kmax, d, h, a_s, incoming, KR, C, bring, dur_k, trans_k, g_trans, cols, cmask,
                   TRANS_3D: tl.constexpr, FT: tl.constexpr):
    """Segments [s, s+d) for a chunk of durations d (DB,). Returns (max (float64), sum exp) of the online
    logsumexp (2-D: of seg + beta - M over d per c; 3-D: of trans(d) + seg + beta - M over (d, c) per c'), the
    marginals Σ_c' P(s, d, c', c) (DB, CP) and, for 3-D, their sum over d (2-D: 0). 3-D: adds P to the
    per-sequence transition gradient buffer, times g (0 for a dead sequence, else 1; not at s = 0, where the first
    segment pays no transition)."""
    slot, ok = ring_rows(s + d, d, kmax, KR, cols, cmask)
    w = tl.load(bring + slot[:, None] * C + cols[None, :], mask=ok, other=float("-inf"))
    x64 = tl.where(ok, w + h[None, :] - M + dur_k.to(tl.float64), float("-inf"))  # seg(s, d, c) + beta[s+d, c] - M
    x = x64.to(FT)
    if TRANS_3D:
        pairs_in = a_s[None, :, None] + trans_k  # alpha[s, c'] - A[s] + trans(d)[c', c], (DB, CP', CP)
        incoming = tl.where((s + 0 * d == 0)[:, None], 0.0, logsumexp(pairs_in, 1))  # in(s, d) - A[s], (DB, CP)
        seg = tl.exp(x + incoming + G)
        pair_ok = (d <= kmax) & (s + 0 * d > 0)
        ptr = g_trans + (d - 1)[:, None, None] * C * C + cols[None, :, None] * C + cols[None, None, :]
        _accumulate(ptr, g * tl.exp(pairs_in + x[:, None, :] + G),
                    pair_ok[:, None, None] & cmask[None, :, None] & cmask[None, None, :])
        out = trans_k + x[:, None, :]
        top = tl.max(tl.max(out, 2), 0)
        total = tl.sum(tl.sum(tl.exp(out - lse_shift(top)[None, :, None]), 2), 0).to(tl.float64)
        top = top.to(tl.float64)
        starts = tl.sum(seg, 0)
    else:
        seg = tl.exp(x + (incoming + G)[None, :])
        top, total = lse_parts(x64, 0)
        starts = tl.zeros_like(total)
    return top, total, seg, starts


@triton.jit
def _outside(s, M, G, g, kmax, h, a_s, first, K, KR, C, bring, trans, dur, dur0, trans0, g_dur, g_trans, dur_acc,
             trans_acc, cols, cmask, TRANS_3D: tl.constexpr, FT: tl.constexpr, CP: tl.constexpr,
             DB: tl.constexpr, NCHUNK: tl.constexpr):
    """Segments starting at s: returns (starts(s) (CP,), beta[s] - M (CP,) float64, dur_acc, trans_acc). The
    duration gradient of chunk 0 accumulates in ``dur_acc`` (registers), of later chunks in the per-sequence
    float64 buffer (times g); the 2-D transition gradient in ``trans_acc`` (skipped at s = 0,
    ``first``).

    ``h = ps[s] - cum[s]`` (float64), ``a_s = alpha[s] - A[s]``, ``G = A[s] + M - logZ`` (A[0] = 0)."""
    if TRANS_3D:
        incoming = tl.zeros((CP,), FT)  # unused: in(s, d) depends on d, computed per chunk
    else:
        pairs_in = a_s[:, None] + trans0  # alpha[s, c'] - A[s] + trans[c', c], (CP', CP)
        incoming = tl.where(first, 0.0, logsumexp(pairs_in, 0))  # in(s) - A[s]
    d = 1 + tl.arange(0, DB)
    top, total, seg, starts = _outside_chunk(s, M, G, g, kmax, d, h, a_s, incoming, KR, C, bring, dur0, trans0,
                                             g_trans, cols, cmask, TRANS_3D, FT)
    dur_acc += seg
    for k in range(1, NCHUNK):
        d = k * DB + 1 + tl.arange(0, DB)
        if TRANS_3D:
            trans_k = trans_chunk(trans, d, K, C, cols, cmask)
        else:
            trans_k = trans0
        c_top, c_total, c_seg, c_starts = _outside_chunk(s, M, G, g, kmax, d, h, a_s, incoming, KR, C, bring,
                                                         dur_chunk(dur, d, K, C, cols, cmask), trans_k, g_trans,
                                                         cols, cmask, TRANS_3D, FT)
        top, total = lse_merge(top, total, c_top, c_total)
        starts += c_starts
        _accumulate(g_dur + (d - 1)[:, None] * C + cols[None, :], g * c_seg, (d <= K)[:, None] & cmask[None, :])
    lse = lse_shift(top) + tl.log(total)
    if TRANS_3D:
        beta = lse
    else:
        out = lse.to(FT) + G  # o(s) - M + G
        starts = tl.exp(incoming + out)
        beta = logsumexp(trans0.to(tl.float64) + lse[None, :], 1)
        trans_acc += tl.where(first, 0.0, tl.exp(pairs_in + out[None, :]))
    return starts, beta, dur_acc, trans_acc


@triton.jit(do_not_specialize=SIZES)
def semicrf_train_kernel(
    cum, trans, dur, ps, pe, lengths,  # inputs as in the forward kernel
    out,  # (B,): logZ in out's dtype
    ring, ring_a,  # scratch (B, KR, C) float64: the forward's rings, then ``ring`` is the outside ring
    alpha_a, alpha_A,  # scratch: a[t] (B, T+1, C) and float64 offsets A[t] (B, T+1) kept by the forward
    g_cum, g_ps, g_pe,  # (B, T+1, C), (B, T, C) x2: every element written here (zeros past the length)
    g_dur, g_trans,  # float64 per-sequence sums: row b of a (B, C*C | K*C*C + K*C) buffer holds its transition sums
                     # at g_trans (3-D: zeroed here, then accumulated) and its (K, C) duration sums right after
    T, K, KR, C,
    TRANS_3D: tl.constexpr, HAS_PS: tl.constexpr, HAS_PE: tl.constexpr,
    FT: tl.constexpr, CT: tl.constexpr, CP: tl.constexpr, DB: tl.constexpr, NCHUNK: tl.constexpr,
):
    """One program per sequence: the forward recursion (chain dtype CT: float64), keeping alpha, then the outside
    recursion over it, writing logZ and the sequence's gradients of its own logZ (grad_logZ = 1; zero when
    logZ = -inf, NaN when the forward's value checks failed). See the module docstring."""
    b = tl.program_id(0).to(tl.int64)
    logZ, _ = forward_sequence(b, cum, trans, dur, ps, pe, lengths, ring, ring_a, alpha_a, alpha_A, None, None,
                               T, K, KR, C, True, TRANS_3D, HAS_PS, HAS_PE, True, False, FT, CT, CP, DB, NCHUNK,
                               False)
    tl.store(out + b, logZ.to(out.dtype.element_ty))
    tl.debug_barrier()  # alpha and the ring, written above by every thread of the program, are read below
    L = tl.minimum(tl.maximum(tl.load(lengths + b), 1), T).to(tl.int32)  # clamped as in the forward
    dead = logZ == float("-inf")  # no finite segmentation: zero gradients
    g = tl.where(dead, 0.0, 1.0).to(FT)
    logZ = tl.where(dead, 0.0, logZ)
    bring = ring + b * KR * C  # the forward's ring, now free
    cum += b * (T + 1) * C
    alpha_a += b * (T + 1) * C
    alpha_A += b * (T + 1)
    g_cum += b * (T + 1) * C
    if HAS_PS:
        ps += b * T * C
        g_ps += b * T * C
    if HAS_PE:
        pe += b * T * C
        g_pe += b * T * C
    part = (K * C * C if TRANS_3D else C * C) + K * C  # a sequence's row of the partial sums (one buffer)
    g_dur += b * part
    g_trans += b * part
    cols = tl.arange(0, CP)
    cmask = cols < C
    # the rows the recursion does not reach (past the length) are zeros, and the sums accumulated in memory (3-D
    # transitions, durations past the first chunk) start at zero: written here, so that no launch zero-fills them
    for t in range(L + 1, T + 1):
        tl.store(g_cum + t * C + cols, tl.zeros((CP,), g_cum.dtype.element_ty), mask=cmask)
    for t in range(L, T):
        if HAS_PS:
            tl.store(g_ps + t * C + cols, tl.zeros((CP,), g_ps.dtype.element_ty), mask=cmask)
        if HAS_PE:
            tl.store(g_pe + t * C + cols, tl.zeros((CP,), g_pe.dtype.element_ty), mask=cmask)
    if TRANS_3D:
        for k in range(K):
            tl.store(g_trans + k * C * C + cols[:, None] * C + cols[None, :], tl.zeros((CP, CP), tl.float64),
                     mask=cmask[:, None] & cmask[None, :])
    for k in range(1, NCHUNK):  # durations past the first chunk accumulate in g_dur (chunk 0 in registers)
        d = k * DB + 1 + tl.arange(0, DB)
        tl.store(g_dur + (d - 1)[:, None] * C + cols[None, :], tl.zeros((DB, CP), tl.float64),
                 mask=(d <= K)[:, None] & cmask[None, :])
    tl.debug_barrier()  # the accumulated sums are read back by the threads that add to them
    dur0, trans0 = load_constants(trans, dur, K, C, cols, cmask, TRANS_3D, DB)
    dur_acc = tl.zeros((DB, CP), tl.float64)  # register sums
    trans_acc = tl.zeros((CP, CP), tl.float64)
    M = tl.zeros((), tl.float64)

    # position L: beta[L] = 0, a segment ends there with probability exp(alpha[L] - logZ)
    a_L = tl.load(alpha_a + L * C + cols, mask=cmask, other=float("-inf"))
    ends = g * tl.exp(a_L + (tl.load(alpha_A + L) - logZ).to(FT))
    tl.store(g_cum + L * C + cols, ends, mask=cmask)
    if HAS_PE:
        tl.store(g_pe + (L - 1) * C + cols, ends, mask=cmask)
    cum_L, ps_L, pe_L = position_inputs(cum, ps, pe, L, T, C, cols, cmask, HAS_PS, HAS_PE, CP)
    tl.store(bring + (L % KR) * C + cols, cum_L + pe_L, mask=cmask)
    tl.debug_barrier()

    # outside recursion for s = L-1 .. 0
    cum_t, ps_t, pe_t = position_inputs(cum, ps, pe, L - 1, T, C, cols, cmask, HAS_PS, HAS_PE, CP)
    for i in range(L):
        s = L - 1 - i
        cum_n, ps_n, pe_n = position_inputs(cum, ps, pe, s - 1, T, C, cols, cmask, HAS_PS, HAS_PE, CP)
        first = s == 0
        later = cmask & (s + 0 * cols > 0)  # (CP,) vector: the interpreter mishandles scalar & vector masks
        a_s = tl.load(alpha_a + s * C + cols, mask=later, other=0.0)
        A_s = tl.load(alpha_A + s, mask=s > 0, other=0.0)
        G = (A_s + M - logZ).to(FT)
        starts, beta, dur_acc, trans_acc = _outside(
            s, M, G, g, tl.minimum(K, L - s), ps_t - cum_t, a_s, first, K, KR, C, bring, trans, dur, dur0, trans0,
            g_dur, g_trans, dur_acc, trans_acc, cols, cmask, TRANS_3D, FT, CP, DB, NCHUNK)
        ends = tl.where(first, 0.0, tl.exp(a_s + beta.to(FT) + G))
        tl.store(g_cum + s * C + cols, g * (ends - starts), mask=cmask)
        if HAS_PS:
            tl.store(g_ps + s * C + cols, g * starts, mask=cmask)
        if HAS_PE:
            tl.store(g_pe + (s - 1) * C + cols, g * ends, mask=later)
        tl.store(bring + (s % KR) * C + cols, M + beta + cum_t + pe_t, mask=cmask)
        M += lse_shift(tl.max(beta, 0))
        tl.debug_barrier()
        cum_t, ps_t, pe_t = cum_n, ps_n, pe_n

    g = g.to(tl.float64)
    d = 1 + tl.arange(0, DB)
    tl.store(g_dur + (d - 1)[:, None] * C + cols[None, :], g * dur_acc, mask=(d <= K)[:, None] & cmask[None, :])
    if not TRANS_3D:
        tl.store(g_trans + cols[:, None] * C + cols[None, :], g * trans_acc, mask=cmask[:, None] & cmask[None, :])


@triton.jit
def _scale_span(src, dst, n, g, BLOCK: tl.constexpr):
    """dst[0:n] = g * src[0:n] (float64 product, stored in dst's dtype), BLOCK elements at a time."""
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        tl.store(dst + offs, (g * tl.load(src + offs, mask=offs < n, other=0.0)).to(dst.dtype.element_ty),
                 mask=offs < n)


@triton.jit(do_not_specialize=["B", "n_cum", "n_proj", "W", "TN", "grad_stride"])
def semicrf_scale_kernel(unit_cum, unit_ps, unit_pe, parts, grad, g_cum, g_ps, g_pe, g_trans, g_dur,
                         B, n_cum, n_proj, W, TN, grad_stride,
                         HAS_PS: tl.constexpr, HAS_PE: tl.constexpr, BLOCK: tl.constexpr):
    """The gradients for grad_logZ from the unit ones (float64, grad_logZ = 1; rows of n_cum / n_proj elements per
    sequence, ``parts`` (B, W) the per-sequence transition (first TN columns) and duration-bias sums; grad[b] at
    ``grad + b * grad_stride``, e.g. stride 0 for the expanded gradient of ``logZ.sum()``). Programs
    0..B-1: sequence b's rows times grad[b]. Programs B..: BLOCK columns of Σ_b grad[b] * parts[b, :], b in order
    (deterministic), into ``g_trans`` (columns < TN) and ``g_dur``. Outputs in their own dtype."""
    pid = tl.program_id(0)
    if pid < B:
        seq = pid.to(tl.int64)
        g = tl.load(grad + seq * grad_stride).to(tl.float64)
        _scale_span(unit_cum + seq * n_cum, g_cum + seq * n_cum, n_cum, g, BLOCK)
        if HAS_PS:
            _scale_span(unit_ps + seq * n_proj, g_ps + seq * n_proj, n_proj, g, BLOCK)
        if HAS_PE:
            _scale_span(unit_pe + seq * n_proj, g_pe + seq * n_proj, n_proj, g, BLOCK)
    else:
        cols = (pid - B).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < W
        total = tl.zeros((BLOCK,), tl.float64)
        for row in range(0, B):
            weight = tl.load(grad + row * grad_stride).to(tl.float64)
            total += weight * tl.load(parts + row * W + cols, mask=inside, other=0.0)
        tl.store(g_trans + cols, total.to(g_trans.dtype.element_ty), mask=inside & (cols < TN))
        tl.store(g_dur + (cols - TN), total.to(g_dur.dtype.element_ty), mask=inside & (cols >= TN))
