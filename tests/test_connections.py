"""Connections (issue 30): providers managed in the app, each agent on its own, keys that stay secret.

Two fake OpenAI-compatible providers and a fake Ollama run at once beside the environment's (the session's fake
model); each request must reach its own server, with its own key, model and window."""

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.fake_llm import FakeLLM
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.reflection import reflect_agent
from webapp.jobs.replies import ReplyFailed, request_replies, respond
from webapp.llm import targets
from webapp.models import Agent, AgentMemory, Connection, LlmCall, Message
from webapp.models import connections as connection_rows
from webapp.timeutil import utcnow

ROUTER_KEY = "sk-or-v1-router-secret-0123456789abcdef"
OPENAI_KEY = "sk-proj-openai-secret-fedcba9876543210"


@pytest.fixture(scope="module")
def providers():
    servers = {"router": FakeLLM(), "openai": FakeLLM(), "ollama": FakeLLM()}
    yield servers
    for server in servers.values():
        server.close()


@pytest.fixture(autouse=True)
def _fresh_providers(providers):
    for server in providers.values():
        server.reset()
    providers["router"].models = [{"id": "meta-llama/llama-3.3-70b", "context_length": 131072}]
    providers["openai"].models = [{"id": "gpt-4o-mini"}]
    providers["ollama"].ollama_models = {"llama3.2:3b": 131072}


def _connect(account, name, kind, server, key=""):
    connection = connection_rows.add(
        account.id,
        name=name,
        kind=kind,
        base_url=server.root if kind == "ollama" else server.base_url,
        api_key=key,
    )
    db.session.flush()
    from webapp.llm import providers as provider_api

    provider_api.refresh(connection)
    db.session.commit()
    return connection


@pytest.fixture
def router(admin, providers):
    return _connect(admin.account, "OpenRouter", "openai", providers["router"], ROUTER_KEY)


@pytest.fixture
def openai_direct(admin, providers):
    return _connect(admin.account, "OpenAI", "openai", providers["openai"], OPENAI_KEY)


@pytest.fixture
def ollama(admin, providers):
    return _connect(admin.account, "Ollama", "ollama", providers["ollama"])


def _fresh(row):
    db.session.expire_all()
    return db.session.get(type(row), row.id)


def test_a_group_chat_mixes_agents_on_three_connections_and_the_environment(
    admin, router, openai_direct, ollama, providers, fake_llm
):
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    bob = factories.agent(admin.account, "Bob", connection_id=ollama.id, model_id="llama3.2:3b")
    cleo = factories.agent(admin.account, "Cleo", connection_id=openai_direct.id, model_id="gpt-4o-mini")
    dora = factories.agent(admin.account, "Dora")  # made before connections: the environment's provider
    chat = factories.chat(admin.account, [ada, bob, cleo, dora])
    factories.message(chat, "Thoughts, everyone?", author=admin)
    providers["router"].reply("Ada here.")
    providers["ollama"].reply("Bob here.")
    providers["openai"].reply("Cleo here.")
    fake_llm.reply("Dora here.")
    replies = request_replies(chat, [ada, bob, cleo, dora])
    db.session.commit()

    respond([r.id for r in replies])

    assert [_fresh(r).content for r in replies] == ["Ada here.", "Bob here.", "Cleo here.", "Dora here."]
    (ada_request,), (bob_request,) = providers["router"].requests, providers["ollama"].requests
    (cleo_request,), (dora_request,) = providers["openai"].requests, fake_llm.requests
    assert (ada_request["model"], bob_request["model"]) == ("meta-llama/llama-3.3-70b", "llama3.2:3b")
    assert (cleo_request["model"], dora_request["model"]) == ("gpt-4o-mini", "dora-model")
    assert providers["router"].headers[0]["authorization"] == f"Bearer {ROUTER_KEY}"
    assert providers["openai"].headers[0]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert ROUTER_KEY not in json.dumps(
        providers["openai"].headers + fake_llm.headers + providers["ollama"].headers
    )
    # each later agent sees the earlier replies, whichever provider wrote them
    assert {"role": "user", "content": "Ada: Ada here."} in cleo_request["messages"]
    calls = db.session.execute(sa.select(LlmCall.model, LlmCall.connection_id).order_by(LlmCall.id)).all()
    assert calls == [
        ("meta-llama/llama-3.3-70b", router.id),
        ("llama3.2:3b", ollama.id),
        ("gpt-4o-mini", openai_direct.id),
        ("dora-model", None),
    ]


