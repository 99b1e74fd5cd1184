"""Staged review in a real browser, on a desktop and on a phone: the pending count in the navigation leads to the
review page, each change shows as a diff, one form applies some changes and rejects the rest, and the ledger
draws the drift chart with the changes marked. axe-core on every page visited; screenshots kept."""

from datetime import timedelta

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from tests import factories
from tests.conftest import ARTIFACTS
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.jobs.refinement import refine_agent
from webapp.models import AgentMemory
from webapp.models.audit import record_change
from webapp.timeutil import utcnow

pytestmark = pytest.mark.browser


def look(page: Page, size: str, name: str) -> None:  # noqa: F811
    check_page(page, size, name, prefix="proposals", full_page=True)


def _past(agent, texts_and_days: list[tuple[str, int]]) -> None:
    """Memories the agent saved days ago (their audit rows dated then), for the chart to have a history."""
    for text, days in texts_and_days:
        memory = factories.memory(agent, text, created_at=utcnow() - timedelta(days=days))
        row = record_change(memory, "memory_create", None, via="tool")
        row.created_at = memory.created_at
    db.session.commit()
    old = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id)).all()[1]
    before = old.snapshot()
    old.soft_delete()
    row = record_change(old, "memory_refinement_delete", before, via="refinement", session_id="earlier")
    row.created_at = utcnow() - timedelta(days=20)
    db.session.commit()


def test_review_a_proposal_and_see_the_drift(page, size, live_app, live_server, fake_llm):  # noqa: F811
    live_app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada", core_token_budget=120, background_changes="staged")
    _past(ada, [("Dana lives in Ghent.", 80), ("Dana once kept bees.", 61), ("Dana's son is Milo.", 45)])
    roses = factories.memory(ada, "Dana grows old roses along the shady north wall of the garden.")
    climbers = factories.memory(ada, "Dana's roses on the north wall are climbers: Albéric Barbier mostly.")
    tea = factories.memory(ada, "Dana likes tea and biscuits in the afternoon, every single day of the week.")
    cat = factories.memory(ada, "Dana's cat is called Pip and sleeps in the greenhouse.")
    for call in (
        {
            "action": "consolidate",
            "ids": f"{roses.id},{climbers.id}",
            "content": "Dana grows climbing roses (mostly Albéric Barbier) along the shady north wall.",
        },
        {"action": "update", "id": str(tea.id), "content": "Dana has tea and biscuits every afternoon."},
        {"action": "delete", "id": str(cat.id)},
        {"action": "complete", "summary": "Merged the roses, tightened tea, dropped the cat."},
    ):
        fake_llm.reply(tool_calls=[("refine_memory", call)])
    assert refine_agent(ada.id, True)["proposed"] == 3
    roses, climbers, tea, cat = (m.id for m in (roses, climbers, tea, cat))
    db.session.remove()

    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    count = page.locator("#review-count")
    expect(count).to_have_text("1 to review")
    tap(count)

    expect(page.get_by_role("heading", name="Proposed changes · Ada")).to_be_visible()
    merge, rewrite, delete = page.locator("fieldset.change").all()
    expect(merge.locator("legend")).to_contain_text(f"Merge 2 memories (#{roses}, #{climbers}) into one")
    expect(merge.locator("del")).to_have_count(2)
    expect(merge.locator(".after ins")).to_contain_text("climbing roses")
    expect(rewrite.locator(".diff del").first).to_have_text("likes")
    expect(rewrite.locator(".diff ins").first).to_have_text("has")
    expect(delete.locator("del")).to_contain_text("Pip")
    expect(page.locator(".proposal-figures")).to_contain_text("Budget")
    look(page, size, "01-review")

    tap(delete.locator("label.apply"))
    expect(delete.get_by_label("Apply this change")).not_to_be_checked()
    tap(page.get_by_role("button", name="Apply ticked changes, reject the rest"))
    expect(page.locator(".flash")).to_have_text("Decided: 2 applied, 1 rejected.")
    expect(page.locator("fieldset.change .status")).to_have_text(["applied", "applied", "rejected"])
    expect(page.locator("#review-count")).to_have_count(0)
    look(page, size, "02-decided")

    tap(page.get_by_role("link", name="Memory ledger"))
    expect(page.get_by_role("heading", name="Ada · memory ledger")).to_be_visible()
    chart = page.locator("svg.drift-chart")
    expect(chart).to_be_visible()
    expect(chart.locator("g.mark.merged")).to_have_count(1)
    expect(chart.locator("g.mark.rewritten")).to_have_count(1)
    expect(page.locator(".drift-legend")).to_contain_text("merged")
    expect(page.locator(f"#memory-{cat}")).to_contain_text("Pip")  # rejected: still there
    page.locator("#drift").scroll_into_view_if_needed()
    look(page, size, "03-ledger-drift")
    page.locator("#drift").screenshot(path=str(ARTIFACTS / f"proposals-{size}-04-drift-chart.png"))
    assert db.session.get(AgentMemory, tea).content == "Dana has tea and biscuits every afternoon."
