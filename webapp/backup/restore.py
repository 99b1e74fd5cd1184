"""`flask backup import`: a backup into an empty database at this Cairn's newest schema, of either kind.

The file is read twice: once to check it whole (its format, its schema revision, every line against the trailer's
SHA-256) before the database is touched, then to load it, in one transaction: any failure rolls all of it back,
so a refused file leaves nothing behind. Ids are kept; PostgreSQL's sequences are then set past the largest.
What is derived (search's indexes and statistics) is rebuilt afterwards by `flask memories reindex`.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.util import CommandError

from webapp.backup import BackupError, cairn_version, migrations, newest_revision, schema_revision, tables
from webapp.backup.format import Reader, check_header, decoder, is_json
from webapp.extensions import db
from webapp.models import Connection
from webapp.models.connections import SecretError

BATCH = 1000  # rows inserted by one executemany

Step = Callable[[str, int, int], None]  # (what it does, bytes of the file read, the file's bytes)


def restore(path: str | Path, step: Step | None = None) -> dict[str, int]:
    """Load the backup at path into this empty database; the rows of each table. Raises BackupError, with
    nothing changed, when the file or the database is not fit."""
    with db.engine.connect() as connection:
        _check_database(connection)  # at once, before the file is read whole
        connection.rollback()
        header = _checked(Reader(path), step)
        with connection.begin():
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock now: no one writes meanwhile
            _check_database(connection)
            rows = _load(connection, Reader(path), header, step)
            if connection.dialect.name == "postgresql":
                _set_sequences(connection)
    return rows


def _checked(reader: Reader, step: Step | None) -> dict:
    """The file's header, once the whole file is found sound and of this install's schema."""
    items = reader.items()
    header = check_header(next(items))
    _check_revision(header)
    columns = _columns(header)
    current, seen = None, 0
    for item in items:
        if isinstance(item, dict) and item.get("table") in columns:
            current = item["table"]
        elif isinstance(item, list) and current is not None and len(item) == len(columns[current]):
            seen += 1
            if step is not None and seen % BATCH == 0:
                step("Checking", reader.position(), reader.size)
        else:
            raise BackupError(
                f"{reader.path} holds a line that is neither a table's start nor one of its rows."
            )
    return header


def _check_revision(header: dict) -> None:
    theirs, ours = header.get("schema"), newest_revision()
    if theirs == ours:
        return
    if not isinstance(theirs, str) or not theirs:
        raise BackupError("The file is not a Cairn backup: its first line names no schema revision.")
    wrote, here = f"Cairn {header.get('cairn')}, schema revision {theirs}", f"Cairn {cairn_version()}, {ours}"
    try:
        migrations().get_revision(theirs)
    except CommandError:  # "Can't locate revision"
        raise BackupError(
            f"This backup comes from a newer Cairn ({wrote}) than this install ({here}), which does not know "
            "its schema: upgrade this install to that version or later, run `flask db upgrade`, then import."
        ) from None
    raise BackupError(
        f"This backup is of an older schema ({wrote}) than this install's ({here}): import it into an install "
        "of the Cairn that wrote it and run `flask db upgrade` there, or upgrade the install you exported from, "
        "then export again and import that file here."
    )


def _columns(header: dict) -> dict[str, list[str]]:
    """Each table's columns in the file, once they are found to be this schema's."""
    listed = {table.get("name"): table.get("columns") for table in header.get("tables", [])}
    for table in tables():
        if sorted(listed.get(table.name) or []) != sorted(c.name for c in table.columns):
            raise BackupError(f"The file's table {table.name} does not have this schema's columns.")
    return {table.name: listed[table.name] for table in tables()}


def _check_database(connection: sa.Connection) -> None:
    """Refuses a database not at the newest schema, or holding any row."""
    revision, newest = schema_revision(connection), newest_revision()
    if revision is None:
        raise BackupError("This database has no Cairn schema yet: run `flask db upgrade` first, then import.")
    if revision != newest:
        raise BackupError(
            f"This database is at schema revision {revision}, not this Cairn's newest ({newest}): run "
            "`flask db upgrade` first, then import."
        )
    counted = {table.name: _rows(connection, table) for table in db.metadata.sorted_tables}
    if held := {name: count for name, count in counted.items() if count}:
        said = ", ".join(f"{name} {count:,}" for name, count in held.items())
        raise BackupError(
            f"This database is not empty (rows: {said}): a backup goes into a new database, migrated with "
            "`flask db upgrade` and nothing else (no `flask demo seed`, no first admin). Nothing was changed."
        )


def _rows(connection: sa.Connection, table: sa.Table) -> int:
    return connection.scalar(sa.select(sa.func.count()).select_from(table))


def _load(connection: sa.Connection, reader: Reader, header: dict, step: Step | None) -> dict[str, int]:
    """Insert every row of the file, a batch at a time; the rows of each table."""
    order = [table.name for table in tables()]
    columns = _columns(header)
    items = reader.items()
    next(items)  # the header, checked
    loaders: dict[str, _Loader] = {}
    loader = None
    for item in items:
        if isinstance(item, dict):
            if loader is not None:
                loader.flush()
            loader = loaders[item["table"]] = _Loader(
                connection, item["table"], columns[item["table"]], order
            )
        elif loader.add(item) and step is not None:
            step(loader.table.name, reader.position(), reader.size)
    if loader is not None:
        loader.flush()
    rows = {name: loaders[name].count if name in loaders else 0 for name in order}
    if rows != {name: reader.trailer["rows"].get(name, 0) for name in order}:
        raise BackupError(f"{reader.path} does not hold the rows its last line counts: it was changed.")
    for each in loaders.values():
        each.link()
    return rows


class _Loader:
    """Inserts one table's rows in batches. A column referring to a table loaded later (the account's
    background connection) is written once that table is in (link)."""

    def __init__(self, connection: sa.Connection, name: str, names: list[str], order: list[str]):
        self.connection, self.table = connection, db.metadata.tables[name]
        self._columns = columns = [self.table.c[column] for column in names]
        self._decode = decoder(columns)
        self._keys = [f"v{n}" for n in range(len(columns))]
        postgres = connection.dialect.name == "postgresql"
        self._insert = self.table.insert().values(
            {column: _bound(key, column, postgres) for key, column in zip(self._keys, columns, strict=True)}
        )
        self._later = [n for n, column in enumerate(columns) if _refers_to_later(column, name, order)]
        self._primary = [names.index(c.name) for c in self.table.primary_key.columns]
        self._linked: list[tuple[int, dict[str, Any]]] = []
        self._batch: list[dict[str, Any]] = []
        self.count = 0

    def add(self, line: list) -> bool:
        """Queue one row; True when a batch was written."""
        values = self._decode(line)
        for n in self._later:
            if values[n] is not None:
                self._linked.append((n, {"linked": values[n], **self._key_of(values)}))
                values[n] = None
        self._batch.append(dict(zip(self._keys, values, strict=True)))
        self.count += 1
        if len(self._batch) < BATCH:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        if self._batch:
            try:
                self.connection.execute(self._insert, self._batch)
            except sa.exc.DBAPIError as error:
                raise BackupError(
                    f"Rows of {self.table.name} could not be written ({error.orig}). Nothing was imported."
                ) from None
            self._batch = []

    def _key_of(self, values: list) -> dict[str, Any]:
        return {f"k{n}": values[index] for n, index in enumerate(self._primary)}

    def link(self) -> None:
        """Write the columns that referred to tables loaded after this one."""
        primary = list(self.table.primary_key.columns)
        where = [column == sa.bindparam(f"k{n}", type_=column.type) for n, column in enumerate(primary)]
        for n in self._later:
            column = self._columns[n]
            rows = [row for which, row in self._linked if which == n]
            if rows:
                values = {column: sa.bindparam("linked", type_=column.type)}
                self.connection.execute(sa.update(self.table).where(*where).values(values), rows)


def _bound(key: str, column: sa.Column, postgres: bool) -> sa.ColumnElement:
    """The insert's parameter for the column: a JSON column is given its JSON text (cast to JSONB on PostgreSQL;
    SQLite keeps JSON as text)."""
    if not is_json(column):
        return sa.bindparam(key, type_=column.type)
    text = sa.bindparam(key, type_=sa.Text)
    return sa.cast(text, column.type) if postgres else text


def _refers_to_later(column: sa.Column, table: str, order: list[str]) -> bool:
    """Whether the column refers to a table loaded with or after its own (only the account's background
    connection does: connections belong to accounts)."""
    return any(order.index(key.column.table.name) >= order.index(table) for key in column.foreign_keys)


def _set_sequences(connection: sa.Connection) -> None:
    """PostgreSQL: each table's id sequence past the largest id imported, so the next row gets a new one."""
    for table in tables():
        keys = list(table.primary_key.columns)
        if len(keys) != 1 or not isinstance(keys[0].type, sa.Integer):
            continue
        name, key = table.name, keys[0].name
        connection.execute(
            sa.text(
                f"SELECT setval(pg_get_serial_sequence('{name}', '{key}'), coalesce(max({key}), 0) + 1, false) "
                f"FROM {name}"
            )
        )


def unreadable_connections() -> list[str]:
    """The names of the connections whose key or headers do not decrypt under this install's SECRET_KEY (and its
    fallbacks): those of an install whose SECRET_KEY was another."""
    names = []
    for connection in db.session.scalars(sa.select(Connection).order_by(Connection.id)):
        try:
            connection.api_key, connection.headers  # noqa: B018 (decrypted to see that they can be)
        except SecretError:
            names.append(connection.name)
    return names
