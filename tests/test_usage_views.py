"""The usage page as an admin reads it: tokens and dollars by day, agent, purpose and model, and its chart."""

import re
import time
from datetime import datetime, timedelta
from html.parser import HTMLParser

import genai_prices
import pytest
import sqlalchemy as sa
import time_machine
from genai_prices import Usage, calc_price
from sqlalchemy.dialects import postgresql, sqlite

from tests import factories
from tests.querycount import count_queries
from webapp.admin.usage import CalendarDay, _usd
from webapp.extensions import db
from webapp.models import LlmCall
from webapp.runtime.health import PROBES, Check

NOW = datetime(2025, 5, 10, 12, 0)


@pytest.fixture(autouse=True)
def _frozen_clock():
    with time_machine.travel("2025-05-10 12:00:00Z", tick=False):
        yield


@pytest.fixture(autouse=True)
def _a_provider_without_a_price_list(app):
    """The fake model server is on loopback, where every model runs for free: say the calls went to a provider
    genai-prices does not know, so the test models ("ada-model") have no price unless a test gives one."""
    app.config["LLM_BASE_URL"] = "https://llm.example.com/v1"
    # Every page's status line would ask that address for its models: take it as answering.
    report = app.extensions["health_report"]
    report.checks = {name: Check(True, "up") for name in PROBES}
    report.taken_at = time.monotonic() + 3600


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


@pytest.fixture
def ledger(ada, basil, stranger):
    """Known calls over three days of the last week, one 40 days old, and calls no Acme admin may see."""
    call = factories.llm_call
    call(ada, prompt_tokens=1_000_000, completion_tokens=200_000, created_at=NOW)
    call(ada, purpose="extract", prompt_tokens=500, completion_tokens=100, created_at=NOW - timedelta(days=1))
    call(basil, prompt_tokens=300, completion_tokens=30, created_at=datetime(2025, 5, 8, 23, 59, 59))
    call(basil, prompt_tokens=0, completion_tokens=0, status="error", error="HTTP 503", created_at=NOW)
    call(
        ada,
        purpose="reflect",
        prompt_tokens=7_000,
        completion_tokens=700,
        created_at=NOW - timedelta(days=40),
    )
    call(None, purpose="check", prompt_tokens=99_999, completion_tokens=9_999, created_at=NOW)
    foreign = factories.agent(stranger.account, "Mallory")
    call(foreign, prompt_tokens=88_888, completion_tokens=8_888, created_at=NOW)


