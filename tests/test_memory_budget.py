"""Issue 14.1 and 14.3: memory in every prompt stays within its budget; extraction knows the recent journal."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.refinement import refine_agent
from webapp.jobs.reflection import reflect_agent
from webapp.models import AgentMemory
from webapp.prompting.build import PromptTooLarge, build_prompt, fit_to_budget, prompt_tokens
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens
from webapp.tools import ToolContext
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
    assert prompt_tokens(prompt.messages) <= app.config["PROMPT_TOKEN_BUDGET"]
    core = section.split("## Core memories (permanent)\n")[1].split("\n\n")[0].splitlines()
    assert (
        core[0] == "- Memory number 1: the user grows 1 kinds of roses by the old stone wall."
    )  # oldest first
    assert core[1].startswith("- Memory number 3:")
    assert "did not fit here" in section and "recall tool" in section
    assert counted.count < 15  # the same few queries whatever the number of memories
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


def test_fitting_drops_the_oldest_transcript_then_tool_results_then_refuses():
    messages = [
        {"role": "system", "content": "You are Ada."},
        {"role": "user", "content": "old " * 500},
        {"role": "user", "content": "newest question"},
        {"role": "system", "content": "# Your memory"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "recall", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"results": ["x " * 800]})},
    ]  # fmt: skip

    used = fit_to_budget(messages, 200)

    assert used <= 200
    assert [m["content"] for m in messages if m["role"] == "user"] == ["newest question"]
    assert "removed" in messages[-1]["content"]
    assert messages[2]["content"].startswith("(Earlier messages")
    with pytest.raises(PromptTooLarge):
        fit_to_budget([{"role": "system", "content": "word " * 300}, {"role": "user", "content": "hi"}], 100)


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
    assert all(count_tokens(p.split("## Recent Journal Entries")[1]) <= 400 for p in prompts)
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
