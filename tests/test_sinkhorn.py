"""The Sinkhorn family against its independent float64 oracle (the plain loop of the convention).

Without a GPU the Triton routes run under the Triton interpreter (tests/conftest.py switches it on), so shapes
and iteration counts stay tiny.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from provable_kernels import validate
from provable_kernels.dispatch import recording
from provable_kernels.sinkhorn import FusedMHC, SinkhornKnopp, sinkhorn
from provable_kernels.sinkhorn import autograd as ops
from provable_kernels.sinkhorn import triton_ops
from provable_kernels.sinkhorn.oracle import residual_oracle, sinkhorn_oracle

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: masked-off lanes divide by 0

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# outputs and gradients against the float64 loop: the output's rounding (half a unit in the last place at 1: bfloat16
# 2e-3, float16 5e-4) and a few units of float32's or float64's rounding over the iterations
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}
ROOT = Path(__file__).resolve().parent.parent


def logits(shape, scale=1.0, seed=0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def check(x: torch.Tensor, iters: int, domain: str, eps: float = 1e-6, use_triton: bool = True,
          route: str | None = None) -> None:
    """Output and gradient (weighted by a fixed random upstream gradient) against the float64 oracle."""
    x = x.detach().requires_grad_()
    with recording() as taken:
        out = sinkhorn(x, iters, domain, eps, use_triton=use_triton)
    if route is not None:
        assert taken == [route]
    weight = logits(x.shape, seed=7, dtype=torch.float64)
    (out.double() * weight).sum().backward()
    x64 = x.detach().double().requires_grad_()
    ref = sinkhorn_oracle(x64, iters, domain, eps)
    (ref * weight).sum().backward()
    tol = TOL[x.dtype]
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out.double(), ref.detach(), atol=tol, rtol=tol)
    gtol = tol * max(1.0, float(x64.grad.abs().max()))  # the gradient's own scale
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=gtol, rtol=tol)


@pytest.mark.parametrize("domain", ["log", "prob"])
@pytest.mark.parametrize("shape", [(3, 1, 1), (4, 2, 2), (5, 3, 3), (2, 2, 4, 4), (6, 6), (9, 5, 5)])
def test_triton_matches_oracle(domain, shape):
    """Every Triton route equals the float64 loop of the convention (outputs and gradients), n = 1..6 and 64, leading
    dims of any rank."""
    check(logits(shape, seed=sum(shape)), 3, domain, route=f"sinkhorn.triton.{domain}.train")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_triton_dtypes(dtype):
    for domain in ("log", "prob"):
        check(logits((4, 3, 3), dtype=dtype), 2, domain)


@pytest.mark.parametrize("domain", ["log", "prob"])
def test_torch_backend_matches_oracle(domain):
    check(logits((3, 4, 4)), 3, domain, use_triton=False, route=f"sinkhorn.torch.{domain}.train")


@pytest.mark.parametrize("n, iters", [(3, 5), (3, 20), (5, 10)])
@pytest.mark.parametrize("domain", ["log", "prob"])
def test_backward_replays_from_kept_scalings(domain, n, iters):
    """n <= 4 keeps the scalings of every ceil(iters / 8)-th step (iters = 5: every step, no replay; 20: every 3rd),
    n = 5 every ceil(sqrt(iters))-th (10: every 4th): replays start at several kept slots."""
    check(logits((3, n, n), seed=iters, dtype=torch.float64), iters, domain, eps=1e-3)


def test_large_n_takes_the_torch_route():
    check(logits((1, 65, 65)), 2, "log", route="sinkhorn.torch.large")


def test_n_64_on_triton():
    check(logits((1, 64, 64), scale=0.5), 1, "log", route="sinkhorn.triton.log.train")


def test_packing_several_matrices_per_program_and_a_partial_block():
    """Several matrices per program, with a partial last block, give the same results."""
    n, B = 8, 37
    p = triton_ops.plan(B, n)
    assert p.BM > 1 and p.grid > 1 and B % p.BM != 0
    check(logits((B, n, n), seed=3), 2, "log")
    check(logits((B, n, n), seed=4), 2, "prob", eps=1e-3)


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize("domain", ["log", "prob"])
def test_guards_neg_inf_huge_logits_and_all_neg_inf_rows(domain, use_triton):
    """-inf entries, all -inf rows and columns and logits of +-1e4 give the float64 loop's results."""
    x = logits((4, 4, 4), seed=5)
    x[0] *= 1e4  # +-1e4: the log domain runs the log loop for this block
    x[1, 2, 1] = float("-inf")
    x[2, 1, :] = float("-inf")  # all -inf row
    x[3, :, 2] = float("-inf")  # all -inf column: float32 stays exact through the flagged form
    check(x, 3, domain, eps=1e-3, use_triton=use_triton)


