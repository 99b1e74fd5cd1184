"""Small builders for test data."""

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Account, Agent, AgentMemory, Chat, ChatAgent, ChatPerson, Message, User

PASSWORD = "correct horse battery"


def account(name: str = "Acme") -> Account:
    row = Account(name=name)
    db.session.add(row)
    db.session.commit()
    return row


def user(acct: Account, email: str = "dana@example.com", role: str = "admin") -> User:
    row = User(account=acct, email=email, role=role)
    row.set_password(PASSWORD)
    db.session.add(row)
    db.session.commit()
    return row


def agent(acct: Account, name: str = "Ada", **fields) -> Agent:
    fields.setdefault("model_id", f"{name.lower()}-model")
    fields.setdefault("enabled_tools", ["save_memory"])
    # As every agent made before issue 23: refinement applies at once. Tests of staged review ask for "staged".
    fields.setdefault("background_changes", "automatic")
    row = Agent(account=acct, name=name, **fields)
    db.session.add(row)
    db.session.commit()
    return row


def chat(
    acct: Account,
    agents: list[Agent],
    title: str = "",
    manual: bool | None = None,
    people: list[User] = (),
    remembers: bool = True,
) -> Chat:
    """A chat of the agents: private to `people` (the first started it) when given, else shared with the
    account (as every chat made before chats had people)."""
    row = Chat(
        account_id=acct.id,
        title=title,
        manual_responses=len(agents) > 1 if manual is None else manual,
        visibility="private" if people else "shared",
        started_by_id=people[0].id if people else None,
        chat_people=[ChatPerson(user_id=p.id) for p in people],
        remembers=remembers,
    )
    row.chat_agents = [ChatAgent(agent=a) for a in agents]
    db.session.add(row)
    db.session.commit()
    return row


def add_person(chat_row: Chat, person: User) -> None:
    db.session.add(ChatPerson(chat_id=chat_row.id, user_id=person.id))
    db.session.commit()


def message(chat_row: Chat, content: str, *, author: User | Agent | None = None, **fields) -> Message:
    if isinstance(author, Agent):
        fields.update(role="assistant", agent=author)
    else:
        fields.update(role=fields.get("role", "user"), user=author)
    row = chat_row.add_message(content=content, status=fields.pop("status", "done"), **fields)
    db.session.commit()
    return row


def memory(agent_row: Agent, content: str, memory_type: str = "core", **fields) -> AgentMemory:
    row = AgentMemory(agent_id=agent_row.id, content=content, memory_type=memory_type, **fields)
    db.session.add(row)
    db.session.commit()
    return row


def llm_call(agent_row: Agent | None, **fields):
    """One row of the cost ledger; `created_at` and the token counts are what usage tests vary."""
    from webapp.models import LlmCall

    fields.setdefault("purpose", "reply")
    fields.setdefault("model", agent_row.model_id if agent_row else "no-agent-model")
    fields.setdefault("status", "ok")
    row = LlmCall(agent_id=agent_row.id if agent_row else None, **fields)
    db.session.add(row)
    db.session.commit()
    return row


def embedding_calls():
    """The cost ledger's embedding rows, oldest first, once the rows set aside are written: a query's row is
    written by the ledger's thread a moment after its vector (webapp.llm.ledger.write_aside)."""
    from webapp.llm import ledger
    from webapp.models import LlmCall

    ledger.wait_for_rows_aside()
    return list(
        db.session.scalars(sa.select(LlmCall).where(LlmCall.purpose == "embedding").order_by(LlmCall.id))
    )


def job_run(acct: Account | None, job_type: str = "reply", **fields):
    """A recorded job run of the account (None: a run across accounts)."""
    from webapp.models import JobRun

    fields.setdefault("status", "done")
    fields.setdefault("args", [])
    row = JobRun(job_type=job_type, account_id=acct.id if acct else None, **fields)
    db.session.add(row)
    db.session.commit()
    return row


def summary(chat_row: Chat, agent_row: Agent, text: str, **fields) -> ChatAgent:
    """Give the agent's row in the chat a summary (spec 003); `agent_summary_generated_at` defaults to now."""
    import sqlalchemy as sa

    from webapp.timeutil import utcnow

    row = db.session.scalar(
        sa.select(ChatAgent).where(ChatAgent.chat_id == chat_row.id, ChatAgent.agent_id == agent_row.id)
    )
    row.agent_summary = text
    row.agent_summary_generated_at = fields.pop("generated_at", utcnow())
    for name, value in fields.items():
        setattr(row, name, value)
    db.session.commit()
    return row


def memories(agent_row: Agent, count: int, memory_type: str = "core", **fields) -> list[AgentMemory]:
    """`count` memories of the agent ("Memory 0: …", …) added in one commit, for pages and benchmarks."""
    rows = [
        AgentMemory(
            agent_id=agent_row.id,
            content=f"Memory {i}: Dana likes roses number {i}.",
            memory_type=memory_type,
            **fields,
        )
        for i in range(count)
    ]
    db.session.add_all(rows)
    db.session.commit()
    return rows


def audit_rows(agent_row: Agent, memory_ids: list[int], count: int, **fields) -> None:
    """`count` audit rows of edits to the agent's memories (cycling through memory_ids), bulk-inserted."""
    import sqlalchemy as sa

    from webapp.models import AuditLog
    from webapp.timeutil import utcnow

    def snapshot(text: str) -> dict:
        return {"content": text, "memory_type": "core", "constitutional": False, "deleted_at": None}

    rows = [
        {
            "account_id": agent_row.account_id,
            "agent_id": agent_row.id,
            "action": "memory_update",
            "auditable_type": "AgentMemory",
            "auditable_id": memory_ids[i % len(memory_ids)],
            "data": {"before": snapshot(f"old text {i}"), "after": snapshot(f"new text {i}"), "via": "bench"},
            "created_at": utcnow(),
            **fields,
        }
        for i in range(count)
    ]
    db.session.execute(sa.insert(AuditLog), rows)
    db.session.commit()
