"""Triton kernels that are provably right.

Each family lives in one package with the same files (the site page "The family layout"):

- ``call.py``: the call type (a dataclass) and its validation; imports no backend;
- ``dispatch.py``: the declarative decision tree (data) that picks a route, the route bodies, the direct runners
  and the entry points;
- ``torch_ops.py``: the PyTorch backend; ``triton_ops.py``: the Triton host side; ``triton_*.py``: the kernels;
- ``autograd.py``: the custom ops (:class:`provable_kernels.custom_ops.Op`) that join forward and hand-written
  backward;
- ``oracle.py``: the independent float64 reference and brute force (torch and the standard library only);
- ``family.py``: the registration with sentinel (cases per route, references, tolerances, invariants); with
  several decision trees, one part per tree in ``family_<tree>.py``.

Shared pieces, each used by at least two families: :mod:`provable_kernels.dispatch` (trees and route recording),
:mod:`provable_kernels.runtime` (the host path: validation once per call signature, direct runners),
:mod:`provable_kernels.launch` (the launch cache), :mod:`provable_kernels.validate` (argument checks and the
value-check policy), :mod:`provable_kernels.triton_math` (-inf-safe reductions for Triton kernels),
:mod:`provable_kernels.alloc` (allocation of kernel outputs), :mod:`provable_kernels.custom_ops` (custom ops with an
eager fast path). What one family alone uses lives in its package (the semi-CRF's semirings and fused value
checks).
"""
