"""Registration of the segment-reduction family for verification (data and plain functions; sentinel reads it,
see ``kernel_sentinel.registration``): cases per route, the float64 oracle (per-segment loops) as reference and a
dense-mask oracle, tolerances per dtype, properties, guards, bad inputs, invariants.

Outputs of a route, by name: ``segment_reduce`` routes give ``value`` (S, ...) and, when ``x`` requires grad,
``grad_x`` (weights ``Case.upstream["value"]``); the adjoint routes give ``grad_x``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from provable_kernels.segment import oracle, probes, torch_ops, triton_ops
from provable_kernels.segment.call import make_call
from provable_kernels.segment.dispatch import TREE, segment_max_backward, segment_min_backward, segment_reduce
from provable_kernels.segment.triton_segment import FAN, segment_chunk_kernel


def across_the_epochs_wrap(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``segment_reduce`` as the call after 2**31 - 1 others in one process: the epochs (int32, never 0) wrap to 1
    there, and flags kept from earlier calls must not pass for this call's."""
    triton_ops.restart_epochs(triton_ops.EPOCH_LIMIT)
    return segment_reduce(*args, **kwargs)


ENTRY_POINTS = {f.__name__: f for f in (segment_reduce, segment_max_backward, segment_min_backward,
                                        across_the_epochs_wrap)}
_ADJOINTS = {"max": segment_max_backward.__name__, "min": segment_min_backward.__name__}
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12),
              torch.bfloat16: (2e-2, 1e-2),  # output rounding: 2**-8 relative
              torch.float16: (2e-3, 2e-3)}  # 2**-11 relative
_F32, _F64, _BF16, _F16 = TOLERANCES
_EMPTY = -1.5  # the value of empty segments in every case (exact in every dtype)
_ONE_BLOCK_MAX = triton_ops.INTERPRETED.short_rows  # the interpreter's short rows: at most this many is one pass
# the index form each route without an index branch is verified with (both forms are reached across routes)
_FORMS = {"one_block": "ids", "blocked": "offsets", "sum": "offsets", "mean": "ids", "max": "ids", "min": "offsets"}
_ALL = "segment.*"

# A problem: segment lengths (zeros are empty segments), trailing dims of x, integer-valued data (ties) or N(0, 1),
# and ``sign``: all upstream weights +-1 (0: random). ``short``: the lengths of one-pass routes (``lengths``: a
# long segment, fit adds one of two chunks). ``wide``: the trailing dims of the one-pass sum, two column blocks (the
# ids form's bounds must be written by the first block alone: memory's one-writer rule).
SIZES = {"small": dict(lengths=(3, 0, 25, 0, 1, 17, 0), short=(3, 0, 5, 4), trailing=(2, 2)),
         "tiny": dict(lengths=(3, 0, 14, 0, 4), short=(2, 0, 3), trailing=(2,), wide=(triton_ops.MAX_BLOCK_D + 1,))}


def _path(route_id: str) -> dict[str, str]:
    """The route's path, ``reduce`` also on the adjoint routes."""
    path = TREE.path_to(route_id)
    return {**path, "reduce": path.get("reduce", path.get("extreme"))}


def _one_block(route_id: str) -> bool:
    """one_block only for the routes that ask for it; every other route runs segments of several chunks."""
    return TREE.path_to(route_id).get("rows") == "one_block"


def _sibling(route_id: str, **outcomes: str) -> str:
    """The route whose path is ``route_id``'s with ``outcomes`` changed."""
    want = {**TREE.path_to(route_id), **outcomes}
    return next(r.id for r in TREE.routes() if TREE.path_to(r.id) == want)


def spanning_rows(device: torch.device) -> int:
    """Rows of a segment cut into two chunks on ``device``, the second of one row."""
    return triton_ops.sizes(1, device).min_chunk + 1


def fitted(route_id: str, lengths: tuple[int, ...], device: torch.device) -> tuple[int, ...]:
    """``lengths`` adjusted to the route's shape regime on ``device``: trimmed to at most its short rows for
    one_block routes, extended by a segment that spans two chunks otherwise."""
    if _one_block(route_id):
        out, room = [], triton_ops.short_rows(device)
        for n in lengths:
            out.append(min(n, room))
            room -= out[-1]
        return tuple(out)
    return tuple(lengths) + (spanning_rows(device),)  # two chunks, the second of one row


