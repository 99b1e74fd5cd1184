"""Agents as files: export an agent (settings, memories, audit trail, sessions, chats) and import it into another
account as a new agent, reproducing it field by field; bad files refused whole; the CLI, the download button,
the upload form, the --agent option, and Letta .af files."""

import io
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.agent_files.schema import SCHEMA
from webapp.agent_files.validation import read
from webapp.extensions import db
from webapp.models import (
    Account,
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatPerson,
    EmbeddingQueue,
    JobRun,
    Message,
    ReplySources,
    User,
)
from webapp.models.access import memories_heard_by
from webapp.models.audit import record_change, rollback_session, undo
from webapp.models.memories import add_sources
from webapp.timeutil import utcnow

ROOT = Path(__file__).resolve().parent.parent
COUNTED = (
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatPerson,
    Message,
    ReplySources,
    EmbeddingQueue,
    JobRun,
    Account,
    User,
)


def _counts() -> dict[str, int]:
    return {m.__tablename__: db.session.scalar(sa.select(sa.func.count()).select_from(m)) for m in COUNTED}


@pytest.fixture
def ada(admin, member):
    """Ada of Acme with everything a file carries: settings, memories of every kind (a faded journal entry, a
    deleted one, a constitutional one, a merge), audit rows by a person, by jobs, an undo and a refinement
    session; a private chat of the admin, a shared group chat with Basil, a private chat of a member; a reply
    with its sources. Basil's memories and chats' messages are there too, to stay out of Ada's file."""
    acme = admin.account
    ada = factories.agent(
        acme,
        "Ada",
        system_prompt="You are Ada, careful and curious.",
        enabled_tools=["save_memory", "recall"],
        core_token_budget=3000,
        memory_token_budget=1200,
        members_see_memory="core",
        consolidates_direct_chats=False,
        last_refinement_at=utcnow() - timedelta(days=3),
    )
    basil = factories.agent(acme, "Basil")
    roses = factories.chat(acme, [ada], title="Roses", people=[admin])
    team = factories.chat(acme, [ada, basil], title="Team")  # shared
    secrets = factories.chat(acme, [ada], title="Milo's plans", people=[member])
    asked = factories.message(roses, "I grow roses, remember that.", author=admin)
    reply = factories.message(roses, "Noted: you grow roses.", author=ada)
    factories.message(team, "Basil here: tulips are better.", author=basil)
    factories.message(team, "Both are fine.", author=admin)
    planned = factories.message(secrets, "Plan a surprise for Dana.", author=member)

    def create(content, memory_type="core", via="admin", user=None, **fields):
        memory = AgentMemory(agent=ada, content=content, memory_type=memory_type, **fields)
        db.session.add(memory)
        record_change(
            memory,
            "memory_create",
            None,
            via=via,
            user_id=user.id if user else None,
            **fields.pop("extra", {}),
        )
        db.session.commit()
        return memory

    rule = create("Never share one person's secrets with another.", user=admin, constitutional=True)
    faded = create(
        "Dana grows roses",
        "journal",
        via="consolidation",
        chat_id=roses.id,
        audience="chat",
        created_at=utcnow() - timedelta(days=10),
    )
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.auditable_id == faded.id))
    row.data = {**row.data, "chat_id": roses.id, "first_message_id": asked.id, "last_message_id": reply.id}
    tulips = create("Basil prefers tulips", via="save_memory", chat_id=team.id, audience="chat")
    add_sources(faded, [asked.id, reply.id])
    surprise = create(
        "Milo plans a surprise for Dana", via="consolidation", chat_id=secrets.id, audience="chat"
    )
    add_sources(surprise, [planned.id])
    gone = create("Dana dislikes lilies", via="save_memory", chat_id=roses.id, audience="chat")
    before = gone.snapshot()
    gone.soft_delete()
    record_change(gone, "memory_delete", before, via="admin", user_id=admin.id)
    before = tulips.snapshot()
    tulips.content = "Basil prefers tulips to roses"
    edit = record_change(tulips, "memory_update", before, via="admin", user_id=admin.id)
    db.session.commit()
    undo(edit, user_id=admin.id, via="admin")
    db.session.commit()
    # A refinement session that merged two memories into one.
    session = "5e55a0e0-0000-4000-8000-000000000001"
    AuditLog.record(
        "memory_refinement_start",
        ada,
        account_id=acme.id,
        agent_id=ada.id,
        session_id=session,
        tokens_before=40,
    )
    first, second = create("Dana likes red"), create("Dana likes red roses")
    merged = AgentMemory(agent=ada, content="Dana likes red roses", memory_type="core")
    db.session.add(merged)
    record_change(merged, "memory_refinement_consolidate_create", None, via="refinement", session_id=session)
    for memory in (first, second):
        before = memory.snapshot()
        memory.soft_delete()
        record_change(
            memory,
            "memory_refinement_consolidate",
            before,
            via="refinement",
            session_id=session,
            merged_into=merged.id,
        )
    AuditLog.record(
        "memory_refinement_complete",
        ada,
        account_id=acme.id,
        agent_id=ada.id,
        session_id=session,
        summary="Merged.",
    )
    db.session.add(
        ReplySources(
            message_id=reply.id,
            memory_ids=[rule.id, faded.id],
            recalled_memory_ids=[tulips.id],
            recalled_chat_ids=[team.id],
            summary_chat_ids=[secrets.id],
            conversation_summary=True,
        )
    )
    link = db.session.scalar(
        sa.select(ChatAgent).where(ChatAgent.chat_id == roses.id, ChatAgent.agent_id == ada.id)
    )
    link.agent_summary, link.agent_summary_generated_at = "Dana and roses.", utcnow()
    link.last_consolidated_message_id = reply.id
    factories.memory(basil, "Basil's own secret")
    db.session.commit()
    return ada


