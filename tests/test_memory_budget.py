"""Issue 14.1 and 14.3: memory in every prompt stays within its budget; extraction knows the recent journal."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
from llama_cpp.llama_chat_format import chatml_function_calling

from tests import factories
from tests.querycount import count_queries
from webapp import config
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.refinement import refine_agent
from webapp.jobs.reflection import reflect_agent
from webapp.llm.targets import for_environment
from webapp.models import AgentMemory
from webapp.prompting.build import build_prompt
from webapp.prompting.window import PromptTooLarge, fit_to_budget, prompt_tokens, text_tokens
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens
from webapp.tools import REGISTRY, ToolContext, reply_tools, schemas_for
from webapp.tools.save_memory import save_memory


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


@pytest.fixture
def chat(admin, ada):
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "What do you remember?", author=admin)
    return chat


def _bulk_memories(agent, count: int) -> None:
    """Half core, half journal within the week, each about 15 tokens."""
    now = utcnow()
    rows = []
    for i in range(count):
        kind = "core" if i % 2 else "journal"
        content = f"Memory number {i}: the user grows {i % 17} kinds of roses by the old stone wall."
        rows.append(
            {"agent_id": agent.id, "content": content, "memory_type": kind, "constitutional": False,
             "token_estimate": count_tokens(content), "content_hash": f"h{i}",
             "created_at": now - timedelta(minutes=count - i), "updated_at": now}
        )  # fmt: skip
    db.session.execute(sa.insert(AgentMemory), rows)
    db.session.commit()


def _memory_section(prompt) -> str:
    context = prompt.messages[-1]["content"]
    return context[context.index("# Your memory") : context.index("# Now")].strip()


def test_the_prompt_stays_within_the_memory_budget_with_10000_memories(app, chat, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 1500
    _bulk_memories(ada, 10_000)

    with count_queries() as counted:
        prompt = build_prompt(chat, ada)

    section = _memory_section(prompt)
    assert count_tokens(section) <= 1500
    assert prompt_tokens(prompt.target, prompt.messages) <= prompt.target.input_budget()
    core = section.split("## Core memories (permanent)\n")[1].split("\n\n")[0].splitlines()
    assert (
        core[0] == "- Memory number 1: the user grows 1 kinds of roses by the old stone wall."
    )  # oldest first
    assert core[1].startswith("- Memory number 3:")
    assert "did not fit here" in section and "recall tool" in section
    assert counted.count < 25  # the same few queries whatever the number of memories, the search included
    assert len(prompt.sources.memory_ids) == len(core)


def test_journal_entries_fill_what_core_leaves_newest_first(app, chat, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 400
    _bulk_memories(ada, 20)  # 10 core of about 23 tokens each, then journal

    section = _memory_section(build_prompt(chat, ada))

    journal = section.split("## Journal (last 7 days, newest first)\n")[1].split("\n\n")[0].splitlines()
    assert "Memory number 18:" in journal[0] and "Memory number 16:" in journal[1]
    assert "0 core memories and" in section and "journal entries of this week did not fit" in section


def test_an_agents_own_budget_wins_over_the_setting(app, chat, ada):
    ada.memory_token_budget = 300
    db.session.commit()
    _bulk_memories(ada, 200)

    assert count_tokens(_memory_section(build_prompt(chat, ada))) <= 300


def test_fitting_drops_the_oldest_transcript_then_tool_results_then_refuses(app):
    messages = [
        {"role": "system", "content": "You are Ada."},
        {"role": "user", "content": "old " * 500},
        {"role": "user", "content": "newest question"},
        {"role": "system", "content": "# Your memory"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "recall", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"results": ["x " * 800]})},
    ]  # fmt: skip

    target = for_environment("m")
    used = fit_to_budget(target, messages, budget=200)

    assert used <= 200
    assert [m["content"] for m in messages if m["role"] == "user"] == ["newest question"]
    assert "removed" in messages[-1]["content"]
    assert messages[2]["content"].startswith("(Earlier messages")
    with pytest.raises(PromptTooLarge):
        fit_to_budget(
            target,
            [{"role": "system", "content": "word " * 300}, {"role": "user", "content": "hi"}],
            budget=100,
        )


def test_a_reply_whose_prompt_cannot_fit_fails_with_the_reason(app, fake_llm, chat, ada):
    from webapp.jobs.replies import request_replies, respond

    app.config["PROMPT_TOKEN_BUDGET"] = 20
    [reply] = request_replies(chat, [ada])
    db.session.commit()

    with pytest.raises(Exception):  # noqa: B017 (the job fails; the message says why)
        respond([reply.id])

    db.session.expire_all()
    assert reply.status == "failed" and "PROMPT_TOKEN_BUDGET" in reply.error
    assert fake_llm.requests == []  # checked before the call


# The whole request fits the model's window: messages, tool schemas and the answer's room


class _Rendered(Exception):
    """The prompt llama-cpp-python built for the stand-in model."""


class _RendersOnly:
    verbose = False

    def create_completion(self, prompt: str, **_):
        raise _Rendered(prompt)


def _as_the_local_server_sees_it(messages, tools) -> int:
    """The tokens of the prompt the local model's server (chatml-function-calling) builds from this request,
    tools offered, in the local model's own tokenizer."""
    choice = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    with pytest.raises(_Rendered) as rendered:
        chatml_function_calling(_RendersOnly(), messages=messages, tools=tools, tool_choice=choice)
    return text_tokens(for_environment("smollm2"), rendered.value.args[0])


