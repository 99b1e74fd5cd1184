"""Whose chat it is, in a real browser on a desktop and on a phone: a member makes her chat shared and private
again with the switch in its header, adds a person with the picker and takes them out; the lists mark private
and shared chats; another member's view lacks her private chat. axe-core on every page visited; the header
must not push the page sideways on a phone."""

import shutil

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.conftest import ARTIFACTS
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db

pytestmark = pytest.mark.browser

TITLE = "Ayla notes 4417"


def _sign_in(page: Page, live_server: str, email: str) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()


def _keep(page: Page, viewport: str, name: str) -> None:
    """The page's screenshot, also in /tmp for a look at it."""
    check_page(page, viewport, name)
    shutil.copy(ARTIFACTS / f"first-hour-{viewport}-{name}.png", f"/tmp/chat-access-{viewport}-{name}.png")


def test_the_switch_the_picker_the_marks_and_another_members_view(page, size, browser, live_server):  # noqa: F811
    acme = factories.account("Acme")
    factories.user(acme, "dana@example.com", "admin")
    milo = factories.user(acme, "milo@example.com", "member")
    milo.name = "Milo Marsh"
    sam = factories.user(acme, "sam@example.com", "member")
    sam.name = "Sam Lee"
    ada = factories.agent(acme, "Ada")
    mine = factories.chat(acme, [ada], TITLE, people=[milo])
    factories.message(mine, "my locker code is PLUM-7731", author=milo)
    factories.message(factories.chat(acme, [ada], "Garden club"), "Shade beds?", author=sam)
    mine_id = mine.id
    db.session.commit()
    db.session.remove()

    # Milo's list marks her chat private and the garden club shared, in words as well as icons.
    _sign_in(page, live_server, "milo@example.com")
    listed = page.locator("#chat-list li", has_text=TITLE)
    expect(listed.locator(".visibility-mark.private")).to_have_text("Only its people")
    expect(page.locator("#chat-list li", has_text="Garden club").locator(".visibility-mark")).to_have_text(
        "Everyone in Acme"
    )
    _keep(page, size, "access-01-list")

    # The header: the switch shows private pressed; the people are Milo alone.
    tap(listed.get_by_role("link"))
    switch = page.get_by_role("group", name="Who can read this chat")
    only_its_people, everyone = (
        switch.get_by_role("button", name=n) for n in ("Only its people", "Everyone in Acme")
    )
    expect(only_its_people).to_have_attribute("aria-pressed", "true")
    expect(everyone).to_have_attribute("aria-pressed", "false")
    if size == "desktop":  # the list beside the chat says it in words too, not only with the icon
        side = page.locator("#side-list")
        expect(side.locator("li", has_text=TITLE).locator(".visibility-mark.private")).to_be_visible()
        expect(side.locator("li", has_text=TITLE).locator(".visibility-mark.private")).to_have_text(
            "Only its people"
        )
        expect(side.locator("li", has_text="Garden club").locator(".visibility-mark.shared")).to_have_text(
            "Everyone in Acme"
        )
    _keep(page, size, "access-02-private-chat")

    tap(everyone)
    expect(page.locator(".flash")).to_contain_text("Everyone in Acme can read this chat now.")
    expect(everyone).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#messages")).to_contain_text("Milo Marsh opened this chat to everyone in Acme.")
    tap(only_its_people)
    expect(page.locator(".flash")).to_contain_text("Only this chat's people can read it now.")
    expect(only_its_people).to_have_attribute("aria-pressed", "true")

    # The picker: add Sam, then take him out again.
    people = page.locator(".people-picker")
    tap(people.locator("summary"))
    expect(people).to_contain_text("Only these people can read this chat.")
    expect(people.locator("li", has_text="Milo Marsh")).to_contain_text("(you) · started it")
    _keep(page, size, "access-03-people-open")
    people.get_by_label("Add a person").select_option(label="Sam Lee")
    tap(people.get_by_role("button", name="Add", exact=True))
    expect(page.locator(".flash")).to_contain_text("Sam Lee can read this chat now.")
    tap(people.locator("summary"))
    expect(people.locator("li", has_text="Sam Lee")).to_be_visible()
    expect(people.get_by_role("button", name="Take out Milo Marsh")).to_have_count(0)  # she started it
    _keep(page, size, "access-04-sam-added")
    tap(people.get_by_role("button", name="Take out Sam Lee"))
    expect(page.locator(".flash")).to_contain_text("Sam Lee is no longer one of this chat's people.")
    expect(people.locator("li", has_text="Sam Lee")).to_have_count(0)

    # Sam's view: the garden club, marked shared; no trace of Milo's private chat; its address is not found.
    other = browser.new_context(viewport=page.viewport_size)
    try:
        sams = other.new_page()
        _sign_in(sams, live_server, "sam@example.com")
        expect(sams.locator("#chat-list")).to_contain_text("Garden club")
        expect(sams.locator("#chat-list")).not_to_contain_text(TITLE)
        _keep(sams, size, "access-05-another-members-list")
        assert sams.goto(f"{live_server}/chats/{mine_id}").status == 404
        assert "PLUM-7731" not in sams.content()
    finally:
        other.close()
