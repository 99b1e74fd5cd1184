"""The people of an account: an admin adds them (with a password or a sign-in link), changes their role and
removes them (signed out at once, unable to sign in, their chats kept); members see only their names."""

import html
import re
from urllib.parse import parse_qs, unquote

import pytest
import sqlalchemy as sa
from sqlalchemy.orm.attributes import set_committed_value

from tests import factories
from tests.conftest import Auth
from tests.test_sessions import Browser
from webapp.extensions import db
from webapp.models import Chat, User
from webapp.models.accounts import PersonChangeRefused, PersonName
from webapp.timeutil import utcnow

NEW_PASSWORD = "lantern orchard pebble"


@pytest.fixture(autouse=True)
def _browsers(app):
    """Each request in an app context of its own, so a sign-in is loaded from its cookies every time."""
    app.test_client_class = Browser


def _person(email: str) -> User:
    db.session.expire_all()
    return db.session.scalar(sa.select(User).where(User.email == email))


def _sign_in(client, email: str, password: str = factories.PASSWORD):
    return client.post("/login", data={"email": email, "password": password})


def _page_of(html: str, email: str) -> str:
    """A sign-in page as a person sees it, whoever's e-mail it holds (its CSRF tokens differ each time)."""
    return re.sub(r'(csrf_token" type="hidden" value=|"X-CSRFToken": )"[^"]+"', "", html.replace(email, ""))


def _link(page: str) -> str:
    return re.search(r'id="sign-in-link"[^>]*>[^<]*(/welcome/[^<]+)</textarea>', page).group(1)


def test_the_people_page_lists_everyone_of_the_account_and_no_one_else(client, auth, admin, member, stranger):
    auth.login(admin)

    page = client.get("/people/")

    assert page.status_code == 200
    assert "dana@example.com" in page.text and "milo@example.com" in page.text
    assert "eve@globex.example" not in page.text
    assert 'href="/people/"' in page.text  # the admin's navigation links it


def test_an_admin_adds_a_member_with_a_password_who_can_then_sign_in(app, client, auth, admin):
    auth.login(admin)

    added = client.post(
        "/people/new",
        data={"name": "Sam Lee", "email": " Sam@Example.com ", "role": "member", "password": NEW_PASSWORD},
    )

    assert (added.status_code, added.headers["Location"]) == (303, "/people/")
    sam = _person("sam@example.com")
    assert (sam.account_id, sam.role, sam.display_name) == (admin.account_id, "member", "Sam Lee")
    other = app.test_client()
    assert _sign_in(other, "sam@example.com", NEW_PASSWORD).status_code == 303
    assert other.get("/chats/").status_code == 200
    assert other.get("/people/").status_code == 403


def test_a_new_person_s_password_follows_the_password_rules_and_the_e_mail_is_unique(client, auth, admin):
    auth.login(admin)

    weak = client.post(
        "/people/new", data={"email": "sam@example.com", "role": "member", "password": "password1"}
    )
    taken = client.post(
        "/people/new", data={"email": "DANA@example.com", "role": "member", "password": NEW_PASSWORD}
    )
    no_role = client.post(
        "/people/new", data={"email": "sam@example.com", "role": "owner", "password": NEW_PASSWORD}
    )

    assert weak.status_code == 422 and "too easy to guess" in weak.text
    assert taken.status_code == 422 and "Someone already signs in with this e-mail." in taken.text
    assert no_role.status_code == 422
    assert _person("sam@example.com") is None


def test_a_sign_in_link_lets_the_new_person_choose_a_password_once(app, client, auth, admin):
    auth.login(admin)

    shown = client.post("/people/new", data={"name": "Sam", "email": "sam@example.com", "role": "admin"})

    assert shown.status_code == 200 and shown.headers["Cache-Control"] == "no-store"
    link = _link(shown.text)
    sam = _person("sam@example.com")
    assert not sam.has_password and sam.role == "admin"
    assert client.get("/people/").text.count("invited") == 1
    # No password signs in before one is chosen, not even the text stored in its place.
    newcomer = app.test_client()
    assert _sign_in(newcomer, "sam@example.com", sam.password_hash).status_code == 422

    form = newcomer.get(link)
    assert form.status_code == 200 and "Welcome, Sam" in form.text
    assert form.headers["Referrer-Policy"] == "no-referrer"
    weak = newcomer.post(link, data={"password": "sam12345", "confirm": "sam12345"})
    assert weak.status_code == 422
    chosen = newcomer.post(link, data={"password": NEW_PASSWORD, "confirm": NEW_PASSWORD})
    assert (chosen.status_code, chosen.headers["Location"]) == (303, "/chats/")
    assert newcomer.get("/people/").status_code == 200  # signed in, as an admin

    assert app.test_client().get(link).status_code == 404  # used: it works once
    assert _sign_in(app.test_client(), "sam@example.com", NEW_PASSWORD).status_code == 303