class _Tables(HTMLParser):
    """Cell texts of every table on a page, by table id."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _table(html: str, table_id: str) -> list[list[str]]:
    return _Tables(html).tables[table_id]


def test_usage_is_a_full_page_and_a_fragment(client, auth, admin, ledger):
    auth.login(admin)

    page = client.get("/admin/usage")
    fragment = client.get("/admin/usage?days=7", headers={"HX-Request": "true", "HX-Target": "usage"})

    assert page.status_code == fragment.status_code == 200
    assert "<html" in page.text and '<svg class="usage-chart"' in page.text
    assert "<html" not in fragment.text and fragment.text.lstrip().startswith('<section id="usage"')
    assert re.search(r'<a href="/admin/usage\?days=7"[^>]*aria-current="page"', fragment.text)
    assert "HX-Request" in page.headers["Vary"] and "HX-Request" in fragment.headers["Vary"]


def test_tokens_by_agent_purpose_model_and_day(client, auth, admin, ledger):
    auth.login(admin)

    html = client.get("/admin/usage?days=7").text

    assert _table(html, "usage-by-agent") == [
        ["Agent", "Input", "Output", "Calls", "Cost"],
        ["Ada", "1,000,500", "200,100", "2", "no price known"],
        ["Basil", "300", "30", "2 (1 failed)", "no price known"],
        ["Total", "1,000,800", "200,130", "4 (1 failed)", "no price known"],
    ]
    assert [row[:4] for row in _table(html, "usage-by-purpose")[1:3]] == [
        ["reply", "1,000,300", "200,030", "3 (1 failed)"],
        ["extract", "500", "100", "1"],
    ]
    assert [row[:4] for row in _table(html, "usage-by-model")[1:3]] == [
        ["ada-model", "1,000,500", "200,100", "2"],
        ["basil-model", "300", "30", "2 (1 failed)"],
    ]
    # 23:59:59 on the 8th stays on the 8th: days are cut in SQL, at midnight UTC.
    assert [row[:4] for row in _table(html, "usage-by-day")[1:4]] == [
        ["2025-05-08", "300", "30", "1"],
        ["2025-05-09", "500", "100", "1"],
        ["2025-05-10", "1,000,000", "200,000", "2 (1 failed)"],
    ]


def test_the_daily_figures_are_visible_without_hovering(client, auth, admin, ledger):
    auth.login(admin)

    html = client.get("/admin/usage?days=7").text

    # What shows without a hover or a click: no tooltips, no collapsed details.
    visible = re.sub(r"<title>.*?</title>|<details.*?</details>", "", html, flags=re.S)
    visible = re.sub(r'\stitle="[^"]*"', "", visible)
    assert _table(visible, "usage-by-day")[1:4] == [
        ["2025-05-08", "300", "30", "1", "no price known"],
        ["2025-05-09", "500", "100", "1", "no price known"],
        ["2025-05-10", "1,000,000", "200,000", "2 (1 failed)", "no price known"],
    ]
    assert "hover" not in visible


def test_the_window_decides_which_calls_count(client, auth, admin, ledger):
    auth.login(admin)

    def total_input(days) -> str:
        return _table(client.get(f"/admin/usage?days={days}").text, "usage-by-agent")[-1][1]

    assert total_input(7) == total_input(30) == "1,000,800"
    assert total_input(90) == "1,007,800"  # the reflection 40 days ago
    assert total_input(5) == total_input(30)  # an unknown window falls back to 30 days


def test_the_chart_has_one_bar_group_per_day_with_calls(client, auth, admin, ledger):
    auth.login(admin)

    html = client.get("/admin/usage?days=30").text
    chart = html[html.index("<svg") : html.index("</svg>")]
    days = re.findall(r'<g class="day" data-day="([\d-]+)">', chart)

    assert days == ["2025-05-08", "2025-05-09", "2025-05-10"]
    assert "<title>Sat 10 May 2025: 1,000,000 input + 200,000 output tokens, 2 calls</title>" in chart
    assert chart.count('<rect class="input"') == chart.count('<rect class="output"') == 3
    assert (
        ">1.5M<" in chart and ">2M<" in chart and ">May 10<" not in chart and ">Apr 11<" in chart
    )  # y ticks and day labels


def test_an_empty_window_says_so(client, auth, admin):
    auth.login(admin)

    html = client.get("/admin/usage").text

    assert "No LLM calls in these days." in html and '<g class="day"' not in html
    assert _table(html, "usage-by-agent")[1] == ["No calls in these days."]


def test_prices_turn_tokens_into_dollars(app, client, auth, admin, ledger):
    app.config["MODEL_PRICES"] = {"ada-model": {"input": 3, "output": 15}}
    auth.login(admin)

    html = client.get("/admin/usage?days=7").text
    by_agent = _table(html, "usage-by-agent")

    assert by_agent[0][-1] == "Cost"
    assert by_agent[1][-1] == "$6.00"  # 1,000,500 × $3 + 200,100 × $15, per million: 3.0015 + 3.0015
    assert by_agent[2][-1] == "no price known"  # basil-model is in neither MODEL_PRICES nor genai-prices
    assert by_agent[3][-1] == "$6.00*"  # the total leaves out the calls without a price, and says so
    assert "2 calls to models without a price are not counted" in html
    assert _table(html, "usage-by-purpose")[2][-1] == "$0.0030"  # extract: 500 × $3 + 100 × $15 per million
    assert "basil-model." in html  # the footnote names the models left out


def _genai_dollars(model: str, input_tokens: int, output_tokens: int, **provider) -> str:
    """What genai-prices itself says these tokens cost, as the page writes dollars."""
    found = calc_price(Usage(input_tokens=input_tokens, output_tokens=output_tokens), model, **provider)
    return _usd(float(found.total_price))


@pytest.fixture
def known_models(ada, basil):
    """Calls to models genai-prices knows, by OpenAI's id and by OpenRouter's, and to one nobody prices."""
    factories.llm_call(
        ada, model="gpt-4o-mini", prompt_tokens=150_000, completion_tokens=20_000, created_at=NOW
    )
    factories.llm_call(
        ada, model="openai/gpt-4o", prompt_tokens=40_000, completion_tokens=5_000, created_at=NOW
    )
    factories.llm_call(basil, prompt_tokens=300, completion_tokens=30, created_at=NOW)


def test_known_models_show_dollars_with_no_configuration(app, client, auth, admin, known_models):
    assert app.config["MODEL_PRICES"] == {}
    auth.login(admin)

    by_model = _table(client.get("/admin/usage").text, "usage-by-model")

    assert by_model[1] == [
        "gpt-4o-mini",
        "150,000",
        "20,000",
        "1",
        _genai_dollars("gpt-4o-mini", 150_000, 20_000),
    ]
    assert by_model[2][0] == "openai/gpt-4o"
    assert by_model[2][-1] == _genai_dollars("openai/gpt-4o", 40_000, 5_000, provider_id="openrouter")
    assert by_model[3] == ["basil-model", "300", "30", "1", "no price known"]
    assert by_model[1][-1] not in ("$0.00", "no price known")


def test_the_provider_url_decides_whose_price_a_model_has(app, client, auth, admin, known_models):
    app.config["LLM_BASE_URL"] = "https://openrouter.ai/api/v1"
    auth.login(admin)

    by_model = _table(client.get("/admin/usage").text, "usage-by-model")

    url = {"provider_api_url": "https://openrouter.ai/api/v1"}
    assert by_model[2][-1] == _genai_dollars("openai/gpt-4o", 40_000, 5_000, **url)


def test_model_prices_override_genai_prices(app, client, auth, admin, known_models):
    app.config["MODEL_PRICES"] = {"gpt-4o-mini": {"input": 10, "output": 100}}
    auth.login(admin)

    by_model = _table(client.get("/admin/usage").text, "usage-by-model")

    assert by_model[1][-1] == "$3.50"  # 150,000 × $10 + 20,000 × $100, per million: 1.50 + 2.00


def test_models_that_run_here_cost_nothing_and_say_so(app, client, auth, admin, ada):
    factories.llm_call(ada, model="smollm2", prompt_tokens=5_000, completion_tokens=500, created_at=NOW)
    auth.login(admin)

    html = client.get("/admin/usage").text

    assert _table(html, "usage-by-model")[1][-1] == "$0 (runs here)"
    assert "no price known" not in html


def test_prices_are_looked_up_without_the_network(client, auth, admin, known_models, offline):
    from webapp.admin import prices

    prices._listed_price.cache_clear()  # so this request looks the models up in genai-prices' table
    auth.login(admin)

    by_model = _table(client.get("/admin/usage").text, "usage-by-model")

    assert by_model[1][-1] == _genai_dollars("gpt-4o-mini", 150_000, 20_000)
    assert offline == []  # no attempt to reach another machine, nor to start genai-prices' updater
    assert not genai_prices.data_snapshot.get_snapshot().from_auto_update


def test_each_account_sees_only_its_own_agents_calls(client, auth, stranger, ledger):
    auth.login(stranger)

    html = client.get("/admin/usage").text

    assert _table(html, "usage-by-agent")[1:] == [
        ["Mallory", "88,888", "8,888", "1", "no price known"],
        ["Total", "88,888", "8,888", "1", "no price known"],
    ]
    assert "Ada" not in html and "99,999" not in html  # nor calls without an agent


def test_members_are_forbidden_and_see_no_admin_links(client, auth, member, admin):
    auth.login(member)

    assert client.get("/admin/usage").status_code == 403
    assert 'href="/admin/usage"' not in client.get("/chats/").text


def test_admins_have_usage_and_jobs_in_the_navigation(client, auth, admin):
    auth.login(admin)

    nav = client.get("/chats/").text

    assert 'href="/admin/usage"' in nav and 'href="/admin/jobs"' in nav


def _fill(agents, count: int) -> None:
    rows = [
        {
            "agent_id": agents[i % len(agents)].id,
            "purpose": ("reply", "extract", "reflect", "refine")[i % 4],
            "model": f"model-{i % 3}",
            "prompt_tokens": 100 + i,
            "completion_tokens": 10,
            "status": "ok",
            "created_at": NOW - timedelta(days=i % 30, minutes=i),
        }
        for i in range(count)
    ]
    db.session.execute(sa.insert(LlmCall), rows)
    db.session.commit()


def test_the_page_runs_the_same_queries_for_10_or_1000_calls(app, client, auth, admin, ada, basil):
    app.config["MODEL_PRICES"] = {"model-0": {"input": 1, "output": 2}}
    auth.login(admin)

    def queries(count: int) -> int:
        db.session.execute(sa.delete(LlmCall))
        _fill([ada, basil], count)
        with count_queries() as counted:
            assert client.get("/admin/usage?days=30").status_code == 200
        return counted.count

    assert queries(10) == queries(1000) <= 7  # one of them: the status line asks which connections are in use


def test_days_are_cut_portably_on_sqlite_and_postgresql():
    day = CalendarDay(LlmCall.created_at)

    assert str(day.compile(dialect=postgresql.dialect())) == "CAST(llm_calls.created_at AS DATE)"
    assert str(day.compile(dialect=sqlite.dialect())) == "date(llm_calls.created_at)"
