"""Issue 41: agents call the tools of MCP servers in their replies, with real servers: mcp-server-time over stdio,
and tests/mcp_tool_server.py over stdio and streamable HTTP. A call shows as a step and a chip, its arguments
and result stay on the reply and name it in its sources; a hang ends at the timeout, a server killed is started
again, a result too large is cut, a secret is in no text, a server down or removed costs the agent the tool
and nothing else. (The Tools page and `flask tools`: tests/test_tool_servers_admin.py.)"""

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.conftest import free_port, wait_for
from tests.querycount import count_queries
from webapp import tool_servers
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.replies import request_replies, respond
from webapp.models import Message, ToolServer
from webapp.models.tool_servers import offered_name
from webapp.timeutil import utcnow
from webapp.tool_servers import _schema_problem
from webapp.tool_servers import client as mcp_sessions
from webapp.tools import reply_tools

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SECRET = "s3cret-greeting-7f1c"


def _server(account, name: str, **fields) -> ToolServer:
    server = ToolServer(account_id=account.id, name=name, **fields)
    db.session.add(server)
    db.session.flush()
    assert tool_servers.refresh(server) is None, server.status_error
    db.session.commit()
    return server


@pytest.fixture
def time_server(admin):
    return _server(admin.account, "time", kind="stdio", command=str(BIN / "mcp-server-time"), arguments=[])


@pytest.fixture
def test_server(admin):
    server = ToolServer(
        account_id=admin.account_id,
        name="test",
        kind="stdio",
        command=sys.executable,
        arguments=[str(HERE / "mcp_tool_server.py"), "stdio"],
        timeout_seconds=30,  # room for a loaded machine; the hang test shortens it
    )
    server.secrets = {"GREETING": SECRET}
    db.session.add(server)
    db.session.flush()
    assert tool_servers.refresh(server) is None
    db.session.commit()
    return server


@pytest.fixture
def http_server(admin):
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "mcp_tool_server.py"), "http", str(port), SECRET])
    try:
        server = ToolServer(
            account_id=admin.account_id, name="web", kind="http", url=f"http://127.0.0.1:{port}/mcp"
        )
        server.secrets = {"Authorization": f"Bearer {SECRET}"}
        db.session.add(server)
        db.session.flush()
        wait_for(lambda: tool_servers.refresh(server) is None, seconds=20, what="the HTTP MCP server")
        db.session.commit()
        yield server
    finally:
        process.terminate()
        process.wait(10)


def _agent(admin, *tools: str):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", *tools])


def _reply(admin, agent, fake_llm, *answers, text: str = "What time is it in Paris?"):
    chat = factories.chat(admin.account, [agent], "Clocks")
    factories.message(chat, text, author=admin)
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    for answer in answers:
        fake_llm.reply(**answer) if isinstance(answer, dict) else fake_llm.reply(answer)
    respond([reply.id])
    db.session.expire_all()
    return db.session.get(Message, reply.id)


def _tool_message(request: dict) -> dict:
    return next(m for m in request["messages"] if m["role"] == "tool")


def test_a_stdio_servers_tool_answers_in_the_reply_and_shows_as_step_chip_and_source(
    app, client, signed_in, admin, fake_llm, time_server
):
    ada = _agent(admin, "time__get_current_time")
    call = {"tool_calls": [("time__get_current_time", {"timezone": "Europe/Paris"})]}

    reply = _reply(admin, ada, fake_llm, call, "It is evening in Paris.")

    offered = [tool["function"]["name"] for tool in fake_llm.requests[0]["tools"]]
    answered = json.loads(_tool_message(fake_llm.requests[1])["content"])
    [step] = reply.tools_used
    page = client.get(f"/chats/{reply.chat_id}").text
    assert offered == ["save_memory", "time__get_current_time"]
    assert '"timezone": "Europe/Paris"' in answered["result"] and '"datetime": "' in answered["result"]
    assert reply.status == "done" and reply.content == "It is evening in Paris."
    assert step["state"] == "done" and step["server"] == "time" and step["server_tool"] == "get_current_time"
    assert step["arguments"] == {"timezone": "Europe/Paris"} and "Europe/Paris" in step["result"]
    assert step["chip"].startswith("time: {")
    assert "the tool time: get_current_time" in page and "time: {" in page


def test_a_streamable_http_servers_tool_answers_with_its_secret_header_sent(
    app, admin, fake_llm, http_server
):
    ada = _agent(admin, "web__echo")

    reply = _reply(admin, ada, fake_llm, {"tool_calls": [("web__echo", {"text": "tulips"})]}, "Done.")

    assert json.loads(_tool_message(fake_llm.requests[1])["content"]) == {"result": "hello: tulips"}
    assert reply.tools_used[0]["chip"] == "web: hello: tulips"


