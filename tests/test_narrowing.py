"""Issue 42.5: a chat narrowed narrows what was drawn from it. Taken out of a private chat, a person no longer hears
its memories in their other chats (prompt, recall and so MCP and /v1, which search as recall does), and hears
them again once added back; a memory drawn from it but heard by everyone takes the chat as its audience, audited;
a shared chat made private does the same."""

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.actions.memory import search_memory
from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog
from webapp.models.memories import add_sources
from webapp.prompting.build import build_prompt
from webapp.tools.base import ToolContext
from webapp.tools.borrow_context import borrow_context


@pytest.fixture
def garden(acme, member):
    """Ana and Ben (Milo) plan a garden with Ada in a private chat; Ben also talks to Ada alone."""
    ben = member
    ana = factories.user(acme, "ana@example.com", "member")
    ada = factories.agent(acme, "Ada", enabled_tools=["recall"])
    plans = factories.chat(acme, [ada], "Garden plans", people=[ana, ben])
    alone = factories.chat(acme, [ada], "Ben and Ada", people=[ben])
    said = factories.message(plans, "We keep the spare key under the blue pot.", author=ana)
    factories.message(alone, "What do you know about my garden?", author=ben)
    heard_there = factories.memory(
        ada, "The spare key is under the blue pot.", audience="chat", chat_id=plans.id
    )
    widened = factories.memory(ada, "Ana's gate code is 4471.")  # an admin widened it to everyone
    add_sources(heard_there, [said.id])
    add_sources(widened, [said.id])
    db.session.commit()
    return {
        "ana": ana,
        "ben": ben,
        "ada": ada,
        "plans": plans,
        "alone": alone,
        "memories": (heard_there, widened),
    }


def _heard_by_ben(garden) -> set[str]:
    """The garden memories that reach Ada's prompt in Ben's own chat, or his recall (MCP and /v1 search alike)."""
    db.session.expire_all()
    ada, ben = garden["ada"], garden["ben"]
    prompt = " ".join(
        m["content"] for m in build_prompt(garden["alone"], ada).messages if m["role"] == "system"
    )
    found = {hit.get("content") for hit in search_memory(ben, ada, "spare key blue pot gate code")["results"]}
    texts = {m.content for m in garden["memories"]}
    return {text for text in texts if text in prompt} | (texts & found)


def test_taken_out_of_a_chat_a_person_stops_hearing_what_was_drawn_from_it_and_hears_it_again_once_back(
    client, auth, garden
):
    ana, ben, plans = garden["ana"], garden["ben"], garden["plans"]
    everything = {m.content for m in garden["memories"]}
    assert _heard_by_ben(garden) == everything
    auth.login(ana)

    client.post(f"/chats/{plans.id}/people/{ben.id}/remove")
    while_out = _heard_by_ben(garden)
    client.post(f"/chats/{plans.id}/people", data={"user_id": ben.id})
    back = _heard_by_ben(garden)

    assert while_out == set()
    assert back == everything
    widened = db.session.get(AgentMemory, garden["memories"][1].id)
    assert (widened.audience, widened.chat_id) == ("chat", plans.id)
    [row] = db.session.scalars(sa.select(AuditLog).where(AuditLog.action == "memory_audience")).all()
    assert row.auditable_id == widened.id and row.user_id == ana.id and row.data["via"] == "narrowing"


def test_a_shared_chat_made_private_gives_what_was_drawn_from_it_its_people_only(client, auth, acme, member):
    ana = factories.user(acme, "ana@example.com", "member")
    ada = factories.agent(acme, "Ada")
    club = factories.chat(acme, [ada], "Club", people=[ana])
    club.visibility = "shared"
    said = factories.message(club, "The club's safe opens with 1234.", author=ana)
    everyone = factories.memory(ada, "The club's safe opens with 1234.")
    add_sources(everyone, [said.id])
    db.session.commit()
    auth.login(ana)

    client.post(f"/chats/{club.id}/visibility", data={"visibility": "private"})

    db.session.expire_all()
    memory = db.session.get(AgentMemory, everyone.id)
    assert (memory.audience, memory.chat_id) == ("chat", club.id)
    assert "1234" not in str(search_memory(member, ada, "club safe")["results"])


def test_a_memory_drawn_from_elsewhere_keeps_its_audience(client, auth, garden):
    ana, ben, plans, ada = garden["ana"], garden["ben"], garden["plans"], garden["ada"]
    other = factories.chat(ben.account, [ada], "Elsewhere", people=[ana])
    said = factories.message(other, "Ana likes figs.", author=ana)
    figs = factories.memory(ada, "Ana likes figs.")
    add_sources(figs, [said.id])
    db.session.commit()
    auth.login(ana)

    client.post(f"/chats/{plans.id}/people/{ben.id}/remove")

    db.session.expire_all()
    assert db.session.get(AgentMemory, figs.id).audience == "everyone"


def test_summaries_and_borrow_follow_the_narrowing_too(client, auth, garden):
    """Ada's summary of the plans chat is listed in Ben's own chat, and borrow_context reads it, while Ben is one
    of its people; taken out, neither; back in, both."""
    ana, ben, plans, alone, ada = (garden[k] for k in ("ana", "ben", "plans", "alone", "ada"))
    factories.summary(plans, ada, "Ana and Ben hide the spare key under the blue pot.")
    context = ToolContext(ada, alone, factories.message(alone, "Borrow the plans?", author=ben))

    def heard() -> tuple[bool, bool]:
        db.session.expire_all()
        prompt = " ".join(m["content"] for m in build_prompt(alone, ada).messages if m["role"] == "system")
        borrowed = borrow_context(context, plans.public_id)
        return "hide the spare key" in prompt, "error" not in borrowed

    auth.login(ana)
    before = heard()
    client.post(f"/chats/{plans.id}/people/{ben.id}/remove")
    while_out = heard()
    client.post(f"/chats/{plans.id}/people", data={"user_id": ben.id})

    assert before == (True, True) and while_out == (False, False) and heard() == (True, True)
