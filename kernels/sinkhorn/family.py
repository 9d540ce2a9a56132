"""Registration of the Sinkhorn family for verification (data and plain functions; sentinel reads it, see
``kernel_sentinel.registration``): cases per route through the entry point users call (``sinkhorn``, the
``SinkhornKnopp`` or the ``FusedMHC`` module), the float64 loop as reference, the float64 scaling-form derivation
as oracle, tolerances per dtype, properties, guards and bad inputs.

Outputs of a route, by name: ``out`` (the matrices, shaped like ``x``), ``residual`` (each matrix's convergence
residual, shaped like ``x``'s leading dims: the cases with ``return_residual=True``) and, for training routes,
``grad_x`` (weights ``Case.upstream["out"]``, shaped like ``out``).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from provable_kernels.sinkhorn import torch_ops, triton_ops, triton_sinkhorn
from provable_kernels.sinkhorn.call import make_call
from provable_kernels.sinkhorn.dispatch import TREE, FusedMHC, SinkhornKnopp, sinkhorn
from provable_kernels.sinkhorn.oracle import residual_oracle, sinkhorn_oracle, sinkhorn_scaling_oracle


def sinkhorn_knopp(x: torch.Tensor, iters: int, domain: str, eps: float, return_residual: bool = False):
    """What a user of the module runs: ``SinkhornKnopp(iters, domain, eps, return_residual)(x)``."""
    return SinkhornKnopp(iters, domain, eps, return_residual)(x)


def fused_mhc(x: torch.Tensor, mhc_iters: int) -> torch.Tensor:
    """What a user of the triton-sinkhorn drop-in runs: ``FusedMHC(mhc_iters)(x)``."""
    return FusedMHC(mhc_iters)(x)


ENTRY_POINTS = {"sinkhorn": sinkhorn, "SinkhornKnopp": sinkhorn_knopp, "FusedMHC": fused_mhc}
# Which entry point each route's cases call: the modules dispatch through the same tree, so some routes are
# verified through them (the torch routes need use_triton=False, which only the function takes).
_ENTRY_OF = {"sinkhorn.triton.log.train": "FusedMHC", "sinkhorn.triton.prob.infer": "SinkhornKnopp",
            "sinkhorn.torch.large": "SinkhornKnopp"}
_ALL = "sinkhorn.*"
_FUNCTION_ROUTES = tuple(r.id for r in TREE.routes() if r.id not in _ENTRY_OF)
_WITH_DOMAIN = tuple(r.id for r in TREE.routes() if _ENTRY_OF.get(r.id) != "FusedMHC")
_MHC_ROUTES = tuple(r for r, e in _ENTRY_OF.items() if e == "FusedMHC")
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-10, 1e-10), torch.bfloat16: (1.6e-2, 1.6e-2),
              torch.float16: (2e-3, 2e-3)}
_EPS = 1e-3  # large enough that the probability domain's eps terms show in every comparison
_LARGE = triton_ops.MAX_N + 1  # the large route needs n > MAX_N

# A problem: leading dims, n, iterations; logits ~ N(0, 1), or on a grid of 1/8 in [-4, 4] (``grid``: exact in
# every dtype, also after adding an integer row shift). small: 12 matrices of n = 5 (padded to 8; the interpreter
# packs them into one program of 16, so a partial block and masked lanes run), with the residuals
# (``return_residual=True`` where the entry point takes it); tiny: 2 matrices of n = 3.
SIZES = {"small": dict(lead=(3, 4), n=5, iters=3, residual=True), "tiny": dict(lead=(2,), n=3, iters=2)}


def fit(route_id: str, p: Any, device: torch.device) -> dict:
    """The large route's problems: one matrix of n = _LARGE."""
    return dict(p, lead=(1,), n=_LARGE) if route_id == "sinkhorn.torch.large" else p


def case(route_id: str, p: Any, gen: torch.Generator, device: torch.device) -> tuple:
    """The entry point follows :data:`_ENTRY_OF`; training routes (and the large route) weigh ``out``."""
    path = TREE.path_to(route_id)
    size = (*p.lead, p.n, p.n)
    x = (torch.randint(-32, 33, size, generator=gen).double() / 8 if p.get("grid") else
         torch.randn(size, generator=gen, dtype=torch.float64))
    entry = _ENTRY_OF.get(route_id, "sinkhorn")
    kwargs: dict[str, Any] = {"x": x, "mhc_iters": p.iters} if entry == "FusedMHC" else {
        "x": x, "iters": p.iters, "domain": path.get("domain", "log"), "eps": _EPS}
    if entry == "sinkhorn":
        kwargs["use_triton"] = path["backend"] == "triton"
    if p.get("residual") and entry != "FusedMHC":
        kwargs["return_residual"] = True
    train = path.get("grad", "train") == "train"
    return entry, kwargs, {"out": torch.randn(size, generator=gen, dtype=torch.float64)} if train else {}


