"""Prompt assembly: the one function that builds the messages for an agent's activation (DESIGN.md section 4).

Stable text first so providers can cache the prefix: the agent's system prompt, the chat's summary of its
compacted history, then the transcript after the cut, then the volatile context (memory, other conversations,
borrowed context, time, participants) at the end.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import joinedload, lazyload

from webapp import search
from webapp.extensions import db
from webapp.llm import targets
from webapp.llm.targets import ModelTarget
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message, User, public_ids
from webapp.models.access import (
    chats_heard_in,
    joined_ids,
    memories_heard,
    memories_heard_from,
    memory_chats_heard,
    split_ids,
)
from webapp.models.chats import other_conversation_summaries
from webapp.models.memories import active_memories
from webapp.models.memory_budget import MemoryWithin, memories_within
from webapp.prompting import render
from webapp.prompting.window import TRUNCATION_NOTE, fit_to_budget, text_tokens
from webapp.search.terms import terms
from webapp.timeutil import utcnow
from webapp.tools import ReplyTools, reply_tools, schemas_for

MEMORY_SHARE = 3  # memory takes at most a third of the input budget
SUMMARY_SHARE = 6  # the conversation's summary at most a sixth
RELEVANT_MEMORIES = 8  # memories chosen by what the conversation is about, before the most recent
QUERY_TURNS = 3  # the newest messages whose words search the memory: the latest person's, and around it
QUERY_MESSAGE_CHARS = 1000
# Words of the turns around the message added to its own: enough to carry a follow-up's topic; each word more
# is more rows for the word search to rank (bench.prompt_memory).
QUERY_CONTEXT_WORDS = 8
QUERY_EMBEDDED_CHARS = 300  # of the message, embedded for the search by meaning (about 60 tokens)


@dataclass
class Sources:
    """What went into a prompt, as ids (recorded with the reply as its provenance)."""

    memory_ids: list[int] = field(default_factory=list)
    conversation_summary: bool = False
    summary_chat_ids: list[int] = field(default_factory=list)
    borrowed_chat_id: int | None = None


@dataclass
class Prompt:
    messages: list[dict[str, Any]]
    target: ModelTarget  # the model it is for, whose window it fits
    # The staged borrowed context this prompt included; the reply clears exactly this once it succeeds.
    borrowed_context: dict[str, Any] | None = None
    sources: Sources = field(default_factory=Sources)
    # The tools it offers (the request's schemas are counted in its budget), and those left out, as steps.
    tools: ReplyTools = field(default_factory=lambda: ReplyTools({}, []))


def build_prompt(chat: Chat, agent: Agent, *, before_message_id: int | None = None) -> Prompt:
    """The messages for an activation of the agent's own model, and the borrowed context they include."""
    now, target = utcnow(), targets.for_agent(agent)
    recent = _recent_messages(chat, before_message_id)
    transcript, truncated = _transcript(target, recent, agent)
    heard = chats_heard_in(chat)  # reads who is present in the chat once, for every part of the prompt
    # The query's embedding runs on its thread while the other parts are read; the memory is chosen after them.
    memory_chosen = started_memory(target, chat, agent, now, recent, chats=heard)
    borrowed = _staged_borrowed_context(chat, agent, heard)
    borrowed_section = _borrowed_section(borrowed)
    summaries = other_conversation_summaries(agent, exclude_chat_id=chat.id, heard=heard)
    others, now_section = _other_conversations_section(summaries, agent), _now_section(chat, agent, now)
    so_far = _conversation_so_far(target, chat)
    memory, listed = memory_chosen()
    context = [listed, others, borrowed_section, now_section]
    if truncated:
        context.insert(0, TRUNCATION_NOTE)
    messages = [
        {"role": "system", "content": agent.identity()},
        *so_far,
        *transcript,
        {"role": "system", "content": "\n\n".join(part for part in context if part)},
    ]
    sources = Sources(
        memory_ids=memory.ids,
        conversation_summary=bool(so_far),
        summary_chat_ids=[s.chat_id for s in summaries],
        borrowed_chat_id=public_ids.decode(borrowed["source_conversation_id"]) if borrowed_section else None,
    )
    tools = reply_tools(agent, chat)
    fit_to_budget(target, messages, schemas_for(tools.tools.values()))
    return Prompt(messages, target, borrowed if borrowed_section else None, sources, tools)


