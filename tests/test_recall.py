"""Issue 14.2: the recall tool searches the agent's own memory and conversations in the database's index."""

import json
import re
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.querycount import count_queries
from webapp import search
from webapp.extensions import db
from webapp.jobs.replies import request_replies, respond
from webapp.models import Agent, AgentMemory, JobRun, Message, ReplySources
from webapp.search import indexing
from webapp.search.terms import COMMON_ROWS, informative, terms
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


@pytest.fixture
def chat(admin, ada):
    chat = factories.chat(admin.account, [ada], "Dogs")
    factories.message(chat, "What was my dog called again?", author=admin)
    return chat


def _recall(agent, chat, query: str) -> dict:
    reply = factories.message(chat, "", author=agent, status="streaming")
    return recall(ToolContext(agent=agent, chat=chat, message=reply), query)


def test_a_fact_saved_30_days_ago_is_recalled_and_reaches_the_model(app, fake_llm, chat, ada):
    old = factories.memory(
        ada, "The user's dog is named Biscuit.", "journal", created_at=utcnow() - timedelta(days=30)
    )
    _index(old)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply(tool_calls=[("recall", {"query": "dog named"})])
    fake_llm.reply("Your dog is Biscuit.")

    respond([reply.id])

    first, second = fake_llm.requests
    # A faded entry reaches the prompt only as a match for the conversation ("my dog"), with its date.
    relevant = first["messages"][-1]["content"].split("## Relevant to this conversation", 1)[1]
    assert f"{old.created_at:%Y-%m-%d}" in relevant and "The user's dog is named Biscuit." in relevant
    assert "recall" in first["messages"][-1]["content"]  # the prompt says how to reach the rest
    result = json.loads(second["messages"][-1]["content"])
    assert second["messages"][-1]["role"] == "tool"
    assert result["results"][0] == {
        "memory_id": old.id, "type": "journal", "date": old.created_at.strftime("%Y-%m-%d"),
        "content": "The user's dog is named Biscuit.", "faded": True,
    }  # fmt: skip
    sources = db.session.get(ReplySources, reply.id)
    assert sources.recalled_memory_ids == [old.id]
    # The queries were embedded on a thread of their own, and their cost is the reply's: its run, its chat.
    [run] = db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "reply"))
    embedded = [c for c in factories.embedding_calls() if c.job_run_id is not None]
    assert len(embedded) == 2  # the prompt's memory search, and recall's
    assert {(c.job_run_id, c.chat_id, c.agent_id, c.status) for c in embedded} == {
        (run.id, chat.id, ada.id, "ok")
    }


def test_recall_finds_messages_of_the_agents_conversations_with_their_opaque_id(app, admin, chat, ada):
    other = factories.chat(admin.account, [ada], "Walks")
    walk = factories.message(other, "Biscuit loves the long walk by the river.", author=admin)

    hits = _recall(ada, chat, "river walk")["results"]

    said = walk.created_at.strftime("%Y-%m-%d %H:%M")
    assert hits == [
        {"conversation_id": other.public_id, "conversation": "Walks",
         "excerpt": f"[{said}] dana: Biscuit loves the long walk by the river."}
    ]  # fmt: skip


def test_a_message_found_comes_with_the_turns_around_it_dated_and_named(app, admin, ada):
    walks = factories.chat(admin.account, [ada], "Walks")
    lines = [
        (admin, "Where should we go on Saturday?"),
        (ada, "How about somewhere with water?"),
        (admin, "The lake! I love the lake."),
        (ada, "Then the lake it is, at nine."),
        (admin, "Unrelated: my sister visits on Sunday."),
        (ada, "Say hello to her."),
    ]
    for author, text in lines:
        factories.message(walks, text, author=author)

    [hit] = _recall(ada, walks, "lake")["results"]

    turns = hit["excerpt"].splitlines()
    assert [t.split("] ", 1)[1] for t in turns] == [
        "dana: Where should we go on Saturday?",
        "Ada: How about somewhere with water?",
        "dana: The lake! I love the lake.",
        "Ada: Then the lake it is, at nine.",
        "dana: Unrelated: my sister visits on Sunday.",
    ]  # two turns before the first match, one after the last; the two matches are one excerpt
    assert re.match(r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}\] ", turns[0])  # the date once, then each turn's time
    assert all(re.match(r"\[\d{2}:\d{2}\] ", t) for t in turns[1:])


