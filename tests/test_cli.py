"""The ``sentinel`` command line: exit codes, reports, records, ``routes``, ``python -m kernel_sentinel``, and the Triton
interpreter switch. Most tests run in-process on the toy family of conftest.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

from kernel_sentinel import device, records, registry
from kernel_sentinel import cli
from kernel_sentinel.cli import main
from kernel_sentinel.family import REPO_ROOT, FailureMode
from kernel_sentinel.rows import CHECKS


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INFO = device.info(torch.device(DEVICE))


@pytest.fixture
def only_toy(monkeypatch, toy_family):
    monkeypatch.setattr(registry, "discover", lambda package="provable_kernels": ([toy_family()], []))


def verify(*args: str) -> int:
    return main(["verify", "--device", DEVICE, "--examples", "2", "--jobs", "0", *args])


def test_passing_route_exits_0_and_writes_json_and_junit(only_toy, tmp_path, capsys):
    assert verify("--route", "toy.slow", "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")) == 0
    out = capsys.readouterr().out
    assert "toy.slow" in out and f"1 routes on {INFO['name']}: 1 passed, 0 failed" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["commit"] == records.head_commit()
    assert report["device"] == INFO
    assert [(r["id"], r["status"]) for r in report["routes"]] == [("toy.slow", "pass")]
    assert len(list(ET.parse(tmp_path / "j.xml").getroot().iter("testcase"))) == len(CHECKS)


def test_failing_route_exits_1_and_prints_detail_and_repro(only_toy, capsys):
    assert verify("--family", "toy") == 1
    out = capsys.readouterr().out
    assert "FAIL toy.fast reference" in out
    assert f"reproduce: sentinel verify --family toy --route toy.fast --device {DEVICE} --seed 0 --examples 2" in out
    assert f"2 routes on {INFO['name']}: 1 passed, 1 failed" in out


def test_failed_check_prints_its_failure_mode_next_to_the_repro(monkeypatch, toy_family, capsys):
    mismatch = FailureMode("backend mismatch", "toy/fast.md#routes", "toy/index.md#numerical-guards",
                           "the reference check", checks=("reference", "exact"), routes=("toy.fast",))
    unrelated = FailureMode("wrong route taken", "toy/index.md#dispatch-conditions", "toy/index.md",
                            "the route check", checks=("route",))
    monkeypatch.setattr(registry, "discover",
                        lambda package="provable_kernels": ([toy_family(failure_modes=(mismatch, unrelated))], []))
    assert verify("--family", "toy", "--route", "toy.fast") == 1
    lines = capsys.readouterr().out.splitlines()
    repro = next(i for i, line in enumerate(lines) if "reproduce:" in line)
    assert lines[repro + 1].strip() == (
        "reference check, failure mode 'backend mismatch': read traces/toy/fast.md#routes first, then "
        "traces/toy/index.md#numerical-guards; covered by the reference check")
    assert not any("wrong route taken" in line for line in lines)


def test_a_failure_mode_shows_only_for_failures_that_hold_its_signs():
    """A gradient mismatch in the guards check is no 'NaN in the loss' (the hint fits the failure)."""
    nan = FailureMode("NaN in the loss", "a.md", "b.md", "guards", checks=("guards",), signs=("has NaN",))
    grads = FailureMode("wrong gradients", "a.md", "b.md", "reference", checks=("guards", "reference"),
                        signs=("grad",))
    mismatch = "rows near the clamp: grad_x vs float64 loop: abs 0.167; 16/17 adversarial inputs handled: NaN input"
    assert not nan.shown_by("guards", mismatch) and grads.shown_by("guards", mismatch)
    assert nan.shown_by("guards", "all -inf rows: out has NaN") and not grads.shown_by("guards", "out has NaN")
    assert not grads.shown_by("route", "grad_x vs float64 loop")


def test_usage_errors_exit_2(only_toy, capsys):
    assert verify("--family", "nope") == 2
    assert "unknown family nope" in capsys.readouterr().err
    assert verify("--route", "toy.slow", "nomatch.*") == 2
    assert "--route nomatch.* matches no route" in capsys.readouterr().err
    assert verify("--record", "--route", "toy.slow", "--coverage") == 2
    assert "--coverage measures a whole run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--no-such-option"])
    assert exc.value.code == 2


def test_no_route_run_is_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(registry, "discover", lambda package="provable_kernels": ([], []))
    assert verify() == 1
    assert "no route ran" in capsys.readouterr().out


def test_cuda_without_gpu_is_a_usage_error(only_toy, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["verify", "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no CUDA device"):
        device.prepare("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # on a GPU machine this process compiled its kernels for CUDA
    assert device.prepare("auto") == torch.device("cpu")


def test_record_writes_one_file_per_family(only_toy, tmp_path, monkeypatch):
    monkeypatch.setattr(records, "record_dir", lambda: tmp_path)
    assert main(["verify", "--device", DEVICE, "--record", "--jobs", "0"]) == 1  # toy.fast fails; the record says so
    record = records.load_record(tmp_path / f"toy-{records.device_slug(INFO)}.json")
    assert record["family"] == "toy" and record["device"] == INFO
    assert [r["status"] for r in record["routes"]] == ["fail", "pass"]
    assert set(record["versions"]) == {"torch", "triton", "python"}


@pytest.mark.parametrize("weaker", [["--quick"], ["--examples", "2"]])
def test_record_refuses_a_weaker_run(only_toy, tmp_path, monkeypatch, weaker):
    monkeypatch.setattr(records, "record_dir", lambda: tmp_path)
    assert main(["verify", "--device", DEVICE, "--record", "--jobs", "0", *weaker]) == 2
    assert not list(tmp_path.iterdir())


def test_missing_invariant_test_fails(monkeypatch, toy_family, capsys):
    from kernel_sentinel.family import Invariant

    broken = toy_family(invariants=(Invariant("sums", "tests/test_cli.py::test_does_not_exist"),))
    monkeypatch.setattr(registry, "discover", lambda package="provable_kernels": ([broken], []))
    assert verify("--route", "toy.slow") == 1
    out = capsys.readouterr().out
    assert "invariant test tests/test_cli.py::test_does_not_exist does not exist" in out
    assert f"1 routes on {INFO['name']}: 1 passed, 0 failed, 1 problem (FAIL above) in " in out


@pytest.mark.parametrize("rows, problems", [((True,), ()), ((True, False), ()), ((True,), ("a", "b")), ((), ("a",))])
def test_the_summary_counts_every_failure_behind_the_exit_code(rows, problems):
    """The exit code is 1 exactly when a row failed, no row ran or a problem was found; the summary line then
    shows a failure count above zero (or no route)."""
    from kernel_sentinel.records import CheckResult, RouteResult
    from kernel_sentinel.report import summary_line

    results = [RouteResult(f"toy.r{i}", "toy", (CheckResult("reference", ok, "", ""),)) for i, ok in enumerate(rows)]
    line = summary_line(results, problems, 1.0, INFO)
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed|problems?)\b", line))
    exit_1 = not results or not all(r.passed for r in results) or bool(problems)
    shown = counts["failed"] + counts.get("problem", 0) + counts.get("problems", 0) > 0 or line.startswith("0 routes")
    assert shown == exit_1, line
    assert counts["passed"] + counts["failed"] == len(rows), line


def test_the_table_shows_the_criterion_it_applies(only_toy, tmp_path, capsys, monkeypatch):
    """The reference column is the largest |x - ref| / (atol + rtol * |ref|) ("0.21 of tol"), the bound is shown
    as atol + rtol·|ref|; the JSON keeps abs, rel, atol and rtol, and of_tol agrees with them within the bound."""
    from kernel_sentinel import console

    monkeypatch.setattr(console.out, "width", 160)  # as a CI log lays it out (a pytest-xdist worker's is narrower)
    assert verify("--route", "toy.slow", "--json", str(tmp_path / "r.json")) == 0
    out = capsys.readouterr().out
    check = next(c for c in json.loads((tmp_path / "r.json").read_text())["routes"][0]["checks"]
                 if c["name"] == "reference")
    assert {"max_abs", "max_rel", "atol", "rtol", "of_tol"} <= set(check)
    assert f"{check['of_tol']:.2g} of tol" in out and f"{check['atol']:g} + {check['rtol']:g}·|ref|" in out
    assert 0 <= check["of_tol"] <= 1 and check["of_tol"] <= check["max_abs"] / check["atol"] + 1e-12


def test_fixed_cases_inside_one_declared_block_fail(monkeypatch, toy_family, capsys):
    from kernel_sentinel.family import Blocks

    narrow = toy_family(blocks=(Blocks(("toy.slow",), "x", -1, 1024),))
    monkeypatch.setattr(registry, "discover", lambda package="provable_kernels": ([narrow], []))
    assert verify("--route", "toy.slow") == 1
    assert "toy.slow (small): x.shape[-1] = " in capsys.readouterr().out


def test_routes_prints_trees_and_json(capsys):
    assert main(["routes"]) == 0
    out = capsys.readouterr().out
    assert "semicrf.triton.log.train" in out and "kernels/semicrf/dispatch.py:" in out
    assert main(["routes", "--json", "--family", "semicrf"]) == 0
    data = json.loads(capsys.readouterr().out)
    routes = data["families"][0]["routes"]
    assert [r["id"] for r in routes] == [r.id for r in registry.select(["semicrf"])[0].routes()]
    assert data["families"][0]["entries"] == ["semicrf", "SemiMarkovCRFHead", "SemiMarkov"]
    assert routes[0]["path"] == {"op": "partition", "backend": "triton", "semiring": "log", "grad": "infer"}


def test_entry_point_and_python_dash_m():
    assert 'sentinel = "kernel_sentinel.cli:main"' in (REPO_ROOT / "pyproject.toml").read_text()
    done = subprocess.run([sys.executable, "-m", "kernel_sentinel", "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "verify" in done.stdout and "routes" in done.stdout


def test_help_imports_no_command_module_torch_or_family():
    """``sentinel --help`` lists every command from cli.COMMANDS alone; ``sentinel routes`` imports its own module
    only (neither verify's nor the others')."""
    probe = ("import sys\nfrom kernel_sentinel.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'provable_kernels') or "
             "m in ('kernel_sentinel.verify', 'kernel_sentinel.routes', 'kernel_sentinel.mutate')), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, "--help"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr.strip() == "[]", done.stderr
    assert all(name in done.stdout.split() for name in cli.COMMANDS)
    done = subprocess.run([sys.executable, "-c", probe, "routes", "--family", "sinkhorn"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    imported = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 0 and "'kernel_sentinel.routes'" in imported, done.stderr
    assert "'kernel_sentinel.verify'" not in imported and "'kernel_sentinel.mutate'" not in imported


def test_cli_switches_the_triton_interpreter_on_for_cpu(tmp_path):
    """A fresh process without TRITON_INTERPRET: the CLI must set it before the kernels are imported, so the
    Triton route is reached and runs on CPU tensors."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "kernel_sentinel", "verify", "--route", "semicrf.triton.max.infer", "--device", "cpu",
         "--quick", "--examples", "1", "--dtype", "float32", "--json", str(tmp_path / "r.json")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (route,) = json.loads((tmp_path / "r.json").read_text())["routes"]
    assert route["id"] == "semicrf.triton.max.infer" and route["status"] == "pass"
    assert route["checks"][0]["detail"].startswith("recorded 'semicrf.triton.max.infer'")


