"""MCP sessions of this process, one per tool server, kept open between calls.

The SDK's client is asynchronous; Cairn's jobs are threads. So one event loop runs in a thread of its own
(`_loop`), and `call` and `list_tools` hand it a coroutine and wait for the answer. A stdio server is started by
the first call that needs it in this process and reused by every thread after; an HTTP server's session is
reused the same way. A session whose server died or hung up is closed and started again once, at the next call.

A session is keyed by the server's id and a digest of everything it was started with (command, arguments,
address, secrets): a server changed on the Tools page gets a new session, and the old one is closed.
"""

import asyncio
import hashlib
import json
import logging
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

log = logging.getLogger(__name__)
START_SECONDS = 20  # a server that has not answered its handshake by then is down


class ServerDown(Exception):
    """The server could not be started or reached, or stopped answering: said in words, without a secret."""


class CallTimedOut(Exception):
    """The tool did not answer within the server's timeout."""


@dataclass(frozen=True)
class Spec:
    """Everything a session is started with."""

    server_id: int
    kind: str  # "stdio" or "http"
    command: str | None = None
    arguments: tuple[str, ...] = ()
    url: str | None = None
    secrets: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> tuple[int, str]:
        shape = [self.kind, self.command, list(self.arguments), self.url, sorted(self.secrets.items())]
        return self.server_id, hashlib.sha256(json.dumps(shape).encode()).hexdigest()


class _Session:
    """One open client, entered and left by its own task (anyio's cancel scopes ask for that)."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.client: Client | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._failure: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._hold())

    async def _hold(self) -> None:
        try:
            async with Client(_server(self.spec), mode="legacy") as client:
                self.client = client
                self._ready.set()
                await self._closing.wait()
        except BaseException as error:  # noqa: BLE001 (any failure of the server is told at the next call)
            self._failure = error
        finally:
            self.client = None
            self._ready.set()

    async def ready(self) -> Client:
        try:
            await asyncio.wait_for(self._ready.wait(), START_SECONDS)
        except TimeoutError:
            self.close()
            raise ServerDown(f"It did not answer within {START_SECONDS} s of being started.") from None
        if self.client is None:
            raise ServerDown(_words(self._failure))
        return self.client

    def close(self) -> None:
        self._closing.set()
        if not self._ready.is_set():
            self._task.cancel()


def _server(spec: Spec) -> Any:
    if spec.kind == "stdio":
        # The server's environment: its own values over a PATH to find its command, and nothing else of Cairn's.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **spec.secrets}
        return StdioServerParameters(command=spec.command or "", args=list(spec.arguments), env=env)
    http = httpx2.AsyncClient(headers=spec.secrets, timeout=httpx2.Timeout(30, read=300))
    return streamable_http_client(spec.url or "", http_client=http)


def _hung_up(error: BaseException) -> bool:
    """Whether the error says the session is gone (its process ended, the connection closed), not the tool."""
    if isinstance(error, MCPError):
        return error.code == CONNECTION_CLOSED
    return isinstance(error, _GONE)


_GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError, httpx2.HTTPError)


class Pool:
    """This process's sessions, on its event loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="mcp-sessions", daemon=True).start()
            return self._loop

    def _run(self, coroutine, seconds: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())
        try:
            return future.result(seconds)
        except FutureTimeout:
            future.cancel()
            raise CallTimedOut(f"It did not answer within {seconds:g} s.") from None

    def list_tools(self, spec: Spec, seconds: float) -> list[mcp_types.Tool]:
        return self._run(self._with_session(spec, lambda client: _all_tools(client), seconds), seconds + 5)

    def call(
        self, spec: Spec, tool: str, arguments: dict[str, Any], seconds: float
    ) -> mcp_types.CallToolResult:
        return self._run(
            self._with_session(spec, lambda client: client.call_tool(tool, arguments), seconds), seconds + 5
        )

    async def _with_session(self, spec: Spec, use, seconds: float) -> Any:
        """Run `use(client)` on the server's session, starting it (again, once) if it is not running."""
        for attempt in (1, 2):
            session = self._session(spec)
            client = await session.ready()
            try:
                return await asyncio.wait_for(use(client), seconds)
            except TimeoutError:
                raise CallTimedOut(f"It did not answer within {seconds:g} s.") from None
            except Exception as error:
                if not _hung_up(error):
                    raise  # the server answered, with an error: the session is fine
                self._drop(spec.server_id, session)
                if attempt == 2:
                    raise ServerDown(_words(error)) from None
                log.info("MCP server %s hung up; starting it again", spec.server_id)
        raise AssertionError("unreachable")

    def _session(self, spec: Spec) -> _Session:
        session = self._sessions.get(spec.server_id)
        if session is not None and (session.spec.key != spec.key or session._failure is not None):
            self._drop(spec.server_id, session)
            session = None
        if session is None:
            session = self._sessions[spec.server_id] = _Session(spec)
        return session

    def _drop(self, server_id: int, session: _Session) -> None:
        if self._sessions.get(server_id) is session:
            del self._sessions[server_id]
        session.close()

    def forget(self, server_id: int) -> None:
        """Close the server's session in this process (the server was changed or removed)."""
        if self._loop is None:
            return

        async def drop() -> None:
            if session := self._sessions.get(server_id):
                self._drop(server_id, session)

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(5)


async def _all_tools(client: Client) -> list[mcp_types.Tool]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _words(error: BaseException | None) -> str:
    """What failed, in a sentence (the SDK wraps a failure to start in exception groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, FileNotFoundError):
        return f"Its command was not found ({error.filename or 'no such file'})."
    if isinstance(error, PermissionError):
        return "Its command may not be run here (permission denied)."
    if isinstance(error, httpx2.ConnectError):
        return "Nothing answered at its address (connection refused or no such host)."
    if isinstance(error, httpx2.HTTPStatusError):
        return f"Its address answered HTTP {error.response.status_code}."
    if isinstance(error, httpx2.HTTPError):
        return f"Its address could not be reached ({type(error).__name__})."
    if isinstance(error, anyio.EndOfStream | anyio.ClosedResourceError | anyio.BrokenResourceError):
        return "It stopped before answering (its process ended or it hung up)."
    if isinstance(error, MCPError) and error.code == CONNECTION_CLOSED:
        return "It stopped before answering (its process ended or it hung up)."
    if isinstance(error, MCPError) and error.error.message == "Server returned an error response":
        return "Its address answered with an HTTP error: is it an MCP endpoint, and are its headers right?"
    if isinstance(error, MCPError):
        return f"It refused: {error.error.message}"
    return f"It failed: {type(error).__name__}: {error}" if error else "It failed."


POOL = Pool()
