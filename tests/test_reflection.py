"""Spec 001: each agent promotes the journal entries it chooses to core; most days, none."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
from rq import SimpleWorker

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.queue import enqueue, rq_queue
from webapp.jobs.reflection import agents_to_reflect_query, chosen_numbers, reflect_agent, reflect_all
from webapp.models import AgentMemory, AuditLog, JobRun
from webapp.timeutil import utcnow


@pytest.fixture
def agent(admin):
    return factories.agent(admin.account, "Ada")


@pytest.fixture
def journal(agent):
    return [
        factories.memory(agent, "User prefers concise answers", "journal"),
        factories.memory(agent, "Discussed project deadline of Jan 15", "journal"),
        factories.memory(agent, "I work best when I ask clarifying questions", "journal"),
    ]


def _types(memories) -> list[str]:
    db.session.expire_all()
    return [db.session.get(AgentMemory, m.id).memory_type for m in memories]


def _count(agent, memory_type=None) -> int:
    query = sa.select(sa.func.count()).select_from(AgentMemory).where(AgentMemory.agent_id == agent.id)
    if memory_type:
        query = query.where(AgentMemory.memory_type == memory_type)
    return db.session.scalar(query)


def test_skips_agents_without_recent_journal_entries(agent, fake_llm):
    factories.memory(agent, "core only", "core")

    assert reflect_all() == {"agents": 0}
    assert reflect_agent(agent.id) == {"entries": 0, "promoted": 0}
    assert fake_llm.requests == []


def test_skips_agents_with_only_expired_or_deleted_journal_entries(agent, fake_llm):
    factories.memory(agent, "old", "journal", created_at=utcnow() - timedelta(days=14))
    factories.memory(agent, "deleted", "journal", deleted_at=utcnow())

    assert reflect_all() == {"agents": 0}
    assert reflect_agent(agent.id)["entries"] == 0
    assert _count(agent, "core") == 0


def test_promotes_selected_entries_to_core_without_adding_memories(agent, journal, fake_llm):
    fake_llm.reply(json.dumps({"promote": [1, 3]}))

    counts = reflect_agent(agent.id)

    assert _types(journal) == ["core", "journal", "core"]
    assert _count(agent) == 3 and _count(agent, "core") == 2
    assert counts == {"entries": 3, "promoted": 2, "ignored": 0}
    audits = db.session.scalars(sa.select(AuditLog).order_by(AuditLog.id)).all()
    assert [(a.action, a.auditable_id, a.agent_id, a.user_id) for a in audits] == [
        ("memory_promote", journal[0].id, agent.id, None),
        ("memory_promote", journal[2].id, agent.id, None),
    ]
    assert (
        audits[0].data["before"]["memory_type"] == "journal"
        and audits[0].data["after"]["memory_type"] == "core"
    )


def test_an_empty_promotion_list_is_normal(agent, journal, fake_llm):
    fake_llm.reply('{"promote": []}')

    assert reflect_agent(agent.id) == {"entries": 3, "promoted": 0, "ignored": 0}
    assert _count(agent, "core") == 0 and _count(agent, "journal") == 3


def test_malformed_json_promotes_nothing(agent, journal, fake_llm):
    fake_llm.reply("This is not valid JSON")

    assert reflect_agent(agent.id) == {"entries": 3, "promoted": 0, "ignored": 0, "malformed": 1}
    assert _count(agent, "core") == 0


def test_invalid_indices_are_ignored(agent, journal, fake_llm):
    fake_llm.reply('Here you go: ```json\n{"promote": [1, 99, 0, -2, "abc", 1, true, "2"]}\n```')

    counts = reflect_agent(agent.id)

    assert _types(journal) == ["core", "core", "journal"]
    assert counts == {"entries": 3, "promoted": 2, "ignored": 6}


@pytest.mark.parametrize(
    ("value", "expected"), [(None, ([], 0)), ("1", ([], 1)), ([2, 2, 5], ([2], 2)), ([3, 1], ([3, 1], 0))]
)
def test_chosen_numbers(value, expected):
    assert chosen_numbers(value, 3) == expected


def test_the_prompt_holds_core_memories_and_numbered_journal_entries_and_uses_the_agents_model(
    agent, journal, fake_llm
):
    factories.memory(agent, "I am a helpful assistant", "core")
    fake_llm.reply('{"promote": []}')

    reflect_agent(agent.id)

    request = fake_llm.requests[-1]
    prompt = request["messages"][0]["content"]
    assert request["model"] == "ada-model"
    assert "Your core memories:\n- I am a helpful assistant\n" in prompt
    today = utcnow().strftime("%Y-%m-%d")  # written once, above the day's entries
    assert f"\n{today}\n1. User prefers concise answers\n2. Discussed" in prompt
    assert "\n3. I work best when I ask clarifying questions\n" in prompt


def test_core_memories_beyond_the_budget_are_left_out_and_the_prompt_says_so(app, agent, journal, fake_llm):
    app.config["MEMORY_TOKEN_BUDGET"] = 200
    core = [factories.memory(agent, f"Core belief {i} about patience with slow roses.") for i in range(30)]
    fake_llm.reply('{"promote": []}')

    reflect_agent(agent.id)

    prompt = fake_llm.requests[-1]["messages"][0]["content"]
    listed = prompt.split("Your core memories:")[1].split("Journal entries")[0]
    shown = [m for m in core if f"{m.content}\n" in listed]
    assert shown == core[: len(shown)] and 0 < len(shown) < 30  # the oldest, as in a reply's prompt
    assert f"({30 - len(shown)} more are not listed.)" in listed


def test_one_agents_failure_does_not_stop_the_others(app, admin, agent, journal, fake_llm):
    other = factories.agent(admin.account, "Basil")
    factories.memory(other, "Some observation", "journal")
    fake_llm.fail(400, "bad request", model="ada-model")
    fake_llm.reply('{"promote": [1]}', model="basil-model")

    reflect_all()
    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)

    runs = {
        r.target: r.status for r in db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "reflect"))
    }
    assert runs == {f"agent:{agent.id}": "failed", f"agent:{other.id}": "done"}
    assert _count(other, "core") == 1 and _count(agent, "core") == 0


def test_paused_agents_do_not_reflect(agent, journal, fake_llm):
    agent.paused = True
    db.session.commit()

    assert reflect_all() == {"agents": 0}
    assert reflect_agent(agent.id) == {"skipped": 1}


def test_finding_agents_is_one_query(admin, fake_llm):
    for i in range(5):
        factories.memory(factories.agent(admin.account, f"A{i}"), "note", "journal")

    with count_queries() as counted:
        found = db.session.scalars(agents_to_reflect_query(utcnow())).all()

    assert len(found) == 5 and counted.count == 1


def test_an_html_body_is_a_retryable_model_error_not_a_crash(agent, journal, fake_llm):
    from webapp.llm import LLMError
    from webapp.models import LlmCall

    fake_llm.html("application/json")

    with pytest.raises(LLMError) as raised:
        reflect_agent(agent.id)

    assert raised.value.retryable and _count(agent, "core") == 0
    assert db.session.scalar(sa.select(LlmCall.status)) == "error"
    assert "not a completion" in db.session.scalar(
        sa.select(JobRun.error).where(JobRun.job_type == "reflect")
    )


def test_one_reflection_per_agent_at_a_time(agent):
    assert enqueue(reflect_agent, agent.id) is not None
    assert enqueue(reflect_agent, agent.id) is None


def test_no_second_reflection_is_queued_while_one_is_running(app, agent, journal, fake_llm, monkeypatch):
    from webapp import llm

    enqueue(reflect_agent, agent.id)
    db.session.commit()
    fake_llm.reply(json.dumps({"promote": [1]}))
    complete, agent_id, meanwhile = llm.complete, agent.id, []

    def asked_again_while_it_thinks(*args, **kwargs):
        if meanwhile:
            return complete(*args, **kwargs)
        with app.app_context():  # the daily finder and a second request, each in its own session
            meanwhile.append(db.session.scalar(sa.select(JobRun.status).where(JobRun.job_type == "reflect")))
            meanwhile.append(reflect_all())
            meanwhile.append(enqueue(reflect_agent, agent_id))
            db.session.commit()
        return complete(*args, **kwargs)

    monkeypatch.setattr(llm, "complete", asked_again_while_it_thinks)
    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)

    assert meanwhile == ["running", {"agents": 1}, None]  # the agent was due, but its reflection was running
    runs = db.session.scalars(sa.select(JobRun.status).where(JobRun.job_type == "reflect")).all()
    assert runs == ["done"] and rq_queue().count == 0
    assert _types(journal)[0] == "core"  # the one reflection did its work
