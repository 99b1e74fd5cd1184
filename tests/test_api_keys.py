"""API keys (issue 22.1): each person makes, sees and revokes their own on the account page (/account, where
/account/password now leads); `flask api-keys` does the same for scripts; a key acts as its person through
`Authorization: Bearer`, and its last use is written at most once a minute."""

import html
import json
import re
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
import yaml

from tests import factories
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.models import ApiKey
from webapp.models.api_keys import bearer_secret, key_for_bearer, person_for_bearer
from webapp.timeutil import utcnow


def _make(client, name: str = "Open WebUI"):
    return client.post("/account/keys", data={"key_name": name})


def _secret(page: str) -> str:
    return re.search(
        r'<textarea id="new-key-secret" rows="2" readonly[^>]*>(cairn_[^<]+)</textarea>', page
    ).group(1)


def test_the_account_page_holds_name_password_and_keys_and_the_old_url_leads_there(client, auth, member):
    auth.login(member)

    page = client.get("/account")
    old = client.get("/account/password")

    assert page.status_code == 200
    for field in ('name="name"', 'name="current_password"', 'name="key_name"'):
        assert field in page.text
    assert "You have no keys." in page.text and "http://localhost/v1" in page.text
    assert (old.status_code, old.headers["Location"]) == (301, "/account")
    assert 'href="/account"' in client.get("/chats/").text


def test_a_new_key_is_shown_once_then_listed_by_its_first_characters(client, auth, member):
    auth.login(member)

    made = _make(client)
    secret = _secret(made.text)
    later = client.get("/account").text

    assert made.status_code == 200 and made.headers["Cache-Control"] == "no-store"
    assert "Copy it now" in made.text and 'data-copy="#new-key-secret"' in made.text
    key = db.session.scalar(sa.select(ApiKey))
    assert (key.user_id, key.name, key.shown) == (member.id, "Open WebUI", secret[:12])
    assert secret not in later and secret not in key.key_hash  # stored as its SHA-256 only
    assert f"<code>{key.shown}…</code>" in later and "Open WebUI" in later and "never used" in later
    assert ApiKey.find(secret) == key


def _config(page: str, name: str) -> str:
    """The text of one ready-made config of the account page, as its Copy button copies it."""
    return html.unescape(
        re.search(rf'<pre id="config-{name}" tabindex="0"><code>(.*?)</code></pre>', page, re.S).group(1)
    )


def test_the_account_page_gives_the_addresses_and_ready_configs_at_the_requests_host(client, auth, member):
    factories.agent(member.account, "Ada Lovelace")
    factories.agent(member.account, "Basil")
    auth.login(member)

    page = client.get("/account", base_url="https://cairn.example.com").text

    assert 'id="api-base" type="text" readonly value="https://cairn.example.com/v1"' in page
    assert 'value="https://cairn.example.com/mcp/ada-lovelace"' in page and 'data-copy="#mcp-basil"' in page
    openai = _config(page, "openai")
    compile(openai, "config", "exec")
    assert (
        'base_url="https://cairn.example.com/v1", api_key="cairn_..."' in openai
        and 'model="ada-lovelace"' in openai
    )
    assert _config(page, "open-webui").splitlines() == [
        "OPENAI_API_BASE_URL=https://cairn.example.com/v1",
        "OPENAI_API_KEY=cairn_...",
    ]
    (librechat,) = yaml.safe_load(_config(page, "librechat"))["endpoints"]["custom"]
    assert librechat["baseURL"] == "https://cairn.example.com/v1" and librechat["apiKey"] == "cairn_..."
    assert librechat["models"]["default"] == ["ada-lovelace", "basil"] and librechat["dropParams"] == ["user"]
    assert yaml.safe_load(_config(page, "llm")) == [
        {
            "model_id": f"cairn-{slug}",
            "model_name": slug,
            "api_base": "https://cairn.example.com/v1",
            "api_key_name": "cairn",
        }
        for slug in ("ada-lovelace", "basil")
    ]
    assert json.loads(_config(page, "mcp")) == {
        "mcpServers": {
            "cairn-ada-lovelace": {
                "type": "http",
                "url": "https://cairn.example.com/mcp/ada-lovelace",
                "headers": {"Authorization": "Bearer cairn_..."},
            }
        }
    }
    for name in ("openai", "open-webui", "librechat", "llm", "mcp"):
        assert f'data-copy="#config-{name}"' in page


def test_the_configs_hold_a_new_key_while_it_is_shown(client, auth, member):
    factories.agent(member.account, "Ada")
    auth.login(member)

    made = _make(client)

    secret = _secret(made.text)
    assert f'api_key="{secret}"' in _config(made.text, "openai")
    assert f'"Bearer {secret}"' in _config(made.text, "mcp")
    assert secret not in client.get("/account").text


