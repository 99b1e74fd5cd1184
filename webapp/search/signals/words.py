"""Evidence by words: BM25 in each database (webapp.search.sqlite, webapp.search.postgres)."""

import functools

import sqlalchemy as sa

from webapp.extensions import db
from webapp.search.databases import backend
from webapp.search.signals import Evidence, Hits, Query
from webapp.search.terms import Match, terms


def _lexical(query: Query) -> Hits:
    """(id, score) of the best word matches, best first (the score is BM25: higher is better)."""
    words = terms(query.text)
    if not words:
        return []
    # Ordered as it is selected: wrapped in a subquery, SQLite computes bm25() twice for every match.
    hits = backend().lexical(query.model, words, Match.ANY_WORD, query.scope)
    rows = db.session.execute(hits.order_by(sa.literal_column("rank")).limit(query.candidates))
    return [(row.id, -row.rank) for row in rows]


# Searched on the caller's connection once asked, while the meaning's may run on a thread of its own.
EVIDENCE = Evidence("words", lambda query: functools.partial(_lexical, query))
