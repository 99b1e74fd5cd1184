"""The OpenAI-compatible API (issue 22.2): /v1/models lists the agents of the key's person's account, and
/v1/chat/completions answers as the agent would in Cairn, in a chat of that person.

Unit tests with Flask's client: the request runs on a thread while this one runs the reply jobs it waits for
(an RQ SimpleWorker on the fake Redis), against the fake model. The last test drives a running Cairn (gunicorn,
a worker, redis-server, the fake model) with the official openai client.
"""

import json
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import time_machine
from rq import SimpleWorker

from tests import factories
from tests.conftest import free_port, wait_for, worker_env
from webapp import events
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat, consolidate_stale_chats
from webapp.jobs.queue import rq_queue
from webapp.models import AgentMemory, ApiKey, Chat, ChatPerson, Message
from webapp.timeutil import utcnow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", system_prompt="You are Ada.")


def _key(person) -> str:
    _, secret = ApiKey.issue(person, "Tests")
    db.session.commit()
    return secret


@pytest.fixture
def key(admin) -> str:
    return _key(admin)


def _auth(secret: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **headers}


def _body(content: str = "Hello", *, history=(), model: str = "ada", **fields) -> dict:
    messages = [{"role": role, "content": text} for role, text in history]
    return {"model": model, "messages": [*messages, {"role": "user", "content": content}], **fields}


def _ask(client, secret: str, body, headers: dict | None = None, *, worker: bool = True):
    """POST /v1/chat/completions on a thread; this one answers the replies it asks for until it returns."""
    box = {}

    def post():
        kwargs = {"data": body} if isinstance(body, str | bytes) else {"json": body}
        response = client.post("/v1/chat/completions", headers=_auth(secret, **(headers or {})), **kwargs)
        response.get_data()  # a stream is read to its end on this thread
        response.close()
        box["response"] = response

    thread = threading.Thread(target=post)
    thread.start()
    while thread.is_alive():
        if worker:
            SimpleWorker([rq_queue("replies")], connection=rq_queue().connection).work(burst=True)
        thread.join(0.05)
    return box["response"]


def _events(response) -> list:
    """The data of each server-sent event: parsed JSON, or "[DONE]"."""
    items = []
    for block in response.get_data(as_text=True).split("\n\n"):
        data = [line.removeprefix("data: ") for line in block.splitlines() if line.startswith("data: ")]
        if data:
            items.append(data[0] if data[0] == "[DONE]" else json.loads(data[0]))
    return items


def _reply_requests(fake_llm) -> list[dict]:
    """What the model was asked for replies (a worker also writes summaries, on their own model)."""
    return [r for r in fake_llm.requests if r["model"] == "ada-model"]


def _api_chats(person=None) -> list[Chat]:
    db.session.rollback()  # a fresh transaction: what the server has committed
    query = sa.select(Chat).where(Chat.source == "api").order_by(Chat.id)
    if person is not None:
        query = query.where(Chat.started_by_id == person.id)
    return list(db.session.scalars(query))


def _turns(chat: Chat) -> list[tuple[str, str]]:
    db.session.rollback()
    rows = db.session.execute(
        sa.select(Message.role, Message.content).where(Message.chat_id == chat.id).order_by(Message.id)
    )
    return [tuple(row) for row in rows]


# Models


def test_models_are_the_agents_of_the_persons_account_by_slug(client, key, admin, stranger, ada):
    factories.agent(admin.account, "Zoë Ångström")
    factories.agent(stranger.account, "Globex bot")

    listed = client.get("/v1/models", headers=_auth(key))
    one = client.get("/v1/models/zoe-angstrom", headers=_auth(key))

    assert listed.status_code == 200 and listed.json["object"] == "list"
    assert [m["id"] for m in listed.json["data"]] == ["ada", "zoe-angstrom"]
    first = listed.json["data"][0]
    assert first == {"id": "ada", "object": "model", "created": first["created"], "owned_by": "cairn"}
    assert abs(first["created"] - int(ada.created_at.timestamp())) < 86400 * 2  # seconds since the epoch, UTC
    assert one.json["id"] == "zoe-angstrom"


