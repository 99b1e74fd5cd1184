"""A real MCP server for the tests of tool servers (issue 41), built on the `mcp` SDK's own MCPServer:
`python tests/mcp_tool_server.py stdio` or `python tests/mcp_tool_server.py http PORT [TOKEN]`.

Its tools: echo (says back what it was given, and the environment value GREETING), big (a result of N
megabytes), hang (never answers), fail (answers with a tool error), whoami (its process id, so a test sees it
was started again). Over HTTP, a TOKEN makes every request without `Authorization: Bearer TOKEN` a 401.
"""

import asyncio
import os
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

server = MCPServer("cairn-test-tools", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Say the text back, with the server's GREETING."""
    return f"{os.environ.get('GREETING', 'hello')}: {text}"


@server.tool()
def big(megabytes: int = 5) -> str:
    """A result of that many megabytes."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "late"


@server.tool()
def fail() -> str:
    """Fails."""
    raise ValueError("the tool broke on purpose")


@server.tool()
def whoami() -> str:
    """This server's process id."""
    return str(os.getpid())


class _Bearer:
    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (f"Bearer {self.token}".encode(), b"authorization") not in [
            (value, name) for name, value in scope["headers"]
        ]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        app = server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
        )
        if len(sys.argv) > 3:
            app = _Bearer(app, sys.argv[3])
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
