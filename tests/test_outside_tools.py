"""``sentinel mutate`` and ``sentinel site`` for a family in a kernel author's own git repository: run from that
repository's root, the mutation record and the site are written there, planted bugs in the family's own sources
are killed, and nothing in this repository changes. The site's default configuration is the one this repository's
``mkdocs.yml`` inherits."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_layout_plugin_family import FAMILY, GIT
from test_outside_family import REPO, commit, outside, sentinel, this_repository_state  # noqa: F401 (a fixture)

PATH = ("--family-path", "kernels_of_mine")
INLINE_ROW_SUM = ('def row_sum(x):\n    """Row sums in float64, cast back."""\n'
                  '    return x.double().sum(-1).to(x.dtype)\n')
TORCH_OPS = '''\
"""The toy family's PyTorch route."""


def row_sum(x):
    """Row sums of ``x`` (N, D) in float64, cast back: the first column plus the sum of the others."""
    y = x.double()
    return (y[:, 0] + y[:, 1:].sum(1)).to(x.dtype)
'''
# the four mutants of TORCH_OPS (each changes the row sums of every case with two columns or more)
MUTANTS = {"return (y[:, 1] + y[:, 1:].sum(1)).to(x.dtype)", "return (y[:, 0] + y[:, 2:].sum(1)).to(x.dtype)",
           "return (y[:, 0] - y[:, 1:].sum(1)).to(x.dtype)", "return (y[:, 0] + y[:, 1:].max(1)).to(x.dtype)"}


@pytest.fixture
def with_torch_ops(outside):
    """The outside repository of ``outside``, its family's route in a backend source of its own (``torch_ops.py``,
    which ``sentinel mutate`` samples by default)."""
    repo, env = outside
    assert INLINE_ROW_SUM in FAMILY  # the toy registration this test rewrites
    package = repo / "kernels_of_mine" / "plugfam"
    (package / "family.py").write_text(FAMILY.replace(INLINE_ROW_SUM, "from plugfam.torch_ops import row_sum\n"))
    (package / "torch_ops.py").write_text(TORCH_OPS)
    commit(repo, "the route in torch_ops.py")
    return repo, env


def test_mutate_records_in_the_outside_repository_and_kills_the_planted_bugs(with_torch_ops, tmp_path):
    repo, env = with_torch_ops
    before = this_repository_state()
    scratch = tmp_path / "tmp"  # the run's temporary directory: its scratch copies must go
    scratch.mkdir()
    done = sentinel(repo, {**env, "TMPDIR": str(scratch)}, "mutate", "--family", "plugfam", *PATH, "-n", "3",
                    "--record", "--json", str(tmp_path / "mutants.json"))
    assert done.returncode == 0, done.stdout + done.stderr

    record = json.loads((repo / "traces" / "verification" / "mutation" / "plugfam.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head
    assert (record["candidates"], record["sampled"], record["killed"]) == (4, 3, 3)
    assert list(record["files"]) == ["kernels_of_mine/plugfam/torch_ops.py"]  # a path in the family's repository
    (summary,) = json.loads((tmp_path / "mutants.json").read_text())
    for mutant in summary["mutants"]:
        assert mutant["after"] in MUTANTS and mutant["status"] == "killed", mutant
        assert mutant["by"].startswith("plugfam."), mutant  # the route and check that caught it
    assert not list(scratch.glob("sentinel-mutate-*")), "scratch copies left behind"
    assert (repo / "kernels_of_mine" / "plugfam" / "torch_ops.py").read_text() == TORCH_OPS
    assert this_repository_state() == before


def test_a_forking_check_of_a_triton_route_runs_in_a_mutation_worker(tmp_path):
    """The ``observed`` check forks a child per kernel: in a mutation worker, after a check that ran torch's
    parallel operations (``reference``), the child finishes (the worker's torch uses one thread, so the child
    inherits no OpenMP team to wait for), on the family ``sentinel new`` makes."""
    from kernel_sentinel import mutate

    repo = tmp_path / "mine"
    repo.mkdir()
    subprocess.run(GIT + ["init", "-q"], cwd=repo, check=True, capture_output=True)
    done = sentinel(repo, dict(os.environ), "new", "l2norm")
    assert done.returncode == 0, done.stdout + done.stderr
    scratch = mutate.Scratch(repo, {"l2norm": "l2norm"})
    try:
        code, last, timed_out = scratch.worker("l2norm", ["l2norm.triton.rows"], 0, timeout=240.0,
                                               checks=["reference", "observed"])
    finally:
        scratch.remove()
    assert (code, timed_out) == (0, False), last


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def test_site_builds_and_serves_the_trace_site_of_the_outside_repository(outside):
    repo, env = outside
    before = this_repository_state()
    done = sentinel(repo, env, "trace", *PATH)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (repo / "mkdocs.yml").exists()  # the default configuration builds it

    done = sentinel(repo, env, "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (repo / "site" / "index.html").is_file()
    assert "Toy plug-in family" in (repo / "site" / "plugfam" / "index.html").read_text()
    assert (repo / "site" / "assets" / "javascripts" / "mermaid.min.js").is_file()  # the hook ran
    done = sentinel(repo, env, "site", "--out", str(repo.parent / "elsewhere"))
    assert done.returncode == 0 and (repo.parent / "elsewhere" / "plugfam" / "index.html").is_file()

    (repo / "traces" / "plugfam" / "index.md").write_text("[a broken link](nowhere.md)\n")
    done = sentinel(repo, env, "site")
    assert done.returncode == 1 and "nowhere.md" in done.stdout + done.stderr  # strict: a warning fails it

    (repo / "traces" / "plugfam" / "index.md").write_text("# plugfam, served\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "kernel_sentinel", "site", "--serve", "--port", str(port)],
                              cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, status, page = time.monotonic() + 180, None, ""
        while status != 200 and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            try:
                status, page = get(port, "/plugfam/")
            except OSError:  # not listening yet
                pass
        assert status == 200 and "plugfam, served" in page, (status, server.poll())
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    assert this_repository_state() == before


def test_site_without_the_docs_extra_or_traces_is_a_usage_error_saying_what_to_do(tmp_path, monkeypatch, capsys):
    import importlib.util

    from kernel_sentinel.cli import main

    monkeypatch.chdir(tmp_path)  # no git repository, no traces/
    assert main(["site"]) == 2
    assert "has no traces/index.md: run `sentinel trace` first" in capsys.readouterr().err
    assert main(["site", "--serve", "--port", "0"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mkdocs" else find_spec(name, *a))
    assert main(["site"]) == 2
    assert "needs the docs extra (mkdocs not installed): pip install 'kernel-sentinel[docs]'" in capsys.readouterr().err


def test_this_repository_site_inherits_the_default_configuration():
    """Theme, extensions, assets and hook of this repository's mkdocs.yml are those of sentinel's default one; its
    one addition is the hook that serves the benchmark plots."""
    from mkdocs.config import load_config

    from kernel_sentinel import site_command

    config_file, settings = site_command.site_config(REPO, REPO / "site")
    assert config_file == REPO / "mkdocs.yml"
    ours = load_config(str(config_file), **settings)
    default = load_config(str(site_command.DEFAULT_CONFIG), docs_dir=str(REPO / "traces"))
    for key in ("markdown_extensions", "mdx_configs", "extra_css", "extra_javascript", "strict"):
        assert ours[key] == default[key], key
    assert ours["theme"].name == default["theme"].name == "material"
    assert dict(ours["theme"].items()) == dict(default["theme"].items())
    assert [p for p in ours["plugins"] if p not in ours["hooks"]] == \
        [p for p in default["plugins"] if p not in default["hooks"]] == ["material/search"]
    assert [Path(m.__file__).resolve() for m in default["hooks"].values()] == [REPO / "sentinel" / "site.py"]
    assert [Path(m.__file__).resolve() for m in ours["hooks"].values()] == \
        [REPO / "sentinel" / "site.py", REPO / "benchmarks" / "site_plots.py"]
