"""The ``devices`` check (kernel_sentinel.crossdevice) without a GPU: CPU tensors stand in for two GPUs (a
:class:`StandIn` placement says where each lies and which is current), a toy route whose Triton kernel enters its
inputs' device passes, and each planted bug fails the check naming what went wrong: a launch on the current
device, an output left on the current device, results that depend on the current device, an entry point that
accepts inputs split across devices. The GPU count is mocked for the not-applicable verdict, which the records
do not count as evidence; the real families' validation is probed with one argument on the meta device."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import pytest
import torch
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from provable_kernels import alloc, validate
from provable_kernels.dispatch import Route, Tree
from provable_kernels.launch import launcher
from kernel_sentinel import crossdevice, records, registry
from kernel_sentinel.family import Case, Tolerance
from kernel_sentinel.generic import Probe

HOME, OTHER = torch.device("cuda", 0), torch.device("cuda", 1)
CPU, META = torch.device("cpu"), torch.device("meta")


class StandIn(crossdevice.Placement):
    """Two GPUs stood in by CPU tensors: a tensor lies where it was put (:meth:`to`, :meth:`put`), else on
    ``HOME``; the current device is what :meth:`entered` last made current (``HOME`` outside)."""

    def __init__(self) -> None:
        self.places: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.now = HOME

    def current(self) -> torch.device:
        return self.now

    @contextlib.contextmanager
    def entered(self, device: torch.device) -> Iterator[None]:
        before, self.now = self.now, device
        try:
            yield
        finally:
            self.now = before

    def where(self, x: torch.Tensor) -> torch.device:
        return self.places.get(x, HOME)

    def to(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        return self.put(x.clone(), device)

    def put(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.places[x] = device
        return x


@triton.jit
def row_dot_kernel(x, w, out, D, BD: tl.constexpr):
    """out[r] = sum over d of x[r, d] * w[d] (rows of D contiguous elements)."""
    r = tl.program_id(0)
    offs = tl.arange(0, BD)
    row = tl.load(x + r * D + offs, mask=offs < D, other=0.0)
    tl.store(out + r, tl.sum(row * tl.load(w + offs, mask=offs < D, other=0.0), 0))


def row_dots(place: StandIn, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` by :func:`row_dot_kernel` into a fresh allocation on the device of ``x`` (as ``device=x.device``
    allocates), whatever device is current."""
    out = place.put(alloc.empty((x.shape[0],), dtype=x.dtype, device=x.device), place.where(x))
    launcher(row_dot_kernel)[(x.shape[0],)](x, w, out, x.shape[1], BD=triton.next_power_of_2(x.shape[1]))
    return out


def entering(place: StandIn) -> Callable[[dict], torch.Tensor]:
    """The right route body: the kernel runs with the inputs' device entered, its output lies there."""
    def body(call: dict) -> torch.Tensor:
        x, w = call["x"], call["w"]
        with place.entered(place.where(x)):
            return row_dots(place, x, w)
    return body


def named(x_on: torch.device, w_on: torch.device) -> Exception:
    return ValueError(f"w must be on {x_on} like x, got {w_on}")


def pair_family(toy_family, place: StandIn, body: Callable[[dict], torch.Tensor],
                split_error: Optional[Callable[[torch.device, torch.device], Exception]] = named):
    """A family of one route, ``pair.dot``: ``dot(x, w)`` = ``x @ w`` for x (N, D) and w (D,), computed by
    ``body(call)``; its entry point raises ``split_error(device of x, device of w)`` when they differ (None:
    accepts them)."""
    tree = Tree("dot", Route("pair.dot", body))

    def dot(x, w):
        validate.tensor("x", x, ndim=2, dtypes=validate.FLOAT_DTYPES)
        validate.tensor("w", w, ndim=1, dtypes=(x.dtype,))
        if split_error is not None and place.where(w) != place.where(x):
            raise split_error(place.where(x), place.where(w))
        return tree.dispatch({"x": x, "w": w})

    def make_case(route_id, *, size, dtype, device, seed):
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(3, 5, generator=gen, dtype=dtype), torch.randn(5, generator=gen, dtype=dtype)
        return Case(route_id, "dot", {"x": x, "w": w}, "x (3, 5), w (5,)")

    return toy_family(name="pair", tree=tree, entry_points={"dot": dot}, make_case=make_case,
                      run=lambda case: {"value": dot(**case.kwargs)},
                      reference=lambda case: {"value": case.kwargs["x"].double() @ case.kwargs["w"].double()})


