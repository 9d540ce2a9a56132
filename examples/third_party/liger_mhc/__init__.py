"""Liger-Kernel's mHC Sinkhorn (``liger_kernel.ops.mhc``, liger-kernel 0.8.5, the ``bench`` extra) registered as
a third-party family: the kernels under test are Liger's ``_mhc_split_sinkhorn_fwd_kernel`` and its two backward
kernels (recomputing the iterations, or reading the history the forward stored), verified against this
repository's float64 Sinkhorn oracle (``provable_kernels.sinkhorn.oracle``, probability domain).

``liger_sinkhorn(x, iters=3, eps=1e-3, keep_history=False)``: ``x`` (N, n, n) float32 logits of N tokens; the
residual matrices ``h_res`` of Liger's split (its pre and post gates take zero logits here, its scales are 1).
"""
from .dispatch import TREE, liger_sinkhorn

__all__ = ["TREE", "liger_sinkhorn"]
