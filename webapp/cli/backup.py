"""`flask backup export FILE` / `flask backup import FILE`: the whole install in one file, and back into a new
database of either kind (a `make run` SQLite install moves to PostgreSQL this way), its search then rebuilt."""

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.backup import BackupError
from webapp.backup.export import export
from webapp.backup.restore import restore, unreadable_connections
from webapp.cli.core import DEMO_EMAIL, DEMO_PASSWORD
from webapp.cli.memories import reindex
from webapp.extensions import db
from webapp.models import User

backup_cli = AppGroup("backup", help="The whole install in one file, and into a new database of either kind.")


class _Bar:
    """A progress bar on stderr per stage, made at its first step (when its length is known)."""

    def __init__(self, stage_of):
        self._stage_of, self._stage, self._bar, self._shown = stage_of, None, None, 0

    def step(self, label: str, done: int, total: int) -> None:
        stage = self._stage_of(label)
        if stage != self._stage:
            self.close()
            self._stage, self._shown = stage, 0
            self._bar = click.progressbar(length=total, label=stage, file=sys.stderr).__enter__()
        self._bar.update(done - self._shown)
        self._shown = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def __enter__(self) -> "_Bar":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


@contextmanager
def _readable(file: str) -> Iterator[str]:
    """The file's path; stdin's copy in a temporary folder for "-" (a container reads a file of the host so)."""
    if file != "-":
        yield file
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stdin.backup"
        with click.open_file("-", "rb") as stdin, open(path, "wb") as copy:
            shutil.copyfileobj(stdin, copy, 1 << 20)
        yield str(path)


@contextmanager
def _writable(file: str) -> Iterator[str]:
    """The file's path; for "-", a temporary file copied to stdout once whole (a container's backup reaches the
    host so)."""
    if file != "-":
        yield file
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stdout.backup"
        yield str(path)
        with open(path, "rb") as whole, click.open_file("-", "wb") as stdout:
            shutil.copyfileobj(whole, stdout, 1 << 20)


def _summary(rows: dict[str, int], err: bool = False) -> None:
    for table, count in rows.items():
        click.echo(f"  {table}: {count:,}", err=err)


@backup_cli.command("export")
@click.argument("file", type=click.Path(dir_okay=False, writable=True, allow_dash=True))
def export_command(file: str) -> None:
    """Write the whole install to FILE: accounts, people (with their password hashes), agents, chats, messages,
    memories, proposals, audit, sign-ins, connections (keys still encrypted under SECRET_KEY), API keys' hashes,
    job runs and costs. Read in one snapshot, so people may go on chatting meanwhile. FILE "-" writes it to
    stdout (`docker compose exec -T web flask backup export - > cairn.backup`); only its owner may read it."""
    to_stdout = file == "-"
    try:
        with _writable(file) as path, _Bar(lambda _table: "Exporting rows") as bar:
            rows = export(path, bar.step)
    except BackupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Exported {sum(rows.values()):,} rows of {len(rows)} tables to {file}:", err=to_stdout)
    _summary(rows, err=to_stdout)


@backup_cli.command("import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.pass_context
def import_command(context: click.Context, file: str) -> None:
    """Load FILE, written by `flask backup export`, into this database, which must be new (`flask db upgrade`
    and nothing else), of either kind; then rebuild search as `flask memories reindex` does. The file is checked
    whole first; anything wrong, and nothing is imported. FILE "-" reads it from stdin (into a temporary file)."""
    try:
        with (
            _readable(file) as path,
            _Bar(lambda label: "Checking" if label == "Checking" else "Importing") as bar,
        ):
            rows = restore(path, bar.step)
    except BackupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Imported {sum(rows.values()):,} rows of {len(rows)} tables from {file}:")
    _summary(rows)
    if unreadable := unreadable_connections():
        click.echo(
            f"Connections whose keys do not decrypt under this SECRET_KEY: {', '.join(unreadable)}. Set SECRET_KEY "
            "to the old install's (`make run` keeps it in instance/secret_key), or put that one in "
            "SECRET_KEY_FALLBACKS and run `flask connections rotate-key`.",
            err=True,
        )
    if _demo_admin_signs_in():
        click.echo(
            f"{DEMO_EMAIL}, `make run`'s demo admin, came along and signs in with the demo password: once another "
            f"admin can sign in, remove it (`flask users remove {DEMO_EMAIL}`) or change its password on its "
            "Account page.",
            err=True,
        )
    click.echo("Rebuilding search (stopped, `flask memories reindex` goes on where it stopped):")
    context.invoke(reindex, everything=False)


def _demo_admin_signs_in() -> bool:
    demo = db.session.scalar(sa.select(User).where(User.email == DEMO_EMAIL, User.removed_at.is_(None)))
    return demo is not None and demo.check_password(os.environ.get("DEMO_PASSWORD", DEMO_PASSWORD))


COMMANDS = [backup_cli]
