"""Retrieval quality on LoCoMo: how often recall brings back the turns that answer a question.

    .venv/bin/python -m bench.locomo                                    # SQLite
    .venv/bin/python -m bench.locomo --memories observations --data DIR  # with memories, any LoCoMo files
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.locomo   # PostgreSQL

Each conversation of --data (a folder of LoCoMo conversation files; ../shared/data/locomo-dev, or LOCOMO_DIR, by
default) becomes one chat between its two people and an
agent, one message per turn at its session's date (a shared photo as its caption). Every question but the
unanswerable ones (category 5) is asked of the agent's search; R@k is the mean share of a question's evidence
turns among the first k results, hit@k the share of questions with one at least. A message result counts with
the turns around it, as recall offers them to the model.

Printed per category: word search alone, vector search alone, both fused, recall's own results (fused, with
neighbours, within its token budget: what a model gets) and a plain Okapi BM25 over the same turns (no
stemming, no neighbours) for reference. Embeddings are cached in ~/.cache/cairn/locomo-embeddings.npz.

With --memories observations, each session's observations (LoCoMo's facts about each speaker, each citing the
turns it is drawn from) then become the agent's memories of the chat, dated as their session, with those turns
as their sources, as consolidation would have written them; the questions are asked again, and `memories` is
recall's results with them (a memory hit counts with its source turns, as recall shows them).
"""

import argparse
import hashlib
import json
import math
import os
import re
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from bench.common import bench_app
from tests import factories
from webapp import search
from webapp.extensions import db
from webapp.models import AgentMemory, ChatAgent, MemorySource, Message
from webapp.search import embedder, indexing
from webapp.search.terms import STOP_WORDS
from webapp.tools import ToolContext
from webapp.tools.recall import recall

DATA = Path(os.environ.get("LOCOMO_DIR", Path(__file__).resolve().parents[2] / "shared/data/locomo-dev"))
CACHE = Path.home() / ".cache/cairn/locomo-embeddings.npz"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
K = (5, 10)


