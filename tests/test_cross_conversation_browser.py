"""In a real browser: the chat page's panel of the agents' other conversations, kept live as the worker writes
summaries and stages borrowed context."""

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.conftest import ARTIFACTS
from webapp.extensions import db
from webapp.timeutil import utcnow

pytestmark = pytest.mark.browser


@pytest.fixture
def garden(live_app):
    """Ada in two chats of Dana's account: Roses (summarized a while ago) and Garden club (just started)."""
    live_app.config["CROSS_CONVERSATION_REFRESH_SECONDS"] = 1
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context"])
    roses = factories.chat(admin.account, [ada], "Roses")
    factories.message(roses, "The wall faces north.", author=admin)
    factories.message(roses, "Then a climber that forgives shade.", author=ada)
    factories.summary(
        roses, ada, "Choosing a climber for the north wall.", generated_at=utcnow() - timedelta(minutes=10)
    )
    club = factories.chat(admin.account, [ada], "Garden club")
    names = {"email": admin.email, "roses": roses.id, "roses_public": roses.public_id, "club": club.id}
    db.session.remove()  # the browser's requests and the worker need the database, not this test's session
    return names


def test_the_panel_shows_other_conversations_and_follows_the_worker(
    page,  # noqa: F811
    live_server,
    worker_process,
    fake_llm,
    garden,
):
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(garden["email"])
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()

    page.goto(f"{live_server}/chats/{garden['club']}")
    panel = page.locator("#cross-conversations")
    expect(panel.get_by_role("heading", name="Other conversations")).to_be_visible()
    expect(panel.get_by_role("link", name="Roses")).to_be_visible()
    expect(panel).to_contain_text("Choosing a climber for the north wall.")
    expect(panel).not_to_contain_text("borrowed context waiting")

    fake_llm.reply(tool_calls=[("borrow_context", {"conversation_id": garden["roses_public"]})])
    fake_llm.reply("I'll bring what we said about the north wall next time.")
    fake_llm.reply("Planning the club's shade beds.\nNext: pick roses from the Roses chat.")  # the summary
    composer = page.get_by_label("Message")
    composer.fill("What did we decide about roses?")
    composer.press("Enter")

    expect(page.locator("article.message.assistant.done")).to_contain_text("north wall next time")
    expect(panel).to_contain_text("borrowed context waiting")
    expect(panel).to_contain_text("2 messages for Ada's next reply here")
    expect(panel).to_contain_text("Planning the club's shade beds.")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "cross-conversation-panel.png"), full_page=True)

    panel.get_by_role("link", name="Roses").click()
    expect(page).to_have_url(f"{live_server}/chats/{garden['roses']}")
    other_panel = page.locator("#cross-conversations")
    expect(other_panel.get_by_role("link", name="Garden club")).to_be_visible()
    expect(other_panel).to_contain_text("Next: pick roses from the Roses chat.")
    assert [r["model"] for r in fake_llm.requests] == ["ada-model"] * 3
