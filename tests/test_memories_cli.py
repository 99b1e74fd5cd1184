"""`flask memories consolidate|reflect|backfill` and the recurring schedule for them."""

import json
from datetime import timedelta

import sqlalchemy as sa
import time_machine

from tests import factories
from webapp.extensions import db
from webapp.jobs import schedule
from webapp.jobs.queue import rq_queue
from webapp.models import AgentMemory, JobRun
from webapp.timeutil import utcnow


def _idle_group_chat(admin):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada, factories.agent(admin.account, "Basil")])
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "I grow roses.", author=admin)
    return chat, ada


def test_consolidate_enqueues_the_finder_or_one_chat(runner, admin):
    chat, _ = _idle_group_chat(admin)

    assert "finder: enqueued" in runner.invoke(args=["memories", "consolidate"]).output
    assert (
        f"chat {chat.id}: enqueued"
        in runner.invoke(args=["memories", "consolidate", "--chat", str(chat.id)]).output
    )
    assert [
        j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs() if "embeddings" not in j.func_name
    ] == [
        "consolidate_stale_chats",
        "consolidate_chat",
    ]


def test_consolidate_now_runs_inline(runner, admin, fake_llm):
    chat, ada = _idle_group_chat(admin)
    fake_llm.default_text = json.dumps({"journal": ["Dana grows roses"], "core": []})

    result = runner.invoke(args=["memories", "consolidate", "--now"])

    assert f"chat {chat.id}: {{'agents': 2" in result.output
    contents = db.session.scalars(sa.select(AgentMemory.content).where(AgentMemory.agent_id == ada.id)).all()
    assert contents == ["Dana grows roses"]


def test_consolidate_now_names_the_agent_whose_model_failed_and_exits_1(runner, admin, fake_llm):
    chat, ada = _idle_group_chat(admin)
    fake_llm.html(model="ada-model")  # a proxy's sign-in page instead of a completion
    fake_llm.reply(json.dumps({"journal": ["Dana grows roses"], "core": []}), model="basil-model")

    result = runner.invoke(args=["memories", "consolidate", "--now"])

    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert (
        f"chat {chat.id}: failed: 1 of 2 agents failed (Ada: The model's server answered with something that"
        " is not a completion: <!doctype html>"
    ) in result.output
    basil_memories = db.session.scalars(sa.select(AgentMemory.content).where(AgentMemory.agent_id != ada.id))
    assert list(basil_memories) == ["Dana grows roses"]
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "consolidate"))
    assert run.status == "failed" and run.counts["by_agent"]["Basil"]["journal"] == 1
    assert f"chat {chat.id}: counts of the failed run: {{'agents': 2, 'failed': 1" in result.output


def test_consolidate_now_goes_on_with_the_other_chats_after_a_failure(runner, admin, fake_llm):
    failing, _ = _idle_group_chat(admin)
    cleo = factories.agent(admin.account, "Cleo")
    working = factories.chat(admin.account, [cleo])  # one-to-one
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(working, "I grow tulips.", author=admin)
    fake_llm.fail(401, "bad key", model="ada-model")
    fake_llm.reply(json.dumps({"journal": ["Dana grows tulips"], "core": []}), model="cleo-model")

    result = runner.invoke(args=["memories", "consolidate", "--now"])

    assert result.exit_code == 1
    assert (
        f"chat {failing.id}: failed: 1 of 2 agents failed (Ada: The provider refused the API key"
        in result.output
    )
    assert f"chat {working.id}: {{'agents': 1" in result.output


def test_reflect_now_for_one_agent(runner, admin, fake_llm):
    ada = factories.agent(admin.account, "Ada")
    note = factories.memory(ada, "Dana grows roses", "journal")
    fake_llm.reply('{"promote": [1]}')

    result = runner.invoke(args=["memories", "reflect", "--agent", str(ada.id), "--now"])

    assert f"agent {ada.id}: {{'entries': 1, 'promoted': 1" in result.output
    db.session.refresh(note)
    assert note.memory_type == "core"


def test_backfill_fills_missing_hashes_and_token_counts(runner, admin):
    ada = factories.agent(admin.account, "Ada")
    for i in range(3):
        factories.memory(ada, f"memory {i}", "core")
    db.session.execute(sa.update(AgentMemory).values(content_hash=None, token_estimate=None))
    db.session.commit()

    result = runner.invoke(args=["memories", "backfill"])

    assert "Done: 3 memories updated." in result.output
    db.session.expire_all()
    assert all(m.content_hash and m.token_estimate for m in db.session.scalars(sa.select(AgentMemory)))


def test_schedule_holds_hourly_consolidation_and_daily_reflection():
    cadences = {s.func: s.cron for s in schedule.SCHEDULES}

    assert cadences["webapp.jobs.consolidation.consolidate_stale_chats"] == "0 * * * *"
    assert cadences["webapp.jobs.reflection.reflect_all"] == "0 3 * * *"


def test_refine_now_for_one_agent_and_dedup(runner, admin, fake_llm):
    ada = factories.agent(admin.account, "Ada")
    factories.memory(ada, "Likes tea")
    factories.memory(ada, "likes tea")
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "Nothing to merge."})])

    deduped = runner.invoke(args=["memories", "dedup", "--agent", str(ada.id)])
    refined = runner.invoke(args=["memories", "refine", "--agent", str(ada.id), "--now"])

    assert f"agent {ada.id}: 1 duplicates removed" in deduped.output
    assert "'status': 'complete'" in refined.output
    assert "refine_agent" not in [j.func_name for j in rq_queue().get_jobs()]
    assert "agent" in runner.invoke(args=["memories", "refine", "--agent", str(ada.id)]).output