def test_each_request_fits_its_own_models_window(admin, router, ollama, providers):
    """The router lists a 131k window (capped by PROMPT_TOKEN_BUDGET, 24k by default); Ollama serves 4k by
    default whatever its model could take; the environment's local model has 8k. An admin may set a window."""
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    bob = factories.agent(admin.account, "Bob", connection_id=ollama.id, model_id="llama3.2:3b")
    dora = factories.agent(admin.account, "Dora")

    assert targets.for_agent(ada).input_budget() == 24_000
    assert targets.for_agent(bob).input_budget() == 4096 - 1024
    assert targets.for_agent(dora).input_budget() == 8192 - 1024
    router.model_settings = {"meta-llama/llama-3.3-70b": {"context_tokens": 16_000}}
    db.session.commit()
    assert targets.for_agent(_fresh(ada)).input_budget() == 16_000 - 1024
    assert (
        targets.for_agent(bob).chunk_tokens("CONSOLIDATION_CHUNK_TOKENS", targets.CONSOLIDATION_CHUNK_CAP)
        == (4096 - 1024) // 3
    )


def test_a_long_chat_on_a_small_window_is_cut_to_fit_it(admin, ollama, providers):
    bob = factories.agent(admin.account, "Bob", connection_id=ollama.id, model_id="llama3.2:3b")
    chat = factories.chat(admin.account, [bob])
    for n in range(40):
        factories.message(chat, f"Message {n}: " + "words and more words " * 40, author=admin)
    [reply] = request_replies(chat, [bob])
    db.session.commit()

    respond([reply.id])

    sent = json.dumps(providers["ollama"].requests[0]["messages"])
    assert _fresh(reply).status == "done"
    from webapp.tokens import count_tokens

    assert count_tokens(sent) < 4096 - 1024 + 200  # its window less the answer's room (JSON adds a little)
    assert "Message 39" in sent and "Message 0:" not in sent


def test_memory_jobs_use_the_accounts_background_model_when_set(admin, router, openai_direct, providers):
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    basil = factories.agent(
        admin.account, "Basil", connection_id=router.id, model_id="meta-llama/llama-3.3-70b"
    )
    chat = factories.chat(admin.account, [ada, basil], "Garden club")
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "Hello agents!", author=admin)
    # Of the chat, as what consolidation writes: reflection then asks about one audience, in one request.
    factories.memory(ada, "The user grows tomatoes", "journal", chat_id=chat.id)
    extraction = json.dumps({"journal": ["Likes gardens"], "core": []})

    providers["router"].reply(extraction)
    providers["router"].reply(extraction)
    consolidate_chat(chat.id)
    assert {r["model"] for r in providers["router"].requests} == {"meta-llama/llama-3.3-70b"}

    admin.account.background_connection_id, admin.account.background_model_id = (
        openai_direct.id,
        "gpt-4o-mini",
    )
    db.session.commit()
    factories.message(chat, "More news!", author=admin)
    providers["openai"].reply(extraction)
    providers["openai"].reply(extraction)
    with time_machine.travel(utcnow() + timedelta(hours=7), tick=False):
        consolidate_chat(chat.id)
    providers["openai"].reply(json.dumps({"promote": []}))
    reflect_agent(ada.id)

    assert len(providers["router"].requests) == 2  # nothing more went to the agents' own model
    purposes = db.session.scalars(
        sa.select(LlmCall.purpose).where(LlmCall.connection_id == openai_direct.id).order_by(LlmCall.id)
    ).all()
    assert purposes == ["extract", "extract", "reflect"]
    assert {r["model"] for r in providers["openai"].requests} == {"gpt-4o-mini"}
    assert providers["openai"].headers[0]["authorization"] == f"Bearer {OPENAI_KEY}"


