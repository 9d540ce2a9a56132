"""The public call path of every family on a GPU: launches per call, no recompilation when sizes change,
``torch.compile(fullgraph=True)`` and CUDA-graph replay of a training step bitwise equal to eager.

Launches, compilations and graphs exist only for compiled kernels on a CUDA device (the interpreter has none of
them), so this file runs on the GPU machine (``benchmarks/gpu_session.sh verify`` with ``VERIFY_EXTRAS=1``) and is
skipped without CUDA. The limits are those of the site page "The call path" (``traces/guide/host-syncs.md``):
semi-CRF forward 1, forward+backward <= 2; Sinkhorn 1 and 2; segment 1 and 2.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="launches, compilations and CUDA graphs exist on a CUDA device only")

from benchmarks.common import device_launches  # noqa: E402
from provable_kernels.segment import segment_reduce  # noqa: E402
from provable_kernels.semicrf import semi_crf_streaming_forward  # noqa: E402
from provable_kernels.sinkhorn import sinkhorn  # noqa: E402

DEVICE = torch.device("cuda")


@dataclass(frozen=True)
class Family:
    """A family's public call for this file: ``make(rng, big)`` draws differentiable inputs of random sizes (``big``:
    the large size bucket), ``call(inputs)`` runs the public function; the launch limits per call."""

    make: Callable[[random.Random, bool], dict]
    call: Callable[[dict], torch.Tensor]
    forward_launches: int
    training_launches: int


def _semicrf_inputs(rng: random.Random, big: bool) -> dict:
    B, T, K, C = rng.randint(1, 64), rng.randint(2, 400 if big else 40), rng.randint(1, 8), 8
    cum = torch.randn(B, T + 1, C, device=DEVICE).cumsum(1)
    cum[:, 0] = 0
    return dict(cum_scores=cum, transition=torch.randn(C, C, device=DEVICE),
                duration_bias=torch.randn(K, C, device=DEVICE),
                lengths=torch.randint(1, T + 1, (B,), device=DEVICE), K=K)


def _sinkhorn_inputs(rng: random.Random, big: bool) -> dict:
    return dict(x=torch.randn(rng.randint(40000, 300000) if big else rng.randint(1, 20000), 4, 4, device=DEVICE))


def _segment_inputs(rng: random.Random, big: bool) -> dict:
    N, S = rng.randint(1, 400000 if big else 4000), rng.randint(1, 2000)
    ids = torch.randint(0, S, (N,), device=DEVICE).sort().values
    offsets = torch.searchsorted(ids, torch.arange(S + 1, device=DEVICE))
    return dict(x=torch.randn(N, 16, device=DEVICE), offsets=offsets, ids=ids, num_segments=S)


FAMILIES = {
    "semicrf": Family(_semicrf_inputs, lambda a: semi_crf_streaming_forward(**a), 1, 2),
    "sinkhorn": Family(_sinkhorn_inputs, lambda a: sinkhorn(a["x"], 20, "log"), 1, 2),
    # the residuals come from the forward's own launch
    "sinkhorn-residual": Family(_sinkhorn_inputs, lambda a: sinkhorn(a["x"], 20, "prob", return_residual=True)[0],
                                1, 2),
    "segment": Family(_segment_inputs, lambda a: segment_reduce(a["x"], "max", offsets=a["offsets"]), 1, 2),
    "segment-ids": Family(_segment_inputs, lambda a: segment_reduce(a["x"], "sum", ids=a["ids"],
                                                                    num_segments=a["num_segments"]), 1, 2),
}
FLOATS = {"semicrf": ("cum_scores", "transition", "duration_bias"), "sinkhorn": ("x",), "sinkhorn-residual": ("x",),
          "segment": ("x",), "segment-ids": ("x",)}


def _with_grad(family: str, inputs: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() if k in FLOATS[family] else v for k, v in inputs.items()}


def _step(family: str, inputs: dict) -> tuple[torch.Tensor, ...]:
    """Forward and backward of ``sum(out * w)`` for a fixed weight: the output and every input gradient."""
    out = FAMILIES[family].call(inputs)
    weight = torch.linspace(-1, 1, out.numel(), device=DEVICE, dtype=out.dtype).reshape(out.shape)
    grads = torch.autograd.grad((out * weight).sum(), [inputs[k] for k in FLOATS[family]])
    return (out.detach(), *grads)


def compiled_kernels() -> int:
    """How many compiled variants the Triton kernels of provable_kernels hold now (every device)."""
    kernels = {id(obj): obj for name, module in list(sys.modules.items())
               if name.startswith("provable_kernels") and module is not None
               for obj in vars(module).values() if isinstance(obj, triton.runtime.JITFunction)}
    return sum(len(cache[0]) for fn in kernels.values() for cache in fn.device_caches.values())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_launches_per_public_call(family):
    spec = FAMILIES[family]
    inputs = spec.make(random.Random(0), False)
    with torch.no_grad():
        forward = device_launches(lambda: spec.call(inputs))
        out = spec.call(inputs)
    training = device_launches(lambda: _step(family, _with_grad(family, inputs)))
    # what the step adds around the family's call (its weight, product, sum, the autograd seed, the product's
    # backward, the inputs' clones): the same step on a leaf in place of the call, measured and subtracted
    extra = device_launches(lambda: _around_the_call(family, inputs, out))
    assert forward <= spec.forward_launches, f"{family} forward: {forward} launches"
    assert training - extra <= spec.training_launches, f"{family} forward+backward: {training - extra} launches"


def _around_the_call(family: str, inputs: dict, out: torch.Tensor) -> None:
    _with_grad(family, inputs)
    leaf = out.detach().requires_grad_()
    weight = torch.linspace(-1, 1, leaf.numel(), device=DEVICE, dtype=leaf.dtype).reshape(leaf.shape)
    torch.autograd.grad((leaf * weight).sum(), [leaf])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_changing_sizes_compile_at_most_two_kernels_after_the_first_step(family):
    """20 training steps with sizes drawn at random (both size buckets) compile at most two new kernels after the
    first step of each bucket has run."""
    spec, rng = FAMILIES[family], random.Random(1)
    for big in (False, True):
        _step(family, _with_grad(family, spec.make(rng, big)))
    before = compiled_kernels()
    for i in range(20):
        _step(family, _with_grad(family, spec.make(rng, i % 2 == 1)))
    torch.cuda.synchronize()
    assert compiled_kernels() - before <= 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step_replays_in_a_cuda_graph_bitwise(family):
    inputs = _with_grad(family, FAMILIES[family].make(random.Random(2), False))
    eager = _step(family, inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as torch.cuda.graphs requires
        _step(family, inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(family, inputs)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_captured_forward_owns_its_workspace(family):
    """A forward captured in a CUDA graph on a stream replays bitwise equal to eager after an eager call on that
    stream replaced the workspace a family keeps per stream (segment's partials and flags) and freed the old one,
    whose memory may then hold other tensors: the graph writes into buffers of its own (taken fresh while
    capturing), so those tensors keep their values."""
    spec = FAMILIES[family]
    small, large = spec.make(random.Random(4), False), spec.make(random.Random(5), True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        eager = spec.call(small)  # warm-up on the capture stream: its kept workspace exists from here on
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = spec.call(small)
        spec.call(large)  # a larger problem replaces the stream's workspace; the old one returns to the allocator
        sizes = (64, 256, 1024, 4096, 16384, 65536)
        fillers = [torch.full((n,), 7.0, device=DEVICE) for n in sizes for _ in range(4)]
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, captured)
    assert all(bool((f == 7.0).all()) for f in fillers), "the replay wrote into memory the graph does not own"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_compiled_public_call_equals_eager_bitwise(family):
    inputs = _with_grad(family, FAMILIES[family].make(random.Random(3), False))
    call = FAMILIES[family].call
    compiled = torch.compile(lambda a: call(a), fullgraph=True)
    out = compiled(inputs)
    weight = torch.linspace(-1, 1, out.numel(), device=DEVICE, dtype=out.dtype).reshape(out.shape)
    grads = torch.autograd.grad((out * weight).sum(), [inputs[k] for k in FLOATS[family]])
    for a, b in zip(_step(family, inputs), (out.detach(), *grads)):
        assert torch.equal(a, b)


def _output_and_gradient(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, item: int,
                         weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_()
    out = call(leaf)
    return out[item].detach(), torch.autograd.grad((out[item] * weight).sum(), [leaf])[0]


@pytest.mark.parametrize("domain", ["log", "prob"])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_a_sinkhorn_matrix_is_batch_invariant_in_a_large_batch(n, domain):
    """A matrix in the middle of a batch of 60000-300000 and the same matrix alone: bitwise the same output and
    gradient (a smaller packing for small batches once gave them other tile layouts, and other bits)."""
    torch.manual_seed(n)
    batch = torch.randn(300000 if n == 4 else 60000, n, n, device=DEVICE)
    item, weight = len(batch) // 2 + 3, torch.randn(n, n, device=DEVICE)
    call = lambda x: sinkhorn(x, 20, domain)  # noqa: E731
    packed = _output_and_gradient(call, batch, item, weight)
    alone_out, alone_grad = _output_and_gradient(call, batch[item:item + 1], 0, weight)
    assert torch.equal(packed[0], alone_out) and torch.equal(packed[1][item], alone_grad[0])


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_a_segment_is_batch_invariant_in_a_large_problem(reduce):
    """A segment of 5000 rows reduced alone and as one of 1000 segments of 2M rows (other chunk plans, tiles and
    programs): bitwise the same output and gradient rows."""
    torch.manual_seed(0)
    N, S, D = 2_000_000, 1000, 16
    inner = torch.randint(1, N, (S - 2,), device=DEVICE).sort().values
    offsets = torch.cat([torch.tensor([0, 5000], device=DEVICE), inner.clamp(min=5000),
                         torch.tensor([N], device=DEVICE)])
    x, weight = torch.randn(N, D, device=DEVICE), torch.randn(D, device=DEVICE)
    packed = _output_and_gradient(lambda t: segment_reduce(t, reduce, offsets=offsets), x, 0, weight)
    alone = _output_and_gradient(lambda t: segment_reduce(t, reduce, offsets=offsets[:2]), x[:5000], 0, weight)
    assert torch.equal(packed[0], alone[0]) and torch.equal(packed[1][:5000], alone[1])