def test_an_unknown_model_or_another_accounts_agent_is_a_404_in_openais_shape(client, key, stranger):
    factories.agent(stranger.account, "Globex bot")

    for response in (
        client.get("/v1/models/globex-bot", headers=_auth(key)),
        client.post("/v1/chat/completions", headers=_auth(key), json=_body(model="globex-bot")),
    ):
        assert response.status_code == 404
        error = response.json["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            "model",
            "model_not_found",
        )
        assert "`globex-bot` does not exist" in error["message"]
    assert not _api_chats()


@pytest.mark.parametrize(
    "header",
    [None, "Bearer cairn_not-a-key", "Basic dXNlcjpwYXNz", "Bearer "],
    ids=["missing", "wrong", "basic", "empty"],
)
def test_without_a_live_key_every_path_is_a_401(client, admin, ada, header):
    headers = {"Authorization": header} if header else {}

    answers = [
        client.get("/v1/models", headers=headers),
        client.get("/v1/models/ada", headers=headers),
        client.post("/v1/chat/completions", headers=headers, json=_body()),
    ]

    for response in answers:
        assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
        assert response.json["error"]["code"] == "invalid_api_key"
        assert set(response.json["error"]) == {"message", "type", "param", "code"}
    assert not _api_chats()


def test_a_revoked_key_and_a_removed_persons_key_are_refused(client, admin, member, ada):
    revoked, removed = _key(admin), _key(member)
    db.session.scalar(sa.select(ApiKey).where(ApiKey.user_id == admin.id)).revoke()
    member.remove(by=admin)
    db.session.commit()

    for secret in (revoked, removed):
        response = client.get("/v1/models", headers=_auth(secret))
        assert response.status_code == 401 and "revoked" in response.json["error"]["message"]


def test_a_signed_in_browser_without_a_key_is_refused(client, auth, admin, ada):
    auth.login(admin)  # cookies are not a key: a page of another site cannot post here with them

    assert client.post("/v1/chat/completions", json=_body()).status_code == 401


def test_unknown_paths_and_methods_answer_in_openais_shape(client, key):
    missing = client.get("/v1/embeddings", headers=_auth(key))
    wrong_method = client.get("/v1/chat/completions", headers=_auth(key))

    assert missing.status_code == 404 and missing.json["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and wrong_method.json["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong_method.headers["Allow"]
    assert "<html" in client.get("/chats/nothing").text.lower()  # pages keep their own 404


# Bad requests


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ("{not json", None, "must be a JSON object"),
        ({"model": "ada"}, "messages", "non-empty array"),
        ({"model": "ada", "messages": []}, "messages", "non-empty array"),
        (_body("   "), "messages", "The last message is empty"),
        (_body("x" * 20_001), "messages", "20,001 characters; the limit is 20,000"),
        (_body("a\x00b"), "messages", "NUL"),
        (
            {"model": "ada", "messages": [{"role": "assistant", "content": "Hi"}]},
            "messages",
            "must be the user's",
        ),
        ({"model": "ada", "messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0]", "with a role"),
        (
            {
                "model": "ada",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            "messages[0].content",
            "text only",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}]}, "model", "`model` is required"),
        (_body(stream="yes"), "stream", "true or false"),
        (_body(user="u" * 201), "user", "at most 200 characters"),
    ],
    ids=[
        "invalid JSON",
        "no messages",
        "empty messages",
        "empty content",
        "oversized content",
        "NUL",
        "last not the user's",
        "unknown role",
        "an image",
        "no model",
        "stream not a boolean",
        "long user id",
    ],
)
def test_a_bad_request_is_a_400_saying_what_is_wrong_and_changes_nothing(client, key, ada, body, param, says):
    response = _ask(client, key, body, {"Content-Type": "application/json"}, worker=False)

    assert response.status_code == 400, response.text
    error = response.json["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and says in error["message"]
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Message)) == 0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n": 2}, ["n"]),
        ({"response_format": {"type": "json_object"}}, ["response_format"]),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, ["response_format"]),
        ({"logprobs": True, "top_logprobs": 3}, ["logprobs", "top_logprobs"]),
        ({"max_tokens": 50}, ["max_tokens"]),
        ({"max_completion_tokens": 50}, ["max_completion_tokens"]),
        ({"stop": ["\n"]}, ["stop"]),
        ({"stop": "END"}, ["stop"]),
        ({"tools": [{"type": "function", "function": {"name": "get_weather"}}]}, ["tools"]),
        ({"tool_choice": "required"}, ["tool_choice"]),
        (
            {"functions": [{"name": "get_weather"}], "function_call": {"name": "get_weather"}},
            ["functions", "function_call"],
        ),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy"}}, ["modalities", "audio"]),
        ({"logit_bias": {"50256": -100}}, ["logit_bias"]),
        ({"n": 3, "max_tokens": 10, "tools": [{"type": "function"}]}, ["n", "max_tokens", "tools"]),
    ],
    ids=lambda value: "+".join(value) if isinstance(value, list) else None,
)
def test_parameters_cairn_cannot_honour_are_a_400_naming_them(app, client, key, ada, fake_llm, fields, named):
    """Issue 31.15: they were ignored, and the client got an answer other than the one it asked for."""
    app.config["API_REPLY_SECONDS"] = 1  # were one taken, no worker answers: a 503, not a wait
    response = _ask(client, key, _body(**fields), worker=False)

    assert response.status_code == 400, response.text
    error = response.json["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "unsupported_parameter",
        named[0],
    )
    assert all(f"`{name}`" in error["message"] for name in named) and "Leave " in error["message"]
    assert not _api_chats() and not fake_llm.requests


