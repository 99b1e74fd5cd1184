"""Adding a tool, a job kind or a search signal is one new file (issue 34): each test writes a throwaway one in a
temporary module of its package, touching nothing else, and sees it offered, labelled and listed."""

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa

from tests import factories
from webapp import jobs, search, tools
from webapp.extensions import db
from webapp.jobs.runs import JOB_TYPES
from webapp.llm import ToolCall
from webapp.models import JobRun
from webapp.search import signals
from webapp.tools import steps

WEATHER = """
from webapp.tools.base import Tool


def _run(context, town: str) -> dict:
    return {"town": town, "degrees": 21}


TOOL = Tool(
    name="throwaway_weather",
    description="The weather in a town, now.",
    parameters={"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]},
    run=_run,
    label=lambda arguments, _chat: f"Looking at the sky over {arguments['town']}…",
    chip=lambda _arguments, result, _chat: {"chip": f"{result['degrees']} °C in {result['town']}"},
    failure="see the sky",
)
"""

CHORES = '''
from webapp.jobs.queue import recorded_job


@recorded_job("throwaway_chores", "Sweep the yard")
def sweep() -> dict[str, int]:
    """A job kind that exists only for this test."""
    return {"swept": 1}
'''

NEWER_FIRST = '''
import sqlalchemy as sa

from webapp.extensions import db
from webapp.search.signals import Evidence


def _newer_first(query):
    """Evidence that exists only for this test: the newer a row within the search's scope, the better."""
    return lambda: [(i, float(i)) for i in db.session.scalars(sa.select(query.model.id).where(*query.scope))]


EVIDENCE = Evidence("throwaway_newer_first", _newer_first, weight=3.0)
'''


@contextmanager
def module_in(package: ModuleType, folder: Path, name: str, source: str) -> Iterator[str]:
    """`source` as the module `name` of the package, from a folder of its own, for the block's length."""
    folder.mkdir()
    (folder / f"{name}.py").write_text(source)
    package.__path__.append(str(folder))
    importlib.invalidate_caches()
    try:
        yield f"{package.__name__}.{name}"
    finally:
        package.__path__.remove(str(folder))
        sys.modules.pop(f"{package.__name__}.{name}", None)


def test_a_new_tool_is_one_new_file(tmp_path, client, signed_in):
    try:
        with module_in(tools, tmp_path / "tools", "throwaway_weather", WEATHER):
            tools.discover()
            ada = factories.agent(
                signed_in.account, "Ada", enabled_tools=["save_memory", "throwaway_weather"]
            )
            chat = factories.chat(signed_in.account, [ada])
            asked = factories.message(chat, "Is it raining?", author=signed_in)
            form = client.get("/agents/new").text
            offered = tools.reply_tools(ada, chat).tools
            schemas = [schema["function"]["name"] for schema in tools.schemas_for(offered.values())]
            call = ToolCall("call-1", "throwaway_weather", '{"town": "Leeds"}')
            outcome = tools.run_tool_call(call, tools.ToolContext(ada, chat, asked), offered)
    finally:
        tools.discover()

    assert 'value="throwaway_weather"' in form  # listed: an agent may enable it
    assert list(offered) == ["save_memory", "throwaway_weather"]  # offered to the agent that enabled it
    assert schemas == list(offered)
    assert outcome.result == {"town": "Leeds", "degrees": 21}
    assert "throwaway_weather" not in tools.REGISTRY  # gone with its file


def test_a_new_tool_labels_its_own_steps(tmp_path, admin):
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])
    try:
        with module_in(tools, tmp_path / "tools", "throwaway_weather", WEATHER):
            tools.discover()
            running = steps.running("throwaway_weather", {"town": "Leeds"}, chat)
            done = steps.finished("throwaway_weather", {}, {"town": "Leeds", "degrees": 21}, chat)
            failed = steps.finished("throwaway_weather", {}, {"error": "cloudy"}, chat)
    finally:
        tools.discover()

    assert running["label"] == "Looking at the sky over Leeds…"
    assert done == {"tool": "throwaway_weather", "state": "done", "chip": "21 °C in Leeds"}
    assert failed["chip"] == "Could not see the sky: cloudy"


def test_a_new_job_kind_is_one_new_file(tmp_path, client, signed_in):
    try:
        with module_in(jobs, tmp_path / "jobs", "throwaway_chores", CHORES) as name:
            jobs.load_all()
            counts = sys.modules[name].sweep()
            factories.job_run(signed_in.account, "throwaway_chores")
            page = client.get("/admin/jobs").text
    finally:
        JOB_TYPES.pop("throwaway_chores", None)

    run = db.session.scalar(
        sa.select(JobRun).where(JobRun.job_type == "throwaway_chores").order_by(JobRun.id)
    )
    assert counts == {"swept": 1}
    assert run.status == "done"  # recorded like any job
    assert '<option value="throwaway_chores">Sweep the yard</option>' in page  # listed by its title
    assert "<strong>Sweep the yard</strong>" in page  # its run, labelled


def test_a_new_search_signal_is_one_new_file(tmp_path, admin):
    ada = factories.agent(admin.account, "Ada")
    older = factories.memory(ada, "The greenhouse key hangs by the door.")
    newer = factories.memory(ada, "A key to the shed.")
    before = search.memory_ids(ada.id, "greenhouse key", 5)
    try:
        with module_in(signals, tmp_path / "signals", "throwaway_newer_first", NEWER_FIRST):
            signals.discover()
            listed = [evidence.name for evidence in signals.REGISTRY]
            found = search.memory_ids(ada.id, "greenhouse key", 5)
    finally:
        signals.discover()

    assert before == [older.id, newer.id]  # by words: the older memory holds both
    assert listed == ["words", "meaning", "throwaway_newer_first"]  # after the two it always had
    assert found == [newer.id, older.id]  # the new signal counts in a real search, with no change to it
    assert [evidence.name for evidence in signals.REGISTRY] == ["words", "meaning"]  # gone with its file
