"""Keeping the search statistics fresh: on PostgreSQL, how many rows hold each word, by which BM25 weighs a word
(webapp.search.postgres); on SQLite, whose FTS5 keeps its own, the query planner's statistics (ANALYZE)."""

from webapp import search
from webapp.extensions import db
from webapp.jobs.queue import recorded_job


@recorded_job("refresh_search_statistics", "Refresh search statistics", unique="queued")
def refresh_term_stats() -> dict[str, str]:
    """Count again how many memories and messages hold each word, and their mean length; on SQLite, refresh the
    query planner's statistics (hourly)."""
    search.backend().refresh_term_stats()
    db.session.commit()
    return {"database": db.engine.dialect.name}