def test_cpu_refuses_kernels_compiled_before_the_interpreter_switch(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "provable_kernels.fake.triton_kernel", object())
    with pytest.raises(ValueError, match=r"kernels\.fake\.triton_kernel.*imported before TRITON_INTERPRET=1"):
        device.prepare("cpu")
    assert not device.interpreter_enabled()


def test_a_record_made_in_parts_joins_rows_of_the_same_sources(only_toy, toy_family, tmp_path, monkeypatch):
    """``--record --route`` writes part of a record; a later part from the same sources joins it (rows in the
    family's order, a re-run row replaced); a part from other sources starts the record again."""
    from kernel_sentinel import gate

    monkeypatch.setattr(records, "record_dir", lambda: tmp_path)
    family = toy_family()
    path = records.record_path("toy", INFO)

    def record_verify(route: str) -> int:
        return main(["verify", "--device", DEVICE, "--record", "--jobs", "0", "--route", route])

    def rows() -> list[tuple[str, str]]:
        return [(r["id"], r["status"]) for r in records.load_record(path)["routes"]]

    assert record_verify("toy.slow") == 0
    assert rows() == [("toy.slow", "pass")]
    current = records.blob_ids(family.source_files())
    assert "lacks routes toy.fast" in gate.record_problem(family, records.load_record(path), current)
    assert record_verify("toy.fast") == 1
    order = [r.id for r in family.routes()]
    assert rows() == sorted([("toy.fast", "fail"), ("toy.slow", "pass")], key=lambda row: order.index(row[0]))
    assert record_verify("toy.slow") == 0 and len(rows()) == 2  # replaced, not appended
    assert "toy.fast" in gate.record_problem(family, records.load_record(path), current)  # it failed

    stale = records.load_record(path)
    stale["sources"] = {name: "0" * 40 for name in stale["sources"]}
    path.write_text(records.dumps(stale))
    assert record_verify("toy.slow") == 0
    assert rows() == [("toy.slow", "pass")]


@pytest.mark.parametrize("command", ["verify", "routes", "trace", "gate", "mutate", "site"])
def test_help_is_plain_terminal_text(command, capsys):
    """--help shows the docstrings' words without their reStructuredText / Markdown markup."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert len(text) > 200 and not any(mark in text for mark in ("**", "``", ":func:", ":class:", "`"))
