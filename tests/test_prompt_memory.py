"""Issue 20.1: a prompt's memory is chosen by what the conversation is about, then by recency, within its
budget; what it held is what the reply's sources list."""

import re
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests import conftest, factories
from tests.querycount import count_queries
from webapp import config
from webapp.extensions import db
from webapp.factory import create_app
from webapp.jobs.replies import request_replies, respond
from webapp.llm.targets import for_agent
from webapp.models import AgentMemory, LlmCall, ReplySources
from webapp.models.memory_budget import MemoryWithin
from webapp.prompting.build import _memory_section, build_prompt
from webapp.search.indexing import index_memories
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

FACTS = {
    "where did I leave the greenhouse key?": (
        "The spare key to the greenhouse is taped under the blue watering can by the shed."
    ),
    "What was the name of the plumber who fixed the boiler?": (
        "The plumber who fixed the boiler in January is called Teodor Vasquez."
    ),
    "When is Mia's recital?": "Mia's piano recital is on the 14th of June at the town hall.",
}
TOPICS = "roses tulips compost frost pruning seeds birds bees soil shade water wall hedge lawn".split()


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


def _bulk_memories(agent, count: int, *, days: int = 60) -> None:
    """Garden notes over the last `days` days, half core and half journal; a few mention a greenhouse, a key, a
    boiler or a piano, none all of what a question asks. Inserted in one statement."""
    now = utcnow()
    extras = ["the greenhouse roof", "a key ring", "the boiler pressure", "the old piano", "the town hall"]
    rows = []
    for i in range(count):
        words = " ".join(TOPICS[(i + k) % len(TOPICS)] for k in range(6))
        extra = f" near {extras[i % len(extras)]}" if i % 40 == 0 else ""
        content = f"Note {i}: the user talked about {words}{extra}."
        rows.append(
            {"agent_id": agent.id, "content": content, "memory_type": "core" if i % 2 else "journal",
             "constitutional": False, "token_estimate": count_tokens(content), "content_hash": f"h{i}",
             "created_at": now - timedelta(days=days) * (count - i) / count, "updated_at": now}
        )  # fmt: skip
    db.session.execute(sa.insert(AgentMemory), rows)
    db.session.commit()


def _one_connection_app(app):
    """An app on the same database as the web process of `make run` has it on SQLite: one database connection,
    which each request holds until it ends (webapp.config.engine_options, under gevent)."""
    settings = {**app.config, "SQLALCHEMY_ENGINE_OPTIONS": None}
    options = config.engine_options(settings)
    settings["SQLALCHEMY_ENGINE_OPTIONS"] = {**options, "pool_size": 1, "max_overflow": 0, "pool_timeout": 3}
    web = create_app(settings)
    web.extensions["redis"] = app.extensions["redis"]
    web.extensions["rq_queue"] = app.extensions["rq_queue"]
    return web


def test_with_one_database_connection_the_memory_page_embeds_its_query_and_costs_it_after(app, admin, ada):
    key = factories.memory(ada, FACTS["where did I leave the greenhouse key?"], "core")
    index_memories([key.id])  # vectors exist, so the page's search embeds its query
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "where did I leave the greenhouse key?", author=admin)
    db.session.commit()
    web = _one_connection_app(app)
    client = web.test_client()
    conftest.Auth(client).login(admin)

    page = client.get(
        f"/chats/{chat.id}/agents/{ada.id}/memory"
    )  # the ledger row waited 30 s for a connection

    assert page.status_code == 200 and key.content in page.text
    embedded = db.session.scalars(
        sa.select(LlmCall).where(LlmCall.purpose == "embedding", LlmCall.chat_id == chat.id)
    )
    assert [(c.agent_id, c.status) for c in embedded] == [(ada.id, "ok")]
    with web.app_context():
        db.engine.dispose()


def _first_request_for(admin, agent, fake_llm, question: str) -> tuple[dict, ReplySources]:
    """Ask the question in a fresh chat; the first request the model received and the reply's sources."""
    chat = factories.chat(admin.account, [agent])
    factories.message(chat, question, author=admin)
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    fake_llm.reply("Let me think.")
    respond([reply.id])
    db.session.expire_all()
    return fake_llm.requests[-1], db.session.get(ReplySources, reply.id)


def _memory_section_of(prompt_messages: list[dict]) -> str:
    context = prompt_messages[-1]["content"]
    return context[context.index("# Your memory") : context.index("# Now")].strip()


def _listed(section: str) -> list[str]:
    return [line for line in section.splitlines() if line.startswith("- ")]


