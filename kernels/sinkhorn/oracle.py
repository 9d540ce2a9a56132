"""Independent float64 reference: the plain loop of the convention, differentiable by autograd.

Imports only torch and the standard library. Rules the loop states explicitly: the log domain clamps at -1e5
(so an all -inf row becomes uniform after its first row step); in the probability domain an all -inf row
softmaxes to the uniform row 1/n, and a zero denominator (only possible with eps = 0) divides by 1.
"""
from __future__ import annotations

import torch


def _nonzero(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.ones_like(d), d)


def sinkhorn_oracle(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    """The convention in float64 on ``x`` (..., n, n); returns float64. Gradients flow when ``x`` requires them."""
    x = x.to(torch.float64)
    if domain == "log":
        w = torch.clamp(x, min=-1e5)
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
