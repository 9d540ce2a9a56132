"""Exact semi-CRF backend on a pre-built edge tensor, for every semiring of :mod:`provable_kernels.semicrf.semiring`.

Edge layout (one meaning everywhere: :func:`edges_from_streaming`, :class:`SemiMarkov`, the oracle's
``all_scores_from_edges``):

    edge (B, T, K, C, C), log-space; edge[b, s, d-1, c_prev, c] = score of the segment [s, s+d) with label c,
    entered from a segment labelled c_prev (its transition included). Durations d = 1..K, K inclusive.

A segmentation ((s_0, d_0, c_0), (s_1, d_1, c_1), ...) scores ``Σ_i edge[s_i, d_i-1, c_{i-1}, c_i]`` with
``c_{-1} = 0``: the first segment (s = 0) reads row ``c_prev = 0``, a virtual start state; the other rows at
s = 0 are never read. Entries with s+d > T are -inf in :func:`edges_from_streaming`; entries with s+d > L_b are
never read for sequence b. Memory is O(B T K C²): use the streaming API for anything but small problems.

The methods of :class:`SemiMarkov` dispatch on :data:`EXACT_TREE` (method, then semiring): one route per semiring
for ``logpartition`` and one per semiring for ``marginals``, recorded like every route.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from provable_kernels import validate
from provable_kernels.semicrf.call import check_scores
from provable_kernels.dispatch import Branch, Condition, Route, Tree
from provable_kernels.semicrf.semiring import Counting, CrossEntropy, Entropy, KLDivergence, KMax, Log, Max, Semiring

Edge = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def edges_from_streaming(
    cum_scores: torch.Tensor,
    transition: torch.Tensor,
    duration_bias: torch.Tensor,
    K: int,
    proj_start: Optional[torch.Tensor] = None,
    proj_end: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The edge tensor (B, T, K, C, C) of the streaming parameters: ``cum_scores`` (B, T+1, C), ``transition``
    (C, C) or (K, C, C), ``duration_bias`` (K, C), ``proj_start`` / ``proj_end`` (B, T, C) or None, ``K`` int
    (same convention as ``semi_crf_streaming_forward``; float16/bfloat16/float32/float64 arguments). Returns the
    compute dtype (float64 when any argument is float64, else float32); differentiable.

    ``edge[b, s, d-1, c_prev, c] = cum[s+d, c] - cum[s, c] + duration_bias[d-1, c] + proj_start[s, c]
    + proj_end[s+d-1, c] + trans(d)[c_prev, c]``, without the transition at s = 0 (every row there holds the
    transition-free score; :class:`SemiMarkov` reads row 0). -inf where s+d > T.
    """
    cum_scores = validate.tensor("cum_scores", cum_scores, ndim=3, dtypes=validate.FLOAT_DTYPES)
    B, T = cum_scores.shape[0], cum_scores.shape[1] - 1
    full = torch.full((B,), T, dtype=torch.int64, device=cum_scores.device)
    call = check_scores(cum_scores, transition, duration_bias, full, K, proj_start, proj_end)
    device, K = cum_scores.device, call.K
    start = torch.arange(T, device=device)[:, None]  # (T, 1)
    end = start + torch.arange(1, K + 1, device=device)  # (T, K): s + d
    inside = end <= T
    end = end.clamp(max=T)
    cum = call.cum_scores
    segment = cum[:, end] - cum[:, start] + call.duration_bias  # (B, T, K, C)
    if call.proj_start is not None:
        segment = segment + call.proj_start[:, :, None]
    if call.proj_end is not None:
        segment = segment + call.proj_end[:, end - 1]
    segment = torch.where(inside[..., None], segment, torch.full_like(segment, -math.inf))
    trans = call.transition if call.transition.dim() == 3 else call.transition.expand(K, -1, -1)  # (K, C, C)
    edge = segment[..., None, :] + trans  # (B, T, K, C, C)
    first = segment[:, :1, :, None, :].expand(-1, -1, -1, call.C, -1)
    return validate.poison(call.ok, torch.cat([first, edge[:, 1:]], dim=1))


def _edge(name: str, edge: object) -> torch.Tensor:
    edge = validate.tensor(name, edge, ndim=5, dtypes=validate.FLOAT_DTYPES)
    B, T, K, C, C2 = edge.shape
    if C2 != C or min(T, K, C) < 1:
        raise ValueError(f"{name} must have shape (B, T, K, C, C) with T, K, C >= 1, got {tuple(edge.shape)}")
    return edge


