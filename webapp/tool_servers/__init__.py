"""Tool servers (MCP) as tool sources: what each lists, its health, and a call of one of its tools in a reply.

Admins add a server (webapp.admin.tool_servers, `flask tools`); `refresh` asks it for its tools and keeps them
on its row, so replies never ask. An agent's form offers each listed tool, off by default; `offered_tools` turns
the agent's enabled ones into registry tools (webapp.tools.base.Tool) named `server__tool`, which the reply's
tool loop offers and runs beside the memory tools. Memory jobs never offer them.

A call ends at the server's timeout; its result is cut to RESULT_CHARS with a note; a failure goes back to the
model as the tool's error, and the server is marked down, so the next replies leave its tools out (and say so)
for DOWN_SECONDS before trying it again. No secret (an environment value, a header) is in any text this module
returns: `_scrubbed` takes each out of errors and results.
"""

import json
import logging
from datetime import timedelta
from typing import Any

import jsonschema
import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent
from webapp.models.tool_servers import ToolServer, is_offered_name, offered_name
from webapp.timeutil import utcnow
from webapp.tool_servers.client import POOL, CallTimedOut, ServerDown, Spec
from webapp.tools.base import Tool, ToolContext, cut

log = logging.getLogger(__name__)
RESULT_CHARS = 16_000  # what a tool's result may bring into the prompt (about 4,000 tokens)
DOWN_SECONDS = 60  # a server found down is left out of replies this long, then tried again
LIST_SECONDS = 30  # how long a listing may take


def spec_of(server: ToolServer) -> Spec:
    return Spec(
        server_id=server.id,
        kind=server.kind,
        command=server.command,
        arguments=tuple(server.arguments or ()),
        url=server.url,
        secrets=server.secrets,
    )


# --- listing ---


def refresh(server: ToolServer) -> str | None:
    """Ask the server for its tools and keep them on its row (not committed); None, or what failed in words.
    A tool whose input schema is no JSON Schema is kept with its problem and never offered."""
    try:
        listed = POOL.list_tools(spec_of(server), LIST_SECONDS)
    except (ServerDown, CallTimedOut) as error:
        return _mark_down(server, str(error))
    except Exception as error:  # noqa: BLE001 (whatever a server answers, the page says it in words)
        return _mark_down(server, f"It answered something unexpected: {type(error).__name__}: {error}")
    server.tools = [_listed(server.name, tool) for tool in listed]
    server.listed_at = utcnow()
    _mark_up(server)
    return None


def _listed(server_name: str, tool: Any) -> dict[str, Any]:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else None
    return {
        "name": tool.name,
        "offered_name": offered_name(server_name, tool.name),
        "description": (tool.description or "")[:2_000],
        "input_schema": schema,
        "problem": _schema_problem(schema),
    }


def _schema_problem(schema: dict[str, Any] | None) -> str | None:
    """Why a tool's input schema cannot be offered to a model, or None."""
    if schema is None:
        return "Its input schema is not a JSON object."
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        return f"Its input schema is not valid JSON Schema: {cut(error.message)}"
    if schema.get("type", "object") != "object":
        return "Its input schema does not describe an object of arguments."
    return None


# --- health ---


def _mark_down(server: ToolServer, why: str) -> str:
    why = _scrubbed(why, server)
    server.status, server.status_error, server.checked_at = "down", why, utcnow()
    return why


def _mark_up(server: ToolServer) -> None:
    server.status, server.status_error, server.checked_at = "ok", None, utcnow()


def is_resting(server: ToolServer) -> bool:
    """Found down within DOWN_SECONDS: replies leave its tools out."""
    recent = server.checked_at is not None and server.checked_at > utcnow() - timedelta(seconds=DOWN_SECONDS)
    return server.status == "down" and recent


# --- in a reply ---


