"""Triton backend of the streaming semi-CRF: the kernels behind the ``semicrf.triton.*`` routes.

Same interface as :mod:`provable_kernels.semicrf.torch_ops` (conventions in :mod:`provable_kernels.semicrf.call`):
``partition``, ``forward_checkpointed``, ``backward``, ``viterbi``. Every kernel runs one program per sequence,
sequential over positions, with edges computed on the fly from ``cum_scores`` and O(K*C) live state (a ring of the
last K+1 positions in a small per-sequence scratch). Any K >= 1 (durations longer than T never occur, so K is
capped at T internally), 2-D (C, C) or 3-D (K, C, C) transitions, optional proj_start / proj_end, variable
lengths, float32 or float64 inputs; outputs in the input dtype.

Precision per route (float32 inputs; see :mod:`provable_kernels.semicrf.triton_forward`). Every route carries float64
offsets and float64 ring entries; the ⊕ (logsumexp / max) along the chain of T dependent steps runs in

- float32 for inference (``partition``: the ``log.infer`` / ``max.infer`` routes): logZ relative error 5.3e-8 at
  T = 1e5 measured on an H200 (benchmarks/NOTES-semicrf.md, run 1), i.e. its float32 output rounding; ~2.5x
  faster per step than a float64 chain on short shapes (run 1 vs run 3);
- float64 for training (``forward_checkpointed`` / ``backward``) and Viterbi: gradients were 1.4e-4 off at T = 1e5
  with a float32 chain (an error random walk), ~2e-7 with the float64 one (run 3); Viterbi's max chain and
  backpointers stay exactly those of the float64 recursion.

On the training routes the kernels' working dtype ``FT`` (values relative to an offset, marginals, the 3-D
transitions' reduction over the previous label, the interval and a-value buffers) is float64 too: with float32 it
was O(1) only for moderate scores, and the exponent of a marginal, a sum of float32 terms as large as the scores,
lost ~1e-7 x |scores| absolutely (norm-wise gradient error 4.5e-4 at score scale 1e4, 5e-2 at 1e6). With
float64 the error no longer grows with the magnitude (tests/test_semicrf_training.py; the accuracy-vs-scale table
of benchmarks/gpu_semicrf_training.py): gradients within 1e-4 norm-wise relative and logZ within 1e-6 relative of
a float64 run for scores, transitions and duration biases up to 1e4 and, as measured, beyond (1e6); float32
remains only in the inference chain and in the gradients' output dtype. Requirement: at T = 100,000, logZ within
1e-6 relative of a float64 computation and gradients within 1e-4 norm-wise relative. float64 inputs run in
float64 throughout.

Guards: -inf transitions / duration biases never give NaN (every logsumexp shift is guarded); a sequence with no
segmentation of finite score gets logZ = -inf and zero gradients; its Viterbi score is -inf with some valid
segmentation. Value checks: the forward kernel checks each sequence's values and length (module docstring of
:mod:`~provable_kernels.semicrf.triton_forward`); a failed check gives that sequence NaN, every kernel clamps
lengths into 1..T.

Memory per sequence (T = cum_scores.shape[1] - 1, K capped at T, S = ceil(sqrt(T*(K+1)))):

- ``partition``: rings, 2*(K+1)*C floats (O(K*C)).
- ``forward_checkpointed`` saves the ring every S steps: (T//S + 1)*(K+1)*C float64 (+ as many float64 a-values
  for 3-D transitions).
- ``unit_gradients`` (the backward kernel) adds an interval buffer (S+1)*C and rings 3*(K+1)*C, and returns the
  sequence's float64 gradients for grad_logZ = 1: (T+1)*C (+ 2*T*C with both projections) and the partial sums
  K*C + C*C (3-D: K*C + K*C*C). The training route keeps these from the forward to the backward
  (:mod:`~provable_kernels.semicrf.autograd`), O(T*C + K*C*C) per sequence, like the gradients themselves.
- ``scale_gradients`` writes the gradients (the inputs' sizes).
- ``viterbi``: backpointers 2*(T+1)*C int32.

Determinism: no atomics; each program writes its own rows and its own partial sums; the scaling kernel sums those
over the batch in a fixed order, so repeated runs give bitwise-identical gradients.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from provable_kernels import alloc, validate
from provable_kernels.dispatch import triton_usable
from provable_kernels.launch import launcher
from provable_kernels.semicrf.call import StreamingCall, pad_duration_rows, require_call
from provable_kernels.semicrf.structures import ViterbiPath
from provable_kernels.semicrf.triton_backward import semicrf_backward_kernel, semicrf_scale_kernel
from provable_kernels.semicrf.triton_forward import semicrf_forward_kernel
from provable_kernels.semicrf.triton_viterbi import semicrf_backtrack_kernel

TILE_2D = 4096  # elements of a (durations, labels) chunk for 2-D transitions
TILE_3D = 4096  # elements of a (durations, labels, labels) chunk for 3-D transitions
SCALE_BLOCK = 1024  # elements per step of the gradient scaling kernel


def config(K: int, C: int, trans_3d: bool) -> tuple[int, int, int]:
    """(durations per chunk, forward warps, backward warps) for capped K and C labels: then warps from the
    chunk's tile size e (measured on an H200, benchmarks/NOTES-semicrf.md): forward e/128 in [2, 8], backward
    (more independent work per step) e/64 in [4, 8]. Memoised (host overhead per call)."""
    return _config(K, C, trans_3d, TILE_2D, TILE_3D)


@functools.lru_cache(maxsize=1024)
def _config(K: int, C: int, trans_3d: bool, tile_2d: int, tile_3d: int) -> tuple[int, int, int]:
    CP = triton.next_power_of_2(C)
    per_duration = CP * CP if trans_3d else CP
    DB = min(triton.next_power_of_2(K), max(1, (tile_3d if trans_3d else tile_2d) // per_duration))
    tile = DB * per_duration
    return DB, min(8, max(2, tile // 128)), min(8, max(4, tile // 64))


@dataclass(slots=True)  # not frozen: host time per call (read-only by convention)
class _Plan:
    """A call's tensors (contiguous), sizes and compile-time flags, shared by every kernel of the call. The kernels
    take the sizes under short names (``KR``, ``S``, ``NCK``, ``DB``, ``FT``, ...); each is spelled out here."""

    cum: Tensor
    trans: Tensor
    dur: Tensor
    ps: Optional[Tensor]
    pe: Optional[Tensor]
    lengths: Tensor
    B: int
    T: int
    C: int
    K: int  # min(call.K, T): durations longer than T never occur
    K_requested: int  # call.K: the gradients have this many duration rows
    checkpoint_interval: int  # kernel ``S``: the forward saves its ring after every S steps
    durations_per_chunk: int  # kernel ``DB``: durations reduced together (NCHUNK = ceil(K / DB) chunks)
    warps: int
    backward_warps: int
    trans_3d: bool
    work_dtype: torch.dtype  # kernel ``FT``: float64 on the training routes, else the input dtype

    @property
    def ring_size(self) -> int:
        """Kernel ``KR``: entries of a ring (the last K+1 positions)."""
        return self.K + 1

    @property
    def checkpoint_count(self) -> int:
        """Kernel ``NCK``: saved rings, after steps 0, S, 2S, ..."""
        return self.T // self.checkpoint_interval + 1

    @property
    def input_type(self):
        """Kernel ``FT``: the Triton working dtype (``work_dtype``) of values kept relative to an offset."""
        return tl.float32 if self.work_dtype == torch.float32 else tl.float64

    def new(self, *shape: int, dtype: torch.dtype, zero: bool = False) -> Tensor:
        """A kernel buffer from :func:`provable_kernels.alloc.empty` (poisoned under ``sentinel verify``: an
        element no kernel writes shows); ``zero``: filled with zeros (buffers the kernels accumulate into)."""
        if zero:
            return torch.zeros(shape, dtype=dtype, device=self.cum.device)
        return alloc.empty(shape, dtype=dtype, device=self.cum.device)

    def carve(self, shapes: Sequence[tuple[int, ...]], dtype: torch.dtype, zero: bool = False,
              flat: Optional[Tensor] = None) -> tuple[Tensor, ...]:
        """Buffers of ``shapes`` as views of one allocation (:meth:`new`; one allocation and at most one fill
        instead of one per buffer: host time per call), each starting 16-byte aligned; or views of ``flat``, an
        allocation of :func:`carved_numel` elements made before."""
        numel, layout = _carving(tuple(shapes), dtype.itemsize)
        if flat is None:
            flat = self.new(numel, dtype=dtype, zero=zero)
        return tuple(flat.as_strided(shape, stride, offset) for shape, stride, offset in layout)

    def unit_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of :func:`unit_gradients`' float64 buffers, in :meth:`carve` order: g_cum (B, T+1, C), the
        per-sequence transition and duration-bias sums (B, C*C | K*C*C + K*C), g_ps and g_pe (B, T, C) when
        present."""
        return unit_shapes(self.B, self.T, self.C, self.K, self.trans_3d, self.ps is not None, self.pe is not None)

    def checkpoint_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the training forward's float64 buffers, in :meth:`carve` order: ring checkpoints (B, NCK,
        KR, C), a-value checkpoints (the same; 3-D transitions only), offsets (B, NCK), then the forward's scratch
        rings (B, KR, C): entries and a-values (3-D only)."""
        return checkpoint_shapes(self.B, self.T, self.C, self.K, self.trans_3d)

    def sizes(self) -> tuple[int, ...]:
        """The kernels' size arguments ``(T, K, KR, S, NCK, C)``."""
        return (self.T, self.K, self.ring_size, self.checkpoint_interval, self.checkpoint_count, self.C)

    def meta(self, warps: int) -> dict:
        """Compile-time arguments shared by the kernels (a memoised dict: do not modify)."""
        return _meta(self.C, self.K, self.durations_per_chunk, self.trans_3d, self.ps is not None, self.pe is not None,
                     self.input_type, warps)

    def inputs(self) -> tuple[Optional[Tensor], ...]:
        """The kernels' input pointers (an absent projection is None)."""
        return (self.cum, self.trans, self.dur, self.ps, self.pe, self.lengths)

    def rings(self) -> tuple[Tensor, Optional[Tensor]]:
        """Scratch rings (B, K+1, C): float64 entries, a-values (3-D transitions only, else None)."""
        shape = (self.B, self.ring_size, self.C)
        ring_a = self.new(*shape, dtype=self.work_dtype) if self.trans_3d else None
        return self.new(*shape, dtype=torch.float64), ring_a


