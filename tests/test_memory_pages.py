"""The memory ledger page: memories with filters, search and pages, the core budget bar, edits in place, run now."""

import re
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs import schedule
from webapp.jobs.queue import rq_queue
from webapp.models import AgentMemory, AuditLog
from webapp.timeutil import utcnow

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", core_token_budget=100)


def _url(agent, **args) -> str:
    query = "&".join(f"{k}={v}" for k, v in args.items())
    return f"/admin/agents/{agent.id}/memories" + (f"?{query}" if query else "")


def _ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article id="memory-(\d+)"', html)]


def _audit(action: str) -> list[AuditLog]:
    return list(
        db.session.scalars(sa.select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id))
    )


def test_the_ledger_is_a_full_page_and_a_fragment(client, signed_in, ada):
    memory = factories.memory(ada, "Dana grows roses")

    page = client.get(_url(ada))
    fragment = client.get(_url(ada, show="core"), headers={**HTMX, "HX-Target": "memory-ledger"})

    assert "<html" in page.text and 'id="add-memory"' in page.text and 'id="core-tokens"' in page.text
    assert fragment.text.lstrip().startswith('<section id="memory-ledger"') and "<html" not in fragment.text
    assert _ids(page.text) == _ids(fragment.text) == [memory.id]
    assert "HX-Request" in page.headers["Vary"] and "HX-Request" in fragment.headers["Vary"]


def test_memories_show_date_tokens_and_flags(client, signed_in, ada):
    core = factories.memory(ada, "I keep my promises", constitutional=True)
    old = factories.memory(ada, "Watered the roses", "journal", created_at=utcnow() - timedelta(days=9))
    gone = factories.memory(ada, "An obsolete thought")
    gone.soft_delete()
    db.session.commit()

    html = client.get(_url(ada)).text

    assert _ids(html) == [core.id, old.id]  # newest first; deleted memories only under "Deleted"
    row = re.search(rf'<article id="memory-{old.id}".*?</article>', html, re.S).group(0)
    assert "badge expired" in row and old.created_at.strftime("%Y-%m-%d") in row
    assert f"{old.token_estimate} tokens" in row
    assert "badge constitutional" in re.search(
        rf'<article id="memory-{core.id}".*?</article>', html, re.S
    ).group(0)


@pytest.mark.parametrize(
    "show, expected",
    [
        ("active", ["fresh", "expired", "core", "constitution"]),
        ("core", ["core", "constitution"]),
        ("journal", ["fresh", "expired"]),
        ("expired", ["expired"]),
        ("constitutional", ["constitution"]),
        ("deleted", ["deleted"]),
    ],
)
def test_filters(client, signed_in, ada, show, expected):
    now = utcnow()
    made = {
        "constitution": factories.memory(
            ada, "constitution", constitutional=True, created_at=now - timedelta(hours=5)
        ),
        "core": factories.memory(ada, "core", created_at=now - timedelta(hours=4)),
        "deleted": factories.memory(ada, "deleted", created_at=now - timedelta(hours=3)),
        "expired": factories.memory(ada, "expired", "journal", created_at=now - timedelta(days=8)),
        "fresh": factories.memory(ada, "fresh", "journal", created_at=now - timedelta(hours=1)),
    }
    made["deleted"].soft_delete()
    db.session.commit()
    factories.memory(factories.agent(ada.account, "Basil"), "someone else's")

    html = client.get(_url(ada, show=show), headers={**HTMX, "HX-Target": "memory-ledger"}).text

    assert sorted(_ids(html)) == sorted(made[name].id for name in expected)
    assert (
        f'aria-current="page">{FILTER_LABELS[show]} <span id="count-{show}" class="count">{len(expected)}</span>'
        in html
    )


FILTER_LABELS = {
    "active": "All active",
    "core": "Core",
    "journal": "Journal",
    "expired": "Expired journal",
    "constitutional": "Constitutional",
    "deleted": "Deleted",
}


