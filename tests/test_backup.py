"""Issue 40.4: `flask backup export` writes the whole install into one file, read in one snapshot; `flask backup
import` loads it into an empty database of either kind (SQLite to PostgreSQL and back) with the same rows and
ids, then rebuilds search; a file cut short, edited, or from another schema is refused with nothing left of it.

Every install here is a database of its own (a SQLite file, or a PostgreSQL database made from a migrated
template on the test server), beside the session's: an import needs one that is empty."""

import contextlib
import gzip
import hashlib
import json
import threading
import tracemalloc
import uuid
from datetime import timedelta

import fakeredis
import pytest
import sqlalchemy as sa
from flask_migrate import upgrade
from rq import Queue

from tests import factories
from tests.conftest import POSTGRES_URL, _settings
from tests.test_mcp import _call, _found, _in_process
from webapp import backup
from webapp.backup.export import export
from webapp.backup.format import is_json
from webapp.backup.restore import restore
from webapp.extensions import db
from webapp.factory import create_app
from webapp.models import (
    Agent,
    ApiKey,
    Chat,
    ChatHidden,
    Connection,
    MemoryProposal,
    Message,
    ProposedChange,
    ToolServer,
    User,
)
from webapp.models import connections as connection_rows
from webapp.models.memories import add_sources
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall

KINDS = ["sqlite", "postgresql"] if POSTGRES_URL else ["sqlite"]
OURS = KINDS[-1]  # the database this run is about
PAIRS = [(source, target) for source in KINDS for target in KINDS]
OPENROUTER_KEY = "sk-or-v1-the-teams-own-key"


# --- databases and apps of their own ---


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory, fake_llm, migrated_database):
    if not POSTGRES_URL:
        return migrated_database.removeprefix("sqlite:///")
    path = tmp_path_factory.mktemp("backup") / "template.db"
    _migrate(f"sqlite:///{path}", fake_llm)
    return str(path)


@pytest.fixture(scope="session")
def postgres_template(fake_llm):
    """A migrated database on the test server from which each test's PostgreSQL databases are copied."""
    if not POSTGRES_URL:
        yield None
        return
    name = f"{sa.make_url(POSTGRES_URL).database}_backup_template"
    _recreate(name)
    _migrate(_on_server(name), fake_llm)
    yield name
    _drop(name)


def _on_server(name: str) -> str:
    return sa.make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)


def _admin_sql(*statements: str) -> None:
    engine = sa.create_engine(_on_server("postgres"), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)
    engine.dispose()


def _recreate(name: str, template: str | None = None) -> None:
    copy = f" TEMPLATE {template}" if template else ""
    _admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}{copy}")


def _drop(name: str) -> None:
    _admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _migrate(url: str, fake_llm) -> None:
    app = create_app(_settings(url, fake_llm.base_url))
    with app.app_context():
        upgrade()
        db.engine.dispose()


@pytest.fixture
def database(tmp_path, sqlite_template, postgres_template):
    """new(kind, name): the URL of a new database of that kind at the newest schema, holding nothing."""
    made = []

    def new(kind: str, name: str) -> str:
        if kind == "sqlite":
            path = tmp_path / f"{name}.db"
            path.write_bytes(open(sqlite_template, "rb").read())
            return f"sqlite:///{path}"
        made.append(f"{postgres_template.removesuffix('_template')}_{name}")
        _recreate(made[-1], template=postgres_template)
        return _on_server(made[-1])

    yield new
    for name in made:
        _drop(name)


@pytest.fixture
def install(fake_llm):
    """install(url): an app on that database, in its context while the `with` lasts."""

    @contextlib.contextmanager
    def run(url: str, **settings):
        app = create_app({**_settings(url, fake_llm.base_url), **settings})
        redis = fakeredis.FakeRedis()
        app.extensions["redis"] = redis
        app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=redis)
        with app.app_context():
            try:
                yield app
            finally:
                db.session.remove()
                db.engine.dispose()

    return run


# --- a team's install ---