@functools.lru_cache(maxsize=1024)
def _meta(C: int, K: int, durations_per_chunk: int, trans_3d: bool, has_ps: bool, has_pe: bool, input_type,
          warps: int) -> dict:
    """The kernels' constexpr arguments: ``CP`` labels padded to a power of two, ``DB`` durations per chunk,
    ``NCHUNK`` chunks, ``FT`` the input dtype."""
    return dict(TRANS_3D=trans_3d, HAS_PS=has_ps, HAS_PE=has_pe, FT=input_type, CP=triton.next_power_of_2(C),
                DB=durations_per_chunk, NCHUNK=triton.cdiv(K, durations_per_chunk), num_warps=warps, num_stages=1)


def checkpoint_shapes(B: int, T: int, C: int, K: int, trans_3d: bool) -> list[tuple[int, ...]]:
    """:meth:`_Plan.checkpoint_shapes` for K capped at T."""
    count, ring = T // checkpoint_interval(T, K) + 1, (B, K + 1, C)
    saved = [(B, count, K + 1, C)] * (2 if trans_3d else 1) + [(B, count)]
    return saved + [ring] * (2 if trans_3d else 1)


def unit_shapes(B: int, T: int, C: int, K: int, trans_3d: bool, has_ps: bool, has_pe: bool) -> list:
    """:meth:`_Plan.unit_shapes` for K capped at T."""
    shared = (K * C * C if trans_3d else C * C) + K * C
    return [(B, T + 1, C), (B, shared)] + [(B, T, C)] * (has_ps + has_pe)


