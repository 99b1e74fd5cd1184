"""Keeping PostgreSQL's word statistics fresh: BM25 weighs a word by how many rows hold it (webapp.search.postgres).
SQLite's FTS5 keeps its own, so there the job does nothing."""

from webapp import search
from webapp.extensions import db
from webapp.jobs.queue import recorded_job


@recorded_job("refresh_search_statistics", unique="queued")
def refresh_term_stats() -> dict[str, str]:
    """Count again how many memories and messages hold each word, and their mean length (hourly)."""
    search.backend().refresh_term_stats()
    db.session.commit()
    return {"database": db.engine.dialect.name}
