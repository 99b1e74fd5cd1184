"""A real OpenID Connect provider for tests: oidc-provider-mock served on loopback from a thread (discovery, JWKS,
authorize, token, userinfo, end-session), and an app signed in through it.

To forge ID tokens as an attacker or a broken provider would, set `provider.forge` to a function of the claims
the provider issued that returns the token to hand back instead: the token endpoint then answers with it, and the
provider's JWKS also lists `provider.key`, the key `provider.sign` signs with (as a provider rotating keys
would). Everything still goes through Cairn's real callback route."""

import base64
import json
import threading
from urllib.parse import urlsplit

import pytest
import requests
from flask import g
from joserfc import jwt
from joserfc.jwk import RSAKey
from oidc_provider_mock import app as provider_app
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.conftest import _database_for_test, _in_context, _settings
from webapp.factory import create_app

CLIENT_ID = "cairn-tests"
FORGER = RSAKey.generate_key(2048, parameters={"kid": "forger", "alg": "RS256", "use": "sig"}, private=True)


class Provider:
    def __init__(self):
        self.app = provider_app(require_nonce=True)
        self.key = FORGER
        self.forge = None
        self.server = make_server("127.0.0.1", 0, self, threaded=True)
        self.issuer = f"http://localhost:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def __call__(self, environ, start_response):
        response = Response.from_app(self.app, environ)
        path = Request(environ).path
        if self.forge and path == "/jwks":
            keys = json.loads(response.get_data())["keys"] + [self.key.as_dict(private=False)]
            response.set_data(json.dumps({"keys": keys}))
        if self.forge and path == "/oauth2/token" and response.status_code == 200:
            body = json.loads(response.get_data())
            body["id_token"] = self.forge(claims_of(body["id_token"]))
            response.set_data(json.dumps(body))
        return response(environ, start_response)

    def person(self, sub: str, **claims) -> str:
        """Make (or change) the provider's person with this subject."""
        requests.put(f"{self.issuer}/users/{sub}", json=claims, timeout=5).raise_for_status()
        return sub

    def sign(self, claims: dict, key: RSAKey | None = None) -> str:
        return jwt.encode({"alg": "RS256", "kid": "forger"}, claims, key or self.key)

    def authorize(self, authorize_url: str, sub: str) -> str:
        """The person `sub` approves at the provider's authorize page: the callback URL it sends them to."""
        response = requests.post(authorize_url, data={"sub": sub}, allow_redirects=False, timeout=5)
        assert response.status_code == 302, response.text
        return response.headers["Location"]

    def close(self):
        self.server.shutdown()


def claims_of(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def unsigned(claims: dict) -> str:
    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def oidc_settings(provider: Provider, **more) -> dict:
    return {
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": "cairn-tests-secret",
        "OIDC_NAME": "Acme ID",
        "OIDC_ALLOWED_DOMAINS": ["example.com"],
        **more,
    }


@pytest.fixture
def provider():
    server = Provider()
    yield server
    server.close()


@pytest.fixture
def app(migrated_database, tmp_path, fake_llm, fake_redis, provider, request):
    """The app with sign-in through `provider` (settings added by indirect parametrization of `app`)."""
    from rq import Queue

    settings = _settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url)
    app = create_app({**settings, **oidc_settings(provider, **getattr(request, "param", {}))})
    app.extensions["redis"] = fake_redis
    app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=fake_redis)
    # The test's app context, and so `g`, outlives each request: each request finds whom it signs in afresh.
    app.before_request(lambda: g.pop("_login_user", None) and None)
    yield from _in_context(app)


def start(client, next_path: str | None = None) -> str:
    """Press "Sign in with Acme ID": the provider's authorize URL Cairn sends the browser to."""
    response = client.post("/login/oidc" + (f"?next={next_path}" if next_path else ""))
    assert response.status_code == 302, response.text
    return response.headers["Location"]


def come_back(client, callback_url: str):
    """The browser arriving at Cairn's callback with what the provider put in the URL."""
    parts = urlsplit(callback_url)
    return client.get(f"{parts.path}?{parts.query}")


def sign_in_through(client, provider: Provider, sub: str):
    return come_back(client, provider.authorize(start(client), sub))
