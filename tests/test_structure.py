"""The package reads bottom-up (issue 25): course_utils's import graph, read from the source.

A unit is a top-level module or package of course_utils (``ledger``, ``models``, ``plots``, ...).
The floors are the units ordered by what they import: a unit stands on what it imports. The world
where these tests fail is an arrow back up: a cycle between units (the ledger once imported the
objectives it measures, and ``runtime`` and ``distributed`` imported each other), or an import
moved into a function to dodge one.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_utils"

# imports made inside a function on purpose, with why (none of them dodges a cycle)
LATE_IMPORTS = {
    ("course_utils.plots", "course_utils.experiments.planning"):
        "the planner widget alone needs the objectives, the mechanisms and torchvision",
    ("course_utils.runtime", "course_utils.distributed.device_check"):
        "the placement check is loaded only when COURSE_CHECK_PLACEMENT=1 asks for it",
}
LEDGER_STANDS_ON = {"checks", "optim", "report"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]):
    """(importer, imported, inside a function?) for every course_utils import in the package."""
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        late = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    yield name, target, id(node) in late


def _unit(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None (depth-first search, three colours)."""
    state, stack = {}, []

    def visit(node) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_runs_back_up_between_modules_or_units():
    modules = _modules()
    by_module, by_unit = defaultdict(set), defaultdict(set)
    for a, b, _ in _imports(modules):
        by_module[a].add(b)
        if _unit(a) and _unit(b) and _unit(a) != _unit(b):
            by_unit[_unit(a)].add(_unit(b))
    assert _cycle(by_module) is None, f"modules import each other: {' -> '.join(_cycle(by_module))}"
    assert _cycle(by_unit) is None, f"units import each other: {' -> '.join(_cycle(by_unit))}"
    assert by_unit["ledger"] <= LEDGER_STANDS_ON, \
        f"the ledger imports {sorted(by_unit['ledger'] - LEDGER_STANDS_ON)}, which stand above it"


def test_no_late_import_but_the_listed_ones():
    late = {(a, b) for a, b, inside in _imports(_modules()) if inside}
    assert late <= set(LATE_IMPORTS), \
        f"imports inside functions: {sorted(late - set(LATE_IMPORTS))}; import at the top " \
        "(if that makes a cycle, the code is on the wrong floor), or list it here with why"


def test_the_floors_as_a_picture_have_the_ledger_low_and_the_experiments_high():
    """Floor 0 imports no other unit; a unit's floor is one above the highest it imports."""
    graph = defaultdict(set)
    for a, b, _ in _imports(_modules()):
        if _unit(a) and _unit(b) and _unit(a) != _unit(b):
            graph[_unit(a)].add(_unit(b))
    floors: dict[str, int] = {}

    def floor(unit) -> int:
        if unit not in floors:
            floors[unit] = 1 + max((floor(u) for u in graph.get(unit, ())), default=-1)
        return floors[unit]

    for unit in {_unit(m) for m in _modules()} - {""}:
        floor(unit)
    assert floors["ledger"] < floors["memory"] < floors["experiments"] < floors["plots"], floors
    assert floors["ledger"] < floors["distributed"] < floors["experiments"], floors
