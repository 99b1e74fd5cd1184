"""Each mechanism is written once (issue 13): read from the source, as a reviewer would."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "webapp"
REDIS_LOCKING = re.compile(r"\bnx\s*=|\.lock\(|\bsetnx\b|\bset_nx\b")


def _modules(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (PACKAGE / folder).rglob("*.py"))


def _imported(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node, alias.name) for alias in node.names)
    return found


def test_only_the_queue_module_takes_redis_locks_or_once_keys():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _modules(".")
        if path != PACKAGE / "jobs" / "queue.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if REDIS_LOCKING.search(line)
    ]

    assert offenders == []


def test_tools_jobs_and_the_llm_client_import_at_the_top_and_point_down():
    inside_functions, upward = [], []
    for path in _modules("tools", "jobs", "llm"):
        tree = ast.parse(path.read_text())
        layer = path.relative_to(PACKAGE).parts[0]
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                inside_functions += [
                    f"{path.relative_to(PACKAGE)}:{node.lineno} imports {name}"
                    for node, name in _imported(function)
                ]
        below = {
            "tools": ("webapp.jobs", "webapp.web", "webapp.admin", "webapp.cli"),
            "llm": ("webapp.tools",),
        }
        upward += [
            f"{path.relative_to(PACKAGE)} imports {name}"
            for _node, name in _imported(tree)
            if name.startswith(below.get(layer, ("webapp.web", "webapp.admin", "webapp.cli")))
        ]

    assert inside_functions == []
    assert upward == []
