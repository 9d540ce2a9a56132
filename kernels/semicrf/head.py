"""``SemiMarkovCRFHead``: a semi-Markov CRF output layer (projection, partition, loss, decode).

Per-position label scores (from ``hidden`` through an optional Linear projection) become ``cum_scores`` by a zero
row and a cumulative sum, in float64 when the scores are float64 and in float32 otherwise; the head's
``transition`` (C, C) or (K, C, C) and ``duration_bias`` (K, C) complete the model (conventions: the site page
"Semi-CRF conventions" and :mod:`provable_kernels.semicrf.call`).
Two backends compute the same model: ``"streaming"`` (``semi_crf_streaming_forward``: O(K C) state, Triton on
GPU; log and max semirings) and ``"exact"`` (``edges_from_streaming`` + ``SemiMarkov``: builds the
(B, T, K, C, C) edge tensor; every semiring).

Semiring names: ``"log"`` (log Z), ``"max"`` (best score), ``"entropy"`` (entropy of the model's distribution
over segmentations), ``"counting"`` (number of segmentations with a finite score, i.e. allowed by the -inf
entries of ``transition`` / ``duration_bias``; not differentiable), ``"kmax:k"`` (the k best scores, (k, B)).

The head's decisions are data: :data:`HEAD_TREE` (method, backend, semiring), evaluated by ``forward``,
``compute_loss`` and ``decode`` and recorded by :func:`provable_kernels.dispatch.recording` like the streaming
tree; its routes call the streaming API or the exact backend, which dispatch on their own trees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from provable_kernels import validate
from provable_kernels.dispatch import Branch, Condition, Route, Tree
from provable_kernels.semicrf.dispatch import semi_crf_streaming_forward, semi_crf_viterbi
from provable_kernels.semicrf.exact import SemiMarkov, edges_from_streaming
from provable_kernels.semicrf.scoring import check_segmentation, label_starts, segmentation_score
from provable_kernels.semicrf.structures import ViterbiResult
from provable_kernels.semicrf.semiring import Counting, Entropy, KMax, Log, Max, Semiring

DEFAULT_EXACT_MAX_BYTES = 256 * 2**20  # 256 MiB
STREAMING_SEMIRINGS = ("log", "max")
HIDDEN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
EXACT_SEMIRINGS = ("log", "max", "entropy", "counting", "kmax")


def parse_semiring(name: object) -> Semiring:
    """``"log"``, ``"max"``, ``"entropy"``, ``"counting"`` or ``"kmax:k"`` (k >= 1) to a semiring."""
    fixed = {"log": Log, "max": Max, "entropy": Entropy, "counting": Counting}
    if isinstance(name, str) and name in fixed:
        return fixed[name]()
    if isinstance(name, str) and name.startswith("kmax:") and name[5:].isdigit() and int(name[5:]) >= 1:
        return KMax(int(name[5:]))
    raise ValueError(f"semiring must be one of {list(fixed)} or 'kmax:k' with an integer k >= 1, got {name!r}")


@dataclass(frozen=True)
class HeadCall:
    """A validated call of a head method, what every head route receives: ``method`` (``forward``,
    ``compute_loss``, ``decode``), the ``head``, its streaming ``inputs`` ``(cum_scores, transition,
    duration_bias, lengths)``, the ``backend`` asked for (``auto``, ``streaming``, ``exact``) and the ``semiring``
    name (``log`` for the loss and ``max`` for decode); for ``compute_loss`` the score (B,) of the validated gold
    segmentation."""

    method: str
    head: "SemiMarkovCRFHead"
    inputs: tuple
    backend: str
    semiring: str
    gold: Optional[torch.Tensor] = None

    def edge_bytes(self) -> int:
        """Bytes of the exact backend's edge tensor: semiring channels x B x T x K x C x C x itemsize."""
        cum_scores = self.inputs[0]
        B, T1, C = cum_scores.shape
        channels = parse_semiring(self.semiring).size
        return channels * B * (T1 - 1) * self.head.max_duration * C * C * cum_scores.element_size()


def ask_method(call: HeadCall) -> str:
    """Which method: ``forward`` (the partition under a semiring), ``compute_loss`` (NLL of the gold segmentation)
    or ``decode`` (the best segmentation)."""
    return call.method


