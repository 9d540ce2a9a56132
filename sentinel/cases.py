"""The generic pieces of verifying a family, written once, for :mod:`kernel_sentinel.registration` (and tests).

- :func:`outputs_and_gradients` / :func:`weighted_gradients`: the weighted-gradient contract of
  :class:`~kernel_sentinel.family.Case`: ``grad_<name>`` = gradient of ``sum_k (upstream[k] * output_k).sum()``
  w.r.t. each tensor argument that requires grad.
- :func:`float64_copies`: the arguments of a case, floating tensors copied in float64 on the CPU (fresh leaves for
  autograd), for the float64 references.
- :func:`replace_argument`: a new :class:`Case` with one argument replaced and the change appended to its
  description (bad inputs).
- :func:`agrees_with_reference`: an ``Adversarial.expect`` comparing a guard input's outputs with the float64
  reference relative to their size.
- :func:`finite_difference_property`: a ready-made :class:`~kernel_sentinel.family.Property`: float64 central
  differences of a route's weighted outputs against its reported gradients.
- :func:`batch_along`: a :class:`~kernel_sentinel.family.BatchItems` (what an item of a batch is, for the
  ``batch`` check) for items along dimensions of named tensors.
- :func:`standard_bad_inputs`: the :class:`~kernel_sentinel.family.BadInput` list every tensor argument gets
  (a list instead of a tensor, wrong rank, wrong dtype, wrong device, NaN or +inf where rejected).

Only tensors whose ``dtype`` is floating point are converted to float64 or differentiated; integer tensors
(lengths, ids, offsets) and non-tensor arguments pass through unchanged.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from kernel_sentinel.checks import expect_close, run_route
from kernel_sentinel.family import BadInput, BatchItems, Case, Outputs, Property, Tolerance

FINITE_DIFFERENCE_STEP = 1e-5
FINITE_DIFFERENCE_TOLERANCE = Tolerance(atol=1e-7, rtol=1e-6)  # central differences, h = 1e-5, in float64


def float_tensors(kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The floating-point tensor arguments of ``kwargs``, by name, in argument order."""
    return {n: x for n, x in kwargs.items() if isinstance(x, torch.Tensor) and x.is_floating_point()}


def weighted_gradients(outputs: Mapping[str, torch.Tensor], kwargs: Mapping[str, Any],
                       upstream: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"grad_<name>": d/d kwargs[name] of sum_k (upstream[k] * outputs[k]).sum()}`` for each floating tensor
    argument that requires grad (empty when none does or ``upstream`` is empty). Weights are cast to each
    output's dtype and device; an argument that the outputs do not depend on gets zeros."""
    wanted = {n: x for n, x in float_tensors(kwargs).items() if x.requires_grad}
    if not wanted or not upstream:
        return {}
    total = sum((outputs[k] * w.to(outputs[k].device, outputs[k].dtype)).sum() for k, w in upstream.items())
    grads = torch.autograd.grad(total, list(wanted.values()), allow_unused=True)
    return {f"grad_{n}": torch.zeros_like(x) if g is None else g for (n, x), g in zip(wanted.items(), grads)}


def outputs_and_gradients(outputs: Mapping[str, torch.Tensor], case: Case,
                          kwargs: Optional[Mapping[str, Any]] = None) -> dict[str, torch.Tensor]:
    """The outputs detached, plus :func:`weighted_gradients` w.r.t. ``kwargs`` (default ``case.kwargs``: pass the
    :func:`float64_copies` a reference computed from) with the weights ``case.upstream``."""
    grads = weighted_gradients(outputs, case.kwargs if kwargs is None else kwargs, case.upstream)
    return {**{k: v.detach() for k, v in outputs.items()}, **grads}


