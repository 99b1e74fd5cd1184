"""Migrations that fill in data on a database already in use: chats' last_message_at, job_runs' account."""

import json

import pytest
import sqlalchemy as sa

from tests.test_cli import _empty_database, flask

ROWS = [
    "INSERT INTO accounts (id, name, created_at) VALUES (1, 'Acme', '2026-01-01'), (2, 'Globex', '2026-01-01')",
    "INSERT INTO agents (id, account_id, name, system_prompt, model_id, enabled_tools, core_token_budget, paused, "
    "created_at, updated_at) VALUES (5, 2, 'Ada', '', 'm', '[]', 5000, false, '2026-01-01', '2026-01-01')",
    "INSERT INTO chats (id, account_id, title, manual_responses, memory_doc, created_at, updated_at) VALUES "
    "(3, 1, 'Busy', true, '', '2026-01-01 08:00:00', '2026-03-01 00:00:00'), "
    "(4, 2, 'Empty', true, '', '2026-01-02 08:00:00', '2026-03-01 00:00:00')",
    "INSERT INTO messages (id, chat_id, role, content, status, created_at, updated_at) VALUES "
    "(7, 3, 'user', 'a', 'done', '2026-02-01 10:00:00', '2026-02-01 10:00:00'), "
    "(8, 3, 'user', 'b', 'done', '2026-02-02 11:00:00', '2026-02-02 11:00:00')",
    "INSERT INTO job_runs (id, job_type, target, args, status, started_at, counts) VALUES "
    "(1, 'consolidate', 'chat:3', '[3]', 'done', '2026-02-03', '{}'), "
    "(2, 'reflect', 'agent:5', '[5]', 'failed', '2026-02-03', '{}'), "
    "(3, 'summarize', 'chat:4 agent:5', '[4, 5]', 'done', '2026-02-03', '{}'), "
    "(4, 'reply', 'messages:8,7', '[[8, 7]]', 'failed', '2026-02-03', '{}'), "
    "(5, 'consolidate_finder', NULL, '[]', 'done', '2026-02-03', '{}'), "
    "(6, 'consolidate', 'chat:999', '[999]', 'failed', '2026-02-03', '{}'), "
    "(7, 'reply', 'messages:oops', '[]', 'failed', '2026-02-03', '{}')",
]


def test_upgrading_fills_in_last_message_at_and_job_run_accounts(tmp_path):
    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "4b521acc2bf4", env=env).returncode == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in ROWS:
            conn.execute(sa.text(statement))

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        last = dict(conn.execute(sa.text("SELECT id, last_message_at FROM chats")).all())
        accounts = dict(conn.execute(sa.text("SELECT id, account_id FROM job_runs")).all())
    engine.dispose()
    assert {k: str(v)[:19] for k, v in last.items()} == {3: "2026-02-02 11:00:00", 4: "2026-01-02 08:00:00"}
    assert accounts == {1: 1, 2: 2, 3: 2, 4: 1, 5: None, 6: None, 7: None}


def test_after_every_migration_the_word_index_follows_new_and_edited_memories_and_messages(app):
    """SQLite's batch mode rebuilds a table as a new one, dropping its triggers; the migration that does so to a
    searched table must make the triggers that keep its FTS5 index in step again."""
    from tests import factories
    from webapp.extensions import db
    from webapp.models import AgentMemory, Message
    from webapp.search import Match, ranked

    acme = factories.account()
    ada = factories.agent(acme)
    memory = factories.memory(ada, "The spare greenhouse key is under the blue watering can.")
    message = factories.message(factories.chat(acme, [ada]), "The tulips survived the frost.")

    def found(model, text):
        return set(db.session.scalars(sa.select(ranked(model, text, Match.ANY_WORD).c.id)))

    assert found(AgentMemory, "greenhouse") == {memory.id}
    assert found(Message, "tulips") == {message.id}
    memory.content = "The spare shed key is in the drawer."
    db.session.commit()
    assert found(AgentMemory, "greenhouse") == set() and found(AgentMemory, "drawer") == {memory.id}


def test_upgrading_keeps_every_chat_readable_by_the_account_and_gives_each_agent_a_slug(tmp_path):
    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "5a7c9e1b3d60", env=env).returncode == 0
    engine = sa.create_engine(url)
    agent = (
        "INSERT INTO agents (id, account_id, name, system_prompt, model_id, enabled_tools, core_token_budget, "
        "paused, consolidates_direct_chats, members_see_memory, created_at, updated_at) VALUES "
        "({id}, {account}, '{name}', '', 'm', '[]', 5000, false, true, 'prompt', '2026-01-01', '2026-01-01')"
    )
    with engine.begin() as conn:
        conn.execute(sa.text(ROWS[0]))
        for id_, account, name in [(1, 1, "Ada"), (2, 1, "ADA!"), (3, 1, "Zoë"), (4, 1, "🤖"), (5, 2, "Ada")]:
            conn.execute(sa.text(agent.format(id=id_, account=account, name=name)))
        conn.execute(
            sa.text(
                "INSERT INTO chats (id, account_id, title, manual_responses, memory_doc, created_at, updated_at, "
                "last_message_at) VALUES (3, 1, 'Busy', true, '', '2026-01-01', '2026-01-01', '2026-01-01'), "
                "(4, 2, 'Empty', true, '', '2026-01-02', '2026-01-02', '2026-01-02')"
            )
        )

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        slugs = dict(conn.execute(sa.text("SELECT id, slug FROM agents")).all())
        chats = conn.execute(
            sa.text("SELECT id, visibility, source, started_by_id FROM chats ORDER BY id")
        ).all()
    engine.dispose()
    assert slugs == {1: "ada", 2: "ada-2", 3: "zoe", 4: "agent", 5: "ada"}
    assert [tuple(c) for c in chats] == [(3, "shared", "web", None), (4, "shared", "web", None)]


