"""Argument checks shared by every public function.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device, range, values)
with a message that names the argument and says what was expected.
"""
from __future__ import annotations

import contextlib
import contextvars
import operator
import os
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

import torch
from torch._subclasses.fake_tensor import FakeTensor

FLOAT_DTYPES = (torch.float32, torch.float64)
CallT = TypeVar("CallT")  # a family's call dataclass


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


def requirer(kind: type[CallT], made_by: str, field: Optional[str] = None) -> Callable[..., CallT]:
    """The guard every backend function of a family runs first: ``require(call[, value])`` returns ``call`` after
    checking that it is a ``kind`` (built by ``made_by``) and, when ``value`` is given, that its ``field`` is
    ``value`` (the tree routes by it)."""

    def require(call: object, value: Optional[str] = None) -> CallT:
        if not isinstance(call, kind):  # verify: unreached (internal guard: routes receive make_call's result)
            raise TypeError(f"call must be a {kind.__name__} (built by {made_by}), got {type(call).__name__}")
        if value is not None and getattr(call, field) != value:  # verify: unreached (internal guard: the tree)
            raise ValueError(f"call.{field} must be {value!r} here, got {getattr(call, field)!r}")
        return call

    return require


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
    ``checks`` when given (one decision for all), else runs now. Returns ``x`` (clamped into range when the
    checks are deferred to the device; see :class:`DataChecks`)."""
    x = tensor(name, x, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    shape(name, x, (batch,), "(B,)")
    pending = checks if checks is not None else DataChecks()
    x = pending.in_range(name, x, 1, max_length)
    if checks is None:
        pending.verify()
    return x


def finite(name: str, x: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    """Reject NaN (and +inf; -inf too unless ``allow_neg_inf``): one reduction and one host read, then, on
    failure, the index of the first bad entry in the message."""
    if x.numel() == 0 or bool(_finite_flag(x, allow_neg_inf)):
        return
    bad = torch.isnan(x) | (x == float("inf"))
    if not allow_neg_inf:
        bad |= x == float("-inf")
    if bool(bad.any()):
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name} contains {what} (at index {tuple(bad.nonzero()[0].tolist())})")


def _finite_flag(x: torch.Tensor, allow_neg_inf: bool) -> torch.Tensor:
    """0-d boolean: ``x`` (non-empty) has no NaN and no +inf (nor -inf unless ``allow_neg_inf``); max and min
    propagate NaN, so one reduction decides."""
    if allow_neg_inf:
        return x.amax() < float("inf")
    low, high = torch.aminmax(x)
    return (low > float("-inf")) & (high < float("inf"))


class DataChecks:
    """Checks that read tensor values (finiteness, ranges, caller-computed conditions), fused into one decision.

    Each check queues a 0-d boolean computed on the tensors' device (max/min reductions: no mask the size of the
    input). What happens next is the host-sync policy (:func:`host_reads_allowed`, page ``guide/host-syncs.md``):

    - **host mode** (eager calls on CPU tensors, or inside ``value_checks("sync")``): :meth:`verify` / :meth:`flag`
      read every queued boolean with ONE host read and raise the named ``ValueError`` of the first failed check,
      before any work is done;
    - **device mode** (CUDA tensors by default, and always under ``torch.compile``, CUDA-graph capture, meta or
      fake tensors and ``torch.func`` transforms): nothing is read on the host. :meth:`flag` returns the fused
      0-d boolean for :func:`poison` (NaN outputs and NaN gradients when a check failed); :meth:`verify`, for
      callers that cannot poison, hands it to ``torch._assert_async`` (an error at execution, never a number).
      :meth:`in_range` then also returns its input clamped into range, so that no kernel indexes out of bounds.

    A failed value check never becomes a wrong number in either mode.
    """

    def __init__(self, *, at_sync_point: bool = False) -> None:
        """``at_sync_point``: the caller reads results on the host anyway (e.g. returns Python values), so the
        checks use host mode wherever a host read is possible at all."""
        self._pending: list[tuple[torch.Tensor, Callable[[], None], str]] = []
        self._host: Optional[bool] = None  # decided at the first queued check, from that tensor and the state
        self._at_sync_point = at_sync_point

    def _queue(self, x: torch.Tensor, ok: torch.Tensor, explain: Callable[[], None], what: str) -> None:
        if self._host is None:
            self._host = host_reads_allowed(x, at_sync_point=self._at_sync_point)
        self._pending.append((ok, explain, what))

    @property
    def deferred(self) -> bool:
        """True in device mode: the checks are not read on the host (see the class docstring)."""
        return self._host is False

    def finite(self, name: str, x: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
        """Queue :func:`finite`: no NaN, no +inf (nor -inf unless ``allow_neg_inf``)."""
        if x.numel() == 0:  # verify: unreached (no verified entry point takes an empty float tensor; tests)
            return
        ok = _finite_flag(x, allow_neg_inf)
        what = f"{name} contains NaN or {'+inf' if allow_neg_inf else 'inf'}"
        self._queue(x, ok, lambda: finite(name, x, allow_neg_inf=allow_neg_inf), what)

    def in_range(self, name: str, x: torch.Tensor, low: int, high: int) -> torch.Tensor:
        """Queue ``low <= x <= high`` elementwise. Returns ``x``, or in device mode ``x`` clamped into the range
        (use the returned tensor: kernels then never index out of bounds while the flag poisons the result)."""
        if x.numel() == 0:  # verify: unreached (no verified entry point takes an empty range-checked tensor; tests)
            return x

        def explain() -> None:
            if int(x.min()) < low or int(x.max()) > high:
                raise ValueError(f"{name} must lie in {low}..{high}, got min {int(x.min())}, max {int(x.max())}")

        clamped = x.clamp(low, high)  # one pass: its comparison with x is the check, and device mode returns it
        self._queue(x, (clamped == x).all(), explain, f"{name} outside {low}..{high}")
        return clamped if self.deferred else x

    def expect(self, ok: torch.Tensor, message: Callable[[], str]) -> None:
        """Queue a 0-d boolean ``ok`` the caller computed on the device; when it is False, raise
        ``ValueError(message())`` (the message names the argument)."""

        def explain() -> None:
            raise ValueError(message())

        self._queue(ok, ok, explain, "a condition on the argument values")

    def flag(self) -> Optional[torch.Tensor]:
        """Host mode: raise the named error of the first failed check (one host read) and return None. Device
        mode: return the fused 0-d boolean (True when every check passed) for :func:`poison`. Clears the queue."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        if not self._host:  # verify: unreached (device mode: CUDA by default, compile, capture; tests on the CPU)
            return torch.stack([ok.to(pending[0][0].device) for ok, _, _ in pending]).all()
        flags = torch.stack([ok.to(pending[0][0].device) for ok, _, _ in pending]).tolist()
        for good, (_, explain, _) in zip(flags, pending):
            if not good:
                explain()
        return None

    def verify(self) -> None:
        """Host mode: raise the named error of the first failed check. Device mode (no host read): assert the
        fused flag on the device (``torch._assert_async``), so that a failed check is an error at execution;
        callers that can poison their outputs use :meth:`flag` instead."""
        whats = [what for _, _, what in self._pending]
        ok = self.flag()
        if ok is not None:  # verify: unreached (device mode: CUDA by default, compile, capture; tests on the CPU)
            torch._assert_async(ok, "a value check failed (one of: " + "; ".join(whats) + "); run the call eagerly "
                                "on the CPU or inside provable_kernels.validate.value_checks('sync') for the named "
                                "error")


