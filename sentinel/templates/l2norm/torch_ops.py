"""The PyTorch backend: the formula in the input's dtype, differentiated by autograd; every device."""
from __future__ import annotations

import torch

from .call import EPS, L2normCall, require_call


def l2norm(call: L2normCall) -> torch.Tensor:
    """``x / sqrt(sum(x**2, -1) + EPS)``, shaped and typed like ``x``."""
    x = require_call(call).x
    return x / torch.sqrt(x.square().sum(-1, keepdim=True) + EPS)  # rsqrt's gradient r**3 underflows
