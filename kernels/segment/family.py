"""Registration of the segment-reduction family with sentinel: cases per route, the float64 oracle (per-segment
loops) as reference and a dense-mask oracle, tolerances per dtype, properties, guards, bad inputs, invariants.
Only :mod:`kernel_sentinel.registry` imports this module.

Outputs of a route, by name: ``segment_reduce`` routes give ``value`` (S, ...) and, when ``x`` requires grad,
``grad_x`` (weights ``Case.upstream["value"]``); the adjoint routes give ``grad_x``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

import provable_kernels.segment as package
from provable_kernels.segment import oracle, torch_ops, triton_ops
from provable_kernels.segment.call import make_call
from provable_kernels.segment.dispatch import TREE, segment_max_backward, segment_min_backward, segment_reduce
from provable_kernels.segment.triton_segment import segment_chunk_kernel, segment_combine_kernel
from kernel_sentinel import cases
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Family, Guard, Invariant, Oracle, Outputs, Property
from kernel_sentinel.family import BatchItems, FailureMode, Tolerance

ENTRIES = {f.__name__: f for f in (segment_reduce, segment_max_backward, segment_min_backward)}
ADJOINTS = {"max": segment_max_backward.__name__, "min": segment_min_backward.__name__}
TOLERANCES = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float64: Tolerance(atol=1e-12, rtol=1e-12),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=1e-2),  # output rounding: 2**-8 relative
    torch.float16: Tolerance(atol=2e-3, rtol=2e-3),  # 2**-11 relative
}
EMPTY = -1.5  # the value of empty segments in every case (exact in every dtype)
ONE_BLOCK_MAX = triton_ops.INTERPRETED.short_rows  # the interpreter's short rows: at most this many is one pass
# the index form each route without an index branch is verified with (both forms are reached across routes)
FORMS = {"one_block": "ids", "blocked": "offsets", "sum": "offsets", "mean": "ids", "max": "ids", "min": "offsets"}


@dataclass(frozen=True)
class CaseShape:
    """A problem: segment lengths (zeros are empty segments), trailing dims of ``x``, integer-valued data (ties)
    or N(0, 1), and the seed of the values."""

    lengths: tuple[int, ...]
    trailing: tuple[int, ...]
    integers: bool
    seed: int = 0

    @property
    def rows(self) -> int:
        return sum(self.lengths)


SIZES = {  # (one pass, with long segments: fit adds one of two chunks)
    "small": ((3, 0, 5, 4), (3, 0, 25, 0, 1, 17, 0)),
    "tiny": ((2, 0, 3), (3, 0, 14, 0, 4)),
}
TRAILING = {"small": (2, 2), "tiny": (2,)}


def _where(route_id: str) -> dict[str, str]:
    return TREE.path_to(route_id)


def _reduce(where: dict[str, str]) -> str:
    return where.get("reduce", where.get("extreme"))


def _regime(where: dict[str, str]) -> str:
    """one_block only for the routes that ask for it; every other route runs segments of several chunks."""
    return where.get("rows", "blocked")


def fit(route_id: str, lengths: tuple[int, ...], device: torch.device = torch.device("cpu")) -> tuple[int, ...]:
    """``lengths`` adjusted to the route's shape regime on ``device``: trimmed to at most its short rows for
    one_block routes, extended by a segment that spans two chunks otherwise."""
    if _regime(_where(route_id)) == "one_block":
        out, room = [], triton_ops.short_rows(device)
        for n in lengths:
            out.append(min(n, room))
            room -= out[-1]
        return tuple(out)
    return tuple(lengths) + (triton_ops.spanning_rows(device),)  # two chunks, the second of one row


def make_case_for(route_id: str, shape: CaseShape, dtype: torch.dtype, device: torch.device,
                  upstream_sign: float = 0.0) -> Case:
    """A case of ``shape`` that the tree routes to ``route_id``. Weights / ``grad_output`` are random, or all
    ``upstream_sign`` when it is nonzero."""
    where = _where(route_id)
    reduce = _reduce(where)
    form = where.get("index", FORMS[_regime(where)] if "rows" in where else FORMS[reduce])
    gen = torch.Generator().manual_seed(shape.seed)
    N, S = shape.rows, len(shape.lengths)
    size = (N, *shape.trailing)
    x = torch.randint(-2, 3, size, generator=gen).double() if shape.integers else \
        torch.randn(size, generator=gen, dtype=torch.float64)
    lengths = torch.tensor(shape.lengths, dtype=torch.int64)
    index = ({"offsets": torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device)} if form == "offsets" else
             {"ids": torch.repeat_interleave(torch.arange(S), lengths).to(device)})
    weights = torch.randn((S, *shape.trailing), generator=gen, dtype=torch.float64)
    if upstream_sign:
        weights = torch.full_like(weights, upstream_sign)
    weights = weights.to(device, dtype)
    use_triton = where["backend"] == "triton"
    describe = f"lengths {shape.lengths} x {size} {str(dtype).replace('torch.', '')} {form} on {device}"
    x = x.to(device, dtype)
    if where["op"] == "adjoint":
        kwargs = {"grad_output": weights, "x": x, **index, "use_triton": use_triton}
        return Case(route_id, ADJOINTS[reduce], kwargs, describe, {}, {"shape": shape})
    train = where.get("grad", "train") == "train"
    kwargs = {"x": x.requires_grad_(train), "reduce": reduce, **index,
              **({"num_segments": S} if form == "ids" else {}), "empty": EMPTY, "use_triton": use_triton}
    return Case(route_id, segment_reduce.__name__, kwargs, describe, {"value": weights} if train else {},
                {"shape": shape})


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    one, several = SIZES[size]
    lengths = fit(route_id, one if _regime(_where(route_id)) == "one_block" else several, device)
    integers = _reduce(_where(route_id)) in ("max", "min")
    return make_case_for(route_id, CaseShape(lengths, TRAILING[size], integers, seed), dtype, device)


def run(case: Case) -> Outputs:
    """Call the route's entry point with the case's arguments as they are; gradients for training routes."""
    result = ENTRIES[case.entry](**case.kwargs)
    if case.entry in ADJOINTS.values():
        return {"grad_x": result}
    return cases.outputs_and_gradients({"value": result}, case)


# --------------------------------------------------------------------------------------------- batch items

PER_SEGMENT = ("grad_output", "value")  # arguments, upstream weights and outputs with one row per segment


def _bounds(case: Case) -> list[int]:
    """The case's CSR offsets as Python ints (counted from ``ids`` in the ids form)."""
    kw = case.kwargs
    if kw.get("offsets") is not None:
        return kw["offsets"].tolist()
    S = kw["num_segments"] if "num_segments" in kw else kw["grad_output"].shape[0]
    return oracle.offsets_from_ids(kw["ids"].cpu(), S)