def _team() -> dict:
    """People (an admin and a member), agents (one on a connection whose key is stored encrypted, which is also
    the account's background connection), a private and a shared chat, memories heard by one chat or everyone
    with their sources, a staged proposal, audit rows, a sign-in, an API key, job runs and costs."""
    acme = factories.account("Acme")
    dana = factories.user(acme, "dana@example.com", "admin")
    milo = factories.user(acme, "milo@example.com", "member")
    openrouter = connection_rows.add(
        acme.id,
        name="OpenRouter",
        kind="openai",
        base_url="https://openrouter.ai/api/v1",
        api_key=OPENROUTER_KEY,
    )
    db.session.commit()
    acme.background_connection_id = openrouter.id
    ada = factories.agent(acme, "Ada", enabled_tools=["save_memory", "recall"], background_changes="staged")
    basil = factories.agent(acme, "Basil", connection_id=openrouter.id)
    private = factories.chat(acme, [ada], "Milo's roses", people=[milo])
    shared = factories.chat(acme, [ada, basil], "Garden club")
    asked = factories.message(private, "My roses have black spot on every leaf.", author=milo)
    factories.message(private, "Spray them with neem oil at dusk.", author=ada, tools_used=["recall"])
    factories.message(shared, "The club meets on Thursdays at the greenhouse.", author=dana)
    factories.message(shared, "Noted: Thursdays, at the greenhouse.", author=basil, tools_used=None)
    roses = factories.memory(ada, "Milo's roses have black spot.", audience="chat", chat_id=private.id)
    add_sources(roses, [asked.id])
    club = factories.memory(ada, "The garden club meets on Thursdays.", audience="chat", chat_id=shared.id)
    tea = factories.memory(ada, "Dana takes her tea without sugar.")
    factories.memory(basil, "Basil answers in French when asked.", "journal")
    factories.audit_rows(ada, [roses.id, club.id], 3)
    changes = [
        ProposedChange.build("rewrite", [tea], "Dana drinks tea, no sugar."),
        ProposedChange.build("delete", [club]),
    ]
    MemoryProposal.stage(
        ada, str(uuid.uuid4()), changes, staged_because="setting", reason=None, summary=None, expiry=timedelta(days=14)
    )  # fmt: skip
    db.session.add(ChatHidden(chat_id=shared.id, user_id=milo.id))
    milo.start_session()
    key, secret = ApiKey.issue(milo, "Open WebUI")
    run = factories.job_run(acme, "reply", args=[1, "two", None], counts={"tokens": 12})
    factories.llm_call(ada, chat_id=private.id, job_run_id=run.id, connection_id=openrouter.id)
    clock = ToolServer(account_id=acme.id, name="time", kind="stdio", command="mcp-server-time", tools=[])
    clock.secrets = {"TZ_TOKEN": "tz-secret-1"}  # kept encrypted, as connections' keys are
    db.session.add(clock)
    db.session.commit()
    return {"secret": secret, "key": key.id, "ada": ada.id, "milo": milo.id, "connection": openrouter.id}


def _contents() -> dict[str, list[tuple]]:
    """Every exported table's rows, by primary key, JSON parsed (SQL NULL apart from JSON null)."""
    found = {}
    with db.engine.connect() as connection:
        for table in backup.tables():
            columns = [sa.cast(c, sa.Text) if is_json(c) else c for c in table.columns]
            rows = connection.execute(sa.select(*columns).order_by(*table.primary_key.columns))
            json_at = [n for n, c in enumerate(table.columns) if is_json(c)]
            found[table.name] = [_parsed(row, json_at) for row in rows]
    return found


def _parsed(row, json_at: list[int]) -> tuple:
    return tuple(
        ("SQL NULL" if value is None else json.loads(value)) if n in json_at else value
        for n, value in enumerate(row)
    )


def _counts() -> dict[str, int]:
    with db.engine.connect() as connection:
        return {
            table.name: connection.scalar(sa.select(sa.func.count()).select_from(table))
            for table in db.metadata.sorted_tables
        }


def _recalled(agent_id: int, query: str) -> list[str]:
    """What recall finds for Ada in Milo's private chat (a reply of hers is written for it)."""
    agent = db.session.get(Agent, agent_id)
    chat = db.session.scalar(sa.select(Chat).where(Chat.title == "Milo's roses"))
    reply = factories.message(chat, "", author=agent, status="streaming")
    return [
        hit.get("content") or hit.get("excerpt")
        for hit in recall(ToolContext(agent=agent, chat=chat, message=reply), query)["results"]
    ]


