"""The MCP server for agents' memory (webapp.mcp), through the official SDK's own client: in process, over
stdio (`flask mcp serve`) and over streamable HTTP (`flask mcp http`, reached through the web process's /mcp
relay), acting as one person with what they may hear and see."""

import concurrent.futures
import contextvars
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client, ClientSession, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests import factories
from tests.conftest import Auth, free_port, wait_for, worker_env
from webapp.extensions import db
from webapp.mcp.server import Caller, build_server
from webapp.models import AgentMemory, AuditLog, Chat, User
from webapp.models.api_keys import ApiKey

ROOT = Path(__file__).resolve().parent.parent
FLASK = str(Path(sys.executable).parent / "flask")
TOOLS = {"search_memory", "save_memory", "prompt_memory", "forget_memory"}


def _memory(agent, content, memory_type="core", *, chat=None, **fields) -> AgentMemory:
    """A memory heard by everyone (an admin's entry), or by whoever may read `chat`."""
    row = AgentMemory(
        agent=agent,
        content=content,
        memory_type=memory_type,
        audience="chat" if chat else "everyone",
        chat_id=chat.id if chat else None,
        **fields,
    )
    db.session.add(row)
    db.session.commit()
    return row


def _run(func):
    """anyio.run(func) in a thread of its own, with this thread's context (the app's): a browser test earlier in
    the session leaves Playwright's event loop running in this one, where anyio.run refuses to start."""
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(context.run, anyio.run, func).result()


def _in_process(app, agent, person):
    return Client(build_server(app, Caller(agent.id, user_id=person.id), agent_slug=agent.slug))


def _call(client_factory, *calls):
    """Run tool calls (name, arguments) in one session; their results, in order."""

    async def run():
        async with client_factory() as client:
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return _run(run)


def _found(result) -> list[str]:
    assert not result.is_error, result.content[0].text
    return [hit.get("content") or hit.get("excerpt") for hit in result.structured_content["results"]]


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada")


def test_the_tools_and_the_core_memory_resource_are_listed_and_read(app, ada, admin):
    _memory(ada, "The lighthouse keeper is called Morwenna.", constitutional=True)
    _memory(ada, "Ana takes her tea without sugar.", "journal")

    async def run():
        async with _in_process(app, ada, admin) as client:
            tools = await client.list_tools()
            resources = await client.list_resources()
            core = await client.read_resource(f"memory://{ada.slug}/core")
            return tools, resources, core

    tools, resources, core = _run(run)

    assert {tool.name for tool in tools.tools} == TOOLS
    assert [str(r.uri) for r in resources.resources] == ["memory://ada/core"]
    text = core.contents[0].text
    assert "Morwenna" in text and "(constitutional)" in text
    assert "tea" not in text  # a journal entry is not core memory


def test_search_memory_has_recalls_shape_and_finds_memories_and_conversations(app, acme, ada, admin):
    chat = factories.chat(acme, [ada], title="Harbour", people=[admin])
    factories.message(chat, "The harbour master's boat is the Saoirse.", author=admin)
    _memory(ada, "The harbour closes at dusk in winter.", chat=chat)

    [result] = _call(lambda: _in_process(app, ada, admin), ("search_memory", {"query": "harbour"}))

    results = result.structured_content["results"]
    assert {"memory_id", "type", "date", "content"} <= results[0].keys()
    assert any(r.get("conversation") == "Harbour" and "Saoirse" in r["excerpt"] for r in results)


