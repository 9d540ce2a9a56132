"""Argument checks shared by every public function.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device, range, values)
with a message that names the argument and says what was expected.
"""
from __future__ import annotations

import operator
from typing import Callable, Iterable, Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)


def tensor(
    name: str,
    x: object,
    *,
    ndim: Optional[int | Sequence[int]] = None,
    dtypes: Optional[Iterable[torch.dtype]] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Check that ``x`` is a tensor with the given rank, one of ``dtypes``, on ``device``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(f"{n}-D" for n in allowed)
            raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if x.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs, got {x.device}")
    return x


def shape(name: str, x: torch.Tensor, expected: Sequence[int], meaning: str) -> None:
    """Check ``x.shape == expected``; ``meaning`` spells the expected shape, e.g. ``"(B, T+1, C)"``."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {meaning} = {tuple(expected)}, got {tuple(x.shape)}")


def positive_int(name: str, value: object) -> int:
    """An integer >= 1: a Python int, a NumPy integer or a 0-d integer tensor (bool is rejected)."""
    try:
        if isinstance(value, bool) or (
            isinstance(value, torch.Tensor) and (value.is_floating_point() or value.dtype == torch.bool)
        ):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def choice(name: str, value: object, options: Sequence[str]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")
    return value  # type: ignore[return-value]


def lengths(name: str, x: object, batch: int, max_length: int, device: torch.device,
            checks: Optional["DataChecks"] = None) -> torch.Tensor:
    """Integer lengths (B,) with 1 <= L <= max_length, on ``device``. The range check reads the data: it joins
    ``checks`` when given (one sync for all), else runs now."""
    x = tensor(name, x, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    shape(name, x, (batch,), "(B,)")
    pending = checks if checks is not None else DataChecks()
    pending.in_range(name, x, 1, max_length)
    if checks is None:
        pending.verify()
    return x


def finite(name: str, x: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    """Reject NaN (and +inf; -inf too unless ``allow_neg_inf``)."""
    bad = torch.isnan(x) | (x == float("inf"))
    if not allow_neg_inf:
        bad |= x == float("-inf")
    if bool(bad.any()):
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name} contains {what} (at index {tuple(bad.nonzero()[0].tolist())})")


class DataChecks:
    """Checks that read tensor values (finiteness, ranges), evaluated together with a single host sync.

    Each check queues a 0-d boolean computed on the tensor's device; :meth:`verify` fetches them all at once and,
    for the first that failed, re-runs the detailed check that raises the named error.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[torch.Tensor, Callable[[], None]]] = []

    def finite(self, name: str, x: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
        """Queue :func:`finite`. Reductions only (max and min propagate NaN), so no mask the size of ``x`` is
        allocated."""
        if x.numel() == 0:
            return
        high = x.amax()
        ok = high < float("inf") if allow_neg_inf else torch.isfinite(high) & torch.isfinite(x.amin())
        self._pending.append((ok, lambda: finite(name, x, allow_neg_inf=allow_neg_inf)))

    def in_range(self, name: str, x: torch.Tensor, low: int, high: int) -> None:
        """Queue ``low <= x <= high`` elementwise."""
        if x.numel() == 0:
            return

        def explain() -> None:
            raise ValueError(f"{name} must lie in {low}..{high}, got min {int(x.min())}, max {int(x.max())}")

        self._pending.append(((x.amin() >= low) & (x.amax() <= high), explain))

    def verify(self) -> None:
        """Raise the named error of the first failed check, if any."""
        if not self._pending:
            return
        flags = torch.stack([ok.to(self._pending[0][0].device) for ok, _ in self._pending]).tolist()
        for good, (_, explain) in zip(flags, self._pending):
            if not good:
                explain()
        self._pending.clear()
