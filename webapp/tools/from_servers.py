"""Tools of the account's tool servers (MCP) as registry tools, for the agents that enabled them: named
`server__tool`, shown as "Using time: get current time…" then "time: <the start of its result>", run by
webapp.tool_servers.call. A server found down lately is left out, and the reply says so in its first step."""

from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent, ToolServer
from webapp.models.tool_servers import SEPARATOR, is_offered_name
from webapp.tool_servers import call, is_resting
from webapp.tools.base import Tool, cut


def offered_tools(agent: Agent) -> tuple[dict[str, Tool], list[ToolServer]]:
    """The agent's enabled tools of its account's servers, as registry tools by offered name; and the servers
    whose enabled tools are left out because they are down. One query, and none for an agent with no such tool
    enabled."""
    wanted = {name for name in agent.enabled_tools or [] if is_offered_name(name)}
    if not wanted:
        return {}, []
    prefixes = {name.split(SEPARATOR, 1)[0] for name in wanted}
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
        run=lambda _context, **arguments: call(server_id, tool_name, arguments),
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


def down_notice(servers: list[ToolServer]) -> list[dict[str, Any]]:
    """The steps a reply shows for the servers whose tools it is without: "time is down, so …"."""
    return [
        {
            "tool": server.name,
            "state": "failed",
            "chip": f"{server.name} is down, so this reply is without its tools: {cut(server.status_error or '')}",
        }
        for server in servers
    ]
