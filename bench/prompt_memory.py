"""What choosing a prompt's memory by relevance costs a reply: build_prompt with and without it.

    .venv/bin/python -m bench.prompt_memory                                   # SQLite
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.prompt_memory   # PostgreSQL

An agent with 10,000 memories among 100,000 (half core, half journal, over the last 90 days), 1,000,000
messages in 10,000 chats; every memory has a vector (random unit vectors, and the local embedder's real ones for
the newest 2,000 of the agent's), so the search is fused as on a real install, and the query is embedded for
real. For each of a few questions asked in a chat of the agent, build_prompt runs BENCH_RUNS times with the
relevance search, with it searching the words of the message alone (no words of the turns around it), and
without it (the memory chosen by recency only, as before issue 20). Prints the p50 and p95 ms of each, its CPU
time, what relevance adds, the SQL statements per build, and whether the answer to the question was in the
prompt. Target: relevance adds under 40 ms p50. BENCH_MEMORIES, BENCH_AGENT_MEMORIES, BENCH_MESSAGES,
BENCH_REAL_VECTORS and BENCH_RUNS change the sizes. BENCH_REUSE=1, with BENCH_DATABASE_URL naming a database an
earlier run loaded, measures it as it is (brought to the latest migration) without loading it again.
"""

import os
import random
import time
from datetime import timedelta
from statistics import median

import numpy as np
import sqlalchemy as sa

from bench.common import bench_app, zipf_text, zipf_vocabulary
from tests import factories
from tests.querycount import count_queries
from webapp import search
from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message
from webapp.prompting import build
from webapp.runtime import set_loaded_aside
from webapp.search import embedder
from webapp.search.indexing import index_memories
from webapp.timeutil import utcnow

MEMORIES = int(os.environ.get("BENCH_MEMORIES", 100_000))
AGENT_MEMORIES = int(os.environ.get("BENCH_AGENT_MEMORIES", 10_000))
MESSAGES = int(os.environ.get("BENCH_MESSAGES", 1_000_000))
REAL_VECTORS = int(os.environ.get("BENCH_REAL_VECTORS", 2_000))
RUNS = int(os.environ.get("BENCH_RUNS", 50))
REUSE = os.environ.get("BENCH_REUSE") == "1"
OTHER_AGENTS, PER_CHAT, BATCH, DIMENSIONS = 9, 100, 20_000, 384
FACTS = {
    "where did I leave the greenhouse key?": "The spare key to the greenhouse is taped under the blue "
    "watering can by the shed.",
    "what did my grandmother say about the birthday cake?": "Dana's grandmother said the birthday cake "
    "needs less sugar and more lemon.",
    "any news on the tulips after the frost?": "The tulips by the gate survived the frost in March.",
}


def _insert(model, rows: list[dict]) -> None:
    for start in range(0, len(rows), BATCH):
        db.session.execute(sa.insert(model), rows[start : start + BATCH])
        db.session.commit()