def _export(runner, *args: str) -> dict:
    result = runner.invoke(args=["agents", "export", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _import(runner, document: dict, *args: str):
    return runner.invoke(args=["agents", "import", "-", *args], input=json.dumps(document))


def _same_sessions(first: list[dict], second: list[dict]) -> None:
    """The rows match field by field, session ids apart, which map one to one (an import gives new ones)."""
    mapping = {}
    for a, b in zip(first, second, strict=True):
        assert {**a, "session": None} == {**b, "session": None}
        if a["session"] is not None:
            assert mapping.setdefault(a["session"], b["session"]) == b["session"]
    assert len(set(mapping.values())) == len(mapping)
    assert all(old != new for old, new in mapping.items())


def test_round_trip_reproduces_every_memory_audit_row_and_setting(runner, ada, stranger):
    first = _export(runner, "Ada")

    result = _import(runner, first, "--account", "Globex")
    assert result.exit_code == 0, result.output
    assert "Imported Ada: 8 memories" in result.output
    second = _export(runner, "Ada", "--account", "Globex")

    assert second["agent"] == first["agent"]
    assert second["memories"] == first["memories"]
    *reproduced, imported = second["audit"]
    _same_sessions(first["audit"], reproduced)
    assert imported["action"] == "agent_import" and imported["target"] == "agent"
    assert [s["session"] for s in second["sessions"]] == [
        r["session"] for r in reproduced if r["action"] == "memory_refinement_start"
    ]
    assert [{**s, "session": None} for s in second["sessions"]] == [
        {**s, "session": None} for s in first["sessions"]
    ]
    for old, new in zip(
        first["chats"], second["chats"], strict=True
    ):  # chats only referred to: archived here, the importer's alone
        assert (new["ref"], new["title"], new["visibility"], new["included"]) == (
            old["ref"],
            old["title"],
            "private",
            False,
        )
        assert new["people"] == [{"name": "eve", "email": "eve@globex.example"}]
        assert new["started_by"] == {"name": "eve", "email": "eve@globex.example"}


def test_imported_memories_keep_their_times_flags_and_audiences_with_derived_values_recomputed(
    runner, ada, stranger
):
    _import(runner, _export(runner, "Ada"), "--account", "Globex")
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    # Two memories share "Dana likes red roses" (one merged into the other): by id, the same one wins each side.
    originals = {
        m.content: m
        for m in db.session.scalars(
            sa.select(AgentMemory).where(AgentMemory.agent_id == ada.id).order_by(AgentMemory.id)
        )
    }
    copies = {
        m.content: m
        for m in db.session.scalars(
            sa.select(AgentMemory).where(AgentMemory.agent_id == copy.id).order_by(AgentMemory.id)
        )
    }

    assert copies.keys() == originals.keys()
    for content, memory in copies.items():
        original = originals[content]
        for column in (
            "memory_type",
            "constitutional",
            "audience",
            "created_at",
            "updated_at",
            "deleted_at",
            "content_hash",
            "token_estimate",
        ):
            assert getattr(memory, column) == getattr(original, column), (content, column)
        assert memory.content_hash and memory.token_estimate
    now = utcnow()
    assert copies["Dana grows roses"].is_expired(now)  # faded a week after it was made, as before
    # A memory of a private chat that is not imported stays private: tied to an archive chat of the importer.
    archive = db.session.get(Chat, copies["Dana grows roses"].chat_id)
    assert archive.account_id == stranger.account_id and archive.is_private and archive.is_discarded
    assert [p.user_id for p in archive.chat_people] == [stranger.id]
    globex_member = factories.user(stranger.account, "gus@globex.example", "member")
    heard = set(
        db.session.scalars(
            sa.select(AgentMemory.content).where(
                AgentMemory.agent_id == copy.id, memories_heard_by(globex_member)
            )
        )
    )
    assert "Dana grows roses" not in heard and "Milo plans a surprise for Dana" not in heard
    # Of a shared chat: the archive chat is the importer's, private until they share it (never heard by more).
    assert "Basil prefers tulips" not in heard
    tulips_chat = db.session.get(Chat, copies["Basil prefers tulips"].chat_id)
    assert tulips_chat.is_private and [p.user_id for p in tulips_chat.chat_people] == [stranger.id]
    assert "Never share one person's secrets with another." in heard
    # Vectors: every memory made is queued for embedding.
    queued = set(db.session.scalars(sa.select(EmbeddingQueue.row_id).where(EmbeddingQueue.kind == "memory")))
    assert {m.id for m in copies.values()} <= queued


def test_imported_audit_rows_name_the_new_memories_and_sessions_roll_back_alone(runner, ada, stranger, admin):
    _import(runner, _export(runner, "Ada"), "--account", "Globex")
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    rows = db.session.scalars(
        sa.select(AuditLog).where(AuditLog.agent_id == copy.id).order_by(AuditLog.id)
    ).all()
    mine = set(db.session.scalars(sa.select(AgentMemory.id).where(AgentMemory.agent_id == copy.id)))

    assert all(r.account_id == stranger.account_id for r in rows)
    assert all(r.auditable_id in mine for r in rows if r.auditable_type == "AgentMemory")
    merged = [r for r in rows if r.action == "memory_refinement_consolidate"]
    assert merged and all(r.data["merged_into"] in mine for r in merged)
    undone = next(r for r in rows if r.action == "memory_undo")
    assert db.session.get(AuditLog, undone.data["undo_of"]).action == "memory_update"
    assert db.session.get(AuditLog, undone.data["undo_of"]).agent_id == copy.id
    created = next(r for r in rows if r.action == "memory_create" and r.data.get("chat_id"))
    assert db.session.get(Chat, created.data["chat_id"]).account_id == stranger.account_id
    assert created.user_id is None or db.session.get(User, created.user_id).account_id == stranger.account_id
    by_dana = next(r for r in rows if r.action == "memory_delete")
    assert by_dana.user_id is None and by_dana.data["who"] == {"name": "dana", "email": "dana@example.com"}

    session = next(r.session_id for r in rows if r.action == "memory_refinement_start")
    assert rollback_session(session, user_id=stranger.id, via="admin") == 3
    db.session.commit()
    original = db.session.scalars(
        sa.select(AgentMemory.content).where(AgentMemory.agent_id == ada.id, AgentMemory.is_active)
    ).all()
    assert "Dana likes red" not in original  # Ada's own session is untouched


def test_with_chats_round_trip_reproduces_the_chats_messages_and_provenance(runner, ada, stranger):
    first = _export(runner, "Ada", "--with-chats")

    assert _import(runner, first, "--account", "Globex").exit_code == 0
    second = _export(runner, "Ada", "--account", "Globex", "--with-chats")

    assert second["memories"] == first["memories"]
    roses_messages = [m["ref"] for c in first["chats"] if c["title"] == "Roses" for m in c["messages"]]
    assert (
        next(m for m in first["memories"] if m["content"] == "Dana grows roses")["sources"] == roses_messages
    )
    _same_sessions(first["audit"], second["audit"][:-1])
    compared = ("ref", "included", "title", "source", "group", "created_at", "last_message_at",
                "discarded_at", "other_agents", "joined_at", "summary", "summary_generated_at",
                "consolidated_through", "last_consolidated_at", "memory_doc", "compacted_through", "messages")  # fmt: skip
    assert [{k: c.get(k) for k in compared} for c in second["chats"]] == [
        {k: c.get(k) for k in compared} for c in first["chats"]
    ]
    roses = next(c for c in first["chats"] if c["title"] == "Roses")
    assert [m["author"]["kind"] for m in roses["messages"]] == ["person", "self"]
    assert roses["messages"][1]["sources"]["memories"] == ["m1", "m2"]
    team = next(c for c in first["chats"] if c["title"] == "Team")
    assert team["other_agents"] == ["Basil"]
    assert team["messages"][0]["author"] == {"kind": "agent", "name": "Basil", "email": None}
    # The copy's chats are the importer's and its own: Basil is not in them, and nothing is consolidated again.
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    linked = db.session.scalars(
        sa.select(ChatAgent.agent_id).join(Chat).where(Chat.account_id == stranger.account_id)
    )
    assert set(linked) == {copy.id}
    queued = set(db.session.scalars(sa.select(EmbeddingQueue.row_id).where(EmbeddingQueue.kind == "message")))
    copied = set(
        db.session.scalars(sa.select(Message.id).join(Chat).where(Chat.account_id == stranger.account_id))
    )
    assert copied and copied <= queued


def test_the_file_holds_nothing_of_other_agents_other_accounts_or_secrets(runner, ada, stranger, app):
    factories.agent(stranger.account, "Ada")
    text = runner.invoke(args=["agents", "export", "Ada", "--account", "Acme", "--with-chats"]).stdout
    document = json.loads(text)

    assert "Basil's own secret" not in text
    ada_memories = db.session.scalars(sa.select(AgentMemory.content).where(AgentMemory.agent_id == ada.id))
    assert sorted(m["content"] for m in document["memories"]) == sorted(ada_memories)
    assert "pbkdf2" not in text and "scrypt" not in text and "password" not in text
    assert app.config["SECRET_KEY"] not in text
    assert "globex" not in text.lower()
    assert document["format"] == "cairn-agent" and document["version"] == 2


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda text: text[: len(text) // 2], "not complete JSON"),
        (
            lambda text: text.replace('"version": 2', '"version": 3', 1),
            "version 3, newer than this Cairn reads",
        ),
        (lambda text: text.replace('"chat_id": "c1"', '"chat_id": 1', 1), "names a database id"),
        (
            lambda text: text.replace('"merged_into": "m', '"merged_into": "m9', 1),
            "which the file does not hold",
        ),
        (
            lambda text: text.replace('"memory_type": "core"', '"memory_type": "forever"', 1),
            "does not follow the cairn-agent format at memories",
        ),
    ],
    ids=["truncated", "newer-version", "another-accounts-id", "dangling-reference", "schema"],
)
def test_a_bad_file_is_refused_whole_changing_nothing(runner, ada, stranger, spoil, says):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    before = _counts()

    result = runner.invoke(args=["agents", "import", "-", "--account", "Globex"], input=spoil(text))

    assert result.exit_code == 1
    assert says in result.output and "Nothing was imported." in result.output
    assert "Traceback" not in result.output
    assert _counts() == before


def test_a_name_clash_is_refused_unless_given_another_name(runner, ada, admin):
    document = _export(runner, "Ada")
    before = _counts()

    refused = _import(runner, document, "--account", "Acme")
    assert refused.exit_code == 1
    assert (
        "An agent named 'Ada' is in account 'Acme' already. Import it under another name with --as NAME."
        in refused.output
    )
    assert _counts() == before

    done = _import(runner, document, "--account", "Acme", "--as", "Ada 2")
    assert done.exit_code == 0, done.output
    copy = db.session.scalar(sa.select(Agent).where(Agent.name == "Ada 2"))
    assert copy.slug == "ada-2" and copy.system_prompt == ada.system_prompt
    # In its own account, the people are the same people: the private chats stay theirs alone.
    roses = db.session.get(
        Chat,
        db.session.scalar(
            sa.select(AgentMemory.chat_id).where(
                AgentMemory.agent_id == copy.id, AgentMemory.content == "Dana grows roses"
            )
        ),
    )
    assert [p.user_id for p in roses.chat_people] == [admin.id] and roses.id != ada.id
    row = db.session.scalar(
        sa.select(AuditLog).where(AuditLog.agent_id == copy.id, AuditLog.action == "memory_delete")
    )
    assert row.user_id == admin.id and "who" not in row.data


def test_export_writes_to_stdout_and_audits_itself(runner, ada):
    result = runner.invoke(args=["agents", "export", str(ada.id)])

    assert result.exit_code == 0
    assert json.loads(result.stdout)["agent"]["name"] == "Ada"
    assert "Exported Ada: 8 memories" in result.stderr
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "agent_export"))
    assert row.agent_id == ada.id and row.data["via"] == "cli" and row.data["memories"] == 8