def test_a_sign_in_link_can_be_copied_or_sent_by_e_mail(client, auth, admin):
    admin.name = "Dana Reyes"
    db.session.commit()
    auth.login(admin)

    shown = client.post(
        "/people/new", data={"name": "Sam Lee", "email": "sam+cairn@example.com", "role": "member"}
    )

    link = _link(shown.text)
    assert 'data-copy="#sign-in-link"' in shown.text and "data-select-on-focus" in shown.text
    mailto = html.unescape(
        re.search(r'<a class="button" href="(mailto:[^"]+)">E-mail it to Sam Lee</a>', shown.text).group(1)
    )
    address, _, query = mailto.removeprefix("mailto:").partition("?")
    fields = parse_qs(query)
    assert unquote(address) == "sam+cairn@example.com" and "+" not in address
    assert fields["subject"] == ["Your sign-in link for Acme on Cairn"]
    body = fields["body"][0]
    assert body.startswith("Hello Sam Lee,\r\n\r\nDana Reyes added you to Acme on Cairn.")
    assert f"\r\n{link}\r\n" in body.replace("http://localhost", "")
    assert "It works once, within 7 days. From then on you sign in as sam+cairn@example.com" in body


def test_a_new_sign_in_link_voids_the_earlier_one_and_none_is_made_for_a_password(
    app, client, auth, admin, member
):
    auth.login(admin)
    first = _link(client.post("/people/new", data={"email": "sam@example.com", "role": "member"}).text)
    sam = _person("sam@example.com")

    second = _link(client.post(f"/people/{sam.id}/link").text)

    assert app.test_client().get(first).status_code == 404
    assert app.test_client().get(second).status_code == 200
    assert client.post(f"/people/{member.id}/link").status_code == 409  # an admin cannot take over a member
    assert app.test_client().get("/welcome/not-a-token").status_code == 404


def test_a_removed_person_s_link_stops_working(app, client, auth, admin):
    auth.login(admin)
    link = _link(client.post("/people/new", data={"email": "sam@example.com", "role": "member"}).text)

    client.post(f"/people/{_person('sam@example.com').id}/remove")

    newcomer = app.test_client()
    assert newcomer.get(link).status_code == 404
    assert newcomer.post(link, data={"password": NEW_PASSWORD, "confirm": NEW_PASSWORD}).status_code == 404


def test_members_get_403_on_every_people_page(client, auth, admin, member):
    auth.login(member)

    assert client.get("/people/").status_code == 403
    assert client.get("/people/new").status_code == 403
    assert client.post("/people/new", data={"email": "x@example.com", "role": "admin"}).status_code == 403
    assert client.post(f"/people/{admin.id}/role", data={"role": "member"}).status_code == 403
    assert client.get(f"/people/{admin.id}/remove").status_code == 403
    assert client.post(f"/people/{admin.id}/remove").status_code == 403
    assert client.post(f"/people/{admin.id}/restore").status_code == 403
    assert 'href="/people/"' not in client.get("/chats/").text
    assert _person(admin.email).role == "admin" and _person("x@example.com") is None


def test_an_admin_changes_a_role_both_ways(client, auth, admin, member):
    auth.login(admin)

    promoted = client.post(f"/people/{member.id}/role", data={"role": "admin"})
    assert promoted.status_code == 303 and _person(member.email).role == "admin"

    demoted = client.post(f"/people/{member.id}/role", data={"role": "member"})
    assert demoted.status_code == 303 and _person(member.email).role == "member"
    assert client.post(f"/people/{member.id}/role", data={"role": "owner"}).status_code == 409


