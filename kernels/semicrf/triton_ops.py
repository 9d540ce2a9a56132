"""Triton backend of the streaming semi-CRF: the kernels behind the ``semicrf.triton.*`` routes.

Conventions in :mod:`provable_kernels.semicrf.call`. ``partition`` and ``viterbi`` as in
:mod:`provable_kernels.semicrf.torch_ops`; training in two parts, ``train_forward`` (logZ, and every sequence's
gradients of its own logZ, computed at once) and ``backward`` (those scaled by grad_logZ: one launch, so that
autograd's backward pass costs little host time). Every kernel runs one program per sequence,
sequential over positions, with edges computed on the fly from ``cum_scores`` and O(K*C) live state (a ring of the
last K+1 positions in a small per-sequence scratch, or in registers: :func:`register_ring`). Any K >= 1 (durations
longer than T never occur, so K is capped at T internally), 2-D (C, C) or 3-D (K, C, C) transitions, optional
proj_start / proj_end, variable lengths, float32 or float64 inputs; outputs in the input dtype.

Precision per route (float32 inputs; see :mod:`provable_kernels.semicrf.triton_forward`). Every route carries float64
offsets and float64 ring entries; the ⊕ (logsumexp / max) along the chain of T dependent steps runs in float32 for
inference (``partition``: the ``log.infer`` / ``max.infer`` routes) and in float64 for training (``train_forward``)
and Viterbi, whose max chain and backpointers are those of the float64 recursion. On the training routes the
kernels' working dtype ``FT`` (values relative to an offset, marginals, the 3-D transitions' reduction over the
previous label, the kept alpha values) is float64 too, so that the error does not grow with the scores'
magnitude; float32 remains only in the inference chain and in the gradients' output dtype. Requirement: at
T = 100,000, logZ within 1e-6 relative of a float64 computation and gradients within 1e-4 norm-wise relative, for
scores, transitions and duration biases up to 1e4 (tests/test_semicrf_training.py). float64 inputs run in float64
throughout. Why each dtype, and what it measured: ``traces/guide/semicrf-design.md``.

Guards: -inf transitions / duration biases never give NaN (every logsumexp shift is guarded); a sequence with no
segmentation of finite score gets logZ = -inf and zero gradients; its Viterbi score is -inf with some valid
segmentation. Value checks: the forward kernel checks each sequence's values and length (module docstring of
:mod:`~provable_kernels.semicrf.triton_forward`); a failed check gives that sequence NaN, every kernel clamps
lengths into 1..T.

Memory per sequence (T = cum_scores.shape[1] - 1, K capped at T):

- ``partition``: rings, 2*(K+1)*C floats (O(K*C)); none where the ring fits in registers (:func:`register_ring`).
- ``train_forward``: while it runs, alpha at every position, (T+1)*(C+1) float64, and the rings (K+1)*C float64
  (twice with 3-D transitions);
  it returns the sequence's float64 gradients for grad_logZ = 1, (T+1)*C (+ 2*T*C with both projections) and the
  partial sums K*C + C*C (3-D: K*C + K*C*C). The training route keeps these from the forward to the backward
  (:mod:`~provable_kernels.semicrf.autograd`), O(T*C + K*C*C) per sequence, like the gradients themselves.
- ``backward`` writes the gradients (the inputs' sizes).
- ``viterbi``: backpointers 2*(T+1)*C int32.

Determinism: no atomics; each program writes its own rows and its own partial sums; the scaling kernel sums those
over the batch in a fixed order, so repeated runs give bitwise-identical gradients.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from provable_kernels import alloc, validate
from provable_kernels.dispatch import triton_usable
from provable_kernels.launch import Bound, Options, launcher, options
from provable_kernels.semicrf.call import StreamingCall, pad_duration_rows, require_call
from provable_kernels.semicrf.structures import ViterbiPath
from provable_kernels.semicrf.triton_backward import semicrf_scale_kernel, semicrf_train_kernel
from provable_kernels.semicrf.triton_forward import semicrf_forward_kernel
from provable_kernels.semicrf.triton_viterbi import semicrf_backtrack_kernel

TILE_2D = 4096  # elements of a (durations, labels) chunk for 2-D transitions
TILE_3D = 4096  # elements of a (durations, labels, labels) chunk for 3-D transitions
SCALE_BLOCK = 1024  # elements per step of the gradient scaling kernel
REGISTER_RING_TILE = 4096  # elements of the register ring's shift tile (DB, DB, CP) at most


def config(K: int, C: int, trans_3d: bool) -> tuple[int, int, int]:
    """(durations per chunk, forward warps, backward warps) for capped K and C labels: then warps from the
    chunk's tile size e (swept on an H200): forward e/128 in [2, 8], backward
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
    take the sizes under short names (``KR``, ``DB``, ``FT``, ...); each is spelled out here."""

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
    durations_per_chunk: int  # kernel ``DB``: durations reduced together (NCHUNK = ceil(K / DB) chunks)
    warps: int
    backward_warps: int
    trans_3d: bool
    work_dtype: torch.dtype  # kernel ``FT``: float64 on the training routes, else the input dtype

    @property
    def ring_size(self) -> int:
        """Kernel ``KR``: entries of a ring (the last K+1 positions)."""
        return self.K + 1

    def new(self, *shape: int, dtype: torch.dtype, zero: bool = False) -> Tensor:
        """A kernel buffer from :func:`provable_kernels.alloc.empty` (poisoned under ``sentinel verify``: an
        element no kernel writes shows); ``zero``: filled with zeros (buffers the kernels accumulate into)."""
        if zero:
            return torch.zeros(shape, dtype=dtype, device=self.cum.device)
        return alloc.empty(shape, dtype=dtype, device=self.cum.device)

    def training_layout(self) -> "_TrainingLayout":
        """Where :func:`train_forward` puts its buffers (:func:`_training_layout`)."""
        return _training_layout(self.B, self.T, self.C, self.K, self.trans_3d, self.ps is not None,
                                self.pe is not None)

    def sizes(self) -> tuple[int, ...]:
        """The kernels' size arguments ``(T, K, KR, C)``."""
        return (self.T, self.K, self.ring_size, self.C)

    def options(self, warps: int, *route: tuple) -> Options:
        """The kernels' constexprs and launch options, with one kernel's ``route`` flags ``(name, value)``
        (:func:`_options`; one lookup per call)."""
        return _options(self.C, self.K, self.durations_per_chunk, self.trans_3d, self.ps is not None,
                        self.pe is not None, self.work_dtype, warps, route)

    def inputs(self) -> tuple[Optional[Tensor], ...]:
        """The kernels' input pointers (an absent projection is None)."""
        return (self.cum, self.trans, self.dur, self.ps, self.pe, self.lengths)

    def rings(self) -> tuple[Tensor, Optional[Tensor]]:
        """Scratch rings (B, K+1, C): float64 entries, a-values (3-D transitions only, else None)."""
        shape = (self.B, self.ring_size, self.C)
        ring_a = self.new(*shape, dtype=self.work_dtype) if self.trans_3d else None
        return self.new(*shape, dtype=torch.float64), ring_a