def test_cli_import_reads_a_file(runner, ada, stranger, tmp_path):
    path = tmp_path / "ada.cairn.json"
    assert runner.invoke(args=["agents", "export", "Ada", "-o", str(path)]).exit_code == 0

    result = runner.invoke(
        args=["agents", "import", str(path), "--account", str(stranger.account_id), "--as", "Ada Lovelace"]
    )

    assert result.exit_code == 0, result.output
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    assert copy.name == "Ada Lovelace" and copy.slug == "ada-lovelace"
    assert f"Its id: {copy.id}, in account 'Globex'." in result.output


def test_the_schema_in_docs_is_the_one_files_are_checked_against(runner):
    assert json.loads((ROOT / "docs" / "cairn-agent.schema.json").read_text()) == SCHEMA
    assert json.loads(runner.invoke(args=["agents", "schema"]).stdout) == SCHEMA


# The download button and the upload form.


def test_the_agent_page_offers_downloads_to_admins(client, signed_in, ada):
    page = client.get(f"/agents/{ada.id}/edit")

    assert f'action="/agents/{ada.id}/export"' in page.text
    assert "Download with chats" in page.text


def test_download_is_the_agent_file_with_the_chats_the_admin_may_read(client, signed_in, ada):
    response = client.post(f"/agents/{ada.id}/export", data={"with_chats": "1"})

    assert response.status_code == 200
    assert response.headers["Content-Disposition"] == 'attachment; filename="ada.cairn.json"'
    document = json.loads(response.data)
    chats = {c["ref"]: c for c in document["chats"]}
    assert {c["title"] for c in chats.values() if c["included"]} == {"Roses", "Team"}
    milos = next(c for c in chats.values() if c["people"] and c["people"][0]["name"] == "milo")
    assert milos["title"] is None and not milos["included"] and "messages" not in milos
    assert "Plan a surprise" not in response.text
    surprise = next(m for m in document["memories"] if m["content"] == "Milo plans a surprise for Dana")
    assert "sources" not in surprise  # its message is in a chat the admin may not read
    faded = next(m for m in document["memories"] if m["content"] == "Dana grows roses")
    assert len(faded["sources"]) == 2
    assert document["exported_by"] == {"name": "dana", "email": "dana@example.com"}
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "agent_export"))
    assert row.user_id == signed_in.id and row.data["with_chats"] is True


