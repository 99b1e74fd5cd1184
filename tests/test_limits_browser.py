"""In a real browser: a rate-limited message and a refused sign-in say so on the page (htmx 2 would silently
drop a 429 unless told to swap it)."""

import pytest
from playwright.sync_api import expect

from tests import factories

pytestmark = pytest.mark.browser


def _sign_in(page, live_server, email: str, password: str) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_a_message_over_the_limit_shows_why_and_keeps_the_text(page, live_app, live_server):
    live_app.config["RATE_LIMIT_REPLIES"] = "1 per minute"
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])
    _sign_in(page, live_server, admin.email, factories.PASSWORD)
    page.goto(f"{live_server}/chats/{chat.id}")
    composer = page.get_by_label("Message")
    composer.fill("first")
    composer.press("Enter")
    expect(page.locator("article.message.user")).to_contain_text("first")

    composer.fill("second, too soon")
    composer.press("Enter")

    expect(page.get_by_role("alert")).to_contain_text("You are asking the agents too often. Try again in")
    expect(composer).to_have_value("second, too soon")
    expect(page.locator("article.message.user")).to_have_count(1)


def test_sign_in_after_too_many_failures_is_refused_with_a_reason(page, live_app, live_server):
    live_app.config["RATE_LIMIT_LOGIN_PER_ACCOUNT"] = "2 per 15 minutes"
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    for _ in range(2):
        _sign_in(page, live_server, admin.email, "wrong password")
        expect(page.get_by_text("That email and password do not match.")).to_be_visible()

    _sign_in(page, live_server, admin.email, factories.PASSWORD)

    expect(page.get_by_text("Too many failed sign-in attempts. Try again in 15 minutes.")).to_be_visible()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