_TRITON_DTYPES = {torch.float32: tl.float32, torch.float64: tl.float64}


@functools.lru_cache(maxsize=1024)
def _options(C: int, K: int, durations_per_chunk: int, trans_3d: bool, has_ps: bool, has_pe: bool,
             work_dtype: torch.dtype, warps: int, route: tuple) -> Options:
    """The kernels' constexpr arguments (``CP`` labels padded to a power of two, ``DB`` durations per chunk,
    ``NCHUNK`` chunks, ``FT`` the working dtype) and launch options, plus ``route``'s ``(name, value)`` pairs of
    one kernel (a torch dtype stands for the Triton one: cheap to hash), interned
    (:func:`provable_kernels.launch.options`)."""
    flags = {name: _TRITON_DTYPES.get(value, value) if isinstance(value, torch.dtype) else value
             for name, value in route}
    return options(TRANS_3D=trans_3d, HAS_PS=has_ps, HAS_PE=has_pe, FT=_TRITON_DTYPES[work_dtype],
                   CP=triton.next_power_of_2(C), DB=durations_per_chunk, NCHUNK=triton.cdiv(K, durations_per_chunk),
                   num_warps=warps, num_stages=1, **flags)


def unit_shapes(B: int, T: int, C: int, K: int, trans_3d: bool, has_ps: bool, has_pe: bool) -> list:
    """Shapes of the unit gradients (:func:`train_forward`'s ``saved``, float64, one after another) for K capped at
    T: g_cum (B, T+1, C), the per-sequence transition and duration-bias sums (B, C*C | K*C*C + K*C), g_ps and g_pe
    (B, T, C) when present."""
    shared = (K * C * C if trans_3d else C * C) + K * C
    return [(B, T + 1, C), (B, shared)] + [(B, T, C)] * (has_ps + has_pe)


