"""Compile the segment forward kernels (chunk, combine, count) for sm_90 on the CPU, no GPU needed, and time them:
the plans of the four benchmark shapes, sum / mean / max (with and without arg) / min, four dtypes at 4M x 64.

    PYTHONPATH=<tree with provable_kernels> python3 benchmarks/segment_xcompile.py [--count-only]
"""
import inspect, sys, time
import triton, triton.language as tl
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from provable_kernels.segment.triton_segment import segment_chunk_kernel, segment_combine_kernel
from provable_kernels.segment import triton_ops

DT = {"fp32": tl.float32, "fp64": tl.float64, "bf16": tl.float32, "fp16": tl.float32}

def compile_one(kernel, dt, idx, constexprs):
    ptr = {"x_ptr": f"*{dt}", "offsets_ptr": f"*{idx}", "first_ptr": "*i32", "chunk_seg_ptr": "*i32",
           "empty_ptr": f"*{dt}", "out_ptr": f"*{dt}", "arg_ptr": "*i32",
           "part_v_ptr": "*fp64" if dt == "fp64" else "*fp32", "part_i_ptr": "*i32"}
    sig = {n: ("constexpr" if n in constexprs else ptr.get(n, "i32")) for n in inspect.signature(kernel.fn).parameters}
    t = time.time()
    k = triton.compile(ASTSource(kernel, sig, constexprs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    return time.time() - t, k

SHAPES = {"4M,64,65536": (4 << 20, 64, 65536), "1M,256,1024": (1 << 20, 256, 1024),
          "16M,16,1M": (16 << 20, 16, 1 << 20), "16M,16,1": (16 << 20, 16, 1)}
jobs = []
for name, (N, D, S) in SHAPES.items():
    for red, code, arg in (("sum", 0, False), ("mean", 1, False), ("max", 2, True), ("max", 2, False), ("min", 3, True)):
        dts = ("fp32", "fp64", "bf16", "fp16") if name == "4M,64,65536" else ("fp32",)
        for dt in dts:
            jobs.append((name, triton_ops.plan(N, D, S, code >= 2), red, code, arg, dt))
total = 0
for name, p, red, code, arg, dt in ([] if "--count-only" in sys.argv else jobs):
    ce = dict(R=p.chunk, G=p.groups, L=p.lanes, BD=p.block_d, REDUCE=code, STORE_ARG=arg, ACC=DT[dt])
    sec, k = compile_one(segment_chunk_kernel, dt, "i64", ce)
    ce2 = dict(G=p.combine_groups, L=p.combine_lanes, BD=p.block_d, REDUCE=code, STORE_ARG=arg, ACC=DT[dt])
    sec2, k2 = compile_one(segment_combine_kernel, dt, "i64", ce2)
    total += sec + sec2
    print(f"{name:12s} {red:4s} arg={int(arg)} {dt}: chunk R={p.chunk} G={p.groups} L={p.lanes} BD={p.block_d} "
          f"{sec:.1f} s (smem {k.metadata.shared}); combine G={p.combine_groups} "
          f"L={p.combine_lanes} {sec2:.1f} s (smem {k2.metadata.shared})", flush=True)
print(f"total {total:.1f} s for {2 * len(jobs)} kernels")
from provable_kernels.segment.triton_segment import segment_chunk_count_kernel
for idx in ("i32", "i64"):
    sig = {"offsets_ptr": f"*{idx}", "first_ptr": "*i32", "S": "i32", "R": "constexpr", "BS": "constexpr"}
    t0 = time.time()
    triton.compile(ASTSource(segment_chunk_count_kernel, sig, dict(R=4096, BS=triton_ops.COUNT_SEGMENTS)),
                   target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    print(f"count kernel offsets {idx}: {time.time() - t0:.1f} s")
