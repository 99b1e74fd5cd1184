"""Issue 41: the Tools page and `flask tools`, with real MCP servers (mcp-server-time over stdio, and
tests/mcp_tool_server.py over stdio and streamable HTTP). Admins add a server, which is kept only once it lists its
tools; see its health and tools and which agents enable each; test it again; change its timeout or secrets; remove
it, which takes its tools off every agent. An environment value or a header is on no page, no /healthz and no
command's output. Members get a 403 on every route, another account's server is a 404.
(Replies calling these tools: tests/test_tool_servers.py.)"""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests import factories
from tests.conftest import free_port, wait_for
from tests.test_first_hour_browser import ALL_IMPACTS, check_page, size, tap  # noqa: F401  (size: the viewport)
from tests.test_phone_browser import _sign_in, _small_targets
from webapp.actions import tool_servers as actions
from webapp.extensions import db
from webapp.models import Agent, ToolServer
from webapp.tool_servers.client import POOL

HERE = Path(__file__).resolve().parent
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")
TOKEN = "tok-9d2e-very-secret-bearer"
GREETING = "greeting-secret-51ab"
TIME_TOOLS = {"get_current_time", "convert_time"}


@pytest.fixture(scope="module")
def http_address():
    """tests/mcp_tool_server.py over streamable HTTP, answering only requests with `Bearer TOKEN`."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "mcp_tool_server.py"), "http", str(port), TOKEN])
    try:
        wait_for(lambda: _listening(port), seconds=30, what="the HTTP MCP server")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(autouse=True)
def _sessions_closed():
    """Each test's servers are stopped after it (the pool is the process's, and ids start again in each test)."""
    yield
    for server_id in list(POOL._sessions):
        POOL.forget(server_id)


def _stdio(name: str = "time", command: str = TIME_SERVER, **fields) -> dict:
    return {"name": name, "kind": "stdio", "command": command, "timeout_seconds": "30", **fields}


def _http(url: str, name: str = "web", **fields) -> dict:
    return {
        "name": name,
        "kind": "http",
        "url": url,
        "headers": f"Authorization: Bearer {TOKEN}",
        "timeout_seconds": "30",
        **fields,
    }


def _count() -> int:
    return db.session.scalar(sa.select(sa.func.count(ToolServer.id)))


def _server(name: str) -> ToolServer:
    db.session.expire_all()
    return db.session.scalar(sa.select(ToolServer).where(ToolServer.name == name))


def _secrets_absent(text: str) -> None:
    assert TOKEN not in text and GREETING not in text


def test_admins_add_a_stdio_and_an_http_server_and_see_their_tools(client, signed_in, http_address):
    added = client.post(
        "/admin/tools", data=_stdio(environment=f"GREETING={GREETING}"), follow_redirects=True
    )
    assert added.status_code == 200 and "time is added. It lists 2 tools." in added.text
    added = client.post("/admin/tools", data=_http(http_address), follow_redirects=True)
    assert "web is added. It lists 5 tools." in added.text

    page = client.get("/admin/tools").text
    for tool in [*TIME_TOOLS, "echo", "big", "hang", "fail", "whoami"]:
        assert f"<code>{tool}</code>" in page
    assert TIME_SERVER in page and http_address in page  # what each runs or reaches
    assert "GREETING <span" in page and "Authorization <span" in page  # the names of their secrets
    assert page.count("up (checked") == 2 and page.count("no agent") == 7
    _secrets_absent(page)
    time, web = _server("time"), _server("web")
    assert time.secrets == {"GREETING": GREETING} and web.secrets == {"Authorization": f"Bearer {TOKEN}"}
    assert {tool["name"] for tool in time.tools} == TIME_TOOLS and web.timeout_seconds == 30


def test_each_tool_says_which_agents_enable_it(admin, client, signed_in):
    client.post("/admin/tools", data=_stdio())
    factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "time__get_current_time"])
    factories.agent(admin.account, "Bob", enabled_tools=["time__get_current_time", "time__convert_time"])

    page = client.get("/admin/tools").text

    row = page.split('id="tool-time__get_current_time"')[1].split("</tr>")[0]
    assert "Ada, Bob" in row
    assert "Bob" in page.split('id="tool-time__convert_time"')[1].split("</tr>")[0]


def test_test_lists_a_changed_server_again_and_keeps_its_tools_when_it_fails(client, signed_in, tmp_path):
    script = tmp_path / "server.sh"
    script.write_text(f"#!/bin/sh\nexec {TIME_SERVER}\n")
    script.chmod(0o755)
    client.post("/admin/tools", data=_stdio("clock", str(script)))
    server = _server("clock")

    script.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'mcp_tool_server.py'} stdio\n")
    tested = client.post(f"/admin/tools/{server.id}/test", follow_redirects=True)
    assert "clock is up. It lists 5 tools." in tested.text and "<code>echo</code>" in tested.text
    assert "<code>get_current_time</code>" not in tested.text

    script.write_text("#!/bin/sh\nexit 3\n")
    failed = client.post(f"/admin/tools/{server.id}/test", follow_redirects=True)
    assert "clock is down: It" in failed.text and "Its tools as last listed are kept." in failed.text
    assert '<span class="error">down: It' in failed.text and "<code>echo</code>" in failed.text
    assert _server("clock").status == "down" and len(_server("clock").tools) == 5


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (_stdio(command="/no/such/command-41"), "Nothing was saved: Its command was not found"),
        (_stdio(command="/bin/echo", arguments="garbage"), "Nothing was saved: It"),
        (_http(f"http://127.0.0.1:{free_port()}/mcp"), "Nothing was saved: Nothing answered at its address"),
        (_http("ftp://example.com/mcp"), "The address must start with http:// or https://"),
        (_http("not an address"), "The address must start with http:// or https://"),
        (_http("http://[::1/mcp"), "The address must start with http:// or https://"),
        (_http("https://user:pw@example.com/mcp"), "Put a token in the extra headers"),
        (_http("https://example.com/mcp", headers="not a header"), "Line 1 is not a header"),
        (_stdio(environment=f"{GREETING} without equals"), "Line 1 is not a variable"),
        (_stdio(command=""), "Give the command to run"),
        (_stdio(name="Time!"), "lowercase letters, digits and hyphens"),
        (_stdio(name="x" * 100_000), "Field cannot be longer than 100 characters"),
        (_stdio(command="x" * 600), "Field cannot be longer than 500 characters"),
        (_stdio(timeout_seconds="0"), "Number must be between 1 and 300"),
        (_stdio(timeout_seconds="301"), "Number must be between 1 and 300"),
        (_stdio(timeout_seconds="soon"), "Not a valid integer value"),
        (_stdio(kind="ftp"), "Not a valid choice"),
    ],
)
def test_a_server_that_cannot_be_added_says_why_and_nothing_is_saved(client, signed_in, fields, said):
    page = client.post("/admin/tools", data={"environment": f"GREETING={GREETING}", **fields})

    assert page.status_code == 422 and said in page.text, page.text[-3000:]
    assert _count() == 0
    _secrets_absent(page.text)  # the secret fields come back empty
    assert "type the environment or headers again" in page.text


def test_a_wrong_token_or_a_server_answering_garbage_is_refused_in_words(
    client, signed_in, http_address, fake_llm
):
    wrong = client.post(
        "/admin/tools", data=_http(http_address, headers="Authorization: Bearer wrong-token-x")
    )
    assert wrong.status_code == 422 and "<p>Nothing was saved: It" in wrong.text
    assert "wrong-token-x" not in wrong.text

    garbage = client.post("/admin/tools", data=_http(fake_llm.base_url))  # an OpenAI-compatible server
    assert garbage.status_code == 422 and "Nothing was saved: " in garbage.text
    _secrets_absent(garbage.text)
    assert _count() == 0


def test_a_name_is_unique_in_its_account(admin, client, signed_in, stranger):
    client.post("/admin/tools", data=_stdio())

    taken = client.post("/admin/tools", data=_stdio())

    assert taken.status_code == 422 and "Another tool server already has this name." in taken.text
    client.get("/logout")
    client.post("/login", data={"email": stranger.email, "password": factories.PASSWORD})
    assert client.post("/admin/tools", data=_stdio()).status_code == 303  # another account: its own names
    assert _count() == 2


def test_a_change_sets_the_timeout_and_replaces_secrets_only_when_given(client, signed_in):
    client.post("/admin/tools", data=_stdio(environment=f"GREETING={GREETING}"))
    server = _server("time")

    kept = client.post(f"/admin/tools/{server.id}/edit", data={"timeout_seconds": "5", "secrets": ""})
    assert kept.status_code == 303
    assert _server("time").timeout_seconds == 5 and _server("time").secrets == {"GREETING": GREETING}

    client.post(f"/admin/tools/{server.id}/edit", data={"timeout_seconds": "5", "secrets": "TZ=UTC"})
    assert _server("time").secrets == {"TZ": "UTC"} and _server("time").status == "ok"

    refused = client.post(
        f"/admin/tools/{server.id}/edit",
        data={"timeout_seconds": "9000", "secrets": "A=b"},
        follow_redirects=True,
    )
    assert "time was not changed: The timeout must be 1 to 300 seconds." in refused.text
    assert _server("time").timeout_seconds == 5 and _server("time").secrets == {"TZ": "UTC"}
    page = client.get("/admin/tools").text
    assert "TZ <span" in page and "UTC" not in page.split('id="tool-server-')[1].split("<dt>Timeout")[0]


def test_remove_takes_the_servers_tools_off_every_agent_of_the_account(admin, client, signed_in, stranger):
    client.post("/admin/tools", data=_stdio())
    server = _server("time")
    ada = factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "time__get_current_time"])
    bob = factories.agent(admin.account, "Bob", enabled_tools=["recall", "timer__start"])
    eve = factories.agent(stranger.account, "Eve", enabled_tools=["time__get_current_time"])

    removed = client.post(f"/admin/tools/{server.id}/remove", follow_redirects=True)

    assert "time is removed, with its secrets. Its tools were taken off Ada." in removed.text
    assert _count() == 0 and "No tool server yet" in removed.text
    db.session.expire_all()
    assert db.session.get(Agent, ada.id).enabled_tools == ["save_memory"]
    assert db.session.get(Agent, bob.id).enabled_tools == ["recall", "timer__start"]  # another server's
    assert db.session.get(Agent, eve.id).enabled_tools == ["time__get_current_time"]  # another account's


def test_remove_asks_first(client, signed_in):
    client.post("/admin/tools", data=_stdio())

    page = client.get("/admin/tools").text

    assert 'data-confirm="Remove time? Its tools are taken off every agent that uses them."' in page


def test_only_an_accounts_admins_see_or_change_its_tool_servers(admin, client, auth, member, stranger):
    auth.login(admin)
    client.post("/admin/tools", data=_stdio())
    server_id = _server("time").id
    client.get("/logout")
    routes = [
        ("get", "/admin/tools"),
        ("post", "/admin/tools"),
        ("post", f"/admin/tools/{server_id}/test"),
        ("post", f"/admin/tools/{server_id}/edit"),
        ("post", f"/admin/tools/{server_id}/remove"),
    ]

    auth.login(member)
    for method, path in routes:
        assert getattr(client, method)(path, data=_stdio("other")).status_code == 403, path
    assert "/admin/tools" not in client.get("/chats/").text  # no Tools link
    client.get("/logout")
    auth.login(stranger)
    for _method, path in routes[2:]:
        assert client.post(path, data={"timeout_seconds": "5"}).status_code == 404, path
    assert (
        "time" not in client.get("/admin/tools").text.split("<h1>Tools</h1>")[1].split("add-tool-server")[0]
    )
    for path in ("/admin/tools/999999/test", f"/admin/tools/{10**30}/remove", "/admin/tools/0/edit"):
        assert client.post(path).status_code == 404, path
    assert _server("time") is not None


def test_every_form_needs_its_csrf_token(app, client, signed_in):
    client.post("/admin/tools", data=_stdio())
    server_id = _server("time").id
    app.config["WTF_CSRF_ENABLED"] = True

    page = client.get("/admin/tools").text
    for path in ("/admin/tools", f"/admin/tools/{server_id}/test", f"/admin/tools/{server_id}/remove"):
        assert client.post(path, data=_stdio("other")).status_code == 400, path
    assert page.count('name="csrf_token"') >= 4  # add, test, change, remove (and sign out)
    assert _count() == 1


def test_healthz_shows_each_tool_servers_health_to_admins_only(admin, client, auth, member, tmp_path):
    script = tmp_path / "server.sh"
    script.write_text(f"#!/bin/sh\nexec {TIME_SERVER}\n")
    script.chmod(0o755)
    auth.login(admin)
    client.post("/admin/tools", data=_stdio("clock", str(script), environment=f"GREETING={GREETING}"))
    client.post("/admin/tools", data=_stdio("time"))
    script.write_text("#!/bin/sh\nexit 3\n")
    client.post(f"/admin/tools/{_server('clock').id}/test")

    health = client.get("/healthz")

    servers = health.json["tool_servers"]
    assert servers["time"]["ok"] and servers["time"]["detail"].startswith("up: 2 tools offered (checked ")
    assert not servers["clock"]["ok"] and servers["clock"]["detail"].startswith("down: It")
    _secrets_absent(health.text)
    client.get("/logout")
    auth.login(member)
    assert "tool_servers" not in client.get("/healthz").json
    client.get("/logout")
    assert "tool_servers" not in client.get("/healthz").json


def test_the_cli_lists_adds_tests_and_removes_tool_servers(admin, runner, monkeypatch, http_address):
    monkeypatch.setenv("GREETING", GREETING)

    stdio = runner.invoke(
        args=[
            "tools",
            "add",
            "echoes",
            "--command",
            sys.executable,
            "--arg",
            str(HERE / "mcp_tool_server.py"),
        ]
        + ["--arg", "stdio", "--env", "GREETING", "--timeout", "5"]
    )
    assert stdio.exit_code == 0, stdio.output
    assert "Added 'echoes'; it lists 5 tools:" in stdio.output and "echoes__echo" in stdio.output
    assert _server("echoes").secrets == {"GREETING": GREETING} and _server("echoes").timeout_seconds == 5
    monkeypatch.delenv("GREETING")
    monkeypatch.setenv("CAIRN_TOOL_SECRETS", f"Authorization: Bearer {TOKEN}")
    http = runner.invoke(args=["tools", "add", "web", "--url", http_address])
    assert http.exit_code == 0, http.output
    assert _server("web").secrets == {"Authorization": f"Bearer {TOKEN}"}

    listed = runner.invoke(args=["tools", "list"])
    assert listed.exit_code == 0 and "echoes  stdio" in listed.output and "secrets: GREETING" in listed.output
    assert "web__whoami" in listed.output and "secrets: Authorization" in listed.output
    assert listed.output.count("up (checked") == 2
    _secrets_absent(listed.output + stdio.output + http.output)

    tested = runner.invoke(args=["tools", "test", "web"])
    assert tested.exit_code == 0 and "web is up; it lists 5 tools:" in tested.output
    removed = runner.invoke(args=["tools", "remove", "web"])
    assert removed.exit_code == 0 and "Removed 'web'." in removed.output and _count() == 1


def test_the_cli_says_what_failed_and_saves_nothing(admin, runner, tmp_path, monkeypatch):
    monkeypatch.delenv("CAIRN_TOOL_SECRETS", raising=False)
    missing = runner.invoke(args=["tools", "add", "gone", "--command", "/no/such/command-41"])
    assert missing.exit_code == 1 and "Nothing was saved: Its command was not found" in missing.output
    assert _count() == 0
    both = runner.invoke(args=["tools", "add", "x", "--command", "a", "--url", "http://a"])
    assert both.exit_code == 2 and "Give either --command or --url." in both.output
    unset = runner.invoke(args=["tools", "add", "x", "--command", "a", "--env", "NOT_SET_41"])
    assert unset.exit_code == 2 and "no such variable here" in unset.output

    script = tmp_path / "server.sh"
    script.write_text(f"#!/bin/sh\nexec {TIME_SERVER}\n")
    script.chmod(0o755)
    assert runner.invoke(args=["tools", "add", "clock", "--command", str(script)]).exit_code == 0
    script.write_text("#!/bin/sh\nexit 3\n")
    failed = runner.invoke(args=["tools", "test", "clock"])
    assert failed.exit_code == 1 and "clock is down: It" in failed.output
    assert runner.invoke(args=["tools", "test", "nothing"]).exit_code == 1
    assert "has no tool server named 'nothing'" in runner.invoke(args=["tools", "remove", "nothing"]).output


@pytest.mark.browser
def test_the_tools_page_is_tidy_on_a_desktop_and_a_phone(page, size, live_app, live_server, http_address):  # noqa: F811
    """axe finds nothing, nothing scrolls sideways, every tap target is 44 px on a phone; a failed add and a
    removal (asked first) work in the browser."""
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    actions.add(
        admin.account_id, name="time", kind="stdio", command=TIME_SERVER, secrets={"GREETING": GREETING}
    )
    actions.add(
        admin.account_id,
        name="web-tools-long-name",
        kind="http",
        url=http_address,
        secrets={"Authorization": f"Bearer {TOKEN}"},
    )
    factories.agent(admin.account, "Ada", enabled_tools=["time__get_current_time"])
    db.session.remove()
    _sign_in(page, live_server, "dana@example.com")

    page.goto(f"{live_server}/admin/tools")
    expect(page.get_by_role("heading", name="Tools", level=1)).to_be_visible()
    check_page(page, size, "tools", prefix="tools", full_page=True, impacts=ALL_IMPACTS)
    if size == "phone":
        assert _small_targets(page) == []
    _secrets_absent(page.content())

    page.get_by_label("Name", exact=True).fill("gone")
    page.get_by_label("Command", exact=True).fill("/no/such/command-41")
    page.get_by_label("Environment, one per line as NAME=value (secret)", exact=True).fill(
        f"GREETING={GREETING}"
    )
    tap(page.get_by_role("button", name="Add and list its tools"))
    expect(page.locator("#add-failure")).to_contain_text("Its command was not found")
    expect(page.get_by_label("Environment, one per line as NAME=value (secret)", exact=True)).to_have_value(
        ""
    )
    check_page(page, size, "tools-failed-add", prefix="tools", full_page=True, impacts=ALL_IMPACTS)
    _secrets_absent(page.content())

    tap(page.get_by_role("button", name="Remove time"))  # the page fixture accepts the question
    expect(page.get_by_role("status").first).to_contain_text("time is removed, with its secrets.")
    expect(page.get_by_role("heading", name="time", level=2)).to_have_count(0)
