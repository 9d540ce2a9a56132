"""Registration of the Sinkhorn family with sentinel: cases per route (through the entry point users call:
``sinkhorn``, the ``SinkhornKnopp`` module or the ``FusedMHC`` module), the float64 loop as reference, the
float64 scaling-form derivation as oracle, tolerances per dtype, properties, guards and bad inputs. Only
:mod:`kernel_sentinel.registry` imports this module.

Outputs of a route, by name: ``out`` (the matrices, shaped like ``x``) and, for training routes, ``grad_x``
(weights ``Case.upstream["out"]``, shaped like ``out``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

import provable_kernels.sinkhorn as package
from provable_kernels.sinkhorn import torch_ops, triton_ops, triton_sinkhorn
from provable_kernels.sinkhorn.call import make_call
from provable_kernels.sinkhorn.dispatch import TREE, FusedMHC, SinkhornKnopp, sinkhorn
from provable_kernels.sinkhorn.oracle import sinkhorn_oracle, sinkhorn_scaling_oracle
from kernel_sentinel import cases
from kernel_sentinel.checks import expect, expect_close, run_route
from kernel_sentinel.family import Adversarial, BadInput, Case, Family, Guard, Invariant, Oracle, Outputs, Property
from kernel_sentinel.family import FailureMode, KnownIssue, Tolerance


def sinkhorn_knopp(x: torch.Tensor, iters: int, domain: str, eps: float) -> torch.Tensor:
    """What a user of the module runs: ``SinkhornKnopp(iters, domain, eps)(x)``."""
    return SinkhornKnopp(iters, domain, eps)(x)


def fused_mhc(x: torch.Tensor, mhc_iters: int) -> torch.Tensor:
    """What a user of the triton-sinkhorn drop-in runs: ``FusedMHC(mhc_iters)(x)``."""
    return FusedMHC(mhc_iters)(x)


ENTRIES = {"sinkhorn": sinkhorn, "SinkhornKnopp": sinkhorn_knopp, "FusedMHC": fused_mhc}
# Which entry point each route's cases call: the modules dispatch through the same tree, so some routes are
# verified through them (the torch routes need use_triton=False, which only the function takes).
ENTRY_OF = {"sinkhorn.triton.log.train": "FusedMHC", "sinkhorn.triton.prob.infer": "SinkhornKnopp",
            "sinkhorn.torch.large": "SinkhornKnopp"}
FUNCTION_ROUTES = tuple(r.id for r in TREE.routes() if r.id not in ENTRY_OF)
WITH_DOMAIN = tuple(r.id for r in TREE.routes() if ENTRY_OF.get(r.id) != "FusedMHC")
MHC_ROUTES = tuple(r for r, e in ENTRY_OF.items() if e == "FusedMHC")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
TOLERANCES = {torch.float32: Tolerance(atol=2e-5, rtol=2e-5), torch.float64: Tolerance(atol=1e-10, rtol=1e-10),
              torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2), torch.float16: Tolerance(atol=2e-3, rtol=2e-3)}
EPS = 1e-3  # large enough that the probability domain's eps terms show in every comparison


@dataclass(frozen=True)
class Shape:
    """The problem of a case: leading dims, n, iterations, the seed of its logits ~ N(0, scale^2)."""

    lead: tuple[int, ...]
    n: int
    iters: int
    seed: int = 0
    scale: float = 1.0


# small: 12 matrices of n = 5 (padded to 8; the interpreter packs them into one program of 16, so a partial
# block and masked lanes run); tiny: 2 matrices of n = 3. The large route needs n > triton_ops.MAX_N.
SIZES = {"small": Shape((3, 4), 5, 3), "tiny": Shape((2,), 3, 2)}
LARGE = triton_ops.MAX_N + 1


def _shape_for(route_id: str, shape: Shape) -> Shape:
    if route_id == "sinkhorn.torch.large":
        return Shape((1,), LARGE, shape.iters, shape.seed, shape.scale)
    return shape


def make_case_for(route_id: str, shape: Shape, dtype: torch.dtype, device: torch.device,
                  values: torch.Tensor | None = None) -> Case:
    """A case of ``shape`` that the tree routes to ``route_id`` (``values``, float64, replace the random logits);
    the entry point follows :data:`ENTRY_OF`, ``x`` requires grad on training routes (and the large route)."""
    shape = _shape_for(route_id, shape)
    path = TREE.path_to(route_id)
    gen = torch.Generator().manual_seed(shape.seed)
    size = (*shape.lead, shape.n, shape.n)
    if values is None:
        values = shape.scale * torch.randn(size, generator=gen, dtype=torch.float64)
    train = path.get("grad", "train") == "train"
    x = values.to(device, dtype).requires_grad_(train)
    entry = ENTRY_OF.get(route_id, "sinkhorn")
    domain = path.get("domain", "log")
    if entry == "FusedMHC":
        kwargs: dict[str, Any] = {"x": x, "mhc_iters": shape.iters}
    else:
        kwargs = {"x": x, "iters": shape.iters, "domain": domain, "eps": EPS}
        if entry == "sinkhorn":
            kwargs["use_triton"] = path["backend"] == "triton"
    upstream = {"out": torch.randn(size, generator=gen, dtype=torch.float64).to(device, dtype)} if train else {}
    description = f"{entry} x{tuple(size)} iters={shape.iters} {str(dtype).replace('torch.', '')} on {device}"
    return Case(route_id, entry, kwargs, description, upstream, {"shape": shape})


def _matrices(case: Case) -> Case:
    """``case`` with ``x`` and its upstream weights as (B, n, n): the leading dims flattened."""
    flat = lambda x: x.reshape(-1, *x.shape[-2:])  # noqa: E731
    x = case.kwargs["x"]
    return dataclasses.replace(case, kwargs={**case.kwargs, "x": flat(x.detach()).requires_grad_(x.requires_grad)},
                               upstream={n: flat(w) for n, w in case.upstream.items()})


_ALONG = cases.batch_along("a matrix", ("sinkhorn.*",), {"x": 0, "out": 0, "grad_x": 0})
BATCH_ITEMS = (dataclasses.replace(_ALONG, split=lambda case: _ALONG.split(_matrices(case))),)


def make_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    s = SIZES[size]
    return make_case_for(route_id, Shape(s.lead, s.n, s.iters, seed), dtype, device)


def run(case: Case) -> Outputs:
    """Call the route's entry point with the case's arguments as they are; backward for training routes."""
    return cases.outputs_and_gradients({"out": ENTRIES[case.entry](**case.kwargs)}, case)


def forward_only(case: Case) -> Outputs:
    return {"out": ENTRIES[case.entry](**case.kwargs)}


def _settings(kw: dict[str, Any]) -> tuple[int, str, float]:
    if "mhc_iters" in kw:
        return kw["mhc_iters"], "log", 0.0
    return kw["iters"], kw["domain"], kw["eps"]


def _float64(case: Case, fn) -> Outputs:
    kw = cases.float64_leaves(case.kwargs)
    with torch.enable_grad():
        return cases.outputs_and_gradients({"out": fn(kw["x"], *_settings(kw))}, case, kw)


def reference(case: Case) -> Outputs:
    """The plain float64 loop of the convention (``oracle.sinkhorn_oracle``), gradients by autograd."""
    return _float64(case, sinkhorn_oracle)


def scaling_form(case: Case) -> Outputs:
    """The matrix-scaling derivation (``P = diag(r) K diag(c)``, divisions only) in float64, gradients by
    autograd: the reformulation the Triton kernels compute, checked against the same outputs."""
    return _float64(case, sinkhorn_scaling_oracle)


# ---------------------------------------------------------------------------------------------- properties


@st.composite
def examples(draw: Any) -> Shape:
    """Leading dims ((), (1,), (3,) or (2, 1)), n in 1..6, iters in 1..3, and a seed for the logits (on a grid of
    1/8 in [-4, 4]: exact in every dtype, also after adding an integer row shift), permutations and shifts."""
    lead = draw(st.sampled_from([(), (1,), (3,), (2, 1)]))
    n, iters, seed = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(0, 2**16))
    return Shape(lead, n, iters, seed)


def _grid_values(shape: Shape, route_id: str) -> tuple[Shape, torch.Tensor]:
    shape = _shape_for(route_id, shape)
    gen = torch.Generator().manual_seed(shape.seed)
    size = (*shape.lead, shape.n, shape.n)
    return shape, torch.randint(-32, 33, size, generator=gen).double() / 8


def _out(route_id: str, shape: Shape, values: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    case = make_case_for(route_id, shape, dtype, device, values)
    return run_route(forward_only, case)["out"].detach().double().cpu()


def prop_row_shift(route_id: str, example: Any, device: torch.device, dtype: torch.dtype) -> None:
    """Adding a constant (an integer in -8..8) to every entry of a row leaves the output unchanged."""
    shape, values = _grid_values(example, route_id)
    gen = torch.Generator().manual_seed(shape.seed + 1)
    shift = torch.randint(-8, 9, (*values.shape[:-1], 1), generator=gen).double()
    expect_close("output after a row shift", _out(route_id, shape, values + shift, dtype, device),
                 _out(route_id, shape, values, dtype, device), TOLERANCES[dtype])


def prop_permutation(route_id: str, example: Any, device: torch.device, dtype: torch.dtype) -> None:
    """Permuting the rows and the columns of x permutes the output the same way."""
    shape, values = _grid_values(example, route_id)
    gen = torch.Generator().manual_seed(shape.seed + 2)
    rows, cols = torch.randperm(shape.n, generator=gen), torch.randperm(shape.n, generator=gen)
    moved = _out(route_id, shape, values[..., rows, :][..., cols], dtype, device)
    expect_close("output of permuted x", moved, _out(route_id, shape, values, dtype, device)[..., rows, :][..., cols],
                 TOLERANCES[dtype])


def prop_column_sums(route_id: str, example: Any, device: torch.device, dtype: torch.dtype) -> None:
    """After the last column step, column sums are 1 (log); in the probability domain each is s / (s + eps) <= 1
    for the column total s before the step, checked against 1 - eps / (eps + e^-8) <= sum <= 1 (e^-8 is the
    smallest softmax ratio that logits in [-4, 4] allow)."""
    shape, values = _grid_values(example, route_id)
    sums = _out(route_id, shape, values, dtype, device).sum(-2)
    tol = TOLERANCES[dtype]
    slack = tol.atol * shape.n + tol.rtol * shape.n
    if TREE.path_to(route_id).get("domain", "log") == "log":
        expect_close("column sums (log domain)", sums, torch.ones_like(sums), Tolerance(slack, 0.0))
        return
    low = 1 - EPS / (EPS + math.exp(-8.0))
    expect(bool(((sums <= 1 + slack) & (sums >= low - slack)).all()),
           f"column sums {sums.flatten().tolist()} outside [{low}, 1] (eps bound)")


def _fd_case(route_id: str, example: Any, device: torch.device) -> Case:
    shape, values = _grid_values(example, route_id)
    return make_case_for(route_id, shape, torch.float64, device, values)


PROPERTIES = (
    Property("adding a constant to a row leaves the output unchanged", ("sinkhorn.*",), examples, prop_row_shift),
    Property("permuting rows and columns permutes the output", ("sinkhorn.*",), examples, prop_permutation),
    Property("column sums after the last column step: 1 (log), within the eps bound (prob)", ("sinkhorn.*",),
             examples, prop_column_sums),
    cases.finite_difference_property(("sinkhorn.*.train", "sinkhorn.torch.large"), examples, _fd_case, run,
                                     forward_only),
)


# ------------------------------------------------------------------------------------------- guards, bad input


# guard inputs are compared with the float64 loop too, not only checked for finiteness
_against_reference = cases.matches_reference(reference, lambda c: TOLERANCES[c.kwargs["x"].dtype], "float64 loop")


def _values(fn, what: str):
    return lambda c: cases.transform_argument(c, "x", fn, what)


def _set(index: Any, value: float):
    def put(x: torch.Tensor) -> torch.Tensor:
        x[index] = value
        return x

    return put


def _near_clamp(x: torch.Tensor) -> torch.Tensor:
    """Row 0 clamps to equal entries (a uniform row after the first row step); the last row's largest entry lies
    10 above the clamp, its others below it (their weight is exp(-10), not zero)."""
    x[..., 0, :], x[..., 0, 0] = -2e5, -1e5
    x[..., -1, :], x[..., -1, -1] = -3e5, -99990.0
    return x


def _rebuilt(case: Case, **changes: Any) -> Case:
    shape = case.extra["shape"]
    shape = Shape(**{**shape.__dict__, **changes})
    x = case.kwargs["x"]
    return make_case_for(case.route_id, shape, x.dtype, x.device)


ALL = ("sinkhorn.*",)
SMALL_N = tuple(r for r in WITH_DOMAIN + MHC_ROUTES if r != "sinkhorn.torch.large")
ADVERSARIAL = (
    Adversarial("-inf entries", ALL, _values(_set((..., 0, 1), -math.inf), "x[..., 0, 1] = -inf"),
                expect=_against_reference),
    Adversarial("an all -inf row", ALL, _values(_set((..., 1, slice(None)), -math.inf), "row 1 all -inf"),
                expect=_against_reference),
    Adversarial("an all -inf column", ALL, _values(_set((..., slice(None), 2), -math.inf), "column 2 all -inf"),
                expect=_against_reference),
    Adversarial("every entry -inf", ALL, _values(lambda x: x.fill_(-math.inf), "all -inf"),
                expect=_against_reference),
    Adversarial("logits of +-1e4", ALL, _values(lambda x: x * 1e4, "* 1e4"), expect=_against_reference),
    Adversarial("logits of +-1e4 with -inf entries", ALL,
                _values(lambda x: _set((..., 0, 0), -math.inf)(x * 1e4), "* 1e4, x[..., 0, 0] = -inf"),
                expect=_against_reference),
    Adversarial("column 0 at -400 (rows span past the scaling-form limit: the log loop), 3 iterations", ALL,
                lambda c: _values(_set((..., slice(None), 0), -400.0), "column 0 = -400")(_rebuilt(c, iters=3)),
                expect=_against_reference),
    Adversarial("matrix 0 with logits of +-1e4, the others unchanged (one block, one loop choice for all)", ALL,
                _values(lambda x: torch.cat([x.reshape(-1, *x.shape[-2:])[:1] * 1e4,
                                             x.reshape(-1, *x.shape[-2:])[1:]]).reshape(x.shape), "matrix 0 * 1e4"),
                expect=_against_reference),
    Adversarial("every logit + 1e3 (rows far from 0: exp overflows unless each row is shifted by its max)", ALL,
                _values(lambda x: x + 1e3, "+ 1e3"), expect=_against_reference),
    Adversarial("rows spanning just under the scaling-form limit (30)", ALL,
                _values(lambda x: torch.where(x > 0, 0.0, -29.9), "entries 0 or -29.9"),
                expect=_against_reference),
    Adversarial("rows whose largest logit is at or near the clamp, the others below it", ALL,
                _values(_near_clamp, "row 0 = [-1e5, -2e5, ...], last row = [..., -3e5, -99990]"),
                expect=_against_reference),
    Adversarial("n = 1", SMALL_N, lambda c: _rebuilt(c, n=1), expect=_against_reference),
    Adversarial("iters = 1", ALL, lambda c: _rebuilt(c, iters=1), expect=_against_reference),
    Adversarial("iters = 10 (the backward replays from several kept scalings)", ALL,
                lambda c: _rebuilt(c, iters=10), expect=_against_reference),
    Adversarial("no leading dims", ALL, lambda c: _rebuilt(c, lead=()), expect=_against_reference),
    Adversarial("B = 0", ALL, lambda c: _rebuilt(c, lead=(0,))),
    Adversarial("eps = 0 with an all -inf column", tuple(r for r in WITH_DOMAIN if ".prob." in r),
                lambda c: cases.replace_argument(_values(_set((..., slice(None), 0), -math.inf), "column 0 -inf")(c),
                                                 "eps", 0.0, "0"), expect=_against_reference),
    Adversarial("NaN input", ALL, _values(_set((..., 0, 0), math.nan), "a NaN"), errors_ok=True),
)


def _bad(argument: str, what: str, value: Any, routes: tuple[str, ...]) -> BadInput:
    return BadInput(argument, what, routes,
                    lambda c: cases.replace_argument(c, argument, value(c) if callable(value) else value, what))


def _x(c: Case) -> torch.Tensor:
    return c.kwargs["x"].detach()


BAD_INPUTS = cases.standard_bad_inputs(ALL, ("x",), rejects_nan=("x",), rejects_inf=("x",)) + (
    _bad("x", "non-square (n, n+1)", lambda c: torch.cat([_x(c), _x(c)[..., :1]], -1), ALL),
    _bad("x", "1-D", lambda c: _x(c).reshape(-1), ALL),
    _bad("x", "int32", lambda c: _x(c).to(torch.int32), ALL),
    _bad("x", "n = 0", lambda c: _x(c)[..., :0, :0], ALL),
    _bad("iters", "0", 0, WITH_DOMAIN),
    _bad("iters", "2.0", 2.0, WITH_DOMAIN),
    _bad("iters", "True", True, WITH_DOMAIN),
    _bad("mhc_iters", "0", 0, MHC_ROUTES),
    _bad("mhc_iters", "a float", 3.0, MHC_ROUTES),
    _bad("domain", "'exp'", "exp", WITH_DOMAIN),
    _bad("eps", "-1e-3", -1e-3, WITH_DOMAIN),
    _bad("eps", "a string", "0.001", WITH_DOMAIN),
    _bad("eps", "NaN", math.nan, WITH_DOMAIN),
    _bad("eps", "1e-300 (below float32's normal range)", 1e-300, WITH_DOMAIN),
    _bad("use_triton", "a string", "yes", FUNCTION_ROUTES),
)

TESTS = "tests/test_sinkhorn.py"
INVARIANTS = (
    Invariant("Every Triton route equals the float64 loop of the convention (outputs and gradients), n = 1..6 and "
              "64, leading dims of any rank.", f"{TESTS}::test_triton_matches_oracle"),
    Invariant("Several matrices per program, with a partial last block, give the same results.",
              f"{TESTS}::test_packing_several_matrices_per_program_and_a_partial_block"),
    Invariant("-inf entries, all -inf rows and columns and logits of +-1e4 give the float64 loop's results.",
              f"{TESTS}::test_guards_neg_inf_huge_logits_and_all_neg_inf_rows"),
    Invariant("An all -inf matrix gives the uniform matrix in both domains.",
              f"{TESTS}::test_all_neg_inf_rows_are_defined"),
    Invariant("The scaling form stays exact for rows spanning up to its limit, over 200 iterations.",
              f"{TESTS}::test_scaling_form_stays_exact_at_the_span_threshold"),
    Invariant("Outputs and gradients are bitwise identical on repeated runs.",
              f"{TESTS}::test_infer_routes_and_bitwise_determinism"),
    Invariant("The custom ops pass torch.library.opcheck and run under torch.compile(fullgraph=True).",
              f"{TESTS}::test_opcheck_custom_ops"),
    Invariant("Every wrong argument raises ValueError/TypeError naming it.", f"{TESTS}::test_bad_inputs"),
    Invariant("The guide's lane-mixing example runs.", f"{TESTS}::test_guide_lane_mixing_example_runs"),
)

FAILURE_MODES = (  # symptom -> the trace section to read first, a second page, what covers it
    FailureMode("NaN in the loss", "sinkhorn/triton-fits.md#numerical-guards",
                "guide/sinkhorn.md#-inf-entries-and-all-inf-rows",
                "guards check (-inf entries, all -inf rows, huge logits); written check (poisoned allocations)",
                checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned")),
    FailureMode("NaN in the backward", "sinkhorn/triton-fits.md#numerical-guards", "guide/sinkhorn.md#conventions",
                "guards check on the training routes", checks=("guards", "written"), signs=("has NaN", "has inf", "poisoned"), routes=("sinkhorn.*.train",)),
    FailureMode("wrong gradients", "sinkhorn/triton-fits.md#routes", "guide/sinkhorn.md#conventions",
                "reference check (gradients vs the float64 oracle); finite-difference property",
                checks=("reference", "exact", "properties", "guards"),
                signs=("grad", "derivative"), routes=("sinkhorn.*.train",)),
    FailureMode("out of memory", "sinkhorn/triton-too_large.md#routes", "guide/sinkhorn.md#routes",
                "matrices too large for one block take the PyTorch route (dispatch condition)"),
    FailureMode("backend mismatch", "sinkhorn/triton-fits.md#verification", "sinkhorn/torch-log.md#routes",
                "reference check: both backends against the same float64 oracle", checks=("reference", "exact")),
    FailureMode("wrong route taken", "sinkhorn/index.md#dispatch-conditions", "sinkhorn/index.md#decision-tree",
                "route check: the dispatcher records the route id it took", checks=("route",)),
)

FAMILY = Family(
    name="sinkhorn",
    package=package,
    tree=TREE,
    entry_points=ENTRIES,
    make_case=make_case,
    run=run,
    reference=reference,
    tolerances=TOLERANCES,
    dtypes=DTYPES,
    oracles=(Oracle("scaling form (float64)", "small", scaling_form),),
    properties=PROPERTIES,
    adversarial=ADVERSARIAL,
    bad_inputs=BAD_INPUTS,
    invariants=INVARIANTS,
    guards=(
        Guard("Arguments are validated before dispatch: dtype, rank, square, iters >= 1 (int), domain, eps >= 0; "
              "NaN/+inf in x raise ValueError naming x (one host sync).", make_call),
        Guard("Entries below -1e5 are held in flagged form (-1e5 + an order-one value), so a column that is -inf "
              "everywhere keeps full float32 precision; an all-flagged line cancels the -1e5 exactly, and a line "
              "whose flagged entries lie within 50 of its largest entry merges them (they carry weight).",
              triton_sinkhorn._norm.fn),
        Guard("The scaling form runs only when every row of a block spans <= RMAX (30 in float32): exp never "
              "underflows and the scalings never overflow; other blocks run the log loop on chip.",
              triton_sinkhorn._log_prepare.fn),
        Guard("A zero denominator (padding, or eps = 0 with an all-zero column) divides by 1, never NaN.",
              triton_sinkhorn._safe.fn),
        Guard("The PyTorch loop uses the same flagged form for clamped entries.", torch_ops._norm),
    ),
    failure_modes=FAILURE_MODES,
    batch_items=BATCH_ITEMS,
    known_issues=(
        KnownIssue("Log domain: a row whose largest logit lay within ~100 of the -1e5 clamp, next to entries below "
                   "it, came out wrong on both backends (flagged entries weighed zero): [-1e5, -2e5, -2e5] gave "
                   "[1, 0, 0] instead of the uniform row.", "high (wrong values)",
                   "rare: logits near -1e5 next to smaller ones",
                   "a line merges its flagged entries when they lie within GAP = 50 of its largest entry; the "
                   "adversarial case 'rows whose largest logit is at or near the clamp' checks it", "f320be8"),
        KnownIssue("The backward keeps the scalings of every ceil(iters / 8)-th step (n <= 4; ceil(sqrt(iters))-th "
                   "at larger n) in registers and replays the others (about 2 to 2.5 forwards in all); matrices "
                   "that take the log loop (rows spanning > 30, -inf entries) replay every step from x: iters^2 / 2 "
                   "steps, and their program runs the scaling form too.", "low (speed)",
                   "matrices with -inf entries or rows spanning more than 30", "by design (no per-iteration memory)"),
    ),
)
