"""Shared test setup.

Without a GPU the Triton kernels run on CPU tensors under the Triton interpreter, which must be switched on before
any kernel module is imported (``@triton.jit`` decides at decoration time); on a GPU machine it stays off.

``toy_family`` builds a two-route toy family for testing sentinel itself: ``toy_sum(x, fast)`` sums the rows of
``x``; route ``toy.slow`` is right, route ``toy.fast`` carries a planted bug (it adds ``1e-3 * x[:, 0]``).

``SemiCRFCase`` / ``semicrf_case`` (import them with ``from conftest import ...``): one semi-CRF problem for the
tests of the streaming routes, with calls to the routes and to the independent references.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    from kernel_sentinel import interpreter  # noqa: E402

    interpreter.install()  # as sentinel verify does (kernel_sentinel.device.prepare)

import dataclasses  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import pytest  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import provable_kernels  # noqa: E402
from provable_kernels import validate  # noqa: E402
from provable_kernels.dispatch import Branch, Condition, Route, Tree  # noqa: E402
from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward, semi_crf_viterbi  # noqa: E402
from provable_kernels.semicrf import oracle  # noqa: E402
from kernel_sentinel.cases import batch_along  # noqa: E402
from kernel_sentinel.checks import expect_close, run_route  # noqa: E402
from kernel_sentinel.family import REPO_ROOT, Adversarial, BadInput, Case, Family, Oracle, Property, Tolerance  # noqa: E402

# Tests of the Triton routes on CPU tensors, which run only under the interpreter (on a GPU machine CPU tensors take
# the PyTorch routes, and tests/test_gpu_call_path.py runs the compiled kernels)
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton routes on CPU tensors: the interpreter")


def with_zero_row(rest: torch.Tensor) -> torch.Tensor:
    """``cum_scores`` from its rows after the first: the convention pins ``cum_scores[:, 0] = 0``, so gradient checks
    perturb only the other rows (``rest`` (B, T, C) -> (B, T+1, C))."""
    return torch.cat([rest.new_zeros(rest.shape[0], 1, rest.shape[2]), rest], 1)


def brute_force_partition(cum_scores, transition, duration_bias, lengths, K: int, semiring: str = "log",
                          proj_start=None, proj_end=None) -> torch.Tensor:
    """logZ or the best score (B,) float64: every segmentation of ``oracle.segmentations`` scored by torch indexing
    from the convention, then logsumexp / max (``oracle.REDUCE``); differentiable by autograd (for max, at the best
    segmentation). Tiny sizes only. A reference of the tests (``sentinel verify`` enumerates with
    ``oracle.all_scores``)."""
    cum, trans, dur = (x.to(torch.float64) for x in (cum_scores, transition, duration_bias))
    zeros = cum.new_zeros(cum.shape[0], cum.shape[1] - 1, cum.shape[2])
    ps, pe = (zeros if x is None else x.to(torch.float64) for x in (proj_start, proj_end))
    out = []
    for b, L in enumerate(torch.as_tensor(lengths).tolist()):
        ys = oracle.segmentations(L, K, cum.shape[2])
        rows = [(i, s, d, c, prev) for i, y in enumerate(ys)
                for (s, d, c), prev in zip(y, (-1,) + tuple(c for _, _, c in y[:-1]))]
        i, s, d, c, prev = (torch.tensor(col, device=cum.device) for col in zip(*rows))
        score = cum[b, s + d, c] - cum[b, s, c] + dur[d - 1, c] + ps[b, s, c] + pe[b, s + d - 1, c]
        paid = (trans if trans.dim() == 3 else trans.expand(K, -1, -1))[d - 1, prev.clamp(min=0), c]
        score = score + torch.where(prev >= 0, paid, torch.zeros_like(paid))  # the first segment pays none
        totals = score.new_zeros(len(ys)).index_add(0, i, score)
        out.append(oracle.REDUCE[semiring](totals, 0))
    return torch.stack(out)


def ask_speed(call: dict) -> str:
    """``fast`` when the caller asks for it, else ``slow``."""
    return "fast" if call["fast"] else "slow"


def toy_slow(call: dict) -> torch.Tensor:
    """Row sums, accumulated in float64."""
    return call["x"].double().sum(-1).to(call["x"].dtype)


def toy_fast(call: dict) -> torch.Tensor:
    """Row sums with a planted bug: ``+ 1e-3 * x[:, 0]``."""
    x = call["x"]
    return x.sum(-1) + 1e-3 * x[:, 0]


TOY_TREE = Tree("toy_sum", Branch(Condition("speed", ask_speed, ("fast", "slow")),
                                  {"fast": Route("toy.fast", toy_fast), "slow": Route("toy.slow", toy_slow)}))


def toy_sum(x: torch.Tensor, fast: bool = False) -> torch.Tensor:
    """Sum of each row of ``x`` (N, D)."""
    validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
    validate.finite("x", x)
    if not isinstance(fast, bool):
        raise TypeError(f"fast must be a bool, got {type(fast).__name__}")
    return TOY_TREE.dispatch({"x": x, "fast": fast})


def toy_entry(fast: Callable[[dict], Any] = toy_fast,
              slow: Callable[[dict], Any] = toy_slow) -> tuple[Tree, Callable[..., Any]]:
    """``(tree, toy_sum)``: a toy tree whose routes ``toy.fast`` / ``toy.slow`` run ``fast`` / ``slow`` (a planted or
    kernel-like body in place of one of them) and its entry point, which checks ``x``'s metadata only."""
    tree = Tree("toy_sum", Branch(Condition("speed", ask_speed, ("fast", "slow")),
                                  {"fast": Route("toy.fast", fast), "slow": Route("toy.slow", slow)}))

    def entry(x, fast=False):
        validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
        return tree.dispatch({"x": x, "fast": fast})
    return tree, entry