def saved_numel(B: int, T: int, C: int, K: int, trans_3d: bool, has_ps: bool, has_pe: bool) -> int:
    """Elements of :func:`train_forward`'s ``saved`` (sizes may be symbolic: fake tensors)."""
    return _pack(tuple(unit_shapes(B, T, C, K, trans_3d, has_ps, has_pe)), 8)[0]


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


class _TrainingLayout(NamedTuple):
    """Two float64 allocations of :func:`train_forward` as views ``(shape, strides, offset)``."""

    saved_numel: int
    saved: tuple  # unit_shapes' views, then the duration-bias columns of the partial sums (the kernel's g_dur)
    scratch_numel: int
    scratch: tuple  # alpha (B, T+1, C) and its offsets (B, T+1), the ring (B, K+1, C) (and the a-value ring with
                    # 3-D transitions)


@functools.lru_cache(maxsize=1024)
def _training_layout(B: int, T: int, C: int, K: int, trans_3d: bool, has_ps: bool, has_pe: bool) -> _TrainingLayout:
    """:class:`_TrainingLayout` for K capped at T, computed once per size (host time per call)."""
    saved_numel, saved = _pack(tuple(unit_shapes(B, T, C, K, trans_3d, has_ps, has_pe)), 8)
    (_, W), _, parts_offset = saved[1]
    g_dur = ((B, K * C), (W, 1), parts_offset + W - K * C)
    ring = (B, K + 1, C)
    scratch_numel, scratch = _pack(((B, T + 1, C), (B, T + 1), ring) + (ring,) * trans_3d, 8)
    return _TrainingLayout(saved_numel, saved + (g_dur,), scratch_numel, scratch)


def _views(flat: Tensor, layout: tuple) -> list[Tensor]:
    """Views ``(shape, strides, offset)`` of ``flat``."""
    return [flat.as_strided(shape, strides, offset) for shape, strides, offset in layout]


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
    durations_per_chunk, warps, backward_warps = config(K, C, trans_3d)
    return _Plan(
        cum=cum.contiguous(), trans=trans.contiguous(), dur=dur.contiguous(), ps=_contiguous(call.proj_start),
        pe=_contiguous(call.proj_end), lengths=call.lengths.contiguous(), B=B, T=T, C=C, K=K, K_requested=call.K,
        durations_per_chunk=durations_per_chunk, warps=warps,
        backward_warps=backward_warps, trans_3d=trans_3d, work_dtype=torch.float64 if training else cum.dtype)


def _require_interpreter(device: torch.device) -> None:
    """On a device other than CUDA the kernels run only under the Triton interpreter (set before they were built:
    otherwise the launch says so, :data:`provable_kernels.launch.LATE_INTERPRETER`)."""
    if not triton_usable(device):  # verify: unreached (internal guard: the tree checks the device)
        raise ValueError(f"cum_scores must be on a CUDA device (or on the CPU with TRITON_INTERPRET=1) for the "
                         f"Triton backend, got {device}")


def register_ring(plan: _Plan) -> bool:
    """Whether the forward kernel holds its ring in registers (``REG_RING``, one warp; module docstring of
    :mod:`~provable_kernels.semicrf.triton_forward`): 2-D transitions, every duration in one chunk, and its shift
    tile of DB * DB * CP float64 elements within :data:`REGISTER_RING_TILE` (faster than the ring in memory
    wherever it fits: ``traces/guide/semicrf-design.md``)."""
    DB = plan.durations_per_chunk
    return (not plan.trans_3d and plan.K <= DB
            and DB * DB * triton.next_power_of_2(plan.C) <= REGISTER_RING_TILE)


def _forward_launch(plan: _Plan, log: bool, chain: torch.dtype, backpointers: bool) -> Bound:
    """The forward kernel's launch for ``plan``'s sizes with the chain dtype ``chain`` (module docstring); its
    tensors: the inputs, ``out``, the rings (None, None where :func:`register_ring`) and (``backpointers``) the
    Viterbi buffers."""
    in_registers = register_ring(plan)
    return launcher(semicrf_forward_kernel).bind(
        (plan.B,), plan.sizes(), plan.options(1 if in_registers else plan.warps, ("LOG", log),
                                              ("WRITE_BP", backpointers), ("CT", chain),
                                              ("REG_RING", in_registers)))