def test_a_key_is_stored_encrypted_and_never_readable_again(app, admin, router, client, signed_in):
    stored = db.session.get(Connection, router.id)
    assert ROUTER_KEY not in stored.api_key_secret and stored.api_key == ROUTER_KEY
    token = stored.api_key_secret

    page = client.get("/admin/connections").text
    assert ROUTER_KEY not in page and "••••" in page and "cdef" in page  # its last 4 characters only
    assert ROUTER_KEY not in client.get("/healthz").text
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    exported = client.post(f"/agents/{ada.id}/export", data={"with_chats": "1"})
    assert (
        exported.status_code == 200
        and ROUTER_KEY not in exported.text
        and "router-secret" not in exported.text
    )
    assert ROUTER_KEY not in client.get(f"/agents/{ada.id}/edit").text
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        db.session.close()
        db.engine.dispose()
        path = Path(app.config["SQLALCHEMY_DATABASE_URI"].removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(f"{path.name}*"))  # -wal and -journal too
        assert token.encode() in raw  # the row is there, encrypted
        assert ROUTER_KEY.encode() not in raw and b"router-secret" not in raw


def test_a_key_under_a_rotated_secret_is_read_and_encrypted_again(app, admin, router, runner):
    old_secret = app.config["SECRET_KEY"]
    before = _fresh(router).api_key_secret
    app.config.update(SECRET_KEY="a brand new secret", SECRET_KEY_FALLBACKS=[old_secret])
    assert _fresh(router).api_key == ROUTER_KEY

    result = runner.invoke(args=["connections", "rotate-key"])

    assert result.exit_code == 0, result.output
    app.config["SECRET_KEY_FALLBACKS"] = []
    after = _fresh(router)
    assert after.api_key_secret != before and after.api_key == ROUTER_KEY


def test_an_error_quoting_the_key_never_shows_it(admin, router, providers, caplog):
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Hi", author=admin)
    providers["router"].fail(401, f"Incorrect API key provided: {ROUTER_KEY}")
    [reply] = request_replies(chat, [ada])
    db.session.commit()

    with caplog.at_level(logging.DEBUG), pytest.raises(ReplyFailed):
        respond([reply.id])

    reply = _fresh(reply)
    assert ROUTER_KEY not in repr(targets.for_agent(ada))  # a target in a traceback's locals shows no key
    assert reply.status == "failed" and "the key of the connection 'OpenRouter'" in reply.error
    assert ROUTER_KEY not in reply.error
    assert ROUTER_KEY not in db.session.scalar(sa.select(LlmCall.error))
    assert ROUTER_KEY not in caplog.text


def test_admins_add_test_and_remove_a_connection_on_its_page(admin, client, signed_in, providers):
    server = providers["openai"]
    page = client.post(
        "/admin/connections",
        data={
            "name": "OpenAI",
            "kind": "openai",
            "base_url": server.base_url,
            "api_key": OPENAI_KEY,
            "headers": "X-Title: Cairn",
        },
        follow_redirects=True,
    )
    assert page.status_code == 200 and "It lists 1 model." in page.text and OPENAI_KEY not in page.text
    connection = db.session.scalar(sa.select(Connection).where(Connection.name == "OpenAI"))
    assert connection.headers == {"X-Title": "Cairn"} and connection.model_ids == ["gpt-4o-mini"]

    server.reply("OK")
    tested = client.post(f"/admin/connections/{connection.id}/test")
    assert "The test worked." in tested.text and "gpt-4o-mini answered." in tested.text
    assert server.requests[-1]["max_tokens"] == 5 and server.headers[-1]["x-title"] == "Cairn"

    server.fail(401, "bad key")
    failed = client.post(f"/admin/connections/{connection.id}/test")
    assert "The test failed." in failed.text and "refused the API key" in failed.text
    assert _fresh(connection).last_error

    removed = client.post(f"/admin/connections/{connection.id}/remove", follow_redirects=True)
    assert "is removed" in removed.text and db.session.scalar(sa.select(sa.func.count(Connection.id))) == 0


