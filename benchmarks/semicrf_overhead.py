"""Host overhead of the Triton semi-CRF inference path, split into its stages.

Run from the repository root::

    python3 benchmarks/semicrf_overhead.py --out DIR [--calls 200] [--repeats 5]

On CUDA, for B,T,K,C = 32,25,5,20 (launch-bound) and 4,1024,16,12 (latency-bound), float32 inputs, log semiring:

(a) ``make_call`` alone (argument validation; value checks in device mode: no host sync, see
    traces/guide/host-syncs.md);
(b) ``triton_ops.partition`` on a prebuilt call (plan, allocations, Triton launch);
(c) the public ``semi_crf_streaming_forward`` (a + dispatch + custom op + b), default value-check policy (device
    mode on CUDA), and (c') the same inside ``validate.value_checks("sync")`` (one host sync: named errors);
(d) the kernel alone: ``triton.testing.do_bench_cudagraph`` on (b) (graph replays: no host work), with the inference
    route's float32 chain and, for comparison, the float64 chain of the training / Viterbi routes;
(e) a public training step: forward + backward of the log partition (float64 working dtype), and (d') the
    training kernel alone (``triton_ops.train_forward``: the forward and the backward recursion in one launch).

``public_host_overhead_us`` = (c) - (d): what a public call adds over the kernel alone (requirement: <= 40 us at
32,25,5,20). (a)-(c), (e): ``torch.cuda.synchronize`` + ``time.perf_counter`` around ``--calls`` back-to-back
calls, per call, median of ``--repeats`` such loops (the host runs ahead of the GPU, so a stage costs max(host,
device) time). Prints a table and writes DIR/semicrf_overhead.json.

Run it first on an idle machine: on a lent H200 the same code read 17.5 us for (c) - (d) first in the lease
and 57-58 us right after a four-minute benchmark on that machine, with no process left running
(``benchmarks/results/semicrf_overhead_after_benchmark.json``, benchmarks/NOTES-semicrf.md).

Without CUDA it runs under the Triton interpreter (set here) on a tiny shape with few calls: a smoke check of the
script, not a measurement; (d) is then skipped.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402

from benchmarks.common import environment, print_table, write_json  # noqa: E402
from benchmarks.overhead import wall_us  # noqa: E402
from provable_kernels import validate  # noqa: E402
from provable_kernels.semicrf import triton_ops  # noqa: E402
from provable_kernels.semicrf.dispatch import make_call, semi_crf_streaming_forward  # noqa: E402

CUDA_SHAPES = [(32, 25, 5, 20), (4, 1024, 16, 12)]
CPU_SHAPES = [(2, 4, 2, 3)]
COLUMNS = [("shape", "B,T,K,C", ""), ("make_call_us", "(a) make_call us", ".1f"),
           ("partition_us", "(b) partition us", ".1f"), ("public_us", "(c) public us", ".1f"),
           ("public_sync_us", "(c') public, sync checks us", ".1f"),
           ("kernel_f32_chain_us", "(d) kernel f32 chain us", ".1f"),
           ("public_host_overhead_us", "(c)-(d) us", ".1f"), ("train_step_us", "(e) fwd+bwd us", ".1f"),
           ("kernel_train_us", "(d') training kernel us", ".1f"), ("kernel_f64_chain_us", "kernel f64 chain us", ".1f"), ("us_per_step_f32", "us/step f32", ".3f"),
           ("us_per_step_f64", "us/step f64", ".3f")]


def inputs(B: int, T: int, K: int, C: int, device: torch.device) -> tuple:
    """Random float32 arguments of ``semi_crf_streaming_forward`` (cumulative scores, full lengths)."""
    gen = torch.Generator().manual_seed(0)
    cum = torch.randn(B, T + 1, C, generator=gen).cumsum(1)
    trans, dur = torch.randn(C, C, generator=gen), torch.randn(K, C, generator=gen)
    lengths = torch.full((B,), T, dtype=torch.int64)
    return tuple(x.to(device) for x in (cum, trans, dur, lengths)) + (K,)


def kernel_us(fn: Callable[[], Any], device: torch.device) -> Optional[float]:
    """Device time of ``fn`` from CUDA-graph replays (median), in microseconds; None without CUDA. If the capture
    fails, ``do_bench`` (events, L2 flushed; its flush hides the host time of a short call) and a warning."""
    if device.type != "cuda":
        return None
    fn()
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
    except RuntimeError as exc:
        print(f"warning: CUDA-graph capture failed ({exc}); timing with do_bench instead", file=sys.stderr)
        return triton.testing.do_bench(fn, return_mode="median") * 1e3


def measure(shape: tuple[int, int, int, int], calls: int, repeats: int, device: torch.device) -> dict:
    B, T, K, C = shape
    cum, trans, dur, lengths, K = inputs(B, T, K, C, device)
    args = ("partition", cum, trans, dur, lengths, K, "log", None, None, True)
    call = make_call(*args)
    plan = triton_ops._plan(call)
    public = lambda: semi_crf_streaming_forward(cum, trans, dur, lengths, K)  # noqa: E731
    leaves = [x.clone().requires_grad_() for x in (cum, trans, dur)]

    def train_step() -> None:
        semi_crf_streaming_forward(*leaves, lengths, K).sum().backward()

    def public_sync() -> None:
        with validate.value_checks("sync"):
            public()

    row = dict(shape=",".join(map(str, shape)),
               make_call_us=wall_us(lambda: make_call(*args), calls, repeats, device),
               partition_us=wall_us(lambda: triton_ops.partition(call), calls, repeats, device),
               public_us=wall_us(public, calls, repeats, device),
               public_sync_us=wall_us(public_sync, calls, repeats, device),
               train_step_us=wall_us(train_step, calls, repeats, device),
               kernel_f32_chain_us=kernel_us(lambda: triton_ops.partition(call), device),
               kernel_f64_chain_us=kernel_us(lambda: triton_ops._forward(plan, True, torch.float64), device),
               kernel_train_us=kernel_us(lambda: triton_ops.train_forward(call), device))
    for chain in ("f32", "f64"):
        value = row[f"kernel_{chain}_chain_us"]
        row[f"us_per_step_{chain}"] = None if value is None else value / T
    kernel = row["kernel_f32_chain_us"]
    row["public_host_overhead_us"] = None if kernel is None else row["public_us"] - kernel
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for semicrf_overhead.json")
    parser.add_argument("--calls", type=int, default=None, help="calls per timed loop (CUDA 200, CPU 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed loops per stage (CUDA 5, CPU 1)")
    opts = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    calls = opts.calls or (200 if cuda else 2)
    repeats = opts.repeats or (5 if cuda else 1)
    rows = [measure(shape, calls, repeats, device) for shape in (CUDA_SHAPES if cuda else CPU_SHAPES)]
    opts.out.mkdir(parents=True, exist_ok=True)
    write_json(opts.out / "semicrf_overhead.json",
               dict(environment=environment(device), calls=calls, repeats=repeats, smoke_only=not cuda, rows=rows))
    print_table(f"semi-CRF inference path, float32, log ({device.type}{'' if cuda else ': interpreter smoke check'})",
                rows, COLUMNS)


if __name__ == "__main__":
    main()