def test_an_excerpt_dates_each_turn_of_a_new_day(app, admin, ada):
    walks = factories.chat(admin.account, [ada], "Walks")
    with time_machine.travel(datetime(2026, 5, 1, 21, 0), tick=False):
        factories.message(walks, "Shall we walk to the lake?", author=admin)
    with time_machine.travel(datetime(2026, 5, 2, 9, 30), tick=False):
        factories.message(walks, "The lake, at ten.", author=ada)

    [hit] = _recall(ada, walks, "lake")["results"]

    assert hit["excerpt"].splitlines() == [
        "[2026-05-01 21:00] dana: Shall we walk to the lake?",
        "[2026-05-02 09:30] Ada: The lake, at ten.",
    ]


def test_recall_never_returns_another_agents_memory_or_a_foreign_conversation(
    app, admin, stranger, chat, ada
):
    basil = factories.agent(admin.account, "Basil")
    factories.memory(basil, "Basil knows the secret password is marmalade.")
    basil_only = factories.chat(admin.account, [basil], "Basil alone")
    factories.message(basil_only, "The marmalade password is for Basil only.", author=admin)
    discarded = factories.chat(admin.account, [ada], "Old")
    factories.message(discarded, "marmalade in a discarded chat", author=admin)
    discarded.discarded_at = utcnow()
    foreign_agent = factories.agent(stranger.account, "Ada")
    factories.memory(foreign_agent, "Globex marmalade secret.")
    foreign_chat = factories.chat(stranger.account, [foreign_agent])
    factories.message(foreign_chat, "marmalade at Globex", author=stranger)
    db.session.commit()

    assert _recall(ada, chat, "marmalade password secret")["results"] == []
    factories.memory(ada, "I like marmalade.")
    assert [h["content"] for h in _recall(ada, chat, "marmalade")["results"]] == ["I like marmalade."]


def test_deleted_memories_are_not_recalled_and_edits_are_searched_by_their_new_words(app, chat, ada):
    gone = factories.memory(ada, "The gate code is 4711.")
    edited = factories.memory(ada, "The user drinks coffee.")
    gone.soft_delete()
    edited.content = "The user drinks green tea now."
    db.session.commit()

    assert _recall(ada, chat, "gate code")["results"] == []
    assert _recall(ada, chat, "coffee")["results"] == []
    assert [h["memory_id"] for h in _recall(ada, chat, "tea")["results"]] == [edited.id]


def test_rows_written_in_bulk_are_searchable_too(app, admin, chat, ada):
    now = utcnow()
    db.session.execute(
        sa.insert(AgentMemory),
        [{"agent_id": ada.id, "content": "Bulk fact about zucchini.", "memory_type": "core",
          "constitutional": False, "created_at": now, "updated_at": now}],
    )  # fmt: skip
    db.session.execute(sa.update(Message).where(Message.chat_id == chat.id).values(content="zucchini soup?"))
    db.session.commit()

    hits = _recall(ada, chat, "zucchini")["results"]

    assert {h.get("content") for h in hits} - {None} == {"Bulk fact about zucchini."}
    assert [h["excerpt"].split(": ", 1)[1] for h in hits if "excerpt" in h] == ["zucchini soup?"]


def test_results_stay_within_the_token_budget(app, chat, ada):
    app.config["RECALL_TOKEN_BUDGET"] = 100
    for i in range(8):
        factories.memory(ada, f"Fact {i} about tomatoes: " + "they like sun and warm soil. " * 10)

    result = _recall(ada, chat, "tomatoes")

    assert 1 <= len(result["results"]) < 8 and "did not fit" in result["note"]