def test_a_connection_in_use_is_not_removed(admin, client, signed_in, router):
    factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")

    page = client.post(f"/admin/connections/{router.id}/remove", follow_redirects=True)

    assert "OpenRouter is kept: Ada uses it" in page.text and _fresh(router) is not None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, "Give it a name"),
        ({"base_url": "ftp://example.com"}, "must start with http:// or https://"),
        ({"base_url": "https://user:pw@example.com/v1"}, "Put the key in the key field"),
        ({"headers": "not a header"}, "Line 1 is not a header"),
        ({"kind": "local"}, "Not a valid choice"),
    ],
)
def test_a_wrong_connection_is_refused_with_the_reason(client, signed_in, providers, fields, message):
    data = {"name": "Mine", "kind": "openai", "base_url": providers["openai"].base_url, **fields}

    page = client.post("/admin/connections", data=data)

    assert page.status_code == 422 and message in page.text
    assert db.session.scalar(sa.select(sa.func.count(Connection.id))) == 0


def test_only_admins_see_or_change_connections(client, member, auth, stranger, router):
    auth.login(member)
    assert client.get("/admin/connections").status_code == 403
    assert client.post("/admin/connections", data={"name": "x"}).status_code == 403
    client.get("/logout")
    auth.login(stranger)  # an admin of another account
    assert client.post(f"/admin/connections/{router.id}/remove").status_code == 404
    assert client.post(f"/admin/connections/{router.id}/test").status_code == 404
    assert f'id="connection-{router.id}"' not in client.get("/admin/connections").text


def test_an_agent_picks_a_connection_and_a_model_in_one_picker(admin, client, signed_in, router, ollama):
    form = client.get("/agents/new").text
    assert 'label="OpenRouter"' in form and f'value="{router.id}|meta-llama/llama-3.3-70b"' in form
    assert f'value="{ollama.id}|llama3.2:3b"' in form

    made = client.post(
        "/agents/new",
        data={
            "name": "Ada",
            "model_choice": f"{ollama.id}|llama3.2:3b",
            "model_id": "",
            "core_token_budget": 5000,
            "members_see_memory": "prompt",
            "background_changes": "staged",
        },
    )
    assert made.status_code == 303, made.text
    ada = db.session.scalar(sa.select(Agent).where(Agent.name == "Ada"))
    assert (ada.connection_id, ada.model_id) == (ollama.id, "llama3.2:3b")

    typed = client.post(
        f"/agents/{ada.id}/edit",
        data={
            "name": "Ada",
            "model_choice": f"{router.id}|",
            "model_id": "no/such-model",
            "core_token_budget": 5000,
            "members_see_memory": "prompt",
            "background_changes": "staged",
        },
    )
    assert (
        typed.status_code == 422
        and "OpenRouter does not list the model &#39;no/such-model&#39;" in typed.text
    )
    assert (_fresh(ada).connection_id, _fresh(ada).model_id) == (ollama.id, "llama3.2:3b")


