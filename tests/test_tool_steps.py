"""A tool says how its calls show in the chat (issue 34): its running label, its chip and what failed come from
the tool itself (Tool.label, Tool.chip, Tool.failure), so a new tool is its own file (tests/test_one_new_file.py)."""

from tests import factories
from webapp import tools
from webapp.tools import steps
from webapp.tools.base import Tool


def test_a_new_tool_shows_in_its_own_words(monkeypatch, admin):
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])
    weather = Tool(
        name="weather",
        description="The weather.",
        parameters={"type": "object", "properties": {}},
        run=lambda context: {"degrees": 21},
        label=lambda arguments, _chat: f"Looking at the sky over {arguments['town']}…",
        chip=lambda _arguments, result, _chat: {"chip": f"{result['degrees']} °C"},
        failure="see the sky",
    )
    monkeypatch.setitem(tools.REGISTRY, "weather", weather)

    assert steps.running("weather", {"town": "Leeds"}, chat)["label"] == "Looking at the sky over Leeds…"
    assert steps.finished("weather", {}, {"degrees": 21}, chat) == {
        "tool": "weather",
        "state": "done",
        "chip": "21 °C",
    }
    assert steps.finished("weather", {}, {"error": "cloudy"}, chat)["chip"] == "Could not see the sky: cloudy"


def test_a_tool_that_says_nothing_shows_plainly(admin):
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])

    assert steps.running("dig_hole", {}, chat)["label"] == "Using dig hole…"
    assert steps.finished("dig_hole", {}, {}, chat)["chip"] == "Used dig hole"
    assert steps.running("save_memory", {}, chat)["label"] == "Saving a memory…"
