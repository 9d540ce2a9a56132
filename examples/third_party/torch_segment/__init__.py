"""PyTorch's ``torch.segment_reduce`` (sum, max, min over the rows of ``x`` (N, D) in segments given by CSR ``offsets``),
registered as a third-party family: the kernel under test is PyTorch's own, verified against this repository's
float64 segment oracle (``provable_kernels.segment.oracle``).

Conventions verified (PyTorch's own, where it states one; ``torch.amax``'s where it does not): an empty segment
gives 0 (sum), -inf (max) or +inf (min) and no gradient; the gradient of max / min is split evenly between the
rows that hold the extreme value, as ``torch.amax`` documents.
"""
from .dispatch import TREE, segment_reduce

__all__ = ["TREE", "segment_reduce"]
