"""Issue 32.3: a person forgets what an agent remembers from their own chats, on the chat's memory page. A member
forgets a memory that came from a chat they are one of the people of (an admin any); it is a soft delete audited as that
person, shown in the ledger, undone by an admin; the agent is not told. Any other memory is not found."""

# ruff: noqa: F811  (the fixtures of test_memory_audience, imported, are parameters here)
import json
import re

import pytest
import sqlalchemy as sa

from tests import factories
from tests.test_memory_audience import (  # noqa: F401  (fixtures)
    SECRET,
    _ask,
    _memory_section,
    ada,
    ana,
    anas_chat,
    ben,
)
from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog

HTMX = {"HX-Request": "true"}


def _url(chat, agent, memory=None) -> str:
    page = f"/chats/{chat.id}/agents/{agent.id}/memory"
    return f"{page}/{memory.id}/forget" if memory else page


def _locker(agent) -> AgentMemory:
    return db.session.scalar(
        sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id, AgentMemory.content.contains(SECRET))
    )


def _unchanged(memory: AgentMemory) -> bool:
    db.session.expire_all()
    found = db.session.get(AgentMemory, memory.id)
    deletes = db.session.scalar(sa.select(sa.func.count()).where(AuditLog.action == "memory_delete"))
    return found.deleted_at is None and deletes == 0


def test_a_member_forgets_a_memory_from_her_chat_and_an_admins_undo_brings_it_back(
    acme, client, auth, admin, ana, ada, anas_chat, fake_llm
):
    locker = _locker(ada)
    assert SECRET in _memory_section(_ask(fake_llm, anas_chat, ana, ada, "What is my code?"))
    auth.login(ana)
    page = " ".join(client.get(_url(anas_chat, ada)).text.split())
    assert f'action="{_url(anas_chat, ada, locker)}"' in page and "You can forget what Ada remembers" in page

    forgotten = client.post(_url(anas_chat, ada, locker), headers=HTMX)

    assert forgotten.status_code == 200
    assert (
        "Forgotten. Ada no longer brings it to its replies; only an admin can bring it back."
        in forgotten.text
    )
    after = _ask(fake_llm, anas_chat, ana, ada, "And now?")
    assert SECRET not in _memory_section(after)
    assert "forgot" not in json.dumps(after).lower()  # the agent is not told
    assert SECRET not in client.get(_url(anas_chat, ada)).text
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_delete"))
    assert (row.user_id, row.data["via"], row.auditable_id) == (ana.id, "chat", locker.id)

    client.post("/logout")
    auth.login(admin)
    ledger = client.get(f"/admin/agents/{ada.id}/memories?show=deleted").text
    assert "Forgotten by Ana (ana@example.com) on the memory page of its chat." in ledger
    audit = client.get(f"/admin/audit?agent={ada.id}").text
    entry = re.search(rf'<tr id="audit-{row.id}".*?</tr>', audit, re.S).group(0)
    assert "ana@example.com" in entry and "forgotten on its chat&#39;s memory page" in entry

    assert client.post(f"/admin/audit/{row.id}/undo", headers=HTMX).status_code == 200
    assert SECRET in _memory_section(_ask(fake_llm, anas_chat, ana, ada, "Back?"))


def test_a_plain_form_post_goes_back_to_the_memory_page(client, auth, ana, ada, anas_chat):
    auth.login(ana)

    response = client.post(_url(anas_chat, ada, _locker(ada)))

    assert response.status_code == 303 and response.location.endswith(_url(anas_chat, ada))
    assert "Forgotten: Ada no longer brings" in client.get(_url(anas_chat, ada)).text


