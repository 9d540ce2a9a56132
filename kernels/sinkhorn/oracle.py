"""Independent float64 reference: the plain loop of the convention, differentiable by autograd.

Imports only torch and the standard library. Rules the loop states explicitly, relying on no torch behaviour at a
boundary: the log domain clamps at -1e5 with :func:`clamp_low` (the gradient flows where ``x >= -1e5``, the
boundary included, and is zero below it; an all -inf row becomes uniform after its first row step); in the
probability domain an all -inf row softmaxes to the uniform row 1/n, and a zero denominator (only possible with
eps = 0) divides by 1.
"""
from __future__ import annotations

import torch


CLAMP = -1e5


def clamp_low(x: torch.Tensor) -> torch.Tensor:
    """``max(x, -1e5)`` with the project's gradient convention written out: 1 where ``x >= -1e5`` (the boundary
    included), 0 below (``torch.clamp``'s gradient at the boundary changed between torch releases)."""
    return torch.where(x >= CLAMP, x, torch.full_like(x, CLAMP))


def _nonzero(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.ones_like(d), d)


def sinkhorn_oracle(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    """The convention in float64 on ``x`` (..., n, n); returns float64. Gradients flow when ``x`` requires them."""
    x = x.to(torch.float64)
    if domain == "log":
        w = clamp_low(x)
        for _ in range(iters):
            w = w - torch.logsumexp(w, dim=-1, keepdim=True)
            w = w - torch.logsumexp(w, dim=-2, keepdim=True)
        return torch.exp(w)
    if domain != "prob":
        raise ValueError(f"domain must be 'log' or 'prob', got {domain!r}")
    flat = torch.isneginf(x).all(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(flat, torch.zeros_like(x), x), dim=-1) + eps
    p = p / _nonzero(p.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        p = p / _nonzero(p.sum(dim=-1, keepdim=True) + eps)
        p = p / _nonzero(p.sum(dim=-2, keepdim=True) + eps)
    return p


def sinkhorn_scaling_oracle(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    """The same function derived as matrix scaling, in float64: ``P = diag(r) K diag(c)``.

    Log domain: ``K = exp(max(x, -1e5) - rowmax)``, then ``iters`` times ``r = 1 / (K c)``, ``c = 1 / (K^T r)``
    (from ``c = 1``); valid while ``K`` does not underflow (rows spanning less than ~700). Probability domain:
    ``p0 = softmax + eps``, then the divisions of the loop applied to the scaling vectors only. This is the
    derivation the Triton kernels use; comparing it with :func:`sinkhorn_oracle` proves the reformulation.
    """
    x = x.to(torch.float64)
    if domain == "log":
        w = clamp_low(x)
        K = torch.exp(w - w.amax(dim=-1, keepdim=True).detach())
        c = torch.ones_like(K[..., :1, :])
        for _ in range(iters):
            r = 1.0 / (K * c).sum(dim=-1, keepdim=True)
            c = 1.0 / (K * r).sum(dim=-2, keepdim=True)
        return r * K * c
    flat = torch.isneginf(x).all(dim=-1, keepdim=True)
    p0 = torch.softmax(torch.where(flat, torch.zeros_like(x), x), dim=-1) + eps
    r = torch.ones_like(p0[..., :, :1])
    c = _scaled(torch.ones_like(p0[..., :1, :]), (p0 * r).sum(dim=-2, keepdim=True), eps)
    for _ in range(iters - 1):
        r = _scaled(r, (p0 * c).sum(dim=-1, keepdim=True), eps)
        c = _scaled(c, (p0 * r).sum(dim=-2, keepdim=True), eps)
    return r * p0 * c


def _scaled(v: torch.Tensor, total: torch.Tensor, eps: float) -> torch.Tensor:
    """``v / (v * total + eps)``: one division step on a scaling vector (a zero denominator divides by 1)."""
    return v / _nonzero(v * total + eps)


def residual_oracle(p: torch.Tensor) -> torch.Tensor:
    """The convergence residual of each matrix of ``p`` (..., n, n) in float64: the largest ``|row sum - 1|`` and
    ``|column sum - 1|`` over its lines; shape ``p.shape[:-2]``."""
    p = p.detach().to(torch.float64)
    rows = (p.sum(dim=-1) - 1.0).abs().amax(dim=-1)
    cols = (p.sum(dim=-2) - 1.0).abs().amax(dim=-1)
    return torch.maximum(rows, cols)
