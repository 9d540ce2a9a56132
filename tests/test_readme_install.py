"""The README's install steps for a CPU machine: PyTorch's CPU index is asked with a bounded wait (pip's defaults
retry an unreachable index for minutes), the fallback where it cannot be reached is given, and the time of the
main command and of ``--quick`` on a CPU is stated. ``scripts/test`` asks the index the same way."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def quick_start() -> str:
    return (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]


def index_calls(text: str) -> list[str]:
    """Every pip install from PyTorch's CPU index in ``text``, its shell continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return re.findall(rf"pip install [^`\n]*--index-url {re.escape(CPU_INDEX)}[^`\n]*", joined)


def test_the_cpu_index_is_asked_with_a_bounded_wait():
    calls = index_calls(quick_start()) + index_calls((REPO / "scripts" / "test").read_text())
    assert len(calls) == 2, calls
    for call in calls:
        retries, timeout = re.search(r"--retries (\d+)", call), re.search(r"--timeout (\d+)", call)
        assert retries and timeout, f"pip's default retries and timeout wait minutes on an unreachable index: {call}"
        assert (int(retries.group(1)) + 1) * int(timeout.group(1)) <= 60, call


def test_the_readme_says_what_to_do_when_the_cpu_index_cannot_be_reached():
    section = quick_start()
    after = section.split("cannot be reached", 1)
    assert len(after) == 2, "no fallback for an unreachable CPU index"
    assert "`pip install torch`" in after[1] and f"pip download torch --no-deps --index-url {CPU_INDEX}" in after[1]
    assert "`pip install -e .` pulls PyPI's torch, the CUDA build" in section


def test_the_readme_says_how_long_verify_and_quick_take_on_a_cpu():
    section = " ".join(quick_start().split())
    stated = re.search(r"How long it takes on a CPU \(measured on two cores.*?the whole `sentinel verify`, (\d+) rows, "
                       r"about (\d+) minutes.*?`sentinel verify --family \w+ --quick` \(under a minute\)", section)
    assert "`--quick`" in section
    assert stated, "the README does not say how long `sentinel verify` and `--quick` take on a CPU"
    rows, minutes = map(int, stated.groups())
    assert rows > 0 and minutes > 1