def test_a_key_needs_a_name_of_at_most_80_characters(client, auth, member):
    auth.login(member)

    unnamed = _make(client, "  ")
    too_long = _make(client, "x" * 81)

    assert (unnamed.status_code, too_long.status_code) == (422, 422)
    assert "Name the key after the app or script" in unnamed.text
    assert "new-key-secret" not in unnamed.text + too_long.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(ApiKey)) == 0


def test_the_list_shows_when_a_key_was_last_used(client, auth, member):
    auth.login(member)
    secret = _secret(_make(client).text)

    assert person_for_bearer(f"Bearer {secret}").id == member.id

    assert "never used" not in client.get("/account").text
    assert "last used" in client.get("/account").text


def test_revoke_asks_first_on_a_page_of_its_own(client, auth, member):
    auth.login(member)
    secret = _secret(_make(client).text)
    key = db.session.scalar(sa.select(ApiKey))

    account = client.get("/account").text
    asked = client.get(f"/account/keys/{key.id}/revoke")

    link = (
        f'<a class="button danger" href="/account/keys/{key.id}/revoke">Revoke<span class="visually-hidden">'
    )
    assert link in account  # a link to the question, not a button that revokes at once
    assert asked.status_code == 200 and "<h1>Revoke the key “Open WebUI”?</h1>" in asked.text
    assert "Every app using it is refused from its next request on." in asked.text
    assert '<a class="button" href="/account#api-keys">Keep it</a>' in asked.text
    assert person_for_bearer(f"Bearer {secret}") is not None  # asking changed nothing


def test_revoking_a_key_refuses_it_at_once(client, auth, member):
    auth.login(member)
    secret = _secret(_make(client).text)
    key = db.session.scalar(sa.select(ApiKey))

    revoked = client.post(f"/account/keys/{key.id}/revoke")

    assert (revoked.status_code, revoked.headers["Location"]) == (303, "/account#api-keys")
    page = client.get("/account").text
    assert "Revoked the key “Open WebUI”" in page and f"key-{key.id}" not in page
    assert person_for_bearer(f"Bearer {secret}") is None
    assert client.post(f"/account/keys/{key.id}/revoke").status_code == 404  # once


def test_another_persons_key_is_not_found_and_stays_live(app, client, auth, admin, member, stranger):
    mine = ApiKey.issue(member, "Milo's script")[0]
    theirs, secret = ApiKey.issue(stranger, "Eve's script")
    db.session.commit()
    auth.login(admin)  # an admin of the same account, too, only sees and revokes their own keys

    page = client.get("/account").text
    answers = [client.post(f"/account/keys/{key.id}/revoke").status_code for key in (mine, theirs)]

    assert "Milo&#39;s script" not in page and "Eve&#39;s script" not in page
    assert answers == [404, 404]
    assert client.post("/account/keys/99999999999/revoke").status_code == 404
    assert person_for_bearer(f"Bearer {secret}") == stranger