def partition_runner(plan: _Plan, log: bool, chain: Optional[torch.dtype] = None) -> Callable[..., Tensor]:
    """``run(cum, trans, dur, ps, pe, lengths) -> (B,)``: :func:`partition` for every call with ``plan``'s sizes,
    its launch made once (the direct runner of the inference routes, ``dispatch``); ``chain``: another chain dtype
    than the inference route's (the benchmarks time the float64 chain)."""
    launch = _forward_launch(plan, log, chain or plan.work_dtype, False)
    B, dtype, device, work = plan.B, plan.cum.dtype, plan.cum.device, plan.work_dtype
    numel, trans_3d = plan.B * plan.ring_size * plan.C, plan.trans_3d  # the rings (B, KR, C), kept workspaces
    rings = None if register_ring(plan) else alloc.Workspaces(
        device, ("semicrf.ring", numel, torch.float64, False),
        *((("semicrf.ring_a", numel, work, False),) if trans_3d else ()))

    def run(cum: Tensor, trans: Tensor, dur: Tensor, ps: Optional[Tensor], pe: Optional[Tensor],
            lengths: Tensor) -> Tensor:
        out = alloc.empty((B,), dtype=dtype, device=device)
        buffers = (None,) if rings is None else rings()
        launch(cum, trans, dur, ps, pe, lengths, out, buffers[0], buffers[1] if trans_3d else None, None, None, None)
        return out
    return run


def partition(call: StreamingCall) -> Tensor:
    """logZ (``call.semiring == "log"``) or the best score (``"max"``) per sequence, (B,) in the input dtype.
    No autograd graph. The chain runs in the input dtype (float32 inputs: float32 chain, float64 offsets)."""
    plan = _plan(call)
    return partition_runner(plan, call.semiring == "log")(*plan.inputs())


class Training(NamedTuple):
    """The training launches of one signature (:func:`training_runner`): ``forward(cum, trans, dur, ps, pe,
    lengths) -> (logZ, saved)`` as :func:`train_forward`, ``backward(saved, grad_logZ) -> (g_cum, g_trans,
    g_dur, g_ps, g_pe)`` as :func:`backward`."""

    forward: Callable[..., tuple[Tensor, Tensor]]
    backward: Callable[[Tensor, Tensor], tuple]