@pytest.fixture
def local_defaults(app, monkeypatch, tmp_path):
    """The settings of a Cairn with no configuration: the embedded local model and its window."""
    for name in ("LLM_BASE_URL", "PROMPT_TOKEN_BUDGET", "MEMORY_TOKEN_BUDGET", "MEMORY_DOC_PROMPT_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    defaults = config.load(str(tmp_path))
    for name in ("LOCAL_LLM", "PROMPT_TOKEN_BUDGET", "MEMORY_TOKEN_BUDGET", "MEMORY_DOC_PROMPT_TOKENS",
                 "TRANSCRIPT_TOKEN_BUDGET", "TRANSCRIPT_MAX_MESSAGES"):  # fmt: skip
        app.config[name] = defaults[name]
    app.config.pop("LLM_MAX_OUTPUT_TOKENS", None)
    return defaults


def test_with_the_local_defaults_a_huge_memory_and_a_long_chat_fit_the_local_window(
    app, local_defaults, admin, ada
):
    ada.enabled_tools = ["save_memory", "recall", "borrow_context"]
    chat = factories.chat(admin.account, [ada], "Accounts")
    chat.memory_doc = "\n\n## ".join(
        f"Part {i}: on 2025-04-{i % 28 + 1:02d} Dana paid invoice {i * 7919} of {i * 37} EUR." * 8
        for i in range(60)
    )
    db.session.commit()
    now = utcnow()
    rows = [
        {"agent_id": ada.id, "memory_type": "core" if i % 2 else "journal", "constitutional": False,
         "content": f"On 2025-05-{i % 28 + 1:02d} the user paid {i * 37} EUR for item #{i * 13} (ref {i * 7919}).",
         "token_estimate": 30, "content_hash": f"h{i}", "created_at": now - timedelta(minutes=10_000 - i),
         "updated_at": now}
        for i in range(10_000)
    ]  # fmt: skip
    db.session.execute(sa.insert(AgentMemory), rows)
    db.session.commit()
    for i in range(300):
        factories.message(chat, f"Message {i}: on 2025-06-{i % 28 + 1:02d} I spent {i * 41} on {i * 3} things.",
                          author=admin if i % 2 else ada)  # fmt: skip

    prompt = build_prompt(chat, ada)

    tools = schemas_for(reply_tools(ada, chat).tools.values())
    sent = _as_the_local_server_sees_it(prompt.messages, tools)
    assert sent + prompt.target.answer_room() <= config.LOCAL_MODEL_CONTEXT_TOKENS
    assert (
        prompt_tokens(prompt.target, prompt.messages, tools) >= sent
    )  # the check never counts less than the server sees
    assert "Message 299:" in prompt.messages[-2]["content"]  # the newest message is always there
    context = prompt.messages[-1]["content"]
    assert "# Your memory" in context and "did not fit here" in context
    assert prompt.messages[1]["content"].startswith("# Conversation so far")


def test_the_check_counts_the_tool_schemas_sent_with_the_messages(app):
    tools = schemas_for(REGISTRY[name] for name in ["save_memory", "recall", "borrow_context"])
    messages = [
        {"role": "system", "content": "You are Ada."},
        {"role": "user", "content": "old " * 3000},
        {"role": "user", "content": "newest question"},
        {"role": "system", "content": "# Now"},
    ]
    target = for_environment("m")
    without_tools = prompt_tokens(target, messages)
    assert prompt_tokens(target, messages, tools) > without_tools

    used = fit_to_budget(target, messages, tools, budget=without_tools)

    assert used <= without_tools
    assert [m["content"] for m in messages if m["role"] == "user"] == ["newest question"]


def test_the_default_budget_fits_the_local_models_window_and_a_setting_still_wins(app):
    """The budget follows the model in use (webapp.llm.targets): the local window less the answer's room, 24,000
    with a provider that gives no window, PROMPT_TOKEN_BUDGET when set, and never past a known window."""
    app.config.update(PROMPT_TOKEN_BUDGET=None, LLM_MAX_OUTPUT_TOKENS=None, LOCAL_LLM=True)
    local = for_environment("smollm2").input_budget()
    app.config["LOCAL_LLM"] = False
    provider = for_environment("gpt-4o-mini").input_budget()
    app.config["PROMPT_TOKEN_BUDGET"] = 50_000
    chosen = for_environment("gpt-4o-mini").input_budget()

    assert local == config.LOCAL_MODEL_CONTEXT_TOKENS - config.ANSWER_RESERVE_TOKENS
    assert provider == 24_000 and chosen == 50_000


@pytest.mark.parametrize(
    ("settings", "budget"),
    [
        ({"PROMPT_TOKEN_BUDGET": 8192}, 7168),
        ({"PROMPT_TOKEN_BUDGET": 7000, "LLM_MAX_OUTPUT_TOKENS": 2000}, 6192),
    ],
)
def test_a_budget_past_the_local_window_leaves_the_answer_its_room(app, settings, budget):
    app.config.update({"LOCAL_LLM": True, "LLM_MAX_OUTPUT_TOKENS": None, **settings})

    assert for_environment("smollm2").input_budget() == budget


# Extraction (14.3)


@pytest.fixture
def group_chat(admin, ada):
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil], "Garden club")
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "I planted the roses by the wall.", author=admin)
    return chat


