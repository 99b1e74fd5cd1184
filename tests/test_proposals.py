"""Issue 23: background rewrites staged for review, proposals decided in one form (or the CLI), the drift alarm."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.refinement import agents_due_query, refine_agent, refine_due, trigger_if_over_budget
from webapp.jobs.reflection import reflect_agent
from webapp.models import AgentMemory, AuditLog, MemoryProposal, ProposedChange
from webapp.models.audit import undo
from webapp.models.drift import core_history, drift_of
from webapp.models.memory_changes import session_limits
from webapp.models.proposals import ProposalRefused
from webapp.timeutil import utcnow

LONG = "about the garden, the old roses along the north wall and the greenhouse where the cat sleeps"


@pytest.fixture
def ada(app, admin):
    app.config["REFINEMENT_TOKEN_FLOOR"] = (
        0  # these sessions cut much of few memories; floor tests set theirs
    )
    return factories.agent(admin.account, "Ada", core_token_budget=50, background_changes="staged")


def _call(action, **arguments):
    return ("refine_memory", {"action": action, **arguments})


def _script(fake_llm, *calls, text="done"):
    for call in calls:
        fake_llm.reply(tool_calls=[call])
    fake_llm.reply(text)


def _state(agent) -> list[tuple]:
    """Every memory of the agent exactly: id, content, type, flags, deletion."""
    db.session.expire_all()
    rows = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id)
    )
    return [(m.id, m.content, m.memory_type, m.constitutional, m.deleted_at) for m in rows]


def _tool_results(fake_llm) -> list[dict]:
    return [
        json.loads(request["messages"][-1]["content"])
        for request in fake_llm.requests
        if request["messages"][-1]["role"] == "tool"
    ]


def _proposal() -> MemoryProposal:
    db.session.expire_all()
    return db.session.scalar(sa.select(MemoryProposal).order_by(MemoryProposal.id.desc()))


def _memories(agent, *texts):
    return [factories.memory(agent, f"Memory {text} {LONG}") for text in texts]


def _propose(agent, fake_llm, *calls):
    """Run a forced session of `calls` (then complete) and return its proposal."""
    _script(fake_llm, *calls, _call("complete", summary="Tidied up."))
    counts = refine_agent(agent.id, force=True)
    assert counts["status"] == "complete", counts
    return _proposal()


def _decide(client, proposal, *apply, decision="apply"):
    return client.post(
        f"/admin/proposals/{proposal.id}", data={"apply": [str(i) for i in apply], "decision": decision}
    )


def test_a_staged_session_that_merges_and_deletes_changes_nothing_until_approved(
    client, signed_in, ada, fake_llm
):
    a, b, c, d = _memories(ada, "a", "b", "c", "d")
    before = _state(ada)

    proposal = _propose(
        ada,
        fake_llm,
        _call("consolidate", ids=f"{a.id},{b.id}", content="Dana's garden: old roses and a greenhouse."),
        _call("delete", id=str(c.id)),
    )

    assert _state(ada) == before  # nothing applied, no journal note either
    assert [r["type"] for r in _tool_results(fake_llm)[:2]] == ["proposed", "proposed"]
    assert proposal.status == "pending" and [ch.kind for ch in proposal.changes] == ["merge", "delete"]
    assert proposal.changes[0].memory_ids == [a.id, b.id] and proposal.changes[1].memory_ids == [c.id]
    assert proposal.staged_because == "setting" and proposal.tokens_after < proposal.tokens_before
    assert proposal.expires_at - proposal.created_at == timedelta(days=14)
    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_complete"))
    assert closing.data["proposal_id"] == proposal.id and closing.data["proposed"] == 2

    response = _decide(client, proposal, *[ch.id for ch in proposal.changes])

    assert response.status_code == 303
    after = {m[0]: m for m in _state(ada)}
    assert all(after[m.id][4] is not None for m in (a, b, c)) and after[d.id][4] is None
    merged = db.session.scalar(
        sa.select(AgentMemory).where(AgentMemory.content == "Dana's garden: old roses and a greenhouse.")
    )
    assert merged.deleted_at is None and merged.created_at == a.created_at
    assert _proposal().status == "decided" and {ch.status for ch in _proposal().changes} == {"applied"}


def test_approving_applies_exactly_the_chosen_changes_and_rejects_the_rest(client, signed_in, ada, fake_llm):
    a, b, c, d = _memories(ada, "a", "b", "c", "d")
    proposal = _propose(
        ada,
        fake_llm,
        _call("update", id=str(a.id), content="Memory a, shorter."),
        _call("delete", id=str(b.id)),
        _call("consolidate", ids=f"{c.id},{d.id}", content="Memories c and d in one."),
    )
    rewrite, delete, merge = proposal.changes
    before = {m[0]: m for m in _state(ada)}

    _decide(client, proposal, rewrite.id, merge.id)

    after = {m[0]: m for m in _state(ada)}
    assert after[a.id][1] == "Memory a, shorter."
    assert after[b.id] == before[b.id]  # the rejected delete changed nothing
    assert after[c.id][4] and after[d.id][4]
    assert [ch.status for ch in _proposal().changes] == ["applied", "rejected", "applied"]
    decided = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_proposal_decided"))
    assert (decided.data["applied"], decided.data["rejected"], decided.data["stale"]) == (2, 1, 0)


def test_rejecting_all_applies_nothing(client, signed_in, ada, fake_llm):
    a, b = _memories(ada, "a", "b")
    proposal = _propose(ada, fake_llm, _call("delete", ids=f"{a.id},{b.id}"))
    before = _state(ada)

    _decide(client, proposal, proposal.changes[0].id, decision="reject")

    assert _state(ada) == before and _proposal().changes[0].status == "rejected"


def test_a_change_whose_memory_was_edited_deleted_or_restored_since_is_stale(
    client, signed_in, ada, fake_llm
):
    a, b, c, d = _memories(ada, "a", "b", "c", "d")
    proposal = _propose(
        ada,
        fake_llm,
        _call("update", id=str(a.id), content="Memory a, shorter."),
        _call("delete", id=str(b.id)),
        _call("delete", id=str(c.id)),
        _call("update", id=str(d.id), content="Memory d, shorter."),
    )
    edit = {f"memory-{a.id}-content": "Edited by Dana.", f"memory-{a.id}-memory_type": "core"}
    client.post(f"/admin/memories/{a.id}", data=edit)
    client.post(f"/admin/memories/{b.id}/delete")
    client.post(f"/admin/memories/{c.id}/delete")
    client.post(f"/admin/memories/{c.id}/restore")  # as it was, but it moved on in between

    page = client.get(f"/admin/proposals/{proposal.id}").text
    assert f"Will not be applied: Memory #{a.id} was edited since" in page

    _decide(client, proposal, *[ch.id for ch in proposal.changes])

    changes = _proposal().changes
    assert [ch.status for ch in changes] == ["stale", "stale", "stale", "applied"]
    assert changes[0].stale_reason == f"Memory #{a.id} was edited since this change was proposed."
    assert changes[1].stale_reason == f"Memory #{b.id} was deleted since this change was proposed."
    assert changes[2].stale_reason == f"Memory #{c.id} was restored since this change was proposed."
    state = {m[0]: m for m in _state(ada)}
    assert (
        state[a.id][1] == "Edited by Dana."
        and state[c.id][4] is None
        and state[d.id][1] == "Memory d, shorter."
    )


def test_a_rejected_change_is_listed_in_the_next_prompt_and_refused_unchanged(
    client, signed_in, ada, fake_llm
):
    a, b = _memories(ada, "a", "b")
    proposal = _propose(ada, fake_llm, _call("update", id=str(a.id), content="Memory a, far too short."))
    _decide(client, proposal, decision="reject")
    fake_llm.reset()

    _script(
        fake_llm,
        _call("update", id=str(a.id), content="memory a, far too short"),  # the same text, in other case
        _call("update", id=str(a.id), content="Memory a: roses and the greenhouse."),
        _call("complete", summary="Second try."),
    )
    refine_agent(ada.id, force=True)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert "## Changes refused before" in prompt
    assert f'- rewrite #{a.id} into "Memory a, far too short."' in prompt
    assert "rejected by a person on" in prompt and "Do not propose them again unchanged." in prompt
    again, other = _tool_results(fake_llm)[:2]
    assert again["type"] == "error" and "refused by a person" in again["error"]
    assert other["type"] == "proposed"
    assert [ch.content for ch in _proposal().changes] == ["Memory a: roses and the greenhouse."]


def test_a_stale_change_is_listed_as_refused_too(client, signed_in, ada, fake_llm):
    (a,) = _memories(ada, "a")
    proposal = _propose(ada, fake_llm, _call("update", id=str(a.id), content="Memory a, short."))
    a.content = "Memory a, as Dana wrote it."
    db.session.commit()
    _decide(client, proposal, proposal.changes[0].id)
    fake_llm.reset()

    _script(fake_llm, _call("complete", summary="Nothing."))
    refine_agent(ada.id, force=True)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert f"Memory #{a.id} was changed since this change was proposed." in prompt  # by no audited path


def test_approval_is_all_or_nothing_when_it_fails_midway(client, signed_in, ada, fake_llm, monkeypatch):
    a, b, c = _memories(ada, "a", "b", "c")
    proposal = _propose(
        ada,
        fake_llm,
        _call("delete", id=str(a.id)),
        _call("update", id=str(b.id), content="Memory b, short."),
        _call("delete", id=str(c.id)),
    )
    before = _state(ada)
    real_apply, applied = ProposedChange.apply, []

    def apply_then_die(change, *args, **kwargs):
        if applied:
            raise RuntimeError("the worker died mid-apply")
        applied.append(change.id)
        return real_apply(change, *args, **kwargs)

    monkeypatch.setattr(ProposedChange, "apply", apply_then_die)

    with pytest.raises(RuntimeError):
        _decide(client, proposal, *[ch.id for ch in proposal.changes])
    db.session.rollback()  # what the request's (or the dead process's) transaction comes to

    assert applied  # the first change was applied in the transaction, then it failed
    assert _state(ada) == before
    assert _proposal().status == "pending" and {ch.status for ch in _proposal().changes} == {"pending"}
    assert db.session.scalar(sa.select(AuditLog).where(AuditLog.user_id.is_not(None))) is None


def test_audit_rows_name_the_approving_person_and_undo_like_any_other(
    client, signed_in, admin, ada, fake_llm
):
    a, b = _memories(ada, "a", "b")
    proposal = _propose(ada, fake_llm, _call("consolidate", ids=f"{a.id},{b.id}", content="a and b as one."))

    _decide(client, proposal, proposal.changes[0].id)

    rows = db.session.scalars(
        sa.select(AuditLog)
        .where(AuditLog.session_id == proposal.session_id, AuditLog.auditable_type == "AgentMemory")
        .order_by(AuditLog.id)
    ).all()
    assert [r.action for r in rows] == [
        "memory_refinement_consolidate_create",
        "memory_refinement_consolidate",
        "memory_refinement_consolidate",
    ]
    assert {r.user_id for r in rows} == {admin.id} and {r.data["proposal_id"] for r in rows} == {proposal.id}
    audit = client.get(f"/admin/audit?session={proposal.session_id}").text
    assert "dana@example.com" in audit and "merged away by refinement" in audit

    undo(rows[1], user_id=admin.id, via="test")
    db.session.commit()
    assert db.session.get(AgentMemory, a.id).deleted_at is None
    rollback = client.post(f"/admin/sessions/{proposal.session_id}/rollback", follow_redirects=True)
    assert f"Memory #{a.id} has changed since this session" in rollback.text  # the undo came after it


def test_the_floor_and_the_cap_hold_for_what_is_applied(app, client, signed_in, ada, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0.6
    a, b, c = _memories(ada, "a", "b", "c")
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))  # a third: above the floor
    change = proposal.changes[0]
    client.post(f"/admin/memories/{c.id}/delete")  # since then, core memory shrank by another third
    before = _state(ada)

    response = _decide(client, proposal, change.id)

    assert response.status_code == 422 and "below 60%" in response.text and "Tick fewer" in response.text
    assert _state(ada) == before and _proposal().status == "pending"
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0.5
    app.config["REFINEMENT_MAX_MUTATIONS"] = 0
    response = _decide(client, proposal, change.id)
    assert response.status_code == 422 and "at most 0" in response.text
    assert _decide(client, proposal).status_code == 303  # nothing ticked: all rejected, nothing to limit
    assert _state(ada) == before


def test_a_staged_session_below_the_floor_leaves_no_proposal(app, ada, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0.5
    a, b, c = _memories(ada, "a", "b", "c")
    before = _state(ada)
    _script(fake_llm, _call("delete", ids=f"{a.id},{b.id}"), _call("complete", summary="x"))

    counts = refine_agent(ada.id, force=True)

    assert counts["status"] == "rolled_back" and len(fake_llm.requests) == 1  # told to stop; it stopped
    assert _proposal() is None and _state(ada) == before


def test_a_session_that_proposes_nothing_leaves_no_proposal(ada, fake_llm):
    _memories(ada, "a")
    _script(fake_llm, _call("page", page=1), _call("complete", summary="All good."))

    assert refine_agent(ada.id, force=True)["status"] == "complete"
    assert _proposal() is None


def test_no_session_starts_while_a_proposal_waits_and_it_expires(app, ada, fake_llm):
    (a,) = _memories(ada, "a")
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))
    ada.last_refinement_at = utcnow() - timedelta(days=30)
    db.session.commit()
    fake_llm.reset()

    assert refine_agent(ada.id, force=True) == {"skipped": "a proposal of its last session awaits review"}
    assert ada.id not in db.session.scalars(agents_due_query(utcnow())).all()
    assert trigger_if_over_budget(ada) is False
    assert fake_llm.requests == []

    proposal.expires_at = utcnow() - timedelta(minutes=1)
    db.session.commit()
    assert ada.id in db.session.scalars(agents_due_query(utcnow())).all()  # lazily: no longer pending
    assert refine_due() == {"agents": 1}
    assert _proposal().status == "expired"  # kept, for the audit
    expired = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_proposal_expired"))
    assert expired.data["proposal_id"] == proposal.id
    assert db.session.get(AgentMemory, a.id).deleted_at is None


def test_an_expired_proposal_cannot_be_decided(client, signed_in, ada, fake_llm):
    (a,) = _memories(ada, "a")
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))
    proposal.expires_at = utcnow() - timedelta(minutes=1)
    db.session.commit()

    response = _decide(client, proposal, proposal.changes[0].id)

    assert response.status_code == 422 and "This proposal is expired" in response.text
    assert db.session.get(AgentMemory, a.id).deleted_at is None


def test_additions_still_apply_at_once(admin, ada, fake_llm):
    entry = factories.memory(ada, "Dana's sister visits in May.", "journal")
    fake_llm.reply(json.dumps({"promote": [1]}))

    assert reflect_agent(ada.id)["promoted"] == 1

    assert db.session.get(AgentMemory, entry.id).memory_type == "core"
    from webapp.tools.save_memory import remember  # noqa: PLC0415  (what a reply's save_memory call does)

    chat = factories.chat(admin.account, [ada])
    remember(ada, chat, "Dana takes her tea with lemon.", "core", via="tool")
    assert db.session.scalar(sa.select(AgentMemory).where(AgentMemory.content.like("%lemon%"))).is_active
    assert _proposal() is None


def test_exact_copies_are_staged_too(ada, fake_llm):
    first = factories.memory(ada, f"Dana likes tea {LONG}")
    copy = factories.memory(ada, f"dana likes TEA {LONG}")
    before = _state(ada)
    _script(fake_llm, _call("complete", summary="Nothing else."))

    counts = refine_agent(ada.id, force=True)

    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert f"#{first.id} (" in prompt and f"#{copy.id} (" not in prompt  # the model never sees the copy
    assert counts["deduplicated"] == 1 and _state(ada) == before
    [change] = _proposal().changes
    assert (change.kind, change.memory_ids, change.duplicate_of) == ("delete", [copy.id], first.id)
    assert change.mutations == 0  # outside the cap, as dedup always was


def test_the_drift_alarm_stages_changes_of_an_agent_set_to_apply_automatically(app, admin, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    basil = factories.agent(admin.account, "Basil", background_changes="automatic")
    a, b, c, d, e = _memories(basil, "a", "b", "c", "d", "e")
    _script(
        fake_llm,
        _call("delete", id=str(a.id)),  # 20%: applied, under the 25% alarm
        _call("delete", id=str(b.id)),  # 40%: applied; the alarm is on from now
        _call("delete", id=str(c.id)),  # staged whatever the setting
        _call("complete", summary="Cut."),
    )

    counts = refine_agent(basil.id, force=True)

    assert [r["type"] for r in _tool_results(fake_llm)[:3]] == ["deleted", "deleted", "proposed"]
    state = {m[0]: m for m in _state(basil)}
    assert state[a.id][4] and state[b.id][4] and state[c.id][4] is None
    drift = drift_of(basil.id, utcnow(), 0.25)
    assert drift.alarm and round(drift.share, 1) == 0.4 and counts["proposed"] == 1
    proposal = _proposal()
    assert proposal.staged_because == "drift" and "removed 40% of core memory" in proposal.reason

    # The next session (once this proposal is decided) is staged from its start.
    proposal.decide(set(), user_id=None, via="test", now=utcnow(), **session_limits())
    db.session.commit()
    fake_llm.reset()
    _script(fake_llm, _call("delete", id=str(d.id)), _call("complete", summary="More."))
    refine_agent(basil.id, force=True)
    assert _tool_results(fake_llm)[0]["type"] == "proposed"
    assert db.session.get(AgentMemory, d.id).deleted_at is None
    assert "Your merges, rewrites and deletes are staged" in fake_llm.requests[0]["messages"][0]["content"]


def test_approved_and_undone_changes_do_not_count_toward_drift(app, admin, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    basil = factories.agent(admin.account, "Basil", background_changes="automatic")
    a, b, c = _memories(basil, "a", "b", "c")
    _script(fake_llm, _call("delete", ids=f"{a.id},{b.id}"), _call("complete", summary="Cut."))
    counts = refine_agent(basil.id, force=True)
    assert drift_of(basil.id, utcnow(), 0.25).alarm

    row = db.session.scalar(
        sa.select(AuditLog).where(
            AuditLog.session_id == counts["session_id"],
            AuditLog.auditable_type == "AgentMemory",
            AuditLog.auditable_id == a.id,
        )
    )
    undo(row, user_id=admin.id, via="test")
    db.session.commit()

    assert round(drift_of(basil.id, utcnow(), 0.25).share, 2) == 0.33  # b: a third of a, b and c
    old = utcnow() - timedelta(days=31)
    db.session.execute(sa.update(AuditLog).values(created_at=old))
    db.session.commit()
    assert drift_of(basil.id, utcnow(), 0.25).removed == 0  # older than 30 days


def test_the_ledger_and_healthz_say_why_changes_are_staged(app, client, signed_in, admin, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    basil = factories.agent(admin.account, "Basil", background_changes="automatic")
    a, b, c = _memories(basil, "a", "b", "c")
    _script(fake_llm, _call("delete", ids=f"{a.id},{b.id}"), _call("complete", summary="Cut."))
    refine_agent(basil.id, force=True)

    ledger = client.get(f"/admin/agents/{basil.id}/memories").text
    health = client.get("/healthz").get_json()["checks"]["memory"]

    assert "Drift alarm." in ledger and "removed 67% of core memory" in ledger
    assert "staged for review: the drift alarm is on" in ledger
    assert health["ok"] is False and health["detail"].startswith("drift alarm: Basil: In the last 30 days")
    assert client.get("/healthz").status_code in (200, 503)  # decided by the services alone


def test_the_drift_chart_marks_the_changes_that_moved_core_memory(client, signed_in, ada, fake_llm):
    a, b, c = _memories(ada, "a", "b", "c")
    proposal = _propose(
        ada,
        fake_llm,
        _call("consolidate", ids=f"{a.id},{b.id}", content="a and b."),
        _call("delete", id=str(c.id)),
    )
    _decide(client, proposal, *[ch.id for ch in proposal.changes])

    history = core_history(ada.id, utcnow(), 90)
    page = client.get(f"/admin/agents/{ada.id}/memories").text

    assert (history.points[0].count, history.points[-1].count) == (3, 1)
    assert dict(history.kinds) == {"merged": 1, "deleted": 1}
    assert (
        '<svg class="drift-chart"' in page
        and 'class="mark merged"' in page
        and 'class="mark deleted"' in page
    )
    assert "Core memory from" in page and "now 1 memories" in page


def test_the_pending_count_links_to_the_review_page(client, signed_in, admin, ada, fake_llm, member, auth):
    (a,) = _memories(ada, "a")
    assert "to review" not in client.get("/chats/").text
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))

    page = client.get("/chats/").text
    ledger = client.get(f"/admin/agents/{ada.id}/memories").text
    review = client.get(f"/admin/proposals/{proposal.id}").text
    listing = client.get("/admin/proposals").text

    assert f'href="/admin/proposals/{proposal.id}" class="review-count"' in page
    assert '<span class="count">1</span><span class="words"> to review</span>' in page
    assert "awaits review" in ledger and f"/admin/proposals/{proposal.id}" in ledger
    assert f"Delete #{a.id}" in review and "<del>Memory a" in review and "Apply ticked changes" in review
    assert f"proposal-{proposal.id}" in listing
    client.post("/logout")
    auth.login(member)
    assert "to review" not in client.get("/chats/").text
    assert client.get(f"/admin/proposals/{proposal.id}").status_code in (302, 403, 404)


def test_another_accounts_proposal_is_a_404(app, client, signed_in, stranger, fake_llm):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0
    globex = factories.agent(stranger.account, "Eve", background_changes="staged", core_token_budget=10)
    (a,) = _memories(globex, "a")
    proposal = _propose(globex, fake_llm, _call("delete", id=str(a.id)))

    assert client.get(f"/admin/proposals/{proposal.id}").status_code == 404
    assert _decide(client, proposal, proposal.changes[0].id).status_code == 404
    assert "to review" not in client.get("/chats/").text
    assert db.session.get(AgentMemory, a.id).deleted_at is None


def test_the_cli_lists_and_decides_proposals(runner, admin, ada, fake_llm):
    a, b, c = _memories(ada, "a", "b", "c")
    proposal = _propose(
        ada,
        fake_llm,
        _call("delete", id=str(a.id)),
        _call("update", id=str(b.id), content="Memory b, short."),
    )
    delete, rewrite = proposal.changes

    listed = runner.invoke(args=["memories", "proposals", "--agent", "Ada"])

    assert listed.exit_code == 0, listed.output
    assert f"proposal {proposal.id} · Ada" in listed.output
    assert f"change {delete.id}: delete #{a.id}" in listed.output
    assert f"change {rewrite.id}: rewrite #{b.id} into 'Memory b, short.'" in listed.output

    decided = runner.invoke(
        args=[
            "memories",
            "proposals",
            "--approve",
            str(proposal.id),
            "--only",
            str(rewrite.id),
            "--by",
            admin.email,
        ]
    )

    assert decided.exit_code == 0, decided.output
    assert f"proposal {proposal.id}: Decided: 1 applied, 1 rejected." in decided.output
    assert db.session.get(AgentMemory, b.id).content == "Memory b, short."
    assert db.session.get(AgentMemory, a.id).deleted_at is None
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_update"))
    assert row.user_id == admin.id and row.data["via"] == "cli"
    again = runner.invoke(args=["memories", "proposals", "--reject", str(proposal.id)])
    assert again.exit_code == 1 and "can no longer be decided" in again.output
    assert "No proposal waits for review." in runner.invoke(args=["memories", "proposals"]).output


def test_the_cli_rejects_and_checks_its_options(client, signed_in, runner, ada, fake_llm):
    (a,) = _memories(ada, "a")
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))

    assert "--only goes with --approve" in runner.invoke(args=["memories", "proposals", "--only", "1"]).output
    unknown = runner.invoke(args=["memories", "proposals", "--approve", str(proposal.id), "--only", "999"])
    assert unknown.exit_code == 1 and "has no change 999" in unknown.output
    nobody = runner.invoke(args=["memories", "proposals", "--reject", str(proposal.id), "--by", "x@y.z"])
    assert nobody.exit_code == 1 and "no admin" in nobody.output

    rejected = runner.invoke(args=["memories", "proposals", "--reject", str(proposal.id)])

    assert rejected.exit_code == 0 and "1 rejected" in rejected.output
    assert db.session.get(AgentMemory, a.id).deleted_at is None
    decided = client.get("/admin/audit?action=memory_proposal_decided").text
    assert "the command line" in decided and f"Proposal #{proposal.id}: 1 rejected" in decided


def test_new_agents_stage_and_the_form_sets_it(client, signed_in, admin):
    form = client.get("/agents/new").text
    assert (
        '<input checked id="background_changes-0" name="background_changes" type="radio" value="staged">'
        in form
    )

    data = {
        "name": "Cleo",
        "model_id": "m",
        "core_token_budget": "5000",
        "members_see_memory": "prompt",
        "background_changes": "automatic",
        "enabled_tools": ["save_memory"],
    }
    assert client.post("/agents/new", data=data).status_code == 303

    from webapp.models import Agent

    assert db.session.scalar(sa.select(Agent.background_changes).where(Agent.name == "Cleo")) == "automatic"
    bare = Agent(account_id=admin.account_id, name="Dot", model_id="m")
    db.session.add(bare)
    db.session.commit()
    assert bare.background_changes == "staged"


def test_upgrading_keeps_existing_agents_applying_automatically(tmp_path):
    from tests.test_cli import _empty_database, flask

    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "c7e9a1b3d5f2", env=env).returncode == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO accounts (id, name, created_at) VALUES (1, 'Acme', '2026-01-01')"))
        conn.execute(
            sa.text(
                "INSERT INTO agents (id, account_id, name, slug, system_prompt, model_id, enabled_tools, "
                "core_token_budget, paused, consolidates_direct_chats, members_see_memory, created_at, updated_at) "
                "VALUES (1, 1, 'Ada', 'ada', '', 'm', '[]', 5000, false, true, 'prompt', '2026-01-01', '2026-01-01')"
            )
        )

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT background_changes FROM agents")).scalar() == "automatic"
    engine.dispose()


def test_decide_refuses_a_second_decision(ada, fake_llm):
    (a,) = _memories(ada, "a")
    proposal = _propose(ada, fake_llm, _call("delete", id=str(a.id)))
    proposal.decide(set(), user_id=None, via="test", now=utcnow(), **session_limits())
    db.session.commit()

    with pytest.raises(ProposalRefused, match="decided"):
        proposal.decide({proposal.changes[0].id}, user_id=None, via="test", now=utcnow(), **session_limits())
