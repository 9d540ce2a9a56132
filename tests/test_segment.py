"""Segment reductions: every backend against the independent float64 oracle, the adjoints, the custom ops, the
conventions (ties, empty segments, NaN), bad inputs, and the peer defect of torch.segment_reduce."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import INTERPRETED

from provable_kernels.alloc import poisoned
from provable_kernels.dispatch import recording
from provable_kernels.segment import oracle, segment_max_backward, segment_min_backward, segment_reduce
from provable_kernels.segment.autograd import segment_backward, segment_forward

REPO = Path(__file__).resolve().parent.parent
# under the interpreter segments of more than 8 rows are long (chunks of 16 or 32 rows); one_block: N <= 8 rows
LENGTHS = {"one_block": [3, 0, 1, 4], "blocked": [3, 0, 25, 0, 1, 17, 0]}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 2e-3}
# Tests of the Triton routes on CPU tensors (the interpreter, its sizes): on a machine with a GPU, CPU tensors take
# the PyTorch routes instead, and the compiled kernels are tested by tests/test_gpu_call_path.py and verified by
# `sentinel verify --device cuda` (its records in traces/verification/).


def problem(lengths, D=3, dtype=torch.float32, integers=False, seed=0):
    """x (N, D), the CSR offsets and the ids of ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    N = sum(lengths)
    x = (torch.randint(-2, 3, (N, D), generator=g).to(dtype) if integers
         else torch.randn(N, D, generator=g, dtype=torch.float64).to(dtype))
    offsets = torch.tensor([0] + lengths).cumsum(0)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return x, offsets, ids


def index_kwargs(form, offsets, ids):
    return {"offsets": offsets} if form == "offsets" else {"ids": ids, "num_segments": offsets.numel() - 1}


def run(x, reduce, upstream, **kwargs):
    """(value, grad_x) of segment_reduce through autograd, and the routes taken."""
    leaf = x.detach().clone().requires_grad_()
    with recording() as taken:
        value = segment_reduce(leaf, reduce, **kwargs)
    value.backward(upstream)
    return value.detach(), leaf.grad, taken


