"""``sentinel new NAME [DIR]``: scaffold a working kernel family in ``DIR/NAME/`` (DIR default: the current
directory), inside a git repository.

The family is the template under ``templates/l2norm/`` (package data, real files): a row-wise L2 normalisation
with a Triton forward and backward kernel, its PyTorch backend, a float64 oracle, the registration ``family.py``
and a test, in the files of every family (``traces/guide/family-layout.md``), on the shared hot path
(``provable_kernels.runtime.Entry``, ``provable_kernels.launch``, ``provable_kernels.custom_ops.Op``). Its
modules import each other relatively, so the package works wherever it lives: a directory of
``SENTINEL_FAMILY_PATH`` or a subpackage of the repository's own package. Every ``l2norm`` of the template
(identifiers, route ids, file names) becomes NAME (``L2norm`` in class names its CamelCase), and the invariant test's path becomes relative to the
repository's top level. It passes ``sentinel verify --quick`` as generated; the command prints the next steps.

Usage errors (exit 2): NAME not a lower-case Python identifier, a keyword or the name of an importable module
(the family's package would shadow it), ``DIR/NAME`` existing and not empty, DIR outside any git repository.
"""
from __future__ import annotations

import argparse
import importlib.util
import keyword
from pathlib import Path

from kernel_sentinel import console
from kernel_sentinel.family import repository_of

TEMPLATE = Path(__file__).resolve().parent / "templates" / "l2norm"
PLACEHOLDER = TEMPLATE.name  # the template family's name, replaced by NAME in every file's name and text


def camel(name: str) -> str:
    """``my_norm`` -> ``MyNorm``: the template's class names (``L2normCall``) follow NAME."""
    return "".join(part.capitalize() for part in name.split("_"))


class ScaffoldError(ValueError):
    """A usage error of ``sentinel new``: what is wrong and what to do."""


def check_name(name: str) -> str:
    """``name`` when it can name a family package; :class:`ScaffoldError` saying why not otherwise."""
    if not (name.isidentifier() and name.isascii() and name == name.lower()) or keyword.iskeyword(name):
        raise ScaffoldError(f"NAME must be a lower-case Python identifier (it names the package, the entry point "
                            f"and the route ids), got {name!r}: try {_suggestion(name)!r}")
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin is not None:  # a namespace package (an empty directory) shadows nothing
        raise ScaffoldError(f"NAME {name!r} is the name of an importable module, which the family's package would "
                            f"shadow: choose another name")
    return name


def _suggestion(name: str) -> str:
    word = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_") or "mykernel"
    return f"k_{word}" if word[0].isdigit() or keyword.iskeyword(word) else word


def scaffold(name: str, directory: Path) -> list[Path]:
    """Write the family ``name`` into ``directory/name/`` and return the files written. :class:`ScaffoldError`
    for a usage error (module docstring)."""
    check_name(name)
    directory = Path(directory).resolve()
    target = directory / name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ScaffoldError(f"{target} exists and is not empty: choose another NAME or DIR, or remove it")
    if not directory.is_dir():
        raise ScaffoldError(f"DIR {directory} is not a directory: create it first, or give an existing one")
    root = repository_of(directory)
    if root is None:
        raise ScaffoldError(f"DIR {directory} is not inside a git repository (traces and records are stamped with "
                            f"its commits): run `git init` there first, or give a DIR inside one")
    test_path = (target / f"test_{name}.py").relative_to(root).as_posix()
    written = []
    for source in sorted(TEMPLATE.glob("*.py")):
        text = source.read_text().replace(f'"{PLACEHOLDER}/test_{PLACEHOLDER}.py"', f'"{test_path}"')
        file = target / source.name.replace(PLACEHOLDER, name)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text.replace(PLACEHOLDER, name).replace(camel(PLACEHOLDER), camel(name)))
        written.append(file)
    return written


def next_steps(name: str, directory: Path) -> str:
    """The commands to run after :func:`scaffold`, from the repository's top level."""
    root = repository_of(directory)
    search = Path(directory).resolve().relative_to(root).as_posix() if root else str(directory)
    package = f"{search}/{name}".removeprefix("./")
    steps = [
        (f"export SENTINEL_FAMILY_PATH=$PWD/{search}".removesuffix("/."), ""),
        (f"sentinel routes --family {name}", "the decision tree"),
        (f"sentinel verify --family {name} --quick", "every route at every dtype, tiny inputs"),
        (f"TRITON_INTERPRET=1 python -m pytest {package}/test_{name}.py", "the family's own test"),
        ("sentinel trace", f"writes traces/{name}/"),
        (f"git add {package} traces && git commit -m 'the {name} family'", ""),
        ("sentinel trace --check", "the committed traces are current"),
        ("sentinel gate --no-cpu-verify", "asks for a GPU record: on a GPU machine,"),
        ("sentinel verify --device cuda --record", "writes it to traces/verification/; trace, commit"),
    ]
    width = max(len(command) for command, _ in steps)
    return "\n".join([f"Made the family {name} in {package}/ (a row-wise L2 normalisation: replace it with your op). "
                      f"Next, from {root}:", ""]
                     + [f"  {command:<{width}}  # {why}" if why else f"  {command}" for command, why in steps])


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("new", help="scaffold a working kernel family", description=__doc__)
    p.add_argument("name", metavar="NAME", help="the family's name: a lower-case Python identifier")
    p.add_argument("dir", metavar="DIR", nargs="?", type=Path, default=Path("."),
                   help="the directory to make NAME/ in, inside a git repository (default: the current directory)")


def run(args: argparse.Namespace) -> int:
    try:
        scaffold(args.name, args.dir)
    except ScaffoldError as exc:
        return console.usage_error(str(exc))
    console.out.print(next_steps(args.name, args.dir), highlight=False, markup=False)
    return 0
