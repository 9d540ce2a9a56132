"""The generic checks: five checks every route of every family gets from sentinel, with no family code.

They catch the failures that agreement with a reference misses because the reference run happens to hide them:

- ``inputs``: every tensor argument (and every upstream weight) is bitwise unchanged after the entry point's
  forward call, and after :attr:`Family.run` (forward and backward);
- ``aliasing``: no output or gradient shares storage with a tensor argument, unless the family declares the pair
  (:class:`~kernel_sentinel.family.Aliasing`);
- ``written``: under :func:`provable_kernels.alloc.poisoned` (every allocation made through
  :func:`provable_kernels.alloc.empty` filled with NaN / :data:`provable_kernels.alloc.POISON_INT`) the outputs
  and gradients are bitwise the same as without it, so no element is right only because of what the allocator
  handed back;
- ``determinism``: repeated runs give bitwise identical outputs and gradients;
- ``layouts``: every tensor argument passed as a non-contiguous view (:data:`LAYOUTS`: transposed, sliced with a
  step, at a storage offset, expanded with stride 0 where the API accepts the repeated values) gives the outputs
  and gradients of a contiguous copy of the same values: bitwise, or within the family's tolerance (a kernel that
  copies into another layout may round differently). The gaps of the strided and offset views hold NaN / the poison integer, so a kernel that ignores a
  stride reads them. A view may be rejected only with a ``ValueError``/``TypeError`` whose message starts with the
  argument's name, and only where the family declares it (:class:`~kernel_sentinel.family.LayoutRejection`).

:class:`Probe` runs them on one :class:`~kernel_sentinel.family.Case`; the runs they share (the baseline) happen
once. Each check returns a :class:`Verdict`. Every run goes through :func:`kernel_sentinel.checks.run_route`, so
it must take the case's route. ``Family.run`` must return its outputs detached, not copied (a copy would hide
aliasing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from provable_kernels import alloc
from kernel_sentinel.checks import Measurement, compare_outputs, kernel_launches, run_route
from kernel_sentinel.family import Case, Family, LayoutRejection, Outputs, Tolerance, matches


GENERIC_CHECKS = ("inputs", "aliasing", "written", "determinism", "layouts")
DETERMINISM_RUNS = 3  # runs compared bitwise, the baseline included
OFFSET = 7  # elements before the first one of an offset view (odd: no alignment a kernel could rely on)


@dataclass(frozen=True)
class Verdict:
    """What one generic check found: ``problems`` (empty: pass), a one-line ``summary`` of what was checked, and
    the comparisons made within tolerance (layouts)."""

    problems: tuple[str, ...]
    summary: str
    measurements: tuple[Measurement, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems


def error_text(exc: BaseException) -> str:
    """``TypeName: message`` of an exception, as check details show it."""
    return f"{type(exc).__name__}: {exc}".strip()


# ------------------------------------------------------------------------------------------------ tensors


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the CPU, contiguous, reinterpreted as integers of its element size (bitwise comparison, NaN and
    the sign of zero included)."""
    x = x.detach().cpu().contiguous()
    if x.dtype == torch.bool:
        return x.view(torch.uint8)
    if x.is_complex():
        x = torch.view_as_real(x)
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _differing(a: torch.Tensor, b: torch.Tensor) -> str:
    """How ``a`` differs from ``b``: shape, dtype, or how many elements and the first one."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    ne = (_bits(a) != _bits(b)).reshape(a.shape)
    first = tuple(int(i) for i in ne.nonzero()[0]) if a.dim() else ()
    return (f"{int(ne.sum())}/{a.numel()} elements differ, first at {list(first)}: "
            f"{a.detach().cpu()[first].item()!r} vs {b.detach().cpu()[first].item()!r}")


def differences(got: Outputs, want: Outputs) -> list[str]:
    """One line per name whose tensors are not bitwise equal (or present on one side only)."""
    out = [f"{name}: missing" for name in want if name not in got]
    out += [f"{name}: unexpected" for name in got if name not in want]
    out += [f"{name}: {_differing(got[name], want[name])}" for name in want
            if name in got and not bitwise_equal(got[name], want[name])]
    return out


def _leaf(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` (sharing its storage and strides) as a leaf that requires grad when ``like`` does."""
    x = x.detach()
    return x.requires_grad_(True) if like.requires_grad else x