def test_a_saved_memory_is_private_to_its_person_audited_via_mcp_and_undoable(
    app, client, acme, ada, admin, member
):
    saved, again, theirs, mine = _call(
        lambda: _in_process(app, ada, member),
        ("save_memory", {"content": "Milo is allergic to peanuts.", "memory_type": "core"}),
        ("save_memory", {"content": "Milo is allergic to peanuts", "memory_type": "core"}),
        ("search_memory", {"query": "peanuts allergic"}),
        ("prompt_memory", {}),
    )
    [heard_by_admin] = _call(lambda: _in_process(app, ada, admin), ("search_memory", {"query": "peanuts"}))

    assert saved.structured_content["saved"] is True
    assert again.structured_content == {
        "saved": False,
        "memory_id": saved.structured_content["memory_id"],
        "note": "Ada already remembers exactly this.",
    }
    memory = db.session.get(AgentMemory, saved.structured_content["memory_id"])
    chat = db.session.get(Chat, memory.chat_id)
    assert (memory.audience, chat.source, chat.visibility, chat.started_by_id, chat.title) == (
        "chat",
        "mcp",
        "private",
        member.id,
        "Notes via MCP",
    )
    assert [a.id for a in chat.agents] == [ada.id]
    assert "Milo is allergic to peanuts." in _found(theirs)
    assert "Milo is allergic to peanuts." in [m["content"] for m in mine.structured_content["memories"]]
    assert _found(heard_by_admin) == []  # another person does not hear it, admin or not
    [row] = db.session.scalars(sa.select(AuditLog).where(AuditLog.auditable_id == memory.id)).all()
    assert (row.action, row.user_id, row.data["via"], row.data["by"], row.data["chat_id"]) == (
        "memory_create",
        member.id,
        "mcp",
        "milo",
        chat.id,
    )

    Auth(client).login(admin)
    ledger = client.get(f"/admin/agents/{ada.id}/memories").text
    assert "Milo is allergic to peanuts." in ledger
    assert "Saved via MCP by milo (milo@example.com)" in ledger
    assert client.post(f"/admin/audit/{row.id}/undo").status_code in (200, 303)
    db.session.expire_all()
    assert db.session.get(AgentMemory, memory.id).is_deleted


def test_a_second_save_goes_to_the_same_notes_chat(app, ada, member):
    first, second = _call(
        lambda: _in_process(app, ada, member),
        ("save_memory", {"content": "Milo plays the cello."}),
        ("save_memory", {"content": "Milo moved to Leeds."}),
    )

    ids = [r.structured_content["memory_id"] for r in (first, second)]
    memories = [db.session.get(AgentMemory, i) for i in ids]
    assert {m.chat_id for m in memories} == {memories[0].chat_id}
    assert [m.memory_type for m in memories] == ["journal", "journal"]  # the default


def test_members_get_what_members_may_see_allows(app, acme, ada, member):
    _memory(ada, "Ada's favourite river is the Severn.", "core")
    _memory(ada, "Ada watched the Severn bore on Tuesday.", "journal")

    ada.members_see_memory = "core"
    db.session.commit()
    searched, listed = _call(
        lambda: _in_process(app, ada, member), ("search_memory", {"query": "Severn"}), ("prompt_memory", {})
    )
    assert _found(searched) == ["Ada's favourite river is the Severn."]
    assert [m["content"] for m in listed.structured_content["memories"]] == [
        "Ada's favourite river is the Severn."
    ]

    ada.members_see_memory = "none"
    db.session.commit()
    refused = _call(
        lambda: _in_process(app, ada, member),
        ("search_memory", {"query": "Severn"}),
        ("prompt_memory", {}),
        ("save_memory", {"content": "Milo likes rivers."}),
    )
    for result in refused:
        assert result.is_error
        assert "Ada's memory is not open to members" in result.content[0].text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory)) == 2


def test_a_person_hears_only_what_their_chats_allow(app, acme, ada, admin, member):
    private = factories.chat(acme, [ada], title="Dana's plans", people=[admin])
    factories.message(private, "Dana is planning a surprise for the gardener.", author=admin)
    _memory(ada, "Dana plans a surprise for the gardener.", chat=private)

    [result] = _call(lambda: _in_process(app, ada, member), ("search_memory", {"query": "surprise gardener"}))

    assert _found(result) == []


def test_a_key_revoked_while_a_session_is_open_ends_its_access(app, ada, member):
    key, secret = _key(member)
    server = build_server(app, Caller(ada.id, key=secret), agent_slug=ada.slug)

    async def run():
        async with Client(server) as client:
            before = await client.call_tool("prompt_memory", {})
            key.revoke()
            db.session.commit()
            after = await client.call_tool("prompt_memory", {})
            return before, after

    before, after = _run(run)

    assert not before.is_error
    assert after.is_error and "revoked" in after.content[0].text


