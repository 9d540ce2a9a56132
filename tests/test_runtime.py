"""The shared host path (``provable_kernels.runtime``): a repeat call is a lookup, never a skipped check.

Each property is shown on real entry points (Sinkhorn's Triton routes under the interpreter, the semi-CRF's) and
compared with the full path (``TREE.dispatch(make_call(...))``), which runs every check and the route's own body.
"""
from __future__ import annotations

import threading

import pytest
import torch
from conftest import INTERPRETED

from provable_kernels import runtime
from provable_kernels.dispatch import recording
from provable_kernels.semicrf import dispatch as semicrf_dispatch
from provable_kernels.semicrf.call import make_call as semicrf_call
from provable_kernels.sinkhorn import dispatch as sinkhorn_dispatch
from provable_kernels.sinkhorn import sinkhorn
from provable_kernels.sinkhorn.call import make_call as sinkhorn_call


@pytest.fixture
def entry():
    """Sinkhorn's entry point with an empty cache (restored afterwards)."""
    saved = dict(sinkhorn_dispatch.ENTRY.cache)
    sinkhorn_dispatch.ENTRY.cache.clear()
    yield sinkhorn_dispatch.ENTRY
    sinkhorn_dispatch.ENTRY.cache.clear()
    sinkhorn_dispatch.ENTRY.cache.update(saved)


def test_one_entry_per_signature_and_repeat_calls_hit_it(entry):
    x = torch.randn(3, 4, 4)
    sinkhorn(x, 3, "prob")
    sinkhorn(x + 1, 3, "prob")
    assert len(entry.cache) == 1
    sinkhorn(torch.randn(5, 4, 4), 3, "prob")  # another shape
    sinkhorn(x, 4, "prob")  # another setting
    sinkhorn(x.double(), 3, "prob")  # another dtype
    sinkhorn(x.transpose(1, 2), 3, "prob")  # other strides
    assert len(entry.cache) == 5


@INTERPRETED
@pytest.mark.parametrize("domain", ["log", "prob"])
def test_the_prepared_runner_is_bitwise_the_full_path(entry, domain):
    x = torch.randn(2, 3, 5, 5)
    for views in (x, x.transpose(-1, -2)):  # contiguous and not
        with recording() as taken:
            first = sinkhorn(views, 6, domain)
            repeat = sinkhorn(views, 6, domain)
        full = sinkhorn_dispatch.TREE.dispatch(sinkhorn_call(views, 6, domain))
        assert taken == [f"sinkhorn.triton.{domain}.infer"] * 2  # a cached route is still recorded
        assert torch.equal(first, full) and torch.equal(repeat, full)


def test_value_checks_run_on_every_call(entry):
    x = torch.randn(3, 4, 4)
    sinkhorn(x, 3)
    bad = x.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"x contains NaN or \+inf"):
        sinkhorn(bad, 3)


def test_a_cached_signature_does_not_admit_other_bad_arguments(entry):
    x = torch.randn(3, 4, 4)
    sinkhorn(x, 3)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        sinkhorn(x, 0)
    with pytest.raises(TypeError, match="iters must be an int"):
        sinkhorn(x, 3.0)
    with pytest.raises(TypeError, match="use_triton must be a bool"):
        sinkhorn(x, 3, use_triton=1)


def test_arguments_outside_the_cache_take_the_full_path(entry):
    x = torch.randn(3, 4, 4)
    assert runtime.signature((x, torch.tensor(3), "log", 1e-6, True)) is None  # a 0-d tensor for iters
    got = sinkhorn(x, torch.tensor(3))
    assert torch.equal(got, sinkhorn(x, 3)) and len(entry.cache) == 1
    assert runtime.signature((torch.empty(3, 4, 4, device="meta"),)) is None


@INTERPRETED
def test_grad_mode_and_requires_grad_are_part_of_the_signature(entry):
    x = torch.randn(3, 4, 4, requires_grad=True)
    with recording() as taken:
        sinkhorn(x, 3)
        with torch.no_grad():
            sinkhorn(x, 3)
        sinkhorn(x.detach(), 3)
    assert taken == ["sinkhorn.triton.log.train", "sinkhorn.triton.log.infer", "sinkhorn.triton.log.infer"]
    assert len(entry.cache) == 3


def test_the_cache_stays_bounded(entry, monkeypatch):
    monkeypatch.setattr(runtime, "CACHE_SIZE", 2)
    for b in range(1, 6):
        sinkhorn(torch.randn(b, 2, 2), 2)
    assert len(entry.cache) <= 2


