"""Prompt assembly: system prompt, transcript, then memory, time and participants; only active memory."""

import json
from datetime import timedelta

import time_machine

from tests import factories
from webapp.extensions import db
from webapp.jobs.replies import request_replies, respond
from webapp.jobs.summaries import summarize
from webapp.models import ChatAgent
from webapp.prompting.build import TRUNCATION_NOTE, build_prompt
from webapp.timeutil import utcnow

NOW = "2026-11-21 12:00:00Z"


@time_machine.travel(NOW, tick=False)
def test_parts_arrive_in_order_with_roles_and_authors(admin):
    ada = factories.agent(admin.account, "Ada", system_prompt="You are Ada, a botanist.")
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil], "Garden")
    factories.message(chat, "Which rose?", author=admin)
    factories.message(chat, "A damask.", author=basil)
    factories.message(chat, "Agreed.", author=ada)
    factories.message(chat, "Basil joined the conversation.", role="system")
    factories.memory(ada, "I love roses.", "core")
    factories.memory(ada, "I am patient.", "core")
    factories.memory(ada, "Dana asked about roses.", "journal")
    factories.memory(ada, "Dana watered the tulips.", "journal")

    messages = build_prompt(chat, ada).messages

    assert messages[0] == {"role": "system", "content": "You are Ada, a botanist."}
    assert messages[1:5] == [
        {"role": "user", "content": "dana: Which rose?"},
        {"role": "user", "content": "Basil: A damask."},
        {"role": "assistant", "content": "Agreed."},
        {"role": "user", "content": "System: Basil joined the conversation."},
    ]
    context = messages[-1]["content"]
    assert messages[-1]["role"] == "system" and len(messages) == 6
    assert context.index("## Core memories") < context.index("- I am patient.") < context.index("## Journal")
    assert "- 2026-11-21: Dana watered the tulips." in context
    relevant = context.split("## Relevant to this conversation")[1].split("## Core memories")[0]
    assert "- (2026-11-21, core memory) I love roses." in relevant  # the conversation is about roses
    assert "- (2026-11-21, journal) Dana asked about roses." in relevant
    assert "Current time: 2026-11-21 12:00 UTC" in context
    assert "Participants: Ada (you), Basil (agent), dana (person)" in context


def test_without_a_system_prompt_the_agent_is_its_name(admin):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])

    assert build_prompt(chat, ada).messages[0] == {"role": "system", "content": "You are Ada."}


def test_only_active_memory_reaches_the_prompt(admin):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    factories.memory(ada, "kept core", "core")
    factories.memory(ada, "deleted core", "core", deleted_at=utcnow())
    factories.memory(ada, "fresh journal", "journal", created_at=utcnow() - timedelta(days=6))
    factories.memory(ada, "faded journal", "journal", created_at=utcnow() - timedelta(days=8))
    factories.memory(ada, "deleted journal", "journal", deleted_at=utcnow())
    other = factories.agent(admin.account, "Basil")
    factories.memory(other, "someone else's memory", "core")

    context = build_prompt(chat, ada).messages[-1]["content"]

    assert "kept core" in context and "fresh journal" in context
    for absent in ("deleted core", "faded journal", "deleted journal", "someone else's"):
        assert absent not in context


def test_a_reply_sees_only_finished_messages_before_it(admin):
    ada = factories.agent(admin.account, "Ada")
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    factories.message(chat, "Question?", author=admin)
    factories.message(chat, "", author=basil, status="failed", error="boom")
    first = factories.message(chat, "Basil's answer", author=basil)
    mine = factories.message(chat, "", author=ada, status="pending")
    factories.message(chat, "Later message", author=admin)

    transcript = [m["content"] for m in build_prompt(chat, ada, before_message_id=mine.id).messages[1:-1]]

    assert transcript == ["dana: Question?", "Basil: Basil's answer"]
    assert first.id < mine.id


def test_a_long_history_keeps_the_newest_messages_within_budget_and_says_so(admin, app):
    app.config["TRANSCRIPT_TOKEN_BUDGET"] = 200
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    for i in range(100):
        chat.add_message(role="user", content=f"message {i} " + "word " * 20, user=admin, status="done")
    db.session.commit()

    messages = build_prompt(chat, ada).messages

    transcript = messages[1:-1]
    assert 1 < len(transcript) < 20
    assert transcript[-1]["content"].startswith("dana: message 99 ")
    assert messages[-1]["content"].startswith(TRUNCATION_NOTE)