def test_a_core_memory_added_today_that_answers_the_question_is_in_the_first_request(
    app, fake_llm, admin, ada
):
    _bulk_memories(ada, 10_000)
    facts = {question: factories.memory(ada, fact, "core") for question, fact in FACTS.items()}

    for question, fact in facts.items():
        before = len(fake_llm.requests)
        request, sources = _first_request_for(admin, ada, fake_llm, question)

        assert len(fake_llm.requests) == before + 1  # answered with no tool call
        section = _memory_section_of(request["messages"])
        relevant = section.split("## Relevant to this conversation")[1].split("\n\n")[0]
        assert f"({fact.created_at:%Y-%m-%d}, core memory) {fact.content}" in relevant
        assert fact.id in sources.memory_ids
        assert "did not fit here" in section and "recall tool" in section


def test_a_follow_up_question_finds_what_the_turns_before_it_were_about(app, fake_llm, admin, ada):
    _bulk_memories(ada, 2_000)
    key = factories.memory(ada, FACTS["where did I leave the greenhouse key?"], "journal",
                           created_at=utcnow() - timedelta(days=20))  # fmt: skip
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "I can't find the greenhouse key anywhere.", author=admin)
    factories.message(chat, "Oh no! Have you looked everywhere?", author=ada)
    factories.message(chat, "Yes. Any idea where it could be?", author=admin)

    prompt = build_prompt(chat, ada)

    assert key.content in _memory_section_of(prompt.messages) and key.id in prompt.sources.memory_ids


def test_a_faded_journal_entry_that_matches_is_listed_with_its_date(app, fake_llm, admin, ada):
    _bulk_memories(ada, 2_000)
    faded = factories.memory(
        ada, "Dana lent the hedge trimmer to Mrs Okafor next door.", "journal",
        created_at=utcnow() - timedelta(days=45),
    )  # fmt: skip

    request, sources = _first_request_for(admin, ada, fake_llm, "Who borrowed my hedge trimmer?")

    section = _memory_section_of(request["messages"])
    assert f"- ({faded.created_at:%Y-%m-%d}, journal, faded) {faded.content}" in section
    assert faded.id in sources.memory_ids


