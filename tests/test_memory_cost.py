"""Issue 44: memory work at its cost floor. Consolidation's request holds each turn on one short numbered line,
lists what a conversation's memories would repeat (what the chat gave, what the agent holds for everyone), and
reads as much at once as the model's window leaves; tokens are counted, never timed."""

import json
import threading

import numpy as np
import pytest
import sqlalchemy as sa

from tests import factories
from tests.conftest import POSTGRES_URL
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.extraction import numbered_turns, parse_extraction
from webapp.llm import ledger, targets
from webapp.models import AgentMemory, LlmCall, MemorySource, memory_budget
from webapp.prompting.build import build_prompt
from webapp.runtime import priority
from webapp.search import embedder
from webapp.search.indexing import index_memories


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


def _prompts(fake_llm) -> list[str]:
    return [r["messages"][0]["content"] for r in fake_llm.requests]


def test_each_turn_is_one_numbered_line_and_a_memory_names_turns_by_those_numbers(admin, ada, fake_llm):
    chat = factories.chat(admin.account, [ada])
    first = factories.message(chat, "I planted roses\n\n  by the   gate.", author=admin)
    factories.message(chat, "Lovely!", author=ada)
    third = factories.message(chat, "Red ones, from my grandmother.", author=admin)
    fake_llm.reply(
        json.dumps({"journal": [{"memory": "Red roses by the gate.", "turns": [1, 3]}], "core": []})
    )

    consolidate_chat(chat.id, force=True)

    [prompt] = _prompts(fake_llm)
    name = first.author_name
    transcript = prompt.split("Conversation:\n")[1]
    assert (
        transcript
        == f"1 {name}: I planted roses by the gate.\n2 Ada: Lovely!\n3 {name}: Red ones, from my grandmother."
    )
    memory = db.session.scalar(sa.select(AgentMemory).where(AgentMemory.agent_id == ada.id))
    sources = db.session.scalars(
        sa.select(MemorySource.message_id).where(MemorySource.memory_id == memory.id)
    )
    assert sorted(sources) == [first.id, third.id]


def test_numbered_turns_and_their_parsing_agree():
    chunk = [(101, "Ana: one"), (102, "Ada: two"), (103, "Ana: three")]
    assert numbered_turns(chunk) == "1 Ana: one\n2 Ada: two\n3 Ana: three"
    parsed = parse_extraction(
        '{"journal": [{"memory": "m", "turns": ["3", 1, 9]}], "core": []}', [101, 102, 103]
    )
    assert parsed["journal"][0].sources == [101, 103]


def test_extraction_lists_what_the_chat_gave_and_what_everyone_hears_not_other_chats_memories(
    admin, ada, fake_llm
):
    chat, other = factories.chat(admin.account, [ada], "Roses"), factories.chat(admin.account, [ada], "Tax")
    factories.memory(ada, "I am a careful gardener.")  # heard by everyone
    factories.memory(ada, "The roses went in last spring.", "journal", chat_id=chat.id)
    factories.memory(
        ada, "The tax return is due in April.", "journal", chat_id=other.id
    )  # heard here, not listed
    factories.message(chat, "The roses are blooming.", author=admin)
    fake_llm.reply(json.dumps({"journal": ["The tax return is due in April."], "core": []}))

    counts = consolidate_chat(chat.id, force=True)

    [prompt] = _prompts(fake_llm)
    assert "- I am a careful gardener." in prompt and "- The roses went in last spring." in prompt
    assert "tax return" not in prompt
    assert counts["duplicates"] == 1  # what is heard here is still not stored twice


def test_a_chunk_takes_what_the_window_leaves_beside_the_instructions_and_the_memory_listed(app):
    with app.test_request_context():
        target = targets.for_environment("smollm2")  # the local model: an 8k window
        room = target.context_tokens - target.answer_room()
        assert (
            target.chunk_tokens("CONSOLIDATION_CHUNK_TOKENS", 100_000, beside=2_500) == room * 2 // 3 - 2_500
        )
        assert target.chunk_tokens("CONSOLIDATION_CHUNK_TOKENS", 100_000) == room // 3
        app.config["CONSOLIDATION_CHUNK_TOKENS"] = 700
        assert target.chunk_tokens("CONSOLIDATION_CHUNK_TOKENS", 100_000, beside=2_500) == 700


