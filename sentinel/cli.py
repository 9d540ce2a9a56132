"""The ``sentinel`` command line: one subcommand per module in :data:`COMMANDS`.

Each command module exposes ``register(subparsers)`` (adds its argparse subparser, with the one-line help of
:data:`COMMANDS`) and ``run(args) -> int`` (the exit code). Only the module of the command given is imported (the
others are listed by name and help): ``sentinel --help`` imports neither torch nor a family. Before a command
runs, the device is resolved (``--device``, default ``auto``) and on the CPU the Triton interpreter is switched on
(``TRITON_INTERPRET=1``) before any kernel module is imported.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

from kernel_sentinel.console import plain

COMMANDS = {  # command: (module, one-line help)
    "verify": ("kernel_sentinel.verify", "run every dispatch route and cross-check it"),
    "routes": ("kernel_sentinel.routes", "print the dispatch trees"),
    "trace": ("kernel_sentinel.trace", "regenerate the trace documents (or --check them)"),
    "gate": ("kernel_sentinel.gate", "CI gate: CPU verification, trace drift, current GPU records"),
    "mutate": ("kernel_sentinel.mutate", "plant bugs in kernel sources and measure how many verify catches"),
    "new": ("kernel_sentinel.new", "scaffold a working kernel family"),
    "site": ("kernel_sentinel.site_command", "build (or serve) the trace site of the current repository"),
}


def build_parser(command: Optional[str] = None) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser, and the command module behind each subcommand name: every command's module when ``command`` is
    None, else only ``command``'s (the others get a parser without options, for the listing)."""
    parser = argparse.ArgumentParser(prog="sentinel", description="Verify, trace and gate the kernel library.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    owners: dict[str, ModuleType] = {}
    for name, (module_name, summary) in COMMANDS.items():
        if command not in (None, name):
            subparsers.add_parser(name, help=summary)
            continue
        owners[name] = importlib.import_module(module_name)
        owners[name].register(subparsers)
    for sub in subparsers.choices.values():  # help is terminal text: the docstrings' markup goes
        sub.add_argument("--family-path", action="append", default=[], metavar="DIR",
                         help="also find families in DIR (each <DIR>/<name>/family.py; repeatable; added to "
                              "SENTINEL_FAMILY_PATH)")
        sub.description = sub.description and plain(sub.description)
        for action in sub._actions:
            action.help = action.help and plain(action.help)
    return parser, owners


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    given = next((a for a in argv if not a.startswith("-")), None)  # the command: sentinel has no options of its own
    parser, owners = build_parser(given if given in COMMANDS else "")
    args = parser.parse_args(argv)
    from kernel_sentinel import console, device  # here: device imports torch

    try:
        device.prepare(getattr(args, "device", "auto"))
    except ValueError as exc:
        return console.usage_error(str(exc))
    from kernel_sentinel import registry

    registry.add_to_search_path(args.family_path)
    try:
        registry.search_path()
    except registry.SearchPathError as exc:
        return console.usage_error(str(exc))
    return owners[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