def test_constitutional_memories_are_always_in_whatever_the_conversation(app, fake_llm, admin, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 600
    _bulk_memories(ada, 2_000)
    rule = factories.memory(ada, "Never share Dana's address with anyone.", constitutional=True)
    vow = factories.memory(
        ada,
        "I promised Dana to be honest.",
        "journal",
        constitutional=True,
        created_at=utcnow() - timedelta(days=300),
    )  # fmt: skip  (protected in the ledger: it never fades)

    request, sources = _first_request_for(admin, ada, fake_llm, "Tell me about the roses and the tulips.")

    core = _memory_section_of(request["messages"]).split("## Core memories (permanent)\n")[1].split("\n\n")[0]
    assert _listed(core)[:2] == [f"- {vow.content}", f"- {rule.content}"]  # oldest first, before the rest
    assert {rule.id, vow.id} <= set(sources.memory_ids)


def test_relevant_then_recent_within_the_budget_and_the_note_counts_what_was_left_out(
    app, fake_llm, admin, ada
):
    app.config["MEMORY_TOKEN_BUDGET"] = 700
    _bulk_memories(ada, 3_000)
    faded = factories.memory(
        ada, "The hedge by the lawn was cut back hard.", "journal", created_at=utcnow() - timedelta(days=30)
    )

    request, sources = _first_request_for(admin, ada, fake_llm, "Should I cut the hedge by the lawn?")

    section = _memory_section_of(request["messages"])
    assert count_tokens(section) <= 700
    listed = list(db.session.scalars(sa.select(AgentMemory).where(AgentMemory.id.in_(sources.memory_ids))))
    assert len(_listed(section)) == len(listed) == len(set(sources.memory_ids))  # no memory twice
    assert faded in listed
    week = utcnow() - timedelta(days=7)
    core_in = sum(m.memory_type == "core" for m in listed)
    journal_in = sum(m.memory_type == "journal" and m.created_at >= week for m in listed)
    core_total = db.session.scalar(sa.select(sa.func.count()).where(AgentMemory.memory_type == "core"))
    journal_total = db.session.scalar(
        sa.select(sa.func.count()).where(AgentMemory.memory_type == "journal", AgentMemory.created_at >= week)
    )
    assert (
        f"({core_total - core_in} core memories and {journal_total - journal_in} journal entries of this week "
        "did not fit here." in section
    )
    relevant = _listed(section.split("## Relevant to this conversation")[1].split("\n\n")[0])
    assert relevant and all("hedge" in line or "lawn" in line for line in relevant)
    core = _listed(section.split("## Core memories (permanent)\n")[1].split("\n\n")[0])
    assert core  # then core memories and recent entries fill what the relevant ones leave


def test_a_reply_records_exactly_the_memories_its_prompt_held(app, fake_llm, admin, ada):
    app.config["MEMORY_TOKEN_BUDGET"] = 500
    _bulk_memories(ada, 1_000)

    request, sources = _first_request_for(admin, ada, fake_llm, "How are the roses by the wall?")

    section = _memory_section_of(request["messages"])
    contents = db.session.execute(
        sa.select(AgentMemory.id, AgentMemory.content).where(AgentMemory.id.in_(sources.memory_ids))
    ).all()
    held = {content for _, content in contents}
    assert {re.sub(r"^- (\([^)]*\) )?(\d{4}-\d\d-\d\d: )?", "", line) for line in _listed(section)} == held


def test_the_section_trims_what_did_not_fit_and_lists_the_ids_it_kept(app, ada):
    now = utcnow()
    rule = factories.memory(ada, "Never share Dana's address.", constitutional=True)
    relevant = [factories.memory(ada, f"Relevant fact {i} about the hedge.", "journal") for i in range(5)]
    core = [factories.memory(ada, f"Core fact {i} about the roses by the wall.") for i in range(5)]
    journal = [factories.memory(ada, f"Journal note {i} about watering.", "journal") for i in range(5)]
    within = MemoryWithin(
        core=[rule, *core], journal=journal, relevant=relevant, core_total=6, journal_total=10, now=now
    )

    text = _memory_section(for_agent(ada), within, ada, 120)

    assert count_tokens(text) <= 120
    assert within.journal == [] and within.core == [rule]  # recent journal and core gave way first
    assert 0 < len(within.relevant) < 5  # then the weakest matches
    assert all(m.content in text for m in within.relevant + within.core)
    assert not any(
        m.content in text for m in journal + [m for m in core + relevant if m.id not in within.ids]
    )
    assert f"5 core memories and {10 - len(within.relevant)} journal entries" in text


def test_prompt_building_runs_the_same_queries_however_many_memories(app, admin, ada):
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Shall we plant roses by the greenhouse wall?", author=admin)

    def queries_with(total: int) -> int:
        db.session.execute(sa.delete(AgentMemory))
        _bulk_memories(ada, total)
        db.session.expire_all()
        with count_queries() as counted:
            prompt = build_prompt(chat, ada)
        assert prompt.sources.memory_ids
        return counted.count

    assert queries_with(100) == queries_with(5_000)


def test_a_memory_that_means_what_was_asked_is_found_by_its_vector(app, fake_llm, admin, ada):
    _bulk_memories(ada, 300)
    car = factories.memory(
        ada, "The user's car is a red Volvo estate.", "journal", created_at=utcnow() - timedelta(days=20)
    )
    index_memories(list(db.session.scalars(sa.select(AgentMemory.id))))
    db.session.commit()

    request, sources = _first_request_for(
        admin, ada, fake_llm, "What vehicle do I drive?"
    )  # no word in common

    assert car.content in _memory_section_of(request["messages"]) and car.id in sources.memory_ids


def test_the_agents_memory_page_shows_what_its_next_prompt_in_that_chat_holds(
    app, client, auth, admin, member, ada
):
    app.config["MEMORY_TOKEN_BUDGET"] = 400
    _bulk_memories(ada, 500)
    key = factories.memory(ada, FACTS["where did I leave the greenhouse key?"], "journal",
                           created_at=utcnow() - timedelta(days=20))  # fmt: skip
    asking = factories.chat(admin.account, [ada])
    factories.message(asking, "where did I leave the greenhouse key?", author=admin)
    other = factories.chat(admin.account, [ada])
    factories.message(other, "How are the tulips?", author=admin)
    auth.login(admin)

    page = client.get(f"/chats/{asking.id}/agents/{ada.id}/memory").text
    elsewhere = client.get(f"/chats/{other.id}/agents/{ada.id}/memory").text

    held = build_prompt(asking, ada).sources.memory_ids
    assert [int(i) for i in re.findall(r'id="memory-(\d+)"', page)] == held
    relevant = page.split('id="relevant-heading"')[1].split("</section>")[0]
    assert key.content in relevant and "faded" in relevant
    assert key.content not in elsewhere
    ada.members_see_memory = "core"  # members who may see core memories only do not see the journal entry
    db.session.commit()
    client.post("/logout")
    auth.login(member)
    assert key.content not in client.get(f"/chats/{asking.id}/agents/{ada.id}/memory").text
