"""What search keeps beside the searched tables (webapp.search uses them)."""

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import db
from webapp.timeutil import utcnow

EMBEDDED_KINDS = ("memory", "message")


class EmbeddingQueue(db.Model):
    """A memory or message written since its vector was: the embedding job's work to do, recorded in the
    same transaction as the write, so neither a lost job nor a Redis outage loses it."""

    __tablename__ = "embedding_queue"
    __table_args__ = (sa.UniqueConstraint("kind", "row_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(10))  # "memory" or "message"
    row_id: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SearchTermStats(db.Model):
    """PostgreSQL's BM25: how many rows of a table hold each (stemmed) word, as last counted."""

    __tablename__ = "search_term_stats"

    table_name: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    term: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    docs: Mapped[int]


class SearchTableStats(db.Model):
    """PostgreSQL's BM25: the rows of a table and their mean length in distinct words, as last counted."""

    __tablename__ = "search_table_stats"

    table_name: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    docs: Mapped[int]
    mean_length: Mapped[float] = mapped_column(sa.Float)