def outputs(result: Any, case: Any) -> dict:
    """``out``, and ``residual`` when the case asked for it (the route returned a pair)."""
    return {"out": result[0], "residual": result[1]} if case.kwargs.get("return_residual") else {"out": result}


def _settings(kw: dict) -> tuple[int, str, float]:
    return (kw["mhc_iters"], "log", 0.0) if "mhc_iters" in kw else (kw["iters"], kw["domain"], kw["eps"])


def _with_residual(out: torch.Tensor, kw: dict) -> dict:
    return {"out": out, "residual": residual_oracle(out)} if kw.get("return_residual") else {"out": out}


def reference(kw: dict, case: Any) -> dict:
    """The plain float64 loop of the convention (``oracle.sinkhorn_oracle``), and its residuals
    (``oracle.residual_oracle``) when asked for."""
    return _with_residual(sinkhorn_oracle(kw["x"], *_settings(kw)), kw)


def scaling_form(kw: dict, case: Any) -> dict:
    """The matrix-scaling derivation (``P = diag(r) K diag(c)``, divisions only) in float64: the reformulation the
    Triton kernels compute, checked against the same outputs."""
    return _with_residual(sinkhorn_scaling_oracle(kw["x"], *_settings(kw)), kw)


ORACLES = (("scaling form (float64)", "small", scaling_form),)
BATCH_ITEMS = (("a matrix", _ALL, {**dict.fromkeys(("x", "out", "grad_x"), (0, -3)), "residual": (0, -1)}),)


# ---------------------------------------------------------------------------------------------- properties


def example(pick: Any) -> dict:
    """Leading dims ((), (1,), (3,) or (2, 1)), n in 1..6, iters in 1..3, logits on the grid, with or without the
    residuals."""
    return dict(lead=pick([(), (1,), (3,), (2, 1)]), n=pick(range(1, 7)), iters=pick(range(1, 4)), grid=True,
                residual=pick([False, True]))


def _out(check: Any, case: Any) -> torch.Tensor:
    return check.forward(case)["out"].detach().double().cpu()


def row_shift(check: Any, case: Any) -> None:
    """Adding a constant (an integer in -8..8) to every entry of a row leaves the output unchanged."""
    x = case.kwargs["x"]
    shift = torch.randint(-8, 9, (*x.shape[:-1], 1), generator=torch.Generator().manual_seed(case.problem.seed + 1))
    check.close("output after a row shift", _out(check, case.transformed("rows shifted", x=lambda v: v + shift)),
                _out(check, case))


def permutation(check: Any, case: Any) -> None:
    """Permuting the rows and the columns of x permutes the output the same way."""
    gen = torch.Generator().manual_seed(case.problem.seed + 2)
    rows, cols = torch.randperm(case.problem.n, generator=gen), torch.randperm(case.problem.n, generator=gen)
    moved = case.transformed("rows and columns permuted", x=lambda v: v[..., rows, :][..., cols])
    check.close("output of permuted x", _out(check, moved), _out(check, case)[..., rows, :][..., cols])


def column_sums(check: Any, case: Any) -> None:
    """After the last column step, column sums are 1 (log); in the probability domain each is s / (s + eps) <= 1
    for the column total s before the step, checked against 1 - eps / (eps + e^-8) <= sum <= 1 (e^-8 is the
    smallest softmax ratio that logits in [-4, 4] allow)."""
    sums = _out(check, case).sum(-2)
    slack = (check.tolerance.atol + check.tolerance.rtol) * case.problem.n
    if case.kwargs.get("domain", "log") == "log":
        check.close("column sums (log domain)", sums, torch.ones_like(sums), (slack, 0.0))
        return
    low = 1 - _EPS / (_EPS + math.exp(-8.0))
    check.expect(bool(((sums <= 1 + slack) & (sums >= low - slack)).all()),
                 f"column sums {sums.flatten().tolist()} outside [{low}, 1] (eps bound)")


