"""Triton kernels of the Sinkhorn family (``@triton.jit`` code only; the host side is in ``triton_ops``).

One program holds ``BM`` whole matrices as a (BM, NB, NB) tile (``NB`` = n rounded up to a power of two; padded
rows, columns and matrices are masked). At NB <= 4 the tile is loaded row by row and joined (``_load``), which gives
it a layout with each matrix in one thread: the sums of every iteration are register additions, with no shuffle and
no shared memory. Nothing per iteration goes to global memory: the forward reads ``x`` once and writes the output
once (and, with ``RESIDUAL``, one convergence residual per matrix from the output tile); the backward reads ``x``
and the upstream gradient, runs the forward once keeping the scaling vectors at the start of every group of STRIDE
steps in registers (CP slots per vector; ``triton_ops._stride``), walks the groups backwards replaying each step
from its group's kept vectors (the adjoint of the scaling vectors: four n^2 multiply-adds a step), and writes the
input gradient once. Matrices that take the log loop replay each step from ``x`` (iters^2 / 2 steps).

Log domain, scaling form. With ``L = max(x, -1e5) - rowmax`` and ``K = exp(L)`` (n^2 exponentials, once), the
log-domain loop equals ``r = 1 / (K c)``, ``c = 1 / (K^T r)`` (reciprocals only, ``_rcp``) with output
``r_i K_ij c_j``: ``w = L + log r_i + log c_j`` at every step. A matrix with a row spanning more than ``RMAX`` in
``L`` (so ``K`` could underflow or the scalings overflow) or with clamped entries takes the log-domain loop itself
(``use_log``, per matrix): a program holding such matrices runs both forms and keeps each matrix's own, so that a
matrix's result never depends on the matrices packed next to it (batch invariance).

Probability domain: ``p0 = softmax(x) + eps`` (n^2 exponentials, once); every later step is a diagonal scaling
``p = r_i p0_ij c_j``, so iterations are matrix-vector sums and divisions.

Backward in matrix form: each normalisation ``w' = w - lse(w)`` has the adjoint ``w_bar -= E * sum(w_bar)`` with
``E = exp(w')`` the normalised matrix; each ``p' = p / d`` has ``p_bar = (p_bar - sum(p_bar * p')) / d``.
"""
import triton
import triton.language as tl

from provable_kernels.triton_math import float_scalar

CLAMP = tl.constexpr(-1e5)  # the log-domain convention's floor: w = max(x, -1e5)
GAP = tl.constexpr(50.0)  # flagged entries this far below a line's largest entry weigh nothing: 64 exp(-50) < 2^-53
# Runtime sizes, never specialised on: a new batch size or iteration count compiles nothing.
SIZES = ("B", "ITERS")
BACKWARD_SIZES = ("B", "ITERS", "STRIDE")


@triton.jit
def _safe(d):
    """``d``, with 0 replaced by 1: a zero denominator (an all-zero row or column: padding, or eps = 0 in the
    probability domain) divides by 1 instead."""
    return tl.where(d == 0.0, 1.0, d)


@triton.jit
def _rcp(d):
    """``1 / d`` for ``d >= 0``. float32: ``rsqrt(d 2^24)^2 2^24``, four instructions (MUFU.RSQ, which flushes
    subnormal inputs, hence the exact scaling by 2^24: every d from the smallest subnormal to 2^104 is in range;
    relative error at most about 3.8e-7: twice rsqrt.approx's 2^-22.9 and two roundings) where ``1.0 / d``
    compiles to an eight-instruction sequence (range tests and scalings around MUFU.RCP) that was half of every
    iteration. float64 divides."""
    if d.dtype == tl.float64:
        q = 1.0 / d
    else:
        q = tl.rsqrt(d * 16777216.0)
        q = q * q * 16777216.0
    return q


@triton.jit
def _tile(pid, B, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr):
    """Masks of the program's (BM, NB, NB) tile: entries, rows (BM, NB, 1), columns (BM, 1, NB)."""
    b = pid * BM + tl.arange(0, BM)[:, None, None]
    i = tl.arange(0, NB)[None, :, None]
    j = tl.arange(0, NB)[None, None, :]
    rows = (b < B) & (i < N)
    cols = (b < B) & (j < N)
    return rows & cols, rows, cols


