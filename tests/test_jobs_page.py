"""The jobs page: recent runs with status, duration, tokens and errors; filters, pages, and running again."""

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from genai_prices import Usage, calc_price

import webapp.admin
from tests import factories
from tests.conftest import ARTIFACTS
from tests.querycount import count_queries
from webapp.admin.usage import _usd
from webapp.extensions import db
from webapp.jobs.queue import rq_queue
from webapp.models import JobRun, LlmCall
from webapp.timeutil import utcnow

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


def _run_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="run-(\d+)"', html)]


def _row(html: str, run: JobRun) -> str:
    return re.search(rf'<tr id="run-{run.id}".*?</tr>', html, re.S).group(0)


def test_jobs_is_a_full_page_and_a_fragment(client, signed_in):
    run = factories.job_run(signed_in.account)

    page = client.get("/admin/jobs")
    fragment = client.get("/admin/jobs?status=done", headers={**HTMX, "HX-Target": "job-runs"})

    assert "<html" in page.text and '<form class="filters"' in page.text
    assert fragment.text.lstrip().startswith('<div id="job-runs">') and "<html" not in fragment.text
    assert _run_ids(page.text) == _run_ids(fragment.text) == [run.id]
    assert "HX-Request" in page.headers["Vary"] and "HX-Request" in fragment.headers["Vary"]


def test_a_run_shows_status_duration_tokens_and_error(client, signed_in, ada, stranger):
    started = utcnow() - timedelta(minutes=5)
    chat = factories.chat(signed_in.account, [ada], "Trip planning")
    reply = factories.message(chat, "", author=ada, status="failed")
    run = factories.job_run(
        signed_in.account,
        target=f"messages:{reply.id}",
        status="failed",
        started_at=started,
        finished_at=started + timedelta(seconds=125),
        error="LLMError: The model returned HTTP 400: context too long",
    )
    factories.llm_call(ada, job_run_id=run.id, prompt_tokens=1_200, completion_tokens=30)
    factories.llm_call(ada, job_run_id=run.id, prompt_tokens=800, completion_tokens=20)
    factories.llm_call(ada, prompt_tokens=5_000)  # another run's call

    row = _row(client.get("/admin/jobs").text, run)

    assert '<span class="status failed">failed</span>' in row
    assert f'<a href="/chats/{chat.id}">Trip planning</a>' in row
    assert "2 min 05 s" in row
    assert "2,000 / 50" in row
    assert "HTTP 400: context too long" in row
    assert "Run again" in row


def test_a_runs_cost_comes_from_genai_prices_unless_no_price_is_known(app, client, signed_in, ada):
    # Not the fake model server, whose loopback URL would make every model free.
    app.config["LLM_BASE_URL"] = "https://api.openai.com/v1"
    priced, unknown = factories.job_run(signed_in.account), factories.job_run(signed_in.account)
    factories.llm_call(
        ada, job_run_id=priced.id, model="gpt-4o-mini", prompt_tokens=90_000, completion_tokens=8_000
    )
    factories.llm_call(ada, job_run_id=unknown.id, prompt_tokens=800, completion_tokens=20)

    html = _runs_fragment(client)

    found = calc_price(Usage(input_tokens=90_000, output_tokens=8_000), "gpt-4o-mini", provider_id="openai")
    assert f">{_usd(float(found.total_price))}</span>" in _row(html, priced)
    assert "no price known" in _row(html, unknown)


def _runs_fragment(client) -> str:
    return client.get("/admin/jobs", headers={**HTMX, "HX-Target": "job-runs"}).text