def test_a_tool_that_hangs_ends_at_the_timeout_the_model_is_told_and_the_reply_completes(
    app, admin, fake_llm, test_server
):
    ada = _agent(admin, "test__hang")
    test_server.timeout_seconds = 3
    db.session.commit()

    reply = _reply(admin, ada, fake_llm, {"tool_calls": [("test__hang", {})]}, "The clock tool is stuck.")

    told = json.loads(_tool_message(fake_llm.requests[1])["content"])
    assert told == {"error": "It did not answer within 3 s. The call was given up."}
    assert reply.status == "done" and reply.content == "The clock tool is stuck."
    assert reply.tools_used[0]["state"] == "failed"
    assert reply.tools_used[0]["chip"].startswith("Could not use test: hang: It did not answer within 3 s")


def test_a_stdio_server_killed_between_two_replies_is_started_again_on_the_next_call(
    app, admin, fake_llm, test_server
):
    ada = _agent(admin, "test__whoami")
    first = _reply(admin, ada, fake_llm, {"tool_calls": [("test__whoami", {})]}, "One.")
    pid = int(first.tools_used[0]["result"])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), seconds=10, what="the server to die")

    second = _reply(admin, ada, fake_llm, {"tool_calls": [("test__whoami", {})]}, "Two.")

    assert second.tools_used[0]["state"] == "done"
    assert int(second.tools_used[0]["result"]) not in (pid, 0)
    assert db.session.get(ToolServer, test_server.id).status == "ok"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:  # reaped since the signal found it
        return False


def test_a_result_of_5_mb_is_cut_to_the_limit_with_a_note(app, admin, fake_llm, test_server):
    ada = _agent(admin, "test__big")

    reply = _reply(admin, ada, fake_llm, {"tool_calls": [("test__big", {"megabytes": 5})]}, "Big.")

    result = json.loads(_tool_message(fake_llm.requests[1])["content"])["result"]
    assert result.startswith("x" * tool_servers.RESULT_CHARS)
    assert result.endswith(
        f"[Cut: the result was 5,242,880 characters; only the first {tool_servers.RESULT_CHARS:,} are here.]"
    )
    assert len(reply.tools_used[0]["result"]) < tool_servers.RESULT_CHARS + 200


def test_a_tools_own_error_goes_back_to_the_model_and_the_reply_completes(app, admin, fake_llm, test_server):
    ada = _agent(admin, "test__fail")

    reply = _reply(admin, ada, fake_llm, {"tool_calls": [("test__fail", {})]}, "It failed.")

    assert "error" in json.loads(_tool_message(fake_llm.requests[1])["content"])
    assert reply.status == "done" and reply.tools_used[0]["state"] == "failed"


def test_a_secret_environment_value_is_in_no_result_page_or_request(
    app, client, signed_in, admin, fake_llm, test_server
):
    ada = _agent(admin, "test__echo")

    reply = _reply(admin, ada, fake_llm, {"tool_calls": [("test__echo", {"text": "tulips"})]}, "Said.")

    page = client.get(f"/chats/{reply.chat_id}").text
    assert reply.tools_used[0]["result"] == "•••: tulips"  # the server's GREETING, taken out
    assert SECRET not in json.dumps(fake_llm.requests) and SECRET not in json.dumps(reply.tools_used)
    assert SECRET not in page


def test_a_server_that_is_down_costs_the_agent_its_tools_the_reply_says_so_and_completes(
    app, client, signed_in, admin, fake_llm, test_server
):
    ada = _agent(admin, "test__echo")
    test_server.command = str(HERE / "no-such-mcp-server")
    db.session.commit()

    first = _reply(admin, ada, fake_llm, {"tool_calls": [("test__echo", {"text": "a"})]}, "No echo.")
    second = _reply(admin, ada, fake_llm, "Still here.")

    assert first.status == "done" and first.tools_used[0]["state"] == "failed"
    assert (
        "server is down: Its command was not found"
        in json.loads(_tool_message(fake_llm.requests[1])["content"])["error"]
    )
    assert second.status == "done" and second.content == "Still here."
    assert "tools" not in fake_llm.requests[-1] or all(
        t["function"]["name"] != "test__echo" for t in fake_llm.requests[-1]["tools"]
    )
    assert second.tools_used[0]["chip"].startswith("test is down, so this reply is without its tools")
    assert "test is down, so this reply is without its tools" in client.get(f"/chats/{second.chat_id}").text


def test_a_server_removed_while_an_agent_uses_it_only_takes_its_tools_away(app, admin, fake_llm, time_server):
    ada = _agent(admin, "time__get_current_time")
    db.session.delete(time_server)
    db.session.commit()

    reply = _reply(admin, ada, fake_llm, "No clock.")

    assert reply.status == "done" and reply.content == "No clock."
    assert [t["function"]["name"] for t in fake_llm.requests[-1]["tools"]] == ["save_memory"]


