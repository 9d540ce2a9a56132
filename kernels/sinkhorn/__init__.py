"""Sinkhorn-Knopp normalisation: doubly-stochastic matrices from logits, batched, in two domains.

``sinkhorn(x, iters=20, domain="log", eps=1e-6)`` maps ``x`` (..., n, n) to the same shape and dtype
(``return_residual=True``: also each matrix's convergence residual, from the same launch).
``"log"``: clamp at -1e5, then ``iters`` row and column log-normalisations, then ``exp``. ``"prob"``:
softmax over rows plus ``eps``, a column division, then ``iters - 1`` row and column divisions (each by the sum
plus ``eps``). Math in float32 (float64 for float64); gradients are exact for the finite loop. The Triton
routes (n <= 64) pack several matrices per program, compute the log domain in scaling form (one exponential per
entry, then divisions only; blocks whose rows span more than a threshold run the log loop itself), and their
backward recomputes the forward on chip from ``x`` (the scalings of every ceil(iters / 8)-th step kept in
registers at n <= 4, of every ceil(sqrt(iters))-th step at larger n; nothing per iteration in global memory).
n > 64 and devices without Triton take the PyTorch loop. Modules: :class:`SinkhornKnopp`, and :class:`FusedMHC`
with triton-sinkhorn's interface.
"""
from provable_kernels.sinkhorn.dispatch import TREE, FusedMHC, SinkhornKnopp, sinkhorn

__all__ = ["TREE", "FusedMHC", "SinkhornKnopp", "sinkhorn"]