def test_a_prompt_ranks_200_memories_in_six_statements_more_than_none(app, admin, ada):
    """Beside a new agent's prompt: its account (the query's embedder; a reply reads it with its agent), the
    words' counts and the search by words, the query embedding's ledger row, the search by meaning, and the
    budget's memories with their counts. Whether there are memories and vectors is one statement either way."""
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Shall we plant roses by the greenhouse wall?", author=admin)

    def statements() -> tuple[list[str], object]:
        db.session.expire_all()
        with count_queries() as counted:
            prompt = build_prompt(chat, ada)
        return [" ".join(s.split()) for s in counted.statements], prompt

    none, _ = statements()
    factories.memories(ada, 200)
    index_memories(list(db.session.scalars(sa.select(AgentMemory.id))))
    db.session.commit()
    ranked, prompt = statements()

    assert prompt.sources.memory_ids
    assert len(ranked) - len(none) == 6
    assert not [s for s in ranked if "vector_dims" in s or "to_regclass" in s.split(" FROM ")[0]]
    assert not [s for s in ranked if s.startswith("SELECT count(*)") and "agent_memories" in s]


def test_the_query_embeddings_ledger_row_is_written_once_the_reply_has_built_its_prompt(admin, ada):
    """On a reply's way to its model, the query's cost-ledger row steps aside: the search does not wait for it,
    and it is written once no reply of the process is building its prompt (while the model thinks), not
    beside the prompt's statements. It is written all the same."""
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Shall we plant roses by the greenhouse wall?", author=admin)
    factories.memories(ada, 5)
    index_memories(list(db.session.scalars(sa.select(AgentMemory.id))))
    db.session.commit()

    def rows_of_query() -> list[tuple[int, str]]:
        db.session.rollback()  # the row is written on a connection of its own
        embedded = sa.select(LlmCall).where(LlmCall.purpose == "embedding", LlmCall.chat_id == chat.id)
        return [(c.agent_id, c.status) for c in db.session.scalars(embedded)]

    with priority.reply_building():
        prompt = build_prompt(chat, ada)
        ledger.wait_for_rows_aside(timeout=0.3)  # the row waits while the reply builds
        assert prompt.sources.memory_ids and rows_of_query() == []
    ledger.wait_for_rows_aside()
    assert rows_of_query() == [(ada.id, "ok")]


def test_rows_set_aside_are_written_at_once_when_no_reply_is_building(app):
    """Outside a reply (a search on a page, a recall tool call), a row set aside waits for nothing."""
    with app.app_context(), ledger.rows_at_end():
        ledger.record_call({"purpose": "embedding", "model": "m"}, 0.0, status="ok", prompt_tokens=3)
    ledger.wait_for_rows_aside(timeout=5)
    assert db.session.scalar(sa.select(sa.func.count()).select_from(LlmCall)) == 1


def test_a_row_set_aside_that_cannot_be_written_is_logged_and_the_next_ones_are_written(
    app, monkeypatch, caplog
):
    write = ledger._write_rows

    def database_down(rows):
        raise sa.exc.OperationalError("INSERT INTO llm_calls", {}, Exception("the database is down"))

    monkeypatch.setattr(ledger, "_write_rows", database_down)
    with ledger.rows_at_end():
        ledger.record_call({"purpose": "embedding", "model": "m"}, 0.0, status="ok", prompt_tokens=3)
    ledger.wait_for_rows_aside(timeout=5)
    assert "1 cost-ledger rows could not be written" in caplog.text
    monkeypatch.setattr(ledger, "_write_rows", write)
    with ledger.rows_at_end():
        ledger.record_call({"purpose": "embedding", "model": "m"}, 0.0, status="ok", prompt_tokens=4)
    ledger.wait_for_rows_aside(timeout=5)
    assert db.session.scalars(sa.select(LlmCall.prompt_tokens)).all() == [4]


