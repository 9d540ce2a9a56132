"""PyTorch backend: the loop of the convention in the compute dtype (float32, or float64 for float64 inputs),
differentiated by autograd. It serves every n and every device."""
from __future__ import annotations

import torch

from provable_kernels import validate
from provable_kernels.sinkhorn.call import SinkhornCall, require_call

CLAMP = -1e5
GAP = 50.0  # flagged entries this far below a line's largest entry weigh nothing: 64 exp(-50) < 2^-53


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, bfloat16 and float16 compute in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _norm(w: torch.Tensor, flag: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w -= logsumexp(w, dim)`` in flagged form (``flag`` marks entries that stand for ``w - 1e5``). A line
    whose flagged entries all lie more than ``GAP`` below its largest unflagged one normalises over the unflagged
    ones and keeps its flags; any other line merges: each entry becomes its value relative to the line's largest
    one (the -1e5 of a flag cancels against that of a flagged largest entry, so an all-flagged line keeps full
    precision), the line normalises over all entries and loses its flags."""
    low = torch.tensor(float("-inf"), dtype=w.dtype, device=w.device)
    top_unflagged = torch.where(flag, low, w).amax(dim, keepdim=True).detach()
    top_flagged = torch.where(flag, w, low).amax(dim, keepdim=True).detach()
    merge = (top_flagged > float("-inf")) & (top_flagged + CLAMP >= top_unflagged - GAP)
    frame = merge & (top_flagged + CLAMP >= top_unflagged)  # the line's largest entry is flagged
    relative = (w - torch.where(frame, top_flagged, top_unflagged)) + (flag.to(w.dtype) - frame.to(w.dtype)) * CLAMP
    v = torch.where(merge, relative, w)
    return v - torch.where(merge | ~flag, v, low).logsumexp(dim, keepdim=True), flag & ~merge


def _log(x: torch.Tensor, iters: int) -> torch.Tensor:
    """The log-domain loop on ``max(x, -1e5)``, with the clamped entries held as ``-1e5 + (value)`` (flag and an
    order-one value) so that float32 keeps full precision where a whole column is clamped."""
    flag = x < CLAMP
    m = x.masked_fill(flag, float("-inf")).amax(-1, keepdim=True).detach()  # a row shift: the output ignores it
    flat = m == float("-inf")
    m = m.masked_fill(flat, 0.0)
    w = torch.where(flag, torch.where(flat, 0.0, -m), x - m)
    flag = flag & ~flat
    for _ in range(iters):
        w, flag = _norm(w, flag, -1)
        w, flag = _norm(w, flag, -2)
    return w.masked_fill(flag, float("-inf")).exp()


def _div(p: torch.Tensor, total: torch.Tensor, eps: float) -> torch.Tensor:
    d = total + eps
    return p / torch.where(d == 0, torch.ones_like(d), d)


def _prob(x: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    flat = (x.amax(-1, keepdim=True) == float("-inf"))
    p = torch.softmax(x.masked_fill(flat, 0.0), dim=-1) + eps
    p = _div(p, p.sum(-2, keepdim=True), eps)
    for _ in range(iters - 1):
        p = _div(p, p.sum(-1, keepdim=True), eps)
        p = _div(p, p.sum(-2, keepdim=True), eps)
    return p


def residual(p: torch.Tensor) -> torch.Tensor:
    """Each matrix's convergence residual, ``max(max_i |sum_j p_ij - 1|, max_j |sum_i p_ij - 1|)``, shape
    ``p.shape[:-2]``, without a gradient."""
    p = p.detach()
    return torch.maximum((p.sum(-1) - 1).abs().amax(-1), (p.sum(-2) - 1).abs().amax(-1))


def sinkhorn(call: SinkhornCall):
    """The output in ``x``'s dtype, and with ``call.residual`` the pair ``(out, residual)`` (the residual in the
    compute dtype, from the output before it is rounded to ``x``'s dtype); builds an autograd graph when grad mode
    is on and ``x`` requires grad. A matrix holding NaN or +inf comes out NaN, and so do its gradient and residual
    (as on the Triton route); the others are exact."""
    call = require_call(call)
    x = call.x.to(compute_dtype(call.x.dtype))
    ok = x.detach().amax((-2, -1), keepdim=True) < float("inf")  # per matrix; NaN fails the comparison too
    x = validate.poison(ok, x)  # NaN through every entry of a bad matrix, and through its whole gradient
    out = validate.poison(ok, _log(x, call.iters) if call.domain == "log" else _prob(x, call.iters, call.eps))
    return (out.to(call.x.dtype), residual(out)) if call.residual else out.to(call.x.dtype)
