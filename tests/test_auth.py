"""Signing in and out, CSRF, and who may see what."""

import pytest

from tests import factories


def test_pages_need_a_signed_in_user(client):
    response = client.get("/chats/")

    assert response.status_code == 302
    assert "/login?next=%2Fchats%2F" in response.headers["Location"]


def test_sign_in_then_out(client, admin):
    response = client.post(
        "/login?next=/agents/", data={"email": "DANA@example.com", "password": factories.PASSWORD}
    )
    assert (response.status_code, response.headers["Location"]) == (303, "/agents/")
    assert client.get("/chats/").status_code == 200

    assert client.post("/logout").status_code == 303
    assert client.get("/chats/").status_code == 302


def test_a_wrong_password_is_refused_with_a_clear_message(client, admin):
    response = client.post("/login", data={"email": admin.email, "password": "wrong"})

    assert response.status_code == 422
    assert "That email and password do not match." in response.text
    assert client.get("/chats/").status_code == 302


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "javascript:alert(1)"])
def test_sign_in_never_redirects_off_site(client, admin, target):
    response = client.post(
        f"/login?next={target}", data={"email": admin.email, "password": factories.PASSWORD}
    )

    assert response.headers["Location"] == "/chats/"


def test_members_chat_but_cannot_manage_agents(client, auth, member):
    auth.login(member)

    assert client.get("/chats/").status_code == 200
    assert client.get("/agents/").status_code == 403
    assert (
        client.post("/agents/new", data={"name": "X", "model_id": "m", "core_token_budget": 5000}).status_code
        == 403
    )


def test_forms_and_htmx_requests_need_the_csrf_token(app, client):
    app.config["WTF_CSRF_ENABLED"] = True  # the other tests switch it off
    user = factories.user(factories.account())
    assert (
        client.post("/login", data={"email": user.email, "password": factories.PASSWORD}).status_code == 400
    )

    token = client.get("/login").text.split('name="csrf_token" type="hidden" value="')[1].split('"')[0]
    signed_in = client.post(
        "/login", data={"email": user.email, "password": factories.PASSWORD, "csrf_token": token}
    )
    assert signed_in.status_code == 303

    chat = factories.chat(user.account, [factories.agent(user.account)])
    assert client.post(f"/chats/{chat.id}/rename", data={"title": "x"}).status_code == 400
    header_token = client.get(f"/chats/{chat.id}").text.split('"X-CSRFToken": "')[1].split('"')[0]
    renamed = client.post(
        f"/chats/{chat.id}/rename", data={"title": "x"}, headers={"X-CSRFToken": header_token}
    )
    assert renamed.status_code == 200


def test_sign_in_never_redirects_off_site_by_backslash(client, admin):
    response = client.post(
        "/login?next=/\\evil.example", data={"email": admin.email, "password": factories.PASSWORD}
    )

    assert response.headers["Location"] == "/chats/"
