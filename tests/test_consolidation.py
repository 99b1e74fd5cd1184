"""Spec 000, corrected by DESIGN.md 5.1: idle chats, group and one-to-one, become each agent's own memories."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat, consolidate_stale_chats, stale_chats_query
from webapp.jobs.extraction import chunk_messages
from webapp.jobs.queue import enqueue, rq_queue
from webapp.llm import LLMError
from webapp.models import AgentMemory, AuditLog, Chat, ChatAgent, JobRun, LlmCall
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens


def _hours_ago(hours: float):
    return time_machine.travel(utcnow() - timedelta(hours=hours) + timedelta(seconds=1), tick=False)


def _extraction(journal=(), core=()) -> str:
    return json.dumps({"journal": list(journal), "core": list(core)})


def _memories(agent) -> list[tuple[str, str]]:
    db.session.expire_all()
    rows = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id)
    )
    return [(m.memory_type, m.content) for m in rows]


def _cursor(chat, agent) -> int | None:
    db.session.expire_all()
    return db.session.scalar(
        sa.select(ChatAgent.last_consolidated_message_id).where(
            ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id
        )
    )


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", system_prompt="You are Ada, a gardener.")


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


@pytest.fixture
def group_chat(admin, ada, basil):
    chat = factories.chat(admin.account, [ada, basil], "Garden club")
    with _hours_ago(7):
        factories.message(chat, "Hello agents!", author=admin)
        factories.message(chat, "Hello! I'm happy to help.", author=ada)
    return chat


def _finder_chat_ids() -> list[int]:
    return [job.args[0] for job in rq_queue().get_jobs() if job.func_name.endswith("consolidate_chat")]


# The finder (spec section 8, finder tests)


def test_finder_enqueues_consolidation_for_idle_group_chats(group_chat):
    assert consolidate_stale_chats() == {"chats": 1}
    assert _finder_chat_ids() == [group_chat.id]


def test_finder_skips_recently_active_chats(group_chat, admin):
    factories.message(group_chat, "New", author=admin)

    consolidate_stale_chats()

    assert _finder_chat_ids() == []


def test_finder_skips_discarded_chats(group_chat, admin, ada):
    discarded = factories.chat(admin.account, [ada], manual=True)
    with _hours_ago(7):
        factories.message(discarded, "Old", author=admin)
    discarded.discarded_at = utcnow()
    db.session.commit()

    consolidate_stale_chats()

    assert _finder_chat_ids() == [group_chat.id]


def test_finder_enqueues_idle_one_to_one_chats_of_agents_that_turn_them_into_memories(group_chat, admin, ada):
    cleo = factories.agent(admin.account, "Cleo", consolidates_direct_chats=False)
    with_ada, with_cleo = factories.chat(admin.account, [ada]), factories.chat(admin.account, [cleo])
    with _hours_ago(7):
        factories.message(with_ada, "Old", author=admin)
        factories.message(with_cleo, "Old", author=admin)

    consolidate_stale_chats()

    assert sorted(_finder_chat_ids()) == sorted([group_chat.id, with_ada.id])


def test_finder_skips_consolidated_chats_without_new_messages(group_chat):
    group_chat.last_consolidated_at = utcnow() - timedelta(hours=1)
    group_chat.last_consolidated_message_id = max(m.id for m in group_chat_messages(group_chat))
    db.session.commit()

    consolidate_stale_chats()

    assert _finder_chat_ids() == []


def test_finder_includes_consolidated_chats_with_new_idle_messages(group_chat, admin):
    group_chat.last_consolidated_at = utcnow() - timedelta(hours=8)
    group_chat.last_consolidated_message_id = min(m.id for m in group_chat_messages(group_chat))
    db.session.commit()
    with _hours_ago(7):
        factories.message(group_chat, "New old", author=admin)

    consolidate_stale_chats()

    assert _finder_chat_ids() == [group_chat.id]


def test_the_finder_is_one_query(group_chat, admin, ada):
    quiet = factories.agent(admin.account, "Quiet", consolidates_direct_chats=False)
    for agents, manual in [([ada], True), ([ada], False), ([quiet], False)] * 2:
        chat = factories.chat(admin.account, agents, manual=manual)
        with _hours_ago(7):
            factories.message(chat, "Old", author=admin)

    with count_queries() as counted:
        found = db.session.scalars(stale_chats_query(utcnow(), timedelta(hours=6))).all()

    assert len(found) == 5  # the group chat, two more, and Ada's two one-to-one chats; not Quiet's
    assert counted.count == 1


def group_chat_messages(chat):
    from webapp.models import Message

    return db.session.scalars(sa.select(Message).where(Message.chat_id == chat.id)).all()


# One-to-one chats (issue 20, item 7)


@pytest.fixture
def one_to_one(admin, ada):
    chat = factories.chat(admin.account, [ada], "Tea talk")
    with _hours_ago(7):
        factories.message(chat, "I only drink green tea.", author=admin)
        factories.message(chat, "Green tea it is.", author=ada)
    return chat


def test_an_idle_one_to_one_chat_is_consolidated_once(one_to_one, ada, fake_llm):
    last_id = max(m.id for m in group_chat_messages(one_to_one))
    fake_llm.default_text = _extraction(journal=["Dana only drinks green tea"])

    consolidate_stale_chats()
    first = consolidate_chat(one_to_one.id)
    consolidate_stale_chats()
    second = consolidate_chat(one_to_one.id)

    assert _finder_chat_ids() == [one_to_one.id]  # the second finder queued nothing more
    assert [r["model"] for r in fake_llm.requests] == ["ada-model"]  # the second run asked no model
    assert (first["agents"], first["journal"], second["agents"]) == (1, 1, 0)
    assert "\n1 dana: I only drink green tea.\n" in fake_llm.requests[0]["messages"][0]["content"]
    assert _memories(ada) == [("journal", "Dana only drinks green tea")]
    assert _cursor(one_to_one, ada) == last_id
    assert db.session.get(Chat, one_to_one.id).last_consolidated_message_id == last_id


def test_an_agent_can_keep_its_one_to_one_chats_out_of_memory(one_to_one, group_chat, ada, basil, fake_llm):
    ada.consolidates_direct_chats = False
    db.session.commit()
    fake_llm.default_text = _extraction(journal=["Something said"])

    consolidate_stale_chats()
    skipped = consolidate_chat(one_to_one.id, force=True)  # not even when asked for
    consolidate_chat(group_chat.id)

    assert _finder_chat_ids() == [group_chat.id]
    assert skipped == {"skipped": 1} and _cursor(one_to_one, ada) is None
    assert sorted(r["model"] for r in fake_llm.requests) == ["ada-model", "basil-model"]  # the group chat's
    assert _memories(ada) == [("journal", "Something said")]


def test_a_memory_saved_during_the_chat_is_not_stored_again(admin, ada, fake_llm):
    from webapp.jobs.replies import request_replies, respond

    chat = factories.chat(admin.account, [ada])
    with _hours_ago(7):
        factories.message(chat, "Remember that I like green tea.", author=admin)
        replies = request_replies(chat, [ada])
        db.session.commit()
        fake_llm.reply(
            tool_calls=[("save_memory", {"content": "Dana likes green tea.", "memory_type": "journal"})]
        )
        fake_llm.reply("I'll remember that.")
        respond([r.id for r in replies])
    fake_llm.requests.clear()
    # A model that extracts the saved fact again anyway, in other case and spacing, and one new fact.
    fake_llm.reply(_extraction(journal=["dana likes  GREEN tea", "Dana asked Ada to remember things"]))

    counts = consolidate_chat(chat.id)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert "\n- Dana likes green tea.\n" in prompt  # extraction is shown what save_memory added
    assert "I'll remember that." in prompt
    assert _memories(ada) == [
        ("journal", "Dana likes green tea."),
        ("journal", "Dana asked Ada to remember things"),
    ]
    assert (counts["journal"], counts["duplicates"]) == (1, 1)


# The per-chat job (spec section 8, worker tests)


def test_job_skips_recently_active_chats(group_chat, admin, ada, fake_llm):
    factories.message(group_chat, "New message", author=admin)

    assert consolidate_chat(group_chat.id) == {"skipped": 1}
    assert fake_llm.requests == [] and _memories(ada) == []


def test_each_agent_extracts_with_its_own_model(group_chat, ada, basil, fake_llm):
    fake_llm.reply(_extraction(journal=["User prefers concise responses"]), model="ada-model")
    fake_llm.reply(_extraction(core=["I value brevity"]), model="basil-model")

    counts = consolidate_chat(group_chat.id)

    assert sorted(r["model"] for r in fake_llm.requests) == ["ada-model", "basil-model"]
    assert _memories(ada) == [("journal", "User prefers concise responses")]
    assert _memories(basil) == [("core", "I value brevity")]
    assert counts == {
        "agents": 2,
        "chunks": 2,
        "journal": 1,
        "core": 1,
        "duplicates": 0,
        "malformed": 0,
        "by_agent": {
            "Ada": {"chunks": 1, "journal": 1, "core": 0, "duplicates": 0, "malformed": 0},
            "Basil": {"chunks": 1, "journal": 0, "core": 1, "duplicates": 0, "malformed": 0},
        },
    }
    ada_prompt = next(r for r in fake_llm.requests if r["model"] == "ada-model")["messages"][0]["content"]
    assert ada_prompt.startswith("You are Ada, a gardener.\n")
    assert "\n1 dana: Hello agents!\n2 Ada: Hello! I'm happy to help." in ada_prompt
    assert "Everything you list is added as a new memory." in ada_prompt  # it promises only what the job does
    assert "update or refine" not in ada_prompt
    assert [a.action for a in db.session.scalars(sa.select(AuditLog))] == ["memory_create", "memory_create"]


def test_job_tracks_the_last_consolidated_message_per_agent_and_for_the_chat(
    group_chat, ada, basil, fake_llm
):
    last_id = max(m.id for m in group_chat_messages(group_chat))

    consolidate_chat(group_chat.id)

    chat = db.session.get(Chat, group_chat.id)
    assert chat.last_consolidated_message_id == last_id and chat.last_consolidated_at is not None
    assert _cursor(group_chat, ada) == _cursor(group_chat, basil) == last_id


def test_subsequent_runs_only_send_new_messages(group_chat, admin, ada, basil, fake_llm):
    fake_llm.default_text = _extraction(journal=["First"])
    consolidate_chat(group_chat.id)
    with _hours_ago(7):
        factories.message(group_chat, "Another message", author=admin)
    fake_llm.requests.clear()

    consolidate_chat(group_chat.id)

    prompts = [r["messages"][0]["content"] for r in fake_llm.requests]
    assert len(prompts) == 2
    assert all("Another message" in p and "Hello agents!" not in p for p in prompts)


def test_an_identical_memory_is_not_added_again(group_chat, ada, basil, fake_llm):
    factories.memory(ada, "User likes tea", "journal")
    factories.memory(ada, "Old deleted fact", "core", deleted_at=utcnow())
    fake_llm.reply(
        _extraction(journal=["user likes TEA", "New fact", "New fact"], core=["Old deleted fact"]),
        model="ada-model",
    )

    counts = consolidate_chat(group_chat.id)

    assert _memories(ada) == [
        ("journal", "User likes tea"),
        ("core", "Old deleted fact"),
        ("journal", "New fact"),
        ("core", "Old deleted fact"),
    ]
    assert counts["duplicates"] == 2


def test_malformed_output_is_counted_and_fenced_json_is_read(group_chat, ada, basil, fake_llm):
    fake_llm.reply("I'd rather not answer in JSON.", model="ada-model")
    fake_llm.reply('Sure!\n```json\n{"journal": ["Fenced fact"], "core": []}\n```', model="basil-model")

    counts = consolidate_chat(group_chat.id)

    assert counts["malformed"] == 1
    assert _memories(ada) == [] and _memories(basil) == [("journal", "Fenced fact")]


def test_retry_after_a_failure_mid_chat_creates_no_duplicates(app, group_chat, ada, basil, fake_llm):
    last_id = max(m.id for m in group_chat_messages(group_chat))
    fake_llm.reply(_extraction(journal=["Ada's fact"]), model="ada-model")
    fake_llm.fail(503, "overloaded", model="basil-model")

    with pytest.raises(LLMError) as raised:
        consolidate_chat(group_chat.id)

    assert raised.value.retryable and "Basil" in str(raised.value) and "HTTP 503" in str(raised.value)
    assert _cursor(group_chat, ada) == last_id
    assert _cursor(group_chat, basil) is None  # the failed agent's cursor does not move
    assert db.session.get(Chat, group_chat.id).last_consolidated_message_id is None
    assert _memories(ada) == [("journal", "Ada's fact")]

    fake_llm.requests.clear()
    fake_llm.reply(_extraction(journal=["Basil's fact"]), model="basil-model")
    consolidate_chat(group_chat.id)  # what RQ's retry runs

    assert [r["model"] for r in fake_llm.requests] == ["basil-model"]
    assert _memories(ada) == [("journal", "Ada's fact")] and _memories(basil) == [("journal", "Basil's fact")]
    assert db.session.get(Chat, group_chat.id).last_consolidated_message_id == last_id
    runs = sa.select(JobRun).where(JobRun.job_type == "consolidate").order_by(JobRun.id)
    assert [r.status for r in db.session.scalars(runs)] == ["failed", "done"]


def test_a_crash_after_some_chunks_resumes_after_the_last_saved_chunk(
    app, group_chat, admin, ada, basil, fake_llm
):
    app.config["CONSOLIDATION_CHUNK_TOKENS"] = 30
    with _hours_ago(7):
        for i in range(3):
            factories.message(group_chat, f"Long message number {i} " + "about roses " * 10, author=admin)
    basil.paused = True
    db.session.commit()
    fake_llm.reply(_extraction(journal=["chunk one"]), model="ada-model")
    fake_llm.reply(_extraction(journal=["chunk two"]), model="ada-model")
    fake_llm.fail(500, "crashed", model="ada-model")

    with pytest.raises(LLMError):
        consolidate_chat(group_chat.id)
    saved_cursor = _cursor(group_chat, ada)
    fake_llm.requests.clear()
    fake_llm.default_text = _extraction(journal=["the rest"])
    consolidate_chat(group_chat.id)

    assert saved_cursor is not None
    assert _memories(ada) == [("journal", "chunk one"), ("journal", "chunk two"), ("journal", "the rest")]
    assert all("number 0" not in r["messages"][0]["content"] for r in fake_llm.requests)


def test_new_core_memories_are_carried_into_the_next_chunk(app, group_chat, admin, ada, basil, fake_llm):
    app.config["CONSOLIDATION_CHUNK_TOKENS"] = 8  # one message per chunk
    basil.paused = True
    db.session.commit()
    fake_llm.reply(_extraction(core=["I care for old roses"]), model="ada-model")

    consolidate_chat(group_chat.id)

    ada_prompts = [r["messages"][0]["content"] for r in fake_llm.requests]
    assert len(ada_prompts) == 2
    assert "- I care for old roses" not in ada_prompts[0] and "- I care for old roses" in ada_prompts[1]


def test_a_250k_token_transcript_splits_into_three_whole_chunks():
    message = "word " * 9_996  # 10,000 tokens with its author prefix
    lines = [(i, f"[dana]: {message}") for i in range(25)]
    assert sum(count_tokens(text) for _, text in lines) == pytest.approx(250_000, rel=0.01)

    chunks = chunk_messages(lines, 100_000)

    assert [len(c) for c in chunks] == [10, 10, 5]
    assert [line for chunk in chunks for line in chunk] == lines  # whole messages, none lost, in order


def test_agents_are_consolidated_concurrently(app, admin, fake_llm):
    agents = [factories.agent(admin.account, f"Agent{i}") for i in range(5)]
    chat = factories.chat(admin.account, agents)
    with _hours_ago(7):
        factories.message(chat, "Hello all", author=admin)
    app.config["CONSOLIDATION_CONCURRENCY"] = 5
    app.config["LOCAL_LLM"] = False  # a provider: a model that runs here answers one request at a time
    app.config["CONNECTION_CONCURRENCY"] = 5
    fake_llm.delay = 0.5

    counts = consolidate_chat(chat.id)

    assert counts["agents"] == 5
    assert fake_llm.max_in_flight == 5  # all five asked at once (each answer takes 0.5 s), not one by one


def test_paused_agents_are_left_out(group_chat, ada, basil, fake_llm):
    basil.paused = True
    db.session.commit()

    consolidate_chat(group_chat.id)

    assert [r["model"] for r in fake_llm.requests] == ["ada-model"]


def test_a_second_run_that_read_the_same_cursor_saves_nothing(group_chat, ada, fake_llm):
    from webapp.jobs.consolidation import AgentOutcome, CursorMoved, _save_chunk
    from webapp.jobs.extraction import Extracted

    link_id = db.session.scalar(sa.select(ChatAgent.id).where(ChatAgent.agent_id == ada.id))
    through = max(m.id for m in group_chat_messages(group_chat))
    extracted = {"journal": [Extracted("a paraphrase the hash check would miss", [], False)], "core": []}
    _save_chunk(link_id, ada.id, group_chat.id, extracted, None, (1, through), AgentOutcome("Ada"))

    with pytest.raises(CursorMoved):  # the other run also started from no cursor
        _save_chunk(
            link_id,
            ada.id,
            group_chat.id,
            {"journal": [Extracted("another paraphrase", [], False)], "core": []},
            None,
            (1, through),
            AgentOutcome("Ada"),
        )

    assert _memories(ada) == [("journal", "a paraphrase the hash check would miss")]
    assert _cursor(group_chat, ada) == through


# An agent added later (issue 12, item 10)


def test_an_agent_added_later_remembers_only_what_was_said_after_it_joined(
    client, signed_in, group_chat, ada, fake_llm
):
    celia = factories.agent(signed_in.account, "Celia")
    client.post(f"/chats/{group_chat.id}/agents", data={"agent_id": celia.id})
    factories.message(group_chat, "Celia, I planted tulips today.", author=signed_in)
    for model in ("ada-model", "basil-model", "celia-model"):
        fake_llm.reply(_extraction(journal=[f"{model} remembers"]), model=model)

    consolidate_chat(group_chat.id, force=True)

    prompts = {r["model"]: r["messages"][0]["content"] for r in fake_llm.requests}
    assert "Hello agents!" in prompts["ada-model"] and "tulips" in prompts["ada-model"]
    assert "Hello agents!" not in prompts["celia-model"] and "tulips" in prompts["celia-model"]
    assert "Celia joined the conversation." in prompts["celia-model"]
    assert _memories(celia) == [("journal", "celia-model remembers")]


def test_an_agent_added_to_a_chat_without_messages_starts_from_the_first(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada], manual=True)
    celia = factories.agent(signed_in.account, "Celia")

    client.post(f"/chats/{chat.id}/agents", data={"agent_id": celia.id})

    assert _cursor(chat, celia) is None


def test_an_html_body_fails_the_agent_retryably_and_never_crashes_the_job(group_chat, ada, basil, fake_llm):
    fake_llm.html("application/json", model="ada-model")  # a proxy's page under a JSON content type
    fake_llm.reply(_extraction(journal=["Basil's fact"]), model="basil-model")

    with pytest.raises(LLMError) as raised:
        consolidate_chat(group_chat.id)

    assert raised.value.retryable and "not a completion" in str(raised.value)
    assert _cursor(group_chat, ada) is None and _memories(basil) == [("journal", "Basil's fact")]
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "consolidate"))
    assert run.status == "failed" and "JSONDecodeError" not in run.error
    statuses = db.session.scalars(sa.select(LlmCall.status).order_by(LlmCall.model))
    assert sorted(statuses) == ["error", "ok"]


def test_a_failed_run_records_what_the_other_agents_did(group_chat, ada, basil, fake_llm):
    fake_llm.html(model="ada-model")  # a proxy's sign-in page
    fake_llm.reply("Nothing in this chat is worth remembering, I think.", model="basil-model")

    with pytest.raises(LLMError) as raised:
        consolidate_chat(group_chat.id)

    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "consolidate"))
    assert run.status == "failed" and run.error == str(raised.value)
    assert run.error.startswith("1 of 2 agents failed (Ada: The model's server answered with something")
    assert "Sign in to the proxy" in run.error
    assert run.counts == {
        "agents": 2,
        "failed": 1,
        "chunks": 1,
        "journal": 0,
        "core": 0,
        "duplicates": 0,
        "malformed": 1,  # Basil's prose answer
        "by_agent": {
            "Ada": {"chunks": 0, "journal": 0, "core": 0, "duplicates": 0, "malformed": 0, "failed": 1},
            "Basil": {"chunks": 1, "journal": 0, "core": 0, "duplicates": 0, "malformed": 1},
        },
    }


def test_a_second_consolidation_of_a_chat_is_not_queued_while_one_waits_or_runs(group_chat):
    assert enqueue(consolidate_chat, group_chat.id) is not None
    assert enqueue(consolidate_chat, group_chat.id, True) is None  # queued: the click follows that one
    db.session.commit()
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "consolidate"))
    run.status = "running"
    db.session.commit()
    assert enqueue(consolidate_chat, group_chat.id) is None  # running
    run.status = "done"
    db.session.commit()
    assert enqueue(consolidate_chat, group_chat.id) is not None