@triton.jit
def _row(ptr, pid, B, i: tl.constexpr, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr):
    """Pointers and mask of row ``i`` of the program's matrices, (BM, NB): NB contiguous entries per matrix (the
    mask is constant along a row at N = NB, so that the row is one vector access)."""
    b = pid * BM + tl.arange(0, BM)[:, None]
    j = tl.arange(0, NB)[None, :]
    mask = b < B
    if N < NB:
        mask = mask & (j < N) & (i < N)
    return ptr + b.to(tl.int64) * (N * N) + i * N + j, mask


@triton.jit
def _load_row(ptr, pid, B, i: tl.constexpr, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr):
    p, m = _row(ptr, pid, B, i, N, NB, BM)
    return tl.load(p, mask=m, other=0.0)


@triton.jit
def _load(ptr, pid, B, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr, F64: tl.constexpr):
    """The program's (BM, NB, NB) tile of ``ptr`` in the compute dtype (0 off the tile). At NB <= 4 the rows are
    loaded one by one (a vector load per row and matrix) and joined, so that the tile's layout holds each matrix
    in one thread: row and column sums are then additions in registers, without shuffles."""
    if NB == 1:
        v = tl.reshape(_load_row(ptr, pid, B, 0, N, NB, BM), (BM, 1, 1))
    elif NB == 2:
        v = tl.permute(tl.join(_load_row(ptr, pid, B, 0, N, NB, BM), _load_row(ptr, pid, B, 1, N, NB, BM)),
                       (0, 2, 1))
    elif NB == 4:  # (BM, j, k, l) holds row 2k + l
        v = tl.join(tl.join(_load_row(ptr, pid, B, 0, N, NB, BM), _load_row(ptr, pid, B, 2, N, NB, BM)),
                    tl.join(_load_row(ptr, pid, B, 1, N, NB, BM), _load_row(ptr, pid, B, 3, N, NB, BM)))
        v = tl.reshape(tl.permute(v, (0, 2, 3, 1)), (BM, NB, NB))
    else:
        b = pid * BM + tl.arange(0, BM)[:, None, None]
        i = tl.arange(0, NB)[None, :, None]
        j = tl.arange(0, NB)[None, None, :]
        v = tl.load(ptr + b.to(tl.int64) * (N * N) + i * N + j, mask=(b < B) & (i < N) & (j < N), other=0.0)
    if F64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@triton.jit
