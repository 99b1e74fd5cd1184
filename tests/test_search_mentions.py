"""Issue 33: a search favours what was said on the date a query names, and what the people it names wrote."""

from datetime import date, datetime, timedelta

import pytest
import time_machine

from tests import factories
from webapp import search
from webapp.extensions import db
from webapp.models import Message
from webapp.search import mentions
from webapp.search.mentions import period_named
from webapp.tools import ToolContext
from webapp.tools.recall import recall

TODAY = date(2026, 11, 27)  # a Friday


def _day(y: int, m: int, d: int) -> tuple[datetime, datetime]:
    return datetime(y, m, d), datetime(y, m, d) + timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "period"),
    [
        ("What did Nate make on 9 November, 2022?", _day(2022, 11, 9)),
        ("as mentioned on 3rd June 2023", _day(2023, 6, 3)),
        ("November 9th, 2022", _day(2022, 11, 9)),
        ("the notes of 2022-11-09", _day(2022, 11, 9)),
        ("on Dec. 25", _day(2025, 12, 25)),  # without its year: the latest one not after today
        ("on May 8", _day(2026, 5, 8)),
        ("on may 8, 2025", _day(2025, 5, 8)),
        ("in January 2024", (datetime(2024, 1, 1), datetime(2024, 2, 1))),
        ("in December 2023", (datetime(2023, 12, 1), datetime(2024, 1, 1))),
        ("What happened in 2022?", (datetime(2022, 1, 1), datetime(2023, 1, 1))),
        ("what did we say yesterday", _day(2026, 11, 26)),
        ("today", _day(2026, 11, 27)),
        ("last week", (datetime(2026, 11, 16), datetime(2026, 11, 23))),
        ("this month", (datetime(2026, 11, 1), datetime(2026, 12, 1))),
        ("last month", (datetime(2026, 10, 1), datetime(2026, 11, 1))),
        ("last year", (datetime(2025, 1, 1), datetime(2026, 1, 1))),
    ],
)
def test_the_date_a_query_names_is_read_as_a_day_a_month_or_a_year(text, period):
    assert period_named(text, TODAY) == period


@pytest.mark.parametrize(
    "text",
    ["", "What may 2 people do?", "What may Caroline paint?", "room 12", "Augusta's trip", "31 February"],
)
def test_a_query_naming_no_date_names_none(text):
    assert period_named(text, TODAY) is None


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["recall"])


def _said(chat, text: str, author, at: datetime | None = None):
    if at is None:
        return factories.message(chat, text, author=author)
    with time_machine.travel(at, tick=False):
        return factories.message(chat, text, author=author)


def _filler(chat, author, n: int = 5) -> None:
    """Turns enough apart that the turns around them are excerpts of their own."""
    for i in range(n):
        _said(chat, f"Filler line number {i}.", author)


def _first_excerpt(agent, chat, query: str) -> str:
    reply = factories.message(chat, "", author=agent, status="streaming")
    return recall(ToolContext(agent=agent, chat=chat, message=reply), query)["results"][0]["excerpt"]


def test_recall_brings_first_what_was_said_on_the_date_asked_about(app, admin, ada, monkeypatch):
    chat = factories.chat(admin.account, [ada], "Baking")
    _said(chat, "I baked a lemon cake, a lovely cake.", admin, datetime(2023, 3, 2, 10, 0))
    _filler(chat, ada)
    _said(chat, "Today I baked a cake with plums.", admin, datetime(2022, 11, 9, 18, 0))
    _filler(chat, ada)

    asked = "Which cake did I bake on 9 November, 2022?"
    dated = _first_excerpt(ada, chat, asked)
    assert "[2022-11-09 18:00] dana: Today I baked a cake with plums." in dated.splitlines()
    monkeypatch.setattr(mentions, "DATE_BONUS", 0.0)
    assert "lemon cake" in _first_excerpt(ada, chat, asked)  # the better match by its words alone


def test_a_memory_made_on_the_date_asked_about_comes_first(app, admin, ada, monkeypatch):
    lemon = factories.memory(ada, "Dana baked a lemon cake, a lovely cake.", "journal")
    with time_machine.travel(datetime(2022, 11, 9, 18, 0), tick=False):
        plums = factories.memory(ada, "Dana baked a cake with plums.", "journal")
    asked = "Which cake did Dana bake in November 2022?"

    assert [i for i, _ in search.memory_hits(ada.id, asked, 2)] == [plums.id, lemon.id]
    # The prompt's search by the conversation's words ranks by words and meaning only (a "today" in a chat asks
    # for nothing made today).
    assert search.memory_ids(ada.id, asked, 2) == [lemon.id, plums.id]
    monkeypatch.setattr(mentions, "DATE_BONUS", 0.0)
    assert [i for i, _ in search.memory_hits(ada.id, asked, 2)] == [lemon.id, plums.id]


def test_the_words_of_whoever_the_query_names_rank_before_words_said_to_them(app, admin, member, ada):
    admin.name, member.name = "Melanie", "Caroline"
    db.session.commit()
    chat = factories.chat(admin.account, [ada], "Art")
    to_her = _said(chat, "Caroline, your painting is great!", admin)
    hers = _said(chat, "I finished a painting of a sunset.", member)
    ada_said = _said(chat, "A painting takes patience.", ada)
    found = [(to_her.id, 1.5), (hers.id, 1.0), (ada_said.id, 0.8)]  # as the words and meaning ranked them

    assert [i for i, _ in mentions.favoured(Message, "What did Caroline paint?", found)] == [
        hers.id, to_her.id, ada_said.id
    ]  # fmt: skip
    assert mentions.favoured(Message, "What did Ada say of painting?", found)[0][0] == ada_said.id
    assert mentions.favoured(Message, "Who likes painting?", found) == found  # nobody named