def test_parameters_that_ask_nothing_cairn_cannot_do_are_accepted(client, key, ada):
    harmless = {
        "temperature": 0.2,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "seed": 7,
        "n": 1,
        "response_format": {"type": "text"},
        "logprobs": False,
        "max_tokens": None,
        "stop": [],
        "tools": [],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "modalities": ["text"],
        "store": False,
        "top_k": 40,  # not OpenAI's: other clients' extensions are let be
    }

    response = _ask(client, key, _body(**harmless))

    assert response.status_code == 200, response.text
    assert response.json["choices"][0]["message"]["content"] == "ok"


def test_text_parts_are_joined_and_a_paused_agent_is_refused(client, key, ada):
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    answered = _ask(client, key, {"model": "ada", "messages": [{"role": "user", "content": parts}]})
    ada.paused = True
    db.session.commit()

    paused = _ask(client, key, _body(), worker=False)

    assert answered.status_code == 200 and _turns(_api_chats()[0])[0] == ("user", "Hello\nthere")
    assert paused.status_code == 409 and paused.json["error"]["code"] == "model_paused"


# Answers


def test_a_plain_completion_is_the_agents_reply_in_a_new_private_chat_of_the_person(
    client, key, admin, member, ada, fake_llm
):
    fake_llm.reply("Hello Dana, nice to meet you.")

    response = _ask(client, key, _body("Hi, I am Dana.", history=[("system", "You are a pirate.")]))

    assert response.status_code == 200, response.text
    answer = response.json
    assert (
        answer["object"] == "chat.completion"
        and answer["model"] == "ada"
        and answer["id"].startswith("chatcmpl-")
    )
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello Dana, nice to meet you."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    [chat] = _api_chats()
    reply = db.session.scalar(
        sa.select(Message).where(Message.chat_id == chat.id, Message.role == "assistant")
    )
    assert (
        answer["usage"]
        == {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        and reply.input_tokens == 11
    )  # the provider's own count
    assert (chat.visibility, chat.started_by_id, chat.title, chat.agents) == ("private", admin.id, "", [ada])
    assert [
        p.user_id for p in db.session.scalars(sa.select(ChatPerson).where(ChatPerson.chat_id == chat.id))
    ] == [admin.id]
    assert _turns(chat) == [("user", "Hi, I am Dana."), ("assistant", "Hello Dana, nice to meet you.")]
    request = fake_llm.requests[-1]
    assert request["model"] == "ada-model"  # the agent's own model
    assert request["messages"][0] == {"role": "system", "content": "You are Ada."}  # not the client's
    assert "pirate" not in json.dumps(request)
    assert request["messages"][1] == {"role": "user", "content": "dana: Hi, I am Dana."}
    assert "# Your memory" in request["messages"][-1]["content"]


def test_a_streamed_completion_relays_the_reply_as_chunks_then_done(client, key, ada, fake_llm):
    fake_llm.reply("One two three four five")

    response = _ask(client, key, _body(stream=True, stream_options={"include_usage": True}))

    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    events = _events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "ada" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "One two three four five"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finals] == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 11
    assert _turns(_api_chats()[0])[-1] == ("assistant", "One two three four five")


