"""`flask backup export`: every table of the install (webapp.backup.tables), read in one snapshot, streamed into
one file a batch of rows at a time, so memory stays flat however many messages there are.

One snapshot: the export reads inside one transaction, REPEATABLE READ and read only on PostgreSQL, a read
transaction on SQLite (whose write-ahead log keeps what it began with); people may go on chatting meanwhile, and
the file holds the install as it was at its first read, each message with its chat.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from webapp.backup import BackupError, cairn_version, schema_revision, tables
from webapp.backup.format import FORMAT, FORMAT_VERSION, Writer, encoder, is_json
from webapp.extensions import db
from webapp.timeutil import utcnow

BATCH = 1000  # rows fetched at a time (a server-side cursor on PostgreSQL)

Step = Callable[[str, int, int], None]  # (table, rows written, rows in all) after each batch


def export(path: str | Path, step: Step | None = None) -> dict[str, int]:
    """Write the whole install to path; the rows of each table."""
    exported = tables()
    with snapshot() as connection:
        revision = schema_revision(connection)
        if revision is None:
            raise BackupError(
                "This database has no Cairn schema (run `flask db upgrade`): nothing to export."
            )
        total = sum(_count(connection, table) for table in exported)
        out = Writer(path)
        try:
            out.write(_header(connection, revision, exported))
            rows, done = {}, 0
            for table in exported:
                out.write({"table": table.name})
                rows[table.name] = 0
                for batch in _batches(connection, table):
                    for row in batch:
                        out.write(row)
                    rows[table.name] += len(batch)
                    done += len(batch)
                    if step is not None:
                        step(table.name, done, total)
            out.finish(rows)
        except BaseException:
            out.abandon()
            raise
    return rows


@contextmanager
def snapshot() -> Iterator[sa.Connection]:
    """A connection whose reads all see the database as it was at the first of them."""
    with db.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with connection.begin():
            if connection.dialect.name == "sqlite":
                # SQLite's driver begins a transaction only before a write: without this, each read would be
                # a transaction of its own, and see what was written since the one before.
                connection.exec_driver_sql("BEGIN")
            yield connection


def _count(connection: sa.Connection, table: sa.Table) -> int:
    return connection.scalar(sa.select(sa.func.count()).select_from(table))


def _header(connection: sa.Connection, revision: str, exported: list[sa.Table]) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "cairn": cairn_version(),
        "schema": revision,
        "database": connection.dialect.name,
        "created_at": utcnow().isoformat(),
        "tables": [{"name": table.name, "columns": [c.name for c in table.columns]} for table in exported],
    }


def _batches(connection: sa.Connection, table: sa.Table) -> Iterator[list[list]]:
    """The table's rows as the file holds them, BATCH at a time, in the order of its primary key."""
    columns = list(table.columns)
    # A JSON column is read as its text: SQL NULL and a JSON null stay apart, and nothing is parsed twice.
    selected = [sa.cast(c, sa.Text).label(c.name) if is_json(c) else c for c in columns]
    query = sa.select(*selected).order_by(*table.primary_key.columns).execution_options(yield_per=BATCH)
    line = encoder(columns)
    for partition in connection.execute(query).partitions():
        yield [line(row) for row in partition]
