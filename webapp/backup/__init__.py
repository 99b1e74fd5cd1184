"""Backups: the whole install in one file (export.py), loaded into an empty database of either kind (restore.py).

The file is gzip'd JSON lines (format.py): a header naming the format, Cairn's version, the schema revision and
each table's columns; then each table as a line {"table": name} followed by one JSON array per row, in the order
of its primary key; then a trailer with the rows of each table and the SHA-256 of every byte before it, so a
file cut short or edited is refused. Every table of the models is in it except what is derived (DERIVED), which
an import rebuilds (`flask memories reindex`): the words' statistics, the embedding queue, and the full-text and
vector indexes, which live outside the models.
"""

import importlib.metadata
import tomllib
from pathlib import Path

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from flask import current_app

from webapp.extensions import db

# Rebuilt from the rest after an import: the words' statistics (PostgreSQL's BM25), and the rows waiting for
# their vectors (the import embeds every row lacking one). The FTS5 tables, the tsvector columns and the vector
# tables are not in the models at all (migrations and webapp.search make them).
DERIVED = frozenset({"search_term_stats", "search_table_stats", "embedding_queue"})


class BackupError(Exception):
    """What is wrong with a file or a database, in a sentence for the person running the command."""


def tables() -> list[sa.Table]:
    """The tables a backup holds, each after those it refers to (the order of insertion)."""
    return [table for table in db.metadata.sorted_tables if table.name not in DERIVED]


def cairn_version() -> str:
    try:
        return importlib.metadata.version("cairn")
    except importlib.metadata.PackageNotFoundError:  # the image runs the code as it is, not installed
        with open(Path(__file__).parents[2] / "pyproject.toml", "rb") as project:
            return tomllib.load(project)["project"]["version"]


def schema_revision(connection: sa.Connection) -> str | None:
    """The database's schema revision (alembic_version), None before any migration ran."""
    return MigrationContext.configure(connection).get_current_revision()


def migrations() -> ScriptDirectory:
    """This install's migrations: which schema revisions it knows, and its newest."""
    return ScriptDirectory(current_app.extensions["migrate"].directory)


def newest_revision() -> str:
    return migrations().get_current_head()
