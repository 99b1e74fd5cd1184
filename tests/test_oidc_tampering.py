"""A sign-in through the identity provider that was tampered with is refused at Cairn's real callback: a wrong
state, a replayed code, a code or a token for another client, an expired, unsigned or wrongly signed token, a
nonce or an issuer that does not match. Each time nothing is created, nobody is signed in, and the page says one
plain sentence without saying what was wrong."""

import logging
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import sqlalchemy as sa
from joserfc.jwk import RSAKey

from tests import oidc_provider
from tests.oidc_provider import CLIENT_ID, come_back, sign_in_through, start, unsigned
from webapp.extensions import db
from webapp.models import User
from webapp.models.accounts import UserSession

app, provider = oidc_provider.app, oidc_provider.provider  # the fixtures

REFUSAL = "The sign-in through Acme ID did not complete. Please try again."
DETAILS = (
    "state",
    "nonce",
    "signature",
    "audience",
    "aud",
    "expired",
    "exp",
    "issuer",
    "invalid_grant",
    "claim",
)


@pytest.fixture
def refused(client, caplog, monkeypatch):
    """Checks that a response refused the sign-in for the reason the server's log gives (and the page does not),
    with nothing made and nobody signed in."""
    monkeypatch.setattr(logging.getLogger("webapp.web.oidc"), "disabled", False)  # alembic's logging config

    def check(response, because: str) -> None:
        _refused_and_nothing_made(client, response)
        reasons = [r.getMessage() for r in caplog.records if r.name == "webapp.web.oidc"]
        assert because in reasons[-1], reasons

    return check


@pytest.fixture
def sam(provider, admin):
    """Someone the provider vouches for, whom a sign-in would make a member of Acme (example.com is allowed)."""
    return provider.person("sam-1", email="sam@example.com", email_verified=True, name="Sam Lee")


def _refused_and_nothing_made(client, response) -> None:
    assert response.status_code in (400, 409), response.text
    assert REFUSAL in response.text
    page = response.text.split("<main", 1)[-1].lower()
    assert [word for word in DETAILS if word in page.replace("sign-in", "")] == []
    db.session.expire_all()
    assert db.session.scalar(sa.select(User).where(User.email == "sam@example.com")) is None
    assert db.session.scalar(sa.select(sa.func.count()).select_from(UserSession)) == 0
    assert client.get("/chats/").status_code == 302  # nobody signed in


def _with_query(url: str, **changes) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode(query)))


def test_the_untampered_token_re_signed_by_the_provider_s_other_key_is_accepted(client, provider, sam):
    """The harness's own check: a forged token differs only in what each test below changes."""
    provider.forge = provider.sign

    assert sign_in_through(client, provider, sam).status_code == 303
    assert client.get("/chats/").status_code == 200


def test_a_wrong_state_is_refused(client, provider, sam, refused):
    callback = provider.authorize(start(client), sam)

    refused(come_back(client, _with_query(callback, state="forged-state")), because="mismatching_state")


def test_a_callback_without_a_sign_in_started_in_this_browser_is_refused(app, client, provider, sam, refused):
    callback = provider.authorize(start(app.test_client()), sam)  # another browser started it

    refused(come_back(client, callback), because="mismatching_state")


def test_a_replayed_code_is_refused(client, provider, sam, refused):
    callback = provider.authorize(start(client), sam)
    assert come_back(client, callback).status_code == 303
    client.post("/logout")
    db.session.execute(sa.delete(User).where(User.email == "sam@example.com"))
    db.session.commit()

    refused(
        come_back(client, callback), because="mismatching_state"
    )  # the same URL again: its state was used
    fresh_state = dict(parse_qsl(urlsplit(start(client)).query))["state"]
    refused(come_back(client, _with_query(callback, state=fresh_state)), because="invalid_grant")


def test_a_code_issued_to_another_client_is_refused(client, provider, sam, refused):
    authorize = _with_query(start(client), client_id="another-client")

    refused(come_back(client, provider.authorize(authorize, sam)), because="invalid_grant")


def test_a_token_for_another_client_is_refused(client, provider, sam, refused):
    provider.forge = lambda claims: provider.sign(
        {**claims, "aud": "another-client", "azp": "another-client"}
    )

    refused(sign_in_through(client, provider, sam), because="'aud'")


def test_a_token_for_several_audiences_none_of_them_cairn_is_refused(client, provider, sam, refused):
    provider.forge = lambda claims: provider.sign(
        {**claims, "aud": ["another-client", "a-third"], "azp": CLIENT_ID}
    )

    refused(sign_in_through(client, provider, sam), because="'aud'")


def test_an_expired_token_is_refused(client, provider, sam, refused):
    now = int(time.time())
    provider.forge = lambda claims: provider.sign({**claims, "iat": now - 7200, "exp": now - 3600})

    refused(sign_in_through(client, provider, sam), because="expired")


def test_an_unsigned_token_is_refused(client, provider, sam, refused):
    provider.forge = unsigned

    refused(sign_in_through(client, provider, sam), because="'none' is not allowed")


def test_a_token_signed_with_a_key_the_provider_does_not_publish_is_refused(client, provider, sam, refused):
    stranger = RSAKey.generate_key(2048, parameters={"kid": "forger", "alg": "RS256"}, private=True)
    provider.forge = lambda claims: provider.sign(claims, key=stranger)

    refused(sign_in_through(client, provider, sam), because="bad_signature")


def test_a_token_whose_nonce_does_not_match_is_refused(client, provider, sam, refused):
    provider.forge = lambda claims: provider.sign({**claims, "nonce": "another-nonce"})

    refused(sign_in_through(client, provider, sam), because="'nonce'")


def test_a_nonce_changed_on_the_way_to_the_provider_is_refused(client, provider, sam, refused):
    authorize = _with_query(start(client), nonce="chosen-by-an-attacker")

    refused(come_back(client, provider.authorize(authorize, sam)), because="'nonce'")


def test_a_token_from_another_issuer_is_refused(client, provider, sam, refused):
    provider.forge = lambda claims: provider.sign({**claims, "iss": "https://evil.example"})

    refused(sign_in_through(client, provider, sam), because="'iss'")


def test_a_refusal_by_the_provider_is_a_sentence_too(client, provider, sam, refused):
    callback = _with_query(provider.authorize(start(client), sam), error="access_denied", code="")

    refused(come_back(client, callback), because="access_denied")
