"""PyTorch backend of the streaming semi-CRF: the code behind the ``semicrf.torch.*`` routes.

The recursion of every streaming route (conventions in :mod:`provable_kernels.semicrf.call`), vectorised over batch,
durations and labels, with a Python loop over positions:

    alpha[t, c] = ⊕_{d=1..min(K,t)} in(t-d, d)[c] + seg(t-d, d, c),   in(0, d) = 0 (the first segment pays no
    in(s, d)[c] = ⊕_{c'} alpha[s, c'] + trans(d)[c', c]  (s > 0)       transition)
    seg(s, d, c) = cum[s+d, c] - cum[s, c] + dur[d-1, c] + ps[s, c] + pe[s+d-1, c]
    result[b]    = ⊕_c alpha[L_b, c]

with ⊕ = logsumexp (``semiring="log"``) or max. Edges are computed on the fly from ``cum_scores``; the live
state is a ring of the last K entries per sequence, O(K*C): in(s, ·) for 2-D transitions (it does not depend on
d), alpha[s] for 3-D ones. The backward is written by hand: the outside recursion

    beta[L, c] = 0,   beta[s, c'] = ⊕_{d, c: s+d <= L} trans(d)[c', c] + seg(s, d, c) + beta[s+d, c]

gives the segment marginals P(s, d, c', c) = exp(alpha[s, c'] + trans(d)[c', c] + seg(s, d, c) + beta[s+d, c]
- logZ) (s = 0: exp(seg + beta - logZ)), and from them every gradient.

Precision: inputs are upcast to float64, all arithmetic is float64, values and gradients are cast back to the
input dtype.

Guards: -inf transitions and duration biases are allowed; a ⊕ over only -inf terms is -inf, never NaN. A sequence
with no segmentation of finite score gets -inf and zero gradients; its Viterbi score is -inf with some valid
segmentation.

Memory per sequence, besides float64 copies of the inputs (O(T*C)), with L the longest length:

- :func:`partition`: O(K*C).
- :func:`forward_checkpointed` saves the ring every S = ceil(sqrt(L*K)) steps, ceil(L/S)*K*C floats;
  :func:`backward` recomputes alpha one interval at a time (S*C) next to the beta ring (K*C) and O(K*C*C)
  temporaries: O(sqrt(L*K)*C + K*C*C) in all.
- :func:`viterbi`: backpointers, the best duration and previous label per (t, c): 2*(T+1)*C int64.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

from provable_kernels import validate
from provable_kernels.semicrf.call import StreamingCall, pad_duration_rows, require_call
from provable_kernels.semicrf.structures import ViterbiPath

Reduce = Callable[..., Tensor]  # reduce(x, dim): the semiring sum ⊕ over dim(s)
REDUCE: dict[str, Reduce] = {"log": torch.logsumexp, "max": torch.amax}
NEG_INF = float("-inf")


class _Ring:
    """Per-position entries (B, C) of the last K positions. Entry s is stored twice, in slots s % K and
    s % K + K of a (B, 2K, C) buffer, so that any K consecutive entries are one slice."""

    def __init__(self, window: Tensor, first: int):
        """A ring holding ``window[:, i]`` (window (B, K, C)) as the entry of position ``first + i``."""
        self.K = window.shape[1]
        rolled = torch.roll(window, first % self.K, dims=1)
        self.buf = torch.cat([rolled, rolled], 1)

    def window(self, first: int) -> Tensor:
        """Entries of positions first .. first+K-1, (B, K, C): a view that later pushes overwrite."""
        i = first % self.K
        return self.buf[:, i : i + self.K]

    def push(self, s: int, entry: Tensor) -> None:
        """Store the entry of position s, replacing that of s - K (forward) or s + K (backward)."""
        i = s % self.K
        self.buf[:, i] = entry
        self.buf[:, i + self.K] = entry


class _Problem:
    """A call's tensors in float64, laid out for the recursion.

    ``K`` is min(call.K, T): longer segments cannot occur. A segment score splits into a start part
    ``start[:, s + K] = ps[s] - cum[s]`` (rows 0..K-1 pad s < 0, row T+K pads s = T), an end part
    ``end[:, e] = cum[e] + pe[e-1]`` (row 0 and rows T+1..T+K pad) and ``dur[d-1]``. Padding is 0; the -inf
    entries of the rings (alpha before 0, beta after L) mask it.
    """

    def __init__(self, call: StreamingCall):
        B, T, C = call.batch, call.T, call.C
        self.B, self.T, self.C, self.K = B, T, C, min(call.K, T)
        self.lengths: list[int] = call.lengths.tolist()
        self.L_max = max(self.lengths, default=0)
        cum = _float64(call.cum_scores)
        proj_start = cum.new_zeros(B, T, C) if call.proj_start is None else _float64(call.proj_start)
        proj_end = cum.new_zeros(B, T, C) if call.proj_end is None else _float64(call.proj_end)
        pad = cum.new_zeros(B, self.K, C)
        self.start = torch.cat([pad, proj_start - cum[:, :T], pad[:, :1]], 1)
        self.end = torch.cat([cum.new_zeros(B, 1, C), cum[:, 1:] + proj_end, pad], 1)
        self.dur = _float64(call.duration_bias)[: self.K]
        self.dur_by_w = self.dur.flip(0)
        trans = _float64(call.transition)
        self.trans_2d = trans if trans.dim() == 2 else None
        self.trans_by_d = trans.expand(self.K, C, C) if trans.dim() == 2 else trans[: self.K]  # (K, C', C)
        self.trans_by_w = self.trans_by_d.flip(0)
        finishing: dict[int, list[int]] = {}
        for b, L in enumerate(self.lengths):
            finishing.setdefault(L, []).append(b)
        self.finishing = {L: torch.tensor(bs, device=cum.device) for L, bs in finishing.items()}

    def ring(self) -> _Ring:
        """A ring of -inf entries: no segment ends before position 0."""
        return _Ring(self.start.new_full((self.B, self.K, self.C), NEG_INF), 0)

    def scores_ending(self, incoming: Tensor, t: int) -> Tensor:
        """in(s, d)[c] + seg(s, d, c) for the segments ending at t, (B, K, C) in window order w (s = t-K+w,
        d = K-w), from ``incoming`` = in(s, d) in the same order. The segment starting at 0 pays no transition."""
        seg = self.end[:, t, None] + self.start[:, t : t + self.K] + self.dur_by_w
        scores = incoming + seg
        if t <= self.K:
            scores[:, self.K - t] = seg[:, self.K - t]
        return scores

    def seg_starting(self, u: int) -> Tensor:
        """seg(u, d, c) for d = 1..K, (B, K, C); padding where u + d > T (masked by beta = -inf there)."""
        return self.start[:, u + self.K, None] + self.end[:, u + 1 : u + self.K + 1] + self.dur

    def entry(self, alpha: Tensor, reduce: Reduce) -> Tensor:
        """The ring entry of position s from alpha[s] (B, C): in(s) for 2-D transitions, alpha[s] for 3-D ones."""
        return alpha if self.trans_2d is None else reduce(alpha[:, :, None] + self.trans_2d, 1)

    def incoming(self, window: Tensor, reduce: Reduce) -> Tensor:
        """in(s, d) (B, K, C) for the ring window of s = t-K..t-1 (d = K..1)."""
        return window if self.trans_2d is not None else reduce(self.transitioned(window), 2)

    def transitioned(self, window: Tensor) -> Tensor:
        """alpha[s, c'] + trans(d)[c', c], (B, K, C', C), from the alpha window of s = t-K..t-1 (d = K..1)."""
        return window[..., None] + self.trans_by_w


def _float64(x: Tensor) -> Tensor:
    return x.detach().to(torch.float64)


def _alphas(x: _Problem, ring: _Ring, start: int, stop: int, reduce: Reduce) -> Iterator[tuple[int, Tensor]]:
    """alpha[t] (B, C) for t = start+1..stop. ``ring`` holds the entries of positions start-K+1..start and is
    advanced in place."""
    for t in range(start + 1, stop + 1):
        alpha = reduce(x.scores_ending(x.incoming(ring.window(t - x.K), reduce), t), 1)
        ring.push(t, x.entry(alpha, reduce))
        yield t, alpha


def _interval(x: _Problem) -> int:
    """Checkpoint spacing S = ceil(sqrt(L*K)): balances saved rings (L/S * K*C) against one interval (S*C)."""
    return max(1, math.ceil(math.sqrt(x.L_max * x.K)))


def _forward(x: _Problem, reduce: Reduce, every: Optional[int] = None) -> tuple[Tensor, list[Tensor]]:
    """⊕_c alpha[L_b, c] per sequence (float64), and, when ``every`` is given, copies of the ring window at
    positions 0, every, 2*every, ... < L_max (entries of t-K+1..t each)."""
    ring = x.ring()
    result = x.start.new_full((x.B,), NEG_INF)
    snapshots = [ring.window(1 - x.K).clone()] if every else []
    for t, alpha in _alphas(x, ring, 0, x.L_max, reduce):
        if t in x.finishing:
            done = x.finishing[t]
            result[done] = reduce(alpha[done], 1)
        if every and t % every == 0 and t < x.L_max:
            snapshots.append(ring.window(t + 1 - x.K).clone())
    return result, snapshots


def partition(call: StreamingCall) -> Tensor:
    """logZ (``call.semiring == "log"``) or the best score (``"max"``) per sequence, (B,) in the input dtype.
    No autograd graph."""
    call = require_call(call)
    result, _ = _forward(_Problem(call), REDUCE[call.semiring])
    return result.to(call.cum_scores.dtype)


def forward_checkpointed(call: StreamingCall) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """logZ (B,) in the input dtype, and what :func:`backward` needs: ``(logZ in float64 (B,), ring snapshots
    (ceil(L/S), B, K, C))`` with S = ceil(sqrt(L*K)), L the longest length, K = min(call.K, T)."""
    call = require_call(call, "log")
    x = _Problem(call)
    logZ, snapshots = _forward(x, torch.logsumexp, every=_interval(x))
    return logZ.to(call.cum_scores.dtype), (logZ, torch.stack(snapshots))


class _Outside:
    """The outside recursion, run from position L_max down to 0, accumulating segment marginals weighted by
    ``grad_logZ``: ``starts``/``ends`` (B, T+1, C) (a segment labelled c starts at / ends at t), ``trans``
    (K, C', C) and ``dur`` (K, C), summed over the batch in a fixed order."""

    def __init__(self, x: _Problem, logZ: Tensor, grad_logZ: Tensor):
        self.x = x
        possible = torch.isfinite(logZ)  # sequences with no finite segmentation get zero gradients
        self.weight = torch.where(possible, _float64(grad_logZ), 0.0)
        self.logZ = torch.where(possible, logZ, 0.0)
        self.beta = x.ring()
        self.starts = x.start.new_zeros(x.B, x.T + 1, x.C)
        self.ends = torch.zeros_like(self.starts)
        self.trans = x.start.new_zeros(x.K, x.C, x.C)
        self.dur = x.start.new_zeros(x.K, x.C)

    def marginal(self, log_score: Tensor) -> Tensor:
        """exp(log_score - logZ) * grad_logZ per sequence (batch first)."""
        shape = (-1,) + (1,) * (log_score.dim() - 1)
        return torch.exp(log_score - self.logZ.view(shape)) * self.weight.view(shape)

    def step(self, u: int, alpha: Optional[Tensor]) -> None:
        """Segments starting at u, given alpha[u] (B, C) (None at u = 0: the first segment, no transition)."""
        x = self.x
        outside = x.seg_starting(u) + self.beta.window(u + 1)  # seg(u, d, c) + beta[u+d, c], (B, K, C)
        if alpha is None:
            starting = self.marginal(outside)
        else:
            paths = x.trans_by_d + outside[:, :, None, :]  # trans(d)[c', c] + seg + beta, (B, K, C', C)
            beta = torch.logsumexp(paths, (1, 3))
            if u in x.finishing:
                beta[x.finishing[u]] = 0.0
            self.beta.push(u, beta)
            pairs = self.marginal(alpha[:, None, :, None] + paths)
            self.trans += pairs.sum(0)
            starting = pairs.sum(2)
            self.ends[:, u] = self.marginal(alpha + beta)
        self.dur += starting.sum(0)
        self.starts[:, u] = starting.sum(1)

    def gradients(self, call: StreamingCall) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
        """(g_cum, g_trans, g_dur, g_ps, g_pe) shaped like the call's tensors, in the input dtype."""
        dtype = call.cum_scores.dtype
        g_trans = self.trans.sum(0) if self.x.trans_2d is not None else pad_duration_rows(self.trans, call.K)
        # a sequence's rows past its length are +0.0, whatever its neighbours' lengths made the batch compute there
        # (zero times a negative weight is -0.0): batch invariance, bitwise
        position = torch.arange(self.x.T + 1, device=call.cum_scores.device)
        inside = position[None, :, None] <= call.lengths.to(position.device)[:, None, None]
        g_ps = self.starts[:, :-1] if call.proj_start is not None else None
        g_pe = self.ends[:, 1:] if call.proj_end is not None else None
        past = tuple(None if g is None else torch.where(inside[:, 1:], g, 0.0) for g in (g_ps, g_pe))
        grads = (torch.where(inside, self.ends - self.starts, 0.0), g_trans, pad_duration_rows(self.dur, call.K), *past)
        return tuple(None if g is None else g.to(dtype) for g in grads)  # type: ignore[return-value]


def backward(call: StreamingCall, saved: tuple[Tensor, Tensor], logZ: Tensor, grad_logZ: Tensor) -> tuple:
    """Gradients of sum_b grad_logZ[b] * logZ[b] w.r.t. (cum_scores, transition, duration_bias, proj_start,
    proj_end), None for an absent projection. Walks the checkpoint intervals in reverse, recomputing alpha in each
    from its snapshot, next to the outside recursion. Uses the float64 logZ in ``saved`` (``logZ``, the forward's
    output in the input dtype, is not precise enough for the marginals at large T)."""
    call = require_call(call, "log")
    validate.tensor("grad_logZ", grad_logZ, ndim=1, dtypes=validate.FLOAT_DTYPES, device=call.cum_scores.device)
    validate.shape("grad_logZ", grad_logZ, (call.batch,), "(B,)")
    x = _Problem(call)
    logZ64, snapshots = saved
    outside = _Outside(x, logZ64, grad_logZ)
    every = _interval(x)
    for j in reversed(range(len(snapshots))):
        first, last = j * every, min((j + 1) * every, x.L_max)
        alphas = [alpha for _, alpha in _alphas(x, _Ring(snapshots[j], first + 1 - x.K), first, last,
                                                torch.logsumexp)]
        for u in range(last, first, -1):
            outside.step(u, alphas[u - first - 1])
    outside.step(0, None)
    return outside.gradients(call)


def viterbi(call: StreamingCall) -> ViterbiPath:
    """The best segmentation per sequence. Max recursion over an alpha ring, keeping backpointers (best duration
    and previous label per (t, c), O(T*C)), then backtracking from the best final label. Ties: the shorter
    duration, then the smaller previous label (then the smaller final label)."""
    call = require_call(call)
    x = _Problem(call)
    device = call.cum_scores.device
    best_duration = torch.ones(x.B, x.T + 1, x.C, dtype=torch.int64, device=device)
    best_previous = torch.zeros_like(best_duration)
    scores = x.start.new_full((x.B,), NEG_INF)
    last_label = torch.zeros(x.B, dtype=torch.int64, device=device)
    ring = x.ring()
    for t in range(1, x.L_max + 1):
        incoming, previous = x.transitioned(ring.window(t - x.K)).max(dim=2)  # first max: smaller label
        alpha, shortest = x.scores_ending(incoming, t).flip(1).max(dim=1)  # d - 1; first max: shorter duration
        best_duration[:, t] = shortest + 1
        best_previous[:, t] = previous.flip(1).gather(1, shortest[:, None]).squeeze(1)
        ring.push(t, alpha)
        if t in x.finishing:
            done = x.finishing[t]
            scores[done], last_label[done] = alpha[done].max(dim=1)
    durations, labels = _backtrack(best_duration.tolist(), best_previous.tolist(), x.lengths, last_label.tolist(), x.T)
    return ViterbiPath(scores.to(call.cum_scores.dtype), durations.to(device), labels.to(device))


def _backtrack(best_duration, best_previous, lengths, last_label, T) -> tuple[Tensor, Tensor]:
    """Follow the backpointers from (L_b, last_label[b]) to 0: ``durations``/``labels`` (B, T) at segment ends."""
    durations = [[0] * T for _ in lengths]
    labels = [[0] * T for _ in lengths]
    for b, (t, c) in enumerate(zip(lengths, last_label)):
        while t > 0:
            d = best_duration[b][t][c]
            durations[b][t - 1], labels[b][t - 1] = d, c
            t, c = t - d, best_previous[b][t][c]
    shape = (len(lengths), T)
    return torch.tensor(durations, dtype=torch.int64).view(shape), torch.tensor(labels, dtype=torch.int64).view(shape)