def test_a_member_cannot_forget_a_memory_from_a_chat_she_is_not_in(
    acme, client, auth, ana, ben, ada, anas_chat
):
    locker = _locker(ada)
    both = factories.chat(acme, [ada], "Ana and Ben", people=[ana, ben])
    bens = factories.chat(acme, [ada], "Ben's", people=[ben])
    auth.login(ben)

    assert client.post(_url(anas_chat, ada, locker), headers=HTMX).status_code == 404  # her chat
    assert client.post(_url(bens, ada, locker), headers=HTMX).status_code == 404  # not heard in his
    assert client.post(_url(both, ada, locker), headers=HTMX).status_code == 404  # nor in theirs
    assert _unchanged(locker)
    client.post("/logout")
    auth.login(ana)
    assert client.post(_url(anas_chat, ada, locker), headers=HTMX).status_code == 200  # she may


def test_a_member_cannot_forget_what_everyone_hears_an_admin_can(
    acme, client, auth, admin, ana, ada, anas_chat
):
    rule = factories.memory(ada, "Everyone's rule: answer in English.")
    auth.login(ana)

    assert "Everyone&#39;s rule" in client.get(_url(anas_chat, ada)).text
    assert f'action="{_url(anas_chat, ada, rule)}"' not in client.get(_url(anas_chat, ada)).text
    assert client.post(_url(anas_chat, ada, rule), headers=HTMX).status_code == 404
    assert _unchanged(rule)
    client.post("/logout")
    shared = factories.chat(acme, [ada], "Everyone's chat")
    auth.login(admin)
    assert client.post(_url(shared, ada, rule), headers=HTMX).status_code == 200
    assert db.session.get(AgentMemory, rule.id).deleted_at is not None


def test_a_constitutional_memory_cannot_be_forgotten_and_the_page_says_so(client, auth, ana, ada, anas_chat):
    vow = factories.memory(ada, "Ana's vow: never share the code.", constitutional=True, chat_id=anas_chat.id)
    auth.login(ana)

    page = " ".join(client.get(_url(anas_chat, ada)).text.split())
    refused = client.post(_url(anas_chat, ada, vow), headers=HTMX)

    assert "Ada keeps it: a constitutional memory cannot be forgotten" in page
    assert refused.status_code == 422 and "it cannot be forgotten" in refused.text
    assert _unchanged(vow)


def test_a_member_forgets_only_what_the_admin_lets_her_see(client, auth, ana, ada, anas_chat):
    note = factories.memory(ada, "Ana's journal: flew to Oslo.", "journal", chat_id=anas_chat.id)
    ada.members_see_memory = "core"
    db.session.commit()
    auth.login(ana)

    assert client.post(_url(anas_chat, ada, note), headers=HTMX).status_code == 404
    assert _unchanged(note)
    ada.members_see_memory = "prompt"
    db.session.commit()
    assert client.post(_url(anas_chat, ada, note), headers=HTMX).status_code == 200


@pytest.mark.parametrize("with_token", [False, True])
def test_forgetting_needs_the_csrf_token(app, client, auth, ana, ada, anas_chat, with_token):
    auth.login(ana)
    app.config["WTF_CSRF_ENABLED"] = True  # the other tests switch it off
    page = client.get(_url(anas_chat, ada)).text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)

    response = client.post(
        _url(anas_chat, ada, _locker(ada)), data={"csrf_token": token} if with_token else {}
    )

    assert response.status_code == (303 if with_token else 400)
    assert (db.session.get(AgentMemory, _locker(ada).id).deleted_at is not None) is with_token


def test_a_member_cannot_forget_a_memory_from_a_shared_chat_she_only_reads(acme, client, auth, ana, ben, ada):
    """A shared chat is read by everyone of the account; what came from it is forgotten by its people only."""
    bens_shared = factories.chat(acme, [ada], "Ben's open chat", people=[ben])
    bens_shared.visibility = "shared"
    db.session.commit()
    fact = factories.memory(ada, "Ben's bike is blue.", chat_id=bens_shared.id, audience="chat")
    auth.login(ana)

    assert client.post(_url(bens_shared, ada, fact), headers=HTMX).status_code == 404
    assert _unchanged(fact)
    client.post("/logout")
    auth.login(ben)
    assert client.post(_url(bens_shared, ada, fact), headers=HTMX).status_code == 200