def _tensors(mapping: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {n: x for n, x in mapping.items() if isinstance(x, torch.Tensor)}


def fresh_case(case: Case) -> Case:
    """``case`` with every tensor argument and upstream weight copied (same strides where the layout is dense,
    leaves requiring grad like the originals), so that a run cannot change the case other checks use."""
    kwargs = {n: _leaf(x.detach().clone(), x) for n, x in _tensors(case.kwargs).items()}
    upstream = {n: w.detach().clone() for n, w in case.upstream.items()}
    return dataclasses.replace(case, kwargs={**case.kwargs, **kwargs}, upstream=upstream)


def _snapshot(case: Case) -> dict[str, torch.Tensor]:
    tensors = {**_tensors(case.kwargs), **{f"upstream[{n}]": w for n, w in case.upstream.items()}}
    return {n: x.detach().clone() for n, x in tensors.items()}


def _changed(before: Mapping[str, torch.Tensor], case: Case, when: str) -> list[str]:
    after = {**_tensors(case.kwargs), **{f"upstream[{n}]": w for n, w in case.upstream.items()}}
    return [f"{name} written by the {when}: {_differing(after[name], x)}"
            for name, x in before.items() if not bitwise_equal(after[name], x)]


def _storage(x: torch.Tensor) -> Optional[int]:
    """The address of ``x``'s storage (None for tensors without one: empty or meta)."""
    if x.numel() == 0 or x.device.type == "meta":
        return None
    return x.untyped_storage().data_ptr()


# ------------------------------------------------------------------------------------------------ layouts


def _poison(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``shape`` with ``like``'s dtype and device, every element poisoned like
    :func:`provable_kernels.alloc.empty` does inside :func:`provable_kernels.alloc.poisoned`."""
    with alloc.poisoned():
        return alloc.empty(shape, dtype=like.dtype, device=like.device)


def _transposed(x: torch.Tensor) -> Optional[torch.Tensor]:
    """The values of ``x`` stored with its last two dimensions swapped in memory."""
    if x.dim() < 2 or x.shape[-1] < 2 or x.shape[-2] < 2:
        return None
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _strided(x: torch.Tensor) -> Optional[torch.Tensor]:
    """The values of ``x`` at every second element of a twice-as-long last dimension (poison in the gaps)."""
    if x.dim() < 1 or x.numel() == 0:
        return None
    big = _poison((*x.shape[:-1], 2 * x.shape[-1]), x)
    big[..., ::2] = x
    return big[..., ::2]


def _offset(x: torch.Tensor) -> Optional[torch.Tensor]:
    """The values of ``x``, contiguous, starting :data:`OFFSET` elements into a poisoned storage."""
    if x.numel() == 0:
        return None
    flat = _poison((x.numel() + OFFSET,), x)
    flat[OFFSET:] = x.reshape(-1)
    return flat[OFFSET:].view(x.shape)


def _expanded(x: torch.Tensor) -> Optional[torch.Tensor]:
    """The first slice of ``x`` along its first dimension longer than 1, expanded back with stride 0 (other
    values than ``x``'s: the result is compared with a contiguous copy of these values)."""
    dims = [d for d in range(x.dim()) if x.shape[d] > 1]
    if not dims:
        return None
    return x.narrow(dims[0], 0, 1).expand(x.shape)


@dataclass(frozen=True)
class Layout:
    """A way to pass a tensor argument: ``make(x)`` returns a non-contiguous view (None where it does not apply to
    ``x``); ``same_values``: the view holds ``x``'s values (else it is compared with a copy of its own values)."""

    name: str
    make: Callable[[torch.Tensor], Optional[torch.Tensor]]
    same_values: bool = True


LAYOUTS = (Layout("transposed", _transposed), Layout("strided", _strided), Layout("offset", _offset),
           Layout("expanded", _expanded, same_values=False))


def layout_names() -> tuple[str, ...]:
    return tuple(layout.name for layout in LAYOUTS)


# -------------------------------------------------------------------------------------------------- probe


@dataclass
class Probe:
    """The generic checks of one case of ``family`` (the route is ``case.route_id``); ``tolerance`` is the
    family's tolerance at the case's dtype (used by ``layouts`` only)."""

    family: Family
    case: Case
    tolerance: Tolerance
    _baseline: Optional[tuple[Case, dict[str, torch.Tensor], Outputs]] = field(default=None, repr=False)
    _kernels: list[str] = field(default_factory=list, repr=False)

    def run(self, case: Case) -> Outputs:
        return run_route(self.family.run, case)

    def baseline(self) -> tuple[Case, dict[str, torch.Tensor], Outputs]:
        """A fresh copy of the case, a snapshot of its tensors taken before the run, and its outputs (run once)."""
        if self._baseline is None:
            case = fresh_case(self.case)
            before = _snapshot(case)
            with kernel_launches() as launched:
                outputs = self.run(case)
            self._baseline, self._kernels = (case, before, outputs), list(dict.fromkeys(launched))
        return self._baseline

    def kernels(self) -> list[str]:
        """The Triton kernels the baseline run launched, each once, in the order of their first launch."""
        self.baseline()
        return self._kernels

    def inputs(self) -> Verdict:
        forward = fresh_case(self.case)
        before = _snapshot(forward)
        entry = self.family.entry_points[forward.entry]
        run_route(lambda c: entry(**c.kwargs), forward)
        problems = _changed(before, forward, f"forward ({forward.entry})")
        case, before, _ = self.baseline()
        problems += [p for p in _changed(before, case, "forward and backward (Family.run)")
                     if p.split(" written", 1)[0] not in {q.split(" written", 1)[0] for q in problems}]
        checked = sorted(_snapshot(case))
        return Verdict(tuple(problems), f"{len(checked)} tensors bitwise unchanged after forward and after "
                                        f"forward+backward: {', '.join(checked)}")

    def aliasing(self) -> Verdict:
        case, _, outputs = self.baseline()
        inputs = {n: _storage(x) for n, x in _tensors(case.kwargs).items()}
        allowed = {(a.output, a.argument) for a in self.family.aliasing if matches(case.route_id, a.routes)}
        problems, declared = [], []
        for out_name, out in outputs.items():
            for arg, address in inputs.items():
                if address is None or _storage(out) != address:
                    continue
                (declared if (out_name, arg) in allowed else problems).append(
                    f"{out_name} shares storage with argument {arg}")
        note = f"; declared: {', '.join(declared)}" if declared else ""
        return Verdict(tuple(problems), f"{len(outputs)} outputs and gradients checked against "
                                        f"{len(inputs)} tensor arguments{note}")

    def written(self) -> Verdict:
        _, _, want = self.baseline()
        case = fresh_case(self.case)
        with alloc.poisoned():
            got = self.run(case)
        problems = [f"{line} (with allocations poisoned: NaN / {alloc.POISON_INT} where nothing is written)"
                    for line in differences(got, want)]
        return Verdict(tuple(problems), f"{len(want)} outputs and gradients bitwise equal with poisoned "
                                        f"allocations")

    def determinism(self, runs: int = DETERMINISM_RUNS) -> Verdict:
        _, _, want = self.baseline()
        problems: list[str] = []
        for i in range(2, runs + 1):
            problems += [f"run {i} vs run 1: {line}" for line in differences(self.run(fresh_case(self.case)), want)]
        return Verdict(tuple(problems), f"{len(want)} outputs and gradients bitwise equal over {runs} runs")

    def layouts(self) -> Verdict:
        route = self.case.route_id
        rejected = [r for r in self.family.rejected_layouts if matches(route, r.routes)]
        skip = {(r.argument, r.layout) for r in rejected}
        problems: list[str] = []
        measurements: list[Measurement] = []
        tried: list[str] = []
        contiguous = self.baseline()[2]
        for layout in LAYOUTS:
            views = {n: v for n, x in _tensors(self.case.kwargs).items()
                     if (n, layout.name) not in skip and (v := layout.make(x.detach())) is not None}
            if not layout.same_values:
                invalid = [n for n in views if self._rejects_values(n, views[n].contiguous())]
                views = {n: v for n, v in views.items() if n not in invalid}
                if invalid:
                    tried.append(f"{layout.name} not applicable to {', '.join(invalid)} (values the API rejects)")
            if not views:
                continue
            tried.append(f"{layout.name} ({', '.join(views)})")
            want = contiguous if layout.same_values else self._run_views(
                {n: v.contiguous() for n, v in views.items()})
            problem, measured = self._layout_problem(layout.name, views, want)
            measurements += measured
            if problem:
                problems.append(problem + self._culprits(layout, views, want))
        for r in rejected:
            problems += self._rejection_problem(r)
        declared = f"; rejected as declared: {', '.join(f'{r.argument} {r.layout}' for r in rejected)}" \
            if rejected else ""
        return Verdict(tuple(problems), f"views match contiguous copies: {'; '.join(tried) or 'none applies'}"
                                        f"{declared}", tuple(measurements))

    # --------------------------------------------------------------------------------------------- helpers

    def _run_views(self, views: Mapping[str, torch.Tensor]) -> Outputs:
        """Run the case with the tensor arguments ``views`` replaced (as leaves like the originals)."""
        base = fresh_case(self.case)
        leaves = {n: _leaf(v, base.kwargs[n]) for n, v in views.items()}
        return self.run(base.with_kwargs(f"{base.description}; views: {', '.join(views)}", **leaves))

    def _rejects_values(self, name: str, values: torch.Tensor) -> bool:
        """True when the entry point rejects argument ``name`` holding ``values`` (contiguous) with a
        ``ValueError``/``TypeError``: an expanded view of it is then not a layout question."""
        try:
            self._run_views({name: values})
        except (ValueError, TypeError):
            return True
        return False

    def _layout_problem(self, name: str, views: Mapping[str, torch.Tensor],
                        want: Outputs) -> tuple[Optional[str], list[Measurement]]:
        """None when the run with ``views`` matches ``want`` bitwise or within tolerance; else what happened."""
        try:
            got = self._run_views(views)
        except (ValueError, TypeError) as exc:
            return f"{name}: rejected without a declaration: {type(exc).__name__}: {exc}", []
        if not differences(got, want):
            return None, []
        measured = compare_outputs(got, want, self.tolerance, f"{name} view vs contiguous copy")
        failing = [str(m) for m in measured if not m.ok]
        if not failing:
            return None, measured
        return f"{name}: {'; '.join(failing)}", measured

    def _culprits(self, layout: Layout, views: Mapping[str, torch.Tensor], want: Outputs) -> str:
        """The arguments that fail on their own in ``layout`` (when more than one was viewed)."""
        if len(views) < 2:
            return ""
        bad = []
        for name, view in views.items():
            one = {name: view}
            target = want if layout.same_values else self._run_views({name: view.contiguous()})
            try:
                problem, _ = self._layout_problem(layout.name, one, target)
            except Exception as exc:  # the localisation is a hint: a crash names the argument too
                problem = f"{type(exc).__name__}"
            if problem:
                bad.append(name)
        return f" (fails with only {', '.join(bad)} as a view)" if bad else ""

    def _rejection_problem(self, rejection: LayoutRejection) -> list[str]:
        """A declared rejection must happen, with an error naming the argument."""
        layout = next((l for l in LAYOUTS if l.name == rejection.layout), None)
        x = self.case.kwargs.get(rejection.argument)
        view = layout.make(x.detach()) if layout is not None and isinstance(x, torch.Tensor) else None
        label = f"{rejection.argument} {rejection.layout} (declared rejected)"
        if view is None:
            return [f"{label}: no such tensor argument or layout for this case"]
        try:
            self._run_views({rejection.argument: view})
        except (ValueError, TypeError) as exc:
            if str(exc).startswith(rejection.argument):
                return []
            return [f"{label}: message does not start with {rejection.argument!r}: {exc}"]
        return [f"{label}: accepted; drop the declaration or reject it"]