def devices_verdict(family, place: StandIn):
    case = family.make_case("pair.dot", size="small", dtype=torch.float32, device=CPU, seed=0)
    return crossdevice.verdict(Probe(family, case, Tolerance(1e-5, 1e-5)), HOME, OTHER, place)


def test_route_entering_its_inputs_device_passes(toy_family):
    place = StandIn()
    found = devices_verdict(pair_family(toy_family, place, entering(place)), place)
    assert found.passed, found.problems
    assert found.summary == ("every input on another GPU than the current one: 1 outputs and gradients there, "
                             "bitwise the current GPU's, every launch on its inputs' GPU; 2/2 inputs alone on "
                             "another GPU rejected with an error naming an argument")


def test_launch_on_the_current_device_fails_naming_the_kernel(toy_family):
    place = StandIn()

    def stays(call):  # the bug the check is for: no device entered, the kernel runs on the current device
        return row_dots(place, call["x"], call["w"])

    found = devices_verdict(pair_family(toy_family, place, stays), place)
    assert found.problems == ("every input on cuda:1, cuda:0 current: row_dot_kernel launched with cuda:0 current "
                              "and its tensor arguments on cuda:1",)


def test_output_left_on_the_current_device_fails(toy_family):
    place = StandIn()

    def misplaced(call):
        with place.entered(place.where(call["x"])):
            out = row_dots(place, call["x"], call["w"])
        return place.put(out.clone(), place.current())  # copied back to the current device

    found = devices_verdict(pair_family(toy_family, place, misplaced), place)
    assert found.problems == ("every input on cuda:1, cuda:0 current: value lies on cuda:0",)


def test_results_depending_on_the_current_device_fail_bitwise(toy_family):
    place = StandIn()
    right = entering(place)

    def reads_home(call):  # e.g. a workspace of the current device read: off by one where the inputs lie elsewhere
        return place.put(right(call) + float(place.where(call["x"]) != HOME), place.where(call["x"]))

    found = devices_verdict(pair_family(toy_family, place, reads_home), place)
    assert len(found.problems) == 1
    assert found.problems[0].startswith("every input on cuda:1, cuda:0 current: value: 3/3 elements differ")
    assert found.problems[0].endswith("(vs every input on cuda:0)")


def test_entry_point_accepting_split_inputs_fails(toy_family):
    place = StandIn()
    found = devices_verdict(pair_family(toy_family, place, entering(place), split_error=None), place)
    assert found.problems == (
        "only x on cuda:1, the rest on cuda:0: accepted",
        "only x on cuda:1, the rest on cuda:0: row_dot_kernel launched with cuda:1 current and its tensor "
        "arguments on cuda:1, cuda:0",
        "only w on cuda:1, the rest on cuda:0: accepted",
        "only w on cuda:1, the rest on cuda:0: row_dot_kernel launched with cuda:0 current and its tensor "
        "arguments on cuda:0, cuda:1")
    assert "0/2 inputs alone on another GPU rejected" in found.summary


def test_split_rejected_without_naming_an_argument_fails(toy_family):
    place = StandIn()
    unnamed = lambda x_on, w_on: RuntimeError("Expected all tensors to be on the same device")  # noqa: E731
    found = devices_verdict(pair_family(toy_family, place, entering(place), split_error=unnamed), place)
    assert found.problems == tuple(
        f"only {name} on cuda:1, the rest on cuda:0: raised RuntimeError: Expected all tensors to be on the same "
        f"device, expected a ValueError or TypeError naming the argument" for name in ("x", "w"))


# --------------------------------------------------------------------------------------------- moving cases


