"""Independent float64 reference of l2norm: the formula and its closed-form gradient in torch, and a Python loop.

Imports only torch and the standard library; shares no code with the routes.
"""
from __future__ import annotations

import math

import torch

EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x**2, -1) + EPS)`` in float64."""
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)


def l2norm_grad(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The gradient of ``sum(weights * l2norm(x))``: ``r * g - x * r**3 * sum(g * x)`` per row, with ``r = 1 /
    sqrt(sum(x**2) + EPS)`` and ``g`` the weights."""
    x, g = x.double(), weights.double()
    r = 1 / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS)
    return r * g - x * r**3 * (g * x).sum(-1, keepdim=True)


def python_loop(x: torch.Tensor) -> torch.Tensor:
    """The formula row by row over Python floats (``math.fsum``)."""
    rows = x.detach().double().reshape(-1, x.shape[-1]).tolist()
    out = [[v / math.sqrt(math.fsum(u * u for u in row) + EPS) for v in row] for row in rows]
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)
