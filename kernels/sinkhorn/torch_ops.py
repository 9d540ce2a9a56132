"""PyTorch backend: the loop of the convention in the compute dtype (float32, or float64 for float64 inputs),
differentiated by autograd. It serves every n and every device."""
from __future__ import annotations

import torch

from provable_kernels.sinkhorn.call import SinkhornCall, require_call

CLAMP = -1e5


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, bfloat16 and float16 compute in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _log(x: torch.Tensor, iters: int) -> torch.Tensor:
    w = x.clamp_min(CLAMP)
    for _ in range(iters):
        w = w - w.logsumexp(-1, keepdim=True)
        w = w - w.logsumexp(-2, keepdim=True)
    return w.exp()


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


def sinkhorn(call: SinkhornCall) -> torch.Tensor:
    """The output in ``x``'s dtype; builds an autograd graph when grad mode is on and ``x`` requires grad."""
    call = require_call(call)
    x = call.x.to(compute_dtype(call.x.dtype))
    out = _log(x, call.iters) if call.domain == "log" else _prob(x, call.iters, call.eps)
    return out.to(call.x.dtype)
