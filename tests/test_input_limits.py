"""Inputs nobody limited (issue 31, items 10-13): request bodies over the app's limit are refused with 413 in
each door's shape before they are read, an upload from someone not signed in is refused unparsed, the agent-file
import applies the forms' limits and caps, a Letta block with an absurd label is refused, and two small 500s."""

import io
import json

import pytest
import sqlalchemy as sa

from tests import factories
from tests.test_mcp import _run
from webapp.agent_files.errors import AgentFileError
from webapp.agent_files.schema import FILE_CAPS, UPLOAD_CAPS
from webapp.agent_files.validation import read
from webapp.extensions import db
from webapp.mcp.http import Gate
from webapp.models import Agent, Message
from webapp.models.api_keys import ApiKey

HTMX = {"HX-Request": "true"}
MB = 2**20


class CountingStream(io.BytesIO):
    """A request body that records how much of it the app read."""

    def __init__(self, size: int, chunk: bytes = b"x"):
        super().__init__(chunk * size)
        self.taken = 0

    def read(self, *args):
        data = super().read(*args)
        self.taken += len(data)
        return data

    def readline(self, *args):
        data = super().readline(*args)
        self.taken += len(data)
        return data

    def readinto(self, buffer):
        count = super().readinto(buffer)
        self.taken += count
        return count


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


def _messages() -> int:
    return db.session.scalar(sa.select(sa.func.count()).select_from(Message))


# 10. One request size limit, answered 413 in each door's shape, before the body is read.


def test_a_form_over_the_limit_is_a_413_page_in_the_layout_and_is_not_read(app, client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    body = CountingStream(app.config["REQUEST_MAX_BYTES"] + 1)

    page = client.post(
        f"/chats/{chat.id}/messages",
        input_stream=body,
        content_length=len(body.getvalue()),
        content_type="application/x-www-form-urlencoded",
    )

    assert page.status_code == 413
    assert "<h1>Too large</h1>" in page.text and 'class="topbar"' in page.text  # the app's layout
    assert "larger than Cairn accepts here (4 MB)" in page.text
    assert body.taken == 0 and _messages() == 0


def test_a_413_for_htmx_is_a_notice(app, client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    big = "x" * (app.config["REQUEST_MAX_BYTES"] + 1)

    notice = client.post(f"/chats/{chat.id}/messages", data={"content": big}, headers=HTMX)

    assert notice.status_code == 413 and notice.headers["HX-Retarget"] == "#notice"
    assert 'id="notice"' in notice.text and "larger than Cairn accepts here" in notice.text
    assert _messages() == 0


def test_v1_answers_413_in_openais_shape(app, client, admin, ada):
    _, secret = ApiKey.issue(admin, "client")
    db.session.commit()
    body = CountingStream(app.config["REQUEST_MAX_BYTES"] + 1)

    answer = client.post(
        "/v1/chat/completions",
        input_stream=body,
        content_length=len(body.getvalue()),
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )

    assert answer.status_code == 413 and body.taken == 0
    error = answer.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert _messages() == 0


def test_the_mcp_relay_answers_413_as_json_rpc_and_reads_no_body_without_a_live_key(app, client, admin, ada):
    _, secret = ApiKey.issue(admin, "client")
    db.session.commit()
    big = CountingStream(app.config["REQUEST_MAX_BYTES"] + 1)
    small = CountingStream(1000)

    too_large = client.post(
        "/mcp/ada",
        input_stream=big,
        content_length=len(big.getvalue()),
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )
    no_key = client.post(
        "/mcp/ada",
        input_stream=small,
        content_length=1000,
        content_type="application/json",
        headers={"Authorization": "Bearer cairn-not-a-key"},
    )

    assert too_large.status_code == 413 and big.taken == 0
    assert too_large.get_json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "The request is larger than 4,194,304 bytes (REQUEST_MAX_BYTES).",
            "data": {"status": 413, "reason": "too_large"},  # as every MCP refusal (webapp.mcp.errors)
        },
    }
    assert small.taken == 0  # relayed without its body (no MCP process runs here: 503)
    assert no_key.status_code == 503


