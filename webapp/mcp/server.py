"""The MCP server (the official SDK's MCPServer) for one agent's memory, acting as one person.

Over stdio (`flask mcp serve`) the agent and the person are fixed when it starts; over HTTP one server answers
for every key and agent, and each request says who (http.py puts its Caller in the request's scope). Either
way the person and the agent are loaded afresh on every call, so a revoked key, a removed person or a changed
"members may see" setting applies at once. Tools are plain functions run in the SDK's worker threads, each
inside an app context of its own.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from flask import Flask
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from pydantic import Field

from webapp.actions import forgetting, memory
from webapp.actions.memory import Refused
from webapp.extensions import db
from webapp.models import Agent, User
from webapp.models.api_keys import key_for_bearer
from webapp.models.memories import MAX_CONTENT_CHARS

CALLER = "cairn.mcp.caller"  # the key of a request's Caller in its ASGI scope (set by http.py)
T = TypeVar("T")

INSTRUCTIONS = (
    "The long-term memory of one Cairn agent, as the person this connection acts for may hear it: search it "
    "(and the agent's conversations they may read) before answering about the past, save what the agent "
    "should remember, and list what its prompt holds. Its core memory is a resource: memory://<agent>/core."
)
SEARCH = (
    "Search the agent's long-term memory (core memories and journal entries, faded ones included) and the "
    "messages of its conversations that you may read. Give a few distinctive words or a question; you get the "
    "best matches with their dates, a message with the turns around it, and its conversation's id."
)
SAVE = (
    "Save something to the agent's long-term memory, told by you: 'journal' for facts and context worth "
    "keeping for now (journal entries fade from its prompt after 7 days, still found by search_memory), "
    "'core' for lasting facts, preferences and relationships (permanent). One clear, self-contained statement "
    "per call. It is heard only where you are (a private chat of yours with the agent)."
)
FORGET = (
    "Forget one of the agent's memories that was drawn from a chat of yours (by its memory_id): it no longer "
    "reaches any reply, search or client. Only memories drawn from your own chats can be forgotten this way; an "
    "admin can bring one back."
)
PROMPT = (
    "List what the agent's prompt holds of its memory when you start a new chat with it: its constitutional "
    "memories, core memories and the last week's journal, within its memory budget, and how many did not fit."
)


@dataclass(frozen=True)
class Caller:
    """Who a call acts as: the agent, and the person (by id) or the API key whose person it is."""

    agent_id: int
    user_id: int | None = None
    key: str | None = None  # checked again at every call, so revoking it ends the session's access


def build_server(app: Flask, caller: Caller | None = None, *, agent_slug: str | None = None) -> MCPServer:
    """The server: for one fixed caller (stdio, whose agent's core memory is then listed as a resource under
    agent_slug), or for whoever each HTTP request's scope names."""
    server = MCPServer("Cairn", instructions=INSTRUCTIONS, log_level="WARNING")

    def acting(ctx: Context | None, action: Callable[[User, Agent], T], error: type = ToolError) -> T:
        who = caller or ctx.request_context.request.scope[CALLER]
        with app.app_context():
            try:
                return action(*_person_and_agent(who))
            except Refused as refusal:
                raise error(str(refusal)) from None

    @server.tool(description=SEARCH)
    def search_memory(
        query: Annotated[str, Field(min_length=1, max_length=200, description="A few words or a question.")],
        ctx: Context,
    ) -> dict[str, Any]:
        return acting(ctx, lambda user, agent: memory.search_memory(user, agent, query))

    @server.tool(description=SAVE)
    def save_memory(
        content: Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)],
        ctx: Context,
        memory_type: Literal["journal", "core"] = "journal",
    ) -> dict[str, Any]:
        return acting(ctx, lambda user, agent: memory.save_memory(user, agent, content, memory_type))

    @server.tool(description=FORGET)
    def forget_memory(
        memory_id: Annotated[
            int, Field(ge=1, description="The memory_id search_memory or prompt_memory gave.")
        ],
        ctx: Context,
    ) -> dict[str, Any]:
        return acting(
            ctx,
            lambda user, agent: _forgotten(forgetting.forget(user, memory_id, via="forget-mcp", agent=agent)),
        )

    @server.tool(description=PROMPT)
    def prompt_memory(ctx: Context) -> dict[str, Any]:
        return acting(ctx, memory.prompt_memory)

    @server.resource("memory://{agent}/core", name="core-memory", mime_type="text/markdown")
    def core_memory(agent: str, ctx: Context) -> str:
        """The agent's core memory (memory://<agent-slug>/core), as you may hear it."""
        return acting(ctx, lambda user, found: _core_of(user, found, agent), ResourceError)

    if caller is not None and agent_slug:

        @server.resource(f"memory://{agent_slug}/core", name="core-memory", mime_type="text/markdown")
        def this_agents_core_memory() -> str:
            """The agent's core memory, as you may hear it."""
            return acting(None, memory.core_memory, ResourceError)

    return server


def _forgotten(memory) -> dict[str, Any]:
    return {"forgotten": memory.id, "content": memory.content}


def _core_of(user: User, agent: Agent, slug: str) -> str:
    if slug != agent.slug:
        raise ResourceNotFoundError(f"This connection is to memory://{agent.slug}/core, not {slug!r}.")
    return memory.core_memory(user, agent)


def _person_and_agent(caller: Caller) -> tuple[User, Agent]:
    """The person and the agent a call acts for, as they are now; Refused when the key or person is gone."""
    if caller.key is not None:
        key = key_for_bearer(f"Bearer {caller.key}")
        user = key.user if key is not None else None
    else:
        user = db.session.get(User, caller.user_id)
    if user is None or user.is_removed:
        raise Refused("This API key was revoked, or its person removed from Cairn: make a new key.")
    agent = db.session.get(Agent, caller.agent_id)
    if agent is None or agent.account_id != user.account_id:
        raise Refused("This agent is no longer in your Cairn account.")
    return user, agent
