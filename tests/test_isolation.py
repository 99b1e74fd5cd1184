"""Another account's agents, chats and messages are a 404 on every route, for reading and for writing."""

import pytest

from tests import factories
from webapp.jobs.queue import rq_queue

ROUTES = [
    ("GET", "/agents/{agent}/edit"),
    ("POST", "/agents/{agent}/edit"),
    ("GET", "/chats/{chat}"),
    ("GET", "/chats/{chat}/messages?before=999999"),
    ("GET", "/chats/{chat}/messages/{message}"),
    ("POST", "/chats/{chat}/messages"),
    ("POST", "/chats/{chat}/messages/{message}/retry"),
    ("POST", "/chats/{chat}/trigger"),
    ("POST", "/chats/{chat}/rename"),
    ("POST", "/chats/{chat}/agents"),
    ("POST", "/chats/{chat}/discard"),
    ("POST", "/chats/{chat}/restore"),
    ("GET", "/chats/{chat}/stream?seconds=0"),
    ("POST", "/chats/{chat}/messages/{message}/stop"),
    ("POST", "/chats/{chat}/messages/{message}/regenerate"),
    ("GET", "/chats/{chat}/messages/{message}/edit"),
    ("POST", "/chats/{chat}/messages/{message}/edit"),
    ("GET", "/chats/{chat}/agents/{agent}/memory"),
]


@pytest.fixture
def acme_rows(admin):
    agent = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [agent], "Acme secrets")
    message = factories.message(chat, "secret plans", author=agent, status="failed", error="x")
    return {"agent": agent.id, "chat": chat.id, "message": message.id}


@pytest.mark.parametrize(("method", "route"), ROUTES)
def test_another_accounts_rows_are_not_found(client, auth, stranger, acme_rows, method, route):
    auth.login(stranger)
    data = {"content": "hi", "agent_id": acme_rows["agent"], "title": "pwned", "name": "X", "model_id": "m"}

    response = client.open(route.format(**acme_rows), method=method, data=data if method == "POST" else None)

    assert response.status_code == 404
    assert "secret" not in response.text
    assert rq_queue().count == 0


def test_an_agent_of_another_account_cannot_be_added_to_a_chat(client, auth, admin, stranger):
    auth.login(admin)
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])
    foreign = factories.agent(stranger.account, "Mallory")

    assert client.post(f"/chats/{chat.id}/agents", data={"agent_id": foreign.id}).status_code == 404


def test_lists_show_only_the_accounts_own_rows(client, auth, admin, stranger, acme_rows):
    factories.chat(stranger.account, [factories.agent(stranger.account, "Mallory")], "Globex plans")
    auth.login(admin)

    assert "Globex plans" not in client.get("/chats/").text
    assert "Mallory" not in client.get("/agents/").text
    assert "Mallory" not in client.get("/chats/new").text


def test_unknown_ids_are_not_found(client, auth, admin, acme_rows):
    auth.login(admin)

    assert client.get("/chats/999999").status_code == 404
    assert client.get(f"/chats/{acme_rows['chat']}/messages/999999").status_code == 404
    assert client.post(f"/chats/{acme_rows['chat']}/messages/999999/retry").status_code == 404
    assert client.get("/agents/999999/edit").status_code == 404


def test_out_of_range_numbers_are_a_clear_client_error(client, auth, admin, acme_rows):
    auth.login(admin)
    agent = acme_rows["agent"]

    assert client.get("/chats/99999999999999999999999").status_code == 404
    assert client.get(f"/admin/agents/{agent}/memories?page=99999999999999999999").status_code == 200
    assert client.get("/admin/audit?until=9999-12-31").status_code in (200, 400)
    assert client.get("/admin/audit?agent=%C2%B2").status_code == 200
    assert client.get("/admin/jobs?day=9999-12-31").status_code in (200, 400)
