"""Sign-in through the team's identity provider (issue 43), against a real OpenID Connect provider
(oidc-provider-mock on loopback): who comes in as whom, who is made, who is refused and what they are told."""

import sqlalchemy as sa

from tests import factories, oidc_provider
from tests.oidc_provider import come_back, sign_in_through, start
from webapp.extensions import db
from webapp.models import Account, User
from webapp.models.accounts import UserSession

app, provider = oidc_provider.app, oidc_provider.provider  # the fixtures


def _person(email: str) -> User | None:
    db.session.expire_all()
    return db.session.scalar(sa.select(User).where(User.email == email))


def _people() -> int:
    return db.session.scalar(sa.select(sa.func.count()).select_from(User))


def test_a_person_signs_in_through_the_provider_and_lands_in_their_chats(client, provider, admin, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True, name="Milo M")

    response = sign_in_through(client, provider, "milo-at-acme")

    assert response.status_code == 303 and response.headers["Location"] == "/chats/"
    page = client.get("/chats/")
    assert page.status_code == 200 and "Chats" in page.text
    milo = _person("milo@example.com")
    assert (milo.id, milo.oidc_subject, milo.oidc_issuer) == (member.id, "milo-at-acme", provider.issuer)
    assert milo.role == "member" and _people() == 2  # the same person, nobody new
    sessions = db.session.scalars(sa.select(UserSession).where(UserSession.user_id == milo.id)).all()
    assert len(sessions) == 1  # Cairn's own server-side sign-in, as with a password


def test_the_page_asked_for_before_signing_in_opens_afterwards(client, provider, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    callback = provider.authorize(start(client, next_path="/account"), "milo-at-acme")

    assert come_back(client, callback).headers["Location"] == "/account"


def test_an_unknown_email_of_an_allowed_domain_becomes_a_member(client, provider, admin):
    provider.person("sam-1", email="Sam@Example.com", email_verified=True, name="Sam Lee")

    assert sign_in_through(client, provider, "sam-1").status_code == 303

    sam = _person("sam@example.com")
    assert (sam.account_id, sam.role, sam.name, sam.oidc_subject) == (
        admin.account_id,
        "member",
        "Sam Lee",
        "sam-1",
    )
    assert not sam.has_password  # passwords are optional: an admin may still send a link to choose one
    assert client.get("/chats/").status_code == 200


def test_an_unknown_email_of_another_domain_is_refused_with_a_sentence(client, provider, admin):
    provider.person("eve-1", email="eve@elsewhere.example", email_verified=True)

    response = sign_in_through(client, provider, "eve-1")

    assert response.status_code == 403
    assert (
        "Nobody signs in here as eve@elsewhere.example, and new people from elsewhere.example are not let in"
        in (response.text)
    )
    assert _person("eve@elsewhere.example") is None and _people() == 1
    assert client.get("/chats/").status_code == 302  # not signed in


def test_an_unverified_email_is_refused_even_for_a_person_of_the_account(client, provider, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=False)

    response = sign_in_through(client, provider, "milo-at-acme")

    assert response.status_code == 403
    assert "Acme ID has not confirmed that milo@example.com is yours" in response.text
    assert _person("milo@example.com").oidc_subject is None


def test_a_removed_person_cannot_come_back_through_the_provider_until_restored(
    client, provider, admin, member
):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303
    member.remove(by=admin)
    db.session.commit()

    refused = sign_in_through(client, provider, "milo-at-acme")

    assert refused.status_code == 403 and "An admin removed you from Acme" in refused.text
    assert client.get("/chats/").status_code == 302
    _person("milo@example.com").restore()
    db.session.commit()
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303
    assert client.get("/chats/").status_code == 200


def test_a_removed_person_not_yet_linked_is_refused_by_email_too(client, provider, admin, member):
    member.remove(by=admin)
    db.session.commit()
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)

    assert sign_in_through(client, provider, "milo-at-acme").status_code == 403
    assert _person("milo@example.com").oidc_subject is None  # nothing changed


def test_a_person_whose_email_changed_at_the_provider_is_still_the_same_person(client, provider, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303
    client.post("/logout")
    provider.person("milo-at-acme", email="milo.marsh@example.com", email_verified=True)

    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303

    assert _person("milo.marsh@example.com").id == member.id and _people() == 1
    assert _person("milo@example.com") is None


def test_another_subject_cannot_take_over_a_linked_person_by_their_email(client, provider, member):
    provider.person("milo-at-acme", email="milo@example.com", email_verified=True)
    assert sign_in_through(client, provider, "milo-at-acme").status_code == 303
    client.post("/logout")
    provider.person("impostor", email="milo@example.com", email_verified=True)

    response = sign_in_through(client, provider, "impostor")

    assert response.status_code == 403 and "linked to another person at Acme ID" in response.text
    assert _person("milo@example.com").oidc_subject == "milo-at-acme"


def test_the_provider_decides_who_is_an_admin_when_the_operator_names_a_group(client, provider, admin):
    client.application.config.update(OIDC_ADMIN_GROUP="cairn-admins", OIDC_GROUPS_CLAIM="groups")
    provider.person("sam-1", email="sam@example.com", email_verified=True, groups=["staff", "cairn-admins"])

    assert sign_in_through(client, provider, "sam-1").status_code == 303
    assert _person("sam@example.com").role == "admin"
    client.post("/logout")
    provider.person("sam-1", email="sam@example.com", email_verified=True, groups=["staff"])
    assert sign_in_through(client, provider, "sam-1").status_code == 303
    assert _person("sam@example.com").role == "member"


def test_a_claim_naming_an_account_lets_its_people_in_there(client, provider, admin, stranger):
    client.application.config.update(OIDC_ACCOUNT_CLAIM="team", OIDC_ALLOWED_DOMAINS=[])
    provider.person("gil-1", email="gil@partner.example", email_verified=True, team="Globex")
    provider.person("hal-1", email="hal@partner.example", email_verified=True, team="Initech")

    assert sign_in_through(client, provider, "gil-1").status_code == 303
    assert _person("gil@partner.example").account_id == stranger.account_id
    client.post("/logout")
    assert sign_in_through(client, provider, "hal-1").status_code == 403  # no such account
    assert _person("hal@partner.example") is None


def test_with_several_accounts_newcomers_join_the_one_the_operator_names(client, provider, admin, stranger):
    provider.person("sam-1", email="sam@example.com", email_verified=True)

    refused = sign_in_through(client, provider, "sam-1")
    assert refused.status_code == 403 and "not set up yet to let new people in" in refused.text
    assert _person("sam@example.com") is None

    client.application.config["OIDC_ACCOUNT"] = "Globex"
    assert sign_in_through(client, provider, "sam-1").status_code == 303
    assert _person("sam@example.com").account_id == stranger.account_id
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Account)) == 2


def test_a_newcomer_named_like_an_agent_goes_by_their_email_s_local_part(client, provider, admin):
    factories.agent(admin.account, "Ada")
    provider.person("ada-1", email="ada.king@example.com", email_verified=True, name="ada")

    assert sign_in_through(client, provider, "ada-1").status_code == 303
    person = _person("ada.king@example.com")
    assert person.name is None and person.display_name == "ada.king"
