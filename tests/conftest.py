"""Shared test setup.

Without a GPU the Triton kernels run on CPU tensors under the Triton interpreter, which must be switched on before
any kernel module is imported (``@triton.jit`` decides at decoration time); on a GPU machine it stays off.

``toy_family`` builds a two-route toy family for testing sentinel itself: ``toy_sum(x, fast)`` sums the rows of
``x``; route ``toy.slow`` is right, route ``toy.fast`` carries a planted bug (it adds ``1e-3 * x[:, 0]``).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402
from typing import Any, Callable  # noqa: E402

import pytest  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import kernels  # noqa: E402
from kernels import validate  # noqa: E402
from kernels.dispatch import Branch, Condition, Route, Tree  # noqa: E402
from sentinel.checks import expect_close, run_route  # noqa: E402
from sentinel.family import Adversarial, BadInput, Case, Family, Oracle, Property, Tolerance  # noqa: E402


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


def check_sum_of_ones(route_id: str, n: int, device: torch.device) -> None:
    case = toy_case(route_id, size="tiny", dtype=torch.float32, device=device, seed=0)
    case = case.with_kwargs(f"x ones (2, {n})", x=torch.ones(2, n, device=device, requires_grad=True))
    value = run_route(toy_run, case)["value"]
    expect_close("sum of ones", value, torch.full((2,), float(n)), Tolerance(1e-6, 1e-6))


def _make_toy(**changes: Any) -> Family:
    family = Family(
        name="toy",
        package=kernels,
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
    )
    return dataclasses.replace(family, **changes)


@pytest.fixture
def toy_family() -> Callable[..., Family]:
    """A factory: ``toy_family(**field_changes)`` returns the toy :class:`Family` with those fields replaced."""
    return _make_toy