@INTERPRETED
@pytest.mark.parametrize("regime", ["one_block", "blocked"])
@pytest.mark.parametrize("form", ["offsets", "ids"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_triton_matches_oracle(reduce, form, regime):
    """Every Triton route matches the float64 oracle in value and gradient, both index forms, both row regimes."""
    x, offsets, ids = problem(LENGTHS[regime], integers=reduce in ("max", "min"))
    upstream = torch.randn(offsets.numel() - 1, 3, generator=torch.Generator().manual_seed(1))
    value, grad, taken = run(x, reduce, upstream, empty=-2.5, **index_kwargs(form, offsets, ids))
    assert taken == [f"segment.triton.{reduce}.train.{form}"]
    with recording() as inferred:
        again = segment_reduce(x, reduce, empty=-2.5, **index_kwargs(form, offsets, ids))
    assert inferred == [f"segment.triton.{reduce}.infer.{regime}"]
    assert torch.equal(again, value)
    bounds = offsets.tolist()
    torch.testing.assert_close(value.double(), oracle.segment_reduce(x, reduce, bounds, -2.5), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), oracle.segment_grad(x, reduce, bounds, upstream), rtol=1e-6,
                               atol=1e-6)


CHUNKED = {  # lengths that take the other shapes of the interpreter's sizes (8-row tiles, 2 lanes per short segment)
    "one long segment: 7 chunks of 32 rows, two combine steps of 4 lanes": [200],
    "short segments: 4 per program, several steps": [3, 0, 4, 2, 5, 1, 0, 3, 6, 2],
    "long segments of one or two 16-row chunks": [13, 0, 16, 20, 15, 9, 0, 22, 17, 16],
    "mixed: short and long of two and three 32-row chunks": [40, 0, 3, 70, 1],
}


@pytest.mark.parametrize("lengths", list(CHUNKED.values()), ids=list(CHUNKED))
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_chunk_plans_match_oracle(reduce, lengths):
    """Segments cut into several chunks (ties across chunks, a NaN only in a later chunk of one column) against
    the oracle, both index forms bitwise equal, repeatable, and the same with poisoned allocations."""
    x, offsets, ids = problem(lengths, D=2, integers=True, seed=11)
    x[offsets[1] - 1, 1] = float("nan")  # the last row of segment 0: a later chunk when it has several
    upstream = torch.randn(len(lengths), 2, generator=torch.Generator().manual_seed(4))
    value, grad, _ = run(x, reduce, upstream, offsets=offsets.to(torch.int32), empty=-2.5)
    bounds = offsets.tolist()
    torch.testing.assert_close(value.double(), oracle.segment_reduce(x, reduce, bounds, -2.5), rtol=1e-6,
                               atol=1e-6, equal_nan=True)
    torch.testing.assert_close(grad.double(), oracle.segment_grad(x, reduce, bounds, upstream), rtol=1e-6,
                               atol=1e-6, equal_nan=True)
    with poisoned():
        again, grad_again, _ = run(x, reduce, upstream, ids=ids, num_segments=len(lengths), empty=-2.5)
    assert torch.equal(again.nan_to_num(7.0), value.nan_to_num(7.0))
    assert torch.equal(grad_again.nan_to_num(7.0), grad.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("use_triton", [True, False])
def test_dtypes_match_oracle(dtype, use_triton):
    """float64, bfloat16 and float16 inputs (float32 accumulation) match the oracle within the dtype's tolerance on both
    backends."""
    x, offsets, ids = problem(LENGTHS["blocked"], D=2, dtype=dtype)
    for reduce in ("sum", "mean", "max", "min"):
        upstream = torch.linspace(-1, 1, 2 * (offsets.numel() - 1)).reshape(-1, 2).to(dtype)
        value, grad, _ = run(x, reduce, upstream, offsets=offsets, use_triton=use_triton)
        assert value.dtype == dtype and grad.dtype == dtype
        tol = TOL[dtype]
        bounds = offsets.tolist()
        torch.testing.assert_close(value.double(), oracle.segment_reduce(x, reduce, bounds), rtol=tol, atol=tol)
        torch.testing.assert_close(grad.double(), oracle.segment_grad(x, reduce, bounds, upstream), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_torch_backend_matches_oracle(reduce):
    x, offsets, ids = problem(LENGTHS["blocked"], integers=reduce in ("max", "min"), seed=3)
    upstream = -torch.ones(offsets.numel() - 1, 3)
    value, grad, taken = run(x, reduce, upstream, ids=ids, num_segments=offsets.numel() - 1, use_triton=False)
    assert taken == [f"segment.torch.{reduce}"]
    bounds = offsets.tolist()
    torch.testing.assert_close(value.double(), oracle.segment_reduce(x, reduce, bounds), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), oracle.segment_grad(x, reduce, bounds, upstream), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("use_triton", [pytest.param(True, marks=INTERPRETED), False])
@pytest.mark.parametrize("form", ["offsets", "ids"])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_adjoint_bitwise_equals_autograd(reduce, form, use_triton):
    """The standalone adjoints are bitwise equal to the autograd gradient."""
    x, offsets, ids = problem(LENGTHS["blocked"], integers=True, seed=5)
    upstream = torch.randn(offsets.numel() - 1, 3, generator=torch.Generator().manual_seed(2))
    _, grad, _ = run(x, reduce, upstream, use_triton=use_triton, **index_kwargs(form, offsets, ids))
    adjoint = segment_max_backward if reduce == "max" else segment_min_backward
    kwargs = {"offsets": offsets} if form == "offsets" else {"ids": ids}
    with recording() as taken:
        standalone = adjoint(upstream, x, use_triton=use_triton, **kwargs)
    backend = "triton" if use_triton else "torch"
    assert taken == [f"segment.{backend}.{reduce}_backward"]
    assert torch.equal(standalone, grad)


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ties_go_to_first_occurrence(sign, use_triton):
    """Ties: the whole max / min gradient goes to the first occurrence for either sign of the upstream gradient."""
    x = torch.tensor([[2.0], [2.0], [1.0], [-3.0], [-3.0]])
    offsets = torch.tensor([0, 3, 5])
    upstream = torch.full((2, 1), sign)
    _, grad_max, _ = run(x, "max", upstream, offsets=offsets, use_triton=use_triton)
    _, grad_min, _ = run(x, "min", upstream, offsets=offsets, use_triton=use_triton)
    assert grad_max.flatten().tolist() == [sign, 0.0, 0.0, sign, 0.0]
    assert grad_min.flatten().tolist() == [0.0, 0.0, sign, sign, 0.0]


def test_peer_defect_torch_segment_reduce_tie_gradient():
    """torch.segment_reduce gives every tied row the full gradient when it is negative; this family gives it to the
    first row.

    torch.segment_reduce splits a tied max gradient only for a positive upstream gradient; with a negative one
    every tied row receives the full gradient (the gradient sum is twice the upstream). Ours: the first row."""
    x = torch.tensor([5.0, 5.0, 1.0])
    lengths = torch.tensor([3])
    for upstream, torch_expected in ((1.0, [0.5, 0.5, 0.0]), (-1.0, [-1.0, -1.0, 0.0])):
        leaf = x.clone().requires_grad_()
        torch.segment_reduce(leaf, "max", lengths=lengths).backward(torch.tensor([upstream]))
        assert leaf.grad.tolist() == torch_expected
        for use_triton in (True, False):
            _, ours, _ = run(x[:, None], "max", torch.tensor([[upstream]]), offsets=torch.tensor([0, 3]),
                             use_triton=use_triton)
            assert ours.flatten().tolist() == [upstream, 0.0, 0.0]


@pytest.mark.parametrize("use_triton", [True, False])
def test_nan_inf_and_empty_segments(use_triton):
    """Empty segments give `empty` and no gradient; NaN propagates and the first NaN is the arg."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 2.0], [nan, -inf], [nan, -inf], [5.0, inf], [-inf, -inf]])
    offsets = torch.tensor([0, 3, 3, 4, 5])
    for reduce in ("sum", "mean", "max", "min"):
        upstream = -torch.ones(4, 2)
        value, grad, _ = run(x, reduce, upstream, offsets=offsets, empty=-7.0, use_triton=use_triton)
        bounds = offsets.tolist()
        torch.testing.assert_close(value.double(), oracle.segment_reduce(x, reduce, bounds, -7.0), equal_nan=True)
        torch.testing.assert_close(grad.double(), oracle.segment_grad(x, reduce, bounds, upstream))
        assert value[1].tolist() == [-7.0, -7.0]  # the empty segment
        assert torch.isnan(value[0, 0])  # NaN propagates
    _, grad, _ = run(x, "max", -torch.ones(4, 2), offsets=offsets, use_triton=use_triton)
    assert grad[:3, 0].tolist() == [0.0, -1.0, 0.0]  # the first NaN is the arg


@pytest.mark.parametrize("use_triton", [True, False])
def test_no_rows_and_all_empty(use_triton):
    for reduce in ("sum", "mean", "max", "min"):
        x = torch.zeros(0, 3, requires_grad=True)
        value = segment_reduce(x, reduce, offsets=torch.zeros(3, dtype=torch.int32), empty=1.5, use_triton=use_triton)
        assert value.tolist() == [[1.5] * 3] * 2
        value.sum().backward()
        assert x.grad.shape == (0, 3)
        assert segment_reduce(x, reduce, ids=torch.zeros(0, dtype=torch.int64), use_triton=use_triton).shape == (0, 3)


def test_trailing_dims_strided_x_and_repeatability():
    """Outputs are bitwise repeatable, strided inputs match contiguous ones, and poisoned allocations change nothing."""
    x, offsets, ids = problem(LENGTHS["blocked"], D=12, seed=7)
    strided = x.reshape(-1, 3, 4).transpose(1, 2)[:, ::2]  # (N, 2, 3), not contiguous
    S = offsets.numel() - 1
    for reduce in ("sum", "max"):
        first = segment_reduce(strided, reduce, ids=ids, num_segments=S)
        assert first.shape == (S, 2, 3)
        assert torch.equal(first, segment_reduce(strided.contiguous(), reduce, ids=ids, num_segments=S))
        with poisoned():
            assert torch.equal(first, segment_reduce(strided, reduce, ids=ids, num_segments=S))
        torch.testing.assert_close(first.double(), oracle.segment_reduce(strided, reduce, offsets.tolist()),
                                   rtol=1e-6, atol=1e-6)


@INTERPRETED
@pytest.mark.parametrize("ids_are", ["sorted", "shuffled, some past S, some negative"])
def test_the_device_mode_nan_rule_holds_over_three_search_steps(ids_are):
    """In device mode the Triton kernels put NaN for bad ids where the registration's rule says
    (``oracle.nan_for_misplaced_ids``, which computes the bounds with a Python copy of the kernels' FAN-ary search),
    also over more than FAN**2 rows (three search steps); valid ids give no NaN."""
    from kernel_sentinel.family import Case
    from kernel_sentinel.registry import family

    from provable_kernels.segment.triton_segment import FAN
    from provable_kernels.validate import value_checks

    rule = next(b.device_mode for b in family("segment").bad_inputs if b.device_mode is not None)
    g, S = torch.Generator().manual_seed(3), 40
    ids = torch.randint(0, S, (FAN.value ** 2 + 77,), generator=g).sort().values
    if ids_are != "sorted":
        ids = ids[torch.randperm(ids.numel(), generator=g)] + torch.randint(-1, 2, ids.shape, generator=g) * 10
    x = torch.randn(ids.numel(), 1, generator=g).requires_grad_()
    with value_checks("device"), recording() as taken:
        value = segment_reduce(x, "sum", ids=ids, num_segments=S)
    value.backward(torch.ones_like(value))
    assert taken == ["segment.triton.sum.train.ids"]
    case = Case("segment.triton.sum.train.ids", "segment_reduce", {"x": x, "ids": ids, "num_segments": S}, ids_are)
    rule(case, {"value": value.detach(), "grad_x": x.grad})
    assert torch.isnan(value).any() == (ids_are != "sorted")


@INTERPRETED
def test_custom_ops_pass_opcheck():
    """The Triton kernels are torch custom ops that pass torch.library.opcheck."""
    x, offsets, ids = problem(LENGTHS["blocked"], D=2)
    upstream = torch.randn(offsets.numel() - 1, 2)
    S = offsets.numel() - 1
    for reduce in ("sum", "max"):
        for given, index in ((offsets, None), (None, ids)):
            for host_checked in (True, False):
                leaf = x.clone().requires_grad_()
                args = (leaf, given, index, S, reduce, 0.0, True, host_checked)
                torch.library.opcheck(segment_forward.custom_op, args)
            _, arg, csr = segment_forward(x, given, index, S, reduce, 0.0, True, True)
            csr = offsets if given is not None else csr
            torch.library.opcheck(segment_backward.custom_op, (upstream, csr, index, arg, reduce, x.shape[0]))


BAD = [
    ("x", TypeError, lambda x, o, i: dict(x=x.long(), reduce="sum", offsets=o)),
    ("reduce", ValueError, lambda x, o, i: dict(x=x, reduce="prod", offsets=o)),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o, ids=i)),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum")),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o.flip(0))),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o + 1)),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o[:-1])),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=torch.tensor([0, 9, 6, 12]))),
    ("offsets", TypeError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o.float())),
    ("offsets", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o.to("meta"))),
    ("ids", ValueError, lambda x, o, i: dict(x=x, reduce="sum", ids=i.flip(0))),
    ("ids", ValueError, lambda x, o, i: dict(x=x, reduce="sum", ids=i, num_segments=2)),
    ("ids", ValueError, lambda x, o, i: dict(x=x, reduce="sum", ids=i - 1)),
    ("ids", TypeError, lambda x, o, i: dict(x=x, reduce="sum", ids=i.to(torch.int16))),
    ("num_segments", ValueError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o, num_segments=7)),
    ("empty", TypeError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o, empty="zero")),
    ("empty", ValueError, lambda x, o, i: dict(x=x.double(), reduce="sum", offsets=o, empty=1e-300)),
    ("use_triton", TypeError, lambda x, o, i: dict(x=x, reduce="sum", offsets=o, use_triton=1)),
]


@pytest.mark.parametrize("argument, error, make", BAD, ids=[f"{a}-{n}" for n, (a, _, _) in enumerate(BAD)])
def test_bad_inputs_name_the_argument(argument, error, make):
    x, offsets, ids = problem([3, 0, 5, 4])
    with pytest.raises(error, match=rf"^{argument}"):
        segment_reduce(**make(x, offsets, ids))


def test_adjoint_bad_grad_output():
    x, offsets, ids = problem([3, 0, 5, 4])
    with pytest.raises(ValueError, match="^grad_output"):
        segment_max_backward(torch.zeros(3, 3), x, offsets=offsets)
    with pytest.raises(TypeError, match="^grad_output"):
        segment_min_backward(torch.zeros(4, 3, dtype=torch.float64), x, ids=ids)
    with pytest.raises(TypeError, match="^grad_output"):  # not a tensor: S cannot come from it (ids form)
        segment_max_backward([[1.0] * 3] * 4, x, ids=ids)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_ids_without_num_segments_under_compile_say_so(fullgraph):
    """Under torch.compile no host read can give S: the error names num_segments and the fix. With fullgraph Dynamo
    wraps it, and the message is in the error lines the traceback prints (the wrapper's own text under torch 2.11,
    its cause, printed first, under newer torch), not only in a quoted source line; without fullgraph the call runs
    eagerly after the graph break and raises the ValueError itself."""
    x, ids = torch.randn(6, 3), torch.tensor([0, 0, 1, 1, 2, 2])
    compiled = torch.compile(lambda x, ids: segment_reduce(x, "sum", ids=ids), fullgraph=fullgraph)
    with pytest.raises(Exception) as caught:
        compiled(x, ids)
    wanted = "num_segments must be given with ids under torch.compile"
    if fullgraph:
        said = [str(caught.value), str(caught.value.__cause__)]
        assert any(wanted in text and "pass num_segments=S" in text for text in said), said
    else:
        assert caught.type is ValueError and str(caught.value).startswith(wanted)
        assert str(caught.value).endswith("pass num_segments=S")


def test_guide_example_runs():
    """The example of traces/guide/segment.md runs and its assertions hold."""
    text = (REPO / "traces" / "guide" / "segment.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the guide has no python example"
    for block in blocks:
        exec(compile(block, "segment.md", "exec"), {})


@pytest.mark.parametrize("use_triton", [pytest.param(True, marks=INTERPRETED), False])
def test_device_mode_poisons_instead_of_reading_the_host(use_triton):
    """With value checks on the device (the CUDA default), a bad index never becomes a silent number and is never
    read out of bounds. The PyTorch backend swaps it for a valid one and every output is NaN; the Triton kernels
    check it themselves: the segments whose bounds (or rows' ids) are wrong are NaN, every segment when the offsets
    do not run from 0 to N, and the rows outside their segment get NaN gradients."""
    from provable_kernels import validate

    x = torch.randn(6, 2)
    bad = [  # (index, segments NaN on the Triton path)
        (dict(ids=torch.tensor([0, 0, 5, 1, 1, 1]), num_segments=3), [1]),  # id 5 inside segment 1's rows
        (dict(ids=torch.tensor([0, 0, 2, 1, 1, 1]), num_segments=3), [1, 2]),  # unsorted: the searches count every
        # id below 1 and 2 (two and five), so segment 1 holds rows 2-4 (row 2 has id 2) and segment 2 row 5 (id 1)
        (dict(ids=torch.tensor([-1, 0, 0, 1, 1, 1]), num_segments=3), [0, 1, 2]),  # offsets start past 0
        (dict(offsets=torch.tensor([0, 4, 2, 6])), [1]),
        (dict(offsets=torch.tensor([0, 9, 3, 6])), [0, 1]),  # past N
        (dict(offsets=torch.tensor([1, 2, 2, 9])), [0, 1, 2]),
        (dict(offsets=torch.tensor([0, 2, 2, 5])), [0, 1, 2]),  # ends before N
    ]
    with validate.value_checks("device"):
        for kwargs, spoiled in bad:
            for reduce in ("sum", "max"):
                out = segment_reduce(x, reduce, use_triton=use_triton, **kwargs)
                nan = torch.isnan(out).all(1)
                if use_triton:
                    assert nan.nonzero().flatten().tolist() == spoiled, (kwargs, reduce)
                    assert not torch.isnan(out[~nan]).any()
                else:
                    assert nan.all()
        grad = segment_max_backward(torch.ones(3, 2), x, offsets=torch.tensor([0, 4, 2, 9]), use_triton=use_triton)
        assert torch.isnan(grad).any()
        leaf = x.clone().requires_grad_()
        segment_reduce(leaf, "sum", offsets=torch.tensor([0, 4, 2, 6]), use_triton=use_triton).sum().backward()
        assert torch.isnan(leaf.grad).any()
        if use_triton:  # six rows in no segment
            assert segment_reduce(x, "sum", offsets=torch.tensor([0])).shape == (0, 2)
            assert torch.isnan(segment_max_backward(torch.ones(0, 2), x, offsets=torch.tensor([0]))).all()
        good = segment_reduce(x, "sum", offsets=torch.tensor([0, 2, 2, 6]), use_triton=use_triton)
    torch.testing.assert_close(good.double(), oracle.segment_reduce(x, "sum", [0, 2, 2, 6]), rtol=1e-6, atol=1e-6)


def _reduced(x: torch.Tensor, rows: torch.Tensor, reduce: str) -> torch.Tensor:
    """float64 reduction of the rows ``x[rows]`` (a boolean mask), for the device-mode property below."""
    part = x[rows].double()
    return {"sum": lambda: part.sum(0), "max": lambda: part.amax(0)}[reduce]()


@pytest.mark.parametrize("form", ["offsets", "ids"])
def test_device_mode_long_segments_bad_index(monkeypatch, form):
    """Device mode with long segments (several chunks, finished by their last chunk's program) and random bad
    indices: every output is written (allocations hold a marker value no reduction of the data gives), each segment
    is NaN or the exact reduction of its own rows (offsets form: its bounds when they are valid; ids form: every row
    holding its id, where every lower id lies before them and every higher one after), some segment is NaN exactly
    when the index is invalid (a bad index is never silent), and a valid call afterwards gives bitwise what it gave
    before the bad ones (the flags and workspace kept between calls hold nothing stale)."""
    from provable_kernels import alloc, validate

    marker = 1234.5
    empty = alloc.empty

    def marked(shape, *, dtype, device):
        out = empty(shape, dtype=dtype, device=device)
        return out.fill_(marker) if out.is_floating_point() else out

    gen = torch.Generator().manual_seed(11)
    lengths = [3, 40, 0, 21, 5, 70, 2]
    x, offsets, ids = problem(lengths, D=3, integers=True, seed=4)  # integer data: sums exact in any order
    N, S = x.shape[0], len(lengths)
    with validate.value_checks("device"):
        before = segment_reduce(x, "sum", **index_kwargs(form, offsets, ids))
        monkeypatch.setattr(alloc, "empty", marked)
        for trial in range(12):
            reduce = ("sum", "max")[trial % 2]
            if form == "offsets":
                bad = offsets.clone()
                k = int(torch.randint(1, S, (1,), generator=gen))
                bad[k] = int(torch.randint(0, N + 1, (1,), generator=gen))
                if trial == 0:  # segment 0 = rows 0-99: its last chunk's program finds segment 1 (row 31 >= 30)
                    bad[1], bad[2] = 100, 30
                out = segment_reduce(x, reduce, offsets=bad)
            else:
                bad = ids.clone()
                k = int(torch.randint(0, N, (1,), generator=gen))
                bad[k] = int(torch.randint(0, S, (1,), generator=gen))
                out = segment_reduce(x, reduce, ids=bad, num_segments=S)
            assert not (out == marker).any(), (trial, bad)
            for s in range(S):
                if torch.isnan(out[s]).all():
                    continue
                if form == "offsets":
                    a, b = int(bad[s]), int(bad[s + 1])
                    assert 0 <= a <= b <= N, (trial, s, bad)
                    rows = (torch.arange(N) >= a) & (torch.arange(N) < b)
                else:  # the rows holding id s, when every lower id lies before them and every higher one after
                    rows = bad == s
                    if not ((bad < s) == (torch.arange(N) < int((bad < s).sum()))).all() \
                            or not ((bad > s) == (torch.arange(N) >= int((bad <= s).sum()))).all():
                        continue
                if not rows.any():
                    continue
                assert torch.equal(out[s].double(), _reduced(x, rows, reduce)), (trial, s, bad)
            still_valid = bool((bad.diff() >= 0).all()) and (form == "ids" or (bad[0] == 0 and bad[-1] == N))
            assert torch.isnan(out).any() != still_valid, (trial, bad)
        monkeypatch.setattr(alloc, "empty", empty)
        after = segment_reduce(x, "sum", **index_kwargs(form, offsets, ids))
    assert torch.equal(before, after)
    torch.testing.assert_close(before.double(), oracle.segment_reduce(x, "sum", offsets.tolist()), rtol=0, atol=0)


# ------------------------------------------------------------------------------------- the thin call path


class _DeviceWork:
    """Kernel launches (through provable_kernels.launch.Launcher) and the torch ops that do device work (anything
    but allocations and views) while active; the interpreter's own tensor traffic inside a launch is not counted."""

    FREE = {"empty.memory_format", "empty_strided.default", "view.default", "_unsafe_view.default", "alias.default",
            "detach.default", "reshape.default", "as_strided.default", "expand.default"}

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

        from provable_kernels.launch import Launcher

        self.launches, self.ops = [], []
        work = self

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.__name__ if "." in func.__name__ else f"{func.__name__}.default"
                if name not in work.FREE and func.namespace != "provable_kernels":  # our ops: their kernels count
                    work.ops.append(name)
                return func(*args, **(kwargs or {}))

        launch = Launcher.launch

        def counted(launcher, grid, args, opts):
            self.launches.append(launcher.kernel.__name__)
            with _disable_current_modes():
                return launch(launcher, grid, args, opts)

        monkeypatch.setattr(Launcher, "launch", counted)
        self.mode = Record()

    def __enter__(self):
        self.launches.clear()
        self.ops.clear()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@INTERPRETED
@pytest.mark.parametrize("form", ["offsets", "ids"])
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_public_call_runs_only_kernels(monkeypatch, reduce, form):
    """What a repeat CUDA call does (value checks on the device): no torch op does device work, one forward launch
    with or without long segments (the last chunk's program combines), in either index form (with ids the chunk
    kernel finds the offsets itself), one backward launch. (A first call may zero the workspace flags it grows.)"""
    from provable_kernels import validate

    work = _DeviceWork(monkeypatch)
    for lengths, forward in (([3, 0, 1, 4], 1), ([3, 0, 25, 0, 1, 17, 0], 1)):
        x, offsets, ids = problem(lengths, D=3)
        leaf = x.clone().requires_grad_()
        upstream = torch.ones(len(lengths), 3)
        with validate.value_checks("device"):
            segment_reduce(x, reduce, **index_kwargs(form, offsets, ids))  # the first call grows the workspace
            with work:
                segment_reduce(x, reduce, **index_kwargs(form, offsets, ids))
            assert not work.ops, work.ops
            assert len(work.launches) == forward, work.launches
            with work:
                out = segment_reduce(leaf, reduce, **index_kwargs(form, offsets, ids))
                torch.autograd.grad(out, leaf, upstream)
            assert not work.ops, work.ops
            assert len(work.launches) == forward + 1, work.launches


@INTERPRETED
def test_sizes_never_change_the_constexprs(monkeypatch):
    """Every launch of a kernel for one D, reduction, dtype and index form gets the same constexprs whatever N and S
    (so a GPU compiles each kernel once), and the GPU's sizes depend on D's column block only."""
    from provable_kernels.launch import Launcher
    from provable_kernels.segment import triton_ops

    seen: dict = {}
    launch = Launcher.launch

    def record(launcher, grid, args, opts):
        seen.setdefault(launcher.kernel.__name__, set()).add(tuple(sorted(opts.meta.items())))
        return launch(launcher, grid, args, opts)

    monkeypatch.setattr(Launcher, "launch", record)
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        S = int(torch.randint(1, 9, (1,), generator=gen))
        lengths = torch.randint(0, 40, (S,), generator=gen).tolist()
        x, offsets, ids = problem(lengths, D=3, seed=S)
        leaf = x.clone().requires_grad_()
        segment_reduce(leaf, "max", ids=ids, num_segments=S).sum().backward()
    assert set(seen) == {"segment_chunk_kernel", "segment_backward_kernel"}
    assert all(len(metas) == 1 for metas in seen.values()), seen
    gpu = torch.device("cuda")
    assert triton_ops.sizes(16, gpu) == triton_ops.sizes(9, gpu) != triton_ops.sizes(17, gpu)


@pytest.mark.parametrize("form", ["offsets", "ids"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_batch_invariance(reduce, form):
    """A segment's output and gradient are bitwise the same reduced alone and at any position among random
    neighbours (short ones, long ones of several chunks, empty ones): its order of operations depends on its own
    rows only. Segments: short, long of one chunk, long of several chunks (several combine steps)."""
    gen = torch.Generator().manual_seed(9)
    for n in (5, 13, 150):
        item = torch.randn(n, 3, generator=gen)
        g_item = torch.randn(1, 3, generator=gen)

        def reduced(before, after):
            lengths = before + [n] + after
            x, offsets, ids = problem(lengths, D=3, seed=len(lengths) + sum(lengths))
            start = sum(before)
            x[start:start + n] = item
            upstream = torch.randn(len(lengths), 3, generator=gen)
            upstream[len(before)] = g_item
            value, grad, _ = run(x, reduce, upstream, **index_kwargs(form, offsets, ids))
            return value[len(before)], grad[start:start + n]

        alone = reduced([], [])
        for before, after in (([7, 0, 40], [3]), ([60, 2], [11, 0, 33]),
                              ([int(v) for v in torch.randint(0, 50, (3,), generator=gen)], [1])):
            value, grad = reduced(before, after)
            assert torch.equal(value, alone[0]), (n, before, after)
            assert torch.equal(grad, alone[1]), (n, before, after)


def test_flags_kept_from_before_the_epochs_wrap_are_dropped(monkeypatch):
    """Epochs run 1 .. 2**31 - 1 and then wrap: a flag a slot kept since the first call equals the first epoch of
    the next round, and a waiting program would take it for one published in this call; at the wrap the kept
    flags are dropped, so they are fresh zeros. ``restart_epochs`` (which the registration's call at the wrap
    uses) numbers the next calls."""
    from provable_kernels import alloc
    from provable_kernels.segment import triton_ops

    monkeypatch.setattr(alloc, "_KEPT", {})
    monkeypatch.setattr(triton_ops, "_EPOCHS", triton_ops._EPOCHS)  # restored after the test
    triton_ops.restart_epochs(0)
    workspaces = triton_ops.workspaces(torch.device("cpu"), 64, 8)
    _, flags, epoch = triton_ops.scratch(workspaces)
    assert epoch == 1
    flags.fill_(epoch)  # every slot published in the first call, never written again
    triton_ops.restart_epochs(triton_ops.EPOCH_LIMIT - 1)  # 2**31 - 2 calls later
    assert triton_ops.scratch(workspaces)[2] == triton_ops.EPOCH_LIMIT
    _, flags, epoch = triton_ops.scratch(workspaces)
    assert epoch == 1 and not bool((flags == epoch).any())
    triton_ops.restart_epochs(3 * triton_ops.EPOCH_LIMIT + 41)
    assert triton_ops.scratch(workspaces)[2] == 42


@pytest.mark.parametrize("calls_made, error, message", [
    (-1, ValueError, "calls_made must be >= 0, got -1"), (1.0, TypeError, "calls_made must be an int, got float"),
    (True, TypeError, "calls_made must be an int, got bool")])
def test_restart_epochs_names_a_bad_count(calls_made, error, message):
    from provable_kernels.segment import triton_ops

    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        triton_ops.restart_epochs(calls_made)


def test_the_chunk_rows_probe_runs_the_kernels_rule():
    """The registration's test kernel returns ``triton_segment.chunk_rows`` per length: the oracle's Python loop of
    the documented rule, at the interpreter's sizes (16-row chunks doubling once, target 2: 16 rows up to 32, 32
    rows above); a bad length is named."""
    from provable_kernels.segment import probes

    lengths = [0, 1, 31, 32, 33, 64, 65, 200]
    assert probes.chunk_rows_of(lengths, 16, 1, 2, torch.device("cpu")) == [16, 16, 16, 16, 32, 32, 32, 32]
    with pytest.raises(ValueError, match=r"^lengths must be ints >= 0, got \[3, -1\]$"):
        probes.chunk_rows_of([3, -1], 16, 1, 2, torch.device("cpu"))
