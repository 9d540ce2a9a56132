"""GPU checks of the semi-CRF in training loops (issue: custom ops, compile, CUDA graphs, precision, overhead).

Run on a CUDA machine from the repository root::

    python3 benchmarks/gpu_semicrf_training.py --out DIR [--calls 200] [--repeats 5] [--only opcheck,compile]

(``--only``: a comma-separated subset of the sections below, to split the run over several device calls; the JSON
is then named after them.)

Sections (each recorded as passed / failed with its evidence; the exit code is 1 when any failed):

1. ``opcheck``: ``torch.library.opcheck`` of every semi-CRF custom op on CUDA tensors, both backends.
2. ``compile``: ``torch.compile(fullgraph=True)`` (inductor) of a module calling ``semi_crf_streaming_forward`` and
   of ``SemiMarkovCRFHead.compute_loss``: zero graph breaks (fullgraph) and values / gradients equal to eager.
3. ``cudagraph``: a forward+backward training step of the public API captured in a CUDA graph and replayed on new
   values written into the static inputs: same loss and gradients as eager; a replay with a NaN in the inputs
   gives NaN (device-mode value checks), never a number.
4. ``precision``: the accuracy-vs-scale table of the float32 Triton training route against the PyTorch route run in
   float64 on the same (rounded) inputs: logZ relative error, gradients norm-wise relative error, for random
   scores scaled by 1 .. 1e6 and for large offsets that leave the distribution unchanged (non-trivial marginals).
   Requirement up to 1e4: logZ <= 1e-6, gradients <= 1e-4.
5. ``mixed``: bfloat16 / float16 inputs computed in float32, gradients in each input's dtype.
6. ``overhead``: ``benchmarks/semicrf_overhead.py`` (public call vs kernel alone at 32,25,5,20 and 4,1024,16,12)
   and a training step (forward + backward) at 32,25,5,20. Requirement: public-call host overhead <= 40 us.

Writes DIR/semicrf_training.json and prints one table per section. Without CUDA it runs every section that can
run under the Triton interpreter on tiny shapes (a smoke check of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import semicrf_overhead  # noqa: E402
from benchmarks.common import environment, normwise_rel_error, print_table, write_json  # noqa: E402
from provable_kernels import validate  # noqa: E402
from provable_kernels.semicrf import SemiMarkovCRFHead, autograd, semi_crf_streaming_forward  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
SCALES = (1.0, 1e2, 1e4, 1e6)
PRECISION_SHAPE = (8, 256, 8, 8) if CUDA else (2, 6, 3, 3)
STEP_SHAPE = (32, 25, 5, 20) if CUDA else (2, 4, 2, 3)


def model(B: int, T: int, K: int, C: int, *, dtype=torch.float32, trans3d=False, proj=False, variable=True,
          scale=1.0, seed=0) -> dict[str, Any]:
    """Random semi-CRF arguments on DEVICE: float64 draws scaled by ``scale``, rounded once to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * scale  # noqa: E731
    cum = torch.cat([torch.zeros(B, 1, C, dtype=torch.float64), r(B, T, C).cumsum(1)], 1)
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g) if variable else torch.full((B,), T)
    lengths[0] = T
    out = dict(cum_scores=cum, transition=r(K, C, C) if trans3d else r(C, C), duration_bias=r(K, C),
               proj_start=r(B, T, C) if proj else None, proj_end=r(B, T, C) if proj else None)
    out = {k: None if v is None else v.to(DEVICE, dtype) for k, v in out.items()}
    return dict(out, lengths=lengths.to(DEVICE), K=K)


TENSORS = ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end")