def ask_backend(call: HeadCall) -> str:
    """The backend the caller names; ``backend="auto"`` takes ``streaming`` for the log and max semirings (O(K C)
    state) and ``exact`` for the others. The exact backend is refused with a ValueError naming ``exact_max_bytes``
    when its edge tensor would exceed the head's ``exact_max_bytes`` (default ``DEFAULT_EXACT_MAX_BYTES``,
    256 MiB): never an attempt to allocate it."""
    backend = call.backend
    if backend == "auto":
        backend = "streaming" if call.semiring in STREAMING_SEMIRINGS else "exact"
    if backend == "exact" and call.edge_bytes() > call.head.exact_max_bytes:
        raise ValueError(
            f"exact_max_bytes = {call.head.exact_max_bytes} is below the {call.edge_bytes()}-byte edge tensor "
            f"(channels x B x T x K x C x C x itemsize) that the exact backend needs for semiring "
            f"{call.semiring!r}; use backend='streaming' (log, max), smaller inputs, or a larger exact_max_bytes")
    return backend


def ask_streaming_semiring(call: HeadCall) -> str:
    """The semiring, ``log`` or ``max``: the only two the streaming API computes."""
    return call.semiring


def ask_exact_semiring(call: HeadCall) -> str:
    """The semiring: ``log``, ``max``, ``entropy``, ``counting`` or ``kmax`` (``kmax:k`` for every k)."""
    return call.semiring.partition(":")[0]


def streaming_partition(call: HeadCall) -> torch.Tensor:
    """``semi_crf_streaming_forward`` on the head's scores (log or max semiring), (B,)."""
    return semi_crf_streaming_forward(*call.inputs, call.head.max_duration, call.semiring,
                                      use_triton=call.head.use_triton)


def exact_partition(call: HeadCall) -> torch.Tensor:
    """``edges_from_streaming`` then ``SemiMarkov(semiring).logpartition`` (counting: on the 0/1 weights of the
    allowed edges): (B,), or (k, B) for ``kmax:k``."""
    cum_scores, transition, duration_bias, lengths = call.inputs
    semiring = parse_semiring(call.semiring)
    edge = edges_from_streaming(cum_scores, transition, duration_bias, call.head.max_duration)
    if isinstance(semiring, Counting):
        edge = (edge.detach() > -math.inf).to(edge.dtype)
    return SemiMarkov(semiring).logpartition(edge, lengths)


def streaming_loss(call: HeadCall) -> torch.Tensor:
    """NLL (B,) = log Z - score(gold): log Z from the streaming API (its hand-written backward)."""
    return streaming_partition(call) - call.gold


def exact_loss(call: HeadCall) -> torch.Tensor:
    """NLL (B,) = log Z - score(gold): log Z from the exact backend (autograd through the edge tensor)."""
    return exact_partition(call) - call.gold


def viterbi_decode(call: HeadCall) -> ViterbiResult:
    """``semi_crf_viterbi`` on the head's scores: the best score (B,) and its segments; no gradient."""
    return semi_crf_viterbi(*call.inputs, call.head.max_duration, use_triton=call.head.use_triton)


METHOD = Condition("method", ask_method, ("forward", "compute_loss", "decode"))
BACKEND = Condition("backend", ask_backend, ("streaming", "exact"))
STREAMING_SEMIRING = Condition("semiring (streaming)", ask_streaming_semiring, STREAMING_SEMIRINGS)
EXACT_SEMIRING = Condition("semiring (exact)", ask_exact_semiring, EXACT_SEMIRINGS)

HEAD_TREE = Tree(
    "SemiMarkovCRFHead",
    Branch(METHOD, {
        "forward": Branch(BACKEND, {
            "streaming": Branch(STREAMING_SEMIRING, {s: Route(f"semicrf.head.streaming.{s}", streaming_partition)
                                                     for s in STREAMING_SEMIRINGS}),
            "exact": Branch(EXACT_SEMIRING, {s: Route(f"semicrf.head.exact.{s}", exact_partition)
                                             for s in EXACT_SEMIRINGS}),
        }),
        "compute_loss": Branch(BACKEND, {"streaming": Route("semicrf.head.streaming.loss", streaming_loss),
                                         "exact": Route("semicrf.head.exact.loss", exact_loss)}),
        "decode": Route("semicrf.head.decode", viterbi_decode),
    }),
)