class _Inner:
    """The SDK's app behind the gate: records the body it was given."""

    def __init__(self):
        self.body = None

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.body = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _through_gate(app, secret: str | None, chunks: list[bytes], length: int | None):
    """Send a request through the MCP process's gate: (status, JSON answer, chunks read, the SDK's body)."""
    inner, sent, read = _Inner(), [], []
    headers = [(b"content-type", b"application/json")]
    headers += [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    headers += [(b"content-length", str(length).encode())] if length is not None else []
    scope = {"type": "http", "method": "POST", "path": "/mcp/ada", "headers": headers}

    async def receive():
        read.append(chunks[len(read)])
        return {"type": "http.request", "body": read[-1], "more_body": len(read) < len(chunks)}

    async def send(message):
        sent.append(message)

    # in a thread of its own (test_mcp._run): a browser test earlier in the session leaves Playwright's event loop
    # running in this one, where anyio.run refuses to start
    _run(lambda: Gate(app, inner)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body), len(read), inner.body


def test_the_mcp_gate_checks_the_key_before_reading_a_body_and_bounds_it(app, admin, ada):
    _, secret = ApiKey.issue(admin, "client")
    db.session.commit()
    limit = app.config["REQUEST_MAX_BYTES"]
    half = b"x" * (limit // 2 + 1)

    no_key = _through_gate(app, None, [half, half], 2 * len(half))
    declared = _through_gate(app, secret, [half, half], 2 * len(half))
    chunked = _through_gate(app, secret, [half, half, half], None)
    fine = _through_gate(app, secret, [b'{"jsonrpc":', b' "2.0"}'], None)

    assert no_key[0] == 401 and no_key[2] == 0
    assert declared[:3] == (413, {"jsonrpc": "2.0", "id": None, "error": declared[1]["error"]}, 0)
    assert declared[1]["error"]["code"] == -32600 and "REQUEST_MAX_BYTES" in declared[1]["error"]["message"]
    assert chunked[0] == 413 and chunked[2] == 2 and chunked[3] is None  # stopped once past the limit
    assert fine[0] == 200 and fine[3] == b'{"jsonrpc": "2.0"}'


def test_an_upload_from_someone_not_signed_in_is_refused_before_its_parts_are_read(app, client):
    app.config["WTF_CSRF_ENABLED"] = True  # CSRF's check, before any view, parses the form
    boundary = "cairnboundary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.json"\r\n'
        f"Content-Type: application/json\r\n\r\n{'x' * 600_000}\r\n--{boundary}--\r\n"
    ).encode()
    body = CountingStream(0)
    body.write(part)
    body.seek(0)

    refused = client.post(
        "/agents/import",
        input_stream=body,
        content_length=len(part),
        content_type=f"multipart/form-data; boundary={boundary}",
    )

    assert refused.status_code == 302 and refused.headers["Location"].startswith("/login")
    assert body.taken == 0


def test_the_agent_file_upload_has_its_own_larger_limit(app, client, signed_in, runner, ada):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    document = json.loads(text)
    document["agent"]["system_prompt"] = "Be brief. " + " " * (app.config["REQUEST_MAX_BYTES"] + 1)
    padded = json.dumps(document).encode()  # over the app's limit, under the upload's

    imported = client.post(
        "/agents/import", data={"file": (io.BytesIO(padded), "ada.cairn.json"), "name": "Ada two"}
    )
    app.config["AGENT_FILE_MAX_BYTES"] = len(padded) - 1
    too_large = client.post(
        "/agents/import", data={"file": (io.BytesIO(padded), "ada.cairn.json"), "name": "Ada three"}
    )

    # Not refused for its size: refused for its system prompt, longer than an agent's form allows (item 11).
    assert imported.status_code == 422 and "system_prompt" in imported.text
    assert too_large.status_code == 413 and "<h1>Too large</h1>" in too_large.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Agent)) == 1


# 11. The agent-file import applies the forms' limits, caps its rows, and refuses deep nesting.


def _exported(runner) -> dict:
    return json.loads(runner.invoke(args=["agents", "export", "Ada"]).stdout)


def _upload(client, document, name: str = "") -> object:
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return client.post("/agents/import", data={"file": (io.BytesIO(raw), "a.cairn.json"), "name": name})


def _agents() -> list[str]:
    return list(db.session.scalars(sa.select(Agent.name).order_by(Agent.id)))


def test_an_import_takes_what_the_agent_form_takes(client, signed_in, runner, ada):
    long_prompt = _exported(runner)
    long_prompt["agent"]["system_prompt"] = "x" * 20_001
    markup = _exported(runner)
    markup["agent"]["name"] = "<img src=x onerror=alert(1)>"
    too_long = _exported(runner)
    too_long["agent"]["name"] = "A" * 41

    prompt = _upload(client, long_prompt, "Ada two")
    named = _upload(client, markup)
    longer = _upload(client, too_long)
    renamed = _upload(client, markup, "Ada two")  # the admin names it as the form would take

    assert prompt.status_code == 422
    assert "at agent.system_prompt: 20,001 characters, more than the 20,000 it may have" in prompt.text
    for refused in (named, longer):
        assert refused.status_code == 422
        assert "is not one the agent form takes: 1 to 40 characters" in refused.text
        assert "Give it another name here." in refused.text
    assert "<img src=x" not in named.text  # quoted escaped, never as markup
    assert renamed.status_code == 303
    assert _agents() == ["Ada", "Ada two"]


