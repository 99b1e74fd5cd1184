"""The README's layout section names exactly what is in webapp/, and each package says in one line what it holds."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "webapp"


def _layout_entries() -> tuple[set[str], set[str]]:
    """(top-level entries, entries under webapp/) as the README's layout block lists them."""
    section = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = section.split("```", 2)[1]
    top, inner = set(), set()
    for line in block.splitlines():
        match = re.match(r"^( *)(\S+)\s", line + " ")
        if match:
            (inner if match.group(1) else top).add(match.group(2))
    return top, inner


def test_the_layout_lists_every_part_of_the_package_and_nothing_else():
    _, listed = _layout_entries()
    present = {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    present |= {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}

    assert listed == present


def test_every_top_level_entry_of_the_layout_exists():
    top, _ = _layout_entries()

    assert {"webapp/", "app.py", "worker.py", "migrations/", "tests/"} <= top
    assert [entry for entry in sorted(top) if not (ROOT / entry).exists()] == []


def test_each_package_says_in_one_line_what_lives_there():
    packages = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))

    assert {p.name for p in packages} >= {
        "web",
        "admin",
        "llm",
        "prompting",
        "jobs",
        "models",
        "tools",
        "runtime",
    }
    for package in packages:
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert docstring, f"{package.name}/__init__.py has no docstring"
        summary, _, rest = docstring.partition("\n")
        assert summary.endswith(".") and (not rest or rest.startswith("\n")), f"{package.name}: {summary}"


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines():
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }

    assert long == {}
