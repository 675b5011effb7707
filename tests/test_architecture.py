"""The shape of the code, walked from its imports (ast; nothing is imported): no circles, and every import points
the way the dependency rule says (docs/architecture.md, "Packages"):

    contracts  <-  solvers  <-  engine
    contracts  <-  console  <-  launch          (console reaches the engine over HTTP only)
    solvers    <-  console, launch

Every import counts, the ones inside functions and under TYPE_CHECKING too: a circle hidden in a function is still a
circle at run time.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contracts", "solvers", "engine", "console", "launch")
# What each top-level package may import of the others.
ALLOWED = {
    "contracts": set(),
    "solvers": {"contracts"},
    "engine": {"contracts", "solvers"},
    "console": {"contracts", "solvers"},
    "launch": {"contracts", "solvers", "console"},
}
MAX_ENGINE_ROOT_MODULES = 12


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The first-party modules `name` imports, resolved to the modules that exist."""
    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # `from pkg import module` imports the module; `from module import name` imports the module
                found.add(resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules else resolve(base))
    found.discard(None)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _collapsed(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """The graph of `prefix`'s direct subpackages (and modules): `console.jobs.worker` counts as `console.jobs`."""
    depth = prefix.count(".") + 2

    def part(name: str) -> str | None:
        return ".".join(name.split(".")[:depth]) if name.startswith(prefix + ".") else None

    collapsed: dict[str, set[str]] = defaultdict(set)
    for name, deps in graph.items():
        if (source := part(name)) is None:
            continue
        collapsed[source].update(d for dep in deps if (d := part(dep)) is not None and d != source)
    return dict(collapsed)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph()


def test_the_walk_sees_the_packages_and_their_imports(graph):
    """Guards the walk itself: a walk that resolved nothing would find no circle anywhere."""
    assert "engine.control.driver" in graph and "console.jobs.worker" in graph
    assert "engine.ranks.group" in graph["engine.control.driver"]
    assert any(dep.startswith("solvers.") for dep in graph["engine.control.driver"])


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_round_a_circle(graph):
    assert _cycles(graph) == []


@pytest.mark.parametrize("prefix", ["console", "engine", "solvers"])
def test_no_circle_between_the_packages_of(graph, prefix):
    """One level up: console's apps (jobs, calibration, ...) and the engine's role packages import one way."""
    assert _cycles(_collapsed(graph, prefix)) == []


def test_every_import_follows_the_dependency_rule(graph):
    against = sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
                     if (top := dep.split(".")[0]) != name.split(".")[0]
                     and top not in ALLOWED[name.split(".")[0]])
    assert against == []


def test_the_engines_root_holds_at_most_a_handful_of_modules():
    root_modules = sorted(path.name for path in (ROOT / "engine").glob("*.py"))
    assert len(root_modules) <= MAX_ENGINE_ROOT_MODULES, root_modules


def test_the_console_mirrors_no_contract_as_a_typeddict():
    """The engine's replies are typed once, in contracts/; a TypedDict in the console would be a second owner."""
    mirrors = [str(path.relative_to(ROOT)) for path in (ROOT / "console").rglob("*.py")
               if "TypedDict" in path.read_text()]
    assert mirrors == []


def test_tests_load_their_fixtures_as_plugins_not_by_path():
    """tests/support/ is the one fixture home (pytest_plugins): no conftest loaded by file path, no sys.path edits."""
    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location" or \
                    isinstance(node, ast.Attribute) and node.attr == "insert" and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "path":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
