"""Spec 003: each agent's own two-line summary of each of its conversations, refreshed at most every 5 minutes."""

import logging

import sqlalchemy as sa
from flask import current_app

from webapp import llm
from webapp.extensions import db
from webapp.jobs.queue import enqueue, job_target, model_time, recorded_job
from webapp.llm import LLMError, targets
from webapp.models import Chat, ChatAgent, Message
from webapp.models.chats import recent_messages
from webapp.prompting import render
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

RECENT_MESSAGES = 10
MESSAGE_CHARS = 500
SUMMARY_LINES = 2
SUMMARY_CHARS = 500


def request_summaries(chat: Chat) -> int:
    """Enqueue a summary job for each agent of the chat whose summary is stale and has none queued yet (however
    many messages arrive); call before the commit. Returns how many were queued (none for a temporary chat)."""
    if not chat.remembers:
        return 0
    stale = [ca for ca in chat.chat_agents if ca.summary_stale() and not ca.agent.paused]
    queued = [enqueue(summarize, ca.chat_id, ca.agent_id) for ca in stale]
    return sum(run is not None for run in queued)


def _target(chat_id: int, agent_id: int) -> str:
    return job_target(chat=chat_id, agent=agent_id)


@recorded_job(
    "summarize",
    "Summarize conversation",
    target=_target,
    of=Chat,
    unique="queued",
    timeout=lambda *_: model_time(1),
)
def summarize(chat_id: int, agent_id: int) -> dict[str, int]:
    """Write the agent's summary of the chat from its last messages; a failure keeps the old summary."""
    chat_agent = db.session.scalar(
        sa.select(ChatAgent).where(ChatAgent.chat_id == chat_id, ChatAgent.agent_id == agent_id)
    )
    if (
        chat_agent is None
        or chat_agent.chat.is_discarded
        or not chat_agent.chat.remembers
        or chat_agent.agent.paused
    ):
        return {"summarized": 0, "skipped": 1}
    if not chat_agent.summary_stale():
        return {"summarized": 0, "fresh": 1}  # another job summarized it since this one was enqueued
    recent = recent_messages(chat_id, RECENT_MESSAGES)
    if len(recent) < 2:
        return {"summarized": 0, "too_few_messages": 1}
    try:
        text = _generate(chat_agent, recent)
    except LLMError as error:
        log.warning("Agent summary failed for chat=%s agent=%s: %s", chat_id, agent_id, error)
        raise  # recorded in job_runs; a retryable error is retried, the old summary stays meanwhile
    summary = clean_summary(text)
    if not summary:
        log.warning("Agent summary for chat=%s agent=%s came back empty", chat_id, agent_id)
        return {"summarized": 0, "empty": 1}
    chat_agent.agent_summary = summary
    chat_agent.agent_summary_generated_at = utcnow()
    db.session.commit()
    return {"summarized": 1, "messages": len(recent)}


def _generate(chat_agent: ChatAgent, recent: list[Message]) -> str:
    """Ask the summary model, with the agent's identity first and its previous summary to update."""
    agent, chat = chat_agent.agent, chat_agent.chat
    variables = {
        "identity": agent.identity(),
        "previous_summary": (chat_agent.agent_summary or "").strip(),
        "conversation_title": chat.model_title,
        "messages": [f"{m.author_name}: {m.excerpt(MESSAGE_CHARS)}" for m in recent],
    }
    messages = [
        {"role": "system", "content": render("generate_agent_summary/system.txt", **variables)},
        {"role": "user", "content": render("generate_agent_summary/user.txt", **variables)},
    ]
    configured = current_app.config["SUMMARY_MODEL_ID"]
    target = targets.for_environment(configured) if configured else targets.for_background(agent)
    agent_id, chat_id = agent.id, chat.id
    db.session.commit()  # hold no transaction while the model thinks
    result = llm.complete(target, messages, purpose="summarize", agent_id=agent_id, chat_id=chat_id)
    return result.text


def clean_summary(text: str) -> str:
    """At most two non-blank lines, each with its spaces collapsed, and at most 500 characters in all."""
    lines = [" ".join(line.split()) for line in (text or "").splitlines()]
    summary = "\n".join([line for line in lines if line][:SUMMARY_LINES])
    return summary if len(summary) <= SUMMARY_CHARS else summary[: SUMMARY_CHARS - 1].rstrip() + "…"