def _indexed(kwargs: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    """``kwargs`` with the index (offsets, or ids and num_segments, in the form, dtype and device it has) of
    segments of ``lengths`` rows."""
    counts = torch.tensor(lengths, dtype=torch.int64)
    if kwargs.get("offsets") is not None:
        like = kwargs["offsets"]
        return {**kwargs, "offsets": torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(like.device, like.dtype)}
    like = kwargs["ids"]
    ids = torch.repeat_interleave(torch.arange(len(lengths)), counts).to(like.device, like.dtype)
    return {**kwargs, "ids": ids, **({"num_segments": len(lengths)} if "num_segments" in kwargs else {})}


def split_segments(case: Case) -> list[Case]:
    """One case per segment: its rows of ``x``, its row of the per-segment tensors, an index of one segment."""
    bounds = _bounds(case)
    items = []
    for s, (start, stop) in enumerate(zip(bounds, bounds[1:])):
        kwargs = {**case.kwargs, "x": case.kwargs["x"][start:stop],
                  **{n: case.kwargs[n][s:s + 1] for n in PER_SEGMENT if n in case.kwargs}}
        items.append(replace(case, kwargs=_indexed(kwargs, [stop - start]), description=f"{case.description}; "
                             f"segment {s}", upstream={n: w[s:s + 1] for n, w in case.upstream.items()}))
    return items


def join_segments(base: Case, items: list[Case]) -> Case:
    """The segments of ``items`` in order, the other arguments from ``base``."""
    def cat(name: str, part: str = "kwargs") -> torch.Tensor:
        return torch.cat([getattr(item, part)[name] for item in items])

    kwargs = {**base.kwargs, "x": cat("x"), **{n: cat(n) for n in PER_SEGMENT if n in base.kwargs}}
    return replace(base, kwargs=_indexed(kwargs, [item.kwargs["x"].shape[0] for item in items]),
                   upstream={n: cat(n, "upstream") for n in base.upstream},
                   description=f"{base.description}; {len(items)} segments joined")


def segment_outputs(case: Case, got: Outputs) -> list[Outputs]:
    """Each segment's row of ``value`` and rows of ``grad_x``."""
    bounds = _bounds(case)
    return [{**({"value": got["value"][s:s + 1]} if "value" in got else {}),
             **({"grad_x": got["grad_x"][start:stop]} if "grad_x" in got else {})}
            for s, (start, stop) in enumerate(zip(bounds, bounds[1:]))]


BATCH_ITEMS = (BatchItems("a segment", ("segment.*",), split_segments, join_segments, segment_outputs),)


# ---------------------------------------------------------------------------------------------- references


def _problem(case: Case) -> tuple[dict[str, Any], str, list[int]]:
    """float64 CPU arguments, the reduction, and the CSR offsets as Python ints (counted from ids if needed)."""
    kw = cases.float64_cpu(case.kwargs)
    reduce = kw.get("reduce") or next(r for r, name in ADJOINTS.items() if name == case.entry)
    if kw.get("offsets") is not None:
        return kw, reduce, kw["offsets"].tolist()
    S = kw["num_segments"] if "num_segments" in kw else kw["grad_output"].shape[0]
    return kw, reduce, oracle.offsets_from_ids(kw["ids"], S)


def _by(reduce_fn, grad_fn):
    def compute(case: Case) -> Outputs:
        kw, reduce, bounds = _problem(case)
        device = case.kwargs["x"].device
        if "grad_output" in kw:
            return {"grad_x": grad_fn(kw["x"], reduce, bounds, kw["grad_output"]).to(device)}
        out = {"value": reduce_fn(kw["x"], reduce, bounds, kw["empty"]).to(device)}
        if case.upstream:
            out["grad_x"] = grad_fn(kw["x"], reduce, bounds, case.upstream["value"]).to(device)
        return out

    return compute


reference = _by(oracle.segment_reduce, oracle.segment_grad)
reference.__doc__ = "The float64 per-segment loops of :mod:`provable_kernels.segment.oracle`."
dense = _by(oracle.dense_reduce, oracle.dense_grad)
dense.__doc__ = "The dense float64 membership-matrix computation of :mod:`provable_kernels.segment.oracle`."


# ---------------------------------------------------------------------------------------------- properties

REDUCE_ROUTES = ("segment.triton.*.infer.*", "segment.triton.*.train.*", "segment.torch.sum", "segment.torch.mean",
                 "segment.torch.max", "segment.torch.min")


@st.composite
def problems(draw: Any, integers: bool = False) -> CaseShape:
    """1..4 segments of 0..6 rows, one trailing dim of 1..2 columns."""
    lengths = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=4)))
    return CaseShape(lengths, (draw(st.integers(1, 2)),), integers, draw(st.integers(0, 2**16)))