@pytest.mark.skipif(
    not POSTGRES_URL, reason="the plan is PostgreSQL's (SQLite checks each candidate by its key)"
)
@pytest.mark.parametrize("statistics", [False, True])
def test_the_search_by_meaning_reads_the_scope_once_whatever_the_statistics(app, admin, ada, statistics):
    """The memories a prompt may use are read once for the 200 candidates by meaning, not once per candidate:
    PostgreSQL, with no statistics yet of a table just written, read the agent's memories 200 times (7 ms)."""
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Shall we plant roses by the greenhouse wall?", author=admin)
    factories.memories(ada, 200)
    index_memories(list(db.session.scalars(sa.select(AgentMemory.id))))
    db.session.commit()
    if statistics:
        db.session.execute(sa.text("ANALYZE agent_memories, memory_vectors"))
    searched = []

    def remember(_conn, _cursor, statement, parameters, *_args):
        if statement.startswith("WITH candidates"):
            searched.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", remember)
    try:
        build_prompt(chat, ada)
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", remember)

    [(statement, parameters)] = searched
    [[[plan]]] = db.session.connection().exec_driver_sql(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
    )
    loops = [
        node["Actual Loops"] for node in _nodes(plan["Plan"]) if node.get("Relation Name") == "agent_memories"
    ]
    assert loops == [1]


def _nodes(node: dict) -> list[dict]:
    return [node, *(found for child in node.get("Plans", []) for found in _nodes(child))]


def test_a_text_is_embedded_on_one_thread_and_a_long_list_two_batches_at_a_time(monkeypatch):
    """A query's embedding leaves the other core to the reply building its prompt meanwhile; a long list (a
    backfill) still takes both cores, a batch on each. Each text gets its own vector, in order."""
    local = embedder._local()
    assert local.session.get_session_options().intra_op_num_threads == 1
    run, two_running = local.session.run, threading.Barrier(2, timeout=10)

    def run_beside_another(*args, **kwargs):
        two_running.wait()  # broken, after its 10 s, unless two batches run at once
        return run(*args, **kwargs)

    monkeypatch.setattr(local.session, "run", run_beside_another)
    texts = [f"Note {n}: the {TOPICS[n % 3]} again." for n in range(2 * embedder.BATCH)]
    together, _tokens = local.embed(texts)
    monkeypatch.setattr(local.session, "run", run)
    for n in (0, embedder.BATCH + 3):
        alone, _tokens = local.embed([texts[n]])
        assert np.allclose(together[n], alone[0], atol=1e-4)


TOPICS = ["garden", "piano", "sister"]


def test_the_budgets_statements_are_built_once_and_each_chat_hears_only_its_own_memories(admin, ada):
    """The prompt's budget runs statements built once and given each chat's values when run: a private chat's
    memory is listed in that chat alone, whichever chat's prompt was built first, and building more prompts
    builds no statement again."""
    bea = factories.user(admin.account, "bea@example.com", role="member")
    adas_chat = factories.chat(admin.account, [ada], people=[admin])
    beas_chat = factories.chat(admin.account, [ada], people=[bea])
    factories.memory(ada, "The safe's code is 4711.", audience="chat", chat_id=adas_chat.id)
    factories.memory(ada, "Bea's sister is called Ines.", audience="chat", chat_id=beas_chat.id)
    factories.memory(ada, "The office closes at six.")
    factories.message(adas_chat, "What should I remember?", author=admin)
    factories.message(beas_chat, "What should I remember?", author=bea)

    def memory_section(chat) -> str:
        return build_prompt(chat, ada).messages[-1]["content"].split("# Now")[0]

    first = [memory_section(adas_chat), memory_section(beas_chat)]
    built = memory_budget._within_queries.cache_info().misses
    again = [memory_section(beas_chat), memory_section(adas_chat)]
    assert memory_budget._within_queries.cache_info().misses == built
    for adas, beas in (first, again[::-1]):
        assert "4711" in adas and "Ines" not in adas and "six" in adas
        assert "Ines" in beas and "4711" not in beas and "six" in beas