SEMIRING_KINDS = (("log", Log), ("max", Max), ("counting", Counting), ("entropy", Entropy),
                  ("cross_entropy", CrossEntropy), ("kl_divergence", KLDivergence), ("kmax", KMax))
MARGINAL_KINDS = ("log", "max")


def semiring_kind(semiring: Semiring) -> str:
    """The name of ``semiring``'s kind (its class or a subclass of it) in :data:`SEMIRING_KINDS`; TypeError
    naming ``semiring`` for any other."""
    for name, kind in SEMIRING_KINDS:
        if isinstance(semiring, kind):
            return name
    raise TypeError(f"semiring must be one of {', '.join(k.__name__ for _, k in SEMIRING_KINDS)} (an instance), "
                    f"got {semiring!r}")


@dataclass(frozen=True)
class ExactCall:
    """A validated call of :class:`SemiMarkov`: the ``method`` (``logpartition`` or ``marginals``), the
    ``semiring``, the ``edge`` tensor (a pair for cross-entropy and KL) and ``lengths`` (B,) int64."""

    method: str
    semiring: Semiring
    edge: Edge
    lengths: torch.Tensor


def ask_method(call: ExactCall) -> str:
    """The method: ``logpartition`` (⊕ over segmentations) or ``marginals`` (its gradient w.r.t. the edges)."""
    return call.method


def ask_semiring(call: ExactCall) -> str:
    """The kind of the semiring (:data:`SEMIRING_KINDS`: log, max, counting, entropy, cross_entropy,
    kl_divergence, kmax)."""
    return semiring_kind(call.semiring)


def scan(call: ExactCall) -> torch.Tensor:
    """The forward scan in the call's semiring: alpha[0] = one on the virtual start row 0; alpha[t, c] =
    ⊕_{d, c_prev} alpha[t-d, c_prev] ⊗ edge[t-d, d-1, c_prev, c]; result ⊕_c alpha[L_b, c]. (B,), or (k, B)."""
    sr, lengths = call.semiring, call.lengths
    x = sr.convert(call.edge)  # (S, B, T, K, C, C)
    B, T, K, C = x.shape[1:5]
    start = torch.cat([sr.one((B, 1), x), sr.zero((B, C - 1), x)], dim=-1)  # (S, B, C)
    alphas = [start]
    for t in range(1, T + 1):
        n = min(K, t)
        durations = torch.arange(n, device=x.device)  # d - 1
        previous = torch.stack(alphas[t - n:][::-1], dim=2)  # (S, B, n, C): alpha[t-d] for d = 1..n
        step = sr.mul(previous.unsqueeze(-1), x[:, :, t - 1 - durations, durations])  # (S, B, n, C, C)
        alphas.append(sr.sum(step, dim=(1, 2)))
    final = torch.stack(alphas, dim=2)[:, torch.arange(B, device=x.device), lengths]  # (S, B, C)
    return sr.unconvert(sr.sum(final, dim=1))


def gradient_of_scan(call: ExactCall) -> torch.Tensor:
    """d logpartition / d edge by autograd through :func:`scan` (a detached leaf copy of the edge)."""
    with torch.enable_grad():
        leaf = call.edge.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(scan(ExactCall("logpartition", call.semiring, leaf, call.lengths)).sum(),
                                      leaf)
    return grad


METHOD = Condition("method", ask_method, ("logpartition", "marginals"))
SEMIRING = Condition("semiring", ask_semiring, tuple(name for name, _ in SEMIRING_KINDS))
MARGINAL_SEMIRING = Condition("semiring (marginals)", ask_semiring, MARGINAL_KINDS)
EXACT_TREE = Tree("SemiMarkov", Branch(METHOD, {
    "logpartition": Branch(SEMIRING, {name: Route(f"semicrf.exact.{name}", scan) for name, _ in SEMIRING_KINDS}),
    "marginals": Branch(MARGINAL_SEMIRING, {name: Route(f"semicrf.exact.marginals.{name}", gradient_of_scan)
                                            for name in MARGINAL_KINDS}),
}))


