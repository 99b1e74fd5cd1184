"""Queries and server time of the chat page and of prompt assembly as a chat grows.

    .venv/bin/python -m bench.chat_page

Prints one row per chat size (10, 1,000 and 10,000 messages; the agent has 500 memories). The query counts
must not grow with the data.
"""

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory, Message
from webapp.prompting.build import build_prompt
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

SIZES = [10, 1_000, 10_000]
MEMORIES = 500


def _fill(chat, user, agent, count: int) -> None:
    rows = []
    for i in range(count):
        mine = i % 2 == 1
        rows.append(
            {
                "chat_id": chat.id,
                "role": "assistant" if mine else "user",
                "agent_id": agent.id if mine else None,
                "user_id": None if mine else user.id,
                "content": f"Message {i}: " + "some words about roses and shade " * 3,
                "status": "done",
                "created_at": utcnow(),
                "updated_at": utcnow(),
            }
        )
    db.session.execute(sa.insert(Message), rows)
    db.session.commit()


def _memories(agent) -> None:
    rows = [
        AgentMemory(agent_id=agent.id, content=f"Memory {i}: Dana likes roses number {i}.", memory_type=kind)
        for i in range(MEMORIES)
        for kind in ["core" if i % 2 else "journal"]
    ]
    db.session.add_all(rows)
    db.session.commit()


def _get_page(client, url: str) -> None:
    assert client.get(url).status_code == 200
    db.session.expire_all()


def _prompt(chat, agent) -> list[dict]:
    db.session.expire_all()
    return build_prompt(chat, agent).messages


def _row(size: int) -> str:
    with bench_app() as app:
        account = factories.account()
        user = factories.user(account)
        agent = factories.agent(account, "Ada")
        chat = factories.chat(account, [agent])
        _fill(chat, user, agent, size)
        _memories(agent)
        client = app.test_client()
        client.post("/login", data={"email": user.email, "password": factories.PASSWORD})
        page_queries, page_ms = measure(lambda: _get_page(client, f"/chats/{chat.id}"))
        prompt_queries, prompt_ms = measure(lambda: _prompt(chat, agent))
        tokens = sum(count_tokens(m["content"]) for m in _prompt(chat, agent))
    return f"{size:>9,} | {page_queries:>12} | {page_ms:>8.1f} | {prompt_queries:>14} | {prompt_ms:>9.1f} | {tokens:>13,}"


def main() -> None:
    print(
        f"{'messages':>9} | {'page queries':>12} | {'page ms':>8} | {'prompt queries':>14} | {'prompt ms':>9} | {'prompt tokens':>13}"
    )
    for size in SIZES:
        print(_row(size))


if __name__ == "__main__":
    main()