def _memories(count: int) -> list[dict]:
    now = "2025-01-01T00:00:00+00:00"
    return [
        {
            "ref": f"m{i}",
            "memory_type": "core",
            "constitutional": False,
            "content": f"memory {i}",
            "audience": "everyone",
            "chat": None,
            "created_at": now,
            "updated_at": now,
            "deleted_at": None,
        }
        for i in range(1, count + 1)
    ]


def test_an_upload_over_the_row_caps_is_refused_and_the_command_line_takes_more(
    client, signed_in, runner, ada, tmp_path
):
    document = _exported(runner)
    document["memories"], document["audit"] = _memories(UPLOAD_CAPS["memories"] + 1), []

    refused = _upload(client, document, "Ada two")
    path = tmp_path / "ada.cairn.json"
    path.write_text(json.dumps(document))
    cli = runner.invoke(args=["agents", "import", str(path), "--as", "Ada three"])
    document["memories"] = _memories(FILE_CAPS["memories"] + 1)
    path.write_text(json.dumps(document))
    over = runner.invoke(args=["agents", "import", str(path), "--as", "Ada four"])

    assert refused.status_code == 422
    assert (
        "The file holds 2,001 memories; an import here takes at most 2,000 (`flask agents import` takes more)."
        in refused.text
    )
    assert cli.exit_code == 0 and "Imported Ada three: 2001 memories" in cli.output
    assert over.exit_code == 1 and "The file holds 10,001 memories; an import here takes at most 10,000." in (
        over.output
    )
    assert _agents() == ["Ada", "Ada three"]


def test_messages_are_capped_across_all_chats(app, runner, ada):
    document = _exported(runner)
    chat = {**document["chats"][0]} if document["chats"] else None
    message = {
        "ref": "msg1",
        "role": "user",
        "author": {"kind": "none", "name": "x", "email": None},
        "content": "hi",
        "status": "done",
        "error": None,
        "tools_used": None,
        "created_at": "2025-01-01T00:00:00+00:00",
        "sources": None,
    }
    base = chat or {}
    chats = [
        {**base, "ref": f"c{n}", "messages": [{**message, "ref": f"msg{n}_{i}"} for i in range(2_001)]}
        for n in (1, 2)
    ]
    document["chats"] = chats

    with pytest.raises(
        AgentFileError, match="The file holds 4,002 messages; an import here takes at most 4,000"
    ):
        read(json.dumps(document), UPLOAD_CAPS)


@pytest.mark.parametrize("levels", [10_000, 100])
def test_deeply_nested_json_is_refused_with_a_clear_422(client, signed_in, levels):
    nested = b'{"format": "cairn-agent", "version": 1, "x": ' + b"[" * levels + b"]" * levels + b"}"

    refused = _upload(client, nested, "Deep")

    assert refused.status_code == 422
    assert "The file&#39;s JSON nests deeper than 32 levels; an agent file never does." in refused.text
    assert _agents() == []


# 12. A Letta block with an absurd label is refused (it made the reader loop until memory ran out).


def _letta(label: str, name: str = "sam") -> dict:
    return {
        "agents": [{"id": "agent-0", "name": name, "system": "You are Sam.", "block_ids": ["block-0"]}],
        "blocks": [{"id": "block-0", "label": label, "value": "First name: Chad\n\nLikes sailing."}],
        "tools": [],
    }


def test_a_letta_block_with_an_absurd_label_is_refused_not_looped_on(app):
    for label in ("x" * 9_980, "x" * 20_000):
        with pytest.raises(
            AgentFileError, match="has a label of [0-9,]+ characters; Cairn takes labels of at most"
        ):
            read(json.dumps(_letta(label)))
    accepted = read(json.dumps(_letta("y" * 100, name="<b>Sam</b> & co")))
    assert accepted["memories"][0]["content"].startswith("y" * 100 + ": First name: Chad")
    assert accepted["agent"]["name"] == "b Sam b co"  # a name the agent form takes


# 13. Two 500s: the name form without its field, and the jobs page past its last page.


def test_the_name_form_without_its_field_is_not_a_500(client, signed_in):
    signed_in.name = "Dana"
    db.session.commit()

    answer = client.post("/account/name", data={})

    assert answer.status_code == 303
    assert db.session.get(type(signed_in), signed_in.id).name is None  # absent, as empty: the e-mail's part


def test_the_jobs_page_caps_its_page_number(client, signed_in):
    for page in ("1000000000000000000", "99999999999999999999"):
        answer = client.get(f"/admin/jobs?page={page}")

        assert answer.status_code == 200, answer.text[:300]
        assert "page=10001" not in answer.text  # MAX_PAGE is the last page it links to