class SemiMarkov:
    """Exact semi-Markov CRF on edges (see the module docstring for the layout), over one semiring.

    ``SemiMarkov(Log()).logpartition(edge, lengths)`` is log Z (B,); ``Max()`` the best score; ``KMax(k)`` the k
    best (k, B); ``Entropy()`` H(p); ``Counting()`` takes real weights (e.g. ``edge.exp()``);
    ``CrossEntropy()`` / ``KLDivergence()`` take ``edge=(edge_p, edge_q)``. As in torch-struct, the semiring may
    be given as the class itself: ``SemiMarkov(LogSemiring)`` (``KMaxSemiring`` needs ``k``: an instance).

    ``edge`` (B, T, K, C, C) float32/float64 (a pair of them for CrossEntropy / KLDivergence), ``lengths`` (B,)
    int32/int64 in 1..T; results in the dtype of ``edge``.
    """

    def __init__(self, semiring: Union[Semiring, type]):
        if isinstance(semiring, type) and issubclass(semiring, Semiring):
            if semiring is KMax:
                raise TypeError("semiring: KMax needs k: pass an instance such as KMaxSemiring(3)")
            semiring = semiring()  # the class itself, as torch-struct and the original library write it
        if not isinstance(semiring, Semiring):
            raise TypeError(f"semiring must be a Semiring class or instance such as LogSemiring, Log() or KMax(3), "
                            f"got {semiring!r}")
        self.semiring = semiring

    def _validate(self, edge: Edge, lengths: object) -> tuple[Edge, torch.Tensor]:
        log_space = self.semiring.log_space
        if self.semiring.pair:
            if not isinstance(edge, (tuple, list)) or len(edge) != 2:
                raise TypeError(f"edge must be a pair (edge_p, edge_q) for {self.semiring!r}, "
                                f"got {type(edge).__name__}")
            first = _edge("edge[0]", edge[0])
            second = _edge("edge[1]", edge[1])
            validate.tensor("edge[1]", second, dtypes=(first.dtype,), device=first.device)
            validate.shape("edge[1]", second, first.shape, "like edge[0]")
            edge, named = (first, second), (("edge[0]", first), ("edge[1]", second))
        else:
            first = edge = _edge("edge", edge)
            named = (("edge", first),)
        B, T = first.shape[:2]
        validate.shape("lengths", validate.tensor("lengths", lengths, ndim=1, dtypes=(torch.int32, torch.int64),
                                                  device=first.device), (B,), "(B,)")  # metadata before values
        for name, x in named:
            validate.finite(name, x, allow_neg_inf=log_space)
        return edge, validate.lengths("lengths", lengths, B, T, first.device).long()

    def logpartition(self, edge: Edge, lengths: torch.Tensor) -> torch.Tensor:
        """⊕ over the segmentations of [0, L_b) of the ⊗ of their edges: (B,), or (k, B) for KMax(k), in the dtype
        of ``edge`` (B, T, K, C, C) float32/float64 (a pair for CrossEntropy / KLDivergence); ``lengths`` (B,)
        int32/int64 in 1..T.

        alpha[0] = one on the virtual start row 0; alpha[t, c] = ⊕_{d, c_prev} alpha[t-d, c_prev] ⊗
        edge[t-d, d-1, c_prev, c]; result ⊕_c alpha[L_b, c]. Differentiable.
        """
        semiring_kind(self.semiring)
        return EXACT_TREE.dispatch(ExactCall("logpartition", self.semiring, *self._validate(edge, lengths)))

    def marginals(self, edge: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """d logpartition / d edge: same shape (B, T, K, C, C) and dtype as ``edge`` (float32/float64), ``lengths``
        (B,) int32/int64 in 1..T (not differentiable itself).

        Log: P(segment [s, s+d) with label c entered from c_prev) (at s = 0 only row 0 is non-zero); a sequence
        with no allowed segmentation (log Z = -inf) gets zeros. Max: the indicator of the best segmentation when
        it is unique. Between exactly tied best segmentations it is not an indicator: every max splits its
        gradient evenly between tied terms (``Max.sum``), which gives a convex combination of the tied
        segmentations' indicators (fractional entries).
        """
        if not isinstance(self.semiring, (Log, Max)):
            raise ValueError(f"semiring must be Log or Max for marginals, got {self.semiring!r}")
        return EXACT_TREE.dispatch(ExactCall("marginals", self.semiring, *self._validate(edge, lengths)))