def float64_copies(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with every floating tensor (also in a tuple) replaced by a float64 copy on the CPU: a fresh leaf
    that requires grad when the original does; other tensors moved to the CPU."""
    def copy(x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(copy(m) for m in x)
        if not isinstance(x, torch.Tensor):
            return x
        if not x.is_floating_point():
            return x.detach().cpu()
        return x.detach().cpu().double().requires_grad_(x.requires_grad)

    return {n: copy(x) for n, x in kwargs.items()}


def replace_argument(case: Case, name: str, value: Any, what: str) -> Case:
    """``case`` with argument ``name`` set to ``value``; the description gains ``"; <name>: <what>"``."""
    if name not in case.kwargs:
        raise KeyError(f"case of {case.route_id} has no argument {name!r}")
    return case.with_kwargs(f"{case.description}; {name}: {what}", **{name: value})


def agrees_with_reference(reference: Callable[[Case], Outputs], value_rtol: float = 1e-6,
                          grad_rtol: float = 1e-4) -> Callable[[Case, Outputs], None]:
    """An ``Adversarial.expect`` that compares the route's outputs with ``reference(case)`` (e.g. the family's
    float64 reference) instead of checking finiteness only: ``grad_*`` outputs within ``grad_rtol`` norm-wise
    relative, other float outputs within ``value_rtol`` relative per element, integer outputs exactly."""
    def expect_reference(case: Case, outputs: Outputs) -> None:
        want = reference(case)
        for name, got in outputs.items():
            got, ref = got.detach().cpu(), want[name].detach().cpu()
            if not got.is_floating_point():
                error, limit = float((got != ref).sum()), 0.0
            elif name.startswith("grad_"):
                error = float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))
                limit = grad_rtol
            else:
                error = float(((got.double() - ref.double()).abs() / ref.double().abs().clamp_min(1e-300)).max())
                limit = value_rtol
            if not error <= limit:
                raise AssertionError(f"{name}: error {error:.2e} against the reference, want <= {limit:g}")
    return expect_reference


# ------------------------------------------------------------------------------------- finite differences


def finite_difference_property(
    routes: tuple[str, ...],
    example: Callable[[], Any],
    make_case: Callable[[str, Any, torch.device], Case],
    run: Callable[[Case], Outputs],
    forward: Optional[Callable[[Case], Outputs]] = None,
    name: str = "gradients match finite differences (float64)",
    tolerance: Tolerance = FINITE_DIFFERENCE_TOLERANCE,
    step: float = FINITE_DIFFERENCE_STEP,
    pinned: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None,
) -> Property:
    """A :class:`Property` (run in float64 rows only): for a random direction ``v`` over every floating tensor
    argument that requires grad, ``<gradients, v>`` equals ``(f(x + h v) - f(x - h v)) / 2h`` with
    ``f = sum_k (upstream[k] * output_k).sum()`` and ``h = step``.

    ``make_case(route_id, example, device)`` builds a float64 case of the route (with ``upstream``) from one
    example of the strategy ``example()``; ``run`` is ``Family.run`` (outputs and gradients); ``forward(case)``,
    when given, computes the outputs without backward (faster); ``pinned(name, v)``, when given, returns the
    direction for argument ``name`` with the entries a convention pins held still (e.g. a zero first row). Every
    run must take the route under test.
    """
    def check(route_id: str, drawn: Any, device: torch.device, dtype: torch.dtype) -> None:
        case = make_case(route_id, drawn, device)
        out = run_route(run, case)
        leaves = {n: x for n, x in float_tensors(case.kwargs).items() if x.requires_grad}
        gen = torch.Generator().manual_seed(0)
        direction = {n: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device) for n, x in leaves.items()}
        if pinned is not None:
            direction = {n: pinned(n, v) for n, v in direction.items()}

        def f(h: float) -> torch.Tensor:
            moved = {n: (x.detach() + h * direction[n]).requires_grad_(True) for n, x in leaves.items()}
            outputs = run_route(forward or run, case.with_kwargs(case.description, **moved))
            return sum((outputs[k].double() * w.to(outputs[k].device).double()).sum() for k, w in case.upstream.items())

        numeric = (f(step) - f(-step)) / (2 * step)
        analytic = sum((out[f"grad_{n}"].double() * v).sum() for n, v in direction.items())
        expect_close("directional derivative vs finite differences", analytic, numeric, tolerance)

    return Property(name, routes, example, check, dtypes=(torch.float64,))


# ------------------------------------------------------------------------------------------ bad inputs


def _wrong_rank(x: torch.Tensor) -> torch.Tensor:
    """A 0-D tensor of ``x``'s dtype and device (every tensor argument of a batched kernel has rank >= 1)."""
    return x.detach().new_zeros(())