def training_runner(plan: _Plan) -> Training:
    """The :class:`Training` launches of ``plan``'s sizes (a training plan: float64 working dtype), made once."""
    layout = plan.training_layout()
    train = launcher(semicrf_train_kernel).bind((plan.B,), plan.sizes(),
                                                plan.options(plan.backward_warps, ("CT", torch.float64)))
    B, T, C, K, dtype, device = plan.B, plan.T, plan.C, plan.K, plan.cum.dtype, plan.cum.device
    has_ps, has_pe, trans_3d, K_requested = plan.ps is not None, plan.pe is not None, plan.trans_3d, plan.K_requested
    W = layout.saved[1][0][1]  # the per-sequence sums' width
    scales: dict[int, Bound] = {}  # by grad_logZ's stride (0: the expanded gradient of logZ.sum())
    workspace = alloc.Workspaces(device, ("semicrf.training", layout.scratch_numel, torch.float64, False))

    def forward(cum: Tensor, trans: Tensor, dur: Tensor, ps: Optional[Tensor], pe: Optional[Tensor],
                lengths: Tensor) -> tuple[Tensor, Tensor]:
        saved = alloc.empty((layout.saved_numel,), dtype=torch.float64, device=device)  # every element written
        g_cum, parts, *proj, g_dur = _views(saved, layout.saved)
        g_ps = proj.pop(0) if has_ps else None
        g_pe = proj.pop(0) if has_pe else None
        alpha_a, alpha_A, ring, *ring_a = _views(workspace()[0], layout.scratch)  # FT = float64 here
        logZ = alloc.empty((B,), dtype=dtype, device=device)
        train(cum, trans, dur, ps, pe, lengths, logZ, ring, ring_a[0] if ring_a else None, alpha_a, alpha_A, g_cum,
              g_ps, g_pe, g_dur, parts)
        return logZ, saved

    def backward(saved: Tensor, grad_logZ: Tensor) -> tuple:
        unit_cum, parts, *proj, _ = _views(saved, layout.saved)
        unit_ps = proj.pop(0) if has_ps else None
        unit_pe = proj.pop(0) if has_pe else None
        g_cum = alloc.empty((B, T + 1, C), dtype=dtype, device=device)
        g_ps = alloc.empty((B, T, C), dtype=dtype, device=device) if has_ps else None
        g_pe = alloc.empty((B, T, C), dtype=dtype, device=device) if has_pe else None
        g_trans = alloc.empty((K, C, C) if trans_3d else (C, C), dtype=dtype, device=device)
        g_dur = alloc.empty((K, C), dtype=dtype, device=device)
        stride = grad_logZ.stride(0)
        scale = scales.get(stride)
        if scale is None:
            scale = scales[stride] = launcher(semicrf_scale_kernel).bind(
                (B + -(-W // SCALE_BLOCK),), (B, (T + 1) * C, T * C, W, W - K * C, stride),
                options(HAS_PS=has_ps, HAS_PE=has_pe, BLOCK=SCALE_BLOCK))
        scale(unit_cum, unit_ps, unit_pe, parts, grad_logZ, g_cum, g_ps, g_pe, g_trans, g_dur)
        if trans_3d:
            g_trans = pad_duration_rows(g_trans, K_requested)
        return g_cum, g_trans, pad_duration_rows(g_dur, K_requested), g_ps, g_pe
    return Training(forward, backward)


def train_forward(call: StreamingCall) -> tuple[Tensor, Tensor]:
    """logZ (B,) in the input dtype and ``saved``: each sequence's gradients of its own logZ, float64, in one flat
    tensor laid out as :func:`unit_shapes` (g_cum, the per-sequence transition and duration-bias sums, g_ps, g_pe),
    for :func:`backward` to scale by grad_logZ. One launch: the training kernel runs the forward recursion (float64
    chain) keeping alpha at every position, then the outside recursion over it, and writes every element of
    ``saved`` (zeros past each sequence's length)."""
    plan = _plan(call, "log", training=True)
    return training_runner(plan).forward(*plan.inputs())


def backward(call: StreamingCall, saved: Tensor, grad_logZ: Tensor) -> tuple:
    """Gradients of Σ_b grad_logZ[b] * logZ[b] w.r.t. (cum_scores, transition, duration_bias, proj_start, proj_end),
    None for an absent projection, in the input dtype, from :func:`train_forward`'s ``saved`` (B,) ``grad_logZ``
    (any float dtype, any stride, e.g. the expanded gradient of ``logZ.sum()``): one launch scales each
    sequence's rows by grad_logZ[b] and sums the transition and duration-bias parts weighted by it over the batch
    in a fixed order (float64: deterministic), stored in the input dtype."""
    plan = _plan(call, "log", training=True)
    grad_logZ = validate.tensor("grad_logZ", grad_logZ, ndim=1, dtypes=validate.FLOAT_DTYPES, device=plan.cum.device)
    validate.shape("grad_logZ", grad_logZ, (plan.B,), "(B,)")
    validate.tensor("saved", saved, ndim=1, dtypes=(torch.float64,), device=plan.cum.device)
    validate.shape("saved", saved, (plan.training_layout().saved_numel,), "(n,) from train_forward")
    return training_runner(plan).backward(saved, grad_logZ)


def viterbi(call: StreamingCall) -> ViterbiPath:
    """The best segmentation per sequence: max recursion writing backpointers, then a backtracking kernel. Ties:
    the shorter duration, then the smaller previous label (and the smaller final label)."""
    plan = _plan(call)
    bp_dur = plan.new(plan.B, plan.T + 1, plan.C, dtype=torch.int32)
    bp_prev = plan.new(plan.B, plan.T + 1, plan.C, dtype=torch.int32)
    last_label = plan.new(plan.B, dtype=torch.int32)
    scores = plan.new(plan.B, dtype=plan.cum.dtype)
    rings = (None, None) if register_ring(plan) else plan.rings()
    _forward_launch(plan, False, torch.float64, True)(*plan.inputs(), scores, *rings, bp_dur, bp_prev, last_label)
    durations = plan.new(plan.B, plan.T, dtype=torch.int64, zero=True)
    labels = plan.new(plan.B, plan.T, dtype=torch.int64, zero=True)
    launcher(semicrf_backtrack_kernel)[(plan.B,)](bp_dur, bp_prev, last_label, plan.lengths, durations, labels, plan.T,
                                       plan.C, PREV_BY_START=not plan.trans_3d, num_warps=1)
    return ViterbiPath(scores, durations, labels)
