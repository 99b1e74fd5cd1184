"""Limits and clean refusals: per-user rate limits on what costs model calls, sign-in attempts per account and
per address, NUL bytes refused with 422, and out-of-range ids answered 404 on every route."""

import re

import pytest
import sqlalchemy as sa
from redis import Redis

from tests import factories
from tests.conftest import _settings
from webapp.extensions import db
from webapp.factory import create_app
from webapp.models import JobRun, Message

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


def _message_count(chat) -> int:
    return db.session.scalar(
        sa.select(sa.func.count()).select_from(Message).where(Message.chat_id == chat.id)
    )


def test_posts_and_triggers_share_a_per_user_limit_with_a_clear_notice(app, client, signed_in, ada, auth):
    app.config["RATE_LIMIT_REPLIES"] = "3 per minute"
    basil = factories.agent(signed_in.account, "Basil")
    group = factories.chat(signed_in.account, [ada, basil])
    for text in ("one", "two"):
        assert (
            client.post(f"/chats/{group.id}/messages", data={"content": text}, headers=HTMX).status_code
            == 200
        )
    assert (
        client.post(f"/chats/{group.id}/trigger", data={"agent_id": "all"}, headers=HTMX).status_code == 200
    )
    stored = _message_count(group)

    refused = client.post(f"/chats/{group.id}/messages", data={"content": "four"}, headers=HTMX)

    assert refused.status_code == 429
    assert refused.headers["HX-Retarget"] == "#notice"  # base.html makes htmx swap a 429 into the notice
    assert "You are asking the agents too often. Try again in" in refused.text
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert _message_count(group) == stored  # nothing stored, no model call queued
    trigger = client.post(f"/chats/{group.id}/trigger", data={"agent_id": "all"}, headers=HTMX)
    assert trigger.status_code == 429


def _reply_runs() -> int:
    return db.session.scalar(sa.select(sa.func.count()).select_from(JobRun).where(JobRun.job_type == "reply"))


def test_edit_and_resend_counts_against_the_same_limit(app, client, signed_in, ada):
    app.config["RATE_LIMIT_REPLIES"] = "2 per minute"
    chat = factories.chat(signed_in.account, [ada])
    assert (
        client.post(f"/chats/{chat.id}/messages", data={"content": "Lisbn"}, headers=HTMX).status_code == 200
    )
    mine = db.session.scalars(sa.select(Message).where(Message.role == "user")).one()
    edit = f"/chats/{chat.id}/messages/{mine.id}/edit"
    assert client.get(edit).status_code == 200  # opening the form asks no agent
    assert client.post(edit, data={"content": "Lisbon"}, headers=HTMX).status_code == 200
    runs = _reply_runs()

    refused = client.post(edit, data={"content": "Lisbon, Portugal"}, headers=HTMX)

    assert refused.status_code == 429
    assert "You are asking the agents too often. Try again in" in refused.text
    assert _reply_runs() == runs  # no new reply job
    db.session.refresh(mine)
    assert mine.content == "Lisbon"
    assert client.get(edit).status_code == 200


def test_the_limit_is_per_user(app, client, signed_in, ada, member):
    app.config["RATE_LIMIT_REPLIES"] = "1 per minute"
    chat = factories.chat(signed_in.account, [ada])
    assert (
        client.post(f"/chats/{chat.id}/messages", data={"content": "mine"}, headers=HTMX).status_code == 200
    )
    assert (
        client.post(f"/chats/{chat.id}/messages", data={"content": "again"}, headers=HTMX).status_code == 429
    )

    other = app.test_client()
    other.post("/login", data={"email": member.email, "password": factories.PASSWORD})
    assert other.post(f"/chats/{chat.id}/messages", data={"content": "hers"}, headers=HTMX).status_code == 200


def _sign_in(client, email: str, password: str, address: str = "127.0.0.1"):
    return client.post(
        "/login", data={"email": email, "password": password}, environ_base={"REMOTE_ADDR": address}
    )


def test_the_31st_attempt_is_refused_even_with_the_right_password(client, admin):
    statuses = [_sign_in(client, admin.email, f"wrong {n}").status_code for n in range(30)]

    right = _sign_in(client, admin.email, factories.PASSWORD)

    assert statuses[:10] == [422] * 10 and set(statuses[10:]) == {429}  # 10 failures per account
    assert right.status_code == 429
    assert "Too many failed sign-in attempts. Try again in 15 minutes." in right.text
    assert client.get("/chats/").status_code == 302  # not signed in


def test_the_account_limit_holds_from_every_address(client, admin):
    for n in range(10):
        assert _sign_in(client, admin.email, "wrong", address=f"10.0.0.{n}").status_code == 422
    assert _sign_in(client, admin.email, factories.PASSWORD, address="10.0.1.1").status_code == 429