def test_a_streamed_reply_that_fails_ends_with_an_error_event(client, key, ada, fake_llm):
    fake_llm.fail(400, "model not found upstream")

    events = _events(_ask(client, key, _body(stream=True)))

    assert "[DONE]" not in events
    error = events[-1]["error"]
    assert error["code"] == "reply_failed" and "model not found upstream" in error["message"]


def test_a_stream_cut_after_its_text_was_sent_says_the_reply_is_written_again(client, key, ada, fake_llm):
    fake_llm.chunk_delay = 0.15  # each word its own event
    fake_llm.cut("alpha bravo charlie")  # then the model's connection closes: the job retries, from the start

    events = _events(_ask(client, key, _body(stream=True)))

    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text.startswith("alpha") and "[DONE]" not in events
    error = events[-1]["error"]
    assert error["code"] == "reply_restarted" and "Ask again" in error["message"]


def test_a_plain_reply_that_fails_is_a_502_and_one_no_worker_takes_is_a_503(app, client, key, ada, fake_llm):
    fake_llm.fail(400, "model not found upstream")
    failed = _ask(client, key, _body())
    app.config["API_REPLY_SECONDS"] = 1

    waiting = _ask(client, key, _body("Anyone?"), worker=False)

    assert failed.status_code == 502 and failed.json["error"]["code"] == "reply_failed"
    assert "Ada could not answer" in failed.json["error"]["message"]
    assert waiting.status_code == 503 and waiting.json["error"]["code"] == "no_worker"
    assert "still arrives in the chat" in waiting.json["error"]["message"]


def test_the_requests_history_continues_the_chat_it_repeats_and_never_rewrites_it(client, key, ada, fake_llm):
    fake_llm.reply("First answer.")
    _ask(client, key, _body("First question."))
    fake_llm.reply("Second answer.")

    again = _ask(
        client,
        key,
        _body("Second question.", history=[("user", "First question."), ("assistant", "First answer.")]),
    )
    other = _ask(
        client, key, _body("Another.", history=[("user", "First question."), ("assistant", "Edited answer.")])
    )

    assert again.status_code == other.status_code == 200
    first, second = _api_chats()
    assert _turns(first) == [
        ("user", "First question."),
        ("assistant", "First answer."),
        ("user", "Second question."),
        ("assistant", "Second answer."),
    ]
    assert _turns(second) == [
        ("user", "Another."),
        ("assistant", "ok"),
    ]  # a history Cairn never had: a new chat
    assert fake_llm.requests[1]["messages"][1:4] == [
        {"role": "user", "content": "dana: First question."},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "dana: Second question."},
    ]


@pytest.mark.parametrize(
    ("headers", "fields"),
    [
        ({"X-Cairn-Conversation": "thread-7"}, {}),
        ({}, {"metadata": {"conversation_id": "thread-7"}}),
        ({}, {"user": "thread-7"}),
    ],
    ids=["header", "metadata", "user"],
)
def test_a_client_id_continues_its_chat_whatever_the_history(client, key, ada, headers, fields):
    _ask(client, key, _body("One.", **fields), headers)
    _ask(client, key, _body("Two.", history=[("user", "something else")], **fields), headers)
    _ask(client, key, _body("Elsewhere."))

    named, unnamed = _api_chats()
    assert named.client_conversation_id == "thread-7"
    assert [t for t in _turns(named) if t[0] == "user"] == [("user", "One."), ("user", "Two.")]
    assert unnamed.client_conversation_id is None and len(_turns(unnamed)) == 2


def _ask_at_once(app, secret: str, bodies: list[dict], headers: dict) -> list:
    """POST each body on a thread of its own, all released at once; this thread answers their replies."""
    start, responses = threading.Barrier(len(bodies)), [None] * len(bodies)

    def post(i: int) -> None:
        client = app.test_client()
        start.wait()
        responses[i] = client.post("/v1/chat/completions", headers=_auth(secret, **headers), json=bodies[i])

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        SimpleWorker([rq_queue("replies")], connection=rq_queue().connection).work(burst=True)
        for thread in threads:
            thread.join(0.02)
    return responses