def test_a_query_without_words_finds_nothing_and_does_not_fail(app, chat, ada):
    factories.memory(ada, "Something.")
    assert _recall(ada, chat, "?!* \"' OR AND NEAR(")["results"] == []


def test_both_databases_leave_out_the_same_common_words(app, client, signed_in, chat, ada):
    factories.memory(ada, "I remind myself daily.")

    page = client.get(f"/admin/agents/{ada.id}/memories", query_string={"q": "myself"}).text

    assert "I remind myself daily." in page  # PostgreSQL drops "myself" from a query: the typed text decides
    assert terms("Don't blame yourself, itself or against it") == ["blame"]


def test_the_words_searched_by_are_all_but_those_both_common_and_frequent():
    held = {"weather": 5_000, "greenhouse": 3, "key": 2_000}
    assert informative(["weather", "greenhouse", "key"], 40_000, held) == [
        "greenhouse",
        "key",
    ]  # 12.5%, 0.01%, 5%
    assert informative(["weather", "key"], 6_000, held) == ["key"]  # the rarest, when all are common
    assert informative(["weather", "key"], 6_000, {"weather": 900, "key": 800}) == [
        "weather",
        "key",
    ]  # few rows


def test_a_word_most_rows_hold_is_left_out_of_the_search_as_it_ranks_nothing(app, chat, ada):
    # Over COMMON_ROWS memories, nearly all about the weather: searching "weather" too would read each of them.
    now = utcnow()
    row = {
        "agent_id": ada.id,
        "memory_type": "core",
        "constitutional": False,
        "created_at": now,
        "updated_at": now,
    }
    db.session.execute(
        sa.insert(AgentMemory),
        [{**row, "content": f"Weather note {i}: cloudy."} for i in range(COMMON_ROWS + 1)],
    )
    key = factories.memory(ada, "The greenhouse keys hang by the door, whatever the weather.")
    search.backend().refresh_term_stats()
    db.session.commit()

    hits = _recall(ada, chat, "weather greenhouses")["results"]

    assert [h.get("memory_id") for h in hits if "memory_id" in h] == [key.id]  # "greenhouses" finds its stem
    assert _recall(ada, chat, "weather")["results"][0]["content"].startswith(
        "Weather note"
    )  # if all are common


def test_new_agents_may_recall_by_default(app, signed_in, client, admin):
    box = re.search(r'<input[^>]*value="recall"[^>]*>', client.get("/agents/new").text).group(0)
    assert "checked" in box
    agent = Agent(account=admin.account, name="Cleo", model_id="m")
    db.session.add(agent)
    db.session.commit()
    assert "recall" in agent.enabled_tools


def _break_the_index() -> None:
    """Break the memories' full-text index, not the memories (as a restore or a table rebuild might)."""
    if db.engine.dialect.name == "sqlite":
        db.session.execute(
            sa.text("INSERT INTO agent_memories_fts(agent_memories_fts) VALUES ('delete-all')")
        )
    else:  # the tsvector is a generated column, never stale; its GIN index can be left invalid (the planner
        # then ignores it), as an interrupted concurrent build leaves it
        db.session.execute(
            sa.text(
                "UPDATE pg_index SET indisvalid = false "
                "WHERE indexrelid = 'ix_agent_memories_search_vector'::regclass"
            )
        )
    db.session.commit()


def _postgres_index_valid() -> bool:
    return db.session.scalar(
        sa.text(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_agent_memories_search_vector'::regclass"
        )
    )


def test_reindex_rebuilds_a_broken_index_from_the_tables(app, runner, chat, ada):
    factories.memory(ada, "The greenhouse key hangs by the door.")
    _break_the_index()
    if db.engine.dialect.name == "sqlite":
        assert _recall(ada, chat, "greenhouse key")["results"] == []  # broken indeed
    else:
        assert not _postgres_index_valid()

    result = runner.invoke(args=["memories", "reindex"])

    assert "agent_memories: 1 rows indexed" in result.output
    assert [h["content"] for h in _recall(ada, chat, "greenhouse key")["results"]] == [
        "The greenhouse key hangs by the door."
    ]
    if db.engine.dialect.name != "sqlite":
        db.session.commit()
        assert _postgres_index_valid()