def residual_of_output(check: Any, case: Any) -> None:
    """With ``return_residual=True`` the residual is the largest ``|line sum - 1|`` of the output returned, within
    the dtype's tolerance per entry of a line (the output is rounded to ``x``'s dtype after the residual is
    taken), and the output is the one returned without it."""
    got = check.forward(case.with_kwargs(f"{case.description}; return_residual=True", return_residual=True))
    out = got["out"].detach().double().cpu()
    slack = (check.tolerance.atol + check.tolerance.rtol) * case.problem.n
    check.close("residual against the output's line sums", got["residual"].double().cpu(), residual_oracle(out),
                (slack, 0.0))
    plain = _out(check, case.with_kwargs(case.description, return_residual=False))
    check.expect(torch.equal(out, plain), "the output with return_residual=True differs from the one without it")


PROPERTIES = (
    ("adding a constant to a row leaves the output unchanged", _ALL, row_shift),
    ("permuting rows and columns permutes the output", _ALL, permutation),
    ("column sums after the last column step: 1 (log), within the eps bound (prob)", _ALL, column_sums),
    ("the residual is the largest line-sum deviation of the output", _WITH_DOMAIN, residual_of_output),
)
FINITE_DIFFERENCES = ("sinkhorn.*.train", "sinkhorn.torch.large")


# ------------------------------------------------------------------------------------------- guards, bad input


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


def _first_matrix_huge(x: torch.Tensor) -> torch.Tensor:
    matrices = x.reshape(-1, *x.shape[-2:])
    return torch.cat([matrices[:1] * 1e4, matrices[1:]]).reshape(x.shape)


_ROW, _COLUMN = (lambda i: (..., i, slice(None))), (lambda j: (..., slice(None), j))
_SMALL_N = tuple(r for r in _WITH_DOMAIN + _MHC_ROUTES if r != "sinkhorn.torch.large")
_REF = "reference"  # guard inputs are compared with the float64 loop too, not only checked for finiteness
ADVERSARIAL = (
    ("-inf entries", {"x": _set((..., 0, 1), -math.inf)}, _REF),
    ("an all -inf row", {"x": _set(_ROW(1), -math.inf)}, _REF),
    ("an all -inf column", {"x": _set(_COLUMN(2), -math.inf)}, _REF),
    ("every entry -inf", {"x": lambda x: x.fill_(-math.inf)}, _REF),
    ("logits of +-1e4", {"x": lambda x: x * 1e4}, _REF),
    ("logits of +-1e4 with -inf entries", {"x": lambda x: _set((..., 0, 0), -math.inf)(x * 1e4)}, _REF),
    ("column 0 at -400 (rows span past the scaling-form limit: the log loop), 3 iterations",
     {"problem": {"iters": 3}, "x": _set(_COLUMN(0), -400.0)}, _REF),
    ("matrix 0 with logits of +-1e4, the others unchanged (one block, one loop choice for all)",
     {"x": _first_matrix_huge}, _REF),
    ("every logit + 1e3 (rows far from 0: exp overflows unless each row is shifted by its max)",
     {"x": lambda x: x + 1e3}, _REF),
    ("rows spanning just under the scaling-form limit (30)", {"x": lambda x: torch.where(x > 0, 0.0, -29.9)}, _REF),
    ("rows whose largest logit is at or near the clamp, the others below it", {"x": _near_clamp}, _REF),
    ("n = 1", {"problem": {"n": 1}}, _REF, {"routes": _SMALL_N}),
    ("iters = 1", {"problem": {"iters": 1}}, _REF),
    ("iters = 10 (the backward replays from several kept scalings)", {"problem": {"iters": 10}}, _REF),
    ("no leading dims", {"problem": {"lead": ()}}, _REF),
    ("B = 0", {"problem": {"lead": (0,)}}),
    ("eps = 0 with an all -inf column", {"x": _set(_COLUMN(0), -math.inf), "eps": lambda eps: 0.0}, _REF,
     {"routes": tuple(r for r in _WITH_DOMAIN if ".prob." in r)}),
    ("NaN input", {"x": _set((..., 0, 0), math.nan)}, None, {"errors_ok": True}))

STANDARD_BAD_INPUTS = (dict(tensors=("x",), rejects_nan=("x",), rejects_inf=("x",), shapes={"x": (-1,)}),
                       dict(counts={"iters": 1}, choices={"domain": "exp"}, routes=_WITH_DOMAIN),
                       dict(counts={"mhc_iters": 1}, routes=_MHC_ROUTES),
                       dict(flags=("use_triton",), routes=_FUNCTION_ROUTES))
