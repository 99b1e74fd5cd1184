"""In a real browser: sign in, create an agent and a group chat, send a message, ask the agent, watch it stream."""

from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests import factories

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


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
    page.get_by_label("Model").fill("ada-model")
    page.get_by_label("save_memory", exact=False).check()
    page.get_by_role("button", name="Save agent").click()
    expect(page.get_by_role("cell", name="Ada", exact=True)).to_be_visible()

    page.get_by_role("link", name="Chats").click()
    page.get_by_role("link", name="New chat").click()
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