def fit(route_id: str, p: Any, device: torch.device) -> dict:
    """Lengths fitted to the route (a size's ``short`` ones on one-pass routes, its ``wide`` trailing dims on the
    one-pass sum); integer data on max / min routes unless the problem says."""
    one_block, reduce = _one_block(route_id), _path(route_id)["reduce"]
    lengths = p.short if one_block and "short" in p else p.lengths
    wide = one_block and reduce == "sum" and "wide" in p  # the bounds are written alike for every reduction
    return dict(p, lengths=fitted(route_id, lengths, device), trailing=p.wide if wide else p.trailing,
                integers=p.get("integers", reduce in _ADJOINTS))


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    path = _path(route_id)
    reduce = path["reduce"]
    form = path.get("index", _FORMS[path["rows"]] if "rows" in path else _FORMS[reduce])
    size, S = (sum(p.lengths), *p.trailing), len(p.lengths)
    x = torch.randint(-2, 3, size, generator=gen).double() if p.integers else \
        torch.randn(size, generator=gen, dtype=torch.float64)
    weights = torch.randn((S, *p.trailing), generator=gen, dtype=torch.float64)
    if p.get("sign"):
        weights = torch.full_like(weights, p.sign)
    index, use_triton = oracle.csr_index(p.lengths, form), path["backend"] == "triton"
    if path["op"] == "adjoint":
        return _ADJOINTS[reduce], {"grad_output": weights, "x": x, **index, "use_triton": use_triton}, {}
    kwargs = {"x": x, "reduce": reduce, **index, **({"num_segments": S} if form == "ids" else {}), "empty": _EMPTY,
              "use_triton": use_triton}
    return segment_reduce.__name__, kwargs, {"value": weights} if path.get("grad", "train") == "train" else {}


def outputs(result: torch.Tensor, case: Any) -> dict:
    return {"grad_x": result} if case.entry in _ADJOINTS.values() else {"value": result}


def _bounds(kw: dict) -> list[int]:
    """The CSR offsets as Python ints (counted from ``ids`` in the ids form; S = ids[-1] + 1 without
    num_segments, as the entry points read it)."""
    if kw.get("offsets") is not None:
        return kw["offsets"].tolist()
    S = (kw["num_segments"] if "num_segments" in kw else kw["grad_output"].shape[0] if "grad_output" in kw
         else int(kw["ids"][-1]) + 1)
    return oracle.offsets_from_ids(kw["ids"].cpu(), S)


def _by(reduce_fn, grad_fn):
    def compute(kw: dict, case: Any) -> dict:
        reduce, bounds = kw.get("reduce") or next(r for r, n in _ADJOINTS.items() if n == case.entry), _bounds(kw)
        if "grad_output" in kw:
            return {"grad_x": grad_fn(kw["x"], reduce, bounds, kw["grad_output"])}
        value = {"value": reduce_fn(kw["x"], reduce, bounds, kw["empty"])}
        return {**value, "grad_x": grad_fn(kw["x"], reduce, bounds, case.upstream["value"])} if case.upstream else value

    return compute


reference = _by(oracle.segment_reduce, oracle.segment_grad)
reference.__doc__ = "The float64 per-segment loops of :mod:`provable_kernels.segment.oracle`."
ORACLES = (("dense membership matrix", "small", _by(oracle.dense_reduce, oracle.dense_grad)),)


# --------------------------------------------------------------------------------------------- batch items

BATCH_ITEMS = (("a segment", _ALL, {"ragged": dict(rows=("x", "grad_x"), per_item=("grad_output", "value"))}),)


# ---------------------------------------------------------------------------------------------- properties


def example(pick: Any, integers: bool = False) -> dict:
    """1..4 segments of 0..6 rows, one trailing dim of 1..2 columns."""
    return dict(lengths=tuple(pick(range(7)) for _ in range(pick(range(1, 5)))), trailing=(pick(range(1, 3)),),
                integers=integers)