@pytest.mark.parametrize("use_triton", [True, False])
def test_clamp_gradient_convention_at_the_boundary(use_triton):
    """The log domain's clamp passes the gradient where x >= -1e5, the boundary included, and none below: the
    gradient at exactly -1e5 equals the one just above it (it is continuous from the right there), and an entry
    1 below the clamp gets none. Oracle and routes alike, whatever torch's clamp does at its boundary."""
    base = torch.tensor([[-1e5 + 0.3, 0.0], [1.0, -2.0]], dtype=torch.float64)  # x[0, 1] varies near -1e5
    weight = torch.tensor([[0.3, -1.0], [2.0, 0.5]], dtype=torch.float64)

    def grad_at(value, fn):
        x = base.clone()
        x[0, 1] = value
        x = x.to(DEVICE).requires_grad_()
        (fn(x).double() * weight.to(DEVICE)).sum().backward()
        return x.grad[0, 1].item()

    routes = {"oracle": lambda x: sinkhorn_oracle(x, 5, "log", 0.0),
              "route": lambda x: sinkhorn(x, 5, "log", use_triton=use_triton)}
    for name, fn in routes.items():
        at, above, below = grad_at(-1e5, fn), grad_at(-1e5 + 1e-6, fn), grad_at(-1e5 - 1.0, fn)
        assert below == 0.0, name
        assert at != 0.0 and at == pytest.approx(above, rel=1e-4), name


def test_all_neg_inf_rows_are_defined():
    """An all -inf matrix gives the uniform matrix in both domains."""
    x = torch.full((1, 3, 3), float("-inf"), device=DEVICE)
    uniform = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    assert torch.allclose(sinkhorn(x, 2, "log").double().cpu(), uniform)
    assert torch.allclose(sinkhorn(x, 2, "prob", eps=0.0).double().cpu(), uniform)


def test_eps_zero_with_a_zero_column_stays_finite():
    x = logits((2, 3, 3), seed=6)
    x[:, :, 1] = float("-inf")
    check(x, 2, "prob", eps=0.0)


def test_scaling_form_stays_exact_at_the_span_threshold():
    """The scaling form stays exact for rows spanning up to its limit, over 200 iterations.

    Rows spanning just under RMAX (entries 0 or -29.9) with many iterations: no overflow or underflow."""
    g = torch.Generator().manual_seed(1)
    x = torch.where(torch.rand(8, 4, 4, generator=g) < 0.5, 0.0, -29.9).to(DEVICE)
    out = triton_ops.forward(x, 200, "log", 0.0)
    torch.testing.assert_close(out.double().cpu(), sinkhorn_oracle(x.cpu(), 200, "log", 0.0), atol=2e-6, rtol=0)


def test_empty_batch_and_2d_input():
    x = torch.zeros(0, 3, 3, device=DEVICE, requires_grad=True)
    out = sinkhorn(x, 2)
    out.sum().backward()
    assert out.shape == (0, 3, 3) and x.grad.shape == (0, 3, 3)
    check(logits((5, 5)), 1, "prob")