def test_upload_imports_a_new_agent(client, signed_in, runner, ada):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    page = client.get("/agents/")
    assert 'enctype="multipart/form-data"' in page.text and "Import an agent" in page.text

    response = client.post(
        "/agents/import", data={"file": (io.BytesIO(text.encode()), "ada.cairn.json"), "name": "Ada copy"}
    )

    copy = db.session.scalar(sa.select(Agent).where(Agent.name == "Ada copy"))
    assert response.status_code == 303 and response.headers["Location"] == f"/admin/agents/{copy.id}/memories"
    assert "Imported Ada copy: 8 memories" in client.get(response.headers["Location"]).text
    row = db.session.scalar(
        sa.select(AuditLog).where(AuditLog.agent_id == copy.id, AuditLog.action == "agent_import")
    )
    assert row.user_id == signed_in.id and row.data["via"] == "web"


def test_upload_of_a_bad_file_says_why_and_changes_nothing(client, signed_in, runner, ada):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    before = _counts()

    cut = client.post("/agents/import", data={"file": (io.BytesIO(text[:100].encode()), "ada.cairn.json")})

    assert cut.status_code == 422 and "not complete JSON (was it cut short?)" in cut.text
    assert 'id="kept-file"' not in cut.text  # a refused file is not kept
    assert _counts() == before


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"name,email\nAda,ada@example.com\n", "The file is not an agent file: it is not JSON."),
        (
            b'{"openapi": "3.1.0", "paths": {}}',
            "The file is not an agent file: it is JSON, but not an agent&#39;s.",
        ),
        (
            b'[{"role": "user", "content": "hi"}]',
            "The file is not an agent file: it is JSON, but not an agent&#39;s.",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff", "The file is not an agent file: it is not text."),
    ],
    ids=["csv", "json-of-another-shape", "json-list", "image"],
)
def test_a_file_that_is_not_an_agent_file_says_so(client, signed_in, content, says):
    before = _counts()

    response = client.post("/agents/import", data={"file": (io.BytesIO(content), "notes.json")})

    assert response.status_code == 422
    assert says in response.text and "Download button saves" in response.text
    assert "cut short" not in response.text
    assert _counts() == before