def _unindexed(case: Any, what: str, *forms: str) -> Any:
    """The case with its index in each of ``forms`` (offsets, ids; none: no index; ids with num_segments when it
    is the only form of a ``segment_reduce`` case: the adjoint takes S from grad_output)."""
    index = {n: x.to(case.device) for form in forms for n, x in oracle.csr_index(case.problem.lengths, form).items()}
    if forms == ("ids",) and case.entry == segment_reduce.__name__:
        index["num_segments"] = len(case.problem.lengths)
    moved = case.without(what, "offsets", "ids", "num_segments")
    return moved.with_kwargs(moved.description, **index)


def _in_form(case: Any, form: str) -> Any:
    """The case with its index in ``form``, on the route that form takes."""
    route = _sibling(case.route_id, index=form) if "index" in TREE.path_to(case.route_id) else case.route_id
    return dataclasses.replace(_unindexed(case, f"{form} form", form), route_id=route)


def permutation(check: Any, case: Any) -> None:
    """Permuting rows within a segment leaves the value unchanged (sums up to rounding) and moves the max / min
    gradient to the new first occurrence (compared with the oracle on the permuted rows)."""
    gen = torch.Generator().manual_seed(case.problem.seed + 1)
    perm, start = [], 0
    for n in case.problem.lengths:
        perm += (start + torch.randperm(n, generator=gen)).tolist()
        start += n
    perm = torch.tensor(perm, dtype=torch.int64)
    moved = case.transformed("rows permuted within segments", x=lambda x: x[perm])
    before, after, reduce = check.run(case), check.run(moved), case.kwargs["reduce"]
    if reduce in _ADJOINTS:
        check.expect(torch.equal(before["value"], after["value"]), f"{reduce} changed under a permutation")
    else:
        check.close("value after permuting rows", after["value"], before["value"])
    if "grad_x" in after and reduce in _ADJOINTS:
        check.close("grad_x after permuting rows", after["grad_x"], check.reference(moved)["grad_x"])
    elif "grad_x" in after:
        check.expect(torch.equal(after["grad_x"], before["grad_x"][perm.to(case.device)]),
                     "sum / mean gradient did not follow the permuted rows")


def forms_agree(check: Any, case: Any) -> None:
    """The ids form and the offsets form give bitwise the same outputs and gradients."""
    got, other = check.run(case), check.run(_in_form(case, "offsets" if "ids" in case.kwargs else "ids"))
    for name, value in got.items():
        check.expect(torch.equal(value, other[name]), f"{name}: ids and offsets forms differ")


def sum_is_mean_times_count(check: Any, case: Any) -> None:
    """sum == mean * count for every non-empty segment (empty ones give ``empty`` for both)."""
    other = "mean" if case.kwargs["reduce"] == "sum" else "sum"
    twin = dataclasses.replace(case.with_kwargs(f"{case.description}; {other}", reduce=other),
                               route_id=_sibling(case.route_id, reduce=other))
    got, again = check.forward(case)["value"].double(), check.forward(twin)["value"].detach().double()
    counts = torch.tensor(case.problem.lengths, dtype=torch.float64, device=got.device)
    counts = counts.reshape(-1, *([1] * (got.dim() - 1)))
    total, mean = (got, again) if other == "mean" else (again, got)
    tol = check.tolerance
    check.close("sum vs mean * count", torch.where(counts > 0, total, 0.0), torch.where(counts > 0, mean * counts, 0.0),
                (tol.atol * 8, tol.rtol * 2))


def ties(check: Any, case: Any) -> None:
    """Integer-valued data (many ties): the whole gradient goes to the first occurrence, for positive and for
    negative upstream gradients (against the oracle)."""
    for sign in (1.0, -1.0):
        signed = check.case({**case.problem, "sign": sign})
        got, want = check.run(signed), check.reference(signed)
        name = "grad_x" if "grad_x" in got else "value"
        check.close(f"{name} with upstream {sign:+g}", got[name], want[name])


