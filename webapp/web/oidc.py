"""Sign in with the team's identity provider (OpenID Connect through Authlib): discovery, the authorization code
flow with PKCE, state and nonce, the ID token's signature, issuer, audience and expiry checked; then who may
come in: a person of an account (linked by the provider's subject from then on), or a new member where the
operator allows it. The sign-in itself is Cairn's own (webapp.web.auth.sign_in)."""

import logging
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import requests
import sqlalchemy as sa
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.flask_client import OAuth
from flask import Blueprint, Flask, abort, current_app, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from joserfc.errors import JoseError

from webapp.config import ConfigError
from webapp.extensions import db
from webapp.models import Account, Agent, User
from webapp.models.accounts import MAX_NAME_CHARS, NO_PASSWORD, PersonChangeRefused
from webapp.web.auth import LoginForm, safe_next, sign_in

bp = Blueprint("oidc", __name__)
log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10  # each request to the provider: discovery, keys, token, userinfo


class Refused(Exception):
    """A sign-in through the provider that Cairn turns down; the message is for the person, the status says why."""

    def __init__(self, sentence: str, status: int = 403):
        super().__init__(sentence)
        self.status = status


def init_app(app: Flask) -> None:
    """Refuse to start with settings that cannot work (a sentence naming the variable), and register the
    provider's client when OIDC_ISSUER is set. Discovery waits for the first sign-in (`flask check` asks at once:
    webapp.runtime.health)."""
    _check_settings(app.config)
    if app.config["OIDC_ISSUER"]:
        client = OAuth(app).register(
            "provider",
            client_id=app.config["OIDC_CLIENT_ID"],
            client_secret=app.config["OIDC_CLIENT_SECRET"],
            server_metadata_url=_discovery_url(app.config["OIDC_ISSUER"]),
            client_kwargs={
                "scope": app.config["OIDC_SCOPES"],
                "code_challenge_method": "S256",
                "default_timeout": TIMEOUT_SECONDS,
            },
        )
        app.extensions["oidc"] = client


def _check_settings(settings: Mapping[str, Any]) -> None:
    issuer = settings["OIDC_ISSUER"]
    if not issuer:
        if settings["OIDC_ONLY"]:
            raise ConfigError("OIDC_ONLY is set but OIDC_ISSUER is not: nobody could sign in.")
        return
    if not issuer.startswith(("https://", "http://")):
        raise ConfigError(
            f"OIDC_ISSUER must be the provider's URL, such as https://id.example.com, not {issuer!r}."
        )
    for name in ("OIDC_CLIENT_ID", "OIDC_CLIENT_SECRET"):
        if not settings[name]:
            raise ConfigError(
                f"{name} must be set when OIDC_ISSUER is: the provider shows it for Cairn's client."
            )
    if "openid" not in settings["OIDC_SCOPES"].split():
        raise ConfigError(
            f"OIDC_SCOPES must include openid, as 'openid email profile' does, not {settings['OIDC_SCOPES']!r}."
        )


def _discovery_url(issuer: str) -> str:
    return f"{issuer}/.well-known/openid-configuration"


@bp.post("/login/oidc")
def start() -> ResponseReturnValue:
    """Off to the identity provider, which sends the person back to the callback."""
    client = _client()
    session["oidc_next"] = safe_next(request.args.get("next"))
    try:
        _metadata(client)
        return client.authorize_redirect(url_for("oidc.callback", _external=True))
    except (requests.RequestException, ValueError) as error:
        log.warning("The identity provider cannot be reached: %s", error)
        return _refused(Refused(_unreachable(), 503))


@bp.get("/login/oidc/callback")
def callback() -> ResponseReturnValue:
    """Where the provider sends the person back: the state, the code and the ID token are checked, then the
    person signs in as who they are in Cairn."""
    client = _client()
    try:
        claims = _verified_claims(client)
        person = _person_for(claims)
        db.session.flush()
    except Refused as refusal:
        db.session.rollback()
        return _refused(refusal)
    except sa.exc.IntegrityError:  # the same newcomer signing in twice at once: the other one won
        db.session.rollback()
        return _refused(Refused(_incomplete(), 409))
    sign_in(person)
    session["provider_logout"] = _logout_url(client)
    return redirect(session.pop("oidc_next", None) or url_for("chats.index"), code=303)


def _client():
    client = current_app.extensions.get("oidc")
    if client is None:
        abort(404)
    return client


def _metadata(client) -> dict:
    """The provider's discovery document (fetched once per process), whose issuer must be OIDC_ISSUER."""
    metadata = client.load_server_metadata()
    issuer = current_app.config["OIDC_ISSUER"]
    if str(metadata.get("issuer", "")).rstrip("/") != issuer:
        client.server_metadata.clear()
        raise ValueError(
            f"{_discovery_url(issuer)} names the issuer {metadata.get('issuer')!r}, not {issuer!r}"
        )
    return metadata


def _verified_claims(client) -> dict:
    """The ID token's claims (and the userinfo endpoint's for the same subject), once Authlib has checked the
    state, exchanged the code with its PKCE verifier and verified the token's signature, issuer, audience, expiry
    and nonce. Anything wrong is refused without saying what (the log says)."""
    try:
        metadata = _metadata(client)
        options = {
            "iss": {"essential": True, "values": [metadata["issuer"]]},
            "aud": {"essential": True, "values": [client.client_id]},
        }
        token = client.authorize_access_token(claims_options=options)
        claims = dict(token.get("userinfo") or {})
        if not claims.get("sub"):
            raise ValueError("the token response has no ID token")
        if metadata.get("userinfo_endpoint"):
            more = dict(client.userinfo(token=token))
            if more.get("sub") != claims["sub"]:
                raise ValueError("the userinfo endpoint speaks of another subject")
            claims = {**more, **claims}
    except requests.RequestException as error:
        log.warning("The identity provider cannot be reached: %s", error)
        raise Refused(_unreachable(), 503) from None
    except (AuthlibBaseError, JoseError, ValueError, KeyError, TypeError) as error:
        log.warning("A sign-in through the identity provider was refused: %r", error)
        raise Refused(_incomplete(), 400) from None
    return claims