def toy_case(route_id: str, *, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    fast = TOY_TREE.path_to(route_id)["speed"] == "fast"
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, {"small": 8, "tiny": 3}[size], generator=gen, dtype=dtype).to(device).requires_grad_(True)
    return Case(route_id, "toy_sum", {"x": x, "fast": fast}, f"x {tuple(x.shape)} fast={fast}")


def toy_run(case: Case) -> dict[str, torch.Tensor]:
    value = toy_sum(**case.kwargs)
    (grad,) = torch.autograd.grad(value.sum(), case.kwargs["x"])
    return {"value": value.detach(), "grad_x": grad}


def toy_reference(case: Case) -> dict[str, torch.Tensor]:
    x = case.kwargs["x"].detach().double()
    return {"value": x.sum(-1), "grad_x": torch.ones_like(x)}


def toy_brute_force(case: Case) -> dict[str, torch.Tensor]:
    rows = case.kwargs["x"].detach().double().tolist()
    return {"value": torch.tensor([sum(r) for r in rows], dtype=torch.float64)}


def check_sum_of_ones(route_id: str, n: int, device: torch.device, dtype: torch.dtype) -> None:
    case = toy_case(route_id, size="tiny", dtype=dtype, device=device, seed=0)
    case = case.with_kwargs(f"x ones (2, {n})", x=torch.ones(2, n, device=device, requires_grad=True))
    value = run_route(toy_run, case)["value"]
    expect_close("sum of ones", value, torch.full((2,), float(n)), Tolerance(1e-6, 1e-6))


TOY_ROWS = batch_along("a row", ("toy.*",), {"x": 0, "value": 0, "grad_x": 0})  # the toy's batch items


def _make_toy(**changes: Any) -> Family:
    family = Family(
        name="toy",
        package=provable_kernels,
        tree=TOY_TREE,
        entry_points={"toy_sum": toy_sum},
        make_case=toy_case,
        run=toy_run,
        reference=toy_reference,
        tolerances={torch.float32: Tolerance(1e-5, 1e-5), torch.float64: Tolerance(1e-12, 1e-12)},
        oracles=(Oracle("brute force", "tiny", toy_brute_force),),
        properties=(Property("sum of ones is the row length", ("toy.*",), lambda: st.integers(1, 6),
                             check_sum_of_ones),),
        adversarial=(
            Adversarial("huge values", ("toy.*",), lambda c: c.with_kwargs("x * 1e30", x=c.kwargs["x"] * 1e30)),
            Adversarial("NaN input", ("toy.*",),
                        lambda c: c.with_kwargs("x NaN", x=torch.full_like(c.kwargs["x"], float("nan"))),
                        errors_ok=True),
        ),
        bad_inputs=(
            BadInput("x", "a list", ("toy.*",), lambda c: c.with_kwargs("x list", x=c.kwargs["x"].tolist())),
            BadInput("x", "1-D", ("toy.*",), lambda c: c.with_kwargs("x 1-D", x=c.kwargs["x"][0])),
            BadInput("fast", "a string", ("toy.*",), lambda c: c.with_kwargs("fast str", fast="yes")),
        ),
        batch_items=(TOY_ROWS,),
    )
    return dataclasses.replace(family, **changes)


@pytest.fixture
def toy_family() -> Callable[..., Family]:
    """A factory: ``toy_family(**field_changes)`` returns the toy :class:`Family` with those fields replaced."""
    return _make_toy


# ------------------------------------------------------------------------------------------- semi-CRF cases

SEMICRF_TENSORS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")