def nan_propagates(check: Any, case: Any) -> None:
    """A NaN row makes its segment's output NaN (that column); for max / min the first NaN gets the gradient, also
    when the segment holds two NaNs in different chunks (even seeds) or a NaN only in its later chunk (odd
    seeds)."""
    N, last, seed = case.kwargs["x"].shape[0], case.problem.lengths[-1], case.problem.seed
    if N == 0:
        return
    rows = torch.randint(0, N, (2,), generator=torch.Generator().manual_seed(seed + 2)).tolist()
    if last > 1:  # the last segment spans two chunks (fit): NaN in both (the first is the arg) or the later one
        rows += [N - 1] if seed % 2 else [N - last, N - 1]
    case = case.transformed(f"NaN rows {rows}", x=lambda x: x.index_fill(0, torch.tensor(rows), math.nan))
    got, want = check.run(case), check.reference(case)
    for name, value in want.items():
        check.expect(torch.equal(torch.isnan(got[name].cpu()), torch.isnan(value)), f"{name}: NaN pattern differs")
        check.close(f"{name} (non-NaN entries)", got[name].cpu()[~torch.isnan(value)], value[~torch.isnan(value)])


def chunks_follow_the_rule(check: Any, case: Any) -> None:
    """The kernels cut a long segment of n rows into chunks of the least power of two >= min_chunk rows holding n in
    at most target chunks, capped at min_chunk * 2**doublings (``triton_ops.Sizes`` of the case's device): against
    that rule as a Python loop, at each doubling's threshold (target chunks of r rows, one row less and one more),
    0, 1 and past the cap (``oracle.chunk_rows``). The chunking moves only a sum's rounding, within tolerance, so no
    value check sees it."""
    z = triton_ops.sizes(1, case.device)
    lengths = [0, 1, 2 * (z.min_chunk << z.doublings) * z.target] + [
        (z.min_chunk << i) * z.target + d for i in range(z.doublings + 1) for d in (-1, 0, 1)]
    want = [oracle.chunk_rows(n, z.min_chunk, z.doublings, z.target) for n in lengths]
    got = probes.chunk_rows_of(lengths, z.min_chunk, z.doublings, z.target, case.device)
    check.expect(got == want, f"chunk rows of lengths {lengths}: {got}, the rule gives {want}")


_REDUCE_ROUTES = ("segment.triton.*.infer.*", "segment.triton.*.train.*", "segment.torch.sum", "segment.torch.mean",
                 "segment.torch.max", "segment.torch.min")
_TIED = lambda pick: example(pick, integers=True)  # noqa: E731
_CHUNKED_ROUTES = ("segment.triton.*.infer.blocked", "segment.triton.*.train.*", "segment.triton.*_backward")
# About one property per route and dtype (the interpreter is slow): every route has at least one at every dtype.
PROPERTIES = (
    ("permuting rows within a segment: same value, max/min gradient moves to the new first occurrence",
     _REDUCE_ROUTES, permutation, (_F32,)),
    ("ids and offsets forms agree bitwise", _REDUCE_ROUTES[:2], forms_agree, (_F64,)),
    ("sum equals mean times count", ("segment.triton.sum.*", "segment.triton.mean.*", "segment.torch.sum",
                                     "segment.torch.mean"), sum_is_mean_times_count, (_BF16,)),
    ("ties in integer data: the first occurrence gets the whole gradient, either sign",
     ("segment.triton.max.*", "segment.triton.min.*", "segment.torch.max", "segment.torch.min"), ties, (_BF16,), _TIED),
    ("ties in integer data: the adjoint gives the whole gradient to the first occurrence, either sign",
     "segment.*_backward", ties, (), _TIED),
    ("NaN propagates to its segment; the first NaN is the arg", _ALL, nan_propagates, (_F16,)),
    ("a long segment's chunks follow the documented rule", _CHUNKED_ROUTES, chunks_follow_the_rule, (_F32,)),
)
FINITE_DIFFERENCES = _REDUCE_ROUTES[2:]


# ------------------------------------------------------------------------------------------------- guards