def _index(*rows) -> None:
    """Write the vectors of these memories and messages, as the embedding job does."""
    indexing.index_memories([r.id for r in rows if isinstance(r, AgentMemory)])
    db.session.commit()
    indexing.index_messages([r.id for r in rows if isinstance(r, Message)])
    db.session.commit()


def test_a_memory_is_found_by_its_meaning_when_no_word_matches(app, chat, ada):
    loss = factories.memory(ada, "My grandmother passed away last spring.")
    _index(loss, factories.memory(ada, "The user prefers tea to coffee."))

    hits = _recall(ada, chat, "death in the family")["results"]

    assert [h["memory_id"] for h in hits] == [loss.id]


def test_search_by_meaning_never_reaches_another_agent_or_a_foreign_conversation(
    app, admin, stranger, chat, ada
):
    basil = factories.agent(admin.account, "Basil")
    basil_only = factories.chat(admin.account, [basil], "Basil alone")
    foreign_agent = factories.agent(stranger.account, "Ada")
    foreign_chat = factories.chat(stranger.account, [foreign_agent])
    _index(
        factories.memory(basil, "My grandmother passed away last spring."),
        factories.memory(foreign_agent, "My grandmother passed away last spring."),
        factories.message(basil_only, "My grandmother passed away last spring.", author=admin),
        factories.message(foreign_chat, "My grandmother passed away last spring.", author=stranger),
    )

    assert _recall(ada, chat, "death in the family")["results"] == []


def test_with_the_embedder_down_recall_answers_by_words(app, chat, ada):
    _index(factories.memory(ada, "The greenhouse key hangs by the door."))
    app.config.update(
        EMBEDDING_BASE_URL="http://127.0.0.1:9/v1", EMBEDDING_MODEL="all-MiniLM-L6-v2 (local, int8)"
    )

    hits = _recall(ada, chat, "greenhouse key")["results"]

    assert [h["content"] for h in hits] == ["The greenhouse key hangs by the door."]
    failed = factories.embedding_calls()[-1]
    assert failed.status == "error"


@pytest.mark.parametrize("candidates", [search.CANDIDATES, 10])
def test_the_scope_is_part_of_the_search_by_meaning_so_closer_rows_outside_it_never_crowd_it_out(
    app, chat, ada, monkeypatch, candidates
):
    """60 closer memories that have left the scope (deleted after their vectors were written, before the embed job
    removes those) still leave the top of the search to the one inside it. With 50 results the search reads 200
    rows by sign bits, so all 61; with 10 it reads 40, all of them out of the scope, and then searches the scope
    itself."""
    monkeypatch.setattr(search, "CANDIDATES", candidates)
    gone = [factories.memory(ada, "A death in the family.") for _ in range(60)]  # the query itself
    kept = factories.memory(ada, "My grandfather died last winter.")
    _index(*gone, kept)
    for memory in gone:
        memory.soft_delete()
    db.session.commit()

    hits = _recall(ada, chat, "a death in the family")["results"]

    assert [h["memory_id"] for h in hits if "memory_id" in h] == [kept.id]


def test_an_agent_with_few_vectors_is_searched_by_meaning_in_one_statement(app, chat, ada):
    """With fewer vectors than the search reads by sign bits, every one of them was a candidate: the longer
    search of the scope would find the same rows again."""
    loss = factories.memory(ada, "My grandmother passed away last spring.")
    _index(loss, factories.memory(ada, "The user prefers tea to coffee."))

    with count_queries() as counted:
        hits = _recall(ada, chat, "a death in the family")["results"]

    assert [h["memory_id"] for h in hits if "memory_id" in h] == [loss.id]
    by_meaning = [s for s in counted.statements if "memory_vectors" in s and "candidates" in s]
    assert len(by_meaning) == 1
