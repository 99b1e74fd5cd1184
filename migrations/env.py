import logging
from logging.config import fileConfig

from alembic import context
from flask import current_app

# this is the Alembic Config object, which provides
# access to the values within the .ini file in use.
config = context.config

# Interpret the config file for Python logging.
# This line sets up loggers basically.
fileConfig(config.config_file_name, disable_existing_loggers=False)
logger = logging.getLogger("alembic.env")


def get_engine():
    try:
        # this works with Flask-SQLAlchemy<3 and Alchemical
        return current_app.extensions["migrate"].db.engine
    except (TypeError, AttributeError):
        # this works with Flask-SQLAlchemy>=3
        return current_app.extensions["migrate"].db.engine


def get_engine_url():
    try:
        return get_engine().url.render_as_string(hide_password=False).replace("%", "%%")
    except AttributeError:
        return str(get_engine().url).replace("%", "%%")


# add your model's MetaData object here
# for 'autogenerate' support
# from myapp import mymodel
# target_metadata = mymodel.Base.metadata
config.set_main_option("sqlalchemy.url", get_engine_url())
target_db = current_app.extensions["migrate"].db

# other values from the config, defined by the needs of env.py,
# can be acquired:
# my_important_option = config.get_main_option("my_important_option")
# ... etc.


MIGRATION_LOCK = 0x6361_6972_6E  # "cairn": the PostgreSQL advisory lock every upgrade takes


def include_object(obj, name, type_, reflected, compare_to):
    """Full-text search lives outside the models (SQLite FTS5 tables, PostgreSQL tsvector columns and their
    GIN indexes): migrations make it by hand, so autogenerate neither adds nor drops it. The vector tables
    (memory_vectors, message_vectors) are made by hand too: on SQLite by the migration e2a4c6e8f0b2, on
    PostgreSQL by webapp.search at first use (they need pgvector)."""
    searched = ("_fts", "search_vector", "memory_vectors", "message_vectors")
    return not (name and any(part in name for part in searched))


def get_metadata():
    if hasattr(target_db, "metadatas"):
        return target_db.metadatas[None]
    return target_db.metadata


def run_migrations_offline():
    """Run migrations in 'offline' mode.

    This configures the context with just a URL
    and not an Engine, though an Engine is acceptable
    here as well.  By skipping the Engine creation
    we don't even need a DBAPI to be available.

    Calls to context.execute() here emit the given string to the
    script output.

    """
    url = config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=get_metadata(), literal_binds=True)

    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    """Run migrations in 'online' mode.

    In this scenario we need to create an Engine
    and associate a connection with the context.

    """

    # this callback is used to prevent an auto-migration from being generated
    # when there are no changes to the schema
    # reference: http://alembic.zzzcomputing.com/en/latest/cookbook.html
    def process_revision_directives(context, revision, directives):
        if getattr(config.cmd_opts, "autogenerate", False):
            script = directives[0]
            if script.upgrade_ops.is_empty():
                directives[:] = []
                logger.info("No changes in schema detected.")

    conf_args = current_app.extensions["migrate"].configure_args
    if conf_args.get("process_revision_directives") is None:
        conf_args["process_revision_directives"] = process_revision_directives
    conf_args.setdefault("include_object", include_object)

    connectable = get_engine()

    with connectable.connect() as connection:
        if connection.dialect.name == "postgresql":
            # One upgrade at a time, whoever runs it (compose's migrate, a second `flask db upgrade` by hand):
            # the next waits here, then finds the schema current. Released below: the connection goes back to
            # the pool, which would keep a session's lock.
            connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
            connection.commit()
        if connection.dialect.name == "sqlite":
            # Batch migrations rebuild a table (copy, drop, rename); with foreign keys enforced, dropping a
            # table that others reference fails. SQLite ignores this pragma inside a transaction: set it first.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        context.configure(connection=connection, target_metadata=get_metadata(), **conf_args)

        try:
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if connection.dialect.name == "postgresql":
                connection.rollback()  # a failed migration's transaction, so that the unlock can run
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
                connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
