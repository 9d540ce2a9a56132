"""The ``observed`` check: the route's checks see every Triton kernel it launches.

Every Triton launch of the library goes through :meth:`provable_kernels.launch.Launcher.launch` or, prepared once
per signature, :class:`provable_kernels.launch.Bound` (whose compiled fast path skips the former: both are
watched). The check runs the route's case once recording which kernels launch (:func:`kernel_launches`), then, for each
kernel launched, runs the case again with every launch of that kernel replaced by a no-op, under
:func:`provable_kernels.alloc.poisoned` (what the kernel should have written keeps NaN /
:data:`provable_kernels.alloc.POISON_INT`). That run must fail the route's checks: raise (the ``route`` check
fails), crash, or give outputs that the float64 reference comparison rejects (a NaN counts as an infinite error).
A kernel whose removal the reference comparison does not notice fails the check: the route's checks would pass
without it, so they do not prove it right.

Each kernel-less run happens in a child process (forked on the CPU, spawned on a GPU): a later kernel that reads
the missing kernel's poisoned indices may read or write any address (the interpreter reads raw memory; a GPU
context would be lost), and none of that may touch the verifying process or its output. A run still going after
:data:`TIME_LIMIT` seconds (e.g. a loop bounded by a poisoned count) is killed and counts as noticed: the
verification would not finish.

What it cannot see: kernels the case does not launch (a kernel that runs only on other inputs is observed only on
the routes whose case launches it), and each
kernel is removed as a whole (all its launches), not launch by launch. A route that launches no Triton kernel
(a PyTorch route) passes with "not applicable".
"""
from __future__ import annotations

import faulthandler
import functools
import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from provable_kernels import alloc
from kernel_sentinel.checks import compare_outputs, kernel_launches, run_route
from kernel_sentinel.family import Case, Family, Tolerance
from kernel_sentinel.generic import Verdict, fresh_case

TIME_LIMIT = 300.0  # seconds a kernel-less run may take


def launched_kernels(family: Family, case: Case) -> list[str]:
    """The kernels one run of ``case`` launches, each once, in the order of their first launch."""
    with kernel_launches() as launched:
        run_route(family.run, fresh_case(case))
    return list(dict.fromkeys(launched))


def kernelless_run(family: Family, case: Case, want: Any, tolerance: Tolerance, kernel: str) -> tuple[bool, str]:
    """Run ``case`` with ``kernel`` removed and allocations poisoned: ``(noticed, how)``; ``want`` is the float64
    reference of ``case``."""
    try:
        with alloc.poisoned(), kernel_launches(removed=kernel):
            got = run_route(family.run, fresh_case(case))
    except Exception as exc:
        return True, f"raised {type(exc).__name__}: {str(exc)[:160]}"
    failing = [m for m in compare_outputs(got, want, tolerance, "float64 reference") if not m.ok]
    if failing:
        names = ", ".join(m.label.removeprefix("float64 reference: ") for m in failing)
        return True, f"reference comparison fails ({names})"
    return False, "outputs still match the float64 reference"


def _spawned_run(family_name: str, route_id: str, size: str, dtype: str, device: str, seed: int,
                 kernel: str) -> tuple[bool, str]:
    """:func:`kernelless_run` in a spawned process: the family, case and reference rebuilt from their names."""
    from kernel_sentinel import device as devices
    from kernel_sentinel import registry

    devices.prepare(device)
    family = registry.family(family_name)
    case = family.make_case(route_id, size=size, dtype=getattr(torch, dtype), device=torch.device(device),
                            seed=seed)
    tolerance = family.tolerance(getattr(torch, dtype))
    return kernelless_run(family, case, family.reference(case), tolerance, kernel)


def _child(conn: Any, job: Callable[[], tuple[bool, str]], output: str) -> None:
    faulthandler.disable()  # a crash's stack dump is not the verifier's output (the exit code is reported)
    with open(output, "wb") as sink:  # nor is what the child prints (a lost CUDA context's "terminate called ...")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    try:
        conn.send(job())
    except BaseException as exc:  # what the job could not handle: the kernel-less run failed
        conn.send((True, f"raised {type(exc).__name__}: {str(exc)[:160]}"))
    conn.close()


def in_child(job: Callable[[], tuple[bool, Any]], context: str, limit: float = TIME_LIMIT) -> tuple[bool, Any]:
    """``job()`` in a child process of the multiprocessing ``context`` (``fork``: ``job`` may be any callable;
    ``spawn``: a picklable one). A child that raises, dies or runs past ``limit`` seconds gives ``(True, what
    happened)``: noticed (a kernel-less run), or raised (a device-mode run). What the child prints goes to a
    temporary file, not to the verifier's output; a child that died is reported with its last line."""
    ctx = multiprocessing.get_context(context)
    receive, send = ctx.Pipe(duplex=False)
    handle, output = tempfile.mkstemp(prefix="sentinel-child-", suffix=".log")
    os.close(handle)
    process = ctx.Process(target=_child, args=(send, job, output), daemon=True)
    start = time.perf_counter()
    process.start()
    send.close()
    try:
        if receive.poll(limit):
            return receive.recv()
        if process.is_alive():
            return True, f"ran past {limit:.0f} s (killed)"
    except EOFError:  # the child died before it sent anything
        pass
    finally:
        if process.is_alive() and time.perf_counter() - start >= limit:
            process.kill()
        process.join()
        receive.close()
        lines = Path(output).read_bytes().decode(errors="replace").strip().splitlines()
        os.remove(output)
    last = f": {lines[-1].strip()[:160]}" if lines else ""
    return True, f"the process died (exit code {process.exitcode}{last})"


def observe(family: Family, case: Case, *, size: str, dtype: torch.dtype, seed: int,
            kernels: Optional[list[str]] = None) -> Verdict:
    """The ``observed`` verdict of ``case``, the route's case of ``size`` at ``dtype`` built with ``seed``: every
    kernel it launches (``kernels``, when a run of it has listed them already: :func:`launched_kernels`) must be
    noticed when removed (module docstring)."""
    if not isinstance(case, Case):
        raise TypeError(f"case must be a Case, got {type(case).__name__}")
    kernels = launched_kernels(family, case) if kernels is None else kernels
    if not kernels:
        return Verdict((), "not applicable: the route launches no Triton kernel (a PyTorch route)")
    want, tolerance, device = family.reference(case), family.tolerance(dtype), _device(case)
    problems, noticed = [], []
    for kernel in kernels:
        if device.type == "cpu":
            job = functools.partial(kernelless_run, family, case, want, tolerance, kernel)
            seen, how = in_child(job, "fork")
        else:
            job = functools.partial(_spawned_run, family.name, case.route_id, size,
                                    str(dtype).removeprefix("torch."), device.type, seed, kernel)
            seen, how = in_child(job, "spawn")
        if seen:
            noticed.append(f"{kernel}: {how}")
        else:
            problems.append(f"without {kernel} the route's checks still pass: {how} (the checks do not see it)")
    summary = (f"{len(noticed)}/{len(kernels)} kernels noticed when removed (launches replaced by a no-op, "
               f"allocations poisoned)" + (f": {'; '.join(noticed)}" if noticed else ""))
    return Verdict(tuple(problems), summary)


def _device(case: Case) -> torch.device:
    """The device of the case's tensor arguments (the CPU when it has none)."""
    tensors = [x for x in case.kwargs.values() if isinstance(x, torch.Tensor)]
    return tensors[0].device if tensors else torch.device("cpu")
