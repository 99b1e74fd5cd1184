"""Count the SQL statements a block of code runs."""

import contextlib
from dataclasses import dataclass, field

import sqlalchemy as sa

from webapp.extensions import db


@dataclass
class Counted:
    count: int = 0
    statements: list[str] = field(default_factory=list)


@contextlib.contextmanager
def count_queries():
    counted = Counted()

    def before(_conn, _cursor, statement, *_args):
        counted.count += 1
        counted.statements.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", before)
    try:
        yield counted
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", before)