VALUE_CHECK_MODES = ("auto", "sync", "device")
VALUE_CHECKS_ENV = "PROVABLE_KERNELS_VALUE_CHECKS"  # the default of value_checks for a whole run, e.g. "sync"


def _default_mode() -> str:
    mode = os.environ.get(VALUE_CHECKS_ENV, "auto") or "auto"
    if mode not in VALUE_CHECK_MODES:
        raise ValueError(f"environment variable {VALUE_CHECKS_ENV} must be one of {list(VALUE_CHECK_MODES)}, "
                         f"got {mode!r}")
    return mode


_MODE: contextvars.ContextVar[str] = contextvars.ContextVar("_MODE", default=_default_mode())


@contextlib.contextmanager
def value_checks(mode: str) -> Iterator[None]:
    """Choose the host-sync policy of value checks inside the block: ``"auto"`` (default: host mode for CPU
    tensors, device mode for CUDA ones), ``"sync"`` (strict: host mode, i.e. named errors before any work, at the
    cost of one host sync per call: a debugging switch for GPU training loops) or ``"device"`` (never a host
    read). The environment variable ``PROVABLE_KERNELS_VALUE_CHECKS`` (read at import) sets the default for a
    whole run, e.g. ``PROVABLE_KERNELS_VALUE_CHECKS=sync python train.py``.
    Under ``torch.compile``, CUDA-graph capture, meta/fake tensors and ``torch.func`` transforms the checks run
    in device mode whatever the setting (a host read is impossible there)."""
    choice("mode", mode, VALUE_CHECK_MODES)
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def current_mode() -> str:
    """The value-check mode in effect (:func:`value_checks`): ``"auto"``, ``"sync"`` or ``"device"``."""
    return _MODE.get()


def symbolic(x: torch.Tensor) -> bool:
    """True when ``x`` has no values to read now: while compiling, under a ``torch.func`` transform, or for a meta
    or fake tensor."""
    return (torch.compiler.is_compiling() or x.is_meta or isinstance(x, FakeTensor)
            or torch._C._are_functorch_transforms_active())


def host_reads_allowed(x: torch.Tensor, *, at_sync_point: bool = False) -> bool:
    """Whether value checks on ``x`` are read on the host now (host mode of :class:`DataChecks`), decided from
    the state at call time: never while compiling, capturing a CUDA graph, under ``torch.func`` transforms or for
    meta/fake tensors; otherwise always ``at_sync_point`` (the caller syncs anyway), else per
    :func:`value_checks`."""
    if torch.compiler.is_compiling():  # verify: unreached (torch.compile; tests)
        return False
    mode = _MODE.get()  # the policy first: a device-mode call skips the checks below (host time per call)
    if not (at_sync_point or mode == "sync" or (mode == "auto" and x.device.type == "cpu")):
        return False
    if symbolic(x):  # verify: unreached (meta/fake tensors, torch.func transforms; tests)
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing())  # capture: the GPU script


def poison(ok: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when ``ok`` is None (the checks were read on the host); otherwise ``x * where(ok, 1, NaN)``:
    the same values when every check passed, NaN values and NaN gradients (through the product) when one failed.
    ``x`` must be a float tensor; ``ok`` a 0-d boolean from :meth:`DataChecks.flag`, or any boolean that broadcasts
    against ``x`` (e.g. one flag per matrix: only the failed ones turn NaN)."""
    if ok is None:
        return x
    if not x.is_floating_point():  # verify: unreached (internal guard: callers poison float outputs; tests)
        raise TypeError(f"poison needs a float tensor, got {x.dtype}")
    return x * torch.where(ok, 1.0, float("nan")).to(x.dtype)