# --- the round trip ---


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_a_teams_install_moves_whole_and_works_there(database, install, tmp_path, source, target):
    path = tmp_path / "cairn.backup"
    with install(database(source, "source")) as old:
        team = _team()
        assert old.test_cli_runner().invoke(args=["memories", "reindex"]).exit_code == 0
        before = _contents()
        exported = old.test_cli_runner().invoke(args=["backup", "export", str(path)])
        recalled = _recalled(team["ada"], "black spot on the roses")

    with install(database(target, "target")) as new:
        imported = new.test_cli_runner().invoke(args=["backup", "import", str(path)])
        assert imported.exit_code == 0, imported.output
        after = _contents()
        client = new.test_client()
        signed_in = client.post("/login", data={"email": "milo@example.com", "password": factories.PASSWORD})
        models = client.get("/v1/models", headers={"Authorization": f"Bearer {team['secret']}"})
        ada, milo = db.session.get(Agent, team["ada"]), db.session.get(User, team["milo"])
        [searched] = _call(lambda: _in_process(new, ada, milo), ("search_memory", {"query": "black spot"}))
        key = db.session.get(Connection, team["connection"]).api_key
        fresh = factories.account("Globex").id  # new rows take new ids
        found_again = _recalled(team["ada"], "black spot on the roses")

    assert exported.exit_code == 0, exported.output
    assert (
        f"Exported {sum(map(len, before.values())):,} rows of {len(backup.tables())} tables"
        in exported.output
    )
    costs, kept = after.pop("llm_calls"), before.pop("llm_calls")  # the import's embeddings are costed after
    assert after == before
    tools_used = [row[10] for row in before["messages"]]
    assert "SQL NULL" in tools_used and None in tools_used and ["recall"] in tools_used  # kept apart
    assert costs[: len(kept)] == kept and {row[1] for row in costs[len(kept) :]} == {"embedding"}
    assert {name for name, rows in before.items() if not rows} <= {"chat_people", "reply_sources"}
    assert "  messages: 4" in imported.output and "  agent_memories: 4" in imported.output
    assert "agent_memories: 4 rows indexed" in imported.output and "embedded" in imported.output
    assert signed_in.status_code == 303
    assert models.status_code == 200 and [m["id"] for m in models.json["data"]] == ["ada", "basil"]
    assert "Milo's roses have black spot." in _found(searched)
    assert key == OPENROUTER_KEY
    assert fresh == 2
    assert found_again == recalled and "Milo's roses have black spot." in found_again


def test_the_file_is_gzipped_json_lines_with_a_header_and_a_checked_trailer(database, install, tmp_path):
    path = tmp_path / "cairn.backup"
    with install(database(OURS, "source")):
        _team()
        rows = export(path)
        revision = backup.newest_revision()

    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    header, trailer = json.loads(lines[0]), json.loads(lines[-1])

    assert (header["format"], header["version"], header["schema"], header["database"]) == (
        "cairn-backup",
        1,
        revision,
        OURS,
    )
    assert [t["name"] for t in header["tables"]] == list(rows)
    assert not {"search_term_stats", "search_table_stats", "embedding_queue"} & set(rows)
    assert trailer["end"] == {"rows": rows, "sha256": hashlib.sha256(b"".join(lines[:-1])).hexdigest()}
    assert json.loads(lines[1]) == {"table": "accounts"}
    assert path.stat().st_mode & 0o777 == 0o600  # password hashes and encrypted keys: its owner's alone


def test_an_export_writes_to_stdout_too_and_its_counts_go_to_stderr(database, install, tmp_path):
    with install(database(OURS, "source")) as app:
        _team()
        export(tmp_path / "file.backup")
        exported = app.test_cli_runner().invoke(args=["backup", "export", "-"])
    with install(database(OURS, "target")) as app:
        imported = app.test_cli_runner().invoke(args=["backup", "import", "-"], input=exported.stdout_bytes)

    assert exported.exit_code == 0, exported.stderr
    assert exported.stdout_bytes[:2] == b"\x1f\x8b" and "Exported" in exported.stderr
    assert imported.exit_code == 0 and "messages: 4" in imported.output, imported.output


def test_an_import_that_brings_make_runs_demo_admin_with_its_demo_password_says_so(
    database, install, tmp_path
):
    path = tmp_path / "cairn.backup"
    with install(database(OURS, "source")) as app:
        assert app.test_cli_runner().invoke(args=["demo", "seed"]).exit_code == 0
        export(path)
    with install(database(OURS, "target")) as app:
        imported = app.test_cli_runner().invoke(args=["backup", "import", str(path)])

    assert imported.exit_code == 0, imported.stderr
    assert "admin@cairn.local, `make run`'s demo admin, came along" in imported.stderr


def test_an_import_reads_the_file_from_stdin_too(database, install, tmp_path):
    path = tmp_path / "cairn.backup"
    with install(database(OURS, "source")):
        _team()
        export(path)
        before = _contents()
    with install(database(OURS, "target")) as app:
        imported = app.test_cli_runner().invoke(args=["backup", "import", "-"], input=path.read_bytes())
        after = _contents()

    assert imported.exit_code == 0, imported.output
    after.pop("llm_calls"), before.pop("llm_calls")  # the import's embeddings are costed after
    assert after == before


