"""Cairn on a phone (issue 32, item 8), in a real browser: every page a member and an admin reach, each measured
with its own geometry (getBoundingClientRect) at 390x844, where every tap target is at least 44x44 px; the
admin's navigation folds into a menu there and stays a row of links on a desktop. axe-core on every page, the
error pages included, at both sizes."""

from datetime import timedelta

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from tests import factories
from tests.test_first_hour_browser import ALL_IMPACTS, check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db
from webapp.jobs.refinement import refine_agent
from webapp.models import MemoryProposal, ReplySources
from webapp.models.accounts import NO_PASSWORD
from webapp.models.audit import record_change
from webapp.timeutil import utcnow

pytestmark = pytest.mark.browser

SMALLEST = 44  # px, WCAG 2.5.5's target size, which Apple's and Google's guidelines ask for as well

# Every visible thing a finger may tap, measured as it is drawn. A checkbox or radio is tapped through its label
# too, so it counts as the box around both. A link inside a sentence of a paragraph is exempt, as WCAG exempts
# inline targets: making it 44 px high would pull the lines of its paragraph apart.
SMALL_TARGETS = """
(smallest) => {
  const size = (r) => [Math.round(r.width * 10) / 10, Math.round(r.height * 10) / 10];
  const union = (a, b) => {
    const left = Math.min(a.left, b.left), top = Math.min(a.top, b.top);
    return {width: Math.max(a.right, b.right) - left, height: Math.max(a.bottom, b.bottom) - top};
  };
  const inSentence = (el) => el.matches("a") && el.parentElement.closest("p, .body")
    && el.closest("p, .body").textContent.replace(el.textContent, "").trim().split(/\\s+/).length > 2;
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""} "${
    (el.innerText || el.value || el.getAttribute("aria-label") || el.labels?.[0]?.innerText || "").trim().slice(0, 40)}"`;
  const small = [];
  const targets = "a[href], button, input:not([type=hidden]), select, textarea, summary";
  for (const el of document.querySelectorAll(targets)) {
    const rect = el.getBoundingClientRect();
    if (!rect.width || !rect.height || el.closest(".skip-link, .visually-hidden")) continue;
    if (getComputedStyle(el).visibility === "hidden" || inSentence(el)) continue;
    const box = el.matches("[type=checkbox], [type=radio]") && el.labels?.[0]
      ? union(rect, el.labels[0].getBoundingClientRect()) : rect;
    const [width, height] = size(box);
    if (width < smallest || height < smallest) small.push(`${name(el)} ${width}x${height}`);
  }
  return small;
}
"""


def _small_targets(page: Page) -> list[str]:
    return page.evaluate(SMALL_TARGETS, SMALLEST)


def _sign_in(page: Page, live_server: str, email: str) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()
    page.wait_for_load_state()  # styled: its callers measure the page


def _a_full_account(fake_llm) -> dict:
    """An account with something on every page: two agents, a group chat with a reply and its sources, memories
    with a history, a staged proposal, runs, an invited and a removed person; the addresses of its pages."""
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    member = factories.user(admin.account, "milo@example.com", "member")
    invited = factories.user(admin.account, "sam@example.com", "member")
    invited.password_hash = NO_PASSWORD
    token = invited.invite()
    removed = factories.user(admin.account, "ivy@example.com", "member")
    removed.removed_at = utcnow()
    ada = factories.agent(admin.account, "Ada", core_token_budget=120, background_changes="staged")
    basil = factories.agent(admin.account, "Basil", enabled_tools=["save_memory", "recall", "borrow_context"])
    chat = factories.chat(admin.account, [ada, basil], "Garden plans")
    factories.message(chat, "What should I plant by the north wall?", author=member)
    reply = factories.message(chat, "Climbing roses: [see this](https://example.com) **soon**.", author=ada)
    db.session.add(ReplySources(message_id=reply.id, conversation_summary=True))
    old = factories.memory(ada, "Dana once kept bees.", created_at=utcnow() - timedelta(days=40))
    record_change(old, "memory_create", None, via="tool").created_at = old.created_at
    roses = factories.memory(ada, "Dana grows old roses along the shady north wall of the garden.")
    climbers = factories.memory(ada, "Dana's roses on the north wall are climbers: Albéric Barbier mostly.")
    factories.memory(ada, "Dana likes tea in the afternoon.", "journal")
    factories.job_run(admin.account, "consolidate", error="HTTP 500", status="failed")
    factories.llm_call(ada, prompt_tokens=1200, completion_tokens=300)
    db.session.commit()
    for call in (
        {
            "action": "consolidate",
            "ids": f"{roses.id},{climbers.id}",
            "content": "Dana grows climbing roses.",
        },
        {"action": "complete", "summary": "Merged the roses."},
    ):
        fake_llm.reply(tool_calls=[("refine_memory", call)])
    assert refine_agent(ada.id, True)["proposed"] == 1
    proposal = db.session.scalar(sa.select(MemoryProposal))
    pages = {
        "nobody": ["/login", f"/welcome/{token}"],
        "member": [
            "/chats/",
            "/chats/new",
            f"/chats/{chat.id}",
            f"/chats/{chat.id}/agents/{ada.id}/memory",
            "/account",
            "/chats/999999",  # the error pages: not found, and an admin's page (403)
            "/people/",
        ],
        "admin": [
            "/chats/",
            f"/chats/{chat.id}",
            f"/chats/{chat.id}/agents/{ada.id}/memory",
            "/agents/",
            "/agents/new",
            f"/agents/{ada.id}/edit",
            "/people/",
            "/people/new",
            f"/people/{member.id}/remove",
            "/admin/connections",
            "/admin/usage",
            "/admin/jobs",
            "/admin/local-models",
            f"/admin/agents/{ada.id}/memories",
            f"/admin/agents/{ada.id}/sessions",
            f"/admin/sessions/{proposal.session_id}",
            "/admin/audit",
            "/admin/proposals",
            f"/admin/proposals/{proposal.id}",
            "/account",
        ],
    }
    db.session.remove()
    return pages


