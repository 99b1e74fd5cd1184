"""The people page in a real browser, on a desktop and on a phone: an admin adds a person with a sign-in link,
the person chooses a password with it, the admin makes them an admin, then removes them (after a confirmation
page), and the removed person's open page is signed out on its next load. axe-core on every page visited."""

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from tests.test_phone_browser import open_menu
from webapp.extensions import db

pytestmark = pytest.mark.browser


def test_an_admin_adds_promotes_and_removes_a_person(page, size, browser, live_server):  # noqa: F811
    admin = factories.user(factories.account("Acme"), "dana@example.com", "admin")
    factories.user(admin.account, "milo@example.com", "member").name = "Milo Marsh"
    db.session.commit()
    db.session.remove()

    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    open_menu(page)
    tap(page.get_by_role("link", name="People"))
    expect(page.get_by_role("heading", name="People", level=1)).to_be_visible()
    check_page(page, size, "people-01-list")

    tap(page.get_by_role("link", name="Add a person"))
    page.get_by_label("Name", exact=True).fill("Sam Lee")
    page.get_by_label("E-mail", exact=True).fill("sam@example.com")
    expect(page.get_by_label("Member", exact=False)).to_be_checked()
    check_page(page, size, "people-02-add")
    tap(page.get_by_role("button", name="Add person"))
    expect(page.get_by_role("heading", name="Sign-in link for Sam Lee")).to_be_visible()
    check_page(page, size, "people-03-link")
    link = page.get_by_label("Sign-in link").input_value()
    assert "/welcome/" in link

    newcomer = browser.new_context(viewport=page.viewport_size)
    try:
        sam = newcomer.new_page()
        sam.goto(link)
        expect(sam.get_by_role("heading", name="Welcome, Sam Lee")).to_be_visible()
        sam.get_by_label("Password", exact=True).fill("lantern orchard pebble")
        sam.get_by_label("Password again").fill("lantern orchard pebble")
        tap(sam.get_by_role("button", name="Choose password and sign in"))
        expect(sam.get_by_role("heading", name="Chats", level=1)).to_be_visible()
        expect(sam.get_by_role("link", name="People")).to_have_count(0)  # a member's navigation

        tap(page.get_by_role("link", name="Back to people"))
        row = page.locator("#people-list tbody tr", has_text="Sam Lee")
        expect(row).not_to_contain_text("invited")
        tap(row.get_by_role("button", name="Make Sam Lee an admin"))
        expect(page.locator(".flash")).to_contain_text("Sam Lee is now an admin.")
        expect(row).to_contain_text("Admin")

        tap(row.get_by_role("button", name="Remove Sam Lee"))
        expect(page.get_by_role("heading", name="Remove Sam Lee?")).to_be_visible()
        check_page(page, size, "people-04-remove")
        tap(page.get_by_role("button", name="Remove Sam Lee"))
        expect(page.locator(".flash")).to_contain_text("Sam Lee was removed")
        expect(row).to_contain_text("removed")
        expect(row.get_by_role("button", name="Restore Sam Lee")).to_be_visible()
        check_page(page, size, "people-05-removed")

        sam.reload()
        expect(sam.get_by_role("heading", name="Sign in")).to_be_visible()
    finally:
        newcomer.close()