def test_prompt_assembly_uses_a_constant_number_of_queries(admin, app):
    from tests.querycount import count_queries

    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])

    def queries_for(n_messages: int) -> int:
        for i in range(n_messages):
            chat.add_message(role="user", content=f"m{i}", user=admin, status="done")
            factories.memory(ada, f"memory {n_messages}-{i}", "core")
        db.session.commit()
        db.session.expire_all()
        with count_queries() as counted:
            build_prompt(chat, ada)
        return counted.count

    assert queries_for(5) == queries_for(200)


def test_no_model_sees_an_untitled_chats_database_id(admin, fake_llm):
    """One model-facing title: the reply prompt's Now block, the other-conversations list, the summary prompt and
    the borrow tool's answer all call an untitled chat "Untitled conversation" (DESIGN.md 5.2)."""
    ada = factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context"])
    for _ in range(40):
        factories.chat(admin.account, [ada])  # ids that no date or count in a prompt could stand for
    here, there = factories.chat(admin.account, [ada]), factories.chat(admin.account, [ada])
    factories.message(there, "Roses need sun.", author=admin)
    db.session.get(ChatAgent, there.chat_agents[0].id).agent_summary = "Roses."
    factories.message(here, "Hello", author=admin)
    [reply] = request_replies(here, [ada])
    db.session.commit()
    fake_llm.reply(tool_calls=[("borrow_context", {"conversation_id": there.public_id})])
    fake_llm.reply("Done.")
    fake_llm.reply("Dana says hello.\nAda listens.")

    respond([reply.id])
    summarize(here.id, ada.id)

    reply_prompt, after_tool, summary_prompt = fake_llm.requests
    now_block = reply_prompt["messages"][-1]["content"].split("# Now")[1]
    assert "Conversation: Untitled conversation" in now_block
    assert f'[{there.public_id}] "Untitled conversation"' in reply_prompt["messages"][-1]["content"]
    assert (
        'recent messages of "Untitled conversation"'
        in json.loads(after_tool["messages"][-1]["content"])["message"]
    )
    assert 'Conversation: "Untitled conversation"' in summary_prompt["messages"][-1]["content"]
    for request in (reply_prompt, after_tool, summary_prompt):
        text = json.dumps(request)
        assert f"Conversation {here.id}" not in text and f"Conversation {there.id}" not in text


def test_a_new_agents_prompt_searches_nothing_and_asks_no_budget_queries(admin, app, monkeypatch):
    """Nothing to rank and nothing to list: neither the query's embedding nor the search nor the budget's two
    queries run; the prompt says the agent has no memory yet, as it did when they ran. A first memory, or a
    constitutional one alone, brings back what it needs."""
    from webapp import search
    from webapp.prompting import build

    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    chat.add_message(role="user", content="What do you know about my garden?", user=admin, status="done")
    db.session.commit()
    searched, budgeted = [], []
    monkeypatch.setattr(search, "query_vector", lambda *a, **k: searched.append(a) or _no_vector())
    monkeypatch.setattr(build, "memories_within", _recording(build.memories_within, budgeted))

    empty = build_prompt(chat, ada).messages[-1]["content"]
    assert searched == [] and budgeted == []

    factories.memory(ada, "Be kind.", "core", constitutional=True)
    with_rule = build_prompt(chat, ada).messages[-1]["content"]
    assert searched == [] and len(budgeted) == 1  # listed, and nothing to rank
    factories.memory(ada, "The garden has roses.", "core")
    with_roses = build_prompt(chat, ada).messages[-1]["content"]
    assert len(searched) == 1 and len(budgeted) == 2
    assert "Be kind." in with_rule and "The garden has roses." in with_roses
    assert "Be kind." not in empty and "- " not in empty.split("# Your memory")[1].split("# Now")[0]


def _no_vector():
    from concurrent.futures import Future

    future = Future()
    future.set_result(None)
    return future


def _recording(func, calls: list):
    def recorded(*args, **kwargs):
        calls.append(args)
        return func(*args, **kwargs)

    return recorded