def test_a_taken_name_offers_the_next_free_one_and_keeps_the_file(client, signed_in, runner, ada, app):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    factories.agent(signed_in.account, "Ada 2")
    before = _counts()

    clash = client.post("/agents/import", data={"file": (io.BytesIO(text.encode()), "ada.cairn.json")})

    assert clash.status_code == 422 and _counts() == before
    assert "An agent named &#39;Ada&#39; is in account &#39;Acme&#39; already." in clash.text
    assert "“Ada 3” is free: import it under that name, or give it another." in clash.text
    assert _input_value(clash.text, "name") == "Ada 3"
    assert re.search(r'id="kept-file"[^>]*>The file <strong>ada.cairn.json</strong> is kept', clash.text)
    kept = _input_value(clash.text, "kept")
    assert kept

    # The name alone, with no file chosen again: the kept file is imported under it.
    response = client.post("/agents/import", data={"kept": kept, "name": "Ada 3"})

    copy = db.session.scalar(sa.select(Agent).where(Agent.name == "Ada 3"))
    assert response.status_code == 303 and response.headers["Location"] == f"/admin/agents/{copy.id}/memories"
    assert not app.extensions["redis"].keys("cairn:agent-upload:*")  # used: no longer kept
    again = client.post("/agents/import", data={"kept": kept, "name": "Ada 4"})
    assert again.status_code == 422 and "Choose a file." in again.text


