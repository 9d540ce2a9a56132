"""Install anywhere: the README's Quick start is what CI runs, and the import names do not collide.

- The Quick start has exactly two commands: the verify one-liner and ``./scripts/test``; ``.ci/run`` reads both
  out of README.md (it does not keep a copy), so CI runs what a user copies.
- ``provable_kernels`` and ``kernel_sentinel`` install next to Hugging Face's ``kernels`` (PyPI) in one virtual
  environment, in either order, and each import finds its own package.
"""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_quick_start_is_two_commands_and_ci_runs_them_from_the_readme():
    """``scripts/readme_commands`` reads the two commands out of README.md; ``.ci/run`` runs what it prints."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_commands")], capture_output=True,
                          text=True, check=True)
    verify, tests = done.stdout.splitlines()
    assert verify.startswith("pip install") and verify.endswith("sentinel verify")
    assert tests == "./scripts/test"
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/readme_commands" in ci and "scripts/test" not in ci  # read from the README, never copied


CHECK_IMPORTS = textwrap.dedent("""
    import kernels, provable_kernels, kernel_sentinel
    from provable_kernels.semicrf import semi_crf_streaming_forward
    from kernel_sentinel.registry import families
    assert hasattr(kernels, "get_kernel"), kernels.__file__          # Hugging Face's kernels
    assert {f.name for f in families()} >= {"semicrf"}
    print(kernels.__file__, provable_kernels.__file__, kernel_sentinel.__file__)
""")


@pytest.mark.slow  # two fresh installs: ~1 min
@pytest.mark.parametrize("order", ["hugging-face-first", "ours-first"])
def test_installs_next_to_hugging_face_kernels(tmp_path: Path, order: str):
    """A fresh venv (this environment's packages visible behind its own, for torch) gets Hugging Face's
    ``kernels`` from PyPI and a regular (non-editable) install of this project, in ``order``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # appended: lower priority
    steps = {"hugging-face": ["kernels"], "ours": ["--no-deps", str(REPO)]}
    for name in (["hugging-face", "ours"] if order == "hugging-face-first" else ["ours", "hugging-face"]):
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *steps[name]], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([str(python), "-c", CHECK_IMPORTS], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    hugging_face, ours, sentinel = done.stdout.split()
    assert Path(hugging_face).parent.parent == Path(site)
    assert Path(ours).parent.parent == Path(site) and Path(ours).parent.name == "provable_kernels"
    assert Path(sentinel).parent.name == "kernel_sentinel"
