"""Job runs in words a person reads: what kind of job ran, what it worked on (the chat and agent by name,
linked) and what went wrong, instead of job types, targets like `messages:10,11` and exception names.

Admins manage agents and memory; they do not read members' private chats: a run on a chat the viewer may not
read (webapp.models.access) says that a private chat was worked on, not its title, and does not link it."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import url_for
from flask_login import current_user
from sqlalchemy.orm import load_only

from webapp.admin.common import bp
from webapp.extensions import db
from webapp.jobs.queue import target_ids
from webapp.jobs.runs import JOB_TYPES
from webapp.models import Agent, Chat, JobRun, Message, access

GONE = "a chat no longer here"
GONE_ALL = "no longer here"
PRIVATE = "a private chat"  # someone else's: that it exists is shown, not its title
# "ReplyFailed: replies failed: 8, 9" (the reply job's error); "module.SomeError: message" (any other exception)
_REPLIES_FAILED = re.compile(r"^(?:\w+\.)*ReplyFailed: replies failed: ([\d, ]+)$")
_TIMED_OUT = re.compile(r"^(?:\w+\.)*JobTimeoutException: .*?(\(\d+ seconds\))?$", re.S)
_EXCEPTION = re.compile(r"^((?:\w+\.)*([A-Z]\w*)): (.+)$", re.S)
_PLAIN = ("LLMError",)  # its message is written for people; its name adds nothing


@bp.app_template_filter("job_name")
def job_name(job_type: str) -> str:
    """ "refine" -> "Refine core memory"; a type this app does not know reads as its words."""
    job = JOB_TYPES.get(job_type)
    return job.job_kind.title if job else job_type.replace("_", " ").capitalize()


@dataclass
class Failure:
    """A run's error as the page shows it: a sentence, and the raw text under Details when it says more."""

    text: str
    detail: str | None = None


@bp.app_template_filter("failure")
def failure(error: str) -> Failure:
    if match := _REPLIES_FAILED.match(error):
        count = len([i for i in match.group(1).split(",") if i.strip()])
        return Failure(f"{count} repl{'y' if count == 1 else 'ies'} failed; the chat shows why, with Retry")
    if match := _TIMED_OUT.match(error):
        limit = f" {match.group(1)}" if match.group(1) else ""
        return Failure(f"Stopped: it ran longer than its time limit{limit}", error)
    if match := _EXCEPTION.match(error):
        message = match.group(3).strip()
        readable = message[:1].upper() + message[1:]
        return Failure(readable, None if match.group(2) in _PLAIN else error)
    return Failure(error)


_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")
WITHHELD = "its message is not shown: it may quote a chat you may not read"


@bp.app_template_filter("withheld_failure")
def withheld_failure(error: str) -> Failure:
    """The error of a run on a chat the viewer may not read, as its kind only: a provider's message may quote
    the prompt (a 400 "near 'my locker code is…'"), so none of its text is shown."""
    if _REPLIES_FAILED.match(error):
        return failure(error)  # says only how many replies failed
    if _TIMED_OUT.match(error):
        return Failure(f"Stopped: it ran longer than its time limit ({WITHHELD})")
    if status := _HTTP_STATUS.search(error):
        return Failure(f"The model answered HTTP {status.group(1)} ({WITHHELD})")
    kind = match.group(2) if (match := _EXCEPTION.match(error)) else "an error"
    return Failure(f"It failed with {kind} ({WITHHELD})")


def on_unreadable_chats(named: dict[int, list["Named"]]) -> set[int]:
    """The runs (by id) that worked on a chat the viewer may not read (from worked_on)."""
    return {run_id for run_id, names in named.items() if any(n.name == PRIVATE for n in names)}


@dataclass
class Named:
    """Something a run worked on: its name, and where to see it (None: it is gone)."""

    name: str
    url: str | None = None


def _ids(targets: Iterable[str | None], key: str) -> set[int]:
    """The ids that targets such as "messages:1,2" or "chat:3 agent:2" give for one key."""
    return {i for target in targets for i in target_ids(target, key)}


def worked_on(runs: list[JobRun]) -> dict[int, list[Named]]:
    """For each run, the chats (by the title people see) and agents (by name) it worked on: three queries."""
    targets = [run.target for run in runs]
    message_ids = _ids(targets, "messages")
    messages = {}
    if message_ids:
        query = sa.select(Message.id, Message.chat_id, Message.agent_id).where(Message.id.in_(message_ids))
        messages = {row.id: row for row in db.session.execute(query)}
    chat_ids = _ids(targets, "chat") | {row.chat_id for row in messages.values()}
    agent_ids = _ids(targets, "agent") | {row.agent_id for row in messages.values() if row.agent_id}
    chats = _chats_named(chat_ids)
    agents = {
        agent.id: Named(agent.name, url_for("agents.edit", agent_id=agent.id))
        for agent in _of_account(Agent, Agent.name, agent_ids)
    }
    return {run.id: _run_named(run.target, messages, chats, agents) for run in runs}


def _of_account(model: type[Agent], name: Any, ids: set[int]) -> list[Any]:
    """The signed-in account's rows among ids, with only their id and name loaded (no query without ids)."""
    if not ids:
        return []
    query = sa.select(model).options(load_only(model.id, name))
    return list(
        db.session.scalars(query.where(model.id.in_(ids), model.account_id == current_user.account_id))
    )


def _chats_named(ids: set[int]) -> dict[int, Named]:
    """The account's chats among ids by the title people see, linked; those the viewer may not read only as
    "a private chat" (access.ChatNames; one query, none without ids)."""
    if not ids:
        return {}
    query = (
        sa.select(Chat)
        .options(load_only(Chat.id, Chat.title))
        .where(Chat.id.in_(ids), Chat.account_id == current_user.account_id)
    )
    chats, names = access.ChatNames.loading(current_user, query)
    return {
        chat.id: Named(title, url_for("chats.show", chat_id=chat.id))
        if (title := names.title(chat)) is not None
        else Named(PRIVATE)
        for chat in chats
    }


def _run_named(
    target: str | None, messages: dict[int, sa.Row], chats: dict[int, Named], agents: dict[int, Named]
) -> list[Named]:
    """One run's chats, then its agents, each once; a chat of another account or no longer there is 'gone'."""
    replies = [messages[i] for i in sorted(_ids([target], "messages")) if i in messages]
    chat_ids = sorted(_ids([target], "chat") | {row.chat_id for row in replies})
    agent_ids = list(dict.fromkeys([*sorted(_ids([target], "agent")), *(r.agent_id for r in replies)]))
    named = [chats.get(i, Named(GONE)) for i in chat_ids] + [agents[i] for i in agent_ids if i in agents]
    return named or ([Named(GONE_ALL)] if target else [])