def test_search_takes_percent_and_underscore_literally(client, signed_in, ada):
    sure = factories.memory(ada, "Dana is 100% sure about roses")
    factories.memory(ada, "Dana is 1000 sure about tulips")
    snake = factories.memory(ada, "Dana writes snake_case")
    factories.memory(ada, "Dana writes snakeXcase")

    assert _ids(client.get(_url(ada, q="100%25")).text) == [sure.id]
    assert _ids(client.get(_url(ada, q="snake_case")).text) == [snake.id]
    assert _ids(client.get(_url(ada, q="DANA WRITES")).text) == [snake.id + 1, snake.id]  # case-insensitive
    assert "No memories match" in client.get(_url(ada, q="%25%25")).text


def test_pages_of_fifty(client, signed_in, ada):
    made = factories.memories(ada, 60)

    first = client.get(_url(ada)).text
    second = client.get(_url(ada, page=2), headers={**HTMX, "HX-Target": "memory-ledger"}).text

    assert len(_ids(first)) == 50 and "Older →" in first and "← Newer" not in first
    assert len(_ids(second)) == 10 and "← Newer" in second and "Older →" not in second
    assert sorted(_ids(first) + _ids(second)) == sorted(m.id for m in made)


def test_the_budget_bar_counts_active_core_tokens(client, signed_in, ada):
    kept = factories.memory(ada, "word " * 60)
    factories.memory(ada, "word " * 80).soft_delete()
    factories.memory(ada, "journal words " * 40, "journal")
    db.session.commit()

    bar = re.search(r'<div id="core-tokens".*?</div>\s*</div>', client.get(_url(ada)).text, re.S).group(0)

    assert f"{kept.token_estimate}</span> / 100 tokens" in bar
    assert "over budget" not in bar
    factories.memory(ada, "more words " * 30)
    assert "over budget" in client.get(_url(ada)).text


def test_add_a_memory_in_place(client, signed_in, ada):
    response = client.post(
        f"/admin/agents/{ada.id}/memories",
        data={"content": "  Dana's cat is called <Pip>  ", "memory_type": "core", "constitutional": "y"},
        headers=HTMX,
    )

    memory = db.session.scalar(sa.select(AgentMemory))
    assert response.status_code == 200
    assert response.text.lstrip().startswith(f'<article id="memory-{memory.id}"')
    assert "Dana&#39;s cat is called &lt;Pip&gt;" in response.text  # escaped
    assert 'id="core-tokens" class="core-tokens" hx-swap-oob="true"' in response.text
    assert (
        '<form id="add-memory"' in response.text
        and "hx-swap-oob" in response.text.split('id="add-memory"')[1][:400]
    )
    assert memory.content == "Dana's cat is called <Pip>" and memory.constitutional
    [row] = _audit("memory_create")
    assert row.user_id == signed_in.id and row.data["via"] == "admin" and row.data["before"] is None
    assert row.data["after"]["content"] == memory.content and row.auditable_id == memory.id


def test_adding_shows_validation_errors(client, signed_in, ada):
    empty = client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "  ", "memory_type": "core"}, headers=HTMX
    )
    long = client.post(
        f"/admin/agents/{ada.id}/memories",
        data={"content": "x" * 10_001, "memory_type": "core"},
        headers=HTMX,
    )
    bad_type = client.post(f"/admin/agents/{ada.id}/memories", data={"content": "ok", "memory_type": "dream"})

    assert empty.status_code == 422 and empty.headers["HX-Retarget"] == "#add-memory"
    assert "Write the memory first." in empty.text and "<html" not in empty.text
    assert long.status_code == 422 and "at most 10,000 characters" in long.text
    assert bad_type.status_code == 422 and "<html" in bad_type.text and "Not a valid choice" in bad_type.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory)) == 0
    assert _audit("memory_create") == []


def test_a_plain_form_post_redirects_back_to_the_ledger(client, signed_in, ada):
    response = client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "Likes tea", "memory_type": "core"}
    )

    assert response.status_code == 303 and response.headers["Location"].endswith(_url(ada))
    assert "added" in client.get(_url(ada)).text


