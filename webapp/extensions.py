"""Extensions are created here and bound to an app in the factory."""

import sqlalchemy as sa
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase

DATABASE_ID_MAX = 2**31 - 1  # integer primary keys: no row has a larger id

# JSON columns are JSONB on PostgreSQL.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class Base(DeclarativeBase):
    # Named constraints let Alembic's batch mode alter them on SQLite.
    metadata = sa.MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


db = SQLAlchemy(model_class=Base)
migrate = Migrate()
login_manager = LoginManager()
csrf = CSRFProtect()
# Only the limits declared on views apply (no default limit); storage is the app's Redis (webapp.limits).
limiter = Limiter(key_func=get_remote_address)


@sa.event.listens_for(sa.engine.Engine, "connect")
def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """SQLite is shared by the web and worker processes: wait for locks, write ahead, enforce foreign keys."""
    if type(dbapi_connection).__module__.startswith(("sqlite3", "pysqlite3")):
        _load_sqlite_vec(dbapi_connection)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()


def _load_sqlite_vec(dbapi_connection) -> None:
    """The vector index (webapp.search.sqlite), where this SQLite may load extensions; search is by words
    only where it may not."""
    if not hasattr(dbapi_connection, "enable_load_extension"):
        return
    import sqlite_vec

    dbapi_connection.enable_load_extension(True)
    try:
        sqlite_vec.load(dbapi_connection)
    finally:
        dbapi_connection.enable_load_extension(False)