def test_the_address_limit_holds_across_accounts(client, admin):
    for n in range(30):
        assert _sign_in(client, f"guess{n}@example.com", "wrong").status_code == 422
    assert _sign_in(client, admin.email, factories.PASSWORD).status_code == 429
    assert _sign_in(client, admin.email, factories.PASSWORD, address="10.9.9.9").status_code == 303


def test_successful_sign_ins_do_not_count(client, admin):
    for _ in range(12):
        assert _sign_in(client, admin.email, factories.PASSWORD).status_code == 303


@pytest.mark.integration
def test_limits_are_counted_in_the_embedded_redis_on_its_unix_socket(
    migrated_database, fake_llm, redis_server
):
    settings = {**_settings(migrated_database, fake_llm.base_url), "REDIS_URL": redis_server}
    del settings["RATELIMIT_STORAGE_URI"]  # the app derives redis+unix://... from REDIS_URL
    app = create_app(settings)
    client = app.test_client()
    with app.app_context():
        statuses = [_sign_in(client, "nobody@example.com", "wrong").status_code for _ in range(11)]
        db.engine.dispose()
    assert statuses == [422] * 10 + [429]
    keys = Redis(unix_socket_path=redis_server.removeprefix("unix://")).keys("LIMITS:*cairn*")
    assert {b"login-account" in key for key in keys} == {True, False}  # per email and per address


def test_a_nul_byte_is_refused_with_422_and_nothing_is_stored(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])

    response = client.post(f"/chats/{chat.id}/messages", data={"content": "a\x00b"}, headers=HTMX)

    assert response.status_code == 422
    assert "NUL character" in response.text and response.headers["HX-Retarget"] == "#notice"
    assert _message_count(chat) == 0
    assert client.post(f"/chats/{chat.id}/rename", data={"title": "x\x00"}).status_code == 422
    assert client.get(f"/agents/{ada.id}/memories?q=%00").status_code == 422
    assert client.post("/login", data={"email": "a\x00@example.com", "password": "x"}).status_code == 422


def _int_routes(app) -> list[tuple[str, str]]:
    """(URL with every int part out of range, method) for each route with an int converter."""
    found = []
    for rule in app.url_map.iter_rules():
        ints = [
            name for name, conv in rule._converters.items() if type(conv).__name__ == "DatabaseIdConverter"
        ]
        if not ints:
            continue
        path = rule.rule
        for name in rule._converters:
            value = str(2**31) if name in ints else "memory"
            path = re.sub(rf"<[^>]*:{name}>|<{name}>", value, path)
        found.extend((path, method) for method in sorted(rule.methods - {"HEAD", "OPTIONS"}))
    return found


@pytest.mark.parametrize("value", [2**31, 2**63, 10**30])
def test_an_out_of_range_id_is_a_404_on_every_route(app, client, signed_in, ada, value):
    routes = _int_routes(app)
    assert len(routes) > 20  # every chat, agent, memory and job route

    answers = {
        (path, method): client.open(path.replace(str(2**31), str(value)), method=method).status_code
        for path, method in routes
    }

    assert {key: status for key, status in answers.items() if status != 404} == {}


def test_an_out_of_range_id_in_a_form_is_a_404(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    for value in (2**31, 2**63, 10**30):
        assert client.post(f"/chats/{chat.id}/agents", data={"agent_id": str(value)}).status_code == 404


def test_behind_a_trusted_proxy_the_forwarded_address_is_counted(app, admin):
    proxied = create_app({**_settings(app.config["SQLALCHEMY_DATABASE_URI"], ""), "TRUSTED_PROXY_HOPS": 1})
    proxied.config["RATE_LIMIT_LOGIN_PER_ADDRESS"] = "2 per 15 minutes"
    client = proxied.test_client()

    def attempt(forwarded_for: str) -> int:
        data = {"email": f"x{forwarded_for}@example.com", "password": "wrong"}
        return client.post("/login", data=data, headers={"X-Forwarded-For": forwarded_for}).status_code

    assert [attempt("203.0.113.1") for _ in range(3)] == [422, 422, 429]
    assert attempt("203.0.113.2") == 422  # another client behind the same proxy


def test_while_redis_is_down_sign_in_still_works_and_is_still_limited(app, admin, member, fake_llm, tmp_path):
    settings = {**_settings(app.config["SQLALCHEMY_DATABASE_URI"], fake_llm.base_url)}
    settings["REDIS_URL"] = f"unix://{tmp_path}/gone.sock"  # no server there
    del settings["RATELIMIT_STORAGE_URI"]
    down = create_app(settings)
    down.config["RATE_LIMIT_LOGIN_PER_ACCOUNT"] = "2 per 15 minutes"
    client = down.test_client()
    with down.app_context():
        statuses = [_sign_in(client, admin.email, "wrong").status_code for _ in range(3)]
        signed_in = _sign_in(client, member.email, factories.PASSWORD).status_code
        db.session.remove()
        db.engine.dispose()
    assert statuses == [422, 422, 429]  # counted in this process's memory meanwhile
    assert signed_in == 303
