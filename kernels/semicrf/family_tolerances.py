"""The semi-CRF family's one tolerance table (registration side: imported by ``family.py`` and its parts)."""
import torch

from kernel_sentinel.family import Tolerance

TOLERANCES = {torch.float32: Tolerance(atol=1e-5, rtol=1e-5), torch.float64: Tolerance(atol=1e-9, rtol=1e-9)}