def test_moved_case_copies_every_tensor_module_and_upstream_weight():
    linear = torch.nn.Linear(2, 2)
    x = torch.ones(2, requires_grad=True)
    case = Case("r", "e", {"x": x, "edge": (torch.zeros(2), torch.ones(3)), "head": linear, "k": 3}, "c",
                upstream={"value": torch.ones(2)})
    moved = crossdevice.moved_case(case, META)
    assert moved.kwargs["x"].device == META and moved.kwargs["x"].requires_grad and moved.kwargs["x"].is_leaf
    assert [t.device for t in moved.kwargs["edge"]] == [META, META] and isinstance(moved.kwargs["edge"], tuple)
    assert moved.kwargs["head"].weight.device == META and linear.weight.device == CPU  # a copy was moved
    assert moved.upstream["value"].device == META and moved.kwargs["k"] == 3
    assert moved.description == "c; every input on meta"
    assert crossdevice.tensor_arguments(case) == [("x", ()), ("edge", (0,)), ("edge", (1,))]
    split = crossdevice.split_case(case, "edge", (1,), META)
    assert [t.device for t in split.kwargs["edge"]] == [CPU, META] and split.kwargs["x"].device == CPU
    assert split.kwargs["x"] is not x and split.description == "c; only edge[1] on meta"


# ------------------------------------------------------------------------------------------ not applicable


@pytest.mark.parametrize("count, current, gpus, want", [
    (0, 0, (), "not applicable: 0 GPUs"),
    (1, 0, (), "not applicable: 1 GPU"),
    (2, 0, (), (0, 1)),
    (4, 3, (), (3, 0)),  # the next visible GPU, round the ring
    (4, 2, (0, 2), (2, 0)),  # the next one of --devices when it lists several
    (4, 2, (2,), (2, 3)),
])
def test_pair_is_the_current_gpu_and_the_next_one(monkeypatch, count, current, gpus, want):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    found = crossdevice.pair(torch.device("cuda"), gpus)
    assert found == (want if isinstance(want, str) else tuple(torch.device("cuda", i) for i in want))
    assert crossdevice.pair(CPU) == "not applicable: a CPU run (no second device)"


def test_one_gpu_is_not_applicable_and_no_evidence(monkeypatch, toy_family):
    """On one GPU the check passes saying so; a record of such rows holds no cross-device evidence."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    family = toy_family()
    case = family.make_case("toy.slow", size="tiny", dtype=torch.float32, device=CPU, seed=0)
    found = crossdevice.check(Probe(family, case, Tolerance(1e-5, 1e-5)), torch.device("cuda"))
    assert found.passed and found.summary == "not applicable: 1 GPU"

    def record(*details: str, status: str = "pass") -> dict:
        return {"routes": [{"checks": [{"name": "devices", "status": status, "detail": d}]} for d in details]}

    assert records.cross_device(record("not applicable: 1 GPU", "not applicable: 1 GPU")) == "not applicable: 1 GPU"
    assert records.cross_device(record("every input on another GPU ...")) == "pass"
    assert records.cross_device(record("every input ...", "not applicable: 1 GPU")) == \
        "pass on 1/2 rows, not applicable: 1 GPU on the others"
    assert records.cross_device(record("x", status="fail")) == "fail"
    assert records.cross_device({"routes": [{"checks": []}]}) == "not run"


# ----------------------------------------------------------------------------------------- real families


class _CpuCurrent(crossdevice.Placement):
    """Real tensors, the CPU current: a split puts one argument on the meta device."""

    def current(self) -> torch.device:
        return CPU

    def entered(self, device: torch.device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


@pytest.mark.parametrize("family_name, route_id, splits", [
    ("semicrf", "semicrf.torch.log.train", 6), ("segment", "segment.torch.max_backward", 3),
    ("segment", "segment.torch.sum", 2),
])
def test_family_validation_rejects_each_argument_on_another_device(family_name, route_id, splits):
    family = registry.family(family_name)
    case = family.make_case(route_id, size="tiny", dtype=torch.float32, device=CPU, seed=0)
    probe = Probe(family, case, family.tolerance(torch.float32))
    problems, tried, rejected = crossdevice._split_problems(probe, CPU, META, _CpuCurrent())
    assert problems == [] and tried == rejected == splits
