"""What a query names beyond its words: a date ("on 9 November, 2022", "in May 2023", "2022-11-09", "yesterday")
and the people or agents who wrote in the searched chats ("What did Caroline say about…"). Among the rows a
search found (fused), those made on the date named come first (DATE_BONUS), and the messages of whoever is named
rank higher (AUTHOR_BONUS): the words of a name match the turns that speak *to* that person at least as well as
those they wrote, and a date is in no turn's words at all. A memory's date is when it was made. Asked searches
only (recall, MCP's search_memory): the prompt's search by the conversation's words leaves them out.

Measured on LoCoMo's dev conversations (bench.locomo, recall's top 10; issue 33), R@10 with observations as
memories 0.852 -> 0.862 with the author's bonus (1.0; 0.5: 0.856, 1.5: 0.860), 0.880 with the date's (5 on
messages and memories; 1: 0.867, 2: 0.871, 3: 0.875, 10 as 5); without memories 0.825 -> 0.855.

Dates are English, read by the patterns below rather than a date-parsing library: a search must never take
"may" for May, or any number for a year, and must cost microseconds. Relative dates are of today in UTC, the
time every column stores.
"""

import re
from datetime import date, datetime, timedelta

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Message, User
from webapp.search.signals import Hits
from webapp.search.terms import terms
from webapp.timeutil import utcnow

# Added to a fused score (a sum of z-scores): the rows of the date named come before the others found, and the
# messages written by someone the query names rank higher.
DATE_BONUS = 5.0
AUTHOR_BONUS = 1.0

Period = tuple[datetime, datetime]  # [start, end)

MONTHS = "january february march april may june july august september october november december".split()
_MONTH = r"(?P<month>" + "|".join(f"{m[:3]}(?:{m[3:]})?" for m in MONTHS) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
# Most precise first: a day, then a month of a year, then a year.
_DAYS = [
    re.compile(r"\b(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})\b"),
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?(?:\s+{_YEAR})?\b", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
]
_MONTH_OF_YEAR = re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE)
_A_YEAR = re.compile(rf"\b{_YEAR}\b(?!-)")
_RELATIVE = re.compile(r"\b(today|yesterday|(?:this|last) (?:week|month|year))\b", re.IGNORECASE)


def period_named(text: str, today: date | None = None) -> Period | None:
    """The day, month or year the text names, as [start, end) in naive UTC; None when it names none. A day or
    month without its year is the latest one not after today."""
    today = today or utcnow().date()
    for pattern in _DAYS:
        for found in pattern.finditer(text):
            day = _day(found, today)
            if day is not None:
                return _at(day), _at(day + timedelta(days=1))
    if found := _MONTH_OF_YEAR.search(text):
        start = date(int(found["year"]), _month(found["month"]), 1)
        return _at(start), _at(_next_month(start))
    if found := _RELATIVE.search(text):
        return _relative(found[1].casefold(), today)
    if found := _A_YEAR.search(text):
        year = int(found["year"])
        return _at(date(year, 1, 1)), _at(date(year + 1, 1, 1))
    return None


def favoured(model: type, text: str, ranked: Hits) -> Hits:
    """The rows found (AgentMemory or Message ids, with their fused scores), best first again once those made on
    the date the text names, and the messages written by someone it names, have their bonus."""
    period, ids = period_named(text), [i for i, _ in ranked]
    if model is AgentMemory:
        bonus = _memory_bonus(ids, period) if period and ids else {}
    else:
        bonus = _message_bonus(ids, text, period) if ids else {}
    if not bonus:
        return ranked
    return sorted(((i, score + bonus.get(i, 0.0)) for i, score in ranked), key=lambda hit: -hit[1])


def _memory_bonus(ids: list[int], period: Period) -> dict[int, float]:
    made = sa.select(AgentMemory.id).where(
        AgentMemory.id.in_(ids), AgentMemory.created_at >= period[0], AgentMemory.created_at < period[1]
    )
    return dict.fromkeys(db.session.scalars(made), DATE_BONUS)


def _message_bonus(ids: list[int], text: str, period: Period | None) -> dict[int, float]:
    """One statement: each message's date and its author's name."""
    words = set(terms(text))
    rows = db.session.execute(
        sa.select(Message.id, Message.created_at, User.name, Agent.name)
        .outerjoin(User, User.id == Message.user_id)
        .outerjoin(Agent, Agent.id == Message.agent_id)
        .where(Message.id.in_(ids))
    )
    bonus = {}
    for message_id, created_at, person, agent in rows:
        named = any(words & set(terms(name)) for name in (person, agent) if name)
        dated = period is not None and period[0] <= created_at < period[1]
        if named or dated:
            bonus[message_id] = AUTHOR_BONUS * named + DATE_BONUS * dated
    return bonus


def _day(found: re.Match, today: date) -> date | None:
    if found["month"] == "may" and not found["year"]:
        return None  # "what may 2 people do": "may" is a month when written May, or with a year
    month = _month(found["month"])
    try:
        if found["year"]:
            return date(int(found["year"]), month, int(found["day"]))
        day = date(today.year, month, int(found["day"]))
        return day if day <= today else date(today.year - 1, month, int(found["day"]))
    except ValueError:  # no such day: 31 February
        return None


def _month(name: str) -> int:
    """The month's number, of a number or a month's name or its first three letters."""
    if name.isdigit():
        return int(name)
    return next(n for n, month in enumerate(MONTHS, 1) if month.startswith(name[:3].lower()))


def _relative(words: str, today: date) -> Period:
    if words in ("today", "yesterday"):
        day = today - timedelta(days=words == "yesterday")
        return _at(day), _at(day + timedelta(days=1))
    last = words.startswith("last")
    unit = words.split()[1]
    if unit == "week":
        start = today - timedelta(days=today.weekday() + 7 * last)
        return _at(start), _at(start + timedelta(days=7))
    if unit == "month":
        start = today.replace(day=1)
        if last:
            start = (start - timedelta(days=1)).replace(day=1)
        return _at(start), _at(_next_month(start))
    year = today.year - last
    return _at(date(year, 1, 1)), _at(date(year + 1, 1, 1))


def _next_month(start: date) -> date:
    return date(start.year + start.month // 12, start.month % 12 + 1, 1)


def _at(day: date) -> datetime:
    return datetime(day.year, day.month, day.day)