def test_an_agent_of_an_install_before_connections_answers_through_the_environments_provider(
    tmp_path, fake_llm
):
    """Upgrading adds connections without moving data: an agent made before them has none, which is the
    environment's provider (LLM_BASE_URL and LLM_API_KEY, read from the settings), so it answers as before."""
    import fakeredis
    from rq import Queue

    from tests.conftest import _settings
    from webapp.extensions import db
    from webapp.factory import create_app
    from webapp.jobs.replies import request_replies, respond
    from webapp.llm import targets
    from webapp.models import Agent, Chat, Message

    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "b7d9f1a3c5e7", env=env).returncode == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(ROWS[0]))
        conn.execute(
            sa.text(
                "INSERT INTO agents (id, account_id, name, slug, system_prompt, model_id, enabled_tools, "
                "core_token_budget, paused, consolidates_direct_chats, members_see_memory, background_changes, "
                "created_at, updated_at) VALUES (5, 1, 'Ada', 'ada', '', 'ada-model', '[]', 5000, false, true, "
                "'prompt', 'automatic', '2026-01-01', '2026-01-01')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO chats (id, account_id, title, manual_responses, memory_doc, visibility, source, "
                "created_at, updated_at, last_message_at) VALUES (3, 1, 'Old', false, '', 'shared', 'web', "
                "'2026-01-01', '2026-01-01', '2026-01-01')"
            )
        )
        conn.execute(
            sa.text("INSERT INTO chat_agents (chat_id, agent_id, created_at) VALUES (3, 5, '2026-01-01')")
        )
    engine.dispose()

    assert flask("db", "upgrade", env=env).returncode == 0

    app = create_app(_settings(url, fake_llm.base_url))
    redis = fakeredis.FakeRedis()
    app.extensions.update(redis=redis, rq_queue=Queue(app.config["RQ_QUEUE"], connection=redis))
    with app.app_context():
        chat, ada = db.session.get(Chat, 3), db.session.get(Agent, 5)
        assert ada.connection_id is None and targets.for_agent(ada).base_url == fake_llm.base_url
        chat.add_message(role="user", content="Still there?", status="done")
        db.session.commit()
        fake_llm.reply("Yes, as before.")
        [reply] = request_replies(chat, [ada])
        db.session.commit()
        respond([reply.id])
        assert db.session.get(Message, reply.id).content == "Yes, as before."
        assert fake_llm.requests[-1]["model"] == "ada-model"
        assert fake_llm.headers[-1]["authorization"] == "Bearer local"
        db.session.remove()
        db.engine.dispose()


