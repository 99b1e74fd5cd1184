"""In a real browser: sign in, create an agent and a group chat, send a message, ask the agent, watch it stream."""

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.browser


def test_a_group_chat_reply_streams_into_the_page(page, live_server, worker_process, fake_llm):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    factories.agent(admin.account, "Basil")

    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(admin.email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()

    page.get_by_role("link", name="Agents").click()
    page.get_by_role("link", name="New agent").click()
    page.get_by_label("Name").fill("Ada")
    page.get_by_label("System prompt").fill("You are Ada, a gardener.")
    page.get_by_label("Or type a model id").fill("ada-model")
    expect(page.get_by_label("Remember things", exact=False)).to_be_checked()  # memory is on by default
    page.get_by_role("button", name="Save agent").click()
    expect(page.get_by_role("heading", name="New chat")).to_be_visible()  # the next step after a new agent
    page.get_by_label("Title").fill("Garden club")
    page.get_by_label("Ada").check()
    page.get_by_label("Basil").check()
    page.get_by_role("button", name="Start chat").click()
    expect(page.get_by_role("button", name="Ask all")).to_be_visible()

    composer = page.get_by_label("Message")
    composer.fill("Which roses do well in shade?")
    composer.press("Enter")
    expect(page.locator("article.message.user")).to_contain_text("Which roses do well in shade?")
    expect(composer).to_have_value("")

    fake_llm.chunk_delay = 0.15
    fake_llm.reply("Try Albéric Barbier and Madame Alfred Carrière; both forgive a shady wall.")
    page.get_by_role("button", name="Ask Ada").click()

    reply = page.locator("article.message.assistant").last
    expect(reply).to_contain_text("Ada is thinking")
    expect(reply.locator(".body.streaming")).to_contain_text("Albéric")  # part of the answer, still arriving
    expect(page.locator("article.message.assistant.done")).to_contain_text("both forgive a shady wall.")
    expect(page.locator("article.message.assistant.done")).not_to_contain_text("thinking")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "group-chat-streamed-reply.png"), full_page=True)
    # Replies stream; the summary jobs (spec 003) that follow them do not.
    assert [r["model"] for r in fake_llm.requests if r.get("stream")] == ["ada-model"]