def memory_budget(target: ModelTarget, agent: Agent) -> int:
    """The tokens the memory section of a prompt for the target's model may take: the agent's own setting, or
    the global one, and never more than a third of the input budget (a small window holds the tools and the
    conversation too)."""
    setting = agent.memory_token_budget or current_app.config["MEMORY_TOKEN_BUDGET"]
    return min(setting, target.input_budget() // MEMORY_SHARE)


def _conversation_so_far(target: ModelTarget, chat: Chat) -> list[dict[str, str]]:
    """Spec 004: the summary of the history before the cut; it changes only when a compaction runs.

    The summary grows by a section per compaction, so only its newest sections within a token budget go in
    (MEMORY_DOC_PROMPT_TOKENS, and at most a sixth of the input budget).
    """
    doc = chat.memory_doc.strip()
    if not doc:
        return []
    sections = doc.split("\n\n## ")
    budget = min(current_app.config["MEMORY_DOC_PROMPT_TOKENS"], target.input_budget() // SUMMARY_SHARE)
    kept, used = [], 0
    for section in reversed(sections):
        used += text_tokens(target, section)
        if used > budget and kept:
            break
        kept.append(section)
    text = "\n\n## ".join(reversed(kept))
    if len(kept) < len(sections):
        text = f"(Older parts of this summary are left out.)\n\n## {text}"
    return [{"role": "system", "content": f"# Conversation so far\n\n{text}"}]


def _recent_messages(chat: Chat, before_message_id: int | None) -> list[Message]:
    """The chat's newest finished messages after its summary's cut (and before the message being answered),
    newest first: one more than the transcript may hold, so it can tell whether any were cut."""
    query = (
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent), lazyload(Message.sources))
        .where(Message.chat_id == chat.id, Message.status == "done", Message.content != "")
        .order_by(Message.id.desc())
        .limit(current_app.config["TRANSCRIPT_MAX_MESSAGES"] + 1)
    )
    if before_message_id is not None:
        query = query.where(Message.id < before_message_id)
    if chat.compacted_through_message_id:
        query = query.where(Message.id > chat.compacted_through_message_id)
    return list(db.session.scalars(query))


def _transcript(
    target: ModelTarget, newest_first: list[Message], agent: Agent
) -> tuple[list[dict[str, str]], bool]:
    """The most recent finished messages that fit the token budget, oldest first; and whether any were cut."""
    budget = current_app.config["TRANSCRIPT_TOKEN_BUDGET"]
    kept: list[dict[str, str]] = []
    used = 0
    for message in newest_first[: current_app.config["TRANSCRIPT_MAX_MESSAGES"]]:
        entry = _transcript_entry(message, agent)
        used += text_tokens(target, entry["content"])
        if used > budget and kept:
            break
        kept.append(entry)
    return kept[::-1], len(kept) < len(newest_first)


def _transcript_entry(message: Message, agent: Agent) -> dict[str, str]:
    if message.role == "assistant" and message.agent_id == agent.id:
        return {"role": "assistant", "content": message.content}
    return {"role": "user", "content": f"{message.author_name}: {message.content}"}


def prompt_memory(
    target: ModelTarget,
    chat: Chat,
    agent: Agent,
    now: datetime,
    recent: list[Message] | None = None,
    *,
    chats: sa.ColumnElement[bool] | None = None,
) -> tuple[MemoryWithin, str]:
    """The memories the agent's prompt in this chat holds now, within its memory budget, and the section that
    lists them: what the prompt and the chat's memory page both show. First the constitutional memories, then
    those that best match the conversation (found by recall's search, queried with the chat's latest
    messages), then the most recent. `recent`: the chat's newest messages, newest first, if already read;
    `chats`: chats_heard_in(chat), if already asked.

    Only what everyone who may read the chat may hear (webapp.models.access.memories_heard_in), inside the
    queries: the search, the budget and the counts of what was left out."""
    return started_memory(target, chat, agent, now, recent, chats=chats)()


def started_memory(
    target: ModelTarget,
    chat: Chat,
    agent: Agent,
    now: datetime,
    recent: list[Message] | None = None,
    *,
    chats: sa.ColumnElement[bool] | None = None,
) -> Callable[[], tuple[MemoryWithin, str]]:
    """prompt_memory in two halves: this one asks whether there are memories here (and vectors) and starts the
    query's embedding; what it returns searches, fits the budget and writes the section (when the rest is read)."""
    if recent is None:
        recent = _recent_messages(chat, None)
    budget = memory_budget(target, agent)
    chats = chats if chats is not None else chats_heard_in(chat)
    active = active_memories(agent.id).whereclause
    scope = (active, memories_heard(chats))
    # (IS NOT TRUE: "= false" would lead SQLite to the constitutional flag's index, over every agent's rows)
    not_constitutional = AgentMemory.constitutional.is_not(True)
    any_memory, any_to_rank, vectors, chats_joined = db.session.execute(
        sa.select(
            sa.exists().where(*scope),
            sa.exists().where(*scope, not_constitutional),
            search.backend().vectors_held(agent.id),
            joined_ids(memory_chats_heard(agent.id, chats)),
        )
    ).one()
    # The chats whose memories are heard here, as ids: the search's and the budget's scope (its statements are
    # built once and given them: memories_within).
    heard_chats = split_ids(chats_joined)
    rankable = (
        active,
        memories_heard_from(search.backend().among(AgentMemory.chat_id, heard_chats)),
        not_constitutional,
    )
    # A new agent has nothing to rank (no query embedding, no search) and nothing to list (no budget queries).
    query = _memory_query(recent)
    ranked = _relevant_memories(agent, chat, rankable, *query, vectors=vectors) if any_to_rank else list

    def chosen() -> tuple[MemoryWithin, str]:
        relevant = ranked()
        within = (
            memories_within(agent.id, now, budget, relevant, heard_chats=heard_chats)
            if any_memory
            else MemoryWithin(now=now)
        )
        return within, _memory_section(target, within, agent, budget)

    return chosen