def test_an_admin_can_neither_demote_nor_remove_themselves(client, auth, admin, member):
    member.change_role("admin", by=None)
    db.session.commit()
    auth.login(admin)

    demoted = client.post(f"/people/{admin.id}/role", data={"role": "member"})
    removed = client.post(f"/people/{admin.id}/remove")

    assert demoted.status_code == 409 and "You cannot change your own role" in demoted.text
    assert removed.status_code == 409 and "You cannot remove yourself" in removed.text
    me = _person(admin.email)
    assert (me.role, me.removed_at) == ("admin", None)


def test_the_account_keeps_an_admin(admin, member):
    with pytest.raises(PersonChangeRefused, match="only admin"):
        admin.change_role("member", by=None)
    with pytest.raises(PersonChangeRefused, match="only admin"):
        admin.remove(by=None)

    member.change_role("admin", by=admin)
    admin.change_role("member", by=member)  # another admin remains
    db.session.commit()
    with pytest.raises(PersonChangeRefused, match="only admin"):
        member.remove(by=None)


def test_a_removed_admin_does_not_count_as_the_account_s_admin(admin, member):
    other = factories.user(admin.account, "ola@example.com", "admin")
    other.remove(by=admin)
    db.session.commit()

    with pytest.raises(PersonChangeRefused, match="only admin"):
        admin.change_role("member", by=None)


def test_removing_a_person_ends_their_live_session_at_once_and_they_cannot_sign_in(
    app, client, auth, admin, member
):
    acct = admin.account
    chat = factories.chat(acct, [factories.agent(acct)], title="Milo's notes", people=[member])
    milo = app.test_client()
    Auth(milo).login(member)
    assert milo.get("/chats/").status_code == 200
    auth.login(admin)

    assert client.get(f"/people/{member.id}/remove").status_code == 200  # asks first
    assert _person(member.email).removed_at is None
    removed = client.post(f"/people/{member.id}/remove")

    assert removed.status_code == 303
    assert milo.get("/chats/").status_code == 302  # their very next request is signed out
    refused = _sign_in(app.test_client(), member.email)
    wrong = _sign_in(app.test_client(), admin.email, "not the password")
    assert refused.status_code == wrong.status_code == 422
    assert _page_of(refused.text, member.email) == _page_of(wrong.text, admin.email)  # it says nothing more
    assert db.session.get(Chat, chat.id).title == "Milo's notes"  # their chats are kept
    assert "removed" in client.get("/people/").text


def test_a_removed_person_s_sign_in_is_refused_by_the_loader_too(admin, member):
    """Whatever ended (or failed to end) their sign-ins, a removed person's session loads nobody."""
    member.start_session()
    token = member.session_token
    db.session.commit()
    assert User.for_session(token) is member

    member.removed_at = utcnow()
    db.session.commit()

    assert User.for_session(token) is None


def test_a_restored_person_signs_in_again(app, client, auth, admin, member):
    auth.login(admin)
    client.post(f"/people/{member.id}/remove")

    restored = client.post(f"/people/{member.id}/restore")

    assert restored.status_code == 303 and _person(member.email).removed_at is None
    assert _sign_in(app.test_client(), member.email).status_code == 303


def test_another_account_s_person_is_a_404(client, auth, admin, stranger):
    auth.login(admin)

    assert client.post(f"/people/{stranger.id}/role", data={"role": "member"}).status_code == 404
    assert client.get(f"/people/{stranger.id}/remove").status_code == 404
    assert client.post(f"/people/{stranger.id}/remove").status_code == 404
    assert client.post(f"/people/{stranger.id}/restore").status_code == 404
    assert client.post(f"/people/{stranger.id}/link").status_code == 404
    assert client.post("/people/987654/remove").status_code == 404
    assert client.post("/people/99999999999999999999/remove").status_code == 404
    eve = _person(stranger.email)
    assert (eve.role, eve.removed_at) == ("admin", None)


