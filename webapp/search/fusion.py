"""How ranked lists are fused into one (fused), and the list the memories found give the turns they came from
(drawn_from, measured in webapp.search's notes)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DRAWN_FROM_WEIGHT = 1.0  # of the list of turns the memories found came from (drawn_from)
SOURCES_COUNTED = 4  # a memory drawn from more turns (a whole chunk) points at none of them


@dataclass(frozen=True)
class Signal:
    """One ranked list of (id, score), higher is better, and its weight in the fused ranking. A row that this
    list alone found counts only when it scores at least `alone_at_least` (a row found by meaning alone must be
    MIN_SIMILARITY close). A new kind of evidence is one more module of webapp.search.signals."""

    hits: list[tuple[int, float]]
    weight: float = 1.0
    alone_at_least: float = float("-inf")


def fused(signals: Sequence[Signal]) -> list[tuple[int, float]]:
    """(id, score) of every row of the signals' ranked lists, best first: each list's scores as z-scores times its
    weight, a row missing from a list scoring that list's lowest."""
    found = [{i for i, _ in signal.hits} for signal in signals]
    combined: dict[int, float] = {}
    ranked = []
    for n, signal in enumerate(signals):
        elsewhere = set().union(*(ids for m, ids in enumerate(found) if m != n))
        kept = [(i, score) for i, score in signal.hits if score >= signal.alone_at_least or i in elsewhere]
        z = _z_scores(kept)
        ranked.append((signal.weight, z, min(z.values(), default=0.0)))
        combined.update(dict.fromkeys(z, 0.0))
    for i in combined:
        combined[i] = sum(weight * z.get(i, floor) for weight, z, floor in ranked)
    return sorted(combined.items(), key=lambda hit: -hit[1])


def drawn_from(memories: list[tuple[int, float]], sources: dict[int, list[int]]) -> Signal:
    """The turns the memories found (id, fused score; memory_hits) came from (their `sources`), each scoring its
    best memory's score: what makes a memory's match count toward its turns in `messages`. A memory drawn from
    more than SOURCES_COUNTED turns gives them nothing."""
    scores: dict[int, float] = {}
    for memory_id, score in memories:
        turns = sources.get(memory_id, [])
        for turn in turns if len(turns) <= SOURCES_COUNTED else []:
            scores[turn] = max(score, scores.get(turn, score))
    return Signal(sorted(scores.items(), key=lambda hit: -hit[1]), DRAWN_FROM_WEIGHT)


def _z_scores(hits: list[tuple[int, float]]) -> dict[int, float]:
    if not hits:
        return {}
    scores = np.array([s for _, s in hits], dtype=np.float64)
    z = (scores - scores.mean()) / (scores.std() or 1.0)
    return {i: float(score) for (i, _), score in zip(hits, z, strict=True)}