def run_route(args: dict, *, use_triton: bool, dtype=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """logZ and the gradients of sum(w * logZ) for fresh leaves (optionally cast to ``dtype``)."""
    leaves = {k: None if args[k] is None else args[k].detach().to(dtype or args[k].dtype).requires_grad_()
              for k in TENSORS}
    value = semi_crf_streaming_forward(leaves["cum_scores"], leaves["transition"], leaves["duration_bias"],
                                       args["lengths"], args["K"], proj_start=leaves["proj_start"],
                                       proj_end=leaves["proj_end"], use_triton=use_triton)
    weights = torch.linspace(0.5, 1.5, value.shape[0], device=value.device, dtype=value.dtype)
    present = [t for t in leaves.values() if t is not None]
    return value.detach(), list(torch.autograd.grad((value * weights).sum(), present))


class Section:
    """Collects the rows and the verdict of one section."""

    def __init__(self, name: str):
        self.name, self.rows, self.passed, self.error = name, [], True, None

    def check(self, ok: bool, row: dict) -> None:
        row["ok"] = bool(ok)
        self.passed &= bool(ok)
        self.rows.append(row)


def section(name: str, body: Callable[[Section], None]) -> Section:
    result = Section(name)
    start = time.perf_counter()
    try:
        body(result)
    except Exception as exc:  # recorded, the next section still runs
        result.passed, result.error = False, "".join(traceback.format_exception(exc))[-4000:]
        print(result.error, file=sys.stderr)
    result.seconds = time.perf_counter() - start
    print(f"== {name}: {'passed' if result.passed else 'FAILED'} ({result.seconds:.1f} s)")
    return result


# ---------------------------------------------------------------------------------------------------- sections


def opcheck(out: Section) -> None:
    args = model(2, 5, 3, 3, proj=True)
    base = [args[k] for k in TENSORS]
    cum, trans, dur, ps, pe = base
    lengths, K = args["lengths"], args["K"]
    for backend in ("triton", "torch"):
        leaves = [x.clone().requires_grad_() for x in (cum, trans, dur, ps)]
        saved = autograd._log_forward_op(cum, trans, dur, lengths, ps, pe, K, backend)[1:]
        cases = {
            "partition log": (autograd._partition_op, (cum, trans, dur, lengths, ps, pe, K, "log", backend)),
            "partition max": (autograd._partition_op, (cum, trans, dur, lengths, None, None, K, "max", backend)),
            "log_forward": (autograd._log_forward_op, (*leaves[:3], lengths, leaves[3], None, K, backend)),
            "log_backward": (autograd._log_backward_op, (cum, trans, dur, lengths, ps, pe, saved,
                                                         torch.ones(2, device=DEVICE), K, backend)),
            "viterbi": (autograd._viterbi_op, (cum, trans, dur, lengths, ps, pe, K, backend)),
        }
        for name, (op, op_args) in cases.items():
            try:
                report = torch.library.opcheck(op.custom_op, op_args)
                out.check(all(v == "SUCCESS" for v in report.values()), dict(backend=backend, op=name,
                                                                               result=str(report)))
            except Exception as exc:
                out.check(False, dict(backend=backend, op=name, result=f"{type(exc).__name__}: {exc}"[:500]))


class Scorer(torch.nn.Module):
    """Linear label scores, prefix sums, the streaming partition."""

    def __init__(self, H: int, C: int, K: int):
        super().__init__()
        self.K = K
        self.linear = torch.nn.Linear(H, C)
        self.transition = torch.nn.Parameter(0.1 * torch.randn(C, C))
        self.duration_bias = torch.nn.Parameter(0.1 * torch.randn(K, C))

    def forward(self, hidden, lengths):
        scores = self.linear(hidden)
        cum = torch.cat([scores.new_zeros(scores.shape[0], 1, scores.shape[2]), scores.cumsum(1)], 1)
        return semi_crf_streaming_forward(cum, self.transition, self.duration_bias, lengths, self.K)


def _values_and_grads(fn, module, *args):
    module.zero_grad()
    value = fn(*args)
    (value * torch.linspace(0.5, 1.5, value.numel(), device=value.device).view(value.shape)).sum().backward()
    return value.detach(), [p.grad.clone() for p in module.parameters()]


def _compare(out: Section, what: str, got, want, tol: float) -> None:
    errors = [normwise_rel_error(got[0], want[0])] + [normwise_rel_error(a, b) for a, b in zip(got[1], want[1])]
    out.check(max(errors) <= tol, dict(what=what, value_error=errors[0], worst_grad_error=max(errors[1:])))


def compile_check(out: Section) -> None:
    torch.manual_seed(0)
    B, T, K, C = STEP_SHAPE
    module = Scorer(16, C, K).to(DEVICE)
    hidden = torch.randn(B, T, 16, device=DEVICE)
    lengths = torch.randint(1, T + 1, (B,), device=DEVICE)
    compiled = torch.compile(module, fullgraph=True)
    _compare(out, "module calling semi_crf_streaming_forward", _values_and_grads(compiled, module, hidden, lengths),
             _values_and_grads(module, module, hidden, lengths), 1e-5)
    head = SemiMarkovCRFHead(C, K, hidden_dim=16).to(DEVICE)
    labels = (torch.arange(T, device=DEVICE) // K % C).expand(B, T)  # runs of K positions: a valid gold
    loss = lambda h: head.compute_loss(h, lengths, labels, reduction="none")  # noqa: E731
    compiled_loss = torch.compile(loss, fullgraph=True)
    _compare(out, "SemiMarkovCRFHead.compute_loss", _values_and_grads(compiled_loss, head, hidden),
             _values_and_grads(loss, head, hidden), 1e-5)


def cudagraph_check(out: Section) -> None:
    if not CUDA:
        out.check(True, dict(what="skipped: no CUDA"))
        return
    B, T, K, C = STEP_SHAPE
    args = model(B, T, K, C)
    static = {k: args[k].clone().requires_grad_() for k in TENSORS[:3]}
    lengths = args["lengths"].clone()

    def step():
        for t in static.values():
            t.grad = None
        loss = semi_crf_streaming_forward(static["cum_scores"], static["transition"], static["duration_bias"],
                                          lengths, K).sum()
        loss.backward()
        return loss

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on a side stream, as CUDA graphs require
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for t in static.values():
        t.grad = None
    with torch.cuda.graph(graph):
        static_loss = step()
    static_grads = [t.grad for t in static.values()]
    for seed in (1, 2):
        fresh = model(B, T, K, C, seed=seed)
        with torch.no_grad():
            for k in static:
                static[k].copy_(fresh[k])
        lengths.copy_(fresh["lengths"])
        graph.replay()
        torch.cuda.synchronize()
        want_value = semi_crf_streaming_forward(*(fresh[k] for k in TENSORS[:3]), fresh["lengths"], K)
        weights_free = [normwise_rel_error(a, b) for a, b in zip(static_grads, _unit_weight_grads(fresh))]
        value_error = abs(float(static_loss) - float(want_value.sum())) / abs(float(want_value.sum()))
        out.check(value_error <= 1e-6 and max(weights_free) <= 1e-6,
                  dict(what=f"replay on new values (seed {seed})", value_error=value_error,
                       worst_grad_error=max(weights_free)))
    with torch.no_grad():
        static["cum_scores"][0, 1, 0] = math.nan
    graph.replay()
    torch.cuda.synchronize()
    # The poisoned value carries NaN into every gradient; entries past a sequence's length get no gradient
    # from the Triton backward at all (structural zeros), so "NaN gradients" means NaN in every gradient tensor.
    out.check(bool(torch.isnan(static_loss)) and all(bool(torch.isnan(g).any()) for g in static_grads),
              dict(what="replay with a NaN in cum_scores: NaN loss and gradients"))


def _unit_weight_grads(args: dict) -> list[torch.Tensor]:
    leaves = [args[k].detach().clone().requires_grad_() for k in TENSORS[:3]]
    value = semi_crf_streaming_forward(*leaves, args["lengths"], args["K"])
    return list(torch.autograd.grad(value.sum(), leaves))


def precision(out: Section) -> None:
    B, T, K, C = PRECISION_SHAPE
    for trans3d in (False, True):
        for kind in ("random", "offsets"):
            for scale in SCALES:
                if kind == "random":
                    args = model(B, T, K, C, trans3d=trans3d, proj=True, scale=scale, dtype=torch.float32)
                else:  # +scale per position to every label, +scale to transitions, -scale to duration biases
                    args = model(B, T, K, C, trans3d=trans3d, dtype=torch.float64)
                    steps = torch.arange(T + 1, device=DEVICE, dtype=torch.float64)[None, :, None]
                    args = dict(args, cum_scores=(args["cum_scores"] + scale * steps).float(),
                                transition=(args["transition"] + scale).float(),
                                duration_bias=(args["duration_bias"] - scale).float())
                value, grads = run_route(args, use_triton=True)
                ref_value, ref_grads = run_route(args, use_triton=False, dtype=torch.float64)
                logz = float(((value.double() - ref_value).abs() / ref_value.abs()).max())
                grad = max(normwise_rel_error(a, b) for a, b in zip(grads, ref_grads))
                required = scale <= 1e4
                out.check(not required or (logz <= 1e-6 and grad <= 1e-4),
                          dict(transition="3-D" if trans3d else "2-D", inputs=kind, scale=scale, logZ_rel=logz,
                               grad_normwise_rel=grad, required=required))


def mixed(out: Section) -> None:
    args = model(4, 16, 4, 5, proj=True)
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16, torch.float16)
    leaves = {k: args[k].to(d).requires_grad_() for k, d in zip(TENSORS, dtypes)}
    value = semi_crf_streaming_forward(leaves["cum_scores"], leaves["transition"], leaves["duration_bias"],
                                       args["lengths"], args["K"], proj_start=leaves["proj_start"],
                                       proj_end=leaves["proj_end"])
    value.sum().backward()
    upcast = {k: v.detach().float() for k, v in leaves.items()}
    want, _ = run_route(dict(args, **upcast), use_triton=True)
    out.check(value.dtype == torch.float32 and all(leaves[k].grad.dtype == d for k, d in zip(TENSORS, dtypes))
              and torch.equal(value.detach(), want),
              dict(what="bf16/fp16/fp32 arguments", value_dtype=str(value.dtype),
                   grad_dtypes=[str(leaves[k].grad.dtype) for k in TENSORS]))


def overhead(out: Section, calls: int, repeats: int) -> None:
    for shape in (semicrf_overhead.CUDA_SHAPES if CUDA else semicrf_overhead.CPU_SHAPES):
        row = semicrf_overhead.measure(shape, calls, repeats, DEVICE)
        host = row.get("public_host_overhead_us")
        required = CUDA and shape == (32, 25, 5, 20)
        out.check(not required or (host is not None and host <= 40.0), dict(row, required=required))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for semicrf_training.json")
    parser.add_argument("--calls", type=int, default=None, help="calls per timed loop (CUDA 200, CPU 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed loops (CUDA 5, CPU 1)")
    parser.add_argument("--only", default=None, help="comma-separated sections to run (default: all)")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    calls, repeats = opts.calls or (200 if CUDA else 2), opts.repeats or (5 if CUDA else 1)
    bodies = {"opcheck": opcheck, "compile": compile_check, "cudagraph": cudagraph_check, "precision": precision,
              "mixed": mixed, "overhead": lambda s: overhead(s, calls, repeats)}
    chosen = list(bodies) if opts.only is None else opts.only.split(",")
    unknown = sorted(set(chosen) - set(bodies))
    if unknown:
        parser.error(f"--only: unknown sections {unknown}; choose from {list(bodies)}")
    sections = [section(name, bodies[name]) for name in chosen]
    for s in sections:
        if s.rows:
            columns = [(k, k, ".3g" if isinstance(v, float) else "") for k, v in s.rows[0].items()]
            print_table(f"{s.name}: {'passed' if s.passed else 'FAILED'}", s.rows, columns)
    name = "semicrf_training" if opts.only is None else "semicrf_training-" + "-".join(chosen)
    write_json(opts.out / f"{name}.json", dict(
        environment=environment(DEVICE), smoke_only=not CUDA, passed=all(s.passed for s in sections),
        sections={s.name: dict(passed=s.passed, seconds=s.seconds, error=s.error, rows=s.rows) for s in sections}))
    return 0 if all(s.passed for s in sections) else 1


if __name__ == "__main__":
    with validate.value_checks("auto"):
        sys.exit(main())