def test_upgrading_ties_old_memories_to_the_chats_they_came_from_without_a_command(tmp_path):
    """Issue 31, item 4: nothing depends on an operator remembering `flask memories backfill-audience`."""
    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "e8a0c2d4f6b8", env=env).returncode == 0
    engine = sa.create_engine(url)
    memory = (
        "INSERT INTO agent_memories (id, agent_id, content, memory_type, constitutional, content_hash, "
        "token_estimate, audience, created_at, updated_at) VALUES ({id}, 5, '{text}', 'core', false, 'h{id}', 3, "
        "'everyone', '2026-01-01', '2026-01-01')"
    )
    created = (
        "INSERT INTO audit_logs (account_id, agent_id, action, auditable_type, auditable_id, data, created_at) "
        "VALUES (1, 5, 'memory_create', 'AgentMemory', {id}, '{data}', '2026-01-01')"
    )
    with engine.begin() as conn:
        conn.execute(sa.text(ROWS[0]))
        conn.execute(
            sa.text(
                "INSERT INTO agents (id, account_id, name, slug, system_prompt, model_id, enabled_tools, "
                "core_token_budget, paused, consolidates_direct_chats, members_see_memory, background_changes, "
                "created_at, updated_at) VALUES (5, 1, 'Ada', 'ada', '', 'm', '[]', 5000, false, true, "
                "'prompt', 'automatic', '2026-01-01', '2026-01-01')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO chats (id, account_id, title, manual_responses, memory_doc, visibility, source, "
                "created_at, updated_at, last_message_at) VALUES "
                "(3, 1, 'Made private since', false, '', 'private', 'web', '2026-01-01', '2026-01-01', '2026-01-01'),"
                "(4, 1, 'Shared', false, '', 'shared', 'web', '2026-01-01', '2026-01-01', '2026-01-01'),"
                "(9, 2, 'Globex', false, '', 'shared', 'web', '2026-01-01', '2026-01-01', '2026-01-01')"
            )
        )
        for id_, text, data in [
            (1, "Told in private.", '{"via": "save_memory", "chat_id": 3}'),
            (2, "Consolidated.", '{"via": "consolidation", "chat_id": 4}'),
            (3, "Typed by an admin.", '{"via": "admin"}'),
            (4, "Names another account.", '{"via": "consolidation", "chat_id": 9}'),
        ]:
            conn.execute(sa.text(memory.format(id=id_, text=text)))
            conn.execute(sa.text(created.format(id=id_, data=data)))

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        tied = conn.execute(sa.text("SELECT id, chat_id, audience FROM agent_memories ORDER BY id")).all()
        audited = conn.execute(
            sa.text(
                "SELECT auditable_id, data FROM audit_logs WHERE action = 'memory_audience' ORDER BY auditable_id"
            )
        ).all()
    engine.dispose()
    assert [tuple(row) for row in tied] == [
        (1, 3, "chat"),
        (2, 4, "chat"),
        (3, None, "everyone"),
        (4, None, "everyone"),
    ]
    assert [row.auditable_id for row in audited] == [1, 2]
    data = audited[0].data if isinstance(audited[0].data, dict) else json.loads(audited[0].data)
    assert (data["before"]["audience"], data["after"]["audience"], data["via"]) == (
        "everyone",
        "chat",
        "migration",
    )


def test_upgrading_leaves_one_chat_per_person_agent_and_client_id_with_the_one_it_leads_to(tmp_path):
    """Issue 31.14: racing requests made several chats with one client id. The id stays with the chat the API
    continued (not discarded, newest activity); the others keep their messages, no longer named by it."""
    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    assert flask("db", "upgrade", "a4c6e8f0b2d4", env=env).returncode == 0
    engine = sa.create_engine(url)
    chat = (
        "INSERT INTO chats (id, account_id, title, manual_responses, memory_doc, visibility, source, "
        "started_by_id, client_conversation_id, discarded_at, created_at, updated_at, last_message_at) VALUES "
        "({id}, 1, '', false, '', 'private', 'api', {by}, {client}, {discarded}, '2026-01-01', '2026-01-01', "
        "'2026-01-0{day}')"
    )
    chats = [  # id, person, client id, discarded, day of the last message, agent
        (1, 1, "'race'", "NULL", 2, 5),
        (2, 1, "'race'", "NULL", 3, 5),  # the newest activity: where the id led
        (3, 1, "'race'", "'2026-01-05'", 4, 5),  # discarded
        (4, 1, "'race'", "NULL", 1, 6),  # the same id with another agent is another conversation
        (5, 2, "'race'", "NULL", 1, 5),  # and with another person
        (6, 1, "NULL", "NULL", 1, 5),
    ]
    with engine.begin() as conn:
        conn.execute(sa.text(ROWS[0]))
        conn.execute(
            sa.text(
                "INSERT INTO users (id, account_id, email, password_hash, role, created_at) VALUES "
                "(1, 1, 'ana@example.com', 'x', 'admin', '2026-01-01'), "
                "(2, 1, 'ben@example.com', 'x', 'member', '2026-01-01')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO agents (id, account_id, name, slug, system_prompt, model_id, enabled_tools, "
                "core_token_budget, paused, consolidates_direct_chats, members_see_memory, background_changes, "
                "created_at, updated_at) VALUES (5, 1, 'Ada', 'ada', '', 'm', '[]', 5000, false, true, "
                "'prompt', 'automatic', '2026-01-01', '2026-01-01'), (6, 1, 'Basil', 'basil', '', 'm', '[]', "
                "5000, false, true, 'prompt', 'automatic', '2026-01-01', '2026-01-01')"
            )
        )
        for id_, by, client, discarded, day, agent in chats:
            conn.execute(sa.text(chat.format(id=id_, by=by, client=client, discarded=discarded, day=day)))
            conn.execute(
                sa.text(
                    f"INSERT INTO chat_agents (chat_id, agent_id, created_at) VALUES ({id_}, {agent}, '2026-01-01')"
                )
            )
    engine.dispose()

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        named = conn.execute(
            sa.text("SELECT id, client_conversation_id, client_agent_id FROM chats ORDER BY id")
        ).all()
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text(chat.format(id=7, by=1, client="'race'", discarded="NULL", day=9)))
        conn.execute(sa.text("UPDATE chats SET client_agent_id = 5 WHERE id = 7"))
    engine.dispose()
    assert [tuple(row) for row in named] == [
        (1, None, None),
        (2, "race", 5),
        (3, None, None),
        (4, "race", 6),
        (5, "race", 5),
        (6, None, None),
    ]
