"""Connecting a provider in a real browser, on a desktop and on a phone (issue 30): the first page says the agents
run on the tiny bundled model, the admin adds a connection and tests it, picks its model for an agent, and the
agent answers from that provider through a real worker. axe-core on every page visited."""

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests import factories
from tests.fake_llm import FakeLLM
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.models import LlmCall

pytestmark = pytest.mark.browser
KEY = "sk-browser-test-key-0123456789"


@pytest.fixture
def provider():
    server = FakeLLM()
    server.models = [{"id": "gpt-4o-mini", "context_length": 128000}]
    yield server
    server.close()


def test_an_admin_connects_a_provider_and_an_agent_answers_from_it(
    page,
    size,  # noqa: F811
    live_server,
    worker_process,
    provider,
    fake_llm,  # noqa: F811
):
    admin = factories.user(factories.account("Acme"), "dana@example.com", "admin")
    factories.agent(admin.account, "Ada", system_prompt="You are Ada.")
    db.session.remove()

    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    notice = page.locator("#bundled-model-notice")
    expect(notice).to_contain_text("Ada runs on the tiny model bundled with Cairn")
    check_page(page, size, "01-bundled-notice", prefix="connections")

    tap(notice.get_by_role("link", name="Connect a model"))
    expect(page.get_by_role("heading", name="Connections", level=1)).to_be_visible()
    page.get_by_label("Name", exact=True).fill("My provider")
    page.get_by_label("Address").fill(provider.base_url)
    page.get_by_label("API key").fill(KEY)
    check_page(page, size, "02-add", prefix="connections")
    tap(page.get_by_role("button", name="Add and list its models"))
    expect(page.locator(".flash")).to_contain_text("My provider is added. It lists 1 model.")
    card = page.locator("section.connection", has_text="My provider")
    expect(card).to_contain_text("•••• 6789")
    assert KEY not in page.content()

    provider.reply("OK")
    tap(card.get_by_role("button", name="Test My provider"))
    expect(page.locator(".test-result")).to_contain_text("gpt-4o-mini answered.")
    check_page(page, size, "03-tested", prefix="connections")

    page.goto(f"{live_server}/agents/")
    page.get_by_role("link", name="Edit").first.click()  # (its tap target is issue 32's)
    page.wait_for_load_state()  # the page's script listens for the picker's change (a loaded machine is slow)
    expect(page.get_by_label("Or type a model id")).to_have_value("ada-model")  # not listed by any connection
    page.get_by_label("Model", exact=True).select_option(label="gpt-4o-mini")
    expect(page.get_by_label("Or type a model id")).to_have_value("")  # no longer looks as if it applied
    check_page(page, size, "04-pick", prefix="connections")
    tap(page.get_by_role("button", name="Save agent"))

    page.goto(f"{live_server}/chats/new")
    tap(page.get_by_role("button", name="Start chat"))
    provider.reply("Hello from your provider.", model="gpt-4o-mini")
    page.get_by_label("Message", exact=True).fill("Hi Ada")
    tap(page.get_by_role("button", name="Send"))
    expect(page.locator(".message.assistant").last).to_contain_text(
        "Hello from your provider.", timeout=30_000
    )
    check_page(page, size, "05-answered", prefix="connections")
    assert provider.headers[-1]["authorization"] == f"Bearer {KEY}"
    # the test and the reply went to the provider (and the reply's summary, on the agent's model, may follow);
    # nothing went to the environment's model
    calls = db.session.execute(
        sa.select(LlmCall.purpose, LlmCall.model)
        .where(LlmCall.purpose.in_(["check", "reply"]))
        .order_by(LlmCall.id)
    ).all()
    assert [tuple(c) for c in calls] == [("check", "gpt-4o-mini"), ("reply", "gpt-4o-mini")]
    assert {r["model"] for r in provider.requests} == {"gpt-4o-mini"} and fake_llm.requests == []
    page.goto(f"{live_server}/chats/")
    expect(page.locator("#bundled-model-notice")).to_have_count(0)