def _input_value(html: str, input_id: str) -> str:
    tag = re.search(rf'<input[^>]*\bid="{input_id}"[^>]*>', html).group(0)
    return re.search(r'\bvalue="([^"]*)"', tag).group(1)


def test_a_kept_file_is_its_uploaders_only_and_expires(client, signed_in, auth, runner, ada, app):
    text = runner.invoke(args=["agents", "export", "Ada"]).stdout
    clash = client.post("/agents/import", data={"file": (io.BytesIO(text.encode()), "ada.cairn.json")})
    kept = _input_value(clash.text, "kept")
    (key,) = app.extensions["redis"].keys("cairn:agent-upload:*")
    assert 0 < app.extensions["redis"].ttl(key) <= 3600

    other = factories.user(signed_in.account, "omar@example.com", "admin")
    auth.login(other)
    refused = client.post("/agents/import", data={"kept": kept, "name": "Ada 3"})

    assert refused.status_code == 422 and "Choose a file." in refused.text
    assert db.session.scalar(sa.select(Agent).where(Agent.name == "Ada 3")) is None


def test_members_may_neither_download_nor_upload(client, auth, member, ada):
    auth.login(member)
    before = _counts()

    assert client.post(f"/agents/{ada.id}/export").status_code == 403
    assert client.post("/agents/import", data={"file": (io.BytesIO(b"{}"), "x.json")}).status_code == 403
    assert _counts() == before


def test_another_accounts_agent_is_not_found(client, auth, stranger, ada):
    auth.login(stranger)

    assert client.post(f"/agents/{ada.id}/export").status_code == 404


def test_download_and_upload_need_the_csrf_token(app, client, signed_in, ada):
    app.config["WTF_CSRF_ENABLED"] = True
    before = _counts()

    assert client.post(f"/agents/{ada.id}/export").status_code == 400
    assert client.post("/agents/import", data={"file": (io.BytesIO(b"{}"), "x.json")}).status_code == 400
    assert _counts() == before


# One --agent option everywhere.