BAD_INPUTS = (
    ("x", "1-D", lambda c: c.kwargs["x"].reshape(-1)),
    ("x", "int32", lambda c: c.kwargs["x"].to(torch.int32)),
    ("x", "n = 0", lambda c: c.kwargs["x"][..., :0, :0]),
    ("eps", "-1e-3", -1e-3, _WITH_DOMAIN),
    ("eps", "a string", "0.001", _WITH_DOMAIN),
    ("eps", "NaN", math.nan, _WITH_DOMAIN),
    ("eps", "1e-300 (below float32's normal range)", 1e-300, _WITH_DOMAIN))

# ------------------------------------------------------------------------------------------- documentation

INVARIANTS = {"tests/test_sinkhorn.py": (
    "test_triton_matches_oracle", "test_packing_several_matrices_per_program_and_a_partial_block",
    "test_guards_neg_inf_huge_logits_and_all_neg_inf_rows", "test_all_neg_inf_rows_are_defined",
    "test_scaling_form_stays_exact_at_the_span_threshold", "test_infer_routes_and_bitwise_determinism",
    "test_opcheck_custom_ops", "test_bad_inputs", "test_guide_lane_mixing_example_runs")}

_TRAIN = ("sinkhorn.*.train",)
FAILURE_MODES = {  # symptom: the trace section to read first, a second page, what covers it[, routes]
    "NaN in the loss": ("sinkhorn/triton-fits.md#numerical-guards", "guide/sinkhorn.md#-inf-entries-and-all-inf-rows",
                        "guards check (-inf entries, all -inf rows, huge logits); written check (poisoned "
                        "allocations)"),
    "NaN in the backward": ("sinkhorn/triton-fits.md#numerical-guards", "guide/sinkhorn.md#conventions",
                            "guards check on the training routes", _TRAIN),
    "wrong gradients": ("sinkhorn/triton-fits.md#routes", "guide/sinkhorn.md#conventions",
                        "reference check (gradients vs the float64 oracle); finite-difference property", _TRAIN),
    "out of memory": ("sinkhorn/triton-too_large.md#routes", "guide/sinkhorn.md#routes",
                      "matrices too large for one block take the PyTorch route (dispatch condition)"),
    "backend mismatch": ("sinkhorn/triton-fits.md#verification", "sinkhorn/torch-log.md#routes",
                         "reference check: both backends against the same float64 oracle"),
}

GUARDS = (
    ("Arguments are validated before dispatch: dtype, rank, square, iters >= 1 (int), domain, eps >= 0; NaN/+inf in "
     "x raise ValueError naming x (one host sync).", make_call),
    ("Entries below -1e5 are held in flagged form (-1e5 + an order-one value), so a column that is -inf everywhere "
     "keeps full float32 precision; an all-flagged line cancels the -1e5 exactly, and a line whose flagged entries "
     "lie within 50 of its largest entry merges them (they carry weight).", triton_sinkhorn._norm.fn),
    ("The scaling form runs only when every row of a block spans <= RMAX (30 in float32): exp never underflows and "
     "the scalings never overflow; other blocks run the log loop on chip.", triton_sinkhorn._log_prepare.fn),
    ("A zero denominator (padding, or eps = 0 with an all-zero column) divides by 1, never NaN.",
     triton_sinkhorn._safe.fn),
    ("The PyTorch loop uses the same flagged form for clamped entries.", torch_ops._norm),
)

KNOWN_ISSUES = (
    ("Log domain: a row whose largest logit lay within ~100 of the -1e5 clamp, next to entries below it, came out "
     "wrong on both backends (flagged entries weighed zero): [-1e5, -2e5, -2e5] gave [1, 0, 0] instead of the "
     "uniform row.", "high (wrong values)", "rare: logits near -1e5 next to smaller ones",
     "a line merges its flagged entries when they lie within GAP = 50 of its largest entry; the adversarial case "
     "'rows whose largest logit is at or near the clamp' checks it", "f320be8"),
    ("The backward keeps the scalings of every ceil(iters / 8)-th step (n <= 4; ceil(sqrt(iters))-th at larger n) "
     "in registers and replays the others (about 4 to 5 forwards of instructions in all); matrices that take the log loop (rows "
     "spanning > 30, -inf entries) replay every step from x: iters^2 / 2 steps, and their program runs the scaling "
     "form too.", "low (speed)", "matrices with -inf entries or rows spanning more than 30",
     "by design (no per-iteration memory)"),
)