def offered_tools(agent: Agent) -> tuple[dict[str, Tool], list[ToolServer]]:
    """The agent's enabled tools of its account's servers, as registry tools by offered name; and the servers
    whose enabled tools are left out because they are down (the chat says so). One query, and none for an agent
    with no such tool enabled."""
    wanted = {name for name in agent.enabled_tools or [] if is_offered_name(name)}
    if not wanted:
        return {}, []
    prefixes = {name.split("__", 1)[0] for name in wanted}
    servers = db.session.scalars(
        sa.select(ToolServer).where(ToolServer.account_id == agent.account_id, ToolServer.name.in_(prefixes))
    ).all()
    tools: dict[str, Tool] = {}
    resting = []
    for server in servers:
        enabled = [tool for tool in server.usable_tools if tool["offered_name"] in wanted]
        if enabled and is_resting(server):
            resting.append(server)
            continue
        tools.update((tool["offered_name"], _registry_tool(server, tool)) for tool in enabled)
    return tools, resting


def _registry_tool(server: ToolServer, listed: dict[str, Any]) -> Tool:
    server_id, server_name, tool_name = server.id, server.name, listed["name"]
    words = tool_name.replace("_", " ")
    return Tool(
        name=listed["offered_name"],
        description=listed["description"] or f"{tool_name}, a tool of {server_name}",
        parameters=listed["input_schema"],
        run=lambda context, **arguments: call(server_id, tool_name, arguments),
        label=lambda _arguments, _chat: f"Using {server_name}: {words}…",
        chip=lambda arguments, result, _chat: {
            "chip": f"{server_name}: {cut(result.get('result', ''))}",
            "server": server_name,
            "server_tool": tool_name,
            "arguments": arguments,
            "result": result.get("result", ""),
        },
        failure=f"use {server_name}: {words}",
    )


def call(server_id: int, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call the tool; its result ({"result": text}) or its error ({"error": words}) for the model."""
    server = db.session.get(ToolServer, server_id)
    if server is None:
        return {"error": "This tool's server was removed."}
    try:
        answer = POOL.call(spec_of(server), tool_name, arguments, server.timeout_seconds)
    except CallTimedOut as error:
        return {"error": f"{error} The call was given up."}
    except ServerDown as error:
        why = _mark_down(server, str(error))
        db.session.commit()
        return {"error": f"The tool's server is down: {why}"}
    except Exception as error:  # noqa: BLE001 (the server's own error: the model reads it and goes on)
        return {"error": _scrubbed(f"{type(error).__name__}: {error}", server)}
    if server.status != "ok":
        _mark_up(server)
        db.session.commit()
    text = _scrubbed(_text_of(answer), server)
    if answer.is_error:
        return {"error": cut_result(text) or "The tool failed without saying why."}
    return {"result": cut_result(text)}


def _text_of(answer: Any) -> str:
    """The result's words: its text blocks, else its structured content as JSON; other blocks named."""
    parts = []
    for block in answer.content or []:
        text = getattr(block, "text", None)
        if text is not None:
            parts.append(text)
        else:
            parts.append(
                f"[{getattr(block, 'type', 'content')} {getattr(block, 'mime_type', '') or ''}]".strip()
            )
    if not parts and answer.structured_content is not None:
        parts.append(json.dumps(answer.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def cut_result(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    return (
        f"{text[:RESULT_CHARS]}\n[Cut: the result was {len(text):,} characters; only the first {RESULT_CHARS:,} "
        "are here.]"
    )


def _scrubbed(text: str, server: ToolServer) -> str:
    for value in server.secrets.values():
        if len(value) >= 4:
            text = text.replace(value, "•••")
    return text


def down_notice(servers: list[ToolServer]) -> list[dict[str, Any]]:
    """The steps a reply shows for tools left out: "time is down: answering without its tools"."""
    return [
        {
            "tool": server.name,
            "state": "failed",
            "chip": f"{server.name} is down, so this reply is without its tools: {cut(server.status_error or '')}",
        }
        for server in servers
    ]


__all__ = ["ToolContext", "call", "down_notice", "offered_tools", "refresh", "spec_of"]