class CachedEmbedder:
    """The local embedder, remembering every text's vector across runs (the bench embeds the same turns)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cache: dict[str, np.ndarray] = dict(np.load(CACHE)) if CACHE.exists() else {}
        self.added = 0

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
        missing = [i for i, key in enumerate(keys) if key not in self.cache]
        if missing:
            vectors, _ = self.inner.embed([texts[i] for i in missing])
            for i, vector in zip(missing, vectors, strict=True):
                self.cache[keys[i]] = vector
            self.added += len(missing)
        return np.array([self.cache[key] for key in keys]), 0

    def save(self) -> None:
        if self.added:
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            np.savez(CACHE, **self.cache)


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%I:%M %p on %d %B, %Y")


def _load(conversation: dict, account, index: int) -> tuple:
    """The conversation as a chat; returns (agent, chat, {dia_id: message id}, [(dia_id, text)])."""
    agent = factories.agent(account, f"Agent{index}")
    people = {
        name: factories.user(account, f"p{index}-{n}@example.com", role="member")
        for n, name in enumerate((conversation["speaker_a"], conversation["speaker_b"]))
    }
    for name, person in people.items():
        person.name = name
    chat = factories.chat(account, [agent], f"Conversation {index}")
    turns = []
    sessions = sorted(
        (int(key.split("_")[1]) for key in conversation if re.fullmatch(r"session_\d+", key)),
    )
    rows = []
    for number in sessions:
        start = _when(conversation[f"session_{number}_date_time"])
        for offset, turn in enumerate(conversation[f"session_{number}"]):
            text = turn["text"] + (
                f" [shares a photo: {turn['blip_caption']}]" if turn.get("blip_caption") else ""
            )
            at = start + timedelta(seconds=30 * offset)
            rows.append(
                {"chat_id": chat.id, "role": "user", "user_id": people[turn["speaker"]].id, "status": "done",
                 "content": text, "created_at": at, "updated_at": at}
            )  # fmt: skip
            turns.append((turn["dia_id"], text))
    db.session.execute(sa.insert(Message), rows)
    db.session.commit()
    ids = db.session.scalars(
        sa.select(Message.id).where(Message.chat_id == chat.id).order_by(Message.id)
    ).all()
    return agent, chat, {dia: i for (dia, _), i in zip(turns, ids, strict=True)}, turns


def _evidence(question: dict, known: dict) -> set[str]:
    found = set()
    for item in question.get("evidence", []):
        for part in re.split(r"[;,\s]+", item):
            if part in known:
                found.add(part)
    return found


class Okapi:
    """Plain Okapi BM25 (k1 1.2, b 0.75) over lowercased words without stop words: the reference."""

    def __init__(self, turns: list[tuple[str, str]]) -> None:
        self.ids = [dia for dia, _ in turns]
        self.docs = [Counter(self._words(text)) for _, text in turns]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.mean = sum(self.lengths) / len(self.lengths)
        frequency = Counter(w for d in self.docs for w in d)
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in frequency.items()}

    @staticmethod
    def _words(text: str) -> list[str]:
        return [w for w in re.findall(r"[^\W_]+", text.casefold()) if w not in STOP_WORDS]

    def top(self, question: str, k: int) -> list[list[str]]:
        words = self._words(question)
        scores = []
        for i, doc in enumerate(self.docs):
            norm = 1.2 * (0.25 + 0.75 * self.lengths[i] / self.mean)
            score = sum(self.idf.get(w, 0) * doc[w] * 2.2 / (doc[w] + norm) for w in words if w in doc)
            scores.append(score)
        best = sorted(range(len(scores)), key=lambda i: -scores[i])[:k]
        return [[self.ids[i]] for i in best if scores[i] > 0]


def _score(results: list[list[str]], evidence: set[str], k: int) -> tuple[float, bool]:
    seen = {dia for result in results[:k] for dia in result}
    found = len(evidence & seen)
    return found / len(evidence), found > 0


def main() -> None:
    parser = argparse.ArgumentParser(description="Recall's retrieval quality on LoCoMo conversations.")
    parser.add_argument("--data", type=Path, default=DATA, help="a folder of LoCoMo conversation files")
    parser.add_argument("--memories", choices=["observations"], help="ask again with these as the memories")
    arguments = parser.parse_args()
    run(arguments.data, arguments.memories)


def run(data: Path, memories: str | None) -> None:
    conversations = sorted(data.glob("*.json"))
    with bench_app() as app:
        app.config["RECALL_MAX_RESULTS"] = 10
        dialect = db.engine.dialect.name
        cached = CachedEmbedder(embedder._local())
        embedder._local_embedder = cached
        account = factories.account()
        loaded = []
        started = time.perf_counter()
        for index, path in enumerate(conversations):
            agent, chat, ids, turns = _load(json.loads(path.read_text()), account, index)
            indexing.index_messages(list(ids.values()))
            db.session.commit()
            loaded.append((json.loads(path.read_text()), agent, chat, ids, turns))
        search.backend().refresh_term_stats()
        db.session.commit()
        if dialect == "postgresql":
            db.session.execute(sa.text("ANALYZE"))
            db.session.commit()
        cached.save()
        print(f"{dialect}: {len(loaded)} conversations, {sum(len(t) for *_, t in loaded):,} turns loaded and embedded "
              f"in {time.perf_counter() - started:.0f} s")  # fmt: skip
        scores: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        asked = time.perf_counter()
        for conversation, agent, chat, ids, turns in loaded:
            by_id = {i: dia for dia, i in ids.items()}
            by_text = {_key(text): dia for dia, text in turns}
            chats = sa.select(ChatAgent.chat_id).where(ChatAgent.agent_id == agent.id)
            okapi = Okapi(turns)
            reply = factories.message(chat, "", author=agent, status="streaming")
            context = ToolContext(agent=agent, chat=chat, message=reply)
            for category, text, evidence in _questions(conversation, ids):
                vector = search.query_vector(text)
                runs = {
                    "words": _turns(search.messages(chats, text, 10), by_id),
                    "vectors": _turns(_dense_only(chats, text, vector), by_id),
                    "fused": _turns(search.messages(chats, text, 10, vector=vector), by_id),
                    "recall": _recalled(recall(context, text), by_text),
                    "okapi": okapi.top(text, 10),
                }
                for name, results in runs.items():
                    for group in (category, "all"):
                        scores[name][group].append([_score(results, evidence, k) for k in K])
        if memories == "observations":
            started = time.perf_counter()
            count = sum(
                _observations(conversation, agent, chat, ids) for conversation, agent, chat, ids, _ in loaded
            )
            search.backend().refresh_term_stats()
            db.session.commit()
            cached.save()
            print(f"{count:,} observations loaded as memories in {time.perf_counter() - started:.0f} s")
            for conversation, agent, chat, ids, turns in loaded:
                by_text = {_key(text): dia for dia, text in turns}
                reply = factories.message(chat, "", author=agent, status="streaming")
                context = ToolContext(agent=agent, chat=chat, message=reply)
                for category, text, evidence in _questions(conversation, ids):
                    results = _recalled(recall(context, text), by_text)
                    for group in (category, "all"):
                        scores["memories"][group].append([_score(results, evidence, k) for k in K])
        _print(scores)
        print(
            f"{sum(len(v) for v in scores['okapi'].values()) // 2} questions in {time.perf_counter() - asked:.0f} s"
        )
        app.logger.info("done")


def _questions(conversation: dict, ids: dict) -> list[tuple[str, str, set[str]]]:
    """(category, question, evidence dia_ids) of each answerable question with evidence among the turns."""
    asked = []
    for question in conversation["qa"]:
        category = CATEGORIES.get(question["category"])
        evidence = _evidence(question, ids)
        if category is not None and evidence:
            asked.append((category, question["question"], evidence))
    return asked


def _observations(conversation: dict, agent, chat, ids: dict) -> int:
    """Each session's observations as the agent's memories of the chat, with the turns they cite as sources."""
    rows, cited = [], []
    for key, by_speaker in conversation.items():
        if not re.fullmatch(r"session_\d+_observation", key):
            continue
        at = _when(conversation[key.replace("_observation", "_date_time")])
        for observations in by_speaker.values():
            for text, *refs in observations:
                rows.append({"agent_id": agent.id, "content": text, "memory_type": "journal", "chat_id": chat.id,
                             "audience": "chat", "created_at": at, "updated_at": at})  # fmt: skip
                flat = [r for ref in refs for r in (ref if isinstance(ref, list) else [ref])]
                cited.append(_evidence({"evidence": flat}, ids))
    memories = [AgentMemory(**row) for row in rows]  # the model's validators set its hash and tokens
    db.session.add_all(memories)
    db.session.flush()
    db.session.execute(
        sa.insert(MemorySource),
        [
            {"memory_id": m.id, "message_id": ids[dia]}
            for m, dias in zip(memories, cited, strict=True)
            for dia in dias
        ],
    )
    db.session.commit()
    indexing.index_memories([m.id for m in memories])
    db.session.commit()
    return len(memories)


def _dense_only(chats, text: str, vector) -> list:
    if vector.result() is None:
        return []
    chat_ids = db.session.scalars(chats).all()
    nearest = search.nearest("message", vector.result(), chat_ids, None, 10)
    return search.excerpts([i for i, _ in nearest])


def _turns(excerpts: list, by_id: dict) -> list[list[str]]:
    return [[by_id[t.id] for t in e.turns if t.id in by_id] for e in excerpts]


def _recalled(answer: dict, by_text: dict) -> list[list[str]]:
    """The dia_ids of the turns in each of recall's results, found by their text (an excerpt's line is
    "[date] Author: text")."""
    return [
        [
            by_text[_key(line.split(": ", 1)[1])]
            for line in hit.get("excerpt", "").splitlines()
            if _key(line.split(": ", 1)[1]) in by_text
        ]
        for hit in answer["results"]
    ]


def _key(text: str) -> str:
    return " ".join(text.split())[:60]


def _print(scores: dict) -> None:
    groups = ["all", *CATEGORIES.values()]
    print(f"{'search':<8} | {'questions':<11} | {'n':>4} | {'R@5':>5} | {'R@10':>5} | {'hit@10':>6}")
    for group in groups:
        for name, by_group in scores.items():
            rows = by_group[group]
            if not rows:
                continue
            r5 = sum(r[0][0] for r in rows) / len(rows)
            r10 = sum(r[1][0] for r in rows) / len(rows)
            hit10 = sum(r[1][1] for r in rows) / len(rows)
            print(f"{name:<8} | {group:<11} | {len(rows):>4} | {r5:>5.3f} | {r10:>5.3f} | {hit10:>6.3f}")


if __name__ == "__main__":
    main()