def test_an_import_under_another_secret_key_names_the_connections_whose_keys_it_cannot_read(
    database, install, tmp_path
):
    path = tmp_path / "cairn.backup"
    with install(database(OURS, "source")):
        _team()
        export(path)
    with install(database(OURS, "target"), SECRET_KEY="another") as app:
        imported = _import(app, path)

    assert imported.exit_code == 0, imported.output
    said = " ".join(imported.output.split())
    assert "Connections whose keys do not decrypt under this SECRET_KEY: OpenRouter." in said
    assert "SECRET_KEY_FALLBACKS and run `flask connections rotate-key`" in said


# --- bad input ---


def _backup(database, install, tmp_path) -> tuple:
    path = tmp_path / "cairn.backup"
    with install(database(OURS, "source")):
        _team()
        export(path)
    return path, gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def _rewritten(path, lines: list[bytes], *, resign: bool) -> None:
    """The file with these lines; with resign, its trailer's SHA-256 made to match them."""
    if resign:
        trailer = json.loads(lines[-1])
        trailer["end"]["sha256"] = hashlib.sha256(b"".join(lines[:-1])).hexdigest()
        lines = [*lines[:-1], (json.dumps(trailer) + "\n").encode()]
    path.write_bytes(gzip.compress(b"".join(lines)))


def _import(app, path):
    return app.test_cli_runner().invoke(args=["backup", "import", str(path)])


def test_a_database_holding_anything_is_refused_and_left_as_it_was(database, install, tmp_path):
    path, _lines = _backup(database, install, tmp_path)
    with install(database(OURS, "target")) as app:
        factories.user(factories.account("Demo"), "admin@cairn.local")
        before = _contents()
        refused = _import(app, path)
        after = _contents()

    assert refused.exit_code == 1
    assert "This database is not empty (rows: accounts 1, users 1)" in refused.output
    assert "Nothing was changed." in refused.output
    assert after == before


def test_a_database_not_migrated_is_told_to_run_flask_db_upgrade(install, tmp_path, database):
    path, _lines = _backup(database, install, tmp_path)
    with install(f"sqlite:///{tmp_path / 'empty.db'}") as app:
        refused = _import(app, path)

    assert refused.exit_code == 1 and "run `flask db upgrade` first, then import" in refused.output


@pytest.mark.parametrize("cut", ["bytes", "lines"])
def test_a_file_cut_short_is_refused_and_nothing_of_it_stays(database, install, tmp_path, cut):
    path, lines = _backup(database, install, tmp_path)
    if cut == "bytes":
        path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    else:
        _rewritten(path, lines[:-3], resign=False)
    with install(database(OURS, "target")) as app:
        refused = _import(app, path)
        counts = _counts()

    assert refused.exit_code == 1
    assert "cut short" in refused.output
    assert set(counts.values()) == {0}


def test_an_edited_file_is_refused_and_nothing_of_it_stays(database, install, tmp_path):
    path, lines = _backup(database, install, tmp_path)
    [at] = [n for n, line in enumerate(lines) if b"neem oil" in line]
    lines[at] = lines[at].replace(b"neem oil", b"neem oiL")
    _rewritten(path, lines, resign=False)
    with install(database(OURS, "target")) as app:
        refused = _import(app, path)
        counts = _counts()

    assert refused.exit_code == 1
    assert "was changed after it was written" in refused.output
    assert set(counts.values()) == {0}


def test_a_file_that_fails_midway_leaves_nothing_behind(database, install, tmp_path):
    """Rewritten with a matching checksum, so the check passes: a message of a chat that is not in the file
    fails its insert after every table before it was written, and all of it is rolled back."""
    path, lines = _backup(database, install, tmp_path)
    [at] = [n for n, line in enumerate(lines) if b"neem oil" in line]
    row = json.loads(lines[at])
    row[1] = 999  # its chat_id
    lines[at] = (json.dumps(row) + "\n").encode()
    _rewritten(path, lines, resign=True)
    with install(database(OURS, "target")) as app:
        refused = _import(app, path)
        counts = _counts()

    assert refused.exit_code == 1
    assert (
        "Rows of messages could not be written" in refused.output
        and "Nothing was imported." in refused.output
    )
    assert set(counts.values()) == {0}


