"""The audit log (who changed which memory, as a diff; undo), refinement sessions (list, page, roll back),
and who may reach the memory pages."""

import re
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.refinement import refine_agent
from webapp.models import AgentMemory, AuditLog
from webapp.models.audit import dedup_for_agent, record_change
from webapp.models.memories import core_token_usage
from webapp.timeutil import utcnow

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", core_token_budget=50)


def _rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="audit-(\d+)"', html)]


def _row_html(html: str, row_id: int) -> str:
    return re.search(rf'<tr id="audit-{row_id}".*?</tr>', html, re.S).group(0)


def _last(action: str) -> AuditLog:
    return db.session.scalar(
        sa.select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id.desc())
    )


def _edit(client, memory, content: str):
    prefix = f"memory-{memory.id}"
    response = client.post(
        f"/admin/memories/{memory.id}",
        data={f"{prefix}-content": content, f"{prefix}-memory_type": memory.memory_type},
        headers=HTMX,
    )
    assert response.status_code == 200
    return _last("memory_update")


def _session(ada, fake_llm, *calls) -> str:
    """Run a refinement session with the fake model making these refine_memory calls; its session id."""
    for call in calls:
        fake_llm.reply(tool_calls=[("refine_memory", call)])
    return refine_agent(ada.id, True)["session_id"]


# The audit log


