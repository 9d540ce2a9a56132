"""Every Triton kernel of every family compiles for a Hopper GPU (``cuda``, sm_90) on a machine without a GPU.

The interpreter runs a kernel's Python on the CPU and cannot see what only Triton's compiler rejects: a Python list
inside a kernel (the GPU machine's Triton 3.6 refused one that the interpreter ran), a construct the code generator
does not support, a tile that ptxas cannot place. Here each family's routes run their tiny case at every declared
dtype under the interpreter while every launch is recorded (kernel, argument types, constexprs and launch options);
a fresh process without the interpreter then compiles each distinct specialisation with Triton's own compiler for
sm_90, ptxas included. CI runs this with the newest Triton and with the lowest declared one (the GPU machine's).
The constexprs are those the interpreter's cases choose (small tiles), so it proves that the code compiles, not
that the GPU's own sizes fit in registers: ``sentinel verify --device cuda`` does that.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton.language as tl

from kernel_sentinel import registry
from provable_kernels.launch import Launcher

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, sentinel verify compiles every kernel")

POINTER = {torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
           torch.int32: "*i32", torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")


def _type(value: object) -> str:
    """Triton's signature type of a runtime argument."""
    if isinstance(value, torch.Tensor):
        return POINTER[value.dtype]
    if value is None:
        return "constexpr"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    return "fp32"


def _constant(value: object) -> object:
    """A constexpr as JSON: a Triton dtype by name."""
    return {"dtype": value.name} if isinstance(value, tl.dtype) else value


def _launches() -> list[dict]:
    """Every distinct specialisation the families' tiny cases launch (module docstring)."""
    seen: dict[str, dict] = {}
    launch = Launcher.launch

    def record(self, grid, args, opts):
        fn = self.kernel.fn
        names = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
        job = dict(module=fn.__module__, kernel=fn.__name__,
                   signature={name: _type(a) for name, a in zip(names, args)},
                   constants={name: _constant(v) for name, v in opts.meta.items() if name not in LAUNCH_OPTIONS},
                   options={name: opts.meta[name] for name in LAUNCH_OPTIONS if name in opts.meta})
        job["constants"].update({name: None for name, a in zip(names, args) if a is None})
        seen.setdefault(json.dumps(job, sort_keys=True), job)
        return launch(self, grid, args, opts)

    Launcher.launch = record
    try:
        for family in registry.families():
            for route in family.routes():
                for dtype in family.dtypes:
                    case = family.make_case(route.id, size="tiny", dtype=dtype, device=torch.device("cpu"), seed=0)
                    family.run(case)
    finally:
        Launcher.launch = launch
    return list(seen.values())


COMPILE = textwrap.dedent("""
    import importlib, json, sys
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dtypes = {t.name: t for t in vars(tl).values() if isinstance(t, tl.dtype)}
    failed = []
    for job in json.load(sys.stdin):
        kernel = getattr(importlib.import_module(job["module"]), job["kernel"])
        constants = {name: dtypes[v["dtype"]] if isinstance(v, dict) else v for name, v in job["constants"].items()}
        signature = {**job["signature"], **{name: "constexpr" for name in constants}}
        names = list(kernel.arg_names)
        source = ASTSource(fn=kernel, signature={n: signature[n] for n in names},
                           constexprs={(names.index(n),): v for n, v in constants.items()})
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32), options=job["options"])
        except Exception as exc:  # every failure is reported, not only the first
            failed.append(f"{job['module']}.{job['kernel']} {job['constants']}: {type(exc).__name__}: {exc}")
    print(json.dumps(failed))
""")


def test_every_kernel_compiles_for_sm90():
    jobs = _launches()
    kernels = {(job["module"], job["kernel"]) for job in jobs}
    assert len(kernels) >= 10, sorted(kernels)  # every family's kernels were reached
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(failed)
