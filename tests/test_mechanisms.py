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


JOB_TARGET_BY_HAND = re.compile(r"""f["'](agent|chat|messages):|removeprefix\(["'](agent|chat|messages):""")


def test_job_targets_are_written_and_read_by_one_helper():
    from webapp.jobs.compaction import compact_chat
    from webapp.jobs.consolidation import consolidate_chat
    from webapp.jobs.queue import job_target, target_ids
    from webapp.jobs.refinement import refine_agent
    from webapp.jobs.reflection import reflect_agent
    from webapp.jobs.replies import respond
    from webapp.jobs.summaries import summarize

    by_hand = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _modules(".")
        if path != PACKAGE / "jobs" / "queue.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if JOB_TARGET_BY_HAND.search(line)
    ]
    targets = {
        func.job_kind.job_type: func.job_kind.target_of(args)
        for func, args in [
            (respond, ([4, 5],)),
            (summarize, (3, 2)),
            (consolidate_chat, (3, True)),
            (compact_chat, (3,)),
            (refine_agent, (2, True)),
            (reflect_agent, (2,)),
        ]
    }

    assert by_hand == []
    assert targets == {
        "reply": "messages:4,5",  # the labels job_runs already holds
        "summarize": "chat:3 agent:2",
        "consolidate": "chat:3",
        "compact": "chat:3",
        "refine": "agent:2",
        "reflect": "agent:2",
    }
    assert job_target(chat=3, agent=2) == "chat:3 agent:2"
    assert (target_ids("chat:3 agent:2", "agent"), target_ids("messages:4,5", "messages")) == ([2], [4, 5])
    assert target_ids(None, "chat") == target_ids("agent:2", "chat") == []