def test_the_extraction_prompt_lists_the_recent_journal(app, fake_llm, group_chat, ada):
    factories.memory(ada, "The user planted roses by the wall.", "journal")
    factories.memory(
        ada, "A faded entry from last month.", "journal", created_at=utcnow() - timedelta(days=30)
    )
    factories.memory(ada, "I am a careful gardener.", "core")

    consolidate_chat(group_chat.id)

    prompts = [r["messages"][0]["content"] for r in fake_llm.requests if r["model"] == "ada-model"]
    assert "The user planted roses by the wall." in prompts[0]
    assert "I am a careful gardener." in prompts[0]
    assert "A faded entry from last month." not in prompts[0]


def test_a_case_space_and_punctuation_variant_is_not_stored_twice(app, fake_llm, group_chat, ada):
    factories.memory(ada, "The user planted roses by the wall.", "journal")
    fake_llm.reply(
        json.dumps({"journal": ["the USER planted   roses, by the wall"], "core": []}), model="ada-model"
    )

    assert consolidate_chat(group_chat.id)["duplicates"] == 1

    contents = db.session.scalars(sa.select(AgentMemory.content).where(AgentMemory.agent_id == ada.id)).all()
    assert contents == ["The user planted roses by the wall."]
    reply = factories.message(group_chat, "Noted.", author=ada)
    context = ToolContext(agent=ada, chat=group_chat, message=reply)
    assert save_memory(context, "  the user planted roses by the wall!! ", "core")["saved"] is False


# Reflection and refinement page through what does not fit (14.1)


def test_reflection_pages_through_a_long_journal(app, fake_llm, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 200
    for i in range(30):
        factories.memory(ada, f"Journal entry {i} about the roses and the weather that day.", "journal")
    fake_llm.default_text = json.dumps({"promote": []})

    result = reflect_agent(ada.id)

    assert result["entries"] == 30
    prompts = [r["messages"][0]["content"] for r in fake_llm.requests]
    assert len(prompts) > 1
    assert all(count_tokens(p.split("Journal entries, by day:")[1]) <= 400 for p in prompts)
    listed = [i for i in range(30) if any(f"Journal entry {i} about" in p for p in prompts)]
    assert listed == list(range(30))  # every entry was shown once, none dropped


def test_refinement_lists_a_page_and_pages_through_the_rest(app, fake_llm, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 200
    ada.core_token_budget = 100
    db.session.commit()
    memories = [factories.memory(ada, f"Core belief {i} about patience with slow roses.") for i in range(30)]
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "page", "page": "2"})])
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "read it all"})])

    refine_agent(ada.id, force=True)

    first = fake_llm.requests[0]["messages"][0]["content"]
    assert "(page 1 of" in first and f"#{memories[0].id} " in first and f"#{memories[-1].id} " not in first
    page_two = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert page_two["type"] == "page" and page_two["page"] == 2
    assert page_two["results"][0]["id"] > memories[0].id


def test_refinement_pages_read_earlier_give_way_so_no_turn_outgrows_the_budget(app, fake_llm, ada):
    app.config["PROMPT_TOKEN_BUDGET"] = 2500
    app.config["MEMORY_TOKEN_BUDGET"] = 300
    ada.core_token_budget = 100
    db.session.commit()
    for i in range(80):  # five pages
        factories.memory(ada, f"Core belief {i} about patience with slow roses.")
    for page in (2, 3, 4, 5):
        fake_llm.reply(tool_calls=[("refine_memory", {"action": "page", "page": str(page)})])
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "read it all"})])

    refine_agent(ada.id, force=True)

    assert len(fake_llm.requests) == 5
    target = for_environment("m")
    assert all(prompt_tokens(target, r["messages"], r.get("tools")) <= 2500 for r in fake_llm.requests)
    results = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "removed" in results[0] and json.loads(results[-1])["page"] == 5  # the newest page is whole
