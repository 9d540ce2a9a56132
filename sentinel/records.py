"""Verification results and the records ``sentinel verify --record`` writes for the trace generator and the gate.

A route result (also the route objects of the JSON report)::

    {"id", "family", "dtype": "float32"|..., "status": "pass"|"fail",
     "checks": [{"name", "status", "max_abs", "max_rel", "atol", "rtol", "of_tol", "detail", "repro", "seconds"}]}

A route runs once per input dtype of its family, so results are keyed by ``(id, dtype)`` (:func:`row_key`).

Errors and tolerances are floats, or null where nothing was compared or the error is not finite. ``seconds`` is
the check's wall time (kernel compilation included), or null where it was not measured.

A record, ``traces/verification/<family>-<device slug>.json``::

    {"family", "device": {"type": "cuda"|"cpu", "name", "gpus"}, "versions": {"torch", "triton", "python"},
     "commit": <git HEAD>, "sources": {<repo-relative path>: <git blob id>}, "routes": [<route result>]}

written with sorted keys, indent 2 and a trailing newline (a re-record changes at least the ``seconds``). On CUDA
``gpus`` lists the model of every GPU the run used (``sentinel verify --devices``), and ``name`` is the distinct
models joined by `` + ``: a record made on four H100s is an H100 record, with the slug and file of a one-GPU H100
record. Records written before ``gpus`` existed ran on one GPU (:func:`gpus`).

A check that had nothing to check on the machine it ran on passes with a detail starting with
:data:`NOT_APPLICABLE`; the ``devices`` check does so below two GPUs, and :func:`cross_device` tells a record with
cross-device evidence from one without.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from kernel_sentinel.family import Family, project_root

RECORD_DIR = Path("traces") / "verification"
NOT_APPLICABLE = "not applicable: "  # a passing check's detail starts with it when it had nothing to check


def _number(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class CheckResult:
    """One check of one route. ``max_abs``/``max_rel``/``atol``/``rtol`` are None where nothing was compared;
    ``of_tol`` is the largest ``|x - ref| / (atol + rtol * |ref|)``, the criterion (it passes at ``<= 1``)."""

    name: str
    passed: bool
    detail: str
    repro: str
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None
    of_tol: Optional[float] = None
    seconds: Optional[float] = field(default=None, compare=False)  # wall time; not part of the result's identity

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "max_abs": _number(self.max_abs),
            "max_rel": _number(self.max_rel),
            "atol": _number(self.atol),
            "rtol": _number(self.rtol),
            "of_tol": _number(self.of_tol),
            "detail": self.detail,
            "repro": self.repro,
            "seconds": None if self.seconds is None else round(self.seconds, 2),
        }


@dataclass(frozen=True)
class RouteResult:
    """Every check of one route at one input dtype; it passes when it has checks and all of them pass."""

    id: str
    family: str
    checks: Sequence[CheckResult] = field(default_factory=tuple)
    dtype: str = "float32"

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "family": self.family, "dtype": self.dtype, "status": self.status,
                "checks": [c.as_dict() for c in self.checks]}


def row_key(route: dict[str, Any]) -> tuple[str, str]:
    """``(route id, dtype)`` of a route result as written in a record (records written before results had a
    dtype verified float32 only)."""
    return route["id"], route.get("dtype", "float32")


# ----------------------------------------------------------------------------------------------------- git


def git(*args: str) -> str:
    """Output of ``git <args>`` in the repository sentinel works in (:func:`~kernel_sentinel.family.project_root`;
    stripped); raises ``RuntimeError`` when git fails."""
    done = subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def head_commit() -> str:
    """``SENTINEL_COMMIT`` when set (a copy of the tree sent to a GPU machine names the commit it was made from;
    a git checkout found there may be another one), else the sha of HEAD, else ``"unknown"``. The record's blob
    ids, not this, identify the sources."""
    if os.environ.get("SENTINEL_COMMIT"):
        return os.environ["SENTINEL_COMMIT"]
    try:
        return git("rev-parse", "HEAD")
    except (RuntimeError, OSError):
        return "unknown"


def blob_ids(paths: Sequence[Path]) -> dict[str, str]:
    """``{repo-relative path: git blob id of the working-tree file}`` (``git hash-object``)."""
    names = [str(p) for p in paths]
    if not names:
        return {}
    ids = git("hash-object", "--", *names).splitlines()
    return dict(zip(names, ids))


# -------------------------------------------------------------------------------------------------- device


def device_slug(device: dict[str, str]) -> str:
    """``cpu``, or ``cuda-`` and the lower-cased device name with runs of other characters as ``-``
    (e.g. ``cuda-nvidia-h100-80gb-hbm3``)."""
    if device["type"] == "cpu":
        return "cpu"
    return device["type"] + "-" + re.sub(r"[^a-z0-9]+", "-", device["name"].lower()).strip("-")


def gpus(device: dict[str, Any]) -> list[str]:
    """The model of each GPU a record's (or report's) ``device`` ran on: ``device["gpus"]``, one GPU named
    ``name`` in records older than that key, none on the CPU."""
    if device["type"] != "cuda":
        return []
    return list(device.get("gpus") or [device["name"]])


def device_text(device: dict[str, Any]) -> str:
    """``device`` in words: its name, with the GPU count when several (``4 x NVIDIA H100 80GB HBM3``)."""
    count = len(gpus(device))
    if count < 2:
        return device["name"]
    return f"{count} x {device['name']}" if len(set(gpus(device))) == 1 else f"{device['name']} ({count} GPUs)"


def cross_device(record: dict[str, Any]) -> str:
    """What ``record`` says about the ``devices`` check (:mod:`kernel_sentinel.crossdevice`): ``pass`` when it
    passed on every row with a second GPU, ``fail`` when it failed on some row, the not-applicable detail (e.g.
    ``not applicable: 1 GPU``) when no row had a second GPU (no evidence), the rows with evidence when only some
    had, ``not run`` when the record has no such check (older records)."""
    checks = [c for row in record["routes"] for c in row["checks"] if c["name"] == "devices"]
    if not checks:
        return "not run"
    if any(c["status"] != "pass" for c in checks):
        return "fail"
    missing = [c["detail"] for c in checks if c["detail"].startswith(NOT_APPLICABLE)]
    if not missing:
        return "pass"
    if len(missing) == len(checks):
        return missing[0]
    return f"pass on {len(checks) - len(missing)}/{len(checks)} rows, {missing[0]} on the others"


def versions() -> dict[str, str]:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}


# ------------------------------------------------------------------------------------------------- records


def record_dir() -> Path:
    """Where records live: ``traces/verification`` in the repository sentinel works in."""
    return project_root() / RECORD_DIR


def record_path(family: str, device: dict[str, str]) -> Path:
    return record_dir() / f"{family}-{device_slug(device)}.json"


def make_record(family: Family, device: dict[str, Any], routes: Sequence[RouteResult],
                stamp: Optional[tuple[str, dict[str, str]]] = None) -> dict[str, Any]:
    """The record of one family's verification on one device (see the module docstring). ``stamp``: the commit and
    source blob ids taken when the run began (default: now), so that a commit made during a long
    run is not named for sources it did not run."""
    commit, sources = stamp or (head_commit(), blob_ids(family.source_files()))
    return {
        "family": family.name,
        "device": dict(device),
        "versions": versions(),
        "commit": commit,
        "sources": sources,
        "routes": [r.as_dict() for r in routes],
    }


def dumps(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, indent 2, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def merge_record(record: dict[str, Any], order: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``record`` (rows of some routes and dtypes of a family) joined with the record already saved for the same
    family and device when that one was made from the same sources with the same software versions on the same
    GPUs (:func:`gpus`): its rows of
    other (route, dtype) keys are kept, the new rows replace the rest. Otherwise ``record`` alone (the gate then
    names the rows it lacks). Rows follow ``order`` (the family's (route id, dtype) keys). This lets one
    verification be recorded in parts (``sentinel verify --record --route ...``) when a whole run does not fit
    one session on the device."""
    path = record_path(record["family"], record["device"])
    old = load_record(path) if path.exists() else None
    if old is None or old["sources"] != record["sources"] or old["versions"] != record["versions"] \
            or gpus(old["device"]) != gpus(record["device"]):
        return record
    new_keys = {row_key(r) for r in record["routes"]}
    rows = {row_key(r): r for r in old["routes"] if row_key(r) not in new_keys}
    rows.update({row_key(r): r for r in record["routes"]})
    rank = {key: i for i, key in enumerate(order)}
    return {**record, "routes": sorted(rows.values(), key=lambda r: rank.get(row_key(r), len(rank)))}


def save_record(record: dict[str, Any]) -> Path:
    path = record_path(record["family"], record["device"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(record))
    return path


def load_record(path: Path) -> dict[str, Any]:
    """Read a record, checking it has every top-level key of the format (``ValueError`` otherwise)."""
    record = json.loads(Path(path).read_text())
    missing = {"family", "device", "versions", "commit", "sources", "routes"} - set(record)
    if missing:
        raise ValueError(f"record {path} lacks {sorted(missing)}")
    return record


def load_records() -> list[dict[str, Any]]:
    """Every record under ``traces/verification``, in file-name order."""
    return [load_record(p) for p in sorted(record_dir().glob("*.json"))]
