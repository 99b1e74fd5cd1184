"""Error pages (issue 32.1): a chat one may not read, an address that leads nowhere, a page for admins, a change
that cannot be made now and a failure on Cairn's side each answer with a page in the app's layout (the navigation,
a sentence a person understands, a way back) and, to an HTMX request, with a notice. /v1 keeps OpenAI's shape."""

import html

import pytest

from tests import factories
from webapp.extensions import db
from webapp.models import ApiKey
from webapp.web.errors import EXPIRED, NO_CHAT

HTMX = {"HX-Request": "true", "HX-Target": "messages"}


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada")


@pytest.fixture
def sams_chat(acme, ada):
    sam = factories.user(acme, "sam@example.com", "member")
    chat = factories.chat(acme, [ada], "Sam's plans", people=[sam])
    factories.message(chat, "the code is PLUM-7731", author=sam)
    return chat


def _text(response) -> str:
    return html.unescape(response.text)


def _is_a_page(response, heading: str, sentence: str) -> None:
    text = _text(response)
    assert f"<h1>{heading}</h1>" in text and sentence in text
    assert '<main id="main"' in text and 'href="/chats/">Chats</a>' in text  # the layout, with its navigation
    assert 'href="/chats/">Back to your chats</a>' in text


def _is_a_notice(response, sentence: str) -> None:
    assert response.headers["HX-Retarget"] == "#notice"
    assert "<html" not in response.text and "<main" not in response.text
    assert 'id="notice" class="notice shown"' in response.text and sentence in _text(response)


def test_a_chat_one_may_not_read_is_a_page_that_says_why_and_leads_back(client, auth, member, sams_chat):
    auth.login(member)

    page = client.get(f"/chats/{sams_chat.id}")
    fragment = client.get(f"/chats/{sams_chat.id}", headers=HTMX)

    assert page.status_code == fragment.status_code == 404
    _is_a_page(page, "Not found", NO_CHAT)
    _is_a_notice(fragment, NO_CHAT)
    assert "PLUM-7731" not in page.text + fragment.text and "Sam's plans" not in _text(page)


def test_an_address_that_leads_nowhere_is_a_page_too(client, auth, member):
    auth.login(member)

    page = client.get("/nowhere/at/all")

    assert page.status_code == 404
    _is_a_page(page, "Not found", "There is nothing at this address, or it is not yours to see.")
    assert NO_CHAT not in _text(page)


def test_signed_out_the_page_offers_to_sign_in(client):
    page = client.get("/nowhere")

    assert (
        page.status_code == 404
        and 'href="/login">Sign in</a>' in page.text
        and "Back to your" not in page.text
    )


def test_an_admins_page_is_a_403_page_for_a_member(client, auth, member):
    auth.login(member)

    page = client.get("/agents/")
    fragment = client.get("/agents/", headers=HTMX)

    assert page.status_code == fragment.status_code == 403
    _is_a_page(page, "Not yours to do", "This is for an admin of your account; ask one of them.")
    _is_a_notice(fragment, "This is for an admin of your account; ask one of them.")


def test_only_a_chats_people_govern_it_says_the_403(client, auth, member, acme, ada):
    chat = factories.chat(acme, [ada], "Everyone's")  # from before chats had people: only an admin governs it
    auth.login(member)

    refused = client.post(f"/chats/{chat.id}/discard")

    assert refused.status_code == 403
    _is_a_page(refused, "Not yours to do", "Only this chat's people may do this; ask one of them.")


def test_a_409_says_the_views_own_words(client, auth, member, acme, ada):
    chat = factories.chat(acme, [ada], "Ours", people=[member])
    first = factories.message(chat, "first", author=member)
    factories.message(chat, "second", author=member)
    auth.login(member)

    page = client.get(f"/chats/{chat.id}/messages/{first.id}/edit")
    fragment = client.get(f"/chats/{chat.id}/messages/{first.id}/edit", headers=HTMX)

    assert page.status_code == fragment.status_code == 409
    _is_a_page(page, "Not now", "Only your own last message can be edited.")
    _is_a_notice(fragment, "Only your own last message can be edited.")


def test_a_failure_on_cairns_side_is_a_500_page_and_the_transaction_is_rolled_back(
    app, client, auth, admin, monkeypatch
):
    def broken():
        db.session.execute(db.text("SELECT * FROM no_such_table"))

    app.config["PROPAGATE_EXCEPTIONS"] = False  # as in production: the handler answers, not the test client
    monkeypatch.setitem(app.view_functions, "chats.new", broken)
    auth.login(admin)  # the layout asks the database for the admin's review count

    page = client.get("/chats/new")
    fragment = client.get("/chats/new", headers=HTMX)

    assert page.status_code == fragment.status_code == 500
    _is_a_page(page, "Something went wrong", "Something failed on Cairn's side, not yours")
    _is_a_notice(fragment, "Try again in a moment")


def test_an_expired_form_says_to_reload(app, client, auth, member):
    auth.login(member)
    app.config["WTF_CSRF_ENABLED"] = True

    refused = client.post("/account/name", data={"name": "Milo"})

    assert refused.status_code == 400
    _is_a_page(refused, "Something in the request was wrong", EXPIRED)


def test_a_history_restore_gets_the_page_not_a_notice(client, auth, member, sams_chat):
    auth.login(member)

    restored = client.get(
        f"/chats/{sams_chat.id}", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )

    assert restored.status_code == 404 and "HX-Retarget" not in restored.headers
    _is_a_page(restored, "Not found", NO_CHAT)


def test_the_api_keeps_openais_shape(app, client, admin, monkeypatch):
    app.config["PROPAGATE_EXCEPTIONS"] = False
    _key, secret = ApiKey.issue(admin, "script")
    db.session.commit()

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setitem(app.view_functions, "api.models", broken)
    missing = client.get("/v1/nothing")
    wrong_method = client.delete("/v1/models")
    failed = client.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})

    assert (missing.status_code, missing.json["error"]["code"]) == (404, "not_found")
    assert (wrong_method.status_code, wrong_method.json["error"]["code"]) == (405, "method_not_allowed")
    assert (failed.status_code, failed.json["error"]["type"]) == (500, "server_error")