def carved_numel(shapes: Sequence[tuple[int, ...]], dtype: torch.dtype) -> int:
    """Elements of the one allocation :meth:`_Plan.carve` makes for ``shapes`` (sizes may be symbolic)."""
    return _pack(tuple(shapes), dtype.itemsize)[0]


def _pack(shapes: tuple[tuple[int, ...], ...], itemsize: int) -> tuple[int, tuple]:
    """(total elements, ((shape, contiguous strides, offset), ...)) of ``shapes`` packed one after another, each
    starting at a 16-byte boundary (the kernels' pointers stay aligned)."""
    per, offset, layout = max(1, 16 // itemsize), 0, []
    for shape in shapes:
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        layout.append((shape, tuple(strides), offset))
        offset += -(-math.prod(shape) // per) * per
    return offset, tuple(layout)


_carving = functools.lru_cache(maxsize=1024)(_pack)  # one lookup per call on the hot path


def checkpoint_interval(T: int, K: int) -> int:
    """Kernel ``S`` = ceil(sqrt(T*(K+1))) for K = min(call's K, T): the spacing of the training forward's saved
    rings (balances T/S saved rings of K+1 rows against an interval buffer of S rows)."""
    return max(1, math.isqrt(T * (K + 1) - 1) + 1)


def _interpreted() -> bool:
    """Whether the kernels were created under the Triton interpreter (``TRITON_INTERPRET=1`` when this module was
    first imported: ``@triton.jit`` decides at decoration time)."""
    return not isinstance(semicrf_forward_kernel, triton.runtime.JITFunction)


def _contiguous(x: Optional[Tensor]) -> Optional[Tensor]:
    return None if x is None else x.contiguous()


def _plan(call: object, semiring: Optional[str] = None, training: bool = False) -> _Plan:
    """The plan of ``call``; ``training`` selects the float64 working dtype (module docstring, precision)."""
    call = require_call(call, semiring)
    cum = call.cum_scores
    if not cum.is_cuda:
        _require_interpreter(cum.device)
    B, T1, C = cum.shape
    T = T1 - 1
    K = min(call.K, T)
    trans, dur = call.transition, call.duration_bias
    trans_3d = trans.dim() == 3
    if K < call.K:  # durations beyond T never occur: drop their rows
        trans, dur = trans[:K] if trans_3d else trans, dur[:K]
    interval, durations_per_chunk, warps, backward_warps = _layout(T, K, C, trans_3d)
    return _Plan(
        cum=cum.contiguous(), trans=trans.contiguous(), dur=dur.contiguous(), ps=_contiguous(call.proj_start),
        pe=_contiguous(call.proj_end), lengths=call.lengths.contiguous(), B=B, T=T, C=C, K=K, K_requested=call.K,
        checkpoint_interval=interval, durations_per_chunk=durations_per_chunk, warps=warps,
        backward_warps=backward_warps, trans_3d=trans_3d, work_dtype=torch.float64 if training else cum.dtype)


@functools.lru_cache(maxsize=1024)
def _layout(T: int, K: int, C: int, trans_3d: bool) -> tuple[int, int, int, int]:
    """(checkpoint interval, durations per chunk, forward warps, backward warps) for capped K: one lookup per call."""
    return (checkpoint_interval(T, K),) + config(K, C, trans_3d)


def _require_interpreter(device: torch.device) -> None:
    """On a device other than CUDA the kernels run only under the Triton interpreter, set before they were built."""
    if not triton_usable(device):  # verify: unreached (internal guard: the tree checks the device)
        raise ValueError(f"cum_scores must be on a CUDA device (or on the CPU with TRITON_INTERPRET=1) for the "
                         f"Triton backend, got {device}")
    if not _interpreted():  # verify: unreached (interpreter set late: tests/test_semicrf_training.py)
        raise RuntimeError("TRITON_INTERPRET=1 was set after the semi-CRF Triton kernels were imported, so they were "
                           "built for a GPU driver: set it before the first import of provable_kernels (e.g. in the "
                           "shell environment), or pass use_triton=False for the PyTorch backend on the CPU")


def _forward(plan: _Plan, log: bool, out_dtype: torch.dtype, checkpoints: Optional[tuple] = None,
             backpointers: Optional[tuple[Tensor, ...]] = None, chain=tl.float64,
             rings: Optional[tuple] = None) -> Tensor:
    """Run the forward kernel with the chain dtype ``chain`` (module docstring); ⊕_c alpha[L_b, c] (B,) in
    ``out_dtype``. ``rings``: the scratch rings (:meth:`_Plan.rings` when None)."""
    out = plan.new(plan.B, dtype=out_dtype)
    ring, ring_a = plan.rings() if rings is None else rings
    ck = checkpoints if checkpoints is not None else (None, None, None)
    bp = backpointers if backpointers is not None else (None, None, None)
    launcher(semicrf_forward_kernel)[(plan.B,)](
        *plan.inputs(), out, ring, ring_a, *ck, *bp, *plan.sizes(), LOG=log, SAVE_CKPT=checkpoints is not None,
        WRITE_BP=backpointers is not None, CT=chain, **plan.meta(plan.warps))
    return out


def partition(call: StreamingCall) -> Tensor:
    """logZ (``call.semiring == "log"``) or the best score (``"max"``) per sequence, (B,) in the input dtype.
    No autograd graph. The chain runs in the input dtype (float32 inputs: float32 chain, float64 offsets)."""
    plan = _plan(call)
    return _forward(plan, call.semiring == "log", plan.cum.dtype, chain=plan.input_type)


def forward_checkpointed(call: StreamingCall) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """logZ (B,) in the input dtype and what :func:`backward` needs: ``(logZ float64 (B,), checkpoints float64
    (n,))``, the ring saved after steps 0, S, 2S, ... as one flat allocation (:meth:`_Plan.checkpoint_shapes`:
    rings, a-values for 3-D transitions, offsets, then the forward's scratch)."""
    plan = _plan(call, "log", training=True)
    shapes = plan.checkpoint_shapes()
    flat = plan.new(carved_numel(shapes, torch.float64), dtype=torch.float64, zero=True)
    # zero-filled: a sequence shorter than T leaves its last slots unwritten, and op outputs must be deterministic
    views = plan.carve(shapes, torch.float64, flat=flat)
    ck_ring, ck_ring_a = views[0], views[1] if plan.trans_3d else None
    ring, ring_a = views[-2:] if plan.trans_3d else (views[-1], None)
    logZ = _forward(plan, True, torch.float64, checkpoints=(ck_ring, ck_ring_a, views[-3 if plan.trans_3d else -2]),
                    rings=(ring, ring_a))
    return logZ.to(plan.cum.dtype), (logZ, flat)


# verify: unreached (for direct callers: benchmarks/semicrf_gpu_check.py, tests; the routes call its two parts)
def backward(call: StreamingCall, saved: tuple, logZ: Tensor, grad_logZ: Tensor) -> tuple:
    """Gradients of Σ_b grad_logZ[b] * logZ[b] w.r.t. (cum_scores, transition, duration_bias, proj_start, proj_end),
    None for an absent projection, in the input dtype: :func:`scale_gradients` of :func:`unit_gradients`. Uses
    the float64 logZ in ``saved`` (the input-dtype ``logZ`` is not precise enough for the marginals at large T)."""
    return scale_gradients(call, unit_gradients(call, saved), grad_logZ)


def unit_gradients(call: StreamingCall, saved: tuple) -> Tensor:
    """The backward kernel for grad_logZ = 1: each sequence's gradients of its own logZ, float64, in one flat
    tensor laid out as :meth:`_Plan.unit_shapes` (g_cum, per-sequence transition and duration-bias sums, g_ps,
    g_pe). ``saved``: :func:`forward_checkpointed`'s."""
    plan = _plan(call, "log", training=True)
    if not (isinstance(saved, tuple) and len(saved) == 2):
        raise TypeError("saved must be the pair returned by forward_checkpointed")  # verify: unreached (internal)
    logZ64, flat = saved
    shapes = plan.checkpoint_shapes()
    validate.shape("saved checkpoints", flat, (carved_numel(shapes, torch.float64),), "(n,)")
    ck_ring, *rest = plan.carve(shapes, torch.float64, flat=flat)
    ck_ring_a, ck_offset = rest[:2] if plan.trans_3d else (None, rest[0])

    S1, KR, B, C = plan.checkpoint_interval + 1, plan.ring_size, plan.B, plan.C
    scratch = [(B, KR, C), (B, S1, C), (B, S1), (B, KR, C)] + [(B, KR, C)] * plan.trans_3d  # all float64 here
    ring, alpha_a, alpha_A, bring, *ring_a = plan.carve(scratch, torch.float64)
    unit_shapes = plan.unit_shapes()
    units = plan.new(carved_numel(unit_shapes, torch.float64), dtype=torch.float64, zero=True)
    g_cum, parts, *proj = plan.carve(unit_shapes, torch.float64, flat=units)
    g_ps = proj.pop(0) if plan.ps is not None else None
    g_pe = proj.pop(0) if plan.pe is not None else None
    trans_numel = parts.shape[1] - plan.K * C
    launcher(semicrf_backward_kernel)[(B,)](
        *plan.inputs(), logZ64, torch.ones(B, dtype=torch.float64, device=plan.cum.device), ring,
        ring_a[0] if ring_a else None, ck_ring, ck_ring_a, ck_offset, alpha_a, alpha_A, bring, g_cum, g_ps, g_pe,
        parts[:, trans_numel:], parts, *plan.sizes(), **plan.meta(plan.backward_warps))
    return units


def scale_gradients(call: StreamingCall, units: Tensor, grad_logZ: Tensor) -> tuple:
    """Gradients of Σ_b grad_logZ[b] * logZ[b], as :func:`backward`, from :func:`unit_gradients`'s ``units``: one
    launch scales each sequence's rows by grad_logZ[b] and sums the transition and duration-bias parts weighted by
    it over the batch in a fixed order (float64: deterministic), stored in the input dtype."""
    plan = _plan(call, "log", training=True)
    B, T, C, K, dtype = plan.B, plan.T, plan.C, plan.K, plan.cum.dtype
    grad_logZ = validate.tensor("grad_logZ", grad_logZ, ndim=1, dtypes=validate.FLOAT_DTYPES, device=plan.cum.device)
    validate.shape("grad_logZ", grad_logZ, (B,), "(B,)")
    unit_shapes = plan.unit_shapes()
    validate.shape("units", units, (carved_numel(unit_shapes, torch.float64),), "(n,)")
    unit_cum, parts, *proj = plan.carve(unit_shapes, torch.float64, flat=units)
    unit_ps = proj.pop(0) if plan.ps is not None else None
    unit_pe = proj.pop(0) if plan.pe is not None else None
    trans_shape = (K, C, C) if plan.trans_3d else (C, C)
    g_cum = plan.new(B, T + 1, C, dtype=dtype)
    g_ps = plan.new(B, T, C, dtype=dtype) if unit_ps is not None else None
    g_pe = plan.new(B, T, C, dtype=dtype) if unit_pe is not None else None
    g_trans, g_dur = plan.new(*trans_shape, dtype=dtype), plan.new(K, C, dtype=dtype)
    W = parts.shape[1]
    launcher(semicrf_scale_kernel)[(B + triton.cdiv(W, SCALE_BLOCK),)](
        unit_cum, unit_ps, unit_pe, parts, grad_logZ.contiguous(), g_cum, g_ps, g_pe, g_trans, g_dur, B,
        (T + 1) * C, T * C, W, W - K * C, HAS_PS=g_ps is not None, HAS_PE=g_pe is not None, BLOCK=SCALE_BLOCK)
    if plan.trans_3d:
        g_trans = pad_duration_rows(g_trans, plan.K_requested)
    return g_cum, g_trans, pad_duration_rows(g_dur, plan.K_requested), g_ps, g_pe


def viterbi(call: StreamingCall) -> ViterbiPath:
    """The best segmentation per sequence: max recursion writing backpointers, then a backtracking kernel. Ties:
    the shorter duration, then the smaller previous label (and the smaller final label)."""
    plan = _plan(call)
    bp_dur = plan.new(plan.B, plan.T + 1, plan.C, dtype=torch.int32)
    bp_prev = plan.new(plan.B, plan.T + 1, plan.C, dtype=torch.int32)
    last_label = plan.new(plan.B, dtype=torch.int32)
    scores = _forward(plan, False, plan.cum.dtype, backpointers=(bp_dur, bp_prev, last_label))
    durations = plan.new(plan.B, plan.T, dtype=torch.int64, zero=True)
    labels = plan.new(plan.B, plan.T, dtype=torch.int64, zero=True)
    launcher(semicrf_backtrack_kernel)[(plan.B,)](bp_dur, bp_prev, last_label, plan.lengths, durations, labels, plan.T,
                                       plan.C, PREV_BY_START=not plan.trans_3d, num_warps=1)
    return ViterbiPath(scores, durations, labels)
