"""Spec 002 with DESIGN.md 5.4: soft delete, constitutional memories, the refinement tool and session."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.queue import rq_queue
from webapp.jobs.refinement import agents_due_query, refine_agent, refine_due, trigger_if_over_budget
from webapp.models import AgentMemory, AuditLog, JobRun
from webapp.models.audit import UndoConflict, dedup_for_agent, rollback_session, undo
from webapp.models.memories import ConstitutionalMemoryError, active_memories, core_token_usage, like_pattern
from webapp.prompting.build import build_prompt
from webapp.timeutil import utcnow
from webapp.tools.refinement import RefinementSession


@pytest.fixture
def agent(admin):
    return factories.agent(admin.account, "Ada", core_token_budget=50)


def _session(agent, **limits) -> RefinementSession:
    return RefinementSession(
        agent=agent,
        session_id="s-1",
        start_tokens=core_token_usage(agent.id),
        max_mutations=limits.get("max_mutations", 10),
        floor=limits.get("floor", 0.5),
        page_tokens=limits.get("page_tokens", 4000),
    )


def _state(agent) -> list[tuple]:
    """Every memory of the agent exactly: content, type, flags, deletion."""
    db.session.expire_all()
    rows = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id)
    )
    return [(m.id, m.content, m.memory_type, m.constitutional, m.deleted_at) for m in rows]


def _actions(session_id=None) -> list[str]:
    query = sa.select(AuditLog.action).order_by(AuditLog.id)
    if session_id:
        query = query.where(AuditLog.session_id == session_id)
    return list(db.session.scalars(query))


def _call(action, **arguments):
    return ("refine_memory", {"action": action, **arguments})


# Phase 1: the model


def test_soft_delete_and_restore_keep_the_row(agent):
    memory = factories.memory(agent, "likes tea")
    memory.soft_delete()
    db.session.commit()

    assert db.session.scalars(active_memories(agent.id)).all() == []
    memory.restore()
    db.session.commit()
    assert db.session.scalars(active_memories(agent.id)).all() == [memory]


def test_no_path_deletes_a_constitutional_memory(agent):
    memory = factories.memory(agent, "I never lie", constitutional=True)

    with pytest.raises(ConstitutionalMemoryError):
        memory.soft_delete()
    with pytest.raises(ConstitutionalMemoryError):
        memory.deleted_at = utcnow()
    db.session.rollback()
    session = _session(agent)
    assert (
        "Cannot delete constitutional memories"
        in session.run({"action": "delete", "id": str(memory.id)})["error"]
    )
    assert (
        "Cannot consolidate constitutional"
        in session.run({"action": "consolidate", "ids": str(memory.id), "content": "x"})["error"]
    )
    assert dedup_for_agent(agent.id, session_id=None, via="test") == 0
    assert db.session.get(AgentMemory, memory.id).deleted_at is None


def test_a_deleted_memory_never_reaches_a_prompt(admin, agent):
    factories.memory(agent, "visible core")
    factories.memory(agent, "deleted core").soft_delete()
    factories.memory(agent, "deleted journal", "journal").soft_delete()
    db.session.commit()
    chat = factories.chat(admin.account, [agent])

    context = build_prompt(chat, agent).messages[-1]["content"]

    assert "visible core" in context and "deleted" not in context


def test_deleted_memories_do_not_count_toward_core_usage(agent):
    kept = factories.memory(agent, "one two three")
    factories.memory(agent, "four five six seven").soft_delete()
    db.session.commit()

    assert core_token_usage(agent.id) == kept.token_estimate


def test_dedup_keeps_the_oldest_and_audits_the_rest(agent):
    first = factories.memory(agent, "Likes tea")
    factories.memory(agent, "likes TEA ")
    factories.memory(agent, "Likes tea")
    other = factories.memory(agent, "Plays chess")

    assert dedup_for_agent(agent.id, session_id="s", via="test") == 2

    assert [m.id for m in db.session.scalars(active_memories(agent.id))] == [first.id, other.id]
    assert _actions("s") == ["memory_dedup", "memory_dedup"]


def test_search_escapes_like_wildcards(agent):
    factories.memory(agent, "100% sure about tea")
    factories.memory(agent, "1000 cups")
    factories.memory(agent, "snake_case")
    factories.memory(agent, "snakeXcase")

    assert [r["content"] for r in _session(agent).run({"action": "search", "query": "100%"})["results"]] == [
        "100% sure about tea"
    ]
    assert [r["content"] for r in _session(agent).run({"action": "search", "query": "e_c"})["results"]] == [
        "snake_case"
    ]
    assert like_pattern("a%b_c") == "%a\\%b\\_c%"


# Phase 2: the tool


def test_consolidate_merges_keeps_the_earliest_date_and_audits(agent):
    old = factories.memory(agent, "Dana likes tea", created_at=utcnow() - timedelta(days=30))
    new = factories.memory(agent, "Dana likes green tea")
    session = _session(agent)

    result = session.run(
        {"action": "consolidate", "ids": f"{old.id}, {new.id}", "content": "Dana likes green tea."}
    )

    merged = db.session.get(AgentMemory, result["new_id"])
    assert result["type"] == "consolidated" and result["merged_count"] == 2
    assert merged.created_at == old.created_at and merged.memory_type == "core"
    assert all(db.session.get(AgentMemory, m.id).deleted_at for m in (old, new))
    assert _actions("s-1") == [
        "memory_refinement_consolidate_create",
        "memory_refinement_consolidate",
        "memory_refinement_consolidate",
    ]
    assert session.stats["consolidated"] == 2


def test_update_delete_protect_each_audit_with_before_and_after(agent):
    a = factories.memory(agent, "first draft")
    b = factories.memory(agent, "obsolete")
    c = factories.memory(agent, "I value honesty")
    session = _session(agent, floor=0)

    assert session.run({"action": "update", "id": str(a.id), "content": "final"})["type"] == "updated"
    assert session.run({"action": "delete", "id": str(b.id)}) == {"type": "deleted", "count": 1}
    assert session.run({"action": "protect", "id": str(c.id)})["type"] == "protected"

    rows = db.session.scalars(
        sa.select(AuditLog).where(AuditLog.session_id == "s-1").order_by(AuditLog.id)
    ).all()
    assert [r.action for r in rows] == [
        "memory_refinement_update",
        "memory_refinement_delete",
        "memory_refinement_protect",
    ]
    assert rows[0].data["before"]["content"] == "first draft" and rows[0].data["after"]["content"] == "final"
    assert rows[1].data["after"]["deleted_at"] is not None
    assert rows[2].data["after"]["constitutional"] is True
    assert session.stats == {"consolidated": 0, "updated": 1, "deleted": 1, "protected": 1}


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"action": "explode"}, "Invalid action 'explode'"),
        ({"action": "search"}, "query is required for search"),
        ({"action": "consolidate", "content": "x"}, "ids is required for consolidate"),
        ({"action": "update", "id": "1"}, "content is required for update"),
        ({"action": "update", "id": "999", "content": "x"}, "Memory #999 not found"),
        ({"action": "delete"}, "id or ids is required for delete"),
        ({"action": "delete", "ids": "one, two"}, "ids must be memory numbers"),
        ({"action": "complete"}, "summary is required for complete"),
        ({"action": "update", "id": "{id}", "content": "x" * 10_001}, "1 to 10,000 characters"),
    ],
)
def test_bad_calls_get_error_results(agent, arguments, error):
    memory = factories.memory(agent, "something")
    arguments = {k: v.replace("{id}", str(memory.id)) for k, v in arguments.items()}

    result = _session(agent).run(arguments)

    assert result["type"] == "error" and error in result["error"]
    assert "search" in result["allowed_actions"]


def test_another_agents_memory_is_not_found(admin, agent):
    other = factories.memory(factories.agent(admin.account, "Basil"), "not yours")

    result = _session(agent).run({"action": "delete", "id": str(other.id)})

    assert result == {"type": "deleted", "count": 0}
    assert db.session.get(AgentMemory, other.id).deleted_at is None


def test_the_mutation_cap_holds(agent):
    memories = [factories.memory(agent, f"memory number {i}") for i in range(5)]
    session = _session(agent, max_mutations=2, floor=0)

    results = [
        session.run({"action": "update", "id": str(m.id), "content": f"short {i}"})
        for i, m in enumerate(memories)
    ]

    assert [r["type"] for r in results] == ["updated", "updated", "error", "error", "error"]
    assert "at most 2 changes" in results[2]["error"]
    assert session.run({"action": "search", "query": "short"})["count"] == 2  # reading is still allowed


def test_the_cap_counts_memories_not_calls(agent):
    memories = [factories.memory(agent, f"memory number {i}") for i in range(20)]
    ids = [str(m.id) for m in memories]
    session = _session(agent, max_mutations=10, floor=0)

    too_many = session.run({"action": "delete", "ids": ",".join(ids[:14])})
    deleted = session.run({"action": "delete", "ids": ",".join(ids[:4])})
    merged = session.run({"action": "consolidate", "ids": ",".join(ids[4:9]), "content": "five in one"})
    over = session.run({"action": "delete", "ids": ",".join(ids[9:11])})
    last = session.run({"action": "update", "id": ids[9], "content": "the tenth change"})
    after = session.run({"action": "protect", "id": ids[10]})

    assert too_many["type"] == "error" and "would change 14 memories" in too_many["error"]
    assert (deleted["type"], merged["type"], last["type"]) == ("deleted", "consolidated", "updated")
    assert over["type"] == "error" and "1 are left" in over["error"] and "would change 2" in over["error"]
    assert after["type"] == "error" and "at most 10 changes" in after["error"]
    assert session.mutations == 10
    assert len(db.session.scalars(active_memories(agent.id)).all()) == 20 - 4 - 5 + 1


def test_the_refinement_prompt_says_the_cap_counts_memories(agent, fake_llm):
    factories.memory(agent, "A memory that is long enough to put the agent over its small budget " * 3)
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "nothing"})])

    refine_agent(agent.id, force=True)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert "change at most 10 memories in this session" in prompt
    assert "deleting or merging several memories counts each one" in prompt


def test_complete_writes_the_summary_journal_and_stamps_the_agent(agent):
    memory = factories.memory(agent, "x")
    session = _session(agent)
    session.run({"action": "update", "id": str(memory.id), "content": "Dana likes tea."})

    result = session.run({"action": "complete", "summary": "Merged tea facts."})

    assert result["type"] == "refinement_complete" and session.status == "complete"
    journal = db.session.scalar(sa.select(AgentMemory).where(AgentMemory.memory_type == "journal"))
    assert journal.content == "Refinement session: Merged tea facts."
    assert agent.last_refinement_at is not None
    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_complete"))
    assert closing.session_id == "s-1" and closing.data["summary"] == "Merged tea facts."


def test_a_session_that_changed_nothing_adds_no_journal_memory(agent):
    factories.memory(agent, "Dana likes tea.")
    session = _session(agent)
    session.run({"action": "page", "page": "1"})

    result = session.run({"action": "complete", "summary": "Nothing to change."})

    assert result["type"] == "refinement_complete" and session.status == "complete"
    journals = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.memory_type == "journal")).all()
    assert journals == []
    assert agent.last_refinement_at is not None
    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_complete"))
    assert closing.data["summary"] == "Nothing to change."
    assert "memory_create" not in _actions("s-1")


# The circuit breaker and rollback


def test_the_circuit_breaker_rolls_a_destructive_session_back_exactly(agent):
    memories = [
        factories.memory(agent, f"Important memory number {i} about the garden and roses") for i in range(4)
    ]
    protected = factories.memory(agent, "tiny")
    session = _session(agent, floor=0.5)
    original = _state(agent)

    assert session.run({"action": "protect", "id": str(memories[0].id)})["type"] == "protected"
    assert (
        session.run({"action": "update", "id": str(memories[1].id), "content": "short"})["type"] == "updated"
    )
    result = session.run({"action": "delete", "ids": f"{memories[2].id},{memories[3].id}"})

    assert result["type"] == "error" and "rolled back" in result["error"]
    assert session.status == "rolled_back"
    assert _state(agent) == original  # content, type, flags and deletion exactly as before
    assert (
        "The session is over"
        in session.run({"action": "update", "id": str(protected.id), "content": "y"})["error"]
    )
    rolled = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_rolled_back"))
    assert rolled.data["tokens_before"] == session.start_tokens


def test_rollback_of_a_session_undoes_creations_and_merges(agent):
    a = factories.memory(agent, "Dana likes tea")
    b = factories.memory(agent, "Dana likes green tea")
    original = _state(agent)
    session = _session(agent, floor=0)
    session.run({"action": "consolidate", "ids": f"{a.id},{b.id}", "content": "Dana likes green tea."})

    assert rollback_session("s-1", user_id=None, via="test") == 3

    restored = _state(agent)
    assert restored[:2] == original
    merged = restored[2]
    assert merged[1] == "Dana likes green tea." and merged[4] is not None  # the merged memory is gone again


def test_undo_a_single_change_and_refuse_a_stale_undo(agent):
    memory = factories.memory(agent, "first")
    session = _session(agent, floor=0)
    session.run({"action": "update", "id": str(memory.id), "content": "second"})
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_update"))
    session.run({"action": "update", "id": str(memory.id), "content": "third"})

    with pytest.raises(UndoConflict):
        undo(row, user_id=None, via="test")
    later = db.session.scalars(
        sa.select(AuditLog).where(AuditLog.action == "memory_refinement_update").order_by(AuditLog.id)
    ).all()[-1]
    undo(later, user_id=None, via="test")
    undo(row, user_id=None, via="test")

    assert db.session.get(AgentMemory, memory.id).content == "first"


# Phase 3: the job


def _script(fake_llm, *calls, text="done"):
    for call in calls:
        fake_llm.reply(tool_calls=[call])
    fake_llm.reply(text)


def test_the_job_runs_a_session_with_the_agents_model_after_dedup(app, agent, fake_llm):
    a = factories.memory(agent, "Dana likes tea and biscuits in the afternoon")
    factories.memory(agent, "dana likes tea and biscuits in the afternoon")
    b = factories.memory(agent, "I like long walks by the sea", constitutional=True)
    _script(
        fake_llm,
        _call("update", id=str(a.id), content="Dana likes tea and biscuits."),
        _call("complete", summary="Tightened one memory."),
    )

    counts = refine_agent(agent.id)

    first = fake_llm.requests[0]
    prompt = first["messages"][0]["content"]
    assert first["model"] == "ada-model" and first["tools"][0]["function"]["name"] == "refine_memory"
    assert f"#{a.id} (" in prompt and f"#{b.id} (" in prompt and "[CONSTITUTIONAL]" in prompt
    assert prompt.count("Dana likes tea and biscuits in the afternoon") + prompt.count("dana likes tea") == 1
    assert "Token budget: 50 tokens" in prompt
    assert counts["status"] == "complete" and counts["deduplicated"] == 1 and counts["updated"] == 1
    session_id = counts["session_id"]
    assert _actions(session_id) == [
        "memory_dedup",
        "memory_refinement_start",
        "memory_refinement_update",
        "memory_create",
        "memory_refinement_complete",
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("refine_memory", '{"action": ', "Invalid arguments for refine_memory: arguments are not valid JSON"),
        ("refine_memory", {"query": "tea"}, "arguments: 'action' is a required property"),
        ("refine_memory", {"action": "explode"}, "action: 'explode' is not one of ['page', 'search'"),
        ("refine_memory", {"action": "search", "query": ["tea"]}, "query: ['tea'] is not of type 'string'"),
        (
            "save_memory",
            {"content": "x", "memory_type": "core"},
            "no tool named 'save_memory'. Available: refine",
        ),
    ],
)
def test_the_job_checks_each_call_as_every_tool_is_checked(app, agent, fake_llm, name, arguments, error):
    memory = factories.memory(agent, "something")
    _script(fake_llm, (name, arguments), _call("complete", summary="ok"))

    counts = refine_agent(agent.id, force=True)

    result = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert error in result["error"]
    assert counts["status"] == "complete" and _actions(counts["session_id"])[-2:] == [
        "memory_refinement_start",
        "memory_refinement_complete",
    ]  # the model read the error and went on; nothing changed, so no journal memory either
    assert db.session.get(AgentMemory, memory.id).content == "something"


def test_memory_and_page_numbers_may_be_numbers(app, agent, fake_llm):
    memory = factories.memory(agent, "a fairly long memory about the garden and the roses in it")
    _script(
        fake_llm,
        _call("page", page=1),
        _call("update", id=memory.id, content="garden and roses in it"),
        _call("complete", summary="ok"),
    )

    counts = refine_agent(agent.id, force=True)

    page = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert page["type"] == "page" and page["results"][0]["id"] == memory.id
    assert (
        counts["updated"] == 1 and db.session.get(AgentMemory, memory.id).content == "garden and roses in it"
    )


def test_a_session_with_no_complete_call_closes_as_incomplete(app, agent, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0.1
    memory = factories.memory(agent, "a fairly long memory about the garden and the roses in it")
    _script(fake_llm, _call("update", id=str(memory.id), content="garden roses"), text="I think I'm done.")

    counts = refine_agent(agent.id)

    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_incomplete"))
    assert counts["status"] == "incomplete"
    assert closing.data["stats"]["updated"] == 1 and "without calling complete" in closing.data["reason"]
    assert closing.data["tokens_after"] < closing.data["tokens_before"]


def test_the_tool_loop_is_bounded(app, agent, fake_llm):
    app.config["REFINEMENT_MAX_TURNS"] = 3
    factories.memory(agent, "something")
    fake_llm.default_text = ""
    for _ in range(5):
        fake_llm.reply(tool_calls=[_call("search", query="something")])

    counts = refine_agent(agent.id)

    assert len(fake_llm.requests) == 3 and counts["status"] == "incomplete"


def test_a_model_error_closes_the_session_and_retries(app, agent, fake_llm):
    factories.memory(agent, "something")
    fake_llm.fail(503, "busy")

    from webapp.llm import LLMError

    with pytest.raises(LLMError):
        refine_agent(agent.id)

    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_incomplete"))
    assert "HTTP 503" in closing.data["reason"]


def test_skips_agents_without_core_memories_or_not_due(app, agent, fake_llm):
    assert refine_agent(agent.id)["skipped"] == "no core memories"
    factories.memory(agent, "small")
    agent.last_refinement_at = utcnow() - timedelta(days=1)
    db.session.commit()

    assert refine_agent(agent.id)["skipped"] == "within budget and refined this week"
    _script(fake_llm, _call("complete", summary="nothing to do"))
    assert refine_agent(agent.id, force=True)["status"] == "complete"  # on demand runs anyway


def test_due_agents_are_found_in_one_query(admin, fake_llm):
    never = factories.agent(admin.account, "Never")
    recent = factories.agent(admin.account, "Recent", last_refinement_at=utcnow() - timedelta(days=1))
    over = factories.agent(admin.account, "Over", last_refinement_at=utcnow(), core_token_budget=1)
    factories.memory(over, "well over a one-token budget")
    factories.agent(admin.account, "Paused", paused=True)
    from tests.querycount import count_queries

    with count_queries() as counted:
        due = db.session.scalars(agents_due_query(utcnow())).all()

    assert due == [never.id, over.id] and counted.count == 1 and recent.id not in due
    assert refine_due() == {"agents": 2}


def test_going_over_budget_triggers_one_refinement_a_day(app, agent):
    factories.memory(agent, "word " * 60)

    assert trigger_if_over_budget(agent) is True
    assert trigger_if_over_budget(agent) is False
    db.session.commit()
    assert [
        j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs() if "embeddings" not in j.func_name
    ] == ["refine_agent"]
    db.session.execute(sa.update(JobRun).values(status="done"))  # that session ran
    db.session.commit()
    assert trigger_if_over_budget(agent) is False  # once a day


def test_a_rolled_back_trigger_does_not_block_refinement_for_a_day(app, agent, fake_redis):
    factories.memory(agent, "word " * 60)

    assert trigger_if_over_budget(agent) is True
    db.session.rollback()  # the transaction that triggered it failed: nothing was queued
    assert fake_redis.keys("cairn:once:*") == []

    assert trigger_if_over_budget(agent) is True
    db.session.commit()
    assert fake_redis.keys("cairn:once:*") == [f"cairn:once:refine:agent:{agent.id}".encode()]
    assert len([j for j in rq_queue().get_jobs() if "embeddings" not in j.func_name]) == 1


def test_save_memory_over_budget_enqueues_a_refinement(app, admin, agent, fake_llm):
    from webapp.jobs.replies import request_replies, respond

    chat = factories.chat(admin.account, [agent])
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    fake_llm.reply(tool_calls=[("save_memory", {"content": "word " * 60, "memory_type": "core"})])
    fake_llm.reply("Saved.")

    respond([reply.id])

    assert "refine_agent" in [j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs()]
    assert db.session.scalar(sa.select(JobRun.status).where(JobRun.job_type == "reply")) == "done"


def test_weekly_schedule_is_monday_0400():
    from webapp.jobs import schedule

    assert {s.func: s.cron for s in schedule.SCHEDULES}["webapp.jobs.refinement.refine_due"] == "0 4 * * 1"


def test_refinement_output_json_is_a_tool_result(app, agent, fake_llm):
    memory = factories.memory(agent, "something")
    _script(fake_llm, _call("search", query="some"), _call("complete", summary="ok"))

    refine_agent(agent.id, force=True)

    tool_message = fake_llm.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"])["results"][0]["id"] == memory.id


def test_a_session_that_changed_memory_is_not_retried_with_fresh_limits(app, agent, fake_llm):
    from webapp.llm import LLMError

    memory = factories.memory(agent, "a fairly long memory about the garden and the roses in it")
    fake_llm.reply(tool_calls=[_call("update", id=str(memory.id), content="garden and roses in it")])
    fake_llm.fail(503, "busy")

    with pytest.raises(LLMError) as raised:
        refine_agent(agent.id)

    assert raised.value.retryable is False and "already changed memory" in str(raised.value)


def test_one_session_per_agent_at_a_time(app, agent, fake_llm, fake_redis):
    factories.memory(agent, "something")
    fake_redis.set(f"cairn:lock:run:refine:agent:{agent.id}", "another session's run id")

    assert refine_agent(agent.id, force=True) == {"skipped": "another run of this target is running"}
    assert fake_llm.requests == []


def test_rolling_back_a_session_refuses_when_a_memory_changed_since(agent):
    memory = factories.memory(agent, "first draft")
    _session(agent, floor=0).run({"action": "update", "id": str(memory.id), "content": "second draft"})
    memory.constitutional = True  # an admin protected it after the session
    db.session.commit()

    with pytest.raises(UndoConflict):
        rollback_session("s-1", user_id=None, via="test")
    db.session.rollback()
    assert db.session.get(AgentMemory, memory.id).content == "second draft"