def test_names_are_escaped(client, auth, admin):
    auth.login(admin)
    client.post(
        "/people/new",
        data={
            "name": "<script>alert(1)</script>",
            "email": "sam@example.com",
            "role": "member",
            "password": NEW_PASSWORD,
        },
    )

    page = client.get("/people/").text

    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_people_forms_need_the_csrf_token(app, client, auth, admin, member):
    auth.login(admin)
    app.config["WTF_CSRF_ENABLED"] = True

    assert client.post(f"/people/{member.id}/remove").status_code == 400
    assert client.post(f"/people/{member.id}/role", data={"role": "admin"}).status_code == 400
    assert client.post("/people/new", data={"email": "x@example.com", "role": "member"}).status_code == 400
    assert _person(member.email).removed_at is None and _person(member.email).role == "member"


def test_members_learn_only_the_names_of_the_account_s_active_people(admin, member, stranger):
    factories.user(admin.account, "ola@example.com", "member").remove(by=admin)
    member.name = "Milo M."
    db.session.commit()

    names = admin.account.people_names()

    assert names == [PersonName(admin.id, "dana"), PersonName(member.id, "Milo M.")]
    assert all(set(person._fields) == {"id", "name"} for person in names)


def test_the_command_line_lists_and_removes_people(runner, admin, member):
    listed = runner.invoke(args=["users", "list"])
    assert "dana@example.com" in listed.output and "milo@example.com" in listed.output

    removed = runner.invoke(args=["users", "remove", "MILO@example.com"])
    assert removed.exit_code == 0, removed.output
    assert _person(member.email).removed_at is not None
    assert "removed" in runner.invoke(args=["users", "list"]).output

    last = runner.invoke(args=["users", "remove", "dana@example.com"])
    assert last.exit_code != 0 and "only admin" in last.output
    assert runner.invoke(args=["users", "remove", "nobody@example.com"]).exit_code != 0


def test_failed_attempts_on_sign_in_links_are_limited_like_sign_ins(app, client):
    app.config["RATE_LIMIT_LOGIN_PER_ADDRESS"] = "2 per minute"
    form = {"password": NEW_PASSWORD, "confirm": NEW_PASSWORD}

    answers = [client.post("/welcome/not-a-token", data=form).status_code for _ in range(3)]

    assert answers == [404, 404, 429]
    assert "Too many failed attempts." in client.post("/welcome/not-a-token", data=form).text


def test_one_sign_in_link_used_twice_at_once_sets_one_password(admin):
    sam = factories.user(admin.account, "sam@example.com", "member")
    sam.password_hash = "!"
    token = sam.invite()
    db.session.commit()
    read_by_both, sam_id = User.for_invite(token).password_hash, sam.id

    assert sam.accept_invite(NEW_PASSWORD)
    db.session.commit()
    # The second request had read the person before the first one committed.
    db.session.expunge_all()
    late = db.session.get(User, sam_id)
    set_committed_value(late, "password_hash", read_by_both)

    assert not late.accept_invite("another fine passphrase")
    assert late.check_password(NEW_PASSWORD)


@pytest.mark.parametrize("change", ["demote", "remove"])
def test_two_admins_taking_each_other_away_at_once_leave_the_account_an_admin(app, admin, change):
    """Each admin, in a session of its own, demotes (or removes) the other at the same moment, ten times over:
    one of them wins each time, never both (on SQLite as on PostgreSQL)."""
    import threading

    from webapp.models import User

    other = factories.user(admin.account, "ola@example.com", "admin")
    ids = (admin.id, other.id)
    for _ in range(10):
        db.session.execute(sa.update(User).where(User.id.in_(ids)).values(role="admin", removed_at=None))
        db.session.commit()
        start = threading.Barrier(2)

        def take_away(actor_id: int, target_id: int, start: threading.Barrier = start) -> None:
            with app.app_context():
                actor, target = db.session.get(User, actor_id), db.session.get(User, target_id)
                start.wait()
                try:
                    target.change_role("member", by=actor) if change == "demote" else target.remove(by=actor)
                    db.session.commit()
                except PersonChangeRefused:
                    db.session.rollback()
                finally:
                    db.session.remove()

        threads = [threading.Thread(target=take_away, args=pair) for pair in (ids, ids[::-1])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        db.session.expire_all()
        admins = db.session.scalars(
            sa.select(User.id).where(User.id.in_(ids), User.role == "admin", User.removed_at.is_(None))
        ).all()
        assert len(admins) == 1, f"{len(admins)} admins left"