@pytest.mark.parametrize("schema", ["newer", "older"])
def test_a_file_of_another_schema_is_refused_naming_both_versions(database, install, tmp_path, schema):
    path, lines = _backup(database, install, tmp_path)
    header = json.loads(lines[0])
    header["schema"] = "f00dfeedbeef" if schema == "newer" else "4c5d6a37cc4d"  # the first migration's
    header["cairn"] = "9.9.9" if schema == "newer" else "0.0.1"
    _rewritten(path, [(json.dumps(header) + "\n").encode(), *lines[1:]], resign=True)
    with install(database(OURS, "target")) as app:
        refused = _import(app, path)
        newest = backup.newest_revision()
        counts = _counts()

    assert refused.exit_code == 1
    said = " ".join(refused.output.split())
    if schema == "newer":
        assert "This backup comes from a newer Cairn (Cairn 9.9.9, schema revision f00dfeedbeef)" in said
    else:
        assert "This backup is of an older schema (Cairn 0.0.1, schema revision 4c5d6a37cc4d)" in said
        assert "export again" in said
    assert (
        f"this install (Cairn 0.1.0, {newest})" in said or f"this install's (Cairn 0.1.0, {newest})" in said
    )
    assert set(counts.values()) == {0}


def test_a_file_that_is_no_backup_is_refused(database, install, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    with install(database(OURS, "target")) as app:
        refused = _import(app, path)

    assert refused.exit_code == 1 and "is not a Cairn backup" in refused.output


# --- one snapshot ---


def _chat_with_messages(engine: sa.Engine, account_id: int, user_id: int, count: int) -> None:
    """What a person chatting writes meanwhile: a new chat and its messages, on a connection of its own."""
    now = utcnow()
    with engine.begin() as connection:
        chat_id = connection.execute(
            sa.insert(Chat).values(account_id=account_id, title="Meanwhile", memory_doc="").returning(Chat.id)
        ).scalar_one()
        connection.execute(
            sa.insert(Message),
            [
                {"chat_id": chat_id, "role": "user", "user_id": user_id, "content": f"said meanwhile {n}",
                 "status": "done", "created_at": now, "updated_at": now}
                for n in range(count)
            ],
        )  # fmt: skip


def test_an_export_while_people_chat_is_one_snapshot_that_imports(database, install, tmp_path, monkeypatch):
    path = tmp_path / "cairn.backup"
    monkeypatch.setattr("webapp.backup.export.BATCH", 2)
    with install(database(OURS, "source")):
        _team()
        _chat_with_messages(db.engine, 1, 1, 10)
        before = _contents()
        engine, written = db.engine, []

        def step(table: str, _done: int, _total: int) -> None:
            if table in ("chats", "messages") and table not in written:  # amid chats, then amid messages
                writer = threading.Thread(target=_chat_with_messages, args=(engine, 1, 1, 5))
                writer.start()
                writer.join()
                written.append(table)

        rows = export(path, step)
        now = _counts()

    with install(database(OURS, "target")):
        restore(path)
        after = _contents()

    assert written == ["chats", "messages"]
    assert now["messages"] == len(before["messages"]) + 10 and now["chats"] == len(before["chats"]) + 2
    assert rows["messages"] == len(before["messages"]) and rows["chats"] == len(before["chats"])
    assert after == before


# --- memory stays flat ---


def _messages(count: int) -> None:
    acme = factories.account("Acme")
    dana = factories.user(acme, "dana@example.com")
    chat = factories.chat(acme, [factories.agent(acme, "Ada")], "Long")
    now = utcnow()
    for start in range(0, count, 5000):
        db.session.execute(
            sa.insert(Message),
            [
                {"chat_id": chat.id, "role": "user", "user_id": dana.id, "content": f"message {n} " + "words " * 40,
                 "status": "done", "tools_used": ["recall"], "created_at": now, "updated_at": now}
                for n in range(start, min(count, start + 5000))
            ],
        )  # fmt: skip
    db.session.commit()


def _peak(func) -> int:
    tracemalloc.start()
    try:
        func()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_flat_as_messages_grow_tenfold(database, install, tmp_path):
    peaks = {}
    for count in (2_000, 20_000):
        path = tmp_path / f"{count}.backup"
        with install(database(OURS, f"source_{count}")):
            _messages(count)
            exported = _peak(lambda: export(path))  # noqa: B023
        with install(database(OURS, f"target_{count}")):
            imported = _peak(lambda: restore(path))  # noqa: B023
            assert _counts()["messages"] == count
        peaks[count] = (exported, imported)

    (small_export, small_import), (large_export, large_import) = peaks[2_000], peaks[20_000]
    # Measured: about 3 MB at either size, on SQLite and PostgreSQL; a file or a table held whole would be 10x.
    assert large_export < 1.25 * small_export + 1_000_000, peaks
    assert large_import < 1.25 * small_import + 1_000_000, peaks
    assert max(large_export, large_import) < 10_000_000, peaks