def test_simultaneous_requests_with_a_new_conversation_id_make_one_chat_with_every_turn(app, key, admin, ada):
    """Issue 31.14: five requests racing with a new id made five chats, and the id then followed the newest."""
    asked = [f"Turn {i}." for i in range(5)]

    answers = _ask_at_once(app, key, [_body(text) for text in asked], {"X-Cairn-Conversation": "race"})

    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    chats = _api_chats(admin)
    assert len(chats) == 1, [_turns(c) for c in chats]
    [chat] = chats
    assert chat.client_conversation_id == "race" and chat.client_agent_id == ada.id
    turns = _turns(chat)
    assert sorted(text for role, text in turns if role == "user") == asked
    assert [role for role, _ in turns].count("assistant") == 5

    later = _ask(app.test_client(), key, _body("And after."), {"X-Cairn-Conversation": "race"})
    assert later.status_code == 200 and [c.id for c in _api_chats(admin)] == [chat.id]


def test_one_id_names_one_chat_per_agent_and_a_discarded_chat_gives_its_id_to_a_new_one(
    client, key, admin, ada
):
    factories.agent(admin.account, "Basil")
    _ask(client, key, _body("To Ada.", user="garden"))
    _ask(client, key, _body("To Basil.", model="basil", user="garden"))
    ada_chat, basil_chat = _api_chats(admin)
    ada_chat.discarded_at = utcnow()
    db.session.commit()

    _ask(client, key, _body("Ada again.", user="garden"))

    *_, fresh = _api_chats(admin)
    assert [t for t in _turns(fresh) if t[0] == "user"] == [("user", "Ada again.")]
    assert (fresh.client_conversation_id, fresh.client_agent_id) == ("garden", ada.id)
    assert _api_chats(admin)[0].client_conversation_id is None  # the discarded chat let go of it
    assert len(_turns(basil_chat)) == 2 and basil_chat.client_conversation_id == "garden"


def test_another_persons_key_never_reaches_the_first_persons_chat(client, key, admin, member, ada):
    _ask(client, key, _body("Dana's secret plan.", user="shared-id"))
    _ask(client, key, _body("Dana again."))
    milo = _key(member)

    _ask(client, milo, _body("Milo here.", user="shared-id"))
    _ask(client, milo, _body("Milo again.", history=[("user", "Dana again."), ("assistant", "ok")]))

    danas = _api_chats(admin)
    milos = _api_chats(member)
    assert len(danas) == 2 and len(milos) == 2
    assert {t for chat in danas for t in _turns(chat)} == {
        ("user", "Dana's secret plan."),
        ("user", "Dana again."),
        ("assistant", "ok"),
    }
    assert all(chat.is_private for chat in milos) and not {c.id for c in danas} & {c.id for c in milos}


def test_the_chat_is_in_the_persons_sidebar_marked_as_via_api(client, auth, key, admin, member, ada):
    _ask(client, key, _body("From my terminal."))
    [chat] = _api_chats()

    auth.login(admin)
    listing = client.get("/chats/").text
    page = client.get(f"/chats/{chat.id}").text
    client.post("/logout")
    auth.login(member)

    assert "via API" in listing and f'href="/chats/{chat.id}"' in listing
    assert "started from an app through the API" in page  # the sidebar's mark, in its tooltip
    assert client.get(f"/chats/{chat.id}").status_code == 404  # private to Dana
    assert f'href="/chats/{chat.id}"' not in client.get("/chats/").text


def test_a_memory_from_an_earlier_chat_of_the_person_is_in_the_prompt_and_another_persons_is_not(
    client, key, admin, member, ada, fake_llm
):
    earlier = factories.chat(admin.account, [ada], people=[admin])
    factories.memory(ada, "Dana waters the roses on Sundays.", chat_id=earlier.id, audience="chat")
    milos = factories.chat(admin.account, [ada], people=[member])
    factories.memory(ada, "Milo is planning a surprise for Dana.", chat_id=milos.id, audience="chat")

    _ask(client, key, _body("When do I water the roses?"))

    prompt = fake_llm.requests[-1]["messages"][-1]["content"]
    assert "Dana waters the roses on Sundays." in prompt
    assert "surprise" not in json.dumps(fake_llm.requests[-1])


def test_the_exchange_is_consolidated_into_memory_like_any_one_to_one_chat(client, key, ada, fake_llm):
    fake_llm.reply("Noted.")
    _ask(client, key, _body("I water the roses on Sundays."))
    [chat] = _api_chats()
    fake_llm.reply(json.dumps({"journal": ["Dana waters the roses on Sundays."], "core": []}))

    with time_machine.travel(utcnow() + timedelta(hours=7)):
        assert consolidate_stale_chats() == {"chats": 1}  # idle for long enough, as any chat
        consolidate_chat(chat.id)

    memory = db.session.scalar(sa.select(AgentMemory))
    assert (memory.agent_id, memory.content) == (ada.id, "Dana waters the roses on Sundays.")
    assert (memory.chat_id, memory.audience) == (chat.id, "chat")  # heard where Dana's private chat may be