def test_tools_not_enabled_are_not_offered_and_listing_is_read_from_the_row_not_the_server(
    app, admin, fake_llm, time_server, test_server
):
    bare = factories.agent(admin.account, "Bare", enabled_tools=["save_memory"])
    three = factories.agent(
        admin.account,
        "Three",
        enabled_tools=["save_memory", "time__get_current_time", "test__echo", "test__whoami"],
    )
    chat = factories.chat(admin.account, [bare, three])
    db.session.commit()
    assert bare.enabled_tools and three.enabled_tools and chat.remembers  # loaded, as a reply has them

    with count_queries() as none_enabled:
        reply_tools(bare, chat)
    with count_queries() as three_enabled:
        offered = reply_tools(three, chat).tools

    assert none_enabled.count == 0  # an agent without a server's tool costs nothing more
    assert three_enabled.count == 1  # its servers in one statement, their tools as listed at the last refresh
    assert sorted(offered) == ["save_memory", "test__echo", "test__whoami", "time__get_current_time"]


def test_memory_jobs_never_offer_a_servers_tools(app, admin, fake_llm, time_server):
    ada = _agent(admin, "time__get_current_time")
    chat = factories.chat(admin.account, [ada, factories.agent(admin.account, "Basil")], "Group")
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "I water the roses on Sundays.", author=admin)
    db.session.commit()
    fake_llm.default_text = json.dumps({"journal": ["The user waters roses on Sundays."], "core": []})

    consolidate_chat(chat.id)

    assert fake_llm.requests, "consolidation asked its model"
    assert all("time__" not in json.dumps(request.get("tools", [])) for request in fake_llm.requests)


def test_an_offered_name_stays_within_the_providers_64_characters_and_apart():
    long_a, long_b = "a" * 70 + "_one", "a" * 70 + "_two"

    assert offered_name("time", "get_current_time") == "time__get_current_time"
    assert offered_name("git", "repo.status/now") == "git__repo_status_now"
    assert len(offered_name("server", long_a)) == 64 and offered_name("server", long_a) != offered_name(
        "server", long_b
    )


def test_a_tool_with_a_schema_that_is_not_json_schema_is_listed_with_why_and_never_offered(app, admin):
    assert _schema_problem({"type": "object", "properties": {"a": {"type": "string"}}}) is None
    assert _schema_problem({"type": "objekt"}).startswith("Its input schema is not valid JSON Schema")
    assert _schema_problem({"type": "string"}) == "Its input schema does not describe an object of arguments."
    assert _schema_problem(None) == "Its input schema is not a JSON object."


def test_a_stdio_server_gets_only_its_own_environment(app, admin):
    server = ToolServer(account_id=admin.account_id, name="env", kind="stdio", command="/bin/true")
    server.secrets = {"TOKEN": "t-1"}
    spec = tool_servers.spec_of(server)

    env = mcp_sessions._server(spec).env
    assert env["TOKEN"] == "t-1" and "PATH" in env
    assert not {"SECRET_KEY", "DATABASE_URL", "LLM_API_KEY"} & set(env)


@pytest.fixture(autouse=True)
def _no_sessions_left():
    yield
    for server_id in list(mcp_sessions.POOL._sessions):
        mcp_sessions.POOL.forget(server_id)


def test_servers_query_is_scoped_to_the_agents_account(app, admin, fake_llm, time_server, stranger):
    other = factories.agent(stranger.account, "Eve", enabled_tools=["time__get_current_time"])
    db.session.commit()

    assert reply_tools(other, factories.chat(stranger.account, [other])).tools == {}
    assert db.session.scalar(sa.select(sa.func.count()).select_from(ToolServer)) == 1


def test_a_real_workers_threads_share_one_session_of_a_stdio_server(live_app, start_worker, fake_llm):
    """`python worker.py` with two threads: the first reply that needs the server starts it, the next reuses it
    (the same process answers both calls)."""
    acme = factories.account("Acme")
    dana = factories.user(acme, "dana@example.com", "admin")
    server = ToolServer(
        account_id=acme.id,
        name="test",
        kind="stdio",
        command=sys.executable,
        arguments=[str(HERE / "mcp_tool_server.py"), "stdio"],
    )
    db.session.add(server)
    db.session.flush()
    assert tool_servers.refresh(server) is None
    mcp_sessions.POOL.forget(server.id)
    ada = factories.agent(acme, "Ada", enabled_tools=["test__whoami"])
    db.session.commit()
    start_worker(threads=2)

    pids = []
    for title in ("One", "Two"):
        chat = factories.chat(acme, [ada], title, people=[dana])
        factories.message(chat, "Who answers?", author=dana)
        fake_llm.reply(tool_calls=[("test__whoami", {})], model="ada-model")  # not a background job's
        fake_llm.reply("Answered.", model="ada-model")
        [reply] = request_replies(chat, [ada])
        db.session.commit()
        reply_id = reply.id
        wait_for(lambda done=reply_id: _status(done) == "done", seconds=60, what="the reply")
        pids.append(int(db.session.get(Message, reply_id).tools_used[0]["result"]))

    assert pids[0] == pids[1] and pids[0] != os.getpid()


def _status(message_id: int) -> str:
    db.session.expire_all()
    return db.session.get(Message, message_id).status