def test_the_web_relay_says_when_the_mcp_process_is_down(app, client):
    app.config["MCP_PORT"] = free_port()  # nothing listens there

    response = client.post("/mcp/ada", json={}, headers={"Authorization": "Bearer cairn_x"})

    assert response.status_code == 503
    assert response.json["error"]["data"]["reason"] == "mcp_unavailable"
    assert "not running" in response.json["error"]["message"] and response.json["jsonrpc"] == "2.0"
    assert response.headers["Retry-After"] == "5"


def _live_people(live_app):
    acme = factories.account("Acme")
    admin = factories.user(acme, "dana@example.com", "admin")
    member = factories.user(acme, "milo@example.com", "member")
    ada = factories.agent(acme, "Ada")
    _memory(ada, "The lighthouse keeper is called Morwenna.", "core")
    return admin, member, ada


def _saved_in_the_ledger(live_app, admin, ada, content: str) -> None:
    client = live_app.test_client()
    Auth(client).login(admin)
    assert content in client.get(f"/admin/agents/{ada.id}/memories").text
    audit = client.get("/admin/audit").text
    assert "milo@example.com" in audit


def test_stdio_flask_mcp_serve_lists_recalls_and_saves(live_app, tmp_path):
    admin, member, ada = _live_people(live_app)
    server = StdioServerParameters(
        command=FLASK,
        args=["mcp", "serve", "--agent", "Ada", "--user", member.email],
        env=worker_env(live_app),
        cwd=str(ROOT),
    )

    log = (tmp_path / "mcp-serve.log").open("w")

    async def run():
        async with (
            stdio_client(server, errlog=log) as (
                read,
                write,
            ),  # its stderr: a file (pytest captures sys.stderr)
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = await session.list_tools()
            found = await session.call_tool("search_memory", {"query": "lighthouse keeper"})
            saved = await session.call_tool("save_memory", {"content": "Milo sails on Sundays."})
            return tools, found, saved

    tools, found, saved = _run(run)

    assert {tool.name for tool in tools.tools} == TOOLS
    assert "The lighthouse keeper is called Morwenna." in _found(found)
    memory = db.session.get(AgentMemory, saved.structured_content["memory_id"])
    assert memory.content == "Milo sails on Sundays."
    _saved_in_the_ledger(live_app, admin, ada, "Milo sails on Sundays.")


def test_stdio_needs_to_know_who_it_acts_as(live_app):
    _live_people(live_app)

    neither = subprocess.run(
        [FLASK, "mcp", "serve", "--agent", "Ada"],
        cwd=ROOT,
        env=worker_env(live_app),
        capture_output=True,
        text=True,
    )

    assert neither.returncode != 0
    assert "--user EMAIL, or --key" in neither.stderr


@pytest.fixture
def mcp_process(live_app):
    """`flask mcp http` on a free port, its requests limited to 8 a minute per key; the web app relays /mcp
    to it."""
    port = free_port()
    env = {
        **worker_env(live_app),
        "MCP_PORT": str(port),
        "RATE_LIMIT_MCP": "8 per minute",
        "MCP_ALLOWED_ORIGINS": "https://Allowed.example/, https://other.example",
    }
    process = subprocess.Popen([FLASK, "mcp", "http"], cwd=ROOT, env=env)
    live_app.config["MCP_PORT"] = port
    wait_for(lambda: _status(f"http://127.0.0.1:{port}/mcp/ada", "") == 401, 60, "the MCP process to start")
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(20)


def _status(url: str, secret: str) -> int | None:
    request = urllib.request.Request(
        url, b"{}", {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def _key(person: User) -> tuple[ApiKey, str]:
    key, secret = ApiKey.issue(person, "test")
    db.session.commit()
    return key, secret


def test_http_lists_recalls_and_saves_through_the_web_relay_and_refuses_revoked_keys(
    live_app, live_server, mcp_process
):
    admin, member, ada = _live_people(live_app)
    key, secret = _key(member)

    async def run():
        headers = {"Authorization": f"Bearer {secret}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(f"{live_server}/mcp/ada", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = await session.list_tools()
            found = await session.call_tool("search_memory", {"query": "lighthouse"})
            saved = await session.call_tool(
                "save_memory", {"content": "Milo keeps bees.", "memory_type": "core"}
            )
            core = await session.read_resource("memory://ada/core")
            return tools, found, saved, core

    tools, found, saved, core = _run(run)

    assert {tool.name for tool in tools.tools} == TOOLS
    assert "The lighthouse keeper is called Morwenna." in _found(found)
    assert saved.structured_content["saved"] is True
    assert "Milo keeps bees." in core.contents[0].text
    _saved_in_the_ledger(live_app, admin, ada, "Milo keeps bees.")

    key.revoke()
    db.session.commit()
    for base in (live_server, mcp_process):
        assert _status(f"{base}/mcp/ada", secret) == 401
    assert _status(f"{mcp_process}/mcp/ada", "cairn_not-a-key") == 401


def test_http_refuses_another_accounts_agent_and_limits_each_key(live_app, mcp_process):
    _admin, member, _ada = _live_people(live_app)
    factories.agent(factories.account("Globex"), "Basil")
    _key_row, secret = _key(member)

    assert _status(f"{mcp_process}/mcp/basil", secret) == 404
    # 8 with the 404; a slug is found whatever its case, as /v1's `model` is (Agent.by_slug)
    statuses = [_status(f"{mcp_process}/mcp/{slug}", secret) for slug in ["Ada", *["ada"] * 6]]
    assert 429 not in statuses and 404 not in statuses
    request = urllib.request.Request(f"{mcp_process}/mcp/ada", b"{}", {"Authorization": f"Bearer {secret}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 429
    assert int(refused.value.headers["Retry-After"]) >= 1
    assert json.load(refused.value)["error"]["data"]["reason"] == "rate_limit_exceeded"


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def _post(url: str, secret: str, origin: str | None = None) -> tuple[int, dict, dict]:
    """An MCP initialize request: its status, headers and JSON body."""
    headers = {
        "Authorization": f"Bearer {secret}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **({"Origin": origin} if origin else {}),
    }
    request = urllib.request.Request(url, json.dumps(INITIALIZE).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.load(error)


def test_http_refusals_are_json_rpc_errors_whose_reason_mcp_clients_show(live_app, live_server, mcp_process):
    """Issue 31.16: a 401 in OpenAI's shape reached an MCP client as "Server returned an error response"."""
    _live_people(live_app)

    async def connect():
        headers = {"Authorization": "Bearer cairn_not-a-key"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(f"{live_server}/mcp/ada", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            try:
                await session.initialize()
            except MCPError as error:
                return error.error.message, error.error.data

    message, data = _run(connect)
    assert message.startswith("Invalid or revoked API key") and data["reason"] == "invalid_api_key"

    status, headers, body = _post(f"{mcp_process}/mcp/ada", "cairn_not-a-key")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32600 and body["error"]["data"] == {
        "status": 401,
        "reason": "invalid_api_key",
    }
    assert "Invalid or revoked API key" in body["error"]["message"]


def test_http_takes_no_origin_its_own_or_a_configured_one_and_refuses_others(
    live_app, live_server, mcp_process
):
    """Issue 31.16: the MCP spec's MUST against DNS rebinding; clients outside a browser send no Origin."""
    _admin, member, _ada = _live_people(live_app)
    _key_row, secret = _key(member)
    direct, relayed = f"{mcp_process}/mcp/ada", f"{live_server}/mcp/ada"

    passed = [
        _post(direct, secret),
        _post(direct, secret, mcp_process),
        _post(relayed, secret, live_server),  # the relay keeps the Host the page was served from
        _post(direct, secret, "https://allowed.example"),
        _post(relayed, secret, "https://other.example"),
    ]
    refused = [
        _post(direct, secret, "https://evil.example"),
        _post(relayed, secret, "http://evil.example:" + live_server.rsplit(":", 1)[1]),
        _post(direct, secret, "null"),
    ]

    assert [status for status, _, _ in passed] == [200] * 5, passed
    assert all(body["result"]["serverInfo"] for _, _, body in passed)
    for status, _, body in refused:
        assert status == 403 and body["error"]["data"]["reason"] == "origin_not_allowed", body
        assert "MCP_ALLOWED_ORIGINS" in body["error"]["message"]