def test_past_the_limit_a_429_with_retry_after_shared_with_the_persons_pages(
    app, client, auth, key, admin, ada
):
    app.config["RATE_LIMIT_REPLIES"] = "2 per minute"
    web_chat = factories.chat(admin.account, [ada], people=[admin])
    auth.login(admin)
    client.post(f"/chats/{web_chat.id}/messages", data={"content": "From the page."})  # one of the two

    allowed = _ask(
        client, key, _body("missing model", model="nobody"), worker=False
    )  # counted before the model
    refused = _ask(client, key, _body(), worker=False)

    assert allowed.status_code == 404
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    error = refused.json["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "You are asking the agents too often" in error["message"]


def test_waiting_requests_take_the_persons_stream_slots_and_give_them_back(app, client, key, admin, ada):
    _ask(client, key, _body(stream=True))
    _ask(client, key, _body("Again."))
    assert events.open_stream_count(admin.id) == 0
    app.config["STREAM_MAX_PER_USER"] = 1
    release = events.take_stream_slot(admin.id, 1, 60)  # a chat page's stream holds the one slot

    refused = _ask(client, key, _body("A third."), worker=False)

    release()
    assert refused.status_code == 429 and refused.json["error"]["code"] == "rate_limit_exceeded"
    assert "Too many of your replies are open at once" in refused.json["error"]["message"]
    assert len(_api_chats()) == 2  # the third was refused before anything was posted


def test_the_api_needs_no_csrf_token(app, client, key, ada):
    app.config["WTF_CSRF_ENABLED"] = True

    assert _ask(client, key, _body()).status_code == 200


# A running Cairn, with the official openai client


@pytest.fixture
def cairn(live_app, start_worker, monkeypatch):
    """gunicorn as `make run` serves the web (gevent), one worker, redis-server, the fake model."""
    from webapp.runtime.processes import web_argv

    start_worker(threads=2)
    port = free_port()
    env = {**worker_env(live_app), "RATE_LIMIT_REPLIES": "12 per minute", "STREAM_KEEPALIVE_SECONDS": "1"}
    server = subprocess.Popen(web_argv(port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(url + "/healthz"), 60, "gunicorn")
    yield url
    server.terminate()
    server.wait(30)


def _answers(url: str) -> bool:
    import httpx2 as httpx

    try:
        return httpx.get(url, timeout=5).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@pytest.mark.integration
def test_the_openai_client_talks_to_an_agent_of_a_running_cairn(cairn, live_app, fake_llm):
    import openai

    acme = factories.account("Acme")
    dana, milo = factories.user(acme, "dana@example.com"), factories.user(acme, "milo@example.com", "member")
    ada = factories.agent(acme, "Ada", system_prompt="You are Ada.")
    factories.agent(factories.account("Globex"), "Globex bot")
    earlier = factories.chat(acme, [ada], people=[dana])
    factories.memory(ada, "Dana waters the roses on Sundays.", chat_id=earlier.id, audience="chat")
    dana_key, milo_key = _key(dana), _key(milo)
    client = openai.OpenAI(base_url=f"{cairn}/v1", api_key=dana_key, max_retries=0, timeout=60)

    assert [m.id for m in client.models.list()] == ["ada"]

    fake_llm.reply("You water them on Sundays.", model="ada-model")  # summaries have their own
    plain = client.chat.completions.create(
        model="ada", messages=[{"role": "user", "content": "When do I water?"}]
    )
    assert plain.choices[0].message.content == "You water them on Sundays."
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (11, 5)
    assert "Dana waters the roses on Sundays." in _reply_requests(fake_llm)[-1]["messages"][-1]["content"]
    [chat] = _api_chats(dana)
    assert chat.is_private and chat.started_by_id == dana.id

    fake_llm.chunk_delay = 0.05
    fake_llm.reply("Sunday mornings are best, before the heat.", model="ada-model")
    history = [
        {"role": "user", "content": "When do I water?"},
        {"role": "assistant", "content": "You water them on Sundays."},
        {"role": "user", "content": "What time?"},
    ]
    with client.chat.completions.stream(model="ada", messages=history) as stream:
        pieces = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(pieces) == "Sunday mornings are best, before the heat." and len(pieces) > 1
    assert final.choices[0].finish_reason == "stop"
    assert [c.id for c in _api_chats(dana)] == [chat.id]  # the history continued it
    assert len(_turns(chat)) == 4

    fake_llm.chunk_delay = 0
    for content in ("Note one.", "Note two."):
        client.chat.completions.create(
            model="ada",
            messages=[{"role": "user", "content": content}],
            extra_headers={"X-Cairn-Conversation": "notes"},
        )
    notes = [c for c in _api_chats(dana) if c.client_conversation_id == "notes"]
    assert len(notes) == 1 and [t for t in _turns(notes[0]) if t[0] == "user"] == [
        ("user", "Note one."),
        ("user", "Note two."),
    ]

    milos = openai.OpenAI(base_url=f"{cairn}/v1", api_key=milo_key, max_retries=0, timeout=60)
    milos.chat.completions.create(
        model="ada", messages=history, extra_headers={"X-Cairn-Conversation": "notes"}
    )
    assert len(_turns(chat)) == 4 and len(_turns(notes[0])) == 4  # Dana's chats are out of Milo's reach
    assert all(c.started_by_id == milo.id and c.is_private for c in _api_chats(milo))
    assert "Dana waters" not in _reply_requests(fake_llm)[-1]["messages"][-1]["content"]

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="globex-bot", messages=[{"role": "user", "content": "Hi"}])
    assert missing.value.code == "model_not_found"

    db.session.scalar(sa.select(ApiKey).where(ApiKey.user_id == dana.id)).revoke()
    db.session.commit()
    with pytest.raises(openai.AuthenticationError):
        client.models.list()

    refusals = []
    for _ in range(12):  # refused requests count too: Milo may ask 12 times a minute, and asked once already
        try:
            milos.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "Hi"}])
        except openai.APIStatusError as error:
            refusals.append(error)
    assert [e.status_code for e in refusals] == [404] * 11 + [429]
    assert isinstance(refusals[-1], openai.RateLimitError) and refusals[-1].code == "rate_limit_exceeded"
    assert int(refusals[-1].response.headers["Retry-After"]) > 0