def _case(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype, sign: float = 0.0) -> Case:
    return make_case_for(route_id, replace(shape, lengths=fit(route_id, shape.lengths, device)), dtype, device, sign)


def _permuted(case: Case, seed: int) -> tuple[Case, torch.Tensor]:
    """The case with the rows of every segment shuffled (weights unchanged), and the permutation."""
    shape = case.extra["shape"]
    gen = torch.Generator().manual_seed(seed)
    perm, start = [], 0
    for n in shape.lengths:
        perm += (start + torch.randperm(n, generator=gen)).tolist()
        start += n
    perm = torch.tensor(perm, dtype=torch.int64)
    x = case.kwargs["x"]
    moved = x.detach()[perm.to(x.device)].clone().requires_grad_(x.requires_grad)
    return case.with_kwargs(case.description + "; rows permuted within segments", x=moved), perm


def check_permutation(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """Permuting rows within a segment leaves the value unchanged (sums up to rounding) and moves the max / min
    gradient to the new first occurrence (compared with the oracle on the permuted rows)."""
    case = _case(route_id, shape, device, dtype)
    moved, perm = _permuted(case, shape.seed + 1)
    before, after = run_route(run, case), run_route(run, moved)
    reduce = case.kwargs["reduce"]
    if reduce in ("max", "min"):
        expect(torch.equal(before["value"], after["value"]), f"{reduce} changed under a permutation within segments")
    else:
        expect_close("value after permuting rows", after["value"], before["value"], TOLERANCES[dtype])
    if "grad_x" in after:
        if reduce in ("max", "min"):
            expect_close("grad_x after permuting rows", after["grad_x"], reference(moved)["grad_x"], TOLERANCES[dtype])
        else:
            expect(torch.equal(after["grad_x"], before["grad_x"][perm.to(device)]),
                   "sum / mean gradient did not follow the permuted rows")


def check_forms_agree(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """The ids form and the offsets form give bitwise the same outputs and gradients."""
    case = _case(route_id, shape, device, dtype)
    got = run_route(run, case)
    kw = dict(case.kwargs)
    lengths = torch.tensor(case.extra["shape"].lengths, device=device)
    if "ids" in kw:
        kw.pop("num_segments")
        kw["offsets"] = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        del kw["ids"]
    else:
        kw["ids"] = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
        kw["num_segments"] = lengths.numel()
        del kw["offsets"]
    x = kw["x"]
    kw["x"] = x.detach().clone().requires_grad_(x.requires_grad)
    other = cases.outputs_and_gradients({"value": segment_reduce(**kw)}, case, kw)
    for name, value in got.items():
        expect(torch.equal(value, other[name]), f"{name}: ids and offsets forms differ")


def check_sum_is_mean_times_count(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """sum == mean * count for every non-empty segment (empty ones give ``empty`` for both)."""
    case = _case(route_id, shape, device, dtype)
    got = run_route(run, case)["value"].double()
    other = "mean" if case.kwargs["reduce"] == "sum" else "sum"
    kw = {**case.kwargs, "reduce": other, "x": case.kwargs["x"].detach()}
    twin = segment_reduce(**kw).double()
    counts = torch.tensor(case.extra["shape"].lengths, dtype=torch.float64, device=device)
    counts = counts.reshape(-1, *([1] * (got.dim() - 1)))
    total, mean = (got, twin) if other == "mean" else (twin, got)
    tol = TOLERANCES[dtype]
    expect_close("sum vs mean * count", torch.where(counts > 0, total, 0.0),
                 torch.where(counts > 0, mean * counts, 0.0), Tolerance(tol.atol * 8, tol.rtol * 2))


def check_ties(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """Integer-valued data (many ties): the whole gradient goes to the first occurrence, for positive and for
    negative upstream gradients (against the oracle)."""
    for sign in (1.0, -1.0):
        case = _case(route_id, replace(shape, integers=True), device, dtype, sign)
        got = run_route(run, case)
        if "grad_x" in got:
            expect_close(f"grad_x with upstream {sign:+g}", got["grad_x"], reference(case)["grad_x"], TOLERANCES[dtype])
        else:
            expect_close("value", got["value"], reference(case)["value"], TOLERANCES[dtype])


def check_nan_propagates(route_id: str, shape: CaseShape, device: torch.device, dtype: torch.dtype) -> None:
    """A NaN row makes its segment's output NaN (that column); for max / min the first NaN gets the gradient, also
    when the segment holds two NaNs in different chunks (even seeds) or a NaN only in its later chunk (odd
    seeds)."""
    case = _case(route_id, shape, device, dtype)
    x = case.kwargs["x"].detach().clone()
    if x.shape[0] == 0:
        return
    gen = torch.Generator().manual_seed(shape.seed + 2)
    rows = torch.randint(0, x.shape[0], (2,), generator=gen).tolist()
    last = case.extra["shape"].lengths[-1]
    if last > 1:  # the last segment spans two chunks (fit): NaN in both (the first is the arg) or the later one
        rows += [x.shape[0] - 1] if shape.seed % 2 else [x.shape[0] - last, x.shape[0] - 1]
    x[rows] = float("nan")
    x = x.requires_grad_(case.kwargs["x"].requires_grad)
    case = case.with_kwargs(case.description + f"; NaN rows {rows}", x=x)
    got = run_route(run, case)
    want = reference(case)
    for name, value in want.items():
        expect(torch.equal(torch.isnan(got[name].cpu()), torch.isnan(value.cpu())), f"{name}: NaN pattern differs")
        finite = ~torch.isnan(value)
        expect_close(f"{name} (non-NaN entries)", got[name][finite], value[finite], TOLERANCES[dtype])


def _fd_case(route_id: str, shape: CaseShape, device: torch.device) -> Case:
    return _case(route_id, shape, device, torch.float64)


F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
SUM_MEAN = ("segment.triton.sum.*", "segment.triton.mean.*", "segment.torch.sum", "segment.torch.mean")
TRITON_REDUCE = ("segment.triton.*.infer.*", "segment.triton.*.train.*")
EXTREME_REDUCE = ("segment.triton.max.*", "segment.triton.min.*", "segment.torch.max", "segment.torch.min")
# About one property per route and dtype (the interpreter is slow): every route has at least one at every dtype.
PROPERTIES = (
    Property("permuting rows within a segment: same value, max/min gradient moves to the new first occurrence",
             REDUCE_ROUTES, problems, check_permutation, dtypes=(F32,)),
    Property("ids and offsets forms agree bitwise", TRITON_REDUCE, problems, check_forms_agree, dtypes=(F64,)),
    Property("sum equals mean times count", SUM_MEAN, problems, check_sum_is_mean_times_count, dtypes=(BF16,)),
    Property("ties in integer data: the first occurrence gets the whole gradient, either sign", EXTREME_REDUCE,
             lambda: problems(integers=True), check_ties, dtypes=(BF16,)),
    Property("ties in integer data: the adjoint gives the whole gradient to the first occurrence, either sign",
             ("segment.*_backward",), lambda: problems(integers=True), check_ties),
    Property("NaN propagates to its segment; the first NaN is the arg", ("segment.*",), problems,
             check_nan_propagates, dtypes=(F16,)),
    cases.finite_difference_property(("segment.torch.sum", "segment.torch.mean", "segment.torch.max",
                                      "segment.torch.min"), problems, _fd_case, run),
)


# ------------------------------------------------------------------------------------------------- guards


def _with_lengths(lengths: tuple[int, ...], what: str):
    def make(case: Case) -> Case:
        shape = replace(case.extra["shape"], lengths=lengths)
        device, dtype = case.kwargs["x"].device, case.kwargs["x"].dtype
        made = make_case_for(case.route_id, shape, dtype, device)
        return made.with_kwargs(f"{made.description} ({what})")

    return make


def _with_trailing(trailing: tuple[int, ...], what: str):
    def make(case: Case) -> Case:
        shape = replace(case.extra["shape"], trailing=trailing)
        made = make_case_for(case.route_id, shape, case.kwargs["x"].dtype, case.kwargs["x"].device)
        return made.with_kwargs(f"{made.description} ({what})")

    return make


def _infinities(case: Case) -> Case:
    """+inf in the first column of the first and middle rows, -inf in the last column of the middle and last
    rows (columns are independent: no segment sums +inf and -inf)."""
    def put(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1)
        n = x.shape[0]
        flat[[0, n // 2], 0] = math.inf
        flat[[n // 2, n - 1], -1] = -math.inf
        return flat.reshape(x.shape)

    return cases.transform_argument(case, "x", put, "+inf and -inf rows")


def _expect_empty(case: Case, outputs: Outputs) -> None:
    lengths = case.extra["shape"].lengths
    if "value" in outputs:
        for s, n in enumerate(lengths):
            if n == 0:
                expect(bool((outputs["value"][s] == EMPTY).all()), f"empty segment {s} is not {EMPTY}")
    if "grad_x" in outputs:
        expect_close("grad_x", outputs["grad_x"], reference(case)["grad_x"], TOLERANCES[case.kwargs["x"].dtype])


def _without_num_segments(case: Case) -> Case:
    """The ids case without ``num_segments`` (its last segment is not empty, so S = ids[-1] + 1 is the same)."""
    kw = {k: v for k, v in case.kwargs.items() if k != "num_segments"}
    return Case(case.route_id, case.entry, kw, case.description + "; no num_segments", case.upstream, case.extra)


_expect_reference = cases.matches_reference(
    lambda c: reference(replace(c, kwargs={**c.kwargs, "num_segments": len(c.extra["shape"].lengths)})),
    lambda c: TOLERANCES[c.kwargs["x"].dtype])


# the backward's rows find their segment among the CSR boundaries BOUNDARY_WINDOW at a time (offsets form): MANY
# empty segments in one tile take three windows; placed at row ONE_BLOCK_MAX - 1, the last row of a backward tile
# under the interpreter (8-row tiles), every boundary of the windows equals that row. In the forward they are MANY
# empty short segments sharing programs with the non-empty ones.
MANY = 2 * triton_ops.BOUNDARY_WINDOW + 1
# the interpreter's sizes: segments of one row less than and exactly the short rows (one pass), one row more (long,
# one chunk), empty, exactly one chunk, one row more (a one-row second chunk), short, and one over more chunks than
# the combine pass has lanes (two combine steps); integer data: ties inside chunks, across chunks and across lanes.
# The backward's 8-row tiles see segments ending one row before, on and after their edges.
_SIZES = triton_ops.INTERPRETED
EDGES = (ONE_BLOCK_MAX - 1, ONE_BLOCK_MAX, ONE_BLOCK_MAX + 1, 0, _SIZES.min_chunk, _SIZES.min_chunk + 1, 2,
         (_SIZES.combine_lanes + 1) * _SIZES.max_chunk - 3)
SEVERAL_BLOCK_ROUTES = ("segment.triton.*.infer.blocked", "segment.triton.*.train.*", "segment.torch.*",
                        "segment.triton.*_backward")
NO_ROWS_ROUTES = ("segment.triton.*.infer.one_block", "segment.triton.*.train.*", "segment.torch.*",
                  "segment.triton.*_backward")  # N = 0 is one chunk
ADVERSARIAL = (
    Adversarial("empty segments at both ends and inside", ("segment.*",),
                lambda c: _with_lengths((0, 0) + c.extra["shape"].lengths + (0,), "empty segments")(c),
                expect=_expect_empty),
    Adversarial(f"{MANY} empty segments at the last row of a tile: that row finds its segment past the first "
                f"{triton_ops.BOUNDARY_WINDOW} CSR boundaries, all equal to it", ("segment.*",),
                lambda c: _with_lengths(fit(c.route_id, (ONE_BLOCK_MAX - 1,) + (0,) * MANY + (1,),
                                            c.kwargs["x"].device),
                                        f"{MANY} empty segments at row {ONE_BLOCK_MAX - 1}")(c),
                expect=_expect_reference),
    Adversarial("every segment empty (N = 0)", NO_ROWS_ROUTES, _with_lengths((0, 0, 0), "N = 0"),
                expect=_expect_empty),
    Adversarial("no segments (S = 0, N = 0)", NO_ROWS_ROUTES, _with_lengths((), "S = 0"), expect=_expect_empty),
    Adversarial("no columns (D = 0)", ("segment.*",), _with_trailing((0,), "D = 0")),
    Adversarial("+inf and -inf rows", ("segment.*",), _infinities, allow_inf=("value",)),
    Adversarial(f"segments of one row less than, exactly, one row more than {ONE_BLOCK_MAX} (short) rows, of one and "
                f"two chunks, an empty one, one over five chunks, ties (integer data) and D = 3", SEVERAL_BLOCK_ROUTES,
                lambda c: _with_trailing((3,), "D = 3")(
                    _with_lengths(fit(c.route_id, EDGES, c.kwargs["x"].device), f"lengths {EDGES}")(c)),
                expect=_expect_reference),
    Adversarial("ids without num_segments (S read from ids[-1])", ("segment.triton.*.infer.one_block",
                                                                   "segment.triton.*.train.ids"),
                _without_num_segments, expect=_expect_reference),
)


# ---------------------------------------------------------------------------------------------- bad inputs

ALL = ("segment.*",)
REDUCE_ONLY = ("segment.triton.*.infer.*", "segment.triton.*.train.*", "segment.torch.sum", "segment.torch.mean",
               "segment.torch.max", "segment.torch.min")


def _swap_form(case: Case, both: bool) -> Case:
    """Both index forms (``both``) or neither."""
    kw = {k: v for k, v in case.kwargs.items() if k not in ("offsets", "ids", "num_segments")}
    if both:
        kw["offsets"] = _as_form(case, "offsets").kwargs["offsets"]
        kw["ids"] = _as_form(case, "ids").kwargs["ids"]
    return Case(case.route_id, case.entry, kw, case.description + ("; both index forms" if both else "; no index"),
                case.upstream, case.extra)


def _index_bad(name: str, what: str, fn) -> BadInput:
    def make(case: Case) -> Case:
        if name not in case.kwargs:
            case = _as_form(case, name)
        return cases.replace_argument(case, name, fn(case.kwargs[name]), what)

    return BadInput(name, what, ALL, make)


def _as_form(case: Case, form: str) -> Case:
    """The case with its index in ``form`` (offsets or ids); the adjoint takes S from grad_output."""
    kw = {k: v for k, v in case.kwargs.items() if k not in ("offsets", "ids", "num_segments")}
    lengths = torch.tensor(case.extra["shape"].lengths, device=case.kwargs["x"].device)
    if form == "offsets":
        kw["offsets"] = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    else:
        kw["ids"] = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
        if case.entry == segment_reduce.__name__:
            kw["num_segments"] = lengths.numel()
    return Case(case.route_id, case.entry, kw, case.description, case.upstream, case.extra)


def _decreasing(o: torch.Tensor) -> torch.Tensor:
    o = o.clone()
    o[1] = o[2] + 1  # now offsets[1] > offsets[2]
    return o


BAD_INPUTS = (
    *cases.standard_bad_inputs(ALL, ("x",)),
    BadInput("x", "integer x", ALL, lambda c: cases.replace_argument(c, "x", c.kwargs["x"].detach().long(), "int64")),
    BadInput("reduce", "unknown reduction", REDUCE_ONLY, lambda c: cases.replace_argument(c, "reduce", "prod", "prod")),
    BadInput("empty", "a string", REDUCE_ONLY, lambda c: cases.replace_argument(c, "empty", "zero", "a string")),
    BadInput("empty", "below float32's range", REDUCE_ONLY,
             lambda c: cases.replace_argument(c, "empty", 1e-300, "1e-300")),
    BadInput("use_triton", "an int", ALL, lambda c: cases.replace_argument(c, "use_triton", 1, "1")),
    BadInput("offsets", "both index forms", ALL, lambda c: _swap_form(c, both=True)),
    BadInput("offsets", "neither index form", ALL, lambda c: _swap_form(c, both=False)),
    _index_bad("offsets", "decreasing", _decreasing),
    _index_bad("offsets", "empty", lambda o: o[:0]),
    _index_bad("offsets", "not starting at 0", lambda o: o + 1),
    _index_bad("offsets", "not ending at N", lambda o: torch.cat([o[:-1], o[-1:] + 1])),
    _index_bad("offsets", "float dtype", lambda o: o.double()),
    _index_bad("offsets", "on another device", lambda o: o.to("meta")),
    _index_bad("ids", "unsorted", lambda i: i.flip(0)),
    _index_bad("ids", "out of range", lambda i: i + 10),
    _index_bad("ids", "negative", lambda i: i - 1),
    _index_bad("ids", "int16", lambda i: i.to(torch.int16)),
    _index_bad("ids", "on another device", lambda i: i.to("meta")),
    BadInput("num_segments", "a float", REDUCE_ONLY,
             lambda c: cases.replace_argument(_as_form(c, "ids"), "num_segments", 2.5, "2.5")),
    BadInput("num_segments", "a bool", REDUCE_ONLY,
             lambda c: cases.replace_argument(_as_form(c, "ids"), "num_segments", True, "True")),
    BadInput("num_segments", "negative", REDUCE_ONLY,
             lambda c: cases.replace_argument(_as_form(c, "ids"), "num_segments", -1, "-1")),
    BadInput("num_segments", "not offsets.numel() - 1", REDUCE_ONLY,
             lambda c: _as_form(c, "offsets").with_kwargs(c.description + "; num_segments: 99", num_segments=99)),
    BadInput("grad_output", "wrong shape", ("segment.*_backward",),
             lambda c: cases.replace_argument(c, "grad_output", c.kwargs["grad_output"][..., :1], "one column")),
    BadInput("grad_output", "wrong dtype", ("segment.*_backward",),
             lambda c: cases.replace_argument(c, "grad_output", c.kwargs["grad_output"].long(), "int64")),
)


# ---------------------------------------------------------------------------------------------- invariants

TESTS = "tests/test_segment.py"
INVARIANTS = (
    Invariant("Every Triton route matches the float64 oracle in value and gradient, both index forms, both row "
              "regimes.", f"{TESTS}::test_triton_matches_oracle"),
    Invariant("float64, bfloat16 and float16 inputs (float32 accumulation) match the oracle within the dtype's "
              "tolerance on both backends.", f"{TESTS}::test_dtypes_match_oracle"),
    Invariant("The standalone adjoints are bitwise equal to the autograd gradient.",
              f"{TESTS}::test_adjoint_bitwise_equals_autograd"),
    Invariant("Ties: the whole max / min gradient goes to the first occurrence for either sign of the upstream "
              "gradient.", f"{TESTS}::test_ties_go_to_first_occurrence"),
    Invariant("Empty segments give `empty` and no gradient; NaN propagates and the first NaN is the arg.",
              f"{TESTS}::test_nan_inf_and_empty_segments"),
    Invariant("Outputs are bitwise repeatable, strided inputs match contiguous ones, and poisoned allocations "
              "change nothing.", f"{TESTS}::test_trailing_dims_strided_x_and_repeatability"),
    Invariant("The Triton kernels are torch custom ops that pass torch.library.opcheck.",
              f"{TESTS}::test_custom_ops_pass_opcheck"),
    Invariant("torch.segment_reduce gives every tied row the full gradient when it is negative; this family gives "
              "it to the first row.", f"{TESTS}::test_peer_defect_torch_segment_reduce_tie_gradient"),
)


FAILURE_MODES = (  # symptom -> the trace section to read first, a second page, what covers it
    FailureMode("NaN in the loss", "segment/reduce-triton.md#numerical-guards", "guide/segment.md#conventions",
                "guards check (NaN/inf input, empty segments); written check (poisoned allocations)",
                checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned")),
    FailureMode("NaN in the backward", "segment/reduce-triton.md#numerical-guards",
                "segment/adjoint-triton.md#routes", "guards check on the training routes and the adjoints",
                checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned"), routes=("segment.*.train.*", "segment.*_backward")),
    FailureMode("wrong gradients", "segment/adjoint-triton.md#routes",
                "guide/segment.md#ties-compared-with-torchsegment_reduce",
                "reference check (first occurrence of a tie gets the gradient); adjoints bitwise vs autograd",
                checks=("reference", "exact", "properties", "guards"),
                signs=("grad", "derivative"), routes=("segment.*.train.*", "segment.*_backward")),
    FailureMode("out of memory", "segment/reduce-triton.md#dispatch-conditions", "guide/segment.md#backends",
                "one (S, D) output and per-chunk partials (N / short rows); no (N, S) intermediate"),
    FailureMode("backend mismatch", "segment/reduce-triton.md#verification", "segment/reduce-torch.md#routes",
                "reference check: both backends against the same float64 oracle", checks=("reference", "exact")),
    FailureMode("wrong route taken", "segment/index.md#dispatch-conditions", "segment/index.md#decision-tree",
                "route check: the dispatcher records the route id it took", checks=("route",)),
)

FAMILY = Family(
    name="segment",
    package=package,
    tree=TREE,
    entry_points=ENTRIES,
    make_case=make_case,
    run=run,
    reference=reference,
    tolerances=TOLERANCES,
    dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16),
    oracles=(Oracle("dense membership matrix", "small", dense),),
    properties=PROPERTIES,
    adversarial=ADVERSARIAL,
    bad_inputs=BAD_INPUTS,
    invariants=INVARIANTS,
    guards=(
        Guard("Arguments are validated before dispatch: wrong type, rank, dtype or device; both or neither index "
              "form; offsets not from 0 to N or decreasing; ids unsorted or out of range raise ValueError / "
              "TypeError naming the argument (value checks in host mode; on CUDA no host read: the Triton kernels "
              "check the index themselves and write NaN for the segments it spoils).", make_call),
        Guard("Empty segments are short segments without rows, written with `empty` by the chunk kernel (mean never "
              "divides by zero), and receive no gradient: no row belongs to them.", segment_chunk_kernel.fn),
        Guard("Long segments are cut into chunks from their first row and combined in chunk order from per-chunk "
              "partials (max / min: ties to the lowest row): no atomics, bitwise repeatable, the same bits alone or "
              "in any batch.", segment_combine_kernel.fn),
        Guard("The PyTorch backend's max / min gathers x at the first-occurrence arg, so autograd's gradient goes to "
              "exactly one row per (segment, column).", torch_ops.first_arg),
    ),
    failure_modes=FAILURE_MODES,
    batch_items=BATCH_ITEMS,
    known_issues=(
        "Peer issue (torch.segment_reduce): its max / min backward splits a tied gradient among the tied rows only "
        "when the upstream gradient is positive; with a negative upstream gradient every tied row receives the full "
        "gradient (the gradients sum to a multiple of the upstream). This family gives the whole gradient to the "
        "first occurrence for either sign (test_peer_defect_torch_segment_reduce_tie_gradient).",
        "Peer issue (torch.segment_reduce): one thread per (segment, column), so one long segment runs serially "
        "(thousands of times off the copy floor at 16M rows); this family cuts long segments into chunks.",
        "The ids form without num_segments reads S = ids[-1] + 1 from the device: a host sync per call (and an "
        "error under torch.compile or graph capture); with offsets, or ids and num_segments, CUDA calls need none.",
        "The Triton kernels index rows and segments with int32: N or S of 2**31 or more runs the PyTorch backend.",
    ),
)