def _load(rng: random.Random) -> tuple:
    """The measured agent and its chats (one per question), the other agents, their memories and messages."""
    account = factories.account()
    user = factories.user(account)
    agent = factories.agent(account, "Ada", enabled_tools=["save_memory", "recall"])
    others = [factories.agent(account, f"Agent{i}") for i in range(OTHER_AGENTS)]
    words, weights = zipf_vocabulary(rng)
    now = utcnow()

    def memory(owner, content: str, days: float) -> dict:
        return {"agent_id": owner.id, "content": content, "memory_type": rng.choice(["core", "journal"]),
                "constitutional": False, "created_at": now - timedelta(days=days), "updated_at": now}  # fmt: skip

    owners = [agent] * AGENT_MEMORIES + [others[i % OTHER_AGENTS] for i in range(MEMORIES - AGENT_MEMORIES)]
    _insert(AgentMemory, [memory(o, zipf_text(rng, words, weights), rng.uniform(0, 90)) for o in owners])
    for fact in FACTS.values():
        factories.memory(agent, fact, "core")  # added today, through the ledger say
    chats = [Chat(account_id=account.id, title=f"Chat {i}") for i in range(max(1, MESSAGES // PER_CHAT))]
    db.session.add_all(chats)
    db.session.commit()
    members = [agent, *others]
    links = {(c.id, members[(i * k) % len(members)].id) for i, c in enumerate(chats) for k in (1, 3)}
    _insert(ChatAgent, [{"chat_id": c, "agent_id": a} for c, a in links])
    for start in range(0, MESSAGES, BATCH):
        _insert(Message, [
            {"chat_id": chats[i // PER_CHAT].id, "role": "user", "user_id": user.id, "status": "done",
             "content": zipf_text(rng, words, weights), "created_at": now, "updated_at": now}
            for i in range(start, min(start + BATCH, MESSAGES))
        ])  # fmt: skip
    asked = []
    for question in FACTS:
        chat = factories.chat(account, [agent], question)
        for i in range(6):
            factories.message(chat, zipf_text(rng, words, weights), author=user if i % 2 else agent)
        factories.message(chat, question, author=user)
        asked.append(chat)
    return agent, asked


def _loaded() -> tuple:
    """The measured agent and its chats (one per question) of a database an earlier run loaded."""
    agent = db.session.scalars(sa.select(Agent).order_by(Agent.id)).first()
    asked = [db.session.scalars(sa.select(Chat).where(Chat.title == question)).first() for question in FACTS]
    if agent is None or None in asked:
        raise SystemExit("BENCH_REUSE=1: the database at BENCH_DATABASE_URL holds no data of this bench")
    return agent, asked


def _load_vectors(agent, rng: np.random.Generator) -> None:
    """A random unit vector for every memory, then the embedder's own for the first of the agent's."""
    backend = search.backend()
    backend.ensure_vector_tables(DIMENSIONS)
    db.session.commit()
    model = embedder.model_name()
    rows = db.session.execute(sa.select(AgentMemory.id, AgentMemory.agent_id).order_by(AgentMemory.id)).all()
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        vectors = rng.standard_normal((len(batch), DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        backend.store_vectors("memory", [(i, o, model, v) for (i, o), v in zip(batch, vectors, strict=True)])
        db.session.commit()
    mine = db.session.scalars(
        sa.select(AgentMemory.id).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id.desc())
    ).all()
    real = mine[:REAL_VECTORS]  # the facts asked about among them
    for start in range(0, len(real), 256):
        index_memories(list(real[start : start + 256]))
        db.session.commit()


def _timed(chats: list, agent) -> tuple[float, float, float, int]:
    """(p50 ms, p95 ms, p50 CPU ms of this process, SQL statements per build) of RUNS builds in each chat. The
    CPU time leaves out waiting for a busy machine's other processes (and, on PostgreSQL, the server's work)."""
    times, cpu, statements = [], [], []
    for _ in range(RUNS):
        for chat in chats:
            db.session.expire_all()
            with count_queries() as counted:
                started, started_cpu = time.perf_counter(), time.process_time()
                build.build_prompt(chat, agent)
                times.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - started_cpu) * 1000)
            db.session.rollback()
            statements.append(counted.count)
    times.sort()
    return median(times), times[int(len(times) * 0.95) - 1], median(cpu), max(statements)


def main() -> None:
    with bench_app(reuse=REUSE) as app:
        dialect = db.engine.dialect.name
        started = time.perf_counter()
        if REUSE:
            agent, chats = _loaded()
        else:
            agent, chats = _load(random.Random(20))
            _load_vectors(agent, np.random.default_rng(20))
        search.backend().refresh_term_stats()
        db.session.commit()
        if dialect == "postgresql":
            db.session.execute(sa.text("ANALYZE"))
            db.session.commit()
        memories = db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory))
        mine = db.session.scalar(sa.select(sa.func.count()).where(AgentMemory.agent_id == agent.id))
        messages = db.session.scalar(sa.select(sa.func.count()).select_from(Message))
        print(
            f"{dialect}: {memories:,} memories ({mine:,} the agent's), {messages:,} messages, "
            f"{'reused' if REUSE else 'loaded'} in {time.perf_counter() - started:.0f} s"
        )
        for chat, fact in zip(chats, FACTS.values(), strict=True):
            prompt = build.build_prompt(chat, agent)
            held = fact in prompt.messages[-1]["content"]
            print(f"  {chat.title!r}: {len(prompt.sources.memory_ids)} memories, the answer held: {held}")
        set_loaded_aside()  # as the worker does: no full collection of the loaded modules is timed
        relevant, context_words = build._relevant_memories, build.QUERY_CONTEXT_WORDS
        with_relevance = _timed(chats, agent)
        build.QUERY_CONTEXT_WORDS = 0
        message_only = _timed(chats, agent)
        build._relevant_memories = lambda *_args, **_kwargs: list  # nothing ranked
        without = _timed(chats, agent)
        build._relevant_memories, build.QUERY_CONTEXT_WORDS = relevant, context_words
        print(f"{'build_prompt':<32} | {'p50 ms':>7} | {'p95 ms':>7} | {'p50 CPU ms':>10} | {'queries':>7}")
        for name, (p50, p95, cpu, queries) in (
            ("with relevance", with_relevance),
            ("  the message's words only", message_only),
            ("recency only (before issue 20)", without),
        ):
            print(f"{name:<32} | {p50:>7.1f} | {p95:>7.1f} | {cpu:>10.1f} | {queries:>7}")
        print(
            f"relevance adds {with_relevance[0] - without[0]:.1f} ms p50 ({with_relevance[2] - without[2]:.1f} ms "
            f"of CPU), {message_only[0] - without[0]:.1f} ms with the message's words only; target < 40 ms. "
            f"Load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs."
        )
        app.logger.info("done")


if __name__ == "__main__":
    main()