def test_a_request_waiting_for_its_reply_ends_when_its_person_is_removed(app, client, admin, ada):
    """Issue 31, item 1: a /v1 request waits for a reply nobody writes; its person is removed meanwhile: the
    request ends within seconds, refused, instead of waiting out its time."""
    from webapp.models import User

    milo = factories.user(admin.account, "milo@example.com", "member")
    secret, milo_id, admin_id = _key(milo), milo.id, admin.id
    app.config.update(STREAM_KEEPALIVE_SECONDS=0.5, API_REPLY_SECONDS=30)

    def remove_milo():
        with app.app_context():
            wait_for(lambda: _api_chats(), seconds=10, what="the request to ask")
            db.session.get(User, milo_id).remove(by=db.session.get(User, admin_id))
            db.session.commit()

    thread = threading.Thread(target=remove_milo)
    thread.start()
    started = time.monotonic()
    refused = _ask(client, secret, _body("Still there?"), worker=False)
    thread.join()

    assert refused.status_code == 403 and refused.json["error"]["code"] == "access_revoked"
    assert time.monotonic() - started < 10


def test_restoring_a_person_revives_neither_their_keys_nor_their_sign_in_link(app, client, admin, ada):
    from webapp.models import User

    milo = factories.user(admin.account, "milo@example.com", "member")
    secret = _key(milo)
    invited = User(account=admin.account, email="ines@example.com", role="member")
    db.session.add(invited)
    link_token = invited.invite()
    db.session.commit()
    for person in (milo, invited):
        person.remove(by=admin)
    db.session.commit()
    for person in (milo, invited):
        person.restore()
    db.session.commit()

    refused = client.get("/v1/models", headers=_auth(secret))
    assert refused.status_code == 401
    assert User.for_invite(link_token) is None
    assert client.get(f"/welcome/{link_token}").status_code in (404, 410, 200)
    fresh = _key(db.session.get(User, milo.id))
    assert client.get("/v1/models", headers=_auth(fresh)).status_code == 200
