"""Semirings for the exact structured backends, one interface (in the style of torch-struct).

A semiring value is a tensor with ``size`` leading *channels* followed by the data dims: shape (size, *data).

- ``convert(potentials)`` lifts potentials (data shape) to a semiring value; ``unconvert(x)`` reads the result.
  Log-space semirings take log-potentials (``-inf`` = forbidden); :class:`Counting` takes real weights;
  :class:`CrossEntropy` and :class:`KLDivergence` take a pair ``(log_p, log_q)`` of log-potentials.
- ``zero(shape, like)`` / ``one(shape, like)``: the neutral elements of ⊕ / ⊗ with data shape ``shape`` and the
  dtype and device of ``like``.
- ``mul(a, b)``: ⊗, broadcasting over the data dims. ``sum(x, dim)``: ⊕-reduction over the data dim(s) ``dim``
  (an int or a tuple; indices count data dims only, so ``dim=0`` is the first dim after the channels).

| semiring | size | channels | ⊗ | ⊕ | unconvert |
|---|---|---|---|---|---|
| Log | 1 | log-weight | + | logsumexp | log Z |
| Max | 1 | score | + | max | best score |
| Counting | 1 | real weight | × | sum | Σ_y Π weights (the number of structures for 0/1 weights) |
| Entropy | 2 | (log Z, H) | + | see below | H(p) |
| CrossEntropy | 3 | (log Z_p, log Z_q, H) | + | see below | H(p, q) = -Σ_y p(y) log q(y) |
| KLDivergence | 3 | (log Z_p, log Z_q, D) | + | see below | KL(p‖q) = Σ_y p(y) (log p(y) - log q(y)) |
| KMax(k) | k | k best scores, descending | top-k of pairwise sums | top-k | (k, *data) |

Entropy-like semirings keep, for a set of structures, its log-mass and the expectation of ``h`` under the set's own
normalised distribution; ⊗ (independent concatenation) adds both; ⊕ over disjoint sets i with shares
``p_i = Z_p,i / Z_p`` gives ``Σ_i p_i (h_i + a log p_i + b log q_i)`` with (a, b) = (-1, 0) for entropy,
(0, -1) for cross-entropy, (1, -1) for KL. Every log-space ⊕ is written so that ``-inf`` inputs (also all of
them) give finite values and finite (zero) gradients, never NaN. H(p, q) and KL(p‖q) are ``+inf`` when p puts
mass on a structure that q forbids; their values and gradients are finite whenever supp p ⊆ supp q.
"""
from __future__ import annotations

import math
from typing import Sequence, Union

import torch

from provable_kernels import validate

Dims = Union[int, Sequence[int]]


def _data_dims(dim: Dims) -> tuple[int, ...]:
    return (dim,) if isinstance(dim, int) else tuple(dim)


def _full_dims(dim: Dims) -> tuple[int, ...]:
    """Data-dim indices (after the channel dim) as indices of the full tensor."""
    return tuple(d if d < 0 else d + 1 for d in _data_dims(dim))