def _store_row(ptr, v, pid, B, i: tl.constexpr, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr):
    p, m = _row(ptr, pid, B, i, N, NB, BM)
    tl.store(p, v.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _store(ptr, v, pid, B, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr):
    """Stores the (BM, NB, NB) tile ``v`` on the tile of ``ptr``, row by row at NB <= 4 (inverse of ``_load``)."""
    if NB == 1:
        _store_row(ptr, tl.reshape(v, (BM, 1)), pid, B, 0, N, NB, BM)
    elif NB == 2:
        v0, v1 = tl.split(tl.permute(v, (0, 2, 1)))
        _store_row(ptr, v0, pid, B, 0, N, NB, BM)
        _store_row(ptr, v1, pid, B, 1, N, NB, BM)
    elif NB == 4:
        even, odd = tl.split(tl.permute(tl.reshape(v, (BM, 2, 2, NB)), (0, 3, 1, 2)))
        v0, v2 = tl.split(even)
        v1, v3 = tl.split(odd)
        _store_row(ptr, v0, pid, B, 0, N, NB, BM)
        _store_row(ptr, v1, pid, B, 1, N, NB, BM)
        _store_row(ptr, v2, pid, B, 2, N, NB, BM)
        _store_row(ptr, v3, pid, B, 3, N, NB, BM)
    else:
        b = pid * BM + tl.arange(0, BM)[:, None, None]
        i = tl.arange(0, NB)[None, :, None]
        j = tl.arange(0, NB)[None, None, :]
        tl.store(ptr + b.to(tl.int64) * (N * N) + i * N + j, v.to(ptr.dtype.element_ty),
                 mask=(b < B) & (i < N) & (j < N))


@triton.jit
def _store_residual(res_ptr, P, bad, pid, B, rows, cols, NB: tl.constexpr, BM: tl.constexpr):
    """Each matrix's convergence residual, ``max(max_i |sum_j P_ij - 1|, max_j |sum_i P_ij - 1|)`` over its valid
    rows and columns, from the output tile ``P`` (0 off the tile) before it is rounded to the output dtype, stored
    at ``res_ptr[b]`` by the tile's entry (b, 0, 0) (NaN for the matrices of ``bad``). Every reduction keeps the
    tile's dimensions, as the loops' own sums do."""
    row_dev = tl.where(rows, tl.abs(tl.sum(P, axis=2)[:, :, None] - 1.0), 0.0)
    col_dev = tl.where(cols, tl.abs(tl.sum(P, axis=1)[:, None, :] - 1.0), 0.0)
    res = tl.max(tl.max(tl.maximum(row_dev, col_dev), axis=2), axis=1)[:, None, None]
    b = pid * BM + tl.arange(0, BM)[:, None, None]
    first = (tl.arange(0, NB)[None, :, None] == 0) & (tl.arange(0, NB)[None, None, :] == 0)
    value = tl.where(bad, float("nan"), res) + tl.zeros_like(P)
    tl.store(res_ptr + (b + 0 * first.to(tl.int32)), value.to(res_ptr.dtype.element_ty), mask=first & (b < B))


@triton.jit
def _load_logits(x_ptr, pid, B, valid, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr, F64: tl.constexpr):
    """``x`` with NaN and +inf entries replaced by 0, and ``bad`` (BM, 1, 1): the matrices that held one. Their
    outputs and gradients are stored as NaN (the value check of device mode, on chip); the replacement keeps
    them from steering the block's shared choices (the log loop or the scaling form) for the other matrices."""
    x = _load(x_ptr, pid, B, N, NB, BM, F64)
    bad_entry = valid & ((x < float("inf")) == 0)
    bad = tl.max(tl.max(bad_entry.to(tl.int32), axis=2), axis=1)[:, None, None] > 0
    return tl.where(bad_entry, 0.0, x), bad


@triton.jit
def _norm(W, F, valid, AXIS: tl.constexpr):
    """One log-normalisation ``W -= logsumexp(W, AXIS)`` of the flagged form: an entry with ``F = 1`` stands
    for ``W - 1e5`` (it came from the clamp). When a line's flagged entries all lie more than ``GAP`` below its
    largest unflagged one, they weigh nothing next to it (exp(-GAP) is below the rounding of either dtype): the
    line normalises over its unflagged entries and keeps its flags. Otherwise it merges: each entry becomes its
    value relative to the line's largest one (the -1e5 of a flag cancels against that of a flagged largest entry,
    so an all-flagged line keeps full precision), the line normalises over all of them and its flags clear.
    Entries off the tile stay 0."""
    flagged = valid & (F != 0)
    unflagged = valid & (F == 0)
    mu = tl.expand_dims(tl.max(tl.where(unflagged, W, float("-inf")), axis=AXIS), AXIS)
    top_flagged = tl.expand_dims(tl.max(tl.where(flagged, W, float("-inf")), axis=AXIS), AXIS)
    mf = top_flagged + CLAMP
    merge = (mf > float("-inf")) & (mf >= mu - GAP)
    frame = (merge & (mf >= mu)).to(tl.int32)  # 1: the line's largest entry is flagged
    V = tl.where(merge, (W - tl.where(frame == 1, top_flagged, mu)) + (F - frame).to(W.dtype) * CLAMP, W)
    inc = valid & (merge | (F == 0))
    mx = tl.expand_dims(tl.max(tl.where(inc, V, float("-inf")), axis=AXIS), AXIS)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    s = tl.expand_dims(tl.sum(tl.where(inc, tl.exp(V - mx), 0.0), axis=AXIS), AXIS)
    return tl.where(valid, V - mx - tl.log(_safe(s)), 0.0), tl.where(merge, 0, F)


@triton.jit
def _log_prepare(x_ptr, pid, B, valid, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr, F64: tl.constexpr,
                 RMAX: tl.constexpr):
    """The shifted logits ``L`` (``max(x, -1e5) - rowmax``, in flagged form: entries below -1e5 hold
    ``-rowmax`` with flag ``F = 1``, and a row that is clamped everywhere becomes 0 without flags), ``K = exp(L)``
    (0 where flagged), the gradient mask ``not x < -1e5``, the matrices that must run the log-domain loop
    (BM, 1, 1: a flag, or some row of ``L`` spanning more than ``RMAX``; decided per matrix, so that a matrix's
    result never depends on the other matrices of its program) and the matrices holding NaN or +inf."""
    x, bad = _load_logits(x_ptr, pid, B, valid, N, NB, BM, F64)
    clamped = valid & (x < CLAMP)
    m = tl.max(tl.where(valid & (x >= CLAMP), x, float("-inf")), axis=2)[:, :, None]
    flat = m == float("-inf")
    m = tl.where(flat, 0.0, m)
    L = tl.where(valid, tl.where(clamped, tl.where(flat, 0.0, -m), x - m), 0.0)
    F = (clamped & (flat == 0)).to(tl.int32)
    unflagged = valid & (F == 0)
    span = tl.max(tl.max(tl.where(unflagged, -L, 0.0), axis=2), axis=1)[:, None, None]
    flags = tl.max(tl.max(F, axis=2), axis=1)[:, None, None]
    K = tl.where(unflagged, tl.exp(L), 0.0)
    return L, F, K, valid & ((x < CLAMP) == 0), (span > RMAX) | (flags > 0), bad


@triton.jit
def _scale_rows(K, c, rows):
    """``r = 1 / (K c)`` on valid rows (0 elsewhere). A valid row's sum is positive (its largest entry of ``K`` is
    1 and ``c > 0``), so only the rows off the tile divide by 0, and the mask drops them."""
    return tl.where(rows, _rcp(tl.sum(K * c, axis=2)[:, :, None]), 0.0)


@triton.jit
def _scale_cols(K, r, cols):
    """``c = 1 / (K^T r)`` on valid columns (0 elsewhere; a valid column's sum is positive: ``K >= exp(-RMAX)``
    and ``r > 0`` on valid rows)."""
    return tl.where(cols, _rcp(tl.sum(K * r, axis=1)[:, None, :]), 0.0)


@triton.jit
def _log_replay(L, F, K, k, use_log, valid, rows, cols):
    """The normalised matrices of step ``k`` (1-based): ``S`` after its row step, ``Q`` after its column step."""
    if use_log:
        W = L
        G = F
        for _ in range(k - 1):
            W, G = _norm(W, G, valid, 2)
            W, G = _norm(W, G, valid, 1)
        W, G = _norm(W, G, valid, 2)
        S = tl.where(valid & (G == 0), tl.exp(W), 0.0)
        W, G = _norm(W, G, valid, 1)
        Q = tl.where(valid & (G == 0), tl.exp(W), 0.0)
    else:
        c = tl.where(cols, 1.0, 0.0).to(K.dtype)
        for _ in range(k - 1):
            r = _scale_rows(K, c, rows)
            c = _scale_cols(K, r, cols)
        r = _scale_rows(K, c, rows)
        S = K * r * c
        c = _scale_cols(K, r, cols)
        Q = K * r * c
    return S, Q


@triton.jit(do_not_specialize=SIZES)
def log_forward_kernel(x_ptr, out_ptr, res_ptr, B, ITERS, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr,
                       F64: tl.constexpr, RMAX: tl.constexpr, RESIDUAL: tl.constexpr):
    """The output of every matrix, and with ``RESIDUAL`` its convergence residual at ``res_ptr`` (B floats)."""
    pid = tl.program_id(0)
    valid, rows, cols = _tile(pid, B, N, NB, BM)
    L, F, K, keep, use_log, bad = _log_prepare(x_ptr, pid, B, valid, N, NB, BM, F64, RMAX)
    S, Q = _log_replay(L, F, K, ITERS, False, valid, rows, cols)
    if tl.max(tl.max(tl.max(use_log.to(tl.int32), axis=2), axis=1), axis=0) > 0:  # the log loop for those matrices
        S_log, Q_log = _log_replay(L, F, K, ITERS, True, valid, rows, cols)
        Q = tl.where(use_log, Q_log, Q)
    _store(out_ptr, tl.where(bad, float("nan"), Q), pid, B, N, NB, BM)
    if RESIDUAL:
        _store_residual(res_ptr, Q, bad, pid, B, rows, cols, NB, BM)


@triton.jit(do_not_specialize=BACKWARD_SIZES)
def log_backward_kernel(x_ptr, grad_ptr, gx_ptr, B, ITERS, STRIDE, N: tl.constexpr, NB: tl.constexpr,
                        BM: tl.constexpr, F64: tl.constexpr, RMAX: tl.constexpr, CP: tl.constexpr):
    """Reverse sweep over the steps k = ITERS..1. Scaling form: a first forward pass keeps the column scalings
    ``c`` of every STRIDE-th step (CP slots, O(n * iters / STRIDE) per matrix, in registers); step k is replayed
    from the nearest kept one (< STRIDE steps). Log loop (the matrices of ``use_log``, when the program holds
    any): step k is replayed from ``x``."""
    pid = tl.program_id(0)
    valid, rows, cols = _tile(pid, B, N, NB, BM)
    L, F, K, keep, use_log, bad = _log_prepare(x_ptr, pid, B, valid, N, NB, BM, F64, RMAX)
    grad = _load(grad_ptr, pid, B, N, NB, BM, F64)
    Wb = _log_backward_scaling(K, grad, ITERS, STRIDE, rows, cols, CP)
    if tl.max(tl.max(tl.max(use_log.to(tl.int32), axis=2), axis=1), axis=0) > 0:  # the log loop for those matrices
        Wb_log = grad
        for t in range(0, ITERS):
            S, Q = _log_replay(L, F, K, ITERS - t, True, valid, rows, cols)
            Wb_log = Wb_log * tl.where(t == 0, Q, 1.0)
            Wb_log = Wb_log - Q * tl.sum(Wb_log, axis=1)[:, None, :]
            Wb_log = Wb_log - S * tl.sum(Wb_log, axis=2)[:, :, None]
        Wb = tl.where(use_log, Wb_log, Wb)
    gx = tl.where(bad, float("nan"), tl.where(keep, Wb, 0.0))
    _store(gx_ptr, gx, pid, B, N, NB, BM)


@triton.jit
def _select(kept, slots, g, AXIS: tl.constexpr):
    """The vector kept in slot ``g`` of ``kept`` (slots along ``AXIS``)."""
    return tl.expand_dims(tl.sum(tl.where(slots == g, kept, 0.0), axis=AXIS), AXIS)


@triton.jit
def _log_backward_scaling(K, Pb, ITERS, STRIDE, rows, cols, CP: tl.constexpr):
    """The gradient with respect to ``L`` of ``sum(Pb * P)``, ``P = r K c`` after ITERS steps of the scaling form,
    by the adjoint of the scaling vectors: step k (``r = 1 / (K c')``, ``c = 1 / (K^T r)`` from the previous
    ``c'``) has ``s = -c_bar c^2``, ``r_bar += K s``, ``t = -r_bar r^2``, ``c'_bar = K^T t`` and adds the outer
    products ``r s^T + t c'^T`` to ``K_bar`` (four n^2 multiply-adds a step); ``L_bar = K * K_bar`` at the end. A
    first forward pass keeps ``c`` at the start of every group of STRIDE steps (CP slots); the reverse sweep takes
    each group's slot once and replays the group's steps from it."""
    slots = tl.arange(0, CP)[None, :, None]
    c = tl.where(cols, 1.0, 0.0).to(K.dtype)
    r = tl.where(rows, 1.0, 0.0).to(K.dtype)
    kept = c + 0.0 * slots
    groups = tl.cdiv(ITERS, STRIDE)
    for g in range(0, groups):  # a slot per group of STRIDE steps: one write per group
        kept = tl.where(slots == g, c, kept)
        for _ in range(g * STRIDE, tl.minimum(g * STRIDE + STRIDE, ITERS)):
            r = _scale_rows(K, c, rows)
            c = _scale_cols(K, r, cols)
    G = Pb * K
    Kb = Pb * r * c  # the output's own factor: P = r K c
    rb = tl.sum(G * c, axis=2)[:, :, None]
    cb = tl.sum(G * r, axis=1)[:, None, :]
    for h in range(0, groups):
        g = groups - 1 - h
        start = _select(kept, slots, g, 1)
        top = tl.minimum(g * STRIDE + STRIDE, ITERS)
        for t in range(0, top - g * STRIDE):
            k = top - t
            cp = start
            for _ in range(g * STRIDE, k - 1):
                cp = _scale_cols(K, _scale_rows(K, cp, rows), cols)
            r = _scale_rows(K, cp, rows)
            c = _scale_cols(K, r, cols)
            s = -(cb * c) * c
            rb = rb + tl.sum(K * s, axis=2)[:, :, None]
            tb = -(rb * r) * r
            Kb = Kb + r * s + tb * cp
            cb = tl.sum(K * tb, axis=1)[:, None, :]
            rb = 0.0 * rb  # r of step k - 1 enters only its own column step
    return K * Kb


@triton.jit
def _prob_prepare(x_ptr, pid, B, valid, eps, N: tl.constexpr, NB: tl.constexpr, BM: tl.constexpr,
                  F64: tl.constexpr):
    """``s = softmax(x, last dim)`` (an all -inf row gives 1/n), ``p0 = s + eps`` (0 off the tile), the all -inf
    rows and the matrices holding NaN or +inf."""
    x, bad = _load_logits(x_ptr, pid, B, valid, N, NB, BM, F64)
    m = tl.max(tl.where(valid, x, float("-inf")), axis=2)[:, :, None]
    z = tl.where(m == float("-inf"), 0.0, x - tl.where(m == float("-inf"), 0.0, m))
    e = tl.where(valid, tl.exp(z), 0.0)
    s = e * _rcp(tl.where(valid, tl.sum(e, axis=2)[:, :, None], 1.0))
    return s, tl.where(valid, s + eps, 0.0), m == float("-inf"), bad


@triton.jit
def _prob_step(p0, r, c, idx, eps):
    """Step ``idx`` (1-based) of the probability loop on the scalings of ``p0``: the row division (none at step 1,
    where the softmax already normalised the rows: denominators 0, which divide by 1 and whose adjoint passes the
    gradient through), then the column division; returns the new scalings and both denominators before ``_safe``
    (0 where a zero sum, or no division, divides by 1)."""
    dr = tl.where(idx > 1, r * tl.sum(p0 * c, axis=2)[:, :, None] + eps, 0.0)
    r = r * _rcp(_safe(dr))
    dc = c * tl.sum(p0 * r, axis=1)[:, None, :] + eps
    return r, c * _rcp(_safe(dc)), dr, dc


@triton.jit
def _division_adjoint(v_bar, v, d, eps):
    """For ``v = v' / d`` with ``d = v' a + eps`` (``d = 0`` divides by 1): the adjoints of ``v'`` and of the sum
    ``a``, from ``v_bar``: ``dv/dv' = eps / d^2`` and ``dv/da = -v^2`` (1 and 0 where ``d = 0``)."""
    q = _rcp(_safe(d))
    return v_bar * tl.where(d == 0.0, 1.0, (eps * q) * q), v_bar * tl.where(d == 0.0, 0.0, -(v * v))


@triton.jit(do_not_specialize=SIZES)
def prob_forward_kernel(x_ptr, out_ptr, res_ptr, B, ITERS, EPS_HI, EPS_LO, N: tl.constexpr, NB: tl.constexpr,
                        BM: tl.constexpr, F64: tl.constexpr, RESIDUAL: tl.constexpr):
    """The output of every matrix, and with ``RESIDUAL`` its convergence residual at ``res_ptr`` (B floats)."""
    pid = tl.program_id(0)
    valid, rows, cols = _tile(pid, B, N, NB, BM)
    eps = float_scalar(EPS_HI, EPS_LO, F64)  # eps as two float32 halves: no per-call tensor
    s, p0, flat, bad = _prob_prepare(x_ptr, pid, B, valid, eps, N, NB, BM, F64)
    r = tl.where(rows, 1.0, 0.0).to(p0.dtype)
    c = tl.where(cols, 1.0, 0.0).to(p0.dtype)
    for t in range(0, ITERS):
        r, c, dr, dc = _prob_step(p0, r, c, t + 1, eps)
    P = r * p0 * c
    _store(out_ptr, tl.where(bad, float("nan"), P), pid, B, N, NB, BM)
    if RESIDUAL:
        _store_residual(res_ptr, P, bad, pid, B, rows, cols, NB, BM)


@triton.jit(do_not_specialize=BACKWARD_SIZES)
def prob_backward_kernel(x_ptr, grad_ptr, gx_ptr, B, ITERS, STRIDE, EPS_HI, EPS_LO, N: tl.constexpr, NB: tl.constexpr,
                         BM: tl.constexpr, F64: tl.constexpr, CP: tl.constexpr):
    """The adjoint of the scaling vectors (``_division_adjoint`` per division), its outer products summed into
    ``p0_bar``: four n^2 multiply-adds a step. A first forward pass keeps ``r``, ``c`` at the start of every
    group of STRIDE steps (CP slots per vector, in registers); the reverse sweep takes each group's pair once and
    replays the group's steps from it."""
    pid = tl.program_id(0)
    valid, rows, cols = _tile(pid, B, N, NB, BM)
    eps = float_scalar(EPS_HI, EPS_LO, F64)  # eps as two float32 halves: no per-call tensor
    s, p0, flat, bad = _prob_prepare(x_ptr, pid, B, valid, eps, N, NB, BM, F64)
    slots_r = tl.arange(0, CP)[None, None, :]
    slots_c = tl.arange(0, CP)[None, :, None]
    r = tl.where(rows, 1.0, 0.0).to(p0.dtype)
    c = tl.where(cols, 1.0, 0.0).to(p0.dtype)
    kept_r = r + 0.0 * slots_r
    kept_c = c + 0.0 * slots_c
    groups = tl.cdiv(ITERS, STRIDE)
    for g in range(0, groups):  # a slot per group of STRIDE steps: one write per group
        kept_r = tl.where(slots_r == g, r, kept_r)
        kept_c = tl.where(slots_c == g, c, kept_c)
        for t in range(g * STRIDE, tl.minimum(g * STRIDE + STRIDE, ITERS)):
            r, c, dr, dc = _prob_step(p0, r, c, t + 1, eps)
    Pb = _load(grad_ptr, pid, B, N, NB, BM, F64)
    G = Pb * p0
    p0b = Pb * r * c  # the output's own factor: P = r p0 c
    rb = tl.sum(G * c, axis=2)[:, :, None]
    cb = tl.sum(G * r, axis=1)[:, None, :]
    for h in range(0, groups):
        g = groups - 1 - h
        start_r = _select(kept_r, slots_r, g, 2)
        start_c = _select(kept_c, slots_c, g, 1)
        top = tl.minimum(g * STRIDE + STRIDE, ITERS)
        for t in range(0, top - g * STRIDE):
            k = top - t
            rp = start_r
            cp = start_c
            for i in range(g * STRIDE, k - 1):
                rp, cp, dr, dc = _prob_step(p0, rp, cp, i + 1, eps)
            r, c, dr, dc = _prob_step(p0, rp, cp, k, eps)
            cb, ub = _division_adjoint(cb, c, dc, eps)  # c = c' / (c' (p0^T r) + eps)
            rb = rb + tl.sum(p0 * ub, axis=2)[:, :, None]
            rb_prev, tb = _division_adjoint(rb, r, dr, eps)  # r = r' / (r' (p0 c') + eps), from step 2 on
            cb = cb + tl.sum(p0 * tb, axis=1)[:, None, :]
            p0b = p0b + r * ub + tb * cp
            rb = rb_prev
    gx = s * (p0b - tl.sum(s * p0b, axis=2)[:, :, None])
    gx = tl.where(bad, float("nan"), tl.where(flat, 0.0, gx))
    _store(gx_ptr, gx, pid, B, N, NB, BM)
