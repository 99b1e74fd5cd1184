"""The kinds of evidence a search ranks by (words, meaning), one module per kind, whose EVIDENCE the registry
finds (discover): a new kind is its own file. webapp.search fuses every one found, weighted as each says."""

import importlib
import pkgutil
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from webapp.models import AgentMemory

Hits = list[tuple[int, float]]  # (id, score), higher is better, best first


@dataclass(frozen=True)
class Query:
    """What a search is asked, as each kind of evidence is given it."""

    model: type  # AgentMemory or Message: what is searched
    text: str
    scope: tuple[sa.ColumnElement[bool], ...]  # conditions on the model's table, its owners' included
    owners: list[int]  # the agent's id (memories) or the chats' ids (messages)
    vector: Future[np.ndarray | None] | None  # the query's embedding (webapp.search.query_vector), if any
    candidates: int  # how many hits each kind gives
    meanwhile: bool = True  # whether a kind may search on a thread of its own while the others do (meaning)

    @property
    def kind(self) -> str:
        return "memory" if self.model is AgentMemory else "message"


@dataclass(frozen=True)
class Evidence:
    """One kind of evidence: `search` starts its search for a query and returns what gives its hits once asked (so
    one may run while another does), weighted `weight` in the fused ranking. A row it alone found counts only
    when it scores at least `alone_at_least`."""

    name: str
    search: Callable[[Query], Callable[[], Hits]]
    weight: float = 1.0
    alone_at_least: float = float("-inf")


FIRST = ("words", "meaning")  # then the others by name: fused in this order, ties rank as they always did

# Every kind of evidence, in the order fused: filled by discover(), in place.
REGISTRY: list[Evidence] = []


def discover() -> None:
    """Fill the registry with the EVIDENCE of every module of this package, so a new kind is one new file."""
    found = []
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        evidence = getattr(importlib.import_module(module.name), "EVIDENCE", None)
        if isinstance(evidence, Evidence):
            found.append(evidence)
    found.sort(key=lambda e: (FIRST.index(e.name) if e.name in FIRST else len(FIRST), e.name))
    REGISTRY[:] = found


discover()