def test_infer_routes_and_bitwise_determinism():
    """Outputs and gradients are bitwise identical on repeated runs."""
    x = logits((6, 5, 5))
    for domain in ("log", "prob"):
        with recording() as taken:
            a = sinkhorn(x, 3, domain)
        b = sinkhorn(x, 3, domain)
        assert taken == [f"sinkhorn.triton.{domain}.infer"] and torch.equal(a, b)
        g = logits(x.shape, seed=9)
        assert torch.equal(ops.sinkhorn_backward(g, x, 3, domain, 1e-6), ops.sinkhorn_backward(g, x, 3, domain, 1e-6))


def test_modules():
    x = logits((2, 4, 4))
    with recording() as taken:
        a = SinkhornKnopp(3, "prob", 1e-4)(x)
        b = FusedMHC(3)(x.to(torch.bfloat16))
    assert taken == ["sinkhorn.triton.prob.infer", "sinkhorn.triton.log.infer"]
    torch.testing.assert_close(a.double().cpu(), sinkhorn_oracle(x.cpu(), 3, "prob", 1e-4), atol=2e-5, rtol=0)
    assert b.dtype == torch.bfloat16
    assert torch.equal(SinkhornKnopp(3, "prob", 1e-4, return_residual=True)(x)[0], a)
    with pytest.raises(ValueError, match="^mhc_iters"):
        FusedMHC(0)
    with pytest.raises(ValueError, match="^domain"):
        SinkhornKnopp(domain="exp")


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(3, 4),), ValueError, "^x must be square"),
    ((torch.zeros(3),), ValueError, "^x must have at least 2 dims"),
    ((torch.zeros(3, 3, dtype=torch.int32),), TypeError, "^x must have dtype"),
    (([[0.0]],), TypeError, "^x must be a torch.Tensor"),
    ((torch.tensor([[0.0, float("nan")], [0.0, 0.0]]),), ValueError, "^x contains NaN or \\+inf"),
    ((torch.tensor([[0.0, float("inf")], [0.0, 0.0]]),), ValueError, "^x contains NaN or \\+inf"),
    ((torch.zeros(2, 2), 0), ValueError, "^iters must be >= 1"),
    ((torch.zeros(2, 2), 2.0), TypeError, "^iters must be an int"),
    ((torch.zeros(2, 2), True), TypeError, "^iters must be an int"),
    ((torch.zeros(2, 2), 2, "exp"), ValueError, "^domain must be one of"),
    ((torch.zeros(2, 2), 2, "prob", -1e-3), ValueError, "^eps must be a finite number >= 0"),
    ((torch.zeros(2, 2), 2, "prob", "1e-3"), TypeError, "^eps must be a real number"),
    ((torch.zeros(2, 2), 2, "prob", 1e-300), ValueError, "^eps must be 0 or lie in"),
    ((torch.randn(2, 0, 0),), ValueError, r"^x must have n >= 1"),
])
def test_bad_inputs(args, error, message):
    """Every wrong argument raises ValueError/TypeError naming it."""
    with pytest.raises(error, match=message):
        sinkhorn(*args)
    with pytest.raises(TypeError, match="^return_residual must be a bool"):
        sinkhorn(torch.zeros(2, 2), return_residual=1)


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize("domain", ["log", "prob"])
@pytest.mark.parametrize("shape, iters", [((2, 3, 5, 5), 2), ((4, 4), 1), ((3, 8, 8), 6), ((0, 3, 3), 2)])
def test_the_residual_against_the_float64_loop(shape, iters, domain, use_triton):
    """``return_residual=True``: each matrix's largest |line sum - 1|, shaped like the leading dims, in float32,
    against the float64 loop's; the output and its gradient are those of the call without it, and the residual
    has no gradient."""
    x = logits(shape, seed=5).requires_grad_()
    out, res = sinkhorn(x, iters, domain, 1e-3, use_triton=use_triton, return_residual=True)
    plain = sinkhorn(x, iters, domain, 1e-3, use_triton=use_triton)
    assert res.shape == shape[:-2] and res.dtype == torch.float32 and not res.requires_grad
    expected = residual_oracle(sinkhorn_oracle(x.detach(), iters, domain, 1e-3))
    torch.testing.assert_close(res.double(), expected, atol=2e-6 * shape[-1], rtol=0)
    assert torch.equal(out, plain)
    g = logits(shape, seed=6)
    assert torch.equal(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(plain, x, g)[0])
    if shape[0] and iters == 1 and domain == "log":  # one step is far from converged: the residual shows it
        assert float(res.min()) > 1e-3