def _person_for(claims: dict) -> User:
    """Who signs in: the person linked to this subject, else the person with this verified e-mail (linked from
    now on), else a new member where the operator lets newcomers in. A removed person stays out."""
    config, subject = current_app.config, str(claims["sub"])
    if len(subject) > 255 or len(str(claims.get("email") or "")) > 254:  # more than any real provider sends
        raise Refused(_incomplete(), 400)
    person = db.session.scalar(
        sa.select(User).where(User.oidc_issuer == config["OIDC_ISSUER"], User.oidc_subject == subject)
    )
    email = str(claims.get("email") or "").strip().lower()
    verified = claims.get("email_verified") in (True, "true") and "@" in email
    if person is None:
        if not verified:
            raise Refused(
                f"{config['OIDC_NAME']} has not confirmed that {email or 'your e-mail address'} is yours, so Cairn "
                "cannot tell who you are. Ask your IT admin to verify it."
            )
        person = db.session.scalar(sa.select(User).where(User.email == email)) or _newcomer(claims, email)
        if person.oidc_issuer == config["OIDC_ISSUER"] and person.oidc_subject not in (None, subject):
            raise Refused(f"{email} is linked to another person at {config['OIDC_NAME']}. Ask an admin.")
    if person.is_removed:
        raise Refused(f"An admin removed you from {person.account.name}. Ask an admin to restore you.")
    person.oidc_issuer, person.oidc_subject = config["OIDC_ISSUER"], subject
    if (
        verified
        and email != person.email
        and not db.session.scalar(sa.select(User.id).where(User.email == email))
    ):
        person.email = email  # renamed at the provider: still the same person
    _role_from_groups(person, claims)
    return person


def _newcomer(claims: dict, email: str) -> User:
    """A new member (an admin if in OIDC_ADMIN_GROUP) of the account the operator named for them, or refused."""
    account = _account_for(claims, email)
    name = " ".join(str(claims.get("name") or "").split())[:MAX_NAME_CHARS] or None
    agents = sa.select(Agent.id).where(
        Agent.account_id == account.id, sa.func.lower(Agent.name) == (name or "").lower()
    )
    if name and db.session.scalar(agents):
        name = None  # an agent's name: their e-mail's local part is shown instead, as for anyone unnamed
    person = User(account=account, email=email, name=name, role="member")
    person.password_hash = NO_PASSWORD + secrets.token_urlsafe(16)  # no password; an admin may send a link
    db.session.add(person)
    log.info("%s joined %s through the identity provider", email, account.name)
    return person


def _account_for(claims: dict, email: str) -> Account:
    config = current_app.config
    if claim := config["OIDC_ACCOUNT_CLAIM"]:
        names = [value for value in _as_list(claims.get(claim)) if isinstance(value, str)]
        if names and (account := db.session.scalar(sa.select(Account).where(Account.name.in_(names)))):
            return account
    domain = email.rsplit("@", 1)[1]
    if domain not in config["OIDC_ALLOWED_DOMAINS"]:
        raise Refused(
            f"Nobody signs in here as {email}, and new people from {domain} are not let in. "
            "Ask an admin of your team to add you."
        )
    accounts = sa.select(Account).order_by(Account.id)
    if config["OIDC_ACCOUNT"]:
        accounts = accounts.where(Account.name == config["OIDC_ACCOUNT"])
    found = db.session.scalars(accounts.limit(2)).all()
    if len(found) != 1:
        log.error(
            "OIDC_ACCOUNT must name the account new people join (%r matches %d)",
            config["OIDC_ACCOUNT"],
            len(found),
        )
        raise Refused("Cairn is not set up yet to let new people in. Ask an admin of your team to add you.")
    return found[0]


def _role_from_groups(person: User, claims: dict) -> None:
    """With OIDC_ADMIN_GROUP set, the provider's groups decide who is an admin, at each sign-in (the account's
    last admin stays one)."""
    group = current_app.config["OIDC_ADMIN_GROUP"]
    if not group:
        return
    role = "admin" if group in _as_list(claims.get(current_app.config["OIDC_GROUPS_CLAIM"])) else "member"
    if person.id is None:
        person.role = role
        return
    try:
        person.change_role(role, by=None)
    except PersonChangeRefused as refusal:
        log.warning("%s stays an admin: %s", person.email, refusal)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _logout_url(client) -> str | None:
    """The provider's sign-out page for after Cairn's own (RP-initiated logout), where it offers one."""
    endpoint = client.server_metadata.get("end_session_endpoint")
    if not endpoint:
        return None
    back = {"client_id": client.client_id, "post_logout_redirect_uri": url_for("auth.login", _external=True)}
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(back)}"


def _unreachable() -> str:
    return f"{current_app.config['OIDC_NAME']} cannot be reached just now. Try again in a minute."


def _incomplete() -> str:
    return f"The sign-in through {current_app.config['OIDC_NAME']} did not complete. Please try again."


def _refused(refusal: Refused) -> ResponseReturnValue:
    """The sign-in page again, saying in one sentence why (no detail of what was wrong)."""
    session.pop("oidc_next", None)
    return render_template(
        "auth/login.html", form=LoginForm(formdata=None), problem=str(refusal)
    ), refusal.status
