"""Memory tokens and total input tokens per reply prompt as an agent's memory grows.

    .venv/bin/python -m bench.memory_prompt

For an agent with 10, 1,000 and 10,000 memories (half core, half journal within the week): the tokens of the
memory section of its reply prompt, the whole prompt, and what the memory would take unbounded, with the
budgets they must stay under. Prints figures; asserts nothing.
"""

from datetime import timedelta

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory
from webapp.prompting.build import build_prompt
from webapp.prompting.window import prompt_tokens
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

SIZES = [10, 1_000, 10_000]
WORDS = "roses shade wall water compost tulips pruning frost seeds birds bees soil".split()


def _memories(agent, count: int) -> int:
    """Add count memories (half core, half journal of the last days); returns their tokens, all listed."""
    now, rows, total = utcnow(), [], 0
    for i in range(count):
        content = f"Memory {i}: the user " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(12)) + "."
        tokens = count_tokens(content)
        total += tokens + 8
        rows.append(
            {"agent_id": agent.id, "content": content, "memory_type": "core" if i % 2 else "journal",
             "constitutional": False, "token_estimate": tokens, "content_hash": f"h{i}",
             "created_at": now - timedelta(seconds=(count - i) * 30), "updated_at": now}
        )  # fmt: skip
    db.session.execute(sa.insert(AgentMemory), rows)
    db.session.commit()
    return total


def _row(size: int) -> str:
    with bench_app() as app:
        account = factories.account()
        user = factories.user(account)
        agent = factories.agent(account, "Ada", enabled_tools=["save_memory", "recall"])
        chat = factories.chat(account, [agent])
        factories.message(chat, "What do you remember about my garden?", author=user)
        unbounded = _memories(agent, size)
        queries, ms = measure(lambda: build_prompt(chat, agent))
        prompt = build_prompt(chat, agent)
        context = prompt.messages[-1]["content"]
        memory = count_tokens(context[context.index("# Your memory") : context.index("# Now")])
        total = prompt_tokens(prompt.messages)
        budgets = f"{app.config['MEMORY_TOKEN_BUDGET']:,} / {app.config['PROMPT_TOKEN_BUDGET']:,}"
    return (
        f"{size:>9,} | {len(prompt.sources.memory_ids):>6,} | {memory:>13,} | {total:>13,} | {budgets:>15} "
        f"| {unbounded:>15,} | {queries:>7} | {ms:>7.1f}"
    )


def main() -> None:
    print(
        f"{'memories':>9} | {'listed':>6} | {'memory tokens':>13} | {'prompt tokens':>13} | {'budgets (m / p)':>15} "
        f"| {'unbounded memory':>15} | {'queries':>7} | {'ms':>7}"
    )
    for size in SIZES:
        print(_row(size))


if __name__ == "__main__":
    main()
