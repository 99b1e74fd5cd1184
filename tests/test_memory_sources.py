"""Issue 33: every memory knows the messages it came from, and recall brings them back, to whoever may read them."""

# ruff: noqa: F811  (the fixtures of test_memory_audience, imported, are parameters here)
import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.test_memory_audience import ana, ben  # noqa: F401  (fixtures)
from webapp import search
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.reflection import reflect_agent
from webapp.models import AgentMemory, AuditLog, Chat, MemorySource, Message
from webapp.models.access import Audience
from webapp.models.memories import add_sources
from webapp.prompting.build import build_prompt
from webapp.search import indexing
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall
from webapp.tools.refinement import RefinementSession
from webapp.tools.save_memory import save_memory

SECRET = "PLUM-7731"


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada", enabled_tools=["save_memory", "recall"])


def _sources(memory: AgentMemory | int) -> list[int]:
    memory_id = memory if isinstance(memory, int) else memory.id
    return list(
        db.session.scalars(
            sa.select(MemorySource.message_id)
            .where(MemorySource.memory_id == memory_id)
            .order_by(MemorySource.message_id)
        )
    )


def _memory(content: str) -> AgentMemory:
    return db.session.scalar(sa.select(AgentMemory).where(AgentMemory.content == content))


def _memory_with_sources(agent, content: str, sources: list[Message], **fields) -> AgentMemory:
    memory = factories.memory(agent, content, **fields)
    add_sources(memory, [m.id for m in sources])
    db.session.commit()
    return memory


def _context(agent, chat) -> ToolContext:
    reply = factories.message(chat, "", author=agent, status="streaming")
    return ToolContext(agent=agent, chat=chat, message=reply)


def _index(*rows) -> None:
    indexing.index_memories([r.id for r in rows if isinstance(r, AgentMemory)])
    db.session.commit()
    indexing.index_messages([r.id for r in rows if isinstance(r, Message)])
    db.session.commit()


# Consolidation: the turns each memory names, checked against its chunk


def test_consolidation_stores_the_turns_each_memory_names_within_its_chunk(acme, ana, ada, fake_llm):
    chat = factories.chat(acme, [ada], "Garden", people=[ana])
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        turns = [
            factories.message(chat, "I planted roses by the gate.", author=ana),
            factories.message(chat, "Lovely! Which colour?", author=ada),
            factories.message(chat, "Red ones, from my grandmother.", author=ana),
        ]
    fake_llm.reply(
        json.dumps(
            {
                "journal": [
                    {"memory": "Ana planted red roses.", "turns": [1, 3]},
                    {"memory": "Ada asked about colour.", "turns": [2, 9]},  # 9: not a turn of the chunk
                    {"memory": "Ana gardens.", "turns": [0, 12]},  # names no turn of the chunk
                    "Ana likes her garden.",  # names none
                ],
                "core": [],
            }
        )
    )

    consolidate_chat(chat.id)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert "\n1 Ana: I planted roses by the gate.\n" in prompt and "\n3 Ana: Red ones" in prompt
    ids = [t.id for t in turns]
    assert _sources(_memory("Ana planted red roses.")) == [ids[0], ids[2]]
    assert _sources(_memory("Ada asked about colour.")) == [ids[1]]
    assert _sources(_memory("Ana gardens.")) == ids  # the chunk's range
    assert _sources(_memory("Ana likes her garden.")) == ids
    created = db.session.scalar(
        sa.select(AuditLog).where(AuditLog.auditable_id == _memory("Ana planted red roses.").id)
    )
    assert created.data["source_message_ids"] == [ids[0], ids[2]]


# save_memory, reflection, refinement


def test_save_memory_records_the_persons_message_and_the_reply_it_quotes(acme, ana, ada):
    chat = factories.chat(acme, [ada], "Pets", people=[ana])
    factories.message(chat, "Something else first.", author=ana)
    told = factories.message(chat, "My dog is called Biscuit, he is three.", author=ana)
    reply = factories.message(chat, "So your dog Biscuit is three years old!", author=ada, status="streaming")
    context = ToolContext(agent=ada, chat=chat, message=reply)

    quoting = save_memory(context, "Ana's dog Biscuit is three years old.", "journal")
    plain = save_memory(context, "Ana has a dog.", "journal")

    assert _sources(quoting["memory_id"]) == [told.id, reply.id]
    assert _sources(plain["memory_id"]) == [told.id]


