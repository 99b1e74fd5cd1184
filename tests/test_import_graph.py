"""The package's imports point one way: no module of webapp/ imports, even inside a function, a module that
imports it back (through any number of others). Read from the source with ast, so nothing is executed."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "webapp"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every dotted name the source imports, at any depth (functions, classes, conditionals included).

    `from a import b` counts as a.b, which is a module or else a name defined in a."""
    package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name inside a module counts as that module)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {
            resolve(name) for name in imported_names(path.read_text(), module, path.name == "__init__.py")
        }
        graph[module] = {target for target in targets if target and target != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None when there is none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (cycle := visit(target)):
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph(module_files())

    cycle = find_cycle(graph)

    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_holds_every_module_and_its_imports():
    graph = import_graph(module_files())

    assert {
        "webapp.models.memories",
        "webapp.web.chats.page",
        "webapp.factory",
        "webapp.cli.memories",
    } <= set(graph)
    assert "webapp.models.agents" in graph["webapp.models.memories"]
    assert "webapp.models" in graph["webapp.jobs.reflection"]  # `from webapp.models import Agent`
    assert "webapp.jobs.consolidation" in graph["webapp.cli.memories"]


def test_imports_inside_functions_count(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def later():\n    from pkg.a import thing\n    return thing\n")
    (package / "c.py").write_text("from . import a\n")

    graph = import_graph(module_files(package))

    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_a_longer_cycle_is_named_in_full():
    graph = {"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}

    assert find_cycle(graph) == ["x", "y", "z", "x"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


# The ways in, by folder: the pages (web/, and admin/ built on it), /v1, MCP and the `flask` commands.
DOORS = {"web": "pages", "admin": "pages", "api": "v1", "mcp": "mcp", "cli": "cli"}


def test_a_door_imports_no_other_door():
    """The doors call the verbs (webapp.actions, agent_files/, models/) and translate; none reaches into another.
    The one exception: `flask mcp` is the command that starts the MCP server, so cli/mcp.py imports it."""
    graph = import_graph(module_files())

    def door(module: str) -> str | None:
        parts = module.split(".")
        return DOORS.get(parts[1]) if len(parts) > 1 else None

    crossings = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if door(module)
        and door(target)
        and door(target) != door(module)
        and not (module == "webapp.cli.mcp" and door(target) == "mcp")
    )

    assert crossings == []


def test_the_door_rule_sees_a_door_importing_a_page():
    graph = import_graph(module_files())

    assert "webapp.actions.ask" in graph["webapp.api.views"]
    assert "webapp.actions.memory" in graph["webapp.mcp.server"]
    assert not any(target.startswith("webapp.web") for target in graph["webapp.api.views"])
