"""The public semi-CRF entry points: every argument rejects bad input with an error that names it; a few
accepted-input corners (int32 lengths, non-contiguous tensors, empty batch) on the PyTorch routes."""
from __future__ import annotations

import pytest
import torch

from provable_kernels.dispatch import recording
from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward, semi_crf_viterbi

B, T, K, C = 2, 4, 3, 2
NAN, INF = float("nan"), float("inf")


def valid_args(dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(B, T, C, generator=g, dtype=dtype)
    return dict(
        cum_scores=torch.cat([torch.zeros(B, 1, C, dtype=dtype), scores.cumsum(1)], 1),
        transition=torch.randn(C, C, generator=g, dtype=dtype),
        duration_bias=torch.randn(K, C, generator=g, dtype=dtype),
        lengths=torch.tensor([T, 2]),
        K=K,
        proj_start=torch.randn(B, T, C, generator=g, dtype=dtype),
        proj_end=torch.randn(B, T, C, generator=g, dtype=dtype),
        use_triton=False,
    )


def forward(**args):
    return semi_crf_streaming_forward(**args)


def viterbi(**args):
    args.pop("semiring", None)
    return semi_crf_viterbi(**args)


ENTRIES = {"streaming_forward": forward, "viterbi": viterbi}


def with_value(tensor: torch.Tensor, index, value) -> torch.Tensor:
    out = tensor.clone()
    out[index] = value
    return out


def meta(x: torch.Tensor) -> torch.Tensor:
    """The same tensor on the meta device: a device mismatch testable without a GPU."""
    return torch.empty_like(x, device="meta")


f64 = valid_args()

# (argument, bad value, expected exception)
BAD = [
    ("cum_scores", f64["cum_scores"].tolist(), TypeError),
    ("cum_scores", f64["cum_scores"][0], ValueError),  # rank 2
    ("cum_scores", f64["cum_scores"][None], ValueError),  # rank 4
    ("cum_scores", f64["cum_scores"].long(), TypeError),
    ("cum_scores", f64["cum_scores"].bool(), TypeError),
    ("cum_scores", f64["cum_scores"][:, :1], ValueError),  # T = 0
    ("cum_scores", f64["cum_scores"][:, :, :0], ValueError),  # C = 0
    ("cum_scores", with_value(f64["cum_scores"], (0, 2, 1), NAN), ValueError),
    ("cum_scores", with_value(f64["cum_scores"], (1, 1, 0), INF), ValueError),
    ("cum_scores", with_value(f64["cum_scores"], (1, 1, 0), -INF), ValueError),
    ("transition", f64["transition"].tolist(), TypeError),
    ("transition", f64["transition"].long(), TypeError),
    ("transition", f64["transition"][0], ValueError),  # rank 1
    ("transition", f64["transition"][None, None], ValueError),  # rank 4
    ("transition", torch.zeros(C + 1, C, dtype=torch.float64), ValueError),
    ("transition", torch.zeros(K + 1, C, C, dtype=torch.float64), ValueError),
    ("transition", torch.zeros(K, C, C + 1, dtype=torch.float64), ValueError),
    ("transition", with_value(f64["transition"], (0, 1), NAN), ValueError),
    ("transition", with_value(f64["transition"], (0, 1), INF), ValueError),
    ("transition", meta(f64["transition"]), ValueError),
    ("duration_bias", None, TypeError),
    ("duration_bias", f64["duration_bias"].long(), TypeError),
    ("duration_bias", f64["duration_bias"][0], ValueError),
    ("duration_bias", torch.zeros(K + 1, C, dtype=torch.float64), ValueError),
    ("duration_bias", torch.zeros(K, C + 1, dtype=torch.float64), ValueError),
    ("duration_bias", with_value(f64["duration_bias"], (2, 0), NAN), ValueError),
    ("duration_bias", with_value(f64["duration_bias"], (2, 0), INF), ValueError),
    ("duration_bias", meta(f64["duration_bias"]), ValueError),
    ("lengths", [T, 2], TypeError),
    ("lengths", torch.tensor([4.0, 2.0]), TypeError),
    ("lengths", torch.tensor([True, True]), TypeError),
    ("lengths", torch.tensor([[T, 2]]), ValueError),  # rank 2
    ("lengths", torch.tensor([T, 2, 1]), ValueError),  # B + 1 entries
    ("lengths", torch.tensor([T, 0]), ValueError),
    ("lengths", torch.tensor([T + 1, 2]), ValueError),
    ("lengths", torch.tensor([-1, 2]), ValueError),
    ("lengths", meta(f64["lengths"]), ValueError),
    ("K", 0, ValueError),
    ("K", -2, ValueError),
    ("K", 3.0, TypeError),
    ("K", "3", TypeError),
    ("K", True, TypeError),
    ("K", None, TypeError),
    ("K", 2, ValueError),  # duration_bias (K, C) no longer matches: its message names duration_bias
    ("proj_start", f64["proj_start"].tolist(), TypeError),
    ("proj_start", f64["proj_start"].int(), TypeError),
    ("proj_start", f64["proj_start"][0], ValueError),
    ("proj_start", torch.zeros(B, T + 1, C, dtype=torch.float64), ValueError),
    ("proj_start", with_value(f64["proj_start"], (1, 3, 1), NAN), ValueError),
    ("proj_start", with_value(f64["proj_start"], (1, 3, 1), INF), ValueError),
    ("proj_start", meta(f64["proj_start"]), ValueError),
    ("proj_end", 0.0, TypeError),
    ("proj_end", f64["proj_end"].long(), TypeError),
    ("proj_end", f64["proj_end"][None], ValueError),
    ("proj_end", torch.zeros(B, T, C + 1, dtype=torch.float64), ValueError),
    ("proj_end", with_value(f64["proj_end"], (0, 0, 0), INF), ValueError),
    ("proj_end", meta(f64["proj_end"]), ValueError),
    ("use_triton", 1, TypeError),
    ("use_triton", "no", TypeError),
    ("use_triton", None, TypeError),
]


def named(argument: str, value) -> str:
    """The argument the error message must name (a K that mismatches duration_bias is reported there)."""
    return "duration_bias" if argument == "K" and value == 2 else argument


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("argument, value, error", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_bad_argument_raises_naming_it(entry, argument, value, error):
    """Every wrong argument raises ValueError/TypeError naming it."""
    args = valid_args() | {argument: value}
    with pytest.raises(error) as caught:
        ENTRIES[entry](**args)
    assert str(caught.value).startswith(named(argument, value)), str(caught.value)


@pytest.mark.parametrize("semiring, error", [("sum", ValueError), ("LOG", ValueError), (None, ValueError),
                                             (1, ValueError)])
def test_bad_semiring_raises_naming_it(semiring, error):
    with pytest.raises(error, match="^semiring"):
        semi_crf_streaming_forward(**valid_args(), semiring=semiring)


def test_valid_arguments_pass_on_both_entries():
    with recording() as taken:
        value = forward(**valid_args())
        result = viterbi(**valid_args())
    assert taken == ["semicrf.torch.log.infer", "semicrf.torch.viterbi"]
    assert value.shape == (B,) and torch.isfinite(value).all() and result.scores.shape == (B,)


def test_int32_lengths_and_non_contiguous_inputs_give_the_same_result():
    args = valid_args()
    expected = forward(**args)
    strided = {name: args[name].transpose(-1, -2).contiguous().transpose(-1, -2)
               for name in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")}
    assert not strided["cum_scores"].is_contiguous()
    got = forward(**(args | strided | {"lengths": args["lengths"].int()}))
    assert torch.equal(got, expected)


def test_empty_batch():
    args = valid_args()
    empty = {name: args[name][:0] for name in ("cum_scores", "lengths", "proj_start", "proj_end")}
    cum = args["cum_scores"][:0].requires_grad_()
    value = forward(**(args | empty | {"cum_scores": cum}))
    assert value.shape == (0,)
    value.sum().backward()
    assert cum.grad.shape == cum.shape
    assert viterbi(**(args | empty)).segments == []


@pytest.mark.parametrize("use_triton", [True, False])
def test_per_position_scores_as_cum_scores_blame_cum_scores_first(use_triton):
    """Per-position scores (B, T, C) passed as cum_scores with lengths = T: lengths reach cum_scores.shape[1] and
    the first row is not zero. The error names cum_scores and shows the fix before it blames lengths; lengths out
    of range with a real zero row keep the lengths error."""
    B, T, K, C = 2, 6, 3, 2
    scores = torch.randn(B, T, C, dtype=torch.float64)
    trans, dur = torch.randn(C, C, dtype=torch.float64), torch.randn(K, C, dtype=torch.float64)
    full = torch.tensor([T, T - 2])
    with pytest.raises(ValueError, match=r"^cum_scores looks like per-position scores \(B, T, C\).*shape\[1\] = 6; "
                       r"pass torch\.cat\(\[zeros\(B, 1, C\), scores\.cumsum\(1\)\], 1\)$"):
        semi_crf_streaming_forward(scores, trans, dur, full, K, use_triton=use_triton)
    cum = torch.cat([torch.zeros(B, 1, C, dtype=torch.float64), scores.cumsum(1)], 1)
    with pytest.raises(ValueError, match=r"^lengths must lie in 1\.\.6, got min 4, max 7$"):
        semi_crf_streaming_forward(cum, trans, dur, torch.tensor([T + 1, T - 2]), K, use_triton=use_triton)


@pytest.mark.parametrize("use_triton", [True, False])
def test_cumsum_without_the_zero_row_is_an_error_not_a_number(use_triton):
    """The README's convention is cum_scores[:, 0] = 0; passing scores.cumsum(1) itself (lengths <= T - 1) used to
    give a wrong logZ silently. Host mode: the named error; device mode: NaN (the Triton kernels check each sequence
    and poison only the bad one; the PyTorch route's fused flag poisons the batch)."""
    from provable_kernels import validate

    B, T, K, C = 2, 6, 3, 2
    scores = torch.randn(B, T, C, dtype=torch.float64)
    trans, dur, lengths = torch.randn(C, C, dtype=torch.float64), torch.randn(K, C, dtype=torch.float64), \
        torch.tensor([5, 4])
    with pytest.raises(ValueError, match=r"^cum_scores\[:, 0\] must be 0"):
        semi_crf_streaming_forward(scores.cumsum(1), trans, dur, lengths, K, use_triton=use_triton)
    cum = torch.cat([torch.zeros(B, 1, C, dtype=torch.float64), scores.cumsum(1)], 1)[:, :T]
    cum[1] = scores[1].cumsum(0)  # sequence 1 lacks its zero row
    with validate.value_checks("device"):
        out = semi_crf_streaming_forward(cum, trans, dur, lengths, K, use_triton=use_triton)
    assert torch.isnan(out[1]) and bool(torch.isfinite(out[0])) == use_triton
