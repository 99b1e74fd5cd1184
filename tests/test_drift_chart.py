"""Issue 32.4: the ledger's drift chart for an agent younger than its 90 days starts at the agent's first memory,
labels its dates, is sent again after a change made on the page, and says so when there is nothing to draw."""

import re
from datetime import timedelta

import pytest

from tests import factories
from webapp.admin.drift import WIDTH, Chart
from webapp.extensions import db
from webapp.models.audit import record_change
from webapp.models.drift import core_history
from webapp.timeutil import utcnow

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", core_token_budget=200)


def _saved(agent, text: str, ago: timedelta):
    """A core memory the agent saved `ago`, its audit row dated then."""
    memory = factories.memory(agent, text, created_at=utcnow() - ago)
    record_change(memory, "memory_create", None, via="tool").created_at = memory.created_at
    db.session.commit()
    return memory


def _drift(html: str) -> str:
    return re.search(r'<section class="panel drift".*?</section>', html, re.S).group(0)


def test_a_young_agents_chart_starts_at_its_first_memory_with_its_changes_spread_out(client, signed_in, ada):
    for days in (6, 4, 2, 1):
        _saved(ada, f"Saved {days} days ago.", timedelta(days=days, hours=1))

    now = utcnow()
    history = core_history(ada.id, now, 90)
    chart = Chart(history, ada.core_token_budget)
    page = client.get(f"/admin/agents/{ada.id}/memories").text

    first = now - timedelta(days=6, hours=1)
    assert first - timedelta(days=1) < history.since < first  # a little before it, not 90 days back
    across = sorted(chart.mark_at(mark)[0] for mark in history.marks)
    assert len(across) == 4 and across[0] < WIDTH * 0.1 and across[-1] > WIDTH * 0.7
    assert all(b - a > 40 for a, b in zip(across, across[1:], strict=False))  # not stacked
    drift = " ".join(_drift(page).split())
    assert "Core memory since its first memory" in drift
    dates = re.search(r'<p class="chart-dates">(.*?)</p>', drift).group(1)
    assert re.findall(r"<span>([^<]+)</span>", dates) == [
        f"{history.since:%Y-%m-%d}",
        f"{history.since + (history.now - history.since) / 2:%Y-%m-%d}",
        "now",
    ]


def test_an_agent_of_an_hour_is_charted_by_the_minute(client, signed_in, ada):
    _saved(ada, "Said an hour ago.", timedelta(minutes=61))
    _saved(ada, "Said just now.", timedelta(minutes=1))

    history = core_history(ada.id, utcnow(), 90)
    chart = Chart(history, ada.core_token_budget)
    dates = chart.dates

    assert history.bucket < timedelta(hours=1)
    across = [chart.mark_at(mark)[0] for mark in history.marks]
    assert across[1] - across[0] > WIDTH / 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", dates[0][1]) and re.fullmatch(r"\d\d:\d\d", dates[1][1])
    assert re.search(
        r"1 added on \d{4}-\d\d-\d\d, \d\d:\d\d–\d\d:\d\d UTC", chart.mark_title(history.marks[0])
    )


def test_an_old_agents_chart_keeps_its_ninety_days(client, signed_in, ada):
    _saved(ada, "Saved long ago.", timedelta(days=200))
    _saved(ada, "Saved lately.", timedelta(days=3))

    history = core_history(ada.id, utcnow(), 90)
    page = client.get(f"/admin/agents/{ada.id}/memories").text

    assert history.now - history.since == timedelta(days=90) and history.bucket == timedelta(days=1)
    assert "Core memory, last 90 days" in page


def test_with_nothing_to_draw_it_says_not_enough_history_yet(client, signed_in, ada):
    factories.memory(ada, "Only a journal entry.", "journal")

    drift = _drift(client.get(f"/admin/agents/{ada.id}/memories").text)

    assert "Not enough history yet" in drift and "<svg" not in drift


def test_a_change_on_the_page_sends_the_chart_again(client, signed_in, ada):
    assert "Not enough history yet" in client.get(f"/admin/agents/{ada.id}/memories").text

    added = client.post(
        f"/admin/agents/{ada.id}/memories",
        data={"content": "Dana likes figs.", "memory_type": "core"},
        headers=HTMX,
    ).text

    drift = _drift(added)
    assert 'id="drift"' in drift and 'hx-swap-oob="true"' in drift
    assert (
        "Not enough history yet" not in drift
        and '<g class="mark added">' in drift
        and "now 1 memories" in drift
    )
