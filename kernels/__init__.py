"""Triton kernels that are provably right.

Each family lives in one package with the same files (the site page "The family layout"):

- ``call.py``: the frozen call type and its validation; imports no backend;
- ``dispatch.py``: the declarative decision tree (data) that picks a route, the route bodies and the entry points;
- ``torch_ops.py``: the PyTorch backend; ``triton_ops.py``: the Triton host side; ``triton_*.py``: the kernels;
- ``autograd.py``: the ``torch.autograd.Function`` objects that join forward and hand-written backward;
- ``oracle.py``: the independent float64 reference and brute force (torch and the standard library only);
- ``family.py``: the registration with sentinel (cases per route, references, tolerances, invariants).

Shared pieces: :mod:`provable_kernels.dispatch` (trees and route recording), :mod:`provable_kernels.validate`
(argument checks), :mod:`provable_kernels.semiring` (semirings for the exact backends),
:mod:`provable_kernels.triton_math` (-inf-safe reductions for Triton kernels), :mod:`provable_kernels.alloc`
(allocation of kernel outputs).
"""