def test_semicrf_entries_share_the_runtime_and_keep_their_post_processing():
    B, T, K, C = 2, 5, 3, 4
    cum = torch.randn(B, T + 1, C).cumsum(1)
    cum[:, 0] = 0
    args = (cum, torch.randn(C, C), torch.randn(K, C), torch.tensor([5, 3]), K)
    first = semicrf_dispatch.semi_crf_streaming_forward(*args)
    repeat = semicrf_dispatch.semi_crf_streaming_forward(*args)
    full = semicrf_dispatch.TREE.dispatch(semicrf_call("partition", *args, "log", None, None, True))
    assert torch.equal(first, full) and torch.equal(repeat, full)
    assert isinstance(semicrf_dispatch.PARTITION, runtime.Entry)
    best = semicrf_dispatch.semi_crf_viterbi(*args)
    assert torch.equal(best.scores, semicrf_dispatch.semi_crf_viterbi(*args).scores)
    shifted = cum + 1  # the zero row forgotten: caught on a cached signature too
    with pytest.raises(ValueError, match=r"cum_scores\[:, 0\] must be 0"):
        semicrf_dispatch.semi_crf_streaming_forward(shifted, *args[1:])


@INTERPRETED
@pytest.mark.parametrize("domain", ["log", "prob"])
def test_the_prepared_training_path_is_bitwise_the_custom_ops(entry, domain):
    """One autograd function per signature whose backward reuses the forward's prepared launch: the same
    outputs and gradients, bitwise, as the full path (the custom op and its registered autograd formula)."""
    x = torch.randn(2, 3, 5, 5)
    weight = torch.randn(2, 3, 5, 5)
    results = []
    for path in ("prepared", "prepared again", "full"):
        leaf = x.clone().requires_grad_()
        with recording() as taken:
            if path == "full":
                out = sinkhorn_dispatch.TREE.dispatch(sinkhorn_call(leaf, 6, domain))
            else:
                out = sinkhorn(leaf, 6, domain)
        assert taken == [f"sinkhorn.triton.{domain}.train"]
        results.append((out.detach(), torch.autograd.grad((out * weight).sum(), [leaf])[0]))
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r))
    assert len(entry.cache) == 1


def _problem():
    """A small semi-CRF problem and a segment problem with short and long segments (the interpreter's sizes)."""
    B, T, K, C = 3, 9, 4, 3
    cum = torch.randn(B, T + 1, C).cumsum(1)
    cum[:, 0] = 0
    crf = (cum, torch.randn(C, C), torch.randn(K, C), torch.tensor([9, 4, 1]), K)
    offsets = torch.tensor([0, 3, 3, 20, 21, 26])  # a long segment of 17 rows: two chunks at the interpreter's sizes
    ids = torch.repeat_interleave(torch.arange(5), offsets.diff())
    return crf, torch.randn(26, 2, 3), offsets, ids


@INTERPRETED
@pytest.mark.parametrize("reduce", ["sum", "max"])
@pytest.mark.parametrize("form", ["offsets", "ids"])
def test_segment_direct_runners_are_bitwise_the_full_path(reduce, form):
    """The direct runners (a repeat call: no call object, no tree walk) of inference and training give the full
    path's outputs and gradients bitwise, in either index form, for (N, D) and (N, ...) inputs alike."""
    from provable_kernels.segment import dispatch as segment_dispatch
    from provable_kernels.segment import segment_reduce
    from provable_kernels.segment.call import make_call as segment_call

    _, x, offsets, ids = _problem()
    index = dict(offsets=offsets) if form == "offsets" else dict(ids=ids, num_segments=5)
    saved = dict(segment_dispatch.REDUCE.cache)
    segment_dispatch.REDUCE.cache.clear()
    for shaped in (x, x.reshape(26, 6)):
        full = segment_dispatch.TREE.dispatch(segment_call("reduce", shaped, reduce, index.get("offsets"),
                                                           index.get("ids"), index.get("num_segments"), 0.0, True))
        assert all(torch.equal(segment_reduce(shaped, reduce, **index), full) for _ in range(3))
        weight = torch.randn(full.shape)
        results = []
        for _ in range(3):  # the first call takes the full path, the others the direct runner
            leaf = shaped.clone().requires_grad_()
            out = segment_reduce(leaf, reduce, **index)
            results.append((out.detach(), torch.autograd.grad((out * weight).sum(), [leaf])[0]))
        assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r))
    mine = list(segment_dispatch.REDUCE.cache.values())
    segment_dispatch.REDUCE.cache.clear()
    segment_dispatch.REDUCE.cache.update(saved)
    assert len(mine) == 4 and all(found[2] is not None for found in mine)  # inference and training, two shapes


