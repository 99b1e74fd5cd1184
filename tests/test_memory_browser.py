"""In a real browser: the memory ledger deletes and restores in place, refuses to delete a constitutional memory,
rolls back a refinement session, and follows a Run now click live until it is done."""

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.conftest import ARTIFACTS
from webapp.jobs.refinement import refine_agent

pytestmark = pytest.mark.browser


@pytest.fixture
def ada(live_app):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    return factories.agent(admin.account, "Ada", core_token_budget=200)


def _sign_in(page, live_server) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()


def test_delete_restore_and_roll_back_a_session(page, live_server, ada, fake_llm):
    vow = factories.memory(ada, "I am Ada, a patient gardener who never invents facts.", constitutional=True)
    roses = factories.memory(ada, "Dana grows old roses along the shady north wall.")
    cat = factories.memory(ada, "Dana's cat is called Pip and sleeps in the greenhouse.")
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "delete", "id": str(cat.id)})])
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "Dropped the cat."})])
    assert refine_agent(ada.id, True)["status"] == "complete"

    _sign_in(page, live_server)
    page.get_by_role("link", name="Agents").click()
    page.get_by_role("row", name="Ada").get_by_role("link", name="Memory").click()
    expect(page.get_by_role("heading", name="Ada · memory ledger")).to_be_visible()
    expect(page.locator(f"#memory-{cat.id}")).to_have_count(0)  # the session deleted it
    tokens = page.locator("#core-tokens .figure")
    before = tokens.inner_text()

    row = page.locator(f"#memory-{roses.id}")
    row.get_by_role("button", name="Delete").click()
    expect(row.locator(".badge.deleted")).to_be_visible()
    expect(tokens).not_to_have_text(before)  # the bar updated out of band
    row.get_by_role("button", name="Restore").click()
    expect(row.locator(".badge.deleted")).to_have_count(0)
    expect(tokens).to_have_text(before)

    page.locator(f"#memory-{vow.id}").get_by_role("button", name="Delete").click()
    expect(page.locator(f"#memory-{vow.id} .error")).to_have_text(
        f"Memory #{vow.id} is constitutional and cannot be deleted."
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "memory-ledger.png"), full_page=True)

    page.get_by_role("link", name="Refinement sessions").click()
    page.get_by_role("link", name="Open").click()
    expect(page.get_by_text("Summary: Dropped the cat.").first).to_be_visible()
    page.get_by_role("button", name="Roll back this session").click()
    expect(page.get_by_text("Rolled back: 2 changes undone.")).to_be_visible()
    expect(page.locator("#session .status")).to_have_text("rolled back")
    expect(page.get_by_role("button", name="Roll back this session")).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "memory-session-rolled-back.png"), full_page=True)

    page.get_by_role("link", name="Memory ledger").click()
    expect(page.locator(f"#memory-{cat.id}")).to_contain_text("Dana's cat is called Pip")
    expect(page.locator(f"#memory-{cat.id} .badge.deleted")).to_have_count(0)


def test_refine_now_shows_its_status_live(page, live_server, ada, worker_process, fake_llm):
    memory = factories.memory(ada, "Dana likes tea and biscuits in the afternoon, every single day.")
    fake_llm.reply(
        tool_calls=[
            (
                "refine_memory",
                {
                    "action": "update",
                    "id": str(memory.id),
                    "content": "Dana likes tea and biscuits every afternoon.",
                },
            )
        ]
    )
    fake_llm.reply(
        tool_calls=[("refine_memory", {"action": "complete", "summary": "Tightened the tea memory."})]
    )

    _sign_in(page, live_server)
    page.goto(f"{live_server}/admin/agents/{ada.id}/memories")
    page.get_by_role("button", name="Refine core memory now").click()

    status = page.locator("#run-refine")
    expect(status.locator(".status")).to_have_text("queued")
    expect(status.locator(".status")).to_have_text("done", timeout=30_000)
    expect(status).to_contain_text("Tightened the tea memory.")
    expect(status).to_contain_text("updated 1")
    page.reload()
    expect(page.locator(f"#memory-{memory.id} .content")).to_have_text(
        "Dana likes tea and biscuits every afternoon."
    )
