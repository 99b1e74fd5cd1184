"""Count the SQL statements a block of code runs, on any thread: the cost-ledger rows it set aside included, as
the ledger's thread writes them a moment later (webapp.llm.ledger.write_aside)."""

import contextlib
from dataclasses import dataclass, field

import sqlalchemy as sa

from webapp.extensions import db
from webapp.llm import ledger


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
        ledger.wait_for_rows_aside()
        sa.event.remove(db.engine, "before_cursor_execute", before)