def test_semicrf_direct_runners_are_bitwise_the_full_path_and_decline_what_they_cannot_take():
    """Inference and training direct runners give the full path's logZ and gradients bitwise; a call whose tensors
    the full path must change (a cast to the compute dtype, K above T) gets no direct runner and stays right."""
    crf, *_ = _problem()
    cum, trans, dur, lengths, K = crf
    full = semicrf_dispatch.TREE.dispatch(semicrf_call("partition", *crf, "log", None, None, True))
    assert all(torch.equal(semicrf_dispatch.semi_crf_streaming_forward(*crf), full) for _ in range(3))
    results = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (cum, trans, dur)]
        logZ = semicrf_dispatch.semi_crf_streaming_forward(*leaves, lengths, K)
        results.append((logZ.detach(), *torch.autograd.grad((logZ * torch.arange(3.0)).sum(), leaves)))
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r))
    declined = [key for key, found in semicrf_dispatch.PARTITION.cache.items() if found[2] is None]
    mixed = (cum, trans.double(), dur, lengths, K)  # computed in float64: the full path casts
    capped = (cum, trans, torch.randn(12, 3), lengths, 12)  # K = 12 > T = 9: the full path drops rows
    for args in (mixed, capped):
        want = semicrf_dispatch.TREE.dispatch(semicrf_call("partition", *args, "log", None, None, True))
        assert all(torch.equal(semicrf_dispatch.semi_crf_streaming_forward(*args), want) for _ in range(2))
    now = [key for key, found in semicrf_dispatch.PARTITION.cache.items() if found[2] is None]
    assert len(now) == len(declined) + 2


def test_a_workspace_is_kept_per_name_and_grown_scratch_is_poisoned_afresh_state_is_not(monkeypatch):
    """``alloc.Workspaces``: one buffer per (name, dtype, device, stream), kept while large enough and replaced by
    a larger one; inside ``alloc.poisoned`` scratch is a fresh poisoned buffer at every call (a kernel that read it
    before writing it would see NaN, not the last call's values), while state (``zeroed``) stays the kept buffer;
    scratch over ``KEEP_BYTES`` is a fresh buffer at every call; another thread gets buffers of its own."""
    from provable_kernels import alloc

    monkeypatch.setattr(alloc, "_KEPT", {})
    cpu = torch.device("cpu")

    def one(name: str, numel: int, dtype: torch.dtype = torch.float32, zeroed: bool = False) -> torch.Tensor:
        (buffer,) = alloc.Workspaces(cpu, (name, numel, dtype, zeroed))()
        return buffer

    first = one("a", 10)
    assert first.shape == (10,) and one("a", 4) is first
    assert one("a", 4, torch.float64) is not first and one("b", 4) is not first  # another dtype, another name
    grown = one("a", 11)
    assert grown.shape == (11,) and one("a", 10) is grown
    assert one("a", 0, torch.int32).shape == (1,)
    pair = alloc.Workspaces(cpu, ("a", 3, torch.float32, False), ("flags", 3, torch.int32, True))
    scratch, state = pair()
    assert scratch is grown and torch.equal(state, torch.zeros(3, dtype=torch.int32))
    state.fill_(5)
    grown.fill_(1.0)
    with alloc.poisoned():
        poisoned, kept = pair()
        assert poisoned is not grown and bool(poisoned.isnan().all()) and kept is state
        assert pair()[0] is not poisoned
    again = pair()
    assert again[0] is grown and again[1] is state
    alloc.drop_workspaces("flags")
    fresh = one("flags", 3, torch.int32, True)
    assert fresh is not state and not bool(fresh.any())
    assert one("a", 10) is grown  # other names stay
    elsewhere: list = []  # another thread (on the CPU threads, not streams, run launches side by side)
    thread = threading.Thread(target=lambda: elsewhere.append(one("a", 10)))
    thread.start()
    thread.join()
    assert elsewhere[0] is not grown and one("a", 10) is grown
    monkeypatch.setattr(alloc, "KEEP_BYTES", 40)  # scratch over it is allocated per call, and replaces nothing
    big = one("a", 11)
    assert big is not grown and one("a", 11) is not big and one("a", 10) is grown
    assert one("flags", 20, torch.int32, True) is one("flags", 20, torch.int32, True)  # state is always kept