def test_runs_read_as_what_they_did_and_name_what_they_worked_on(client, signed_in, ada, stranger):
    basil = factories.agent(signed_in.account, "Basil")
    group = factories.chat(signed_in.account, [ada, basil], "Trip planning")
    untitled = factories.chat(signed_in.account, [ada])
    answers = [factories.message(group, "", author=agent, status="failed") for agent in (ada, basil)]
    theirs = factories.chat(stranger.account, [factories.agent(stranger.account, "Mallory")], "Globex plans")
    account = signed_in.account
    runs = {
        "reply": factories.job_run(account, "reply", target=f"messages:{answers[0].id},{answers[1].id}"),
        "summarize": factories.job_run(account, "summarize", target=f"chat:{group.id} agent:{basil.id}"),
        "consolidate": factories.job_run(account, "consolidate", target=f"chat:{untitled.id}"),
        "compact": factories.job_run(account, "compact", target=f"chat:{group.id}"),
        "refine": factories.job_run(account, "refine", target=f"agent:{ada.id}"),
        "reflect": factories.job_run(account, "reflect", target=f"agent:{ada.id}"),
        "foreign": factories.job_run(account, "compact", target=f"chat:{theirs.id}"),
    }

    html = _runs_fragment(client)

    def row(name: str) -> str:
        return " ".join(_row(html, runs[name]).split())

    chat_link, ada_link = (
        f'<a href="/chats/{group.id}">Trip planning</a>',
        f'<a href="/agents/{ada.id}/edit">Ada</a>',
    )
    basil_link = f'<a href="/agents/{basil.id}/edit">Basil</a>'
    assert "<strong>Reply</strong>" in row("reply") and chat_link in row("reply")
    assert ada_link in row("reply") and basil_link in row("reply")
    assert "<strong>Summarize conversation</strong>" in row("summarize")
    assert chat_link in row("summarize") and basil_link in row("summarize") and "Ada" not in row("summarize")
    assert "<strong>Extract memories from chat</strong>" in row("consolidate")
    assert f'<a href="/chats/{untitled.id}">Conversation {untitled.id}</a>' in row("consolidate")
    assert "<strong>Compact chat history</strong>" in row("compact") and chat_link in row("compact")
    assert "<strong>Refine core memory</strong>" in row("refine") and ada_link in row("refine")
    assert "<strong>Reflect on the journal</strong>" in row("reflect") and ada_link in row("reflect")
    assert "Globex plans" not in html and "a chat no longer here" in row("foreign")
    for internal in ("messages:", "chat:", "agent:", "summarize<", "consolidate<"):
        assert internal not in html


def test_the_job_filter_offers_job_names_in_words(client, signed_in):
    html = client.get("/admin/jobs?type=refine").text

    assert '<option value="refine" selected>Refine core memory</option>' in html
    assert '<option value="reply">Reply</option>' in html
    # Every job says what it is called where it is declared (recorded_job's title), the embedding jobs too.
    assert '<option value="embed_memories_and_messages">Embed new memories and messages</option>' in html
    assert ">Refresh search statistics</option>" in html and "Embed memories and messages<" not in html


@pytest.mark.parametrize(
    ("error", "shown", "hidden"),
    [
        ("webapp.jobs.replies.ReplyFailed: replies failed: 8", "1 reply failed", "ReplyFailed"),
        ("ReplyFailed: replies failed: 8, 9, 12", "3 replies failed", "replies failed:"),
        (
            "LLMError: The model returned HTTP 404: no such model",
            "The model returned HTTP 404: no such model",
            "LLMError",
        ),
        (
            "rq.timeouts.JobTimeoutException: Task exceeded maximum timeout value (3600 seconds)",
            "Stopped: it ran longer than its time limit (3600 seconds)",
            '<summary class="error">rq.timeouts',
        ),
    ],
)
def test_errors_read_as_sentences(client, signed_in, error, shown, hidden):
    run = factories.job_run(signed_in.account, "reply", status="failed", error=error)

    row = _row(_runs_fragment(client), run)

    assert shown in row and hidden not in row


def test_an_unexpected_errors_type_is_kept_under_details(client, signed_in):
    error = "sqlalchemy.exc.OperationalError: database is locked"
    run = factories.job_run(signed_in.account, "compact", status="failed", error=error)

    row = _row(_runs_fragment(client), run)

    assert '<summary class="error">Database is locked</summary>' in row and f"<pre>{error}</pre>" in row


def test_a_run_with_no_account_is_shown_to_no_tenant_and_cannot_be_run_again(client, signed_in, ada):
    finder = factories.job_run(None, "consolidate", status="failed", args=[1], error="finder-secret")
    factories.llm_call(ada, job_run_id=finder.id, prompt_tokens=100, completion_tokens=10)

    html = client.get("/admin/jobs").text
    rerun = client.post(f"/admin/jobs/{finder.id}/rerun", headers=HTMX)

    assert _run_ids(html) == [] and "finder-secret" not in html
    assert rerun.status_code == 404 and rq_queue().get_jobs() == []


def test_another_accounts_runs_never_appear(client, signed_in, stranger):
    mine = factories.job_run(signed_in.account)
    factories.job_run(stranger.account, target="globex-secret", status="failed", error="globex")

    html = client.get("/admin/jobs").text

    assert _run_ids(html) == [mine.id] and "globex" not in html


