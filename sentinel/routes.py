"""``sentinel routes``: print every family's dispatch tree (rich Tree), or its routes as JSON with ``--json``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.markup import escape
from rich.tree import Tree as RichTree

from kernel_sentinel import console
from kernel_sentinel.family import Family
from kernel_sentinel.trace import locate


def family_routes(family: Family) -> dict[str, Any]:
    """``{"family", "entries": [tree name], "routes": [{"id", "entry", "path": {condition: outcome}, "function",
    "where"}]}``, the routes of every tree of the family in tree order (``entry``: the tree's name)."""
    routes = [{"id": route.id, "entry": tree.name, "path": {cond.name: outcome for cond, outcome in path},
               "function": f"{route.fn.__module__}.{route.fn.__qualname__}",
               "where": str(locate(route.fn, anywhere=True))}
              for tree in family.trees for route, path in tree.paths()]
    return {"family": family.name, "entries": [tree.name for tree in family.trees], "routes": routes}


def rich_tree(family: Family) -> RichTree:
    """The family's decision trees: one branch per tree (its entry point), condition nodes, edges labelled by
    outcome, route leaves with id and source."""
    from provable_kernels.dispatch import Branch

    def add(parent: RichTree, node: Any, label: str) -> None:
        if isinstance(node, Branch):
            branch = parent.add(f"{label}[bold]{escape(node.condition.name)}?[/]")
            for outcome, child in node.children.items():
                add(branch, child, f"[cyan]{escape(outcome)}[/] -> ")
        else:
            where = locate(node.fn, anywhere=True)
            parent.add(f"{label}[green]{escape(node.id)}[/]  [dim]{escape(node.fn.__name__)} {where}[/]")

    top = RichTree(f"[bold magenta]{escape(family.name)}[/] ({len(family.routes())} routes)")
    for tree in family.trees:
        add(top.add(f"[bold]{escape(tree.name)}[/] ({len(tree.routes())} routes)"), tree.root, "")
    return top


def register(subparsers: argparse._SubParsersAction) -> None:
    from kernel_sentinel.cli import COMMANDS

    p = subparsers.add_parser("routes", help=COMMANDS["routes"][1], description=__doc__)
    p.add_argument("--family", nargs="+", action="extend", metavar="F", help="families to show (default: all)")
    p.add_argument("--json", action="store_true", help="print the routes as JSON")


def run(args: argparse.Namespace) -> int:
    from kernel_sentinel import registry
    from kernel_sentinel.family import rooted
    from kernel_sentinel.records import dumps

    try:
        families, broken = registry.select_with_broken(args.family)
    except registry.UnknownFamily as exc:
        return console.usage_error(exc.args[0])
    shown = []
    for family in families:
        with rooted(family.root):  # source locations relative to the family's own repository
            shown.append(family_routes(family) if args.json else rich_tree(family))
    if args.json:
        sys.stdout.write(dumps({"families": shown, "broken": [broken_entry(b) for b in broken]}))
    else:
        for tree in shown:
            console.out.print(tree)
    for b in broken:
        console.err.print(f"[bold red]family {escape(b.name)} failed to load[/] ({escape(b.where)}): "
                          f"{escape(b.error)}", highlight=False, soft_wrap=True)
    return 0 if families and not broken else 1


def broken_entry(broken: Any) -> dict[str, str]:
    """A registration that failed to load (:class:`kernel_sentinel.registry.Broken`), for ``--json``."""
    return {"family": broken.name, "where": broken.where, "error": broken.error}