def _wrong_dtype(x: torch.Tensor) -> torch.Tensor:
    """int64 for a floating tensor, float64 for an integer one."""
    return x.detach().long() if x.is_floating_point() else x.detach().double()


def _longer(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with its first slice along ``dim`` appended."""
    return torch.cat([x, x.narrow(dim, 0, 1)], dim)


def _with_value(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def put(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().clone()
        x.view(-1)[x.numel() // 2] = value
        return x

    return put


def standard_bad_inputs(routes: tuple[str, ...], tensors: Sequence[str] = (), *, other_device: Sequence[str] = (),
                        rejects_nan: Sequence[str] = (), rejects_inf: Sequence[str] = (),
                        in_range: Optional[Mapping[str, tuple[int, Callable[[Case], int]]]] = None,
                        counts: Optional[Mapping[str, int]] = None, flags: Sequence[str] = (),
                        choices: Union[Sequence[str], Mapping[str, str]] = (),
                        shapes: Optional[Mapping[str, Sequence[int]]] = None,
                        csr: Optional[Mapping[str, Any]] = None) -> tuple[BadInput, ...]:
    """The bad inputs of the arguments named, for the routes matching ``routes``; each expects a
    ``ValueError``/``TypeError`` whose message starts with the argument's name:

    - every name in ``tensors``: a (nested) list instead of the tensor; a 0-D tensor (wrong rank); int64 instead
      of a floating tensor, float64 instead of an integer one (wrong dtype);
    - every name in ``other_device``: the tensor on the ``meta`` device (meaningful for arguments that must be on
      the device of another, which is validated first);
    - ``rejects_nan`` / ``rejects_inf``: the tensor with one NaN / one +inf element (in its middle);
    - ``in_range``: ``{name: (low, high(case))}`` for an integer tensor whose elements lie in low .. high: every
      element low - 1, every element high + 1;
    - ``counts``: ``{name: least}`` for an int argument of at least ``least``: least - 1, a float, a bool;
    - every name in ``flags`` (a bool argument): an int, a string;
    - every name in ``choices`` (an argument naming one of some options): a name that is none of them, or, given
      ``{name: near_miss}``, the name ``near_miss`` (an option a user might expect, such as ``reduce="prod"``);
    - ``shapes``: ``{name: dims}``: the tensor one longer along each of ``dims`` (its first slice appended), for
      dims whose size another argument fixes;
    - ``csr``: the bad indices of :func:`csr_bad_inputs` (its keyword arguments).

    The argument must be in the case the check builds (the route's ``tiny`` case), a tensor where a tensor is
    changed; a missing one fails the check loudly.
    """
    made: list[tuple[str, str, Callable[[Any, Case], Any]]] = []
    for name in tensors:
        made += [(name, "a list", lambda x, c: x.detach().tolist()), (name, "0-D", lambda x, c: _wrong_rank(x)),
                 (name, "wrong dtype", lambda x, c: _wrong_dtype(x))]
    made += [(name, "on another device", lambda x, c: x.detach().to("meta")) for name in other_device]
    made += [(name, "NaN", lambda x, c, put=_with_value(math.nan): put(x)) for name in rejects_nan]
    made += [(name, "+inf", lambda x, c, put=_with_value(math.inf): put(x)) for name in rejects_inf]
    for name, (low, high) in (in_range or {}).items():
        made += [(name, f"{low - 1} (below {low})", lambda x, c, v=low - 1: torch.full_like(x, v)),
                 (name, "one past the largest allowed", lambda x, c, h=high: torch.full_like(x, h(c) + 1))]
    for name, least in (counts or {}).items():
        made += [(name, f"{least - 1} (below {least})", lambda x, c, v=least - 1: v),
                 (name, "a float", lambda x, c, v=float(least + 1): v), (name, "a bool", lambda x, c: True)]
    for name in flags:
        made += [(name, "an int", lambda x, c: 1), (name, "a string", lambda x, c: "yes")]
    misses = choices if isinstance(choices, Mapping) else dict.fromkeys(choices)  # None: a generic wrong name
    made += [(name, f"{miss!r}, not an option" if miss else "a name of no option",
              lambda x, c, v=miss or "no such option": v) for name, miss in misses.items()]
    made += [(name, f"one longer along dim {d}", lambda x, c, d=d: _longer(x.detach(), d))
             for name, dims in (shapes or {}).items() for d in dims]
    changes_tensor = set().union(tensors, other_device, rejects_nan, rejects_inf, in_range or (), shapes or ())

    def bad(name: str, what: str, fn: Callable[[Any, Case], Any]) -> BadInput:
        def make(case: Case) -> Case:
            x = case.kwargs.get(name)
            if name in changes_tensor and not isinstance(x, torch.Tensor):
                raise TypeError(f"standard bad input {name!r} ({what}): the case has no tensor {name!r}")
            return replace_argument(case, name, fn(x, case), what)

        return BadInput(name, what, routes, make)

    return tuple(bad(*item) for item in made) + (csr_bad_inputs(routes, **csr) if csr is not None else ())


def _decreasing(offsets: torch.Tensor) -> torch.Tensor:
    out = offsets.clone()
    out[1] = out[2] + 1  # now offsets[1] > offsets[2]
    return out


def csr_bad_inputs(routes: tuple[str, ...], offsets: str = "offsets", ids: str = "ids",
                   in_form: Optional[Callable[[Case, str], Case]] = None,
                   ids_device_mode: Optional[Callable[[Case, dict], None]] = None,
                   segments: Optional[Callable[[Case], int]] = None,
                   tile_rows: Optional[Callable[[torch.device], int]] = None) -> tuple[BadInput, ...]:
    """The bad values of a CSR index over the rows of a case, each expecting an error naming the index argument:
    the argument ``offsets`` (S + 1 bounds) decreasing, empty, not starting at 0, with a negative first entry, not
    ending at N or ending below N (N rows), of a float dtype or on another device; the argument ``ids`` (each row's
    segment, sorted) unsorted, out of range (10 past), negative, int16 or on another device. ``in_form(case,
    name)``: the case with its index as the argument ``name``, for a case that holds the other form.
    ``ids_device_mode``: the device-mode expectation of the ids that pass the dtype and device checks
    (:class:`~kernel_sentinel.family.BadInput`). The tiny case needs two segments or more.

    With ``segments(case)`` (the case's S), three misplaced ids that a search of the ids as if sorted can miss: the
    last row alone at S (still sorted); S at rows inside the last segment (its second to last row, and with
    ``tile_rows(device)`` every row that ends a tile of that many rows); the first segment's id 0 at the last
    segment's second row. The tiny case's last segment then needs two rows or more."""
    def changed(name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Case], Case]:
        def make(case: Case) -> Case:
            if case.kwargs.get(name) is None:
                if in_form is None:
                    raise TypeError(f"CSR bad input {name!r}: the case has no {name!r} and no in_form was given")
                case = in_form(case, name)
            return case.with_kwargs(case.description, **{name: change(case.kwargs[name])})

        return make

    made = ((offsets, "decreasing", _decreasing, None),
            (offsets, "empty", lambda o: o[:0], None),
            (offsets, "not starting at 0", lambda o: o + 1, None),
            (offsets, "a negative first entry", lambda o: torch.cat([o[:1] - 1, o[1:]]), None),
            (offsets, "not ending at N", lambda o: torch.cat([o[:-1], o[-1:] + 1]), None),
            (offsets, "ending below N", lambda o: torch.cat([o[:-1], o[-1:] - 1]), None),
            (offsets, "float dtype", lambda o: o.double(), None),
            (offsets, "on another device", lambda o: o.to("meta"), None),
            (ids, "unsorted", lambda i: i.flip(0), ids_device_mode),
            (ids, "out of range", lambda i: i + 10, ids_device_mode),
            (ids, "negative", lambda i: i - 1, ids_device_mode),
            (ids, "int16", lambda i: i.to(torch.int16), None),
            (ids, "on another device", lambda i: i.to("meta"), None))
    bad = tuple(BadInput(name, what, routes, changed(name, change), mode) for name, what, change, mode in made)
    if segments is None:
        return bad

    def misplaced(change: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[Case], Case]:
        return lambda case: changed(ids, lambda i: change(i, segments(case)))(case)

    return bad + tuple(BadInput(ids, what, routes, misplaced(change), ids_device_mode) for what, change in (
        ("the last alone at S", lambda i, S: torch.cat([i[:-1], i.new_full((1,), S)])),
        ("S at rows inside the last segment", lambda i, S: _at_rows(i, _strays(i, S, tile_rows), S)),
        ("the first segment's id inside the last segment", lambda i, S: _at_rows(i, [_last_rows(i, S)[0] + 1], 0))))


def _last_rows(ids: torch.Tensor, S: int) -> tuple[int, int]:
    """``(first, N)``: segment S - 1 of the sorted ``ids`` holds rows first .. N - 1, two or more."""
    N, first = ids.numel(), int((ids < S - 1).sum())
    if N - first < 2:
        raise ValueError(f"the bad input needs a last segment of two rows or more, the case's has {N - first}")
    return first, N


def _strays(ids: torch.Tensor, S: int, tile_rows: Optional[Callable[[torch.device], int]]) -> list[int]:
    """Rows inside the last segment (not its first): the second to last, and every row ending a tile."""
    (first, N), tile = _last_rows(ids, S), tile_rows(ids.device) if tile_rows else 0
    return [r for r in range(first + 1, N) if r == N - 2 or (tile and (r + 1) % tile == 0)]


def _at_rows(ids: torch.Tensor, rows: list[int], value: int) -> torch.Tensor:
    return ids.index_fill(0, torch.tensor(rows, dtype=torch.int64, device=ids.device), value)


# ------------------------------------------------------------------------------------------- batch items


def _each(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn(x)`` for a tensor, ``fn`` of each member for a tuple of tensors, None for None."""
    if x is None:
        return None
    return tuple(fn(m) for m in x) if isinstance(x, tuple) else fn(x)


def batch_along(what: str, routes: tuple[str, ...], dims: Mapping[str, Any],
                summed: tuple[str, ...] = ()) -> BatchItems:
    """:class:`~kernel_sentinel.family.BatchItems` for items along a dimension: ``dims[name]`` is the item
    dimension ``d`` of the argument, upstream weight or output ``name``, or ``(d, last)`` for items along the
    dimensions ``d`` to ``last`` flattened into one (``d >= 0``; e.g. ``(0, -3)``: every leading dimension of a batch
    of matrices). A tuple of tensors (e.g. a pair of edges) is split member by member; None stays None. Arguments
    not in ``dims`` are shared: a joined case takes them from its base. A case holds as many items as the item
    dimension of its first argument in ``dims``; ``summed`` names the outputs summed over the items."""
    if not dims:
        raise ValueError("dims must name at least one argument")
    spans = {n: (d, d) if isinstance(d, int) else tuple(d) for n, d in dims.items()}

    def flat(name: str, t: torch.Tensor) -> torch.Tensor:
        return t.flatten(*spans[name])

    def count(case: Case) -> int:
        name, x = next((n, x) for n, x in case.kwargs.items() if n in dims and x is not None)
        return flat(name, x[0] if isinstance(x, tuple) else x).shape[spans[name][0]]

    def take(named: Mapping[str, Any], i: int) -> dict[str, Any]:
        return {n: _each(x, lambda t, n=n: flat(n, t).narrow(spans[n][0], i, 1)) for n, x in named.items()
                if n in dims}

    def split(case: Case) -> list[Case]:
        return [dataclasses.replace(case, kwargs={**case.kwargs, **take(case.kwargs, i)},
                                    upstream={**case.upstream, **take(case.upstream, i)},
                                    description=f"{case.description}; item {i}") for i in range(count(case))]

    def joined(cases: Sequence[Case], part: str) -> dict[str, Any]:
        first = getattr(cases[0], part)
        out = {}
        for n, x in first.items():
            if n in dims and x is not None:
                members = [getattr(c, part)[n] for c in cases]
                out[n] = (tuple(torch.cat(m, spans[n][0]) for m in zip(*members)) if isinstance(x, tuple)
                          else torch.cat(members, spans[n][0]))
        return out

    def join(base: Case, items: Sequence[Case]) -> Case:
        return dataclasses.replace(base, kwargs={**base.kwargs, **joined(items, "kwargs")},
                                   upstream={**base.upstream, **joined(items, "upstream")},
                                   description=f"{base.description}; {len(items)} items joined")

    def outputs(case: Case, got: Outputs) -> list[Outputs]:
        return [take(got, i) for i in range(count(case))]

    return BatchItems(what, routes, split, join, outputs, summed)


def batch_ragged(what: str, routes: tuple[str, ...], rows: Sequence[str], per_item: Sequence[str] = (),
                 offsets: str = "offsets", ids: str = "ids", count: str = "num_segments") -> BatchItems:
    """:class:`~kernel_sentinel.family.BatchItems` for ragged items indexed like CSR: item ``s`` owns rows
    ``offsets[s] .. offsets[s + 1] - 1`` of every argument, upstream weight or output in ``rows``, and row ``s`` of
    those in ``per_item``. The case's index is the argument ``offsets`` (S + 1 bounds) or ``ids`` (the sorted item of
    each row; then S is the argument ``count`` when the case has it, else the rows of its first ``per_item``
    argument, else ``ids[-1] + 1``). A split item and a joined case keep the index's form, dtype and device, and
    ``count`` when the case has it; other arguments are shared."""
    def bounds(case: Case) -> list[int]:
        kw = case.kwargs
        if kw.get(offsets) is not None:
            return kw[offsets].tolist()
        given = [kw[n].shape[0] for n in per_item if isinstance(kw.get(n), torch.Tensor)]
        S = kw[count] if count in kw else given[0] if given else int(kw[ids][-1]) + 1
        return [0] + torch.bincount(kw[ids].cpu(), minlength=S)[:S].cumsum(0).tolist() if S else [0]

    def indexed(case: Case, kwargs: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
        form = offsets if case.kwargs.get(offsets) is not None else ids
        like, counts = case.kwargs[form], torch.tensor(lengths, dtype=torch.int64)
        index = (torch.cat([counts.new_zeros(1), counts.cumsum(0)]) if form == offsets
                 else torch.repeat_interleave(torch.arange(len(lengths)), counts))
        return {**kwargs, form: index.to(like.device, like.dtype), **({count: len(lengths)} if count in kwargs else {})}

    def take(named: Mapping[str, Any], s: int, start: int, stop: int) -> dict[str, Any]:
        return {**{n: x[start:stop] for n, x in named.items() if n in rows},
                **{n: x[s:s + 1] for n, x in named.items() if n in per_item}}

    def split(case: Case) -> list[Case]:
        b = bounds(case)
        return [dataclasses.replace(case, description=f"{case.description}; item {s}",
                                    kwargs=indexed(case, {**case.kwargs, **take(case.kwargs, s, a, z)}, [z - a]),
                                    upstream={**case.upstream, **take(case.upstream, s, a, z)})
                for s, (a, z) in enumerate(zip(b, b[1:]))]

    def joined(items: Sequence[Case], part: str) -> dict[str, Any]:
        first = getattr(items[0], part)
        return {n: torch.cat([getattr(c, part)[n] for c in items]) for n in first if n in rows or n in per_item}

    def join(base: Case, items: Sequence[Case]) -> Case:
        lengths = [b[-1] for b in map(bounds, items)]
        return dataclasses.replace(base, kwargs=indexed(base, {**base.kwargs, **joined(items, "kwargs")}, lengths),
                                   upstream={**base.upstream, **joined(items, "upstream")},
                                   description=f"{base.description}; {len(items)} items joined")

    def outputs(case: Case, got: Outputs) -> list[Outputs]:
        b = bounds(case)
        return [take(got, s, a, z) for s, (a, z) in enumerate(zip(b, b[1:]))]

    return BatchItems(what, routes, split, join, outputs)