def _memory_query(newest_first: list[Message]) -> tuple[str, str]:
    """What the prompt's memory is searched by: the latest person's message, and a few words of the turns around
    it that the message does not have ("" and "" when no person has written yet)."""
    readable = [m for m in newest_first if m.role in ("user", "assistant") and m.content.strip()]
    latest = next((m for m in readable if m.role == "user"), None)
    if latest is None:
        return "", ""
    message = _cut(latest.content, QUERY_MESSAGE_CHARS)
    asked = set(terms(message))
    around = [
        w for m in readable[:QUERY_TURNS] if m is not latest for w in terms(m.content) if w not in asked
    ]
    return message, " ".join(list(dict.fromkeys(around))[:QUERY_CONTEXT_WORDS])


def _cut(text: str, chars: int) -> str:
    """At most `chars` of text, ending at a whole word."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars].rsplit(" ", 1)[0]


def _relevant_memories(
    agent: Agent,
    chat: Chat,
    scope: tuple[sa.ColumnElement[bool], ...],
    message: str,
    around: str,
    *,
    vectors: bool,
) -> Callable[[], list[int]]:
    """What gives, once called, the ids of the agent's memories within `scope` (any active one heard here but the
    constitutional, listed anyway) that best match the conversation, best first (the query's embedding starts
    now, if `vectors`): the search the recall tool runs, by the words of the message and a few of the turns
    around it, and by the meaning of the message alone (an embedding takes longer the longer its text, and the
    question is what the reply is about). The search by meaning runs after the words, on the prompt's
    connection: it waits for the query's embedding, which takes longer than the words (a thread and a
    connection of its own added a second session and its round trips; bench.job_overhead)."""
    if not message:
        return list
    embedded = _cut(message, QUERY_EMBEDDED_CHARS)
    vector = search.query_vector(embedded, agent_id=agent.id, chat_id=chat.id, vectors=vectors)
    words = f"{message}\n{around}"
    return lambda: search.memory_ids(
        agent.id, words, RELEVANT_MEMORIES, *scope, vector=vector, meanwhile=False
    )


def _memory_section(target: ModelTarget, within: MemoryWithin, agent: Agent, budget: int) -> str:
    """The memory section within its token budget: what did not fit is left out, and the section says so."""
    can_recall = "recall" in (agent.enabled_tools or [])
    while (
        used := text_tokens(target, text := render("memory.txt", within=within, can_recall=can_recall))
    ) > budget:
        listed = len(within.listed)
        if not listed:
            break  # only the headings and the note are left
        # The running sum estimated in cl100k; the rendered text in the model's tokens is what counts. Leave
        # out about as many memories as the excess takes, then count again.
        for _ in range(max(1, (used - budget) * listed // used)):
            within.drop_last()
    return text


def _other_conversations_section(summaries: list[ChatAgent], agent: Agent) -> str | None:
    """Spec 003: the agent's own summaries of its other active chats, under their opaque ids."""
    if not summaries:
        return None
    return render(
        "cross_conversation/other_conversations.txt",
        summaries=summaries,
        can_borrow="borrow_context" in (agent.enabled_tools or []),
    )


def _staged_borrowed_context(
    chat: Chat, agent: Agent, heard: sa.ColumnElement[bool]
) -> dict[str, Any] | None:
    """What the agent borrowed for this chat, read fresh from the database (not the session's copy), while the
    chat it came from may still be heard here (`heard`: chats_heard_in(chat); a person added here since, or that
    chat made private, ends it)."""
    staged = db.session.scalar(
        sa.select(ChatAgent.borrowed_context_json).where(
            ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id
        )
    )
    if not staged:
        return None
    source_id = public_ids.decode(str(staged.get("source_conversation_id", "")))
    still_heard = sa.exists().where(Chat.id == source_id, heard)
    return staged if source_id is not None and db.session.scalar(sa.select(still_heard)) else None


def _borrowed_section(borrowed: dict[str, Any] | None) -> str | None:
    if not borrowed or not borrowed.get("messages"):
        return None
    return render("cross_conversation/borrowed_context.txt", borrowed=borrowed)


TEMPORARY_NOTE = "This conversation is temporary: nothing said in it will be remembered after it."


def _now_section(chat: Chat, agent: Agent, now: datetime) -> str:
    agents = [f"{a.name} (you)" if a.id == agent.id else f"{a.name} (agent)" for a in chat.agents]
    people = db.session.scalars(
        sa.select(User)
        .where(User.id.in_(sa.select(Message.user_id).where(Message.chat_id == chat.id)))
        .order_by(User.id)
    )
    participants = agents + [f"{u.display_name} (person)" for u in people]
    temporary = "" if chat.remembers else f"\n{TEMPORARY_NOTE}"
    return (
        f"# Now\n\nCurrent time: {now:%Y-%m-%d %H:%M} UTC\n"
        f"Conversation: {chat.model_title}\nParticipants: {', '.join(participants)}{temporary}"
    )
