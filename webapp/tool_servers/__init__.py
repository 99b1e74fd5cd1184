"""Tool servers (MCP) as tool sources: what each lists, its health, and a call of one of its tools in a reply.

Admins add a server (webapp.admin.tool_servers, `flask tools`); `refresh` asks it for its tools and keeps them
on its row, so replies never ask. An agent's form offers each listed tool, off by default; webapp.tools.from_servers
turns the agent's enabled ones into registry tools named `server__tool`, which the reply's tool loop offers and
runs beside the memory tools (`call` here). Memory jobs never offer them.

A call ends at the server's timeout; its result is cut to RESULT_CHARS with a note; a failure goes back to the
model as the tool's error, and the server is marked down, so the next replies leave its tools out (and say so)
for DOWN_SECONDS before trying it again. No secret (an environment value, a header) is in any text this module
returns: `_scrubbed` takes each out of errors and results.
"""

import json
from datetime import timedelta
from typing import Any

import jsonschema

from webapp.extensions import db
from webapp.models.tool_servers import ToolServer, offered_name
from webapp.timeutil import utcnow
from webapp.tool_servers.client import POOL, CallTimedOut, ServerDown, Spec

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
        return f"Its input schema is not valid JSON Schema: {error.message[:200]}"
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


__all__ = ["call", "cut_result", "is_resting", "refresh", "spec_of"]