def test_making_and_revoking_keys_need_the_csrf_token(app, client, auth, member):
    auth.login(member)
    key, _ = ApiKey.issue(member, "Old")
    db.session.commit()
    app.config["WTF_CSRF_ENABLED"] = True  # the other tests switch it off
    page = client.get("/account").text
    token = re.search(r'id="key-csrf_token" name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)

    refused = [
        client.post("/account/keys", data={"key_name": "New"}),
        client.post(f"/account/keys/{key.id}/revoke"),
    ]
    made = client.post("/account/keys", data={"key_name": "New", "csrf_token": token})
    revoked = client.post(f"/account/keys/{key.id}/revoke", data={"csrf_token": token})

    assert [r.status_code for r in refused] == [400, 400]
    assert (made.status_code, revoked.status_code) == (200, 303)


def test_the_pages_need_a_sign_in(client, member):
    key, _ = ApiKey.issue(member, "Script")
    db.session.commit()

    for response in (client.get("/account"), client.post("/account/keys", data={"key_name": "x"})):
        assert response.status_code == 302 and "/login" in response.headers["Location"]
    assert client.post(f"/account/keys/{key.id}/revoke").status_code == 302
    assert not key.is_revoked


# The bearer check that /v1 and /mcp share


def test_a_bearer_header_resolves_to_its_live_keys_person(member):
    key, secret = ApiKey.issue(member, "Script")
    db.session.commit()

    assert person_for_bearer(f"Bearer {secret}") == member
    assert person_for_bearer(f"bearer   {secret}  ") == member
    for header in (
        None,
        "",
        secret,
        f"Basic {secret}",
        "Bearer ",
        f"Bearer {secret}x",
        "Bearer cairn_" + "x" * 300,
    ):
        assert person_for_bearer(header) is None, header
    assert bearer_secret("Bearer a b") == "a b"


def test_a_removed_persons_keys_are_refused(admin, member):
    _, secret = ApiKey.issue(member, "Script")
    db.session.commit()

    member.remove(by=admin)
    db.session.commit()

    assert person_for_bearer(f"Bearer {secret}") is None


def test_the_last_use_is_written_at_most_once_a_minute(member):
    key, secret = ApiKey.issue(member, "Script")
    db.session.commit()
    start = utcnow()

    with time_machine.travel(start, tick=False):
        key_for_bearer(f"Bearer {secret}")
        first = db.session.get(ApiKey, key.id).last_used_at
    with time_machine.travel(start + timedelta(seconds=50), tick=False):
        key_for_bearer(f"Bearer {secret}")
        unchanged = db.session.get(ApiKey, key.id).last_used_at
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        key_for_bearer(f"Bearer {secret}")
        later = db.session.get(ApiKey, key.id).last_used_at

    assert first == unchanged == start
    assert later == start + timedelta(seconds=61)


# flask api-keys


def test_the_cli_makes_lists_and_revokes_keys(runner, member):
    made = runner.invoke(args=["api-keys", "create", "--user", "MILO@example.com", "--name", "Backup script"])

    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert (
        secret.startswith("cairn_") and "\n" not in secret
    )  # the key alone on stdout: KEY=$(flask api-keys …)
    assert person_for_bearer(f"Bearer {secret}") == member
    key = db.session.scalar(sa.select(ApiKey))
    listed = runner.invoke(args=["api-keys", "list", "--user", member.email]).output
    assert (
        f"{key.id}  milo@example.com  'Backup script'  {key.shown}…" in listed and "never used" not in listed
    )
    assert secret not in listed

    revoked = runner.invoke(args=["api-keys", "revoke", str(key.id)])

    assert revoked.exit_code == 0 and "Revoked the key 'Backup script' of milo@example.com" in revoked.output
    assert person_for_bearer(f"Bearer {secret}") is None
    assert "revoked" in runner.invoke(args=["api-keys", "list"]).output
    assert runner.invoke(args=["api-keys", "revoke", str(key.id)]).exit_code == 1


def test_the_cli_refuses_an_unknown_or_removed_person_and_a_blank_name(runner, admin, member):
    member.remove(by=admin)
    db.session.commit()

    unknown = runner.invoke(args=["api-keys", "create", "--user", "nobody@example.com", "--name", "x"])
    removed = runner.invoke(args=["api-keys", "create", "--user", member.email, "--name", "x"])
    blank = runner.invoke(args=["api-keys", "create", "--user", admin.email, "--name", " "])
    missing = runner.invoke(args=["api-keys", "revoke", "12345"])

    assert [r.exit_code for r in (unknown, removed, blank, missing)] == [1, 1, 1, 1]
    assert "No user signs in with nobody@example.com" in unknown.output
    assert "was removed" in removed.output and "Give the key a name" in blank.output
    assert db.session.scalar(sa.select(sa.func.count()).select_from(ApiKey)) == 0


def test_a_key_acts_as_its_person_only(client, member, stranger):
    factories.agent(stranger.account, "Eve's agent")
    _, secret = ApiKey.issue(member, "Script")
    db.session.commit()

    listed = client.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).json

    assert listed["data"] == []  # Acme has no agents; Globex's are not Milo's to see
    assert client.get("/chats/", headers={"Authorization": f"Bearer {secret}"}).status_code == 302  # no pages


# In a real browser


@pytest.mark.browser
def test_making_copying_and_revoking_a_key_in_a_browser(page, size, live_server):  # noqa: F811
    from playwright.sync_api import expect

    member = factories.user(factories.account("Acme"), "milo@example.com", "member")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(member.email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()
    tap(page.locator(".signout .who"))  # the e-mail on a desktop, "Account" on a phone
    expect(page.get_by_role("heading", name="API keys")).to_be_visible()
    check_page(page, size, "api-keys-none")

    page.get_by_label("Name of the new key").fill("Open WebUI")
    tap(page.get_by_role("button", name="Make a key"))
    secret = page.get_by_label("Your new key").input_value()
    tap(page.get_by_role("button", name="Copy key"))

    assert secret.startswith("cairn_") and page.evaluate("navigator.clipboard.readText()") == secret
    assert person_for_bearer(f"Bearer {secret}") == member
    check_page(page, size, "api-keys-made")

    tap(page.get_by_role("link", name="Revoke the key Open WebUI"))  # asks first, on a page of its own
    expect(page.get_by_role("heading", name="Revoke the key “Open WebUI”?")).to_be_visible()
    check_page(page, size, "api-keys-revoke-asked")
    tap(page.get_by_role("link", name="Keep it"))
    assert person_for_bearer(f"Bearer {secret}") == member
    tap(page.get_by_role("link", name="Revoke the key Open WebUI"))
    tap(page.get_by_role("button", name="Revoke the key"))
    expect(page.get_by_text("Revoked the key “Open WebUI”")).to_be_visible()
    assert person_for_bearer(f"Bearer {secret}") is None
    check_page(page, size, "api-keys-revoked")