def test_filters_by_type_status_and_day(client, signed_in):
    today = utcnow().replace(hour=12, minute=0, second=0, microsecond=0)
    reply = factories.job_run(signed_in.account, "reply", status="failed", started_at=today)
    summary = factories.job_run(signed_in.account, "summarize", started_at=today)
    old = factories.job_run(signed_in.account, "reply", started_at=today - timedelta(days=3))

    def shown(query: str) -> set[int]:
        return set(_run_ids(client.get(f"/admin/jobs?{query}").text))

    assert shown("") == {reply.id, summary.id, old.id}
    assert shown("type=reply") == {reply.id, old.id}
    assert shown("status=failed") == {reply.id}
    assert shown(f"day={today.date().isoformat()}") == {reply.id, summary.id}
    assert shown("type=reply&status=done") == {old.id}
    assert shown("status=bogus&day=not-a-day") == {reply.id, summary.id, old.id}  # bad filters are ignored


def test_runs_come_newest_first_fifty_to_a_page(client, signed_in):
    start = datetime(2025, 1, 1)
    runs = [factories.job_run(signed_in.account, started_at=start + timedelta(minutes=i)) for i in range(120)]
    newest_first = [run.id for run in reversed(runs)]

    first = client.get("/admin/jobs?type=reply").text
    third = client.get("/admin/jobs?type=reply&page=3", headers={**HTMX, "HX-Target": "job-runs"}).text

    assert _run_ids(first) == newest_first[:50]
    assert 'href="/admin/jobs?page=2&amp;type=reply"' in first and "Newer" not in first
    assert _run_ids(third) == newest_first[100:]
    assert "Older" not in third and 'href="/admin/jobs?page=2&amp;type=reply"' in third


def test_run_again_enqueues_the_failed_runs_job_with_its_args(client, signed_in):
    failed = factories.job_run(signed_in.account, "reply", status="failed", args=[[5, 6]], error="boom")

    response = client.post(f"/admin/jobs/{failed.id}/rerun", headers=HTMX)

    assert response.status_code == 200
    assert "Queued again" in response.text and "<html" not in response.text
    [job] = rq_queue("replies").get_jobs()
    assert job.func_name == "webapp.jobs.replies.respond"
    assert job.args == ([5, 6],)


def test_run_again_without_htmx_goes_back_to_the_jobs_page(client, signed_in):
    failed = factories.job_run(signed_in.account, "reply", status="failed", args=[[5]])

    response = client.post(f"/admin/jobs/{failed.id}/rerun")

    assert response.status_code == 303 and response.headers["Location"] == "/admin/jobs"
    assert "Queued again" in client.get("/admin/jobs").text
    assert len(rq_queue("replies").get_jobs()) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": "done"}, "only a failed or interrupted run can be run again"),
        ({"status": "running"}, "only a failed or interrupted run can be run again"),
        ({"status": "failed", "job_type": "retired-job"}, "no job of type “retired-job”"),
    ],
)
def test_run_again_refuses_runs_that_are_not_failed_or_unknown(client, signed_in, fields, message):
    run = factories.job_run(signed_in.account, **{"job_type": "reply", "args": [[1]], **fields})

    response = client.post(f"/admin/jobs/{run.id}/rerun", headers=HTMX)

    assert response.status_code == 422 and message in response.text
    assert "Run again" not in _row(client.get("/admin/jobs").text, run)
    assert rq_queue().count == 0


def test_another_accounts_run_cannot_be_run_again(client, signed_in, stranger):
    theirs = factories.job_run(stranger.account, "reply", status="failed", args=[[1]])

    assert client.post(f"/admin/jobs/{theirs.id}/rerun", headers=HTMX).status_code == 404
    assert client.post("/admin/jobs/999999/rerun", headers=HTMX).status_code == 404
    assert rq_queue().count == 0


def test_run_again_needs_a_csrf_token(app, client, signed_in):
    failed = factories.job_run(signed_in.account, "reply", status="failed", args=[[1]])
    app.config["WTF_CSRF_ENABLED"] = True

    assert client.post(f"/admin/jobs/{failed.id}/rerun", headers=HTMX).status_code == 400
    assert rq_queue().count == 0


def test_members_are_forbidden(client, auth, member, admin):
    failed = factories.job_run(admin.account, "reply", status="failed", args=[[1]])
    auth.login(member)

    assert client.get("/admin/jobs").status_code == 403
    assert client.post(f"/admin/jobs/{failed.id}/rerun", headers=HTMX).status_code == 403
    assert rq_queue().count == 0