def logsumexp(x: torch.Tensor, dim: Dims, keepdim: bool = False) -> torch.Tensor:
    """``log Σ exp(x)`` over ``dim``: ``-inf`` when every input is ``-inf``, with zero (not NaN) gradients.

    ``torch.logsumexp`` returns NaN gradients on an all ``-inf`` slice; this one does not. Inputs must not contain
    NaN or ``+inf``.
    """
    shift = x.detach().amax(dim=dim, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = torch.exp(x - shift).sum(dim=dim, keepdim=True)
    empty = total == 0
    out = torch.where(empty, torch.full_like(total, -math.inf), torch.log(torch.where(empty, 1.0, total)) + shift)
    return out if keepdim else out.squeeze(dim)


class Semiring:
    """Base class; see the module docstring for the interface. ``log_space``: potentials are log-weights."""

    size = 1
    log_space = True
    pair = False  # convert takes a pair (log_p, log_q)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def convert(self, potentials: torch.Tensor) -> torch.Tensor:
        potentials = validate.tensor("potentials", potentials, dtypes=validate.FLOAT_DTYPES)
        return potentials.unsqueeze(0)

    def unconvert(self, x: torch.Tensor) -> torch.Tensor:
        return x[0]

    def _fill(self, shape: Sequence[int], like: torch.Tensor, values: Sequence[float]) -> torch.Tensor:
        column = torch.tensor(values, dtype=like.dtype, device=like.device)
        return column.reshape(-1, *([1] * len(shape))).expand(len(values), *shape).clone()

    def zero(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._fill(shape, like, [-math.inf] * self.size)

    def one(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        return self._fill(shape, like, [0.0] * self.size)

    def mul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """⊗ with numpy broadcasting over the data dims (the channel dims stay aligned)."""
        rank = max(a.dim(), b.dim())
        a, b = (x.reshape(x.shape[0], *([1] * (rank - x.dim())), *x.shape[1:]) for x in (a, b))
        return self._times(a, b)

    def _times(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def sum(self, x: torch.Tensor, dim: Dims) -> torch.Tensor:
        raise NotImplementedError  # verify: unreached (abstract: every semiring defines its sum)


class Log(Semiring):
    """Log semiring: ⊕ = logsumexp (``-inf``-safe), ⊗ = +. Result: log Z."""

    def sum(self, x, dim):
        return logsumexp(x, _full_dims(dim))


class Max(Semiring):
    """Max semiring (Viterbi): ⊕ = max, ⊗ = +. Result: the best score; its gradient is the best structure's
    indicator (split evenly between exact ties)."""

    def sum(self, x, dim):
        best = x.amax(dim=_full_dims(dim))
        return torch.where(best == -math.inf, best.detach(), best)  # all -inf: zero gradients


class Counting(Semiring):
    """Real sum-product semiring on real weights: ⊕ = +, ⊗ = ×. With weights ``edge.exp()`` of an all-zero-score
    model (1 where allowed, 0 where forbidden) the result is the number of allowed structures."""

    log_space = False

    def zero(self, shape, like):
        return self._fill(shape, like, [0.0])

    def one(self, shape, like):
        return self._fill(shape, like, [1.0])

    def _times(self, a, b):
        return a * b

    def sum(self, x, dim):
        return x.sum(dim=_full_dims(dim))


def _shares(log_mass: torch.Tensor, dims: tuple[int, ...]):
    """For log-masses ``a_i`` (-inf allowed): ``(total, log_share, forbidden)`` with ``total = logsumexp`` over
    ``dims``, ``log_share = a_i - total`` (0 where ``a_i = -inf``; gradient-safe) and ``forbidden = (a_i = -inf)``."""
    total = logsumexp(log_mass, dims, keepdim=True)
    forbidden = log_mass == -math.inf
    finite_total = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
    log_share = torch.where(forbidden, torch.zeros_like(log_mass), log_mass - finite_total)
    return total, log_share, forbidden


class _Expectation(Semiring):
    """Channels (log-mass of p [, log-mass of q], h); ⊕ gives ``Σ_i p_i (h_i + coef_p log p_i + coef_q log q_i)``."""

    coef_p = 0.0
    coef_q = 0.0

    def convert(self, potentials):
        parts = potentials if self.pair else (potentials,)
        if self.pair:
            # verify: unreached (SemiMarkov checks the pair first)
            if not isinstance(potentials, (tuple, list)) or len(potentials) != 2:
                raise TypeError(f"potentials must be a pair (log_p, log_q) for {self!r}, "
                                f"got {type(potentials).__name__}")
            for name, part in zip(("potentials[0]", "potentials[1]"), parts):
                validate.tensor(name, part, dtypes=validate.FLOAT_DTYPES)
            validate.tensor("potentials[1]", parts[1], dtypes=(parts[0].dtype,), device=parts[0].device)
            validate.shape("potentials[1]", parts[1], parts[0].shape, "like potentials[0]")
        else:
            validate.tensor("potentials", potentials, dtypes=validate.FLOAT_DTYPES)
        return torch.stack([*parts, torch.zeros_like(parts[0])])

    def unconvert(self, x):
        return x[-1]

    def sum(self, x, dim):
        dims = _data_dims(dim)  # x[i] holds data dims only
        total_p, log_p, forbidden_p = _shares(x[0], dims)
        totals, term = [total_p], log_p * self.coef_p
        if self.pair:
            total_q, log_q, forbidden_q = _shares(x[1], dims)
            totals.append(total_q)
            term = term + log_q * self.coef_q
        h = torch.where(forbidden_p, torch.zeros_like(x[-1]), x[-1])
        share = torch.where(forbidden_p, torch.zeros_like(log_p), torch.exp(log_p))
        expectation = (share * (h + term)).sum(dim=dims)
        if self.pair:
            expectation = expectation.masked_fill((~forbidden_p & forbidden_q).any(dim=dims), math.inf)
        return torch.stack([total.squeeze(dims) for total in totals] + [expectation])

    def zero(self, shape, like):
        return self._fill(shape, like, [-math.inf] * (self.size - 1) + [0.0])


class Entropy(_Expectation):
    """H(p) = -Σ_y p(y) log p(y) of the Gibbs distribution of the log-potentials."""

    size = 2
    coef_p = -1.0


class CrossEntropy(_Expectation):
    """H(p, q) = -Σ_y p(y) log q(y) for a pair of log-potentials ``(log_p, log_q)``."""

    size = 3
    pair = True
    coef_q = -1.0


class KLDivergence(_Expectation):
    """KL(p‖q) = Σ_y p(y) (log p(y) - log q(y)) for a pair of log-potentials ``(log_p, log_q)``."""

    size = 3
    pair = True
    coef_p = 1.0
    coef_q = -1.0


class KMax(Semiring):
    """The k best scores, descending (padded with ``-inf`` when fewer than k structures exist); result (k, *data)."""

    def __init__(self, k: int):
        self.size = validate.positive_int("k", k)

    def __repr__(self) -> str:  # verify: unreached (for messages and printing)
        return f"KMax({self.size})"

    def convert(self, potentials):
        lifted = super().convert(potentials)
        return torch.cat([lifted, lifted.new_full((self.size - 1, *lifted.shape[1:]), -math.inf)])

    def unconvert(self, x):
        return x

    def one(self, shape, like):
        return self._fill(shape, like, [0.0] + [-math.inf] * (self.size - 1))

    def _top(self, x: torch.Tensor) -> torch.Tensor:
        """The ``size`` largest along dim 0 (which may be shorter: pad with -inf)."""
        if x.shape[0] < self.size:  # verify: unreached (sum and mul always pass at least k candidates)
            x = torch.cat([x, x.new_full((self.size - x.shape[0], *x.shape[1:]), -math.inf)])
        return x.topk(self.size, dim=0).values

    def _times(self, a, b):
        pairs = a.unsqueeze(1) + b.unsqueeze(0)  # (k, k, *data)
        return self._top(pairs.flatten(0, 1))

    def sum(self, x, dim):
        dims = sorted(d % x.dim() for d in _full_dims(dim))
        moved = x.movedim(dims, list(range(1, len(dims) + 1)))
        return self._top(moved.flatten(0, len(dims)))


# Long names, as in torch-struct and the original library's documentation: ``SemiMarkov(LogSemiring)`` takes the
# class itself as well as an instance (``KMaxSemiring`` needs ``k``: ``SemiMarkov(KMaxSemiring(3))``).
LogSemiring = Log
MaxSemiring = Max
CountingSemiring = Counting
EntropySemiring = Entropy
CrossEntropySemiring = CrossEntropy
KLDivergenceSemiring = KLDivergence
KMaxSemiring = KMax