def test_reflection_keeps_a_promoted_entrys_sources(acme, ana, ada, fake_llm):
    chat = factories.chat(acme, [ada], "Pets", people=[ana])
    told = factories.message(chat, "I have a cat.", author=ana)
    entry = _memory_with_sources(ada, "Ana has a cat.", [told], memory_type="journal", chat_id=chat.id)
    fake_llm.reply(json.dumps({"promote": [1]}))

    assert reflect_agent(ada.id)["promoted"] == 1

    db.session.expire_all()
    assert db.session.get(AgentMemory, entry.id).memory_type == "core" and _sources(entry) == [told.id]


def test_a_merge_keeps_the_union_of_its_parts_sources_and_a_rewrite_its_own(acme, ana, ada):
    chat = factories.chat(acme, [ada], "Tea", people=[ana])
    said = [
        factories.message(chat, text, author=ana) for text in ("I like tea.", "Green tea.", "Oolong too.")
    ]
    first = _memory_with_sources(ada, "Ana likes tea.", said[:2], chat_id=chat.id)
    second = _memory_with_sources(ada, "Ana likes green tea.", said[1:], chat_id=chat.id)
    third = _memory_with_sources(ada, "Ana drinks oolong.", said[2:], chat_id=chat.id)
    session = RefinementSession(
        agent=ada,
        session_id="s-1",
        start_tokens=1000,
        max_mutations=10,
        floor=0.0,
        page_tokens=4000,
        audience=Audience(chat.id),
    )

    merged = session.run({"action": "consolidate", "ids": f"{first.id},{second.id}", "content": "Ana: tea."})
    session.run({"action": "update", "id": str(third.id), "content": "Ana drinks oolong tea."})

    assert _sources(merged["new_id"]) == [m.id for m in said]
    assert _sources(third) == [said[2].id]


# Recall brings the words


def test_a_recall_hit_on_a_memory_brings_its_source_turns_once(app, acme, ana, ada):
    chat = factories.chat(acme, [ada], "Support", people=[ana])
    factories.message(chat, "Morning!", author=ana)
    said = factories.message(chat, "I went to a support group yesterday, it was moving.", author=ana)
    factories.message(chat, "That sounds powerful.", author=ada)
    memory = _memory_with_sources(ada, "Ana attended an LGBTQ support group.", [said], chat_id=chat.id)
    _index(memory)

    answer = recall(_context(ada, chat), "LGBTQ support group")

    [hit, *others] = answer["results"]
    assert hit["memory_id"] == memory.id and hit["content"] == "Ana attended an LGBTQ support group."
    assert f"{said.created_at:%H:%M}] Ana: {said.content}" in hit["excerpt"]
    assert f"[{said.created_at:%Y-%m-%d}" in hit["excerpt"]
    assert hit["conversation_id"] == chat.public_id
    assert json.dumps(answer).count("it was moving") == 1  # not again in a message hit


def test_a_memorys_match_counts_toward_the_turn_it_came_from(app, acme, ana, ada):
    chat = factories.chat(acme, [ada], "Outings", people=[ana])
    said = factories.message(chat, "We went there on Sunday, the orchids were in bloom.", author=ana)
    filler = [factories.message(chat, f"Filler turn number {n}.", author=ana) for n in range(4)]
    garden = factories.message(chat, "My garden needs rain.", author=ana)  # the query's words, not its answer
    memories = [
        _memory_with_sources(ada, "Ana visited the botanical garden.", [said], chat_id=chat.id),
        _memory_with_sources(ada, "Ana mentioned a garden.", [filler[0]], chat_id=chat.id),
        _memory_with_sources(ada, "Ana likes her garden.", [filler[1]], chat_id=chat.id),
    ]
    _index(*memories, said, garden, *filler)
    chats = sa.select(Chat.id).where(Chat.id == chat.id)
    found = search.memory_hits(ada.id, "botanical garden", 10)
    their_turns = search.drawn_from(found, search.sources([m.id for m in memories], chats))

    by_words = search.messages(chats, "botanical garden", 1)
    with_memories = search.messages(chats, "botanical garden", 1, memories=their_turns)

    assert [e.found for e in by_words] == [[garden.id]]
    assert [e.found for e in with_memories] == [[said.id]]


def test_a_memory_is_shown_with_the_excerpt_that_holds_its_turns_not_beside_it(app, acme, ana, ada):
    chat = factories.chat(acme, [ada], "Outings", people=[ana])
    said = factories.message(chat, "We went to the botanical garden on Sunday.", author=ana)
    memory = _memory_with_sources(ada, "Ana visited the botanical garden.", [said], chat_id=chat.id)
    _index(memory, said)

    [hit] = recall(_context(ada, chat), "botanical garden")["results"]

    assert hit["memory_id"] == memory.id and said.content in hit["excerpt"]


