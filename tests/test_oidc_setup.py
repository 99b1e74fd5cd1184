"""Sign-in through the identity provider as an operator and an admin see it: settings that cannot work stop
Cairn with a sentence, `flask check` asks the provider, the provider down is a sentence on the sign-in page,
OIDC_ONLY turns passwords off (a one-time link from the CLI still signs an admin in), sign-out offers the
provider's, the People page says how each person signs in, and with no provider nothing changes."""

from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from tests import oidc_provider
from tests.conftest import free_port
from tests.factories import PASSWORD
from tests.oidc_provider import CLIENT_ID, come_back, sign_in_through, start
from tests.test_cli import flask
from webapp.config import ConfigError
from webapp.extensions import db
from webapp.factory import create_app
from webapp.models.accounts import UserSession

app, provider = oidc_provider.app, oidc_provider.provider  # the fixtures


def _env(provider, tmp_path, **more) -> dict[str, str]:
    return {
        "DATABASE_URL": f"sqlite:///{tmp_path}/x.db",
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": "s3cret",
        **more,
    }


@pytest.mark.parametrize(
    ("setting", "sentence"),
    [
        ({"OIDC_CLIENT_SECRET": ""}, "OIDC_CLIENT_SECRET must be set when OIDC_ISSUER is"),
        ({"OIDC_CLIENT_ID": ""}, "OIDC_CLIENT_ID must be set when OIDC_ISSUER is"),
        ({"OIDC_ISSUER": "id.example.com"}, "OIDC_ISSUER must be the provider's URL"),
        ({"OIDC_SCOPES": "email profile"}, "OIDC_SCOPES must include openid"),
        ({"OIDC_ISSUER": "", "OIDC_ONLY": "1"}, "OIDC_ONLY is set but OIDC_ISSUER is not"),
    ],
)
def test_settings_that_cannot_work_stop_cairn_with_a_sentence(provider, tmp_path, setting, sentence):
    result = flask("check", env=_env(provider, tmp_path, **setting))

    assert result.returncode != 0
    assert f"Cairn cannot start: {sentence}" in result.stderr and "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr


def test_flask_check_asks_the_provider(provider, tmp_path):
    result = flask("check", env=_env(provider, tmp_path))

    assert result.returncode == 0, result.stderr
    assert f"ok    OIDC_ISSUER: {provider.issuer}/.well-known/openid-configuration" in result.stdout


def test_flask_check_names_an_unreachable_issuer(provider, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"

    result = flask("check", env=_env(provider, tmp_path, OIDC_ISSUER=down))

    assert result.returncode == 1
    assert f"FAIL  OIDC_ISSUER (set): cannot read {down}/.well-known/openid-configuration" in result.stderr
    assert "Cairn cannot start: fix OIDC_ISSUER" in result.stderr and "Traceback" not in result.stderr


def test_the_factory_refuses_a_provider_without_a_secret():
    with pytest.raises(ConfigError, match="OIDC_CLIENT_SECRET must be set"):
        create_app({"TESTING": True, "OIDC_ISSUER": "https://id.example.com", "OIDC_CLIENT_ID": "cairn"})


@pytest.mark.parametrize("app", [{"OIDC_ISSUER": f"http://127.0.0.1:{free_port()}"}], indirect=True)
def test_the_provider_down_at_sign_in_is_a_sentence_on_the_sign_in_page(client):
    response = client.post("/login/oidc")

    assert response.status_code == 503
    assert "Acme ID cannot be reached just now. Try again in a minute." in response.text
    assert 'name="password"' in response.text  # the password form is still there


def test_the_provider_going_down_during_a_sign_in_is_a_sentence_too(client, provider, admin):
    provider.person("dana-1", email="dana@example.com", email_verified=True)
    callback = provider.authorize(start(client), "dana-1")
    provider.close()

    response = come_back(client, callback)

    assert response.status_code == 503 and "Acme ID cannot be reached just now" in response.text


def test_the_sign_in_page_offers_the_provider_beside_the_password_form(client):
    page = client.get("/login").text

    assert "Sign in with Acme ID" in page and 'action="/login/oidc"' in page
    assert 'name="password"' in page and "or with your password" in page


@pytest.mark.parametrize("app", [{"OIDC_ISSUER": ""}], indirect=True)
def test_with_no_provider_configured_nothing_changes(client, auth, admin):
    page = client.get("/login").text

    assert "Sign in with" not in page and "or with your password" not in page and 'name="password"' in page
    assert client.post("/login/oidc").status_code == 404
    assert client.get("/login/oidc/callback?code=x&state=y").status_code == 404
    auth.login(admin)
    people = client.get("/people/").text
    assert "Signs in with" in people and "Password" in people and "subject" not in people


@pytest.mark.parametrize("app", [{"OIDC_ONLY": True}], indirect=True)
def test_oidc_only_hides_the_password_form_and_refuses_passwords(client, admin):
    page = client.get("/login").text
    assert "Sign in with Acme ID" in page and 'name="password"' not in page

    response = client.post("/login", data={"email": admin.email, "password": PASSWORD})

    assert response.status_code == 403 and "Passwords are turned off here" in response.text
    assert client.get("/chats/").status_code == 302


@pytest.mark.parametrize("app", [{"OIDC_ONLY": True}], indirect=True)
def test_a_one_time_link_from_the_cli_signs_an_admin_in_once(client, runner, admin):
    result = runner.invoke(args=["users", "link", "dana@example.com"])
    assert result.exit_code == 0, result.output
    url = result.stdout.strip()
    assert url.startswith("http://localhost:5000/sign-in/")
    path = urlsplit(url).path

    shown = client.get(path)
    assert shown.status_code == 200 and "Sign in as dana" in shown.text
    assert client.post(path).status_code == 303
    account = client.get("/account").text
    assert "You sign in with Acme ID" in account and "Change password" not in account
    client.post("/logout")
    assert client.post(path).status_code == 404  # once only
    assert client.get("/chats/").status_code == 302
    assert runner.invoke(args=["users", "link", "nobody@example.com"]).exit_code == 1


def test_a_removed_person_s_link_does_not_work(client, runner, admin, member):
    path = urlsplit(runner.invoke(args=["users", "link", member.email]).stdout.strip()).path
    member.remove(by=admin)
    db.session.commit()

    assert client.get(path).status_code == 404 and client.post(path).status_code == 404


def test_signing_out_ends_the_sign_in_and_offers_the_provider_s_sign_out(client, provider, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303

    assert client.post("/logout").headers["Location"] == "/login"

    assert db.session.scalar(sa.select(sa.func.count()).select_from(UserSession)) == 0
    page = client.get("/login").text
    assert "Sign out of Acme ID too" in page
    assert f'href="{provider.issuer}/oauth2/end_session?client_id={CLIENT_ID}' in page
    assert "post_logout_redirect_uri=http%3A%2F%2Flocalhost%2Flogin" in page
    assert "Sign out of Acme ID too" not in client.get("/login").text  # offered once


def test_the_people_page_says_how_each_person_signs_in_and_shows_subjects_to_admins(
    client, auth, provider, admin, member
):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303
    assert client.get("/people/").status_code == 403  # a member: no people page, no subjects
    assert "milo-at-acme" not in client.get("/account").text
    client.post("/logout")

    auth.login(admin)
    row = client.get("/people/").text.split(f'id="person-{member.id}"', 1)[1].split("</tr>", 1)[0]

    assert "Acme ID, password" in row and "subject milo-at-acme" in row
    assert "invited" not in row