def test_agent_options_take_a_name_a_slug_or_an_id(runner, admin, stranger):
    ada = factories.agent(admin.account, "Ada Lovelace")
    globex_ada = factories.agent(stranger.account, "Ada Lovelace")

    by_id = runner.invoke(args=["memories", "dedup", "--agent", str(ada.id)])
    by_slug = runner.invoke(args=["memories", "dedup", "--agent", "ada-lovelace", "--account", "Globex"])
    ambiguous = runner.invoke(args=["memories", "dedup", "--agent", "Ada Lovelace"])
    by_name = runner.invoke(args=["memories", "reflect", "--agent", "Ada Lovelace", "--account", "Acme"])
    unknown = runner.invoke(args=["summaries", "backfill", "--agent", "Zed"])

    assert f"agent {ada.id}: 0 duplicates removed" in by_id.output
    assert f"agent {globex_ada.id}: 0 duplicates removed" in by_slug.output
    assert ambiguous.exit_code == 1
    assert (
        "Agents named 'Ada Lovelace' are in several accounts ('Acme', 'Globex'): say which with --account."
        in ambiguous.output
    )
    assert f"agent {ada.id}: enqueued" in by_name.output
    assert "No agent is named 'Zed'" in unknown.output and unknown.exit_code == 1


# Letta Agent Files (.af), in the format of Letta's AgentFileSchema.


def _letta_file(agents: int = 1) -> dict:
    agent = {
        "id": "agent-0",
        "name": "sam",
        "system": "You are Sam, a helpful assistant.",
        "agent_type": "letta_v1_agent",
        "block_ids": ["block-0", "block-1", "block-2"],
        "tool_ids": ["tool-0"],
        "llm_config": {"model": "gpt-4o-mini", "context_window": 32000},
        "messages": [{"id": "message-0", "role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    return {
        "agents": [dict(agent, id=f"agent-{i}") for i in range(agents)],
        "groups": [],
        "blocks": [
            {"id": "block-0", "label": "human", "value": "First name: Chad\nLikes sailing.", "limit": 5000},
            {"id": "block-1", "label": "persona", "value": "I am Sam.", "read_only": True, "limit": 5000},
            {"id": "block-2", "label": "notes", "value": ("word " * 1500 + "\n\n") * 3, "limit": 20000},
        ],
        "files": [],
        "sources": [],
        "tools": [{"id": "tool-0", "name": "conversation_search", "source_code": None}],
        "mcp_servers": [],
        "metadata": {"revision_id": "x"},
        "created_at": "2025-11-21T03:05:34.027937+00:00",
    }


def test_a_letta_agent_file_becomes_an_agent_with_core_memories(runner, admin, app):
    result = runner.invoke(args=["agents", "import", "-"], input=json.dumps(_letta_file()))

    assert result.exit_code == 0, result.output
    sam = db.session.scalar(sa.select(Agent).where(Agent.name == "sam"))
    assert sam.system_prompt == "You are Sam, a helpful assistant."
    assert sam.model_id == app.config["DEFAULT_MODEL_ID"]
    memories = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.agent_id == sam.id).order_by(AgentMemory.id)
    ).all()
    assert [m.content for m in memories[:2]] == [
        "human: First name: Chad\nLikes sailing.",
        "persona: I am Sam.",
    ]
    assert [m.constitutional for m in memories[:2]] == [False, True]
    assert {m.memory_type for m in memories} == {"core"} and {m.audience for m in memories} == {"everyone"}
    notes = [m.content for m in memories[2:]]
    assert len(notes) == 3 and notes[0].startswith("notes (1 of 3): word")
    created = db.session.scalars(
        sa.select(AuditLog).where(AuditLog.agent_id == sam.id, AuditLog.action == "memory_create")
    )
    assert {r.data["via"] for r in created} == {"letta-import"}


def test_a_letta_file_saved_as_a_json_string_is_read_too(app):
    assert read(json.dumps(json.dumps(_letta_file())))["agent"]["name"] == "sam"


def test_a_letta_file_of_several_agents_is_refused(runner, admin):
    before = _counts()

    result = runner.invoke(args=["agents", "import", "-"], input=json.dumps(_letta_file(agents=2)))

    assert (
        result.exit_code == 1
        and "holds 2 agents ('sam', 'sam'); Cairn imports one at a time." in result.output
    )
    assert _counts() == before


def test_the_audit_log_names_who_made_an_imported_change_and_the_import(runner, client, auth, ada, stranger):
    _import(runner, _export(runner, "Ada"), "--account", "Globex", "--by", "eve@globex.example")
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    auth.login(stranger)

    page = client.get(f"/admin/audit?agent={copy.id}").text

    assert "dana@example.com (imported)" in page
    assert "agent imported from a file" in page and "eve@globex.example" in page
