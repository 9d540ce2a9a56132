"""The semirings under their long names, as torch-struct and the original library's documentation import them:
``from provable_kernels.semirings import LogSemiring, MaxSemiring, EntropySemiring``. Same classes as
:mod:`provable_kernels.semiring` (see its docstring for the interface and the table of semirings)."""
from provable_kernels.semiring import (  # noqa: F401 (re-exports)
    Counting,
    CountingSemiring,
    CrossEntropy,
    CrossEntropySemiring,
    Entropy,
    EntropySemiring,
    KLDivergence,
    KLDivergenceSemiring,
    KMax,
    KMaxSemiring,
    Log,
    LogSemiring,
    Max,
    MaxSemiring,
    Semiring,
)

__all__ = ["Semiring", "LogSemiring", "MaxSemiring", "CountingSemiring", "EntropySemiring", "CrossEntropySemiring",
           "KLDivergenceSemiring", "KMaxSemiring", "Log", "Max", "Counting", "Entropy", "CrossEntropy",
           "KLDivergence", "KMax"]
