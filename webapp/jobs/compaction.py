"""Spec 004: keep every prompt bounded. When a chat's history after its last cut passes the threshold, a job
(never the reply path) summarizes the oldest messages beyond the most recent ones and appends the summary to
the chat's memory_doc; compacted_through_message_id records the cut. Messages are never changed or deleted."""

from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import joinedload

from webapp import llm
from webapp.extensions import db
from webapp.jobs.queue import backlog_time, enqueue, job_target, recorded_job
from webapp.llm import targets
from webapp.models import Chat, Message
from webapp.prompting import render
from webapp.tokens import count_tokens


def thresholds() -> tuple[int, int]:
    """(threshold, keep_recent) from the settings; keep_recent stays below the threshold (config.validate checks
    the pair at start-up), so a compaction always has messages to summarize."""
    config = current_app.config
    threshold = config["COMPACTION_THRESHOLD"]
    return threshold, min(config["COMPACTION_KEEP_RECENT"], threshold - 1)


def _after_cut(chat: Chat) -> sa.Select:
    query = sa.select(Message).where(
        Message.chat_id == chat.id, Message.status == "done", Message.content != ""
    )
    if chat.compacted_through_message_id:
        query = query.where(Message.id > chat.compacted_through_message_id)
    return query


def messages_after_cut(chat: Chat) -> int:
    return db.session.scalar(_after_cut(chat).with_only_columns(sa.func.count()))


def compact_if_needed(chat: Chat) -> bool:
    """Enqueue a compaction when the history after the cut passes the threshold; False when none is needed or
    one is already queued or running (it works through the whole backlog)."""
    threshold, _ = thresholds()
    if messages_after_cut(chat) <= threshold:
        return False
    return enqueue(compact_chat, chat.id) is not None


@recorded_job(
    "compact",
    "Compact chat history",
    target=lambda chat_id: job_target(chat=chat_id),
    of=Chat,
    unique="active",
    timeout=backlog_time,
)
def compact_chat(chat_id: int) -> dict[str, Any]:
    """Summarize all but the newest messages after the cut into the chat's memory_doc, a batch at a time."""
    counts = _compact_batch(chat_id)
    batches = 1
    while counts.get("summarized"):  # a long backlog: the next batch, until under the threshold
        following = _compact_batch(chat_id)
        if not following.get("summarized"):
            break
        counts["summarized"] += following["summarized"]
        counts["kept"] = following["kept"]
        batches += 1
    return counts if batches == 1 else {**counts, "batches": batches}


def _compact_batch(chat_id: int) -> dict[str, Any]:
    """Summarize the oldest messages beyond the recent ones (within the input limit), and move the cut."""
    chat = db.session.get(Chat, chat_id)
    if chat is None:
        return {"skipped": "no such chat"}
    threshold, keep_recent = thresholds()
    messages = db.session.scalars(
        _after_cut(chat).options(joinedload(Message.user), joinedload(Message.agent)).order_by(Message.id)
    ).all()
    if len(messages) <= threshold:
        return {"skipped": "under the threshold", "messages": len(messages)}
    lines = [f"{m.author_name}: {m.content}" for m in (messages[:-keep_recent] if keep_recent else messages)]
    target, old_cut = _target_for(chat), chat.compacted_through_message_id
    lines = _oldest_within(
        lines, target.chunk_tokens("COMPACTION_MAX_INPUT_TOKENS", targets.COMPACTION_INPUT_CAP)
    )
    old = messages[: len(lines)]
    transcript = "\n".join(lines)
    agent_id = (
        chat.agents[0].id if chat.agents else None
    )  # whose model it is by default; the ledger is per agent
    last_id, heading = old[-1].id, f"## Through {old[-1].created_at:%Y-%m-%d %H:%M} UTC"
    db.session.commit()  # hold no transaction while the model thinks
    result = llm.complete(
        target,
        [{"role": "system", "content": render("compaction.txt")}, {"role": "user", "content": transcript}],
        purpose="compact",
        agent_id=agent_id,
        chat_id=chat_id,
    )
    summary = result.text.strip()  # never empty: llm.complete fails an empty answer
    moved = _append_summary(chat_id, old_cut, last_id, f"{heading}\n\n{summary}")
    return {"summarized": len(old) if moved else 0, "kept": len(messages) - len(old), "raced": int(not moved)}


def _oldest_within(lines: list[str], max_tokens: int) -> list[str]:
    """The oldest lines that fit max_tokens (at least one), so no summary request outgrows a context window."""
    used = 0
    for count, line in enumerate(lines):
        used += count_tokens(line)
        if used > max_tokens and count:
            return lines[:count]
    return lines


def _target_for(chat: Chat) -> targets.ModelTarget:
    """COMPACTION_MODEL_ID at the environment's connection when set, else the background model of the chat's
    first agent (its own model unless the account chose one for memory jobs)."""
    configured = current_app.config["COMPACTION_MODEL_ID"]
    if configured:
        return targets.for_environment(configured)
    if chat.agents:
        return targets.for_background(chat.agents[0])
    return targets.for_environment(current_app.config["DEFAULT_MODEL_ID"])


def _append_summary(chat_id: int, old_cut: int | None, last_id: int, section: str) -> bool:
    """Append the section and move the cut in one statement, only if no other compaction moved it first."""
    new_doc = sa.case((Chat.memory_doc == "", section), else_=Chat.memory_doc + "\n\n" + section)
    same_cut = (
        Chat.compacted_through_message_id.is_(None)
        if old_cut is None
        else Chat.compacted_through_message_id == old_cut
    )
    moved = db.session.execute(
        sa.update(Chat)
        .where(Chat.id == chat_id, same_cut)
        .values(memory_doc=new_doc, compacted_through_message_id=last_id)
        .execution_options(synchronize_session=False)
    ).rowcount
    db.session.commit()
    return bool(moved)