@dataclasses.dataclass
class SemiCRFCase:
    """One semi-CRF problem: the five score tensors (projections may be None), lengths, K, and which backend the
    route calls ask for (``use_triton``)."""

    cum_scores: torch.Tensor
    transition: torch.Tensor
    duration_bias: torch.Tensor
    proj_start: Optional[torch.Tensor]
    proj_end: Optional[torch.Tensor]
    lengths: torch.Tensor
    K: int
    use_triton: bool = False

    @property
    def tensors(self) -> list[Optional[torch.Tensor]]:
        return [getattr(self, name) for name in SEMICRF_TENSORS]

    def with_tensors(self, tensors) -> "SemiCRFCase":
        return dataclasses.replace(self, **dict(zip(SEMICRF_TENSORS, tensors)))

    def to(self, dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> "SemiCRFCase":
        """Detached copies in ``dtype`` on ``device`` (each unchanged when None); lengths follow the device."""
        case = self.with_tensors([None if t is None else t.detach().to(device or t.device, dtype or t.dtype)
                                  for t in self.tensors])
        return dataclasses.replace(case, lengths=self.lengths.to(device or self.lengths.device))

    def leaves(self) -> "SemiCRFCase":
        """A copy whose present tensors are fresh leaves that require grad."""
        return self.with_tensors([None if t is None else t.detach().clone().requires_grad_() for t in self.tensors])

    def _arguments(self) -> tuple:
        return (self.cum_scores, self.transition, self.duration_bias, self.lengths, self.K)

    def forward(self, semiring: str = "log") -> torch.Tensor:
        """The streaming route (``semi_crf_streaming_forward``)."""
        return semi_crf_streaming_forward(*self._arguments(), semiring, self.proj_start, self.proj_end,
                                          use_triton=self.use_triton)

    def viterbi(self):
        return semi_crf_viterbi(*self._arguments(), self.proj_start, self.proj_end, use_triton=self.use_triton)

    def naive(self, semiring: str = "log") -> torch.Tensor:
        """The oracle's plain float64 recursion (every alpha kept), differentiable by autograd."""
        return oracle.naive_partition(*self._arguments(), semiring, self.proj_start, self.proj_end)

    def brute_force(self, semiring: str = "log") -> torch.Tensor:
        """The float64 enumeration of every segmentation (:func:`brute_force_partition`), differentiable."""
        return brute_force_partition(*self._arguments(), semiring, self.proj_start, self.proj_end)

    def oracle_scores(self):
        """``oracle.all_scores``: every segmentation with its score, plain Python float64."""
        cpu = [None if t is None else t.detach().cpu() for t in self.tensors]
        return oracle.all_scores(*cpu[:3], self.lengths.cpu(), self.K, *cpu[3:])


def semicrf_case(B=2, T=5, K=2, C=2, *, dtype=torch.float64, trans3d=False, proj_start=False, proj_end=False,
                 variable=False, integers=False, use_triton=False, seed=0) -> SemiCRFCase:
    """Random inputs on the CPU: per-position scores summed into ``cum_scores``, the rest drawn directly, all
    N(0, 1) (``integers``: in -2..2, so that ties are exact); ``variable`` lengths in 1..T with the first = T."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        if integers:
            return torch.randint(-2, 3, shape, generator=g).to(dtype)
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    cum = torch.cat([torch.zeros(B, 1, C, dtype=dtype), draw(B, T, C).cumsum(1)], 1)
    lengths = torch.randint(1, T + 1, (B,), generator=g) if variable else torch.full((B,), T)
    lengths[0] = T
    return SemiCRFCase(cum, draw(K, C, C) if trans3d else draw(C, C), draw(K, C),
                       draw(B, T, C) if proj_start else None, draw(B, T, C) if proj_end else None, lengths, K,
                       use_triton)


# ------------------------------------------------------------------------------------------- planted bugs


@pytest.fixture(scope="module")
def scratch():
    """A scratch copy of the repository (:class:`kernel_sentinel.mutate.Scratch`) shared by a test module's planted
    bugs, each planted and removed in turn."""
    from kernel_sentinel import mutate

    copy = mutate.Scratch(REPO_ROOT)
    yield copy
    copy.remove()


def planted_failure(family: str, route: str, check: str, file: str, pattern: str, old: str, new: str) -> str:
    """The last output line of the mutation worker (:mod:`kernel_sentinel.mutate`, on the CPU) running only
    ``check`` on ``route`` in a scratch copy with the bug planted in ``file`` (:func:`kernel_sentinel.mutate.plant`:
    ``old`` replaced by ``new`` on the line ``pattern`` finds); the unmutated sources must pass it first and the
    planted bug must fail it (exit 1)."""
    from kernel_sentinel import mutate

    scratch = mutate.Scratch(REPO_ROOT)
    try:
        clean = scratch.worker(family, [route], seed=0, timeout=600, checks=[check])[:2]
        with scratch.planted(file, pattern, old, new):
            planted = scratch.worker(family, [route], seed=0, timeout=600, checks=[check])[:2]
    finally:
        scratch.remove()
    assert clean[0] == 0, clean[1]
    assert planted[0] == 1, planted[1]
    return planted[1]
