"""Queries and server time of the admin usage and jobs pages over a large cost ledger.

    .venv/bin/python -m bench.usage_page

Fills 100,000 llm_calls (20 agents, 90 days, several models and purposes) and 10,000 job_runs, half of the
calls pointing at a run, with another account's rows alongside; then prints one row per page. The query
counts must not grow with the data.
"""

from datetime import timedelta

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import JobRun, LlmCall
from webapp.timeutil import utcnow

CALLS = 100_000
RUNS = 10_000
AGENTS = 20
PURPOSES = ("reply", "extract", "reflect", "refine", "summarize", "compact")
MODELS = ("gpt-4o-mini", "claude-haiku", "smollm2")
PAGES = [
    "/admin/usage?days=7",
    "/admin/usage?days=30",
    "/admin/usage?days=90",
    "/admin/jobs",
    "/admin/jobs?status=failed&type=reply",
    "/admin/jobs?page=100",
]


def _fill(account, other_account) -> None:
    agents = [factories.agent(account, f"Agent {i}").id for i in range(AGENTS)]
    agents.append(factories.agent(other_account, "Other").id)
    now = utcnow()
    runs = [
        {
            "job_type": ("reply", "summarize", "reflect", "refine")[i % 4],
            "account_id": (account.id, None, other_account.id)[i % 3],
            "status": "failed" if i % 10 == 0 else "done",
            "args": [[i]],
            "counts": {"items": i % 7},
            "started_at": now - timedelta(minutes=13 * i),
            "finished_at": now - timedelta(minutes=13 * i) + timedelta(seconds=i % 90),
        }
        for i in range(RUNS)
    ]
    db.session.execute(sa.insert(JobRun), runs)
    run_ids = db.session.scalars(sa.select(JobRun.id)).all()
    calls = [
        {
            "agent_id": agents[i % len(agents)],
            "job_run_id": run_ids[i % len(run_ids)] if i % 2 else None,
            "purpose": PURPOSES[i % len(PURPOSES)],
            "model": MODELS[i % len(MODELS)],
            "prompt_tokens": 500 + i % 4000,
            "completion_tokens": 50 + i % 400,
            "latency_ms": 900,
            "status": "error" if i % 50 == 0 else "ok",
            "created_at": now - timedelta(seconds=(90 * 86_400 * i) // CALLS),
        }
        for i in range(CALLS)
    ]
    db.session.execute(sa.insert(LlmCall), calls)
    db.session.commit()


def _get_page(client, url: str) -> None:
    assert client.get(url).status_code == 200
    db.session.expire_all()


def main() -> None:
    with bench_app() as app:
        app.config["MODEL_PRICES"] = {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}
        account = factories.account()
        user = factories.user(account)
        _fill(account, factories.account("Other"))
        client = app.test_client()
        client.post("/login", data={"email": user.email, "password": factories.PASSWORD})
        print(
            f"{CALLS:,} llm_calls, {RUNS:,} job_runs ({app.config['SQLALCHEMY_DATABASE_URI'].split(':')[0]})"
        )
        print(f"{'page':<40} | {'queries':>7} | {'ms':>8}")
        for url in PAGES:
            queries, ms = measure(lambda url=url: _get_page(client, url))
            print(f"{url:<40} | {queries:>7} | {ms:>8.1f}")


if __name__ == "__main__":
    main()
