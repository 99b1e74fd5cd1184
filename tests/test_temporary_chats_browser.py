"""Issue 42.2 in a browser, on a desktop and a phone: a temporary chat is started from the new-chat form, says so
at its top and in the lists, follows the person's setting, and is deleted for good after a confirmation."""

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests import factories
from tests.test_first_hour_browser import ALL_IMPACTS, check_page, size, tap  # noqa: F401  (size: the viewport)
from tests.test_phone_browser import _sign_in, _small_targets
from webapp.extensions import db
from webapp.models import Chat, Message


@pytest.mark.browser
def test_a_temporary_chat_is_started_marked_and_deleted_for_good(
    page,
    size,  # noqa: F811 (the fixture)
    live_app,
    live_server,
):
    acme = factories.account("Acme")
    milo = factories.user(acme, "milo@example.com", "member")
    factories.agent(acme, "Ada")
    db.session.remove()
    _sign_in(page, live_server, "milo@example.com")

    page.goto(f"{live_server}/account/memories")
    page.get_by_label("Delete the temporary chats I start").select_option("7")
    tap(page.get_by_role("button", name="Save"))
    expect(page.get_by_role("status").first).to_contain_text(
        "deleted for good 7 days after their last message"
    )

    page.goto(f"{live_server}/chats/new")
    page.get_by_label("Title").fill("Just between us")
    tap(page.locator("label", has_text="Nothing from this chat is remembered"))
    expect(page.get_by_label("Nothing from this chat is remembered")).to_be_checked()
    check_page(page, size, "new", prefix="temporary", full_page=True, impacts=ALL_IMPACTS)
    tap(page.get_by_role("button", name="Start chat"))

    bar = page.locator(".temporary-bar")
    expect(bar).to_contain_text("Temporary chat. Nothing from it is remembered")
    expect(bar).to_contain_text("It is deleted for good 7 days after its last message.")
    check_page(page, size, "chat", prefix="temporary", full_page=True, impacts=ALL_IMPACTS)
    if size == "phone":
        assert _small_targets(page) == []
    chat = db.session.scalar(sa.select(Chat).where(Chat.title == "Just between us"))
    assert chat.remembers is False
    factories.message(chat, "My door code is 4471.", author=milo)
    chat_id = chat.id
    db.session.remove()

    page.goto(f"{live_server}/chats/")
    expect(page.locator("li", has_text="Just between us").locator(".temporary-word")).to_have_text(
        "· Temporary"
    )
    page.goto(f"{live_server}/chats/{chat_id}")
    page.once("dialog", lambda dialog: dialog.accept())
    tap(page.get_by_role("button", name="Delete for good"))

    expect(page.get_by_role("status").first).to_contain_text(
        "“Just between us” and all its messages are deleted"
    )
    expect(page.get_by_text("Just between us")).to_have_count(1)  # the notice only
    assert db.session.scalar(sa.select(sa.func.count()).where(Message.chat_id == chat_id)) == 0
