"""Triton kernels that are provably right.

Each family lives in one package with the same shape:

- ``dispatch.py``: the declarative decision tree (data) that picks a route, and the public entry points;
- ``triton_*.py``: the Triton kernels;
- ``autograd.py``: the ``torch.autograd.Function`` objects that join forward and hand-written backward;
- ``reference.py``: the PyTorch reference of the same recursion;
- ``family.py``: the registration with sentinel (inputs per route, references, tolerances, invariants).

Shared pieces: :mod:`provable_kernels.dispatch` (trees and route recording), :mod:`provable_kernels.validate` (argument checks),
:mod:`provable_kernels.semiring` (semirings for the exact backends).
"""