def test_every_tap_target_of_every_page_is_44_px_on_a_phone(page, live_app, live_server, fake_llm):
    live_app.config["REFINEMENT_TOKEN_FLOOR"] = 0  # the proposal may merge what it likes
    pages = _a_full_account(fake_llm)
    page.set_viewport_size({"width": 390, "height": 844})
    small: dict[str, list[str]] = {}

    for path in pages["nobody"]:
        page.goto(f"{live_server}{path}")
        small[path] = _small_targets(page)
        check_page(page, "phone", path.split("/")[1], prefix="phone", impacts=ALL_IMPACTS)
    for who, email in (("member", "milo@example.com"), ("admin", "dana@example.com")):
        _sign_in(page, live_server, email)
        for path in pages[who]:
            page.goto(f"{live_server}{path}")
            small[f"{who} {path}"] = _small_targets(page)
            check_page(
                page,
                "phone",
                f"{who}{path.replace('/', '-')}",
                prefix="phone",
                full_page=True,
                impacts=ALL_IMPACTS,
            )
        page.get_by_role("button", name="Sign out").click()

    assert {where: targets for where, targets in small.items() if targets} == {}


def test_every_page_passes_axe_on_a_desktop(page, live_app, live_server, fake_llm):
    """The same pages at 1280x800, where the admin's links are a row and nothing needs to grow: axe on each."""
    live_app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    pages = _a_full_account(fake_llm)
    page.set_viewport_size({"width": 1280, "height": 800})

    for path in pages["nobody"]:
        page.goto(f"{live_server}{path}")
        check_page(page, "desktop", path.split("/")[1], prefix="desktop", impacts=ALL_IMPACTS)
    for who, email in (("member", "milo@example.com"), ("admin", "dana@example.com")):
        _sign_in(page, live_server, email)
        for path in pages[who]:
            page.goto(f"{live_server}{path}")
            check_page(
                page, "desktop", f"{who}{path.replace('/', '-')}", prefix="desktop", impacts=ALL_IMPACTS
            )
        page.get_by_role("button", name="Sign out").click()


def open_menu(page: Page) -> None:
    """On a phone, open the admin's menu (a desktop shows its links in the bar). Asked once the page has loaded:
    before its stylesheet applies, a desktop's menu shows too."""
    page.wait_for_load_state()
    menu = page.locator("details.menu > summary")
    if menu.is_visible():
        tap(menu)


def test_the_admins_links_fold_into_a_menu_on_a_phone(page, size, live_server):  # noqa: F811
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    factories.user(admin.account, "milo@example.com", "member")
    db.session.remove()
    _sign_in(page, live_server, "dana@example.com")
    bar = page.locator("header.topbar")
    links = ["Chats", "Agents", "People", "Connections", "Usage", "Jobs"]

    assert bar.bounding_box()["height"] < 60  # one row, not four
    if size == "desktop":
        expect(page.locator("details.menu")).to_be_hidden()
    else:
        expect(page.get_by_role("link", name="People")).to_have_count(0)  # folded
        menu = page.get_by_role("navigation", name="Menu")
        expect(menu).to_be_hidden()
        open_menu(page)
        expect(menu).to_be_visible()
        assert _small_targets(page) == []  # the menu's links too
        check_page(page, size, "menu-open", prefix="phone")
    for name in links:
        expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
    tap(page.get_by_role("link", name="People", exact=True))
    expect(page.get_by_role("heading", name="People", level=1)).to_be_visible()

    page.get_by_role("button", name="Sign out").click()
    _sign_in(page, live_server, "milo@example.com")  # a member's one link needs no menu
    expect(page.locator("details.menu")).to_have_count(0)
    expect(page.get_by_role("link", name="Chats", exact=True)).to_be_visible()
    assert bar.bounding_box()["height"] < 60
