"""Error pages in a real browser, on a desktop and on a phone (issue 32.1): a member who follows an old link to a
chat she was taken out of reads why, in the app's layout, and goes back to her chats; an admin's page, an address
that leads nowhere and a failure on Cairn's side look the same way; a message sent to a chat she can no longer
read gets a notice above the chat, not a page. axe-core finds no violation of any impact on these pages."""

import shutil

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.conftest import ARTIFACTS
from tests.test_first_hour_browser import AXE, check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.models import ChatPerson
from webapp.web.errors import NO_CHAT

pytestmark = pytest.mark.browser


def sign_in(page: Page, live_server: str, email: str) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()


def look(page: Page, viewport: str, name: str) -> None:
    """No axe violation of any impact (check_page asks for serious and critical ones), no sideways scroll, and a
    screenshot (test-artifacts/errors-..., a copy in /tmp)."""
    check_page(page, viewport, name, prefix="errors")
    violations = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
            .map(v => `${v.id}: ${v.help} (${v.nodes.map(n => n.target.join(" ")).join(", ")})`)"""
    )
    assert violations == [], f"{name}: {violations}"
    shutil.copy(ARTIFACTS / f"errors-{viewport}-{name}.png", f"/tmp/errors-{viewport}-{name}.png")


def an_error_page(page: Page, heading: str, sentence: str) -> None:
    expect(page.get_by_role("heading", level=1)).to_have_text(heading)
    expect(page.get_by_role("main")).to_contain_text(sentence)
    expect(page.get_by_role("link", name="Skip to content")).to_be_attached()
    if page.viewport_size["width"] > 800:
        expect(page.get_by_role("navigation").get_by_role("link", name="Chats", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="Back to your chats")).to_be_visible()


def test_a_member_taken_out_of_a_chat_reads_why_and_finds_her_way_back(page, size, live_app, live_server):  # noqa: F811
    acme = factories.account("Acme")
    factories.user(acme, "dana@example.com", "admin")
    milo = factories.user(acme, "milo@example.com", "member")
    sam = factories.user(acme, "sam@example.com", "member")
    ada = factories.agent(acme, "Ada")
    plans = factories.chat(acme, [ada], "Sam's plans", people=[sam, milo])
    factories.message(plans, "the code is PLUM-7731", author=sam)
    plans_id, milo_id = plans.id, milo.id
    db.session.commit()
    db.session.remove()

    # In the chat, she writes; meanwhile Sam takes her out. Sending gets a notice above the chat, not a page.
    sign_in(page, live_server, "milo@example.com")
    page.goto(f"{live_server}/chats/{plans_id}")
    db.session.delete(db.session.get(ChatPerson, (plans_id, milo_id)))
    db.session.commit()
    page.get_by_label("Message").fill("Shall we meet on Friday?")
    tap(page.get_by_role("button", name="Send"))
    notice = page.locator("#notice")
    expect(notice).to_be_visible()
    expect(notice).to_have_text(NO_CHAT)
    expect(page.get_by_role("heading", name="Sam's plans")).to_be_visible()  # still the page she was on
    look(page, size, "01-notice-in-the-chat")

    # Her old link to it: the app's page, her navigation, a sentence, a way back; nothing of the chat.
    assert page.goto(f"{live_server}/chats/{plans_id}").status == 404
    an_error_page(page, "Not found", NO_CHAT)
    assert "PLUM-7731" not in page.content() and "Sam's plans" not in page.content()
    look(page, size, "02-chat-not-found")
    tap(page.get_by_role("link", name="Back to your chats"))
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()

    # An address that leads nowhere, and an admin's page.
    assert page.goto(f"{live_server}/no/such/page").status == 404
    an_error_page(page, "Not found", "There is nothing at this address, or it is not yours to see.")
    look(page, size, "03-nowhere")
    assert page.goto(f"{live_server}/people").status == 403
    an_error_page(page, "Not yours to do", "This is for an admin of your account; ask one of them.")
    look(page, size, "04-for-admins")


def test_a_failure_on_cairns_side_is_a_page_in_the_layout(page, size, live_app, live_server, monkeypatch):  # noqa: F811
    acme = factories.account("Acme")
    factories.user(acme, "dana@example.com", "admin")
    db.session.commit()
    db.session.remove()

    def broken():
        raise RuntimeError("a bug")

    live_app.config["PROPAGATE_EXCEPTIONS"] = False  # as in production
    monkeypatch.setitem(live_app.view_functions, "chats.new", broken)

    sign_in(page, live_server, "dana@example.com")
    assert page.goto(f"{live_server}/chats/new").status == 500
    an_error_page(page, "Something went wrong", "Something failed on Cairn's side, not yours")
    look(page, size, "05-server-error")
