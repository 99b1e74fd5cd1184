"""Which database's search module is in use (backend): one interface, a module per database behind it
(webapp.search.sqlite, webapp.search.postgres)."""

from types import ModuleType

from webapp.extensions import db


def backend() -> ModuleType:
    """The search module of the database in use."""
    from webapp.search import postgres, sqlite

    return sqlite if db.engine.dialect.name == "sqlite" else postgres