def test_a_connection_that_is_down_is_named_on_its_agents_chat_page(
    admin, client, signed_in, router, providers, fake_llm
):
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    dora = factories.agent(admin.account, "Dora")
    down_chat = factories.chat(admin.account, [ada], people=[admin])
    fine_chat = factories.chat(admin.account, [dora], people=[admin])
    router.base_url = "http://127.0.0.1:9/v1"  # nothing listens there
    db.session.commit()

    page = client.get(f"/chats/{down_chat.id}").text
    assert "Ada&#39;s model (meta-llama/llama-3.3-70b at OpenRouter) is not answering" in page
    assert "The connection OpenRouter is not answering" in page  # the status line too
    assert "is not answering" not in client.get(f"/chats/{fine_chat.id}").text.split("service-status")[0]

    factories.message(fine_chat, "Hi Dora", author=admin)
    fake_llm.reply("Dora answers.")
    [reply] = request_replies(fine_chat, [dora])
    db.session.commit()
    respond([reply.id])
    assert _fresh(reply).content == "Dora answers."


def test_healthz_names_each_connection_in_use_for_admins(admin, client, signed_in, router, ollama, providers):
    factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    factories.agent(admin.account, "Dora")
    ollama.base_url = "http://127.0.0.1:9"
    db.session.commit()

    body = client.get("/healthz").get_json()

    assert body["connections"]["OpenRouter"]["ok"] is True
    assert "Runs here (bundled)" in body["connections"] and "Ollama" not in body["connections"]  # unused


def test_a_detected_ollama_is_offered_and_added_in_one_click(app, client, signed_in, providers):
    app.config["OLLAMA_BASE_URL"] = providers["ollama"].root

    page = client.get("/admin/connections").text
    assert "An Ollama is running at" in page and "llama3.2:3b" in page

    added = client.post("/admin/connections/ollama", follow_redirects=True)
    connection = db.session.scalar(sa.select(Connection))
    assert (connection.name, connection.kind, connection.model_ids) == ("Ollama", "ollama", ["llama3.2:3b"])
    assert connection.models[0]["context_tokens"] == 131072
    assert "An Ollama is running at" not in added.text


def test_no_ollama_running_offers_nothing(app, client, signed_in):
    app.config["OLLAMA_BASE_URL"] = "http://127.0.0.1:9"

    assert "An Ollama is running" not in client.get("/admin/connections").text


def test_the_cli_lists_adds_tests_and_removes_connections(admin, runner, providers, monkeypatch):
    server = providers["openai"]
    monkeypatch.setenv("CAIRN_CONNECTION_KEY", OPENAI_KEY)

    added = runner.invoke(args=["connections", "add", "OpenAI", "--url", server.base_url])
    assert added.exit_code == 0 and "it lists 1 models" in added.output and OPENAI_KEY not in added.output
    listed = runner.invoke(args=["connections", "list"])
    assert "OpenAI" in listed.output and OPENAI_KEY not in listed.output
    server.reply("OK")
    assert runner.invoke(args=["connections", "test", "OpenAI"]).exit_code == 0
    assert server.headers[-1]["authorization"] == f"Bearer {OPENAI_KEY}"
    server.fail(500, "down")
    failed = runner.invoke(args=["connections", "test", "OpenAI"])
    assert failed.exit_code == 1 and "failed" in failed.output
    assert runner.invoke(args=["connections", "remove", "OpenAI"]).exit_code == 0
    assert db.session.scalar(sa.select(sa.func.count(Connection.id))) == 0


def test_an_existing_agent_keeps_the_environments_provider(admin, fake_llm):
    """An agent made before connections (no connection) answers through LLM_BASE_URL exactly as before."""
    dora = factories.agent(admin.account, "Dora")
    chat = factories.chat(admin.account, [dora])
    factories.message(chat, "Hello", author=admin)
    fake_llm.reply("Hi.")
    [reply] = request_replies(chat, [dora])
    db.session.commit()

    respond([reply.id])

    assert dora.connection_id is None and _fresh(reply).content == "Hi."
    assert fake_llm.requests[0]["model"] == "dora-model"
    assert fake_llm.headers[0]["authorization"] == "Bearer local"
    assert (
        db.session.scalar(sa.select(AgentMemory.id)) is None
        and db.session.scalar(sa.select(Message.status).where(Message.id == reply.id)) == "done"
    )


