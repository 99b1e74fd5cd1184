"""Sign-ins end server-side: signing out or changing the password makes copied cookies worthless; cookies are
SameSite=Lax (Secure over HTTPS); an unknown email costs the same password check; weak passwords are refused."""

from datetime import timedelta
from unittest import mock

import pytest
import sqlalchemy as sa
import time_machine
from flask.testing import FlaskClient

from tests import factories
from webapp import config
from webapp.extensions import db
from webapp.models import User, UserSession
from webapp.models import accounts as accounts_module
from webapp.timeutil import utcnow

NEW_PASSWORD = "lantern quarry mosaic"


class Browser(FlaskClient):
    """A client whose every request has an app context (so a `g`) of its own, as in production.

    The app fixture keeps one app context open for the whole test, and a request reuses it, so Flask-Login's
    user cached in `g` would carry over from one request to the next and hide what the cookies alone do."""

    def open(self, *args, **kwargs):
        with self.application.app_context():
            return super().open(*args, **kwargs)


@pytest.fixture(autouse=True)
def _browsers(app):
    app.test_client_class = Browser


def _cookies(client) -> dict[str, str]:
    return {
        name: client.get_cookie(name).value
        for name in ("session", "remember_token")
        if client.get_cookie(name)
    }


def _browser(app, cookies: dict[str, str]):
    """Another browser holding copies of these cookies."""
    other = app.test_client()
    for name, value in cookies.items():
        other.set_cookie(name, value)
    return other


def _signed_in(client) -> bool:
    response = client.get("/chats/")
    assert response.status_code in (200, 302)
    return response.status_code == 200


def test_cookies_copied_before_sign_out_open_nothing_afterwards(app, client, auth, admin):
    auth.login(admin)
    copied = _cookies(client)
    assert set(copied) == {"session", "remember_token"}
    assert _signed_in(_browser(app, copied))

    client.post("/logout")

    replayed = _browser(app, copied).get("/chats/")
    assert replayed.status_code == 302 and "/login" in replayed.headers["Location"]
    assert not _signed_in(_browser(app, {"remember_token": copied["remember_token"]}))
    assert not _signed_in(client)


def test_the_remember_cookie_alone_signs_in_until_sign_out(app, client, auth, admin):
    auth.login(admin)
    remember = {"remember_token": client.get_cookie("remember_token").value}

    assert _signed_in(_browser(app, remember))
    client.post("/logout")
    assert not _signed_in(_browser(app, remember))


def test_signing_out_in_one_browser_leaves_the_others_signed_in(app, admin):
    laptop, phone = app.test_client(), app.test_client()
    for browser in (laptop, phone):
        browser.post("/login", data={"email": admin.email, "password": factories.PASSWORD})

    laptop.post("/logout")

    assert not _signed_in(laptop) and _signed_in(phone)


def test_cookies_carry_no_user_id(client, auth, admin):
    auth.login(admin)

    with client.session_transaction() as session:
        assert session["_user_id"] != str(admin.id) and len(session["_user_id"]) >= 40


def test_a_sign_in_ends_after_the_remember_duration_whatever_the_cookie(app, client, auth, admin):
    auth.login(admin)
    copied = _cookies(client)

    with time_machine.travel(utcnow() + timedelta(days=31), tick=False):
        assert not _signed_in(_browser(app, copied))
        auth.login(admin)  # a new sign-in clears the expired one

    assert db.session.scalar(sa.select(sa.func.count()).select_from(UserSession)) == 1


# Changing one's own password


def _change(client, current=factories.PASSWORD, new=NEW_PASSWORD, confirm=None):
    data = {"current_password": current, "new_password": new, "confirm": new if confirm is None else confirm}
    return client.post("/account/password", data=data)


def test_the_password_page_is_linked_and_shows_its_form(client, auth, admin):
    auth.login(admin)

    chats = client.get("/chats/").text
    page = client.get("/account")

    assert 'href="/account"' in chats
    assert page.status_code == 200 and 'name="current_password"' in page.text
    assert 'autocomplete="new-password"' in page.text