def _fill(account, agent, count: int) -> None:
    start = utcnow() - timedelta(days=1)
    chat = factories.chat(account, [agent], "Trip planning")
    message = factories.message(chat, "", author=agent)
    runs = [
        {
            "job_type": ("reply", "summarize")[i % 2],
            "target": (f"messages:{message.id}", f"chat:{chat.id} agent:{agent.id}")[i % 2],
            "account_id": account.id,
            "status": ("done", "failed")[i % 2],
            "args": [[i]],
            "counts": {},
            "started_at": start + timedelta(seconds=i),
            "finished_at": start + timedelta(seconds=i + 3),
        }
        for i in range(count)
    ]
    db.session.execute(sa.insert(JobRun), runs)
    ids = db.session.scalars(sa.select(JobRun.id)).all()
    calls = [
        {
            "agent_id": agent.id,
            "job_run_id": i,
            "purpose": "reply",
            "model": "m",
            "status": "ok",
            "prompt_tokens": 9,
        }
        for i in ids
    ]
    db.session.execute(sa.insert(LlmCall), calls)
    db.session.commit()


def test_the_page_runs_the_same_queries_for_10_or_1000_runs(client, signed_in, ada):
    def queries(count: int) -> int:
        db.session.execute(sa.delete(LlmCall))
        db.session.execute(sa.delete(JobRun))
        _fill(signed_in.account, ada, count)
        with count_queries() as counted:
            html = client.get("/admin/jobs").text
        assert len(_run_ids(html)) == min(count, 50)
        return counted.count

    # runs, calls, the filters; messages, chats and agents named; the navigation's proposals to review
    assert queries(10) == queries(1000) <= 9  # one of them: the status line asks which connections are in use


def test_the_admin_pages_ask_whether_htmx_sent_a_post_in_one_place():
    admin = Path(webapp.admin.__file__).parent
    asking = sorted(path.name for path in admin.glob("*.py") if "HX-Request" in path.read_text())
    assert asking == ["common.py"]


@pytest.mark.browser
def test_the_jobs_page_fits_a_1280_pixel_window(page, live_server, live_app):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    live_app.config["MODEL_PRICES"] = {"ada-model": {"input": 3, "output": 15}}
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada], "Planning the long walk along the coast " * 4)
    replies = [factories.message(chat, "", author=ada, status="failed") for _ in range(12)]
    error = "LLMError: The model returned HTTP 404: " + "no-such-model/" * 30
    target = "messages:" + ",".join(str(reply.id) for reply in replies)
    run = factories.job_run(admin.account, "reply", status="failed", target=target, error=error, args=[[1]])
    factories.llm_call(ada, job_run_id=run.id, prompt_tokens=1_234_567, completion_tokens=89_012)
    factories.job_run(
        admin.account, "summarize", target=f"chat:{chat.id} agent:{ada.id}", counts={"a" * 80: 1}
    )
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    page.goto(f"{live_server}/admin/jobs")

    assert page.get_by_role("cell", name="Reply").first.is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "jobs-1280.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    table, column = page.locator("#job-runs table").bounding_box(), page.locator("#job-runs").bounding_box()
    assert table["width"] <= column["width"]  # the table fits the page's column too


def test_the_error_of_a_job_on_a_chat_the_admin_may_not_read_is_never_quoted(client, signed_in, ada):
    """Issue 31, item 7: a compaction of a member's private chat failed with a provider's 400 quoting its
    input; the admin sees that it failed, and how (HTTP 400), never the text."""
    member = factories.user(signed_in.account, "milo@example.com", "member")
    private = factories.chat(signed_in.account, [ada], "Milo's locker", people=[member])
    shared = factories.chat(signed_in.account, [ada], "Garden club")
    quoted = "webapp.llm.LLMError: The model returned HTTP 400: invalid input near 'my locker code is 4711'"
    hidden = factories.job_run(
        signed_in.account, "compact", target=f"chat:{private.id}", status="failed", error=quoted
    )
    shown = factories.job_run(
        signed_in.account, "compact", target=f"chat:{shared.id}", status="failed", error=quoted
    )

    html = _runs_fragment(client)

    assert "4711" not in _row(html, hidden) and "my locker code" not in _row(html, hidden)
    assert "The model answered HTTP 400" in _row(
        html, hidden
    ) and "may quote a chat you may not read" in _row(html, hidden)
    assert "my locker code is 4711" in _row(html, shown)  # the admin may read that chat