class SemiMarkovCRFHead(nn.Module):
    """Semi-Markov CRF head over ``num_classes`` labels and durations 1..``max_duration`` (inclusive).

    ``hidden_dim``: when given, a Linear(hidden_dim, C) maps hidden states to label scores; otherwise ``hidden``
    already holds C label scores per position. ``transition="static"`` learns a (C, C) transition
    ``[src, dst]``, ``"duration"`` a (K, C, C) one indexed by the duration of the entered segment. Both
    ``transition`` and ``duration_bias`` start at zero. ``exact_max_bytes`` caps the edge tensor of the exact
    backend (semiring channels x B x T x K x C x C x itemsize); a larger one is a ValueError, never an attempt.
    ``use_triton`` is passed to the streaming API and Viterbi (False: always the PyTorch recursion).
    """

    def __init__(
        self,
        num_classes: int,
        max_duration: int,
        hidden_dim: Optional[int] = None,
        *,
        transition: str = "static",
        exact_max_bytes: int = DEFAULT_EXACT_MAX_BYTES,
        use_triton: bool = True,
    ):
        super().__init__()
        C = validate.positive_int("num_classes", num_classes)
        K = validate.positive_int("max_duration", max_duration)
        self.transition_kind = validate.choice("transition", transition, ("static", "duration"))
        self.exact_max_bytes = validate.positive_int("exact_max_bytes", exact_max_bytes)
        if not isinstance(use_triton, bool):  # verify: unreached (constructor argument)
            raise TypeError(f"use_triton must be a bool, got {type(use_triton).__name__}")
        self.use_triton = use_triton
        self.num_classes, self.max_duration = C, K
        self.transition = nn.Parameter(torch.zeros((C, C) if transition == "static" else (K, C, C)))
        self.duration_bias = nn.Parameter(torch.zeros(K, C))
        self.projection = None if hidden_dim is None else nn.Linear(validate.positive_int("hidden_dim", hidden_dim), C)

    def extra_repr(self) -> str:  # verify: unreached (printing the module)
        return (f"num_classes={self.num_classes}, max_duration={self.max_duration}, "
                f"transition={self.transition_kind!r}, exact_max_bytes={self.exact_max_bytes}, "
                f"use_triton={self.use_triton}")

    def streaming_inputs(self, hidden: torch.Tensor, lengths: torch.Tensor,
                         checks: Optional[validate.DataChecks] = None):
        """``(cum_scores (B, T+1, C), transition, duration_bias, lengths)`` for ``hidden`` (B, T, H) and ``lengths``
        (B,) int32/int64, validated with errors naming ``hidden`` / ``lengths``. ``cum_scores``, ``transition``
        and ``duration_bias`` are float64 when the label scores are float64, else float32 (float16 / bfloat16
        hidden states, e.g. under ``torch.autocast``, are computed in float32). Value checks join ``checks`` when
        given (else they run now; see the host-sync policy)."""
        device = self.duration_bias.device
        for name, parameter in self.named_parameters():  # a module split over devices: named, not a RuntimeError
            if parameter.device != device:  # verify: unreached (one device per module in verify; tests/test_semicrf_head.py)
                raise ValueError(f"{name} must be on {device} (the device of duration_bias), got {parameter.device}")
        hidden = validate.tensor("hidden", hidden, ndim=3, dtypes=HIDDEN_DTYPES, device=device)
        B, T, features = hidden.shape
        if self.projection is not None and not torch.is_autocast_enabled(device.type):
            validate.tensor("hidden", hidden, dtypes=(self.projection.weight.dtype,))
        expected = self.num_classes if self.projection is None else self.projection.in_features
        if T < 1 or features != expected:
            raise ValueError(f"hidden must have shape (B, T, {expected}) with T >= 1, got {tuple(hidden.shape)}")
        pending = checks if checks is not None else validate.DataChecks()
        lengths = validate.lengths("lengths", lengths, B, T, device, pending)
        scores = hidden if self.projection is None else self.projection(hidden)
        pending.finite("hidden" if self.projection is None else "hidden (label scores after the projection)", scores)
        if checks is None:  # verify: unreached (callers without a DataChecks of their own)
            pending.verify()
        dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
        scores = scores.to(dtype)
        cum_scores = torch.cat([scores.new_zeros(B, 1, self.num_classes), scores.cumsum(dim=1)], dim=1)
        return cum_scores, self.transition.to(dtype), self.duration_bias.to(dtype), lengths

    def _call(self, method: str, inputs: tuple, backend: str, semiring: str,
              gold: Optional[torch.Tensor] = None) -> HeadCall:
        """The :class:`HeadCall` of a method on validated ``inputs``, after checking ``backend`` and ``semiring``."""
        backend = validate.choice("backend", backend, ("auto", "streaming", "exact"))
        parse_semiring(semiring)
        if backend == "streaming" and semiring not in STREAMING_SEMIRINGS:
            raise ValueError(f"backend='streaming' supports semiring in {list(STREAMING_SEMIRINGS)}, got {semiring!r};"
                             f" use backend='exact' or 'auto'")
        return HeadCall(method, self, inputs, backend, semiring, gold)

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor, backend: str = "auto",
                semiring: str = "log") -> torch.Tensor:
        """Partition per sequence under ``semiring`` (see the module docstring): (B,), or (k, B) for ``"kmax:k"``,
        float32 (float64 when the label scores are float64). ``hidden`` (B, T, H) float16/bfloat16/float32/float64
        (H = hidden_dim, or C without a projection), ``lengths`` (B,) int32/int64 in 1..T.

        ``backend="auto"`` takes the streaming API for log / max and the exact backend otherwise (a ValueError
        when its edge tensor exceeds ``exact_max_bytes``).
        """
        checks = validate.DataChecks()
        inputs = self.streaming_inputs(hidden, lengths, checks)
        call = self._call("forward", inputs, backend, semiring)
        ok = checks.flag()
        return validate.poison(ok, HEAD_TREE.dispatch(call))

    def compute_loss(
        self,
        hidden: torch.Tensor,
        lengths: torch.Tensor,
        labels: torch.Tensor,
        starts: Optional[torch.Tensor] = None,
        reduction: str = "mean",
        backend: str = "auto",
    ) -> torch.Tensor:
        """Negative log-likelihood ``log Z - score(gold)`` of the gold segmentation.

        ``hidden`` (B, T, H) float16/bfloat16/float32/float64 and ``lengths`` (B,) int32/int64 in 1..T as for
        :meth:`forward`; ``labels`` (B, T) int64/int32 per position; ``starts`` (B, T) bool marks segment starts
        (None: a new segment wherever the label changes). ``reduction``: ``"mean"`` / ``"sum"`` over the batch (a
        0-d tensor; ``"mean"`` of an empty batch is a ValueError), or ``"none"`` (B,). float32 (float64 for
        float64 label scores); first-order differentiable (with ``backend="exact"``, second order too).
        The NLL is >= 0 up to rounding and ``exp(-NLL)`` sums to 1 over all segmentations; it is returned as
        computed, never clamped (a clamp would hide an unnormalised loss and zero its gradient).
        An invalid gold (run longer than K, labels changing inside a segment, labels outside 0..C-1) or a gold the
        model forbids (score -inf) is a ValueError naming ``labels`` / ``starts`` (NaN loss and gradients under
        device-mode value checks: CUDA, compile, capture; see the host-sync policy).
        """
        reduction = validate.choice("reduction", reduction, ("mean", "sum", "none"))
        if reduction == "mean" and isinstance(hidden, torch.Tensor) and hidden.dim() == 3 and hidden.shape[0] == 0:
            raise ValueError("hidden: reduction='mean' over an empty batch (B = 0) is undefined; use reduction='sum' "
                             "(0 for an empty batch) or 'none'")
        checks = validate.DataChecks()
        inputs = self.streaming_inputs(hidden, lengths, checks)
        cum_scores, transition, duration_bias, lengths = inputs
        B, T = cum_scores.shape[0], cum_scores.shape[1] - 1
        lengths = lengths.clamp(1, T)  # the gold is read in range even before the pending length check raises
        labels = validate.tensor("labels", labels, ndim=2, dtypes=(torch.int64, torch.int32), device=cum_scores.device)
        validate.shape("labels", labels, (B, T), "(B, T)")
        labels = labels.long()
        if starts is None:
            starts = label_starts(labels, lengths)
        starts = validate.tensor("starts", starts, ndim=2, dtypes=(torch.bool,), device=cum_scores.device)
        validate.shape("starts", starts, (B, T), "(B, T)")
        check_segmentation(checks, starts, labels, lengths, self.max_duration, self.num_classes)
        labels = labels.clamp(0, self.num_classes - 1)  # in range even where device-mode checks poison the loss
        gold = segmentation_score(cum_scores, transition, duration_bias, lengths, starts, labels)
        forbidden = gold == -math.inf
        checks.expect(~forbidden.any(), lambda: f"labels: the gold segmentation of sequence "
                      f"{int(forbidden.nonzero()[0])} has score -inf (it uses a transition or duration the model "
                      f"forbids)")
        call = self._call("compute_loss", inputs, backend, "log", gold)
        ok = checks.flag()
        nll = validate.poison(ok, HEAD_TREE.dispatch(call))
        return nll if reduction == "none" else getattr(nll, reduction)()

    @torch.no_grad()
    def decode(self, hidden: torch.Tensor, lengths: torch.Tensor) -> ViterbiResult:
        """Best segmentation per sequence (``semi_crf_viterbi``): a :class:`ViterbiResult` with ``scores`` (B,)
        float32 (float64 for float64 label scores) and ``segments[b]`` a list of
        :class:`~provable_kernels.semicrf.structures.Segment`; no gradient. ``hidden`` (B, T, H) and ``lengths``
        (B,) as for :meth:`forward`. Value errors are named (it reads results on the host anyway)."""
        checks = validate.DataChecks(at_sync_point=True)
        inputs = self.streaming_inputs(hidden, lengths, checks)
        checks.flag()
        return HEAD_TREE.dispatch(self._call("decode", inputs, "streaming", "max"))