def test_changing_the_password_signs_out_every_other_sign_in_and_old_cookies(app, client, auth, admin):
    other = app.test_client()
    other.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    auth.login(admin)
    copied_here = _cookies(client)

    response = _change(client)

    assert response.status_code == 303 and response.headers["Location"] == "/chats/"
    assert "Password changed" in client.get("/chats/").text
    assert _signed_in(client)
    assert not _signed_in(other)
    assert not _signed_in(_browser(app, copied_here))
    db.session.expire_all()
    assert db.session.get(User, admin.id).check_password(NEW_PASSWORD)
    assert (
        client.post("/logout")
        and client.post("/login", data={"email": admin.email, "password": NEW_PASSWORD}).status_code == 303
    )


@pytest.mark.parametrize(
    ("current", "new", "confirm", "reason"),
    [
        ("wrong password", NEW_PASSWORD, None, "That is not your current password."),
        (factories.PASSWORD, "password", None, "too easy to guess"),
        (factories.PASSWORD, "12345678", None, "too easy to guess"),
        (factories.PASSWORD, " " * 8, None, "cannot be only spaces"),
        (factories.PASSWORD, "short", None, "at least 8 characters"),
        (factories.PASSWORD, NEW_PASSWORD, "something else", "The two new passwords differ."),
    ],
)
def test_a_refused_change_says_why_and_changes_nothing(
    app, client, auth, admin, current, new, confirm, reason
):
    other = app.test_client()
    other.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    auth.login(admin)

    response = _change(client, current, new, confirm)

    assert response.status_code == 422 and reason in response.text
    db.session.expire_all()
    assert db.session.get(User, admin.id).check_password(factories.PASSWORD)
    assert _signed_in(other)


def test_the_password_page_needs_a_sign_in_and_the_csrf_token(app, client, auth, admin):
    assert client.get("/account/password").status_code == 302

    auth.login(admin)
    app.config["WTF_CSRF_ENABLED"] = True

    assert _change(client).status_code == 400
    db.session.expire_all()
    assert db.session.get(User, admin.id).check_password(factories.PASSWORD)


# Cookies


def _set_cookies(response) -> dict[str, str]:
    return {header.split("=", 1)[0]: header for header in response.headers.getlist("Set-Cookie")}


def test_cookies_are_samesite_lax_and_not_secure_over_plain_http(client, admin):
    response = client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})

    cookies = _set_cookies(response)
    assert set(cookies) == {"session", "remember_token"}
    for header in cookies.values():
        assert "SameSite=Lax" in header and "HttpOnly" in header and "Secure" not in header


def test_cookies_are_secure_when_served_over_https(app, admin, monkeypatch, tmp_path):
    monkeypatch.setenv("PREFERRED_URL_SCHEME", "https")
    settings = config.load(str(tmp_path))
    app.config.update({key: value for key, value in settings.items() if "COOKIE" in key})
    client = app.test_client()

    response = client.post(
        "/login", data={"email": admin.email, "password": factories.PASSWORD}, base_url="https://localhost"
    )

    cookies = _set_cookies(response)
    assert set(cookies) == {"session", "remember_token"}
    assert all("Secure" in header and "SameSite=Lax" in header for header in cookies.values())


# The cost of a password check


def test_an_unknown_email_costs_the_same_password_check_as_a_known_one(client, admin):
    with mock.patch.object(
        accounts_module, "check_password_hash", wraps=accounts_module.check_password_hash
    ) as checked:
        client.post("/login", data={"email": admin.email, "password": "wrong password"})
        client.post("/login", data={"email": "nobody@example.com", "password": "wrong password"})

    known, unknown = (call.args[0] for call in checked.call_args_list)
    assert checked.call_count == 2
    assert unknown != known and unknown.split("$")[0] == known.split("$")[0]  # same method and work factors