def test_edit_in_place(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea", "journal")
    prefix = f"memory-{memory.id}"

    form = client.get(f"/admin/memories/{memory.id}/edit", headers=HTMX)
    saved = client.post(
        f"/admin/memories/{memory.id}",
        data={f"{prefix}-content": "Dana likes green tea", f"{prefix}-memory_type": "core"},
        headers=HTMX,
    )

    assert (
        form.status_code == 200
        and f'name="{prefix}-content"' in form.text
        and "Dana likes tea</textarea>" in form.text
    )
    assert saved.status_code == 200 and "Dana likes green tea" in saved.text and "type-core" in saved.text
    [row] = _audit("memory_update")
    assert row.user_id == signed_in.id and row.data["via"] == "admin"
    assert (
        row.data["before"]["content"] == "Dana likes tea" and row.data["before"]["memory_type"] == "journal"
    )
    assert (
        row.data["after"]["content"] == "Dana likes green tea" and row.data["after"]["memory_type"] == "core"
    )


def test_an_invalid_edit_shows_its_error_and_cancel_brings_the_row_back(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    prefix = f"memory-{memory.id}"

    invalid = client.post(
        f"/admin/memories/{memory.id}",
        data={f"{prefix}-content": "", f"{prefix}-memory_type": "core"},
        headers=HTMX,
    )
    cancel = client.get(f"/admin/memories/{memory.id}", headers=HTMX)

    assert (
        invalid.status_code == 422
        and "Write the memory first." in invalid.text
        and "<textarea" in invalid.text
    )
    assert (
        cancel.text.lstrip().startswith(f'<article id="memory-{memory.id}"')
        and "Dana likes tea" in cancel.text
    )
    assert _audit("memory_update") == []


def test_an_edit_that_changes_nothing_records_nothing(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    prefix = f"memory-{memory.id}"

    client.post(
        f"/admin/memories/{memory.id}",
        data={f"{prefix}-content": "Dana likes tea ", f"{prefix}-memory_type": "core"},
        headers=HTMX,
    )

    assert _audit("memory_update") == []


def test_toggle_constitutional(client, signed_in, ada):
    memory = factories.memory(ada, "I never lie")

    on = client.post(f"/admin/memories/{memory.id}/constitutional", headers=HTMX)
    off = client.post(f"/admin/memories/{memory.id}/constitutional", headers=HTMX)

    assert "badge constitutional" in on.text and ">Unprotect</button>" in on.text
    assert "badge constitutional" not in off.text and ">Protect</button>" in off.text
    first, second = _audit("memory_constitutional_toggle")
    assert (first.data["before"]["constitutional"], first.data["after"]["constitutional"]) == (False, True)
    assert second.data["after"]["constitutional"] is False and second.user_id == signed_in.id


def test_delete_and_restore_in_place_update_the_budget_bar(client, signed_in, ada):
    memory = factories.memory(ada, "word " * 30)
    tokens = memory.token_estimate

    deleted = client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    restored = client.post(f"/admin/memories/{memory.id}/restore", headers=HTMX)

    assert "badge deleted" in deleted.text and ">Restore</button>" in deleted.text
    assert '<span class="figure">0</span> / 100 tokens' in deleted.text
    assert "badge deleted" not in restored.text and f'<span class="figure">{tokens}</span>' in restored.text
    [delete_row] = _audit("memory_delete")
    [restore_row] = _audit("memory_restore")
    assert delete_row.data["before"]["deleted_at"] is None and delete_row.data["after"]["deleted_at"]
    assert restore_row.data["after"]["deleted_at"] is None
    assert delete_row.user_id == restore_row.user_id == signed_in.id
    assert db.session.get(AgentMemory, memory.id).deleted_at is None


def _counts_sent(html: str) -> dict[str, str]:
    """The ledger's tab counts a fragment sends out of band, by tab."""
    found = re.findall(r'<span id="count-(\w+)" class="count" hx-swap-oob="true">([\d,]+)</span>', html)
    return dict(found)


def test_changes_in_place_update_the_tab_counts(client, signed_in, ada):
    memory = factories.memory(ada, "Dana likes tea")
    factories.memory(ada, "Watered the roses", "journal")
    page = client.get(_url(ada)).text

    deleted = client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    client.post(f"/admin/memories/{memory.id}/restore", headers=HTMX)
    protected = client.post(f"/admin/memories/{memory.id}/constitutional", headers=HTMX)
    added = client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "A new one", "memory_type": "core"}, headers=HTMX
    )

    assert '<span id="count-deleted" class="count">0</span>' in page
    assert _counts_sent(deleted.text) == {
        "active": "1",
        "core": "0",
        "journal": "1",
        "expired": "0",
        "constitutional": "0",
        "deleted": "1",
    }
    assert _counts_sent(protected.text)["constitutional"] == "1"
    assert _counts_sent(protected.text)["deleted"] == "0"
    assert _counts_sent(added.text)["core"] == "2" and _counts_sent(added.text)["active"] == "3"


def test_deleting_a_constitutional_memory_is_refused_clearly(client, signed_in, ada):
    memory = factories.memory(ada, "I never lie", constitutional=True)

    response = client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    plain = client.post(f"/admin/memories/{memory.id}/delete")

    assert response.status_code == 422
    assert f"Memory #{memory.id} is constitutional and cannot be deleted." in response.text
    assert response.text.lstrip().startswith(f'<article id="memory-{memory.id}"')
    assert plain.status_code == 303
    assert db.session.get(AgentMemory, memory.id).deleted_at is None and _audit("memory_delete") == []


def test_a_deleted_memory_cannot_be_edited_until_restored(client, signed_in, ada):
    memory = factories.memory(ada, "old")
    memory.soft_delete()
    db.session.commit()

    response = client.get(f"/admin/memories/{memory.id}/edit", headers=HTMX)
    toggle = client.post(f"/admin/memories/{memory.id}/constitutional", headers=HTMX)

    assert response.status_code == 422 and "Restore this memory before editing it." in response.text
    assert toggle.status_code == 422 and _audit("memory_constitutional_toggle") == []


def test_last_refinement_and_the_next_scheduled_run(client, signed_in, ada):
    ada.last_refinement_at = utcnow() - timedelta(days=2)
    db.session.commit()

    unregistered = client.get(_url(ada)).text
    schedule.sync()
    registered = client.get(_url(ada)).text

    assert "2 days ago" in re.search(r'id="last-refinement">.*?</dd>', unregistered, re.S).group(0)
    next_run = re.search(r'id="next-refinement">.*?</dd>', unregistered, re.S).group(0)
    assert (
        "Mon " in next_run
        and "04:00 UTC" in next_run
        and "not registered; run <code>flask schedule sync" in next_run
    )
    next_run = re.search(r'id="next-refinement">.*?</dd>', registered, re.S).group(0)
    assert "Mon " in next_run and "04:00 UTC" in next_run and "not registered" not in next_run


def test_the_agents_list_links_to_each_ledger(client, signed_in, ada):
    assert f'href="/admin/agents/{ada.id}/memories"' in client.get("/agents/").text


# Run now


def test_run_now_buttons_say_what_they_do(client, signed_in, ada):
    html = client.get(_url(ada)).text

    buttons = re.findall(r'<button type="submit">([^<]*now)</button>', html)
    assert buttons == [
        "Refine core memory now",
        "Reflect on the journal now",
        "Extract memories from group chats now",
    ]


def test_a_plain_run_now_post_flashes_what_was_queued(client, signed_in, ada):
    factories.memory(ada, "Dana likes tea")

    response = client.post(f"/admin/agents/{ada.id}/run/reflect", follow_redirects=True)

    assert "Queued: reflect on the journal." in response.text


def _status(client, agent, kind, html):
    after = re.search(r"after=(\d+)", html).group(1)
    return client.get(f"/admin/agents/{agent.id}/run/{kind}?after={after}", headers=HTMX)


def test_refine_now_is_queued_then_running_then_done_with_the_summary(client, signed_in, ada, fake_llm):
    memory = factories.memory(ada, "Dana likes tea and biscuits in the afternoon")
    factories.job_run(ada.account, "refine", target=f"agent:{ada.id}", status="done")  # an earlier run

    queued = client.post(f"/admin/agents/{ada.id}/run/refine", headers=HTMX)
    [job] = [j for j in rq_queue().jobs if "embeddings" not in j.func_name]
    assert queued.status_code == 200 and '<span class="status queued">queued</span>' in queued.text
    assert 'hx-trigger="every 2s"' in queued.text
    assert job.func_name == "webapp.jobs.refinement.refine_agent" and job.args == (ada.id, True)
    assert "queued" in _status(client, ada, "refine", queued.text).text

    running = factories.job_run(ada.account, "refine", target=f"agent:{ada.id}", status="running")
    assert '<span class="status running">running</span>' in _status(client, ada, "refine", queued.text).text
    db.session.delete(running)
    db.session.commit()

    fake_llm.reply(
        tool_calls=[
            ("refine_memory", {"action": "update", "id": str(memory.id), "content": "Dana likes tea."})
        ]
    )
    fake_llm.reply(
        tool_calls=[("refine_memory", {"action": "complete", "summary": "Tightened the tea memory."})]
    )
    job.perform()  # what the worker does
    done = _status(client, ada, "refine", queued.text).text

    assert '<span class="status done">done</span>' in done and "every 2s" not in done
    assert "Tightened the tea memory." in done and "updated 1" in done and "/admin/sessions/" in done


def test_a_failed_run_shows_its_error_and_stops_polling(client, signed_in, ada):
    queued = client.post(f"/admin/agents/{ada.id}/run/reflect", headers=HTMX)
    factories.job_run(
        ada.account, "reflect", target=f"agent:{ada.id}", status="failed", error="LLMError: HTTP 500"
    )

    failed = _status(client, ada, "reflect", queued.text).text

    assert rq_queue().jobs[0].func_name == "webapp.jobs.reflection.reflect_agent"
    assert '<span class="status failed">failed</span>' in failed and "HTTP 500" in failed
    assert "LLMError" not in failed
    assert "every 2s" not in failed


def test_consolidate_now_runs_each_group_chat_of_the_agent(client, signed_in, ada):
    basil = factories.agent(ada.account, "Basil")
    group = factories.chat(ada.account, [ada, basil])
    factories.chat(ada.account, [ada])  # one-to-one: not consolidated
    discarded = factories.chat(ada.account, [ada, basil])
    discarded.discarded_at = utcnow()
    db.session.commit()

    queued = client.post(f"/admin/agents/{ada.id}/run/consolidate", headers=HTMX)
    [job] = rq_queue().jobs
    assert job.args == (group.id, True) and "0 of 1 group chat started" in queued.text

    factories.job_run(
        ada.account, "consolidate", target=f"chat:{group.id}", status="done", counts={"core": 2, "journal": 3}
    )
    done = _status(client, ada, "consolidate", queued.text).text
    assert '<span class="status done">done</span>' in done and "core 2, journal 3" in done


def test_run_now_refuses_with_a_reason(client, signed_in, ada):
    no_chats = client.post(f"/admin/agents/{ada.id}/run/consolidate", headers=HTMX)
    ada.paused = True
    db.session.commit()
    paused = client.post(f"/admin/agents/{ada.id}/run/refine", headers=HTMX)

    assert (
        no_chats.status_code == 422 and "Ada is in no group chat to extract memories from." in no_chats.text
    )
    assert paused.status_code == 422 and "Ada is paused" in paused.text
    assert rq_queue().jobs == [] and client.post(f"/admin/agents/{ada.id}/run/other").status_code == 404


def test_another_accounts_runs_are_not_shown(client, signed_in, ada, stranger):
    queued = client.post(f"/admin/agents/{ada.id}/run/reflect", headers=HTMX)
    factories.job_run(stranger.account, "reflect", target=f"agent:{ada.id}", status="failed", error="secret")

    assert "queued" in _status(client, ada, "reflect", queued.text).text


def test_the_ledger_runs_a_constant_number_of_queries(client, signed_in, ada):
    def queries() -> int:
        db.session.expire_all()
        with count_queries() as counted:
            assert client.get(_url(ada)).status_code == 200
        return counted.count

    factories.memories(ada, 5)
    small = queries()
    factories.memories(ada, 200, "journal")
    factories.memories(ada, 100, constitutional=True)
    assert queries() == small
    assert (
        client.get(
            _url(ada, q="roses", show="core"), headers={**HTMX, "HX-Target": "memory-ledger"}
        ).status_code
        == 200
    )
