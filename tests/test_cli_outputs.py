"""Output paths of `sentinel verify` / `gate` are checked before any work (exit 2, one line)."""
from pathlib import Path

from kernel_sentinel import outputs


def test_writable_targets_pass_and_leave_nothing_behind(tmp_path: Path):
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    assert outputs.unwritable({"--json": tmp_path / "new.json", "--junit": existing, "--x": None},
                              {"--record": tmp_path / "records" / "deep"}) is None
    assert not (tmp_path / "new.json").exists()
    assert existing.read_text() == "keep"
    assert (tmp_path / "records" / "deep").is_dir() and not any((tmp_path / "records" / "deep").iterdir())


def test_missing_directory_is_named(tmp_path: Path):
    target = tmp_path / "nowhere" / "report.json"
    line = outputs.unwritable({"--json": target})
    assert line == f"--json {target}: cannot write there (its directory {target.parent} does not exist)"


def test_directory_and_file_parent_are_named(tmp_path: Path):
    expected = f"--junit {tmp_path}: cannot write there ({tmp_path} is a directory)"
    assert outputs.unwritable({"--junit": tmp_path}) == expected
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = outputs.unwritable({"--json": blocker / "x.json"})
    assert line == f"--json {blocker / 'x.json'}: cannot write there ({blocker} is not a directory)"
    line = outputs.unwritable({}, {"--record": blocker / "sub"})
    assert line.startswith(f"--record: cannot write the record ({blocker / 'sub'}")


def test_verify_and_gate_refuse_unwritable_outputs_before_running(tmp_path: Path, capsys):
    from kernel_sentinel.cli import main

    target = tmp_path / "missing" / "report.json"
    for argv in (["verify", "--family", "semicrf", "--json", str(target)],
                 ["verify", "--family", "semicrf", "--junit", str(tmp_path)],
                 ["gate", "--json", str(target)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("usage error: --j") and "cannot write there" in err and "\n" not in err