# A source in a private chat reaches no one outside it


@pytest.fixture
def widened(acme, ana, ada):
    """A memory from Ana's private chat, widened by an admin to everyone: its words are heard anywhere, the turn
    it came from only where Ana's chat may be read."""
    anas_chat = factories.chat(acme, [ada], "Ana's", people=[ana])
    told = factories.message(anas_chat, f"My locker code is {SECRET}, at the gym.", author=ana)
    memory = _memory_with_sources(
        ada, "Ana keeps a locker at the gym.", [told], chat_id=anas_chat.id, audience="everyone"
    )
    _index(memory, told)
    return memory


def test_a_source_in_a_private_chat_is_never_recalled_outside_it(acme, ana, ben, ada, widened):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    anas_chat = db.session.get(Chat, widened.chat_id)

    for query in ("locker gym", "locker code"):
        outside = recall(_context(ada, bens_chat), query)
        assert SECRET not in json.dumps(outside)
    [hit] = [h for h in outside["results"] if h.get("memory_id") == widened.id]
    assert "excerpt" not in hit
    inside = recall(_context(ada, anas_chat), "locker gym")
    assert SECRET in next(h for h in inside["results"] if h.get("memory_id") == widened.id)["excerpt"]


def test_a_prompt_shows_the_memory_not_its_source_turns(acme, ana, ben, ada, widened):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    factories.message(bens_chat, "Where is the gym locker?", author=ben)

    sent = json.dumps(build_prompt(bens_chat, ada).messages)

    assert "Ana keeps a locker at the gym." in sent and SECRET not in sent


# People see it: the ledger, the chat's memory page and the audit row link each memory to its turns


def test_the_ledger_links_a_memory_to_the_turns_the_admin_may_read(client, auth, admin, ana, ada):
    own = factories.chat(admin.account, [ada], "Mine", people=[admin])
    said = factories.message(own, "I keep bees on the roof.", author=admin)
    _memory_with_sources(ada, "Dana keeps bees.", [said], chat_id=own.id)
    anas = factories.chat(admin.account, [ada], "Ana's", people=[ana])
    told = factories.message(anas, f"Code {SECRET}.", author=ana)
    _memory_with_sources(ada, "Ana has a code.", [told], chat_id=anas.id)
    auth.login(admin)

    page = client.get(f"/admin/agents/{ada.id}/memories").text

    assert f'href="/chats/{own.id}#message-{said.id}"' in page
    assert f"#message-{told.id}" not in page and SECRET not in page


def test_the_chats_memory_page_links_only_to_turns_its_reader_may_read(
    client, auth, acme, ana, ben, ada, widened
):
    shared = factories.chat(acme, [ada], "Lobby")
    factories.message(shared, "Anyone been to the gym locker room?", author=ben)
    said = factories.message(shared, "Ben: I swim on Mondays.", author=ben)
    _memory_with_sources(ada, "Ben swims on Mondays.", [said], chat_id=shared.id)
    auth.login(ben)

    page = client.get(f"/chats/{shared.id}/agents/{ada.id}/memory").text

    assert "Ana keeps a locker at the gym." in page  # heard by everyone
    assert SECRET not in page and f"#message-{_sources(widened)[0]}" not in page
    assert f'href="/chats/{shared.id}#message-{said.id}"' in page


def test_a_consolidations_audit_row_names_the_turns(client, auth, admin, ada, fake_llm):
    chat = factories.chat(admin.account, [ada], "Garden", people=[admin])
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        said = factories.message(chat, "I planted roses.", author=admin)
        factories.message(chat, "Lovely.", author=ada)
    fake_llm.reply(json.dumps({"journal": [{"memory": "Dana planted roses.", "turns": [1]}], "core": []}))
    consolidate_chat(chat.id)
    auth.login(admin)

    page = client.get("/admin/audit").text

    assert f"Drawn from messages #{said.id}" in page


def test_a_memory_from_a_whole_chunk_shows_a_few_of_its_turns_within_the_budget(app, acme, ana, ada):
    chat = factories.chat(acme, [ada], "Long", people=[ana])
    said = [factories.message(chat, f"Turn {i} about the allotment.", author=ana) for i in range(40)]
    memory = _memory_with_sources(ada, "Ana rents an allotment.", said, chat_id=chat.id)

    [hit, *_] = recall(_context(ada, chat), "allotment rents")["results"]

    assert hit["memory_id"] == memory.id
    assert 1 <= len(hit["excerpt"].splitlines()) <= 4 * 4  # SOURCES_SHOWN, each with the turns around it