def test_the_audit_log_is_a_full_page_and_a_fragment(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    row = _edit(client, memory, "Dana likes green tea")

    page = client.get("/admin/audit")
    fragment = client.get("/admin/audit?action=memory_update", headers={**HTMX, "HX-Target": "audit-log"})

    assert "<html" in page.text and '<form class="filters"' in page.text
    assert fragment.text.lstrip().startswith('<div id="audit-log">') and "<html" not in fragment.text
    assert _rows(page.text) == _rows(fragment.text) == [row.id]
    assert "HX-Request" in page.headers["Vary"] and "HX-Request" in fragment.headers["Vary"]


def test_who_changed_what_as_an_escaped_word_diff(client, signed_in, ada, fake_llm):
    memory = factories.memory(ada, "Dana likes <b>tea</b> in the garden")
    by_person = _edit(client, memory, "Dana likes <b>green tea</b> in the garden")
    note = factories.memory(ada, "Chat said hello", "journal")
    record_change(note, "memory_create", None, via="consolidation", chat_id=1)
    db.session.commit()
    session_id = _session(ada, fake_llm, {"action": "protect", "id": str(memory.id)})
    by_refinement = _last("memory_refinement_protect")

    html = client.get("/admin/audit").text

    person = _row_html(html, by_person.id)
    assert '<td class="who">dana@example.com</td>' in person
    assert "<del>&lt;b&gt;tea&lt;/b&gt;</del><ins>&lt;b&gt;green tea&lt;/b&gt;</ins>" in person.replace(
        " ", " "
    )
    assert "<b>" not in person
    consolidation = _row_html(
        html, db.session.scalars(sa.select(AuditLog.id).where(AuditLog.auditable_id == note.id)).first()
    )
    assert (
        '<td class="who">Ada (consolidation)</td>' in consolidation
        and "<ins>Chat said hello</ins>" in consolidation
    )
    protect = _row_html(html, by_refinement.id)
    assert (
        '<td class="who">Ada (refinement)</td>' in protect
        and "<li>Protected as constitutional</li>" in protect
    )
    assert f"/admin/sessions/{session_id}" in protect
    start = _row_html(html, _last("memory_refinement_start").id)
    assert "refinement started" in start and "Undo</button>" not in start


def test_flag_changes_read_as_what_happened(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea", "journal")
    actions = ("constitutional", "constitutional", "delete", "restore")
    for action in actions:
        assert client.post(f"/admin/memories/{memory.id}/{action}", headers=HTMX).status_code == 200
    promoted = AuditLog(action="memory_promote", account_id=ada.account_id, agent_id=ada.id)
    promoted.auditable_type, promoted.auditable_id = "AgentMemory", memory.id
    snapshot = memory.snapshot()
    promoted.data = {"before": snapshot, "after": {**snapshot, "memory_type": "core"}}
    db.session.add(promoted)
    db.session.commit()

    html = client.get("/admin/audit").text

    changes = [
        re.findall(r"<li>(.*?)</li>", _row_html(html, row.id))
        for row in db.session.scalars(sa.select(AuditLog).order_by(AuditLog.id))
    ]
    assert changes == [
        ["Protected as constitutional"],
        ["No longer constitutional"],
        ["Deleted"],
        ["Restored"],
        ["Moved from journal to core"],
    ]


def test_filters_by_agent_action_session_and_date(client, signed_in, ada, fake_llm):
    basil = factories.agent(ada.account, "Basil")
    tea = factories.memory(ada, "Dana likes tea")
    roses = factories.memory(basil, "Basil likes roses")
    ada_edit = _edit(client, tea, "Dana likes green tea")
    basil_edit = _edit(client, roses, "Basil likes red roses")
    session_id = _session(
        ada, fake_llm, {"action": "update", "id": str(tea.id), "content": "Dana likes tea."}
    )
    old = _edit(client, roses, "Basil likes roses")
    old.created_at = utcnow() - timedelta(days=10)
    db.session.commit()

    def shown(query: str) -> list[int]:
        return _rows(client.get(f"/admin/audit?{query}", headers={**HTMX, "HX-Target": "audit-log"}).text)

    session_rows = db.session.scalars(
        sa.select(AuditLog.id).where(AuditLog.session_id == session_id).order_by(AuditLog.id.desc())
    ).all()
    assert shown(f"agent={basil.id}") == [basil_edit.id, old.id]
    assert shown("action=memory_update") == [basil_edit.id, ada_edit.id, old.id]
    assert shown(f"session={session_id}") == session_rows
    day = (utcnow() - timedelta(days=10)).date().isoformat()
    assert shown(f"since={day}&until={day}") == [old.id]
    assert old.id not in shown(f"since={utcnow().date().isoformat()}")
    assert len(shown("action=nonsense&since=yesterday")) == len(shown(""))  # invalid filters are ignored


def test_pages_of_fifty(client, signed_in, ada):
    memory = factories.memory(ada, "x")
    factories.audit_rows(ada, [memory.id], 70)

    first = client.get("/admin/audit").text
    second = client.get("/admin/audit?page=2", headers={**HTMX, "HX-Target": "audit-log"}).text

    assert len(_rows(first)) == 50 and "Older →" in first
    assert len(_rows(second)) == 20 and "← Newer" in second and "Older →" not in second


def test_undo_a_change_in_place(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    row = _edit(client, memory, "Dana likes green tea")

    response = client.post(f"/admin/audit/{row.id}/undo", headers=HTMX)

    undo_row = _last("memory_undo")
    assert response.status_code == 200 and response.text.lstrip().startswith(f'<tr id="audit-{row.id}"')
    assert f"Undone (change #{undo_row.id})." in response.text and "Undo</button>" not in response.text
    assert db.session.get(AgentMemory, memory.id).content == "Dana likes tea"
    assert (
        undo_row.user_id == signed_in.id
        and undo_row.data["via"] == "admin"
        and undo_row.data["undo_of"] == row.id
    )
    assert f"undone by #{undo_row.id}" in _row_html(client.get("/admin/audit").text, row.id)


def test_undo_of_a_stale_change_shows_the_conflict(client, signed_in, ada):
    memory = factories.memory(ada, "first")
    first = _edit(client, memory, "second")
    _edit(client, memory, "third")

    response = client.post(f"/admin/audit/{first.id}/undo", headers=HTMX)

    assert response.status_code == 422
    assert "The memory has changed since; undo the later change first." in response.text
    assert db.session.get(AgentMemory, memory.id).content == "third" and _last("memory_undo") is None


def test_undo_of_a_delete_and_of_a_creation(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "new", "memory_type": "core"}, headers=HTMX
    )
    created = _last("memory_create")

    assert client.post(f"/admin/audit/{_last('memory_delete').id}/undo", headers=HTMX).status_code == 200
    assert client.post(f"/admin/audit/{created.id}/undo", headers=HTMX).status_code == 200

    assert db.session.get(AgentMemory, memory.id).deleted_at is None
    assert db.session.get(AgentMemory, created.auditable_id).deleted_at is not None


def test_a_session_row_cannot_be_undone(client, signed_in, ada, fake_llm):
    factories.memory(ada, "Dana likes tea")
    _session(ada, fake_llm)

    response = client.post(f"/admin/audit/{_last('memory_refinement_start').id}/undo", headers=HTMX)

    assert response.status_code == 422 and "This change cannot be undone." in response.text


# Refinement sessions


def test_sessions_list_dates_stats_status_and_tokens(client, signed_in, ada, fake_llm):
    memory = factories.memory(ada, "Dana likes tea and biscuits in the afternoon, every single day")
    session_id = _session(
        ada,
        fake_llm,
        {"action": "update", "id": str(memory.id), "content": "Dana likes tea and biscuits daily"},
        {"action": "complete", "summary": "Tightened the tea memory."},
    )
    closing = _last("memory_refinement_complete")

    page = client.get(f"/admin/agents/{ada.id}/sessions")
    fragment = client.get(f"/admin/agents/{ada.id}/sessions", headers={**HTMX, "HX-Target": "session-list"})

    row = re.search(rf'<tr id="session-{session_id}".*?</tr>', page.text, re.S).group(0)
    assert '<span class="status complete">complete</span>' in row
    assert "<td>updated 1</td>" in row
    assert f"{closing.data['tokens_before']} → {closing.data['tokens_after']}" in row
    assert "Tightened the tea memory." in row and f"/admin/sessions/{session_id}" in row
    assert fragment.text.lstrip().startswith('<div id="session-list">') and session_id in fragment.text


def test_a_session_page_lists_its_operations_and_rolls_back_once(client, signed_in, ada, fake_llm):
    tea = factories.memory(ada, "Dana likes tea and biscuits in the afternoon")
    walks = factories.memory(ada, "Dana walks the dog every morning by the river")
    session_id = _session(
        ada,
        fake_llm,
        {"action": "update", "id": str(tea.id), "content": "Dana likes tea"},
        {"action": "protect", "id": str(walks.id)},
        {"action": "complete", "summary": "Shorter."},
    )
    operations = db.session.scalars(sa.select(AuditLog.id).where(AuditLog.session_id == session_id)).all()

    page = client.get(f"/admin/sessions/{session_id}")
    assert "Roll back this session</button>" in page.text and sorted(_rows(page.text)) == sorted(operations)
    assert "Dana likes tea<del> and biscuits in the afternoon</del>" in page.text

    rolled = client.post(f"/admin/sessions/{session_id}/rollback", headers=HTMX)
    again = client.post(f"/admin/sessions/{session_id}/rollback", headers=HTMX)

    assert rolled.status_code == 200 and rolled.text.lstrip().startswith('<section id="session"')
    assert (
        "Rolled back: 3 changes undone." in rolled.text
        and 'rolled back</span> <span class="muted">by dana@example.com' in rolled.text
    )
    db.session.expire_all()
    assert db.session.get(AgentMemory, tea.id).content == "Dana likes tea and biscuits in the afternoon"
    assert db.session.get(AgentMemory, walks.id).constitutional is False
    rollbacks = db.session.scalars(sa.select(AuditLog).where(AuditLog.action == "memory_rollback")).all()
    assert len(rollbacks) == 3 and {r.user_id for r in rollbacks} == {signed_in.id}
    marker = _last("memory_refinement_rolled_back")
    assert marker.user_id == signed_in.id and marker.session_id == session_id and marker.data["restored"] == 3
    assert (marker.data["via"], marker.data["tokens_after"]) == ("admin", core_token_usage(ada.id))
    assert again.status_code == 422 and "already rolled back by dana@example.com" in again.text
    assert len(db.session.scalars(sa.select(AuditLog).where(AuditLog.action == "memory_rollback")).all()) == 3


def test_a_session_the_circuit_breaker_rolled_back_is_not_rolled_back_again(
    app, client, signed_in, ada, fake_llm
):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0.9
    big = factories.memory(ada, "A long and important memory about the garden, the roses and the river " * 3)
    factories.memory(ada, "small")
    session_id = _session(ada, fake_llm, {"action": "delete", "id": str(big.id)})

    page = client.get(f"/admin/sessions/{session_id}").text
    refused = client.post(f"/admin/sessions/{session_id}/rollback", headers=HTMX)

    assert 'rolled back</span> <span class="muted">by the circuit breaker' in page
    assert (
        "Roll back this session</button>" not in page and "already rolled back by the circuit breaker" in page
    )
    assert refused.status_code == 422 and "already rolled back" in refused.text
    marker = _last("memory_refinement_rolled_back")  # the same row as an admin's, with the breaker's figures
    assert marker.user_id is None and (marker.data["via"], marker.data["restored"]) == ("refinement", 1)
    assert marker.data["tokens_after"] == core_token_usage(ada.id) == marker.data["tokens_before"]
    assert "fell to" in marker.data["reason"] and marker.data["stats"]["deleted"] == 1


def test_a_session_that_only_deduplicated_can_be_rolled_back(client, signed_in, ada):
    kept = factories.memory(ada, "Dana likes tea")
    twin = factories.memory(ada, "dana likes tea")
    dedup_for_agent(ada.id, session_id="s-dedup", via="refinement")

    page = client.get("/admin/sessions/s-dedup").text
    rolled = client.post("/admin/sessions/s-dedup/rollback", headers=HTMX)

    assert '<span class="status dedup-only">dedup only</span>' in page and "removed as a duplicate" in page
    assert rolled.status_code == 200 and "Rolled back: 1 change undone." in rolled.text
    assert db.session.get(AgentMemory, twin.id).deleted_at is None and kept.deleted_at is None


def test_a_running_session_is_not_rolled_back(client, signed_in, ada):
    memory = factories.memory(ada, "tea")
    AuditLog.record(
        "memory_refinement_start",
        ada,
        account_id=ada.account_id,
        agent_id=ada.id,
        session_id="s-run",
        tokens_before=5,
        budget=50,
    )
    db.session.commit()

    response = client.post("/admin/sessions/s-run/rollback", headers=HTMX)

    assert response.status_code == 422 and "still running" in response.text
    assert memory.content == "tea"


# Who may see these pages


def _pages(agent, memory, row, session_id) -> list[tuple[str, str]]:
    return [
        ("get", f"/admin/agents/{agent.id}/memories"),
        ("post", f"/admin/agents/{agent.id}/memories"),
        ("get", f"/admin/memories/{memory.id}"),
        ("get", f"/admin/memories/{memory.id}/edit"),
        ("post", f"/admin/memories/{memory.id}"),
        ("post", f"/admin/memories/{memory.id}/constitutional"),
        ("post", f"/admin/memories/{memory.id}/delete"),
        ("post", f"/admin/memories/{memory.id}/restore"),
        ("post", f"/admin/agents/{agent.id}/run/refine"),
        ("get", f"/admin/agents/{agent.id}/run/refine?after=0"),
        ("post", f"/admin/audit/{row.id}/undo"),
        ("get", f"/admin/agents/{agent.id}/sessions"),
        ("get", f"/admin/sessions/{session_id}"),
        ("post", f"/admin/sessions/{session_id}/rollback"),
    ]


def _fixture_rows(agent, fake_llm):
    memory = factories.memory(agent, "A memory about the garden and the roses in it")
    record_change(memory, "memory_update", memory.snapshot(), via="test")
    db.session.commit()
    session_id = _session(agent, fake_llm, {"action": "complete", "summary": "ok"})
    return memory, _last("memory_update"), session_id


def test_a_member_gets_403_everywhere(client, auth, member, ada, fake_llm):
    memory, row, session_id = _fixture_rows(ada, fake_llm)
    auth.login(member)

    for method, url in [*_pages(ada, memory, row, session_id), ("get", "/admin/audit")]:
        assert getattr(client, method)(url).status_code == 403, url
    assert db.session.get(AgentMemory, memory.id).deleted_at is None


def test_another_accounts_rows_are_404_and_never_listed(client, signed_in, ada, stranger, fake_llm):
    mallory = factories.agent(stranger.account, "Mallory")
    memory, row, session_id = _fixture_rows(mallory, fake_llm)

    for method, url in _pages(mallory, memory, row, session_id):
        assert getattr(client, method)(url, headers=HTMX).status_code == 404, url
    assert _rows(client.get("/admin/audit").text) == []
    assert _rows(client.get(f"/admin/audit?session={session_id}&agent={mallory.id}").text) == []
    assert db.session.get(AgentMemory, memory.id).deleted_at is None


# Constant queries


def _queries(client, url: str) -> int:
    db.session.expire_all()
    with count_queries() as counted:
        assert client.get(url).status_code == 200
    return counted.count


def test_the_audit_and_session_pages_run_a_constant_number_of_queries(client, signed_in, ada, fake_llm):
    memories = factories.memories(ada, 10)
    factories.audit_rows(ada, [m.id for m in memories], 5)
    _session(ada, fake_llm, {"action": "complete", "summary": "one"})
    small = [_queries(client, url) for url in ("/admin/audit", f"/admin/agents/{ada.id}/sessions")]

    more = factories.memories(factories.agent(ada.account, "Basil"), 100)
    factories.audit_rows(ada, [m.id for m in memories + more], 300)
    for _ in range(3):
        _session(ada, fake_llm, {"action": "update", "id": str(memories[0].id), "content": "Memory 0: roses"})
    large = [_queries(client, url) for url in ("/admin/audit", f"/admin/agents/{ada.id}/sessions")]

    assert large == small


def test_a_conversation_summary_edit_is_listed_without_its_text(client, signed_in, admin, ada, member):
    """The audit log is read by every admin; a chat's summary is read on the chat's page, by its readers."""
    private = factories.chat(admin.account, [ada], "Member's own", people=[member])
    db.session.add(
        AuditLog(
            action="chat_memory_doc_update", auditable_type="Chat", auditable_id=private.id,
            account_id=admin.account_id, user_id=member.id, data={"before": {"memory_doc": "old secret"},
            "after": {"memory_doc": "PLUM-7731 is the locker code"}, "via": "admin"},
        )
    )  # fmt: skip
    db.session.commit()

    page = client.get("/admin/audit")

    assert page.status_code == 200
    assert "PLUM-7731" not in page.text and "old secret" not in page.text
    assert "Member's own" not in page.text