def test_the_usage_page_prices_each_call_at_the_connection_that_answered_it(
    admin, client, signed_in, router, ollama
):
    """A price an admin set on a connection wins; a model of an Ollama on this machine costs nothing; the same
    model id elsewhere has the price of wherever it was served."""
    from tests.test_usage_views import _table

    router.model_settings = {
        "meta-llama/llama-3.3-70b": {"input": 2.0, "output": 10.0, "context_tokens": 9000}
    }
    db.session.commit()
    ada = factories.agent(admin.account, "Ada", connection_id=router.id, model_id="meta-llama/llama-3.3-70b")
    bob = factories.agent(admin.account, "Bob", connection_id=ollama.id, model_id="llama3.2:3b")
    factories.llm_call(ada, connection_id=router.id, prompt_tokens=1_000_000, completion_tokens=100_000)
    factories.llm_call(bob, connection_id=ollama.id, prompt_tokens=5_000, completion_tokens=500)

    by_agent = {row[0]: row[-1] for row in _table(client.get("/admin/usage").text, "usage-by-agent")[1:]}

    assert by_agent["Ada"] == "$3.00"  # 1M × $2 + 100k × $10, per million
    assert by_agent["Bob"].startswith("$0")  # runs on this machine


def test_a_key_and_headers_are_replaced_not_shown(admin, client, signed_in, router):
    page = client.post(
        f"/admin/connections/{router.id}/edit",
        data={
            "name": "Router",
            "base_url": router.base_url,
            "api_key": "sk-new-key-abcdefghijkl",
            "headers": "X-Title: Cairn",
        },
        follow_redirects=True,
    )

    router = _fresh(router)
    assert "Router is saved." in page.text and "sk-new-key" not in page.text and "•••• ijkl" in page.text
    assert (router.api_key, router.headers) == ("sk-new-key-abcdefghijkl", {"X-Title": "Cairn"})
    client.post(f"/admin/connections/{router.id}/edit", data={"name": "Router", "base_url": router.base_url})
    assert (_fresh(router).api_key, _fresh(router).headers) == (
        "sk-new-key-abcdefghijkl",
        {"X-Title": "Cairn"},
    )


def test_the_admins_first_page_says_the_agents_run_on_the_tiny_model_and_offers_a_found_ollama(
    app, admin, member, client, auth, providers, router
):
    ada = factories.agent(admin.account, "Ada")
    app.config["OLLAMA_BASE_URL"] = providers["ollama"].root
    auth.login(admin)

    page = client.get("/chats/").text
    assert "Ada runs on the tiny model bundled with Cairn" in page
    assert "Add the Ollama running here (1 model)" in page
    client.get("/logout")
    auth.login(member)
    assert "bundled-model-notice" not in client.get("/chats/").text  # members cannot change it

    ada.connection_id, ada.model_id = router.id, "meta-llama/llama-3.3-70b"
    db.session.commit()
    client.get("/logout")
    auth.login(admin)
    assert "bundled-model-notice" not in client.get("/chats/").text


def test_a_downloaded_model_is_offered_at_the_environments_connection(
    app, admin, client, signed_in, tmp_path
):
    from webapp.local_models.catalog import CATALOG, write_manifest

    app.instance_path = str(tmp_path)
    model = CATALOG["qwen2.5-1.5b-instruct"]
    (tmp_path / "models").mkdir()
    gguf = tmp_path / "models" / "model.gguf"
    gguf.write_bytes(b"GGUF")
    write_manifest(tmp_path, model, gguf)

    form = client.get("/agents/new").text

    assert 'value="environment|qwen2.5-1.5b-instruct"' in form and 'value="environment|smollm2"' in form
    assert 'hx-get="/admin/local-models/panel"' in client.get("/admin/connections").text