def _infinities(x: torch.Tensor) -> torch.Tensor:
    """+inf in the first column of the first and middle rows, -inf in the last column of the middle and last
    rows (columns are independent: no segment sums +inf and -inf)."""
    flat, n = x.reshape(x.shape[0], -1), x.shape[0]
    flat[[0, n // 2], 0] = math.inf
    flat[[n // 2, n - 1], -1] = -math.inf
    return flat.reshape(x.shape)


def _expect_empty(check: Any, case: Any, outputs: dict) -> None:
    if "value" in outputs:
        for s, n in enumerate(case.problem.lengths):
            if n == 0:
                check.expect(bool((outputs["value"][s] == _EMPTY).all()), f"empty segment {s} is not {_EMPTY}")
    if "grad_x" in outputs:
        check.close("grad_x", outputs["grad_x"], check.reference(case)["grad_x"])


def _lengths(lengths: tuple[int, ...]) -> dict:
    """A problem change: ``lengths`` fitted to the case's route."""
    return {"problem": lambda c: {"lengths": fitted(c.route_id, lengths, c.device)}}


# the backward's rows find their segment among the CSR boundaries BOUNDARY_WINDOW at a time (offsets form): _MANY
# empty segments in one tile take three windows; placed at row _ONE_BLOCK_MAX - 1, the last row of a backward tile
# under the interpreter (8-row tiles), every boundary of the windows equals that row. In the forward they are _MANY
# empty short segments sharing programs with the non-empty ones.
_MANY = 2 * triton_ops.BOUNDARY_WINDOW + 1
# the interpreter's sizes: segments of one row less than and exactly the short rows (one pass), one row more (long,
# one chunk), empty, exactly one chunk, one row more (a one-row second chunk), short, and one over more chunks than
# the combine has lanes (two combine steps); integer data: ties inside chunks, across chunks and across lanes.
# The backward's 8-row tiles see segments ending one row before, on and after their edges.
_SIZES = triton_ops.INTERPRETED
_EDGES = (_ONE_BLOCK_MAX - 1, _ONE_BLOCK_MAX, _ONE_BLOCK_MAX + 1, 0, _SIZES.min_chunk, _SIZES.min_chunk + 1, 2,
         (_SIZES.combine_lanes + 1) * _SIZES.max_chunk - 3)
_SEVERAL_BLOCK_ROUTES = ("segment.triton.*.infer.blocked", "segment.triton.*.train.*", "segment.torch.*",
                        "segment.triton.*_backward")
_NO_ROWS_ROUTES = ("segment.triton.*.infer.one_block", "segment.triton.*.train.*", "segment.torch.*",
                  "segment.triton.*_backward")  # N = 0 is one chunk


def _rows_one_past_fan(case: Any) -> dict:
    """One-row segments before the two-chunk one, N = 1 (mod FAN) rows in all: the FAN-ary searches over N ids
    meet a window of FAN k + 1, whose step must round up (or the last id, the last segment's last row, is lost)."""
    ones = (1 - spanning_rows(case.device)) % FAN.value + FAN.value
    return {"lengths": fitted(case.route_id, (1,) * ones, case.device)}


ADVERSARIAL = (
    ("empty segments at both ends and inside", {"problem": lambda c: {"lengths": (0, 0) + c.problem.lengths + (0,)}},
     _expect_empty),
    (f"{_MANY} empty segments at the last row of a tile: that row finds its segment past the first "
     f"{triton_ops.BOUNDARY_WINDOW} CSR boundaries, all equal to it",
     _lengths((_ONE_BLOCK_MAX - 1,) + (0,) * _MANY + (1,)), "reference"),
    ("every segment empty (N = 0)", {"problem": {"lengths": (0, 0, 0)}}, _expect_empty, {"routes": _NO_ROWS_ROUTES}),
    ("no segments (S = 0, N = 0)", {"problem": {"lengths": ()}}, _expect_empty, {"routes": _NO_ROWS_ROUTES}),
    ("no columns (D = 0)", {"problem": {"trailing": (0,)}}),
    ("+inf and -inf rows", {"x": _infinities}, None, {"allow_inf": ("value",)}),
    (f"segments of one row less than, exactly, one row more than {_ONE_BLOCK_MAX} (short) rows, of one and two "
     f"chunks, an empty one, one over five chunks, ties (integer data) and D = 3",
     {"problem": lambda c: {"lengths": fitted(c.route_id, _EDGES, c.device), "trailing": (3,)}}, "reference",
     {"routes": _SEVERAL_BLOCK_ROUTES}),
    (f"N = 1 (mod {FAN.value}) rows in the ids form: searches over a window of {FAN.value} k + 1 ids",
     {"problem": _rows_one_past_fan}, "reference", {"routes": ("segment.triton.*.train.ids",)}),
    ("ids without num_segments (S read from ids[-1])", lambda c: c.without("no num_segments", "num_segments"),
     "reference", {"routes": ("segment.triton.*.infer.one_block", "segment.triton.*.train.ids")}),
    ("the call at the epochs' wrap, after 2**31 - 1 others (long segments: their flags)",
     lambda c: dataclasses.replace(c, entry=across_the_epochs_wrap.__name__), "reference",
     {"routes": ("segment.triton.*.infer.blocked", "segment.triton.*.train.*")}))


# ---------------------------------------------------------------------------------------------- bad inputs


def _stray_in_long_segment_1(case: Any) -> Any:
    """The ids form of ``case`` with its first long segment (more rows than a short one) numbered 1 (its length and
    segment 1's swapped) and num_segments as the id of that segment's second row: a workspace slot holding no
    chunk of this call is tagged -1, which must not pass for segment 1's tag (nor for any segment's)."""
    lengths, short = list(case.problem.lengths), triton_ops.short_rows(case.device)
    long = next((s for s, n in enumerate(lengths) if n > short), None)
    if long is None or len(lengths) < 2:
        raise ValueError(f"the bad input needs two segments, one of more than {short} rows: {lengths}")
    lengths[1], lengths[long] = lengths[long], lengths[1]
    second = lengths[0] + 1

    case = _in_form(case, "ids")
    ids = oracle.csr_index(lengths, "ids")["ids"].to(case.device, case.kwargs["ids"].dtype)
    return case.with_kwargs(case.description, ids=ids.index_fill(0, torch.tensor([second], device=case.device),
                                                                 len(lengths)))


def nan_where_the_ids_misplace(case: Any, outputs: dict) -> None:
    """In device mode the Triton routes' outputs are NaN for bad ids exactly where ``oracle.nan_for_misplaced_ids``
    says (segments' values, rows' gradients)."""
    kw = case.kwargs
    if not case.route_id.startswith("segment.triton.") or kw.get("ids") is None:
        return
    S = kw["num_segments"] if "num_segments" in kw else kw["grad_output"].shape[0]
    for name, want in zip(("value", "grad_x"), oracle.nan_for_misplaced_ids(kw["ids"].tolist(), S, FAN.value)):
        if name in outputs:
            got = torch.isnan(outputs[name].reshape(len(want), -1).cpu())
            assert got.any(1).tolist() == got.all(1).tolist() == want, (
                f"{name}: NaN at {torch.nonzero(got.any(1)).flatten().tolist()}, the ids' misplacement gives "
                f"{[k for k, bad in enumerate(want) if bad]}")


_BACKWARD, _IDS = "segment.*_backward", lambda c: _in_form(c, "ids")
STANDARD_BAD_INPUTS = (dict(tensors=("x",), flags=("use_triton",),
                            csr=dict(in_form=_in_form, ids_device_mode=nan_where_the_ids_misplace,
                                     segments=lambda c: len(c.problem.lengths), tile_rows=triton_ops.short_rows)),
                       dict(choices={"reduce": "prod"}, routes=_REDUCE_ROUTES),
                       dict(tensors=("grad_output",), shapes={"grad_output": (-1,)}, routes=_BACKWARD))
BAD_INPUTS = (
    ("empty", "a string", "zero", _REDUCE_ROUTES),
    ("empty", "below float32's range", 1e-300, _REDUCE_ROUTES),
    ("offsets", "both index forms", lambda c: _unindexed(c, "both index forms", "offsets", "ids")),
    ("offsets", "neither index form", lambda c: _unindexed(c, "no index")),
    ("ids", "num_segments inside a long segment 1", _stray_in_long_segment_1, _SEVERAL_BLOCK_ROUTES,
     nan_where_the_ids_misplace),
    ("num_segments", "a float", lambda c: _IDS(c).with_kwargs(c.description, num_segments=2.5), _REDUCE_ROUTES),
    ("num_segments", "a bool", lambda c: _IDS(c).with_kwargs(c.description, num_segments=True), _REDUCE_ROUTES),
    ("num_segments", "negative", lambda c: _IDS(c).with_kwargs(c.description, num_segments=-1), _REDUCE_ROUTES),
    ("num_segments", "not offsets.numel() - 1",
     lambda c: _in_form(c, "offsets").with_kwargs(c.description, num_segments=99), _REDUCE_ROUTES))


# ------------------------------------------------------------------------------------------- documentation

INVARIANTS = {"tests/test_segment.py": (
    "test_triton_matches_oracle", "test_dtypes_match_oracle", "test_adjoint_bitwise_equals_autograd",
    "test_ties_go_to_first_occurrence", "test_nan_inf_and_empty_segments",
    "test_trailing_dims_strided_x_and_repeatability", "test_custom_ops_pass_opcheck",
    "test_peer_defect_torch_segment_reduce_tie_gradient")}

_GRADIENT_ROUTES = ("segment.*.train.*", "segment.*_backward")
FAILURE_MODES = {  # symptom: the trace section to read first, a second page, what covers it[, routes]
    "NaN in the loss": ("segment/reduce-triton.md#numerical-guards", "guide/segment.md#conventions",
                        "guards check (NaN/inf input, empty segments); written check (poisoned allocations)"),
    "NaN in the backward": ("segment/reduce-triton.md#numerical-guards", "segment/adjoint-triton.md#routes",
                            "guards check on the training routes and the adjoints", _GRADIENT_ROUTES),
    "wrong gradients": ("segment/adjoint-triton.md#routes", "guide/segment.md#ties-compared-with-torchsegment_reduce",
                        "reference check (first occurrence of a tie gets the gradient); adjoints bitwise vs autograd",
                        _GRADIENT_ROUTES),
    "out of memory": ("segment/reduce-triton.md#dispatch-conditions", "guide/segment.md#backends",
                      "one (S, D) output and per-chunk partials (N / short rows); no (N, S) intermediate"),
    "backend mismatch": ("segment/reduce-triton.md#verification", "segment/reduce-torch.md#routes",
                         "reference check: both backends against the same float64 oracle"),
}

GUARDS = (
    ("Arguments are validated before dispatch: wrong type, rank, dtype or device; both or neither index form; "
     "offsets not from 0 to N or decreasing; ids unsorted or out of range raise ValueError / TypeError naming the "
     "argument (value checks in host mode; on CUDA no host read: the Triton kernels check the index themselves and "
     "write NaN for the segments it spoils).", make_call),
    ("Empty segments are short segments without rows, written with `empty` by the chunk kernel (mean never divides "
     "by zero), and receive no gradient: no row belongs to them.", segment_chunk_kernel.fn),
    ("Long segments are cut into chunks from their first row; the last chunk's program combines the partials in "
     "chunk order once the others have published theirs (max / min: ties to the lowest row): no atomic arithmetic "
     "on data, bitwise repeatable, the same bits alone or in any batch.",
     segment_chunk_kernel.fn),
    ("The PyTorch backend's max / min gathers x at the first-occurrence arg, so autograd's gradient goes to exactly "
     "one row per (segment, column).", torch_ops.first_arg),
)

PUBLISHES = (
    ("segment_chunk_kernel", "ws_ptr", "flags_ptr",
     "a long segment's last chunk reads the partials (and tags) of its earlier chunks only after acquiring their "
     "flags (_wait_published), which each chunk's program released after writing its partial (_publish)"),
)

KNOWN_ISSUES = (
    "Peer issue (torch.segment_reduce): its max / min backward splits a tied gradient among the tied rows only when "
    "the upstream gradient is positive; with a negative upstream gradient every tied row receives the full gradient "
    "(the gradients sum to a multiple of the upstream). This family gives the whole gradient to the first "
    "occurrence for either sign (test_peer_defect_torch_segment_reduce_tie_gradient).",
    "Peer issue (torch.segment_reduce): one thread per (segment, column), so one long segment runs serially "
    "(thousands of times off the copy floor at 16M rows); this family cuts long segments into chunks.",
    "The ids form without num_segments reads S = ids[-1] + 1 from the device: a host sync per call (and an error "
    "under torch.compile or graph capture); with offsets, or ids and num_segments, CUDA calls need none.",
    "The Triton kernels index rows and segments with int32: N or S of 2**31 or more runs the PyTorch backend.",
)
