"""Issue 44: reflection asks one request per page of journal entries, whatever their audiences. It only picks entries
by number and a promoted entry keeps its own audience, so no entry's words reach another audience through it; the
core memories listed beside the entries are only those every entry's audience hears (or none)."""

import json

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.reflection import reflect_agent
from webapp.models import AgentMemory

ANAS_SECRET, BENS_SECRET = "PLUM-7731", "FIG-4242"


@pytest.fixture
def people(acme):
    return [factories.user(acme, f"{name}@example.com", "member") for name in ("ana", "ben")]


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada")


@pytest.fixture
def chats(acme, ada, people):
    return [factories.chat(acme, [ada], f"{person.email}'s", people=[person]) for person in people]


@pytest.fixture
def cores(ada, chats):
    """A core memory heard by everyone, one heard only in Ana's chat and one only in Ben's."""
    return [
        factories.memory(ada, "Tea is served at four."),
        factories.memory(ada, f"Ana's locker code is {ANAS_SECRET}.", chat_id=chats[0].id),
        factories.memory(ada, f"Ben's bike lock is {BENS_SECRET}.", chat_id=chats[1].id),
    ]


def _prompts(fake_llm) -> list[str]:
    return [request["messages"][0]["content"] for request in fake_llm.requests]


def _state(memory: AgentMemory) -> tuple[str, int | None, str]:
    db.session.refresh(memory)
    return memory.memory_type, memory.chat_id, memory.audience


def test_entries_of_every_audience_share_one_request_and_each_promotion_keeps_its_audience(
    ada, chats, fake_llm
):
    anas = factories.memory(ada, "Ana is moving lockers next week.", "journal", chat_id=chats[0].id)
    bens = factories.memory(ada, "Ben rides to work in the rain.", "journal", chat_id=chats[1].id)
    everyones = factories.memory(ada, "The tea room moves upstairs.", "journal")
    fake_llm.reply(json.dumps({"promote": [1, 2, 3]}))

    assert reflect_agent(ada.id) == {"entries": 3, "promoted": 3, "ignored": 0}

    [prompt] = _prompts(fake_llm)
    assert "1. Ana is moving lockers" in prompt and "2. Ben rides" in prompt and "3. The tea room" in prompt
    assert _state(anas) == ("core", chats[0].id, "chat")  # a private entry promoted stays private
    assert _state(bens) == ("core", chats[1].id, "chat")
    assert _state(everyones) == ("core", None, "everyone")
    heard_by_everyone = db.session.scalars(
        sa.select(AgentMemory.content).where(AgentMemory.audience == "everyone")
    ).all()
    assert heard_by_everyone == ["The tea room moves upstairs."]


def test_beside_entries_of_several_audiences_only_what_everyone_hears_is_listed(ada, chats, cores, fake_llm):
    factories.memory(ada, "Ana is moving lockers next week.", "journal", chat_id=chats[0].id)
    factories.memory(ada, "Ben rides to work in the rain.", "journal", chat_id=chats[1].id)
    fake_llm.reply(json.dumps({"promote": []}))

    reflect_agent(ada.id)

    [prompt] = _prompts(fake_llm)
    assert "- Tea is served at four." in prompt
    assert ANAS_SECRET not in prompt and BENS_SECRET not in prompt


def test_beside_one_audiences_entries_its_own_core_memories_are_listed_and_no_other(
    ada, chats, cores, fake_llm
):
    factories.memory(ada, "Ana is moving lockers next week.", "journal", chat_id=chats[0].id)
    fake_llm.reply(json.dumps({"promote": []}))

    reflect_agent(ada.id)

    [prompt] = _prompts(fake_llm)
    assert "- Tea is served at four." in prompt and ANAS_SECRET in prompt
    assert BENS_SECRET not in prompt


def test_with_no_core_memory_every_audience_hears_none_is_listed(ada, chats, fake_llm):
    factories.memory(ada, f"Ana's locker code is {ANAS_SECRET}.", chat_id=chats[0].id)
    factories.memory(ada, "Ben rides to work in the rain.", "journal", chat_id=chats[1].id)
    factories.memory(ada, "The tea room moves upstairs.", "journal")
    fake_llm.reply(json.dumps({"promote": []}))

    reflect_agent(ada.id)

    [prompt] = _prompts(fake_llm)
    assert ANAS_SECRET not in prompt and "core memories" not in prompt


def test_one_request_per_page_whatever_the_audiences(app, ada, chats, fake_llm):
    app.config["MEMORY_TOKEN_BUDGET"] = 200
    for i in range(30):
        factories.memory(
            ada, f"Entry {i} about the roses and the weather that day.", "journal", chat_id=chats[i % 2].id
        )
    fake_llm.default_text = json.dumps({"promote": []})

    reflect_agent(ada.id)

    prompts = _prompts(fake_llm)
    assert 1 < len(prompts) <= 4  # 30 entries of about 20 tokens in pages of 200: 4 pages at most
    listed = [i for i in range(30) if any(f"Entry {i} about" in p for p in prompts)]
    assert listed == list(range(30))