@pytest.mark.parametrize("use_triton", [True, False])
def test_the_residual_of_a_bad_matrix_is_nan_in_device_mode(use_triton):
    x = logits((3, 4, 4), seed=4)
    x[1, 2, 0] = float("nan")
    with validate.value_checks("device"):
        out, res = sinkhorn(x, 3, "log", use_triton=use_triton, return_residual=True)
    assert res[1].isnan() and torch.isfinite(res[[0, 2]]).all()
    assert torch.equal(res[[0, 2]], sinkhorn(x[[0, 2]], 3, "log", use_triton=use_triton, return_residual=True)[1])


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize("domain", ["log", "prob"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_device_mode_poisons_the_bad_matrices_only(use_triton, domain, bad):
    """Device mode reads nothing on the host: a matrix holding NaN or +inf comes out NaN with a NaN gradient in
    every entry; the other matrices (here in the same Triton block) are bitwise those of a clean call."""
    clean = logits((3, 3, 3), seed=4)
    x = clean.clone()
    x[1, 0, 0] = bad
    x.requires_grad_()
    clean.requires_grad_()
    g = logits((3, 3, 3), seed=7)
    with validate.value_checks("device"):
        out = sinkhorn(x, 2, domain, use_triton=use_triton)
        expected = sinkhorn(clean, 2, domain, use_triton=use_triton)
    (grad,) = torch.autograd.grad(out, x, g)
    (expected_grad,) = torch.autograd.grad(expected, clean, g)
    assert out[1].isnan().all() and grad[1].isnan().all()
    keep = [0, 2]
    assert torch.equal(out[keep], expected[keep]) and torch.equal(grad[keep], expected_grad[keep])


@pytest.mark.parametrize("domain", ["log", "prob"])
def test_opcheck_custom_ops(domain):
    """The custom ops pass torch.library.opcheck and run under torch.compile(fullgraph=True)."""
    x = logits((3, 3, 3), seed=2).requires_grad_()
    torch.library.opcheck(torch.ops.provable_kernels.sinkhorn_forward, (x, 2, domain, 1e-3))
    torch.library.opcheck(torch.ops.provable_kernels.sinkhorn_forward_residual, (x, 2, domain, 1e-3))
    g = logits((3, 3, 3), seed=3)
    torch.library.opcheck(torch.ops.provable_kernels.sinkhorn_backward, (g, x.detach(), 2, domain, 1e-3))


def test_compile_fullgraph():
    op = torch.ops.provable_kernels.sinkhorn_forward
    fn = torch.compile(lambda t: op(t, 2, "log", 0.0).square().sum(), fullgraph=True, backend="aot_eager")
    x = logits((2, 3, 3)).requires_grad_()
    fn(x).backward()
    x64 = x.detach().double().requires_grad_()
    sinkhorn_oracle(x64, 2, "log", 0.0).square().sum().backward()
    torch.testing.assert_close(x.grad.double().cpu(), x64.grad.cpu(), atol=1e-5, rtol=1e-5)


def test_guide_lane_mixing_example_runs():
    """The guide's lane-mixing example runs."""
    text = (ROOT / "traces" / "guide" / "sinkhorn.md").read_text()
    section = text.split("## Example: lane mixing", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "sinkhorn.md", "exec"), {"__name__": "guide_example"})


@pytest.mark.parametrize("domain", ["log", "prob"])
def test_eager_fast_path_equals_the_custom_op(domain):
    """Eager calls skip the custom-op dispatcher (provable_kernels.custom_ops.Op): the autograd.Function path and
    the registered op give bitwise the same outputs and gradients."""
    x = logits((3, 4, 4), seed=5).requires_grad_()
    g = logits((3, 4, 4), seed=6)
    eager = ops.sinkhorn_forward(x, 3, domain, 1e-3)
    (eager_grad,) = torch.autograd.grad(eager, x, g)
    op = torch.ops.provable_kernels.sinkhorn_forward(x, 3, domain, 1e-3)
    # the eager call ran the autograd.Function, not the op's generated autograd node
    assert type(eager.grad_fn).__name__ == "sinkhorn_forwardBackward"
    assert type(op.grad_fn).__name__.startswith("GeneratedBackwardFor_provable_kernels_sinkhorn_forward")
    (op_grad,) = torch.autograd.grad(op, x, g)
    assert torch.equal(eager, op) and torch.equal(eager_grad, op_grad)


def test_compile_fullgraph_of_the_public_function_equals_eager():
    """torch.compile(fullgraph=True) of sinkhorn itself: validation, the dispatch tree and the custom op trace
    without a graph break; values and gradients equal eager."""
    x = logits((2, 3, 3), seed=8).requires_grad_()
    g = logits((2, 3, 3), seed=9)
    fn = torch.compile(lambda t: sinkhorn(t, 2, "log"), fullgraph=True, backend="aot_eager")
    compiled = fn(x)
    (compiled_grad,) = torch.autograd.grad(compiled, x, g)
    eager = sinkhorn(x, 2, "log")
    (eager_grad,) = torch.autograd.grad(eager, x, g)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=0, atol=0)
    with_residual = torch.compile(lambda t: sinkhorn(t, 2, "log", return_residual=True), fullgraph=True,
                                  backend="aot_eager")
    out, res = with_residual(x)
    torch.testing.assert_close((out, res), sinkhorn(x, 2, "log", return_residual=True), rtol=0, atol=0)
    (residual_grad,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(residual_grad, eager_grad, rtol=0, atol=0)


@pytest.mark.parametrize("n", [4, 6])
@pytest.mark.parametrize("neighbour", ["-inf entries", "a row spanning 200", "entries below the clamp"])
def test_a_matrix_is_batch_invariant_next_to_matrices_that_take_the_log_loop(n, neighbour):
    """The log-domain kernels pack several matrices per program. The choice between the scaling form and the log
    loop was once made per program: a matrix next to one with -inf entries came out (bitwise) different from the
    same matrix alone. It is now made per matrix; outputs and gradients are bitwise those of the matrix alone."""
    torch.manual_seed(n)
    item = torch.randn(n, n, dtype=torch.float64)
    other = torch.randn(n, n, dtype=torch.float64)
    if neighbour == "-inf entries":
        other[0, 1] = float("-inf")
    elif neighbour == "a row spanning 200":
        other[1, 0] = -200.0
    else:
        other[2, 2] = -3e5
    weight = torch.randn(n, n, dtype=torch.float64).to(DEVICE)
    results = []
    for batch in (item[None], torch.stack([other, item, other])):
        leaf = batch.to(DEVICE, copy=True).requires_grad_()
        with recording() as taken:
            out = sinkhorn(leaf, 7, "log")
        assert taken == ["sinkhorn.triton.log.train"]
        position = 0 if len(batch) == 1 else 1
        grad, = torch.autograd.grad((out[position] * weight).sum(), [leaf])
        results.append((out[position].detach(), grad[position]))
    (alone, alone_grad), (packed, packed_grad) = results
    assert torch.equal(alone, packed) and torch.equal(alone_grad, packed_grad)
