"""Issue 32, items 3, 4 and 7 in a real browser, on a desktop and on a phone: a member forgets a memory from her
chat on its memory page and an admin sees who forgot it and undoes it; the drift chart of a young agent starts at
its first memory, dates itself, redraws after an add and says when there is nothing to draw yet; the review page
shows each change's own tokens, an unticked change as kept, and the chat each memory came from. axe-core on every
page visited; screenshots kept (test-artifacts/memory32-*)."""

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from tests import factories
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.models import AgentMemory, MemoryProposal, ProposedChange
from webapp.models.audit import record_change
from webapp.timeutil import utcnow

pytestmark = pytest.mark.browser

LOCKER = "Ana's locker code is PLUM-7731."


def look(page: Page, size: str, name: str) -> None:  # noqa: F811
    check_page(page, size, name, prefix="memory32", full_page=True)


def _sign_in(page: Page, live_server: str, email: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in"))
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()


def _saved(agent, text: str, ago: timedelta = timedelta(0), **fields) -> AgentMemory:
    """A core memory the agent saved `ago`, with its audit row dated then."""
    memory = factories.memory(agent, text, created_at=utcnow() - ago, **fields)
    record_change(memory, "memory_create", None, via="tool").created_at = memory.created_at
    db.session.commit()
    return memory


def test_a_member_forgets_and_an_admin_brings_it_back(page, size, live_app, live_server):  # noqa: F811
    acme = factories.account()
    factories.user(acme, "dana@example.com", "admin")
    ana = factories.user(acme, "ana@example.com", "member")
    ana.name = "Ana"
    ada = factories.agent(acme, "Ada")
    chat = factories.chat(acme, [ada], "Ana's lockers", people=[ana])
    locker = _saved(ada, LOCKER, chat_id=chat.id).id
    rule = _saved(ada, "Answer in plain English.").id
    vow = _saved(ada, "Never read a locker code aloud.", chat_id=chat.id, constitutional=True).id
    memory_page, ledger = (
        f"{live_server}/chats/{chat.id}/agents/{ada.id}/memory",
        f"/admin/agents/{ada.id}/memories",
    )
    db.session.remove()

    _sign_in(page, live_server, "ana@example.com")
    page.goto(memory_page)
    expect(page.get_by_role("heading", name="Ada's memory")).to_be_visible()
    expect(page.locator("#forget-rule")).to_contain_text(
        "You can forget what Ada remembers from the chats you may read"
    )
    expect(page.locator(f"#memory-{rule}").get_by_role("button")).to_have_count(0)  # heard by everyone
    expect(page.locator(f"#memory-{vow}")).to_contain_text(
        "Ada keeps it: a constitutional memory cannot be forgotten"
    )
    expect(page.locator(f"#memory-{vow}").get_by_role("button")).to_have_count(0)
    look(page, size, "01-member-memory-page")

    tap(
        page.locator(f"#memory-{locker}").get_by_role("button", name="Forget")
    )  # the page accepts the confirm
    forgotten = page.locator(f"#memory-{locker}")
    expect(forgotten).to_have_text(
        "Forgotten. Ada no longer brings it to its replies; only an admin can bring it back."
    )
    expect(forgotten).to_be_focused()
    look(page, size, "02-forgotten")
    page.reload()
    expect(page.get_by_text(LOCKER)).to_have_count(0)

    _sign_in(page, live_server, "dana@example.com")
    page.goto(f"{live_server}{ledger}?show=deleted")
    row = page.locator(f"#memory-{locker}")
    expect(row.locator(".deleted-by")).to_have_text(
        "Forgotten by Ana (ana@example.com) on the memory page of its chat."
    )
    look(page, size, "03-ledger-forgotten-by")
    page.get_by_role("link", name="Audit log").click()  # its size is another item of issue 32
    entry = page.locator("tr.entry", has_text="forgotten on its chat's memory page")
    expect(entry.locator(".who")).to_have_text("ana@example.com")
    look(page, size, "04-audit-forgotten")
    tap(entry.get_by_role("button", name="Undo"))
    expect(entry.locator(".ok")).to_contain_text("Undone")
    assert db.session.get(AgentMemory, locker).deleted_at is None

    _sign_in(page, live_server, "ana@example.com")  # back in what Ada brings to Ana's chat
    page.goto(memory_page)
    expect(page.locator(f"#memory-{locker}")).to_contain_text(LOCKER)
    expect(page.locator(f"#memory-{locker}").get_by_role("button", name="Forget")).to_be_visible()


def test_a_young_agents_drift_chart(page, size, live_app, live_server):  # noqa: F811
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada", core_token_budget=120)
    basil = factories.agent(admin.account, "Basil")
    for text, days in [("Dana lives in Ghent.", 9), ("Dana once kept bees.", 6), ("Dana's son is Milo.", 3)]:
        _saved(ada, text, timedelta(days=days))
    ada, basil = ada.id, basil.id
    db.session.remove()

    _sign_in(page, live_server, "dana@example.com")
    page.goto(f"{live_server}/admin/agents/{basil}/memories")
    expect(page.locator("#drift")).to_contain_text(
        "Not enough history yet: Basil has no core memory to chart."
    )
    expect(page.locator("#drift svg")).to_have_count(0)
    look(page, size, "05-drift-nothing-yet")

    page.goto(f"{live_server}/admin/agents/{ada}/memories")
    drift = page.locator("#drift")
    expect(drift.get_by_role("heading")).to_contain_text("Core memory since its first memory")
    start = (utcnow() - timedelta(days=9)).date()
    dates = drift.locator(".chart-dates span")
    expect(dates).to_have_count(3)
    expect(dates.last).to_have_text("now")
    assert dates.first.inner_text() <= f"{start:%Y-%m-%d}"
    marks = drift.locator("g.mark.added")
    expect(marks).to_have_count(3)
    across = sorted(box["x"] for box in (m.bounding_box() for m in marks.all()))
    width = drift.locator("svg.drift-chart").bounding_box()["width"]
    assert across[-1] - across[0] > width / 2, f"the marks are stacked: {across} in {width}"
    page.locator("#drift").scroll_into_view_if_needed()
    look(page, size, "06-drift-young")

    page.get_by_role("textbox", name="Memory").fill("Dana plays the cello.")
    tap(page.get_by_role("button", name="Add memory"))
    expect(page.locator("#memory-rows")).to_contain_text("Dana plays the cello.")
    expect(drift.locator(".drift-legend")).to_contain_text("added 4")  # redrawn out of band
    expect(drift.locator("desc")).to_contain_text("now 4 memories")
    look(page, size, "07-drift-after-add")


def test_the_review_page_says_what_each_change_does(page, size, live_app, live_server):  # noqa: F811
    acme = factories.account()
    factories.user(acme, "dana@example.com", "admin")
    ana = factories.user(acme, "ana@example.com", "member")
    ana.name = "Ana"
    ada = factories.agent(acme, "Ada", core_token_budget=50, background_changes="staged")
    private = factories.chat(acme, [ada], "Ana's secret garden", people=[ana])
    club = factories.chat(acme, [ada], "Garden club")
    roses = _saved(
        ada, "Ana grows old roses along the shady north wall, climbers mostly.", chat_id=private.id
    )
    cat = _saved(ada, "The club's cat is called Pip and sleeps in the greenhouse.", chat_id=club.id)
    changes = [
        ProposedChange.build("rewrite", [roses], "Ana grows climbing roses on the north wall."),
        ProposedChange.build("delete", [cat]),
    ]
    MemoryProposal.stage(
        ada,
        str(uuid.uuid4()),
        changes,
        staged_because="setting",
        reason=None,
        summary=None,
        expiry=timedelta(days=14),
    )
    db.session.commit()
    cat_tokens, roses, cat = changes[1].tokens_before, roses.id, cat.id
    db.session.remove()

    _sign_in(page, live_server, "dana@example.com")
    tap(page.locator("#review-count"))
    expect(page.get_by_role("heading", name="Proposed changes · Ada")).to_be_visible()
    rewrite, delete = page.locator("fieldset.change").all()
    expect(delete.locator(".tokens")).to_have_text(
        f"This change: −{cat_tokens} tokens (the memory it deletes holds {cat_tokens})"
    )
    expect(rewrite.locator(".tokens")).to_contain_text("This change: −")
    expect(page.locator("fieldset.change .tokens", has_text="Core tokens")).to_have_count(0)
    expect(rewrite.locator(".from")).to_have_text(f"#{roses}, from private: Ana's chat:")
    expect(delete.locator(".from")).to_have_text("(from Garden club)")
    expect(page.get_by_text("secret garden")).to_have_count(0)
    expect(delete.locator(".kept")).to_be_hidden()
    expect(delete.locator("del")).to_have_css("text-decoration-line", "line-through")
    look(page, size, "08-review")

    tap(delete.locator("label.apply"))
    expect(delete.get_by_label("Apply this change")).not_to_be_checked()
    expect(delete.locator(".kept")).to_be_visible()
    expect(delete.locator(".kept")).to_have_text(
        "Will be kept: unticked, this change is not applied and the memory stays as it is."
    )
    expect(delete.locator("del")).to_have_css("text-decoration-line", "none")
    expect(rewrite.locator(".kept")).to_be_hidden()
    look(page, size, "09-review-unticked")

    tap(page.get_by_role("button", name="Apply ticked changes, reject the rest"))
    expect(page.locator(".flash")).to_have_text("Decided: 1 applied, 1 rejected.")
    assert db.session.scalar(sa.select(AgentMemory.deleted_at).where(AgentMemory.id == cat)) is None
