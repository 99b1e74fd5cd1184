"""Queries and server time of the memory ledger, the audit log, and the refinement prompt as memory grows.

    .venv/bin/python -m bench.memory_ledger

One row per size (the agent's memories and the account's audit rows): the ledger page (first page, a search,
and the last page), the audit log page, and building the refinement prompt as refine_agent does. The query
counts must not grow with the data.
"""

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory
from webapp.models.memories import core_memories, core_token_usage
from webapp.prompting import render
from webapp.timeutil import utcnow

SIZES = [(500, 5_000), (5_000, 50_000)]  # (memories, audit rows)


def _fill(agent, memories: int, audit_rows: int) -> None:
    core = factories.memories(agent, memories // 2)
    factories.memories(agent, memories - memories // 2, "journal")
    db.session.execute(
        sa.update(AgentMemory)
        .where(AgentMemory.id.in_([m.id for m in core[::10]]))
        .values(deleted_at=utcnow())
    )
    db.session.commit()
    factories.audit_rows(agent, [m.id for m in core], audit_rows)


def _get(client, url: str) -> None:
    assert client.get(url).status_code == 200, url
    db.session.expire_all()


def _refinement_prompt(agent) -> str:
    """The refinement prompt exactly as refine_agent builds it (its ledger, usage and budget)."""
    db.session.expire_all()
    memories = db.session.scalars(core_memories(agent.id)).all()
    usage = core_token_usage(agent.id)
    return render(
        "refinement.txt",
        memories=memories,
        usage=usage,
        budget=agent.core_token_budget,
        max_mutations=10,
        floor_percent=50,
    )


def _row(memories: int, audit_rows: int) -> str:
    with bench_app() as app:
        account = factories.account()
        user = factories.user(account)
        agent = factories.agent(account, "Ada")
        _fill(agent, memories, audit_rows)
        client = app.test_client()
        client.post("/login", data={"email": user.email, "password": factories.PASSWORD})
        ledger = f"/admin/agents/{agent.id}/memories"
        last_page = memories // 50
        figures = [
            measure(lambda: _get(client, ledger)),
            measure(lambda: _get(client, f"{ledger}?q=roses+number+4&show=core")),
            measure(lambda: _get(client, f"{ledger}?page={last_page}")),
            measure(lambda: _get(client, "/admin/audit")),
            measure(lambda: _refinement_prompt(agent)),
        ]
    cells = " | ".join(f"{queries:>3} q {ms:>7.1f} ms" for queries, ms in figures)
    return f"{memories:>8,} | {audit_rows:>10,} | {cells}"


def main() -> None:
    columns = ["ledger", "ledger search", "ledger last page", "audit log", "refinement prompt"]
    print(f"{'memories':>8} | {'audit rows':>10} | " + " | ".join(f"{c:>16}" for c in columns))
    for memories, audit_rows in SIZES:
        print(_row(memories, audit_rows))


if __name__ == "__main__":
    main()
