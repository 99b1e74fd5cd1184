"""SQLite's schema holds still once migrated: no job or command changes it while other connections work.

A statement another connection is preparing while the schema changes fails ("vtable constructor failed:
messages_fts", "database schema has changed"): a reply failed so when the first embedding made the vector tables
beside it. PostgreSQL changes its schema transactionally, and makes its vector tables (pgvector) at first use.
"""

import pytest
import sqlalchemy as sa

from tests import factories
from tests.conftest import POSTGRES_URL
from webapp.extensions import db
from webapp.jobs.embeddings import embed_queued
from webapp.jobs.term_stats import refresh_term_stats

pytestmark = pytest.mark.skipif(bool(POSTGRES_URL), reason="SQLite's own schema cookie")


def _schema_version() -> int:
    return db.session.scalar(sa.text("PRAGMA schema_version"))


def test_the_first_embedding_the_hourly_statistics_and_a_reindex_change_no_schema(app, admin, runner):
    ada = factories.agent(admin.account, "Ada")
    factories.memory(ada, "The greenhouse key is under the can.")
    factories.message(factories.chat(admin.account, [ada]), "Where is the greenhouse key?")
    db.session.commit()
    migrated = _schema_version()

    assert embed_queued()["memories"] == 1
    assert refresh_term_stats() == {"database": "sqlite"}
    assert runner.invoke(args=["memories", "reindex"]).exit_code == 0
    db.session.commit()

    assert _schema_version() == migrated
    assert db.session.scalar(sa.text("SELECT count(*) FROM memory_vectors")) == 1
    assert db.session.scalar(sa.text("SELECT count(*) FROM sqlite_stat1 WHERE tbl = 'messages'"))
