"""Spec 003 end to end: opaque ids, the prompt's other-conversations and borrowed blocks, the chat page's panel."""

from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
from rq import SimpleWorker

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.queue import worker_queues
from webapp.models import ChatAgent, public_ids
from webapp.prompting.build import build_prompt
from webapp.timeutil import utcnow

NOW = "2026-11-21 12:00:00Z"
OTHERS_HEADING = "# Your Other Active Conversations"


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context"])


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


@pytest.fixture
def here(admin, ada, basil):
    return factories.chat(admin.account, [ada, basil], "Garden club")


def _context(chat, agent) -> str:
    return build_prompt(chat, agent).messages[-1]["content"]


def _run_worker(app) -> None:
    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)


# Opaque ids


def test_opaque_ids_round_trip_and_hide_the_database_id(app):
    encoded = [public_ids.encode(i) for i in (1, 2, 3, 12345)]

    assert [public_ids.decode(e) for e in encoded] == [1, 2, 3, 12345]
    assert all(len(e) >= 8 and e.isalnum() for e in encoded)
    assert all(str(i) not in e for i, e in zip((1, 2, 3, 12345), encoded, strict=True))


def test_opaque_ids_reject_anything_the_app_did_not_make(app):
    valid = public_ids.encode(7)

    for bad in ("", "7", "not-an-id!", valid + "x", valid.swapcase(), "ü" * 8, f" {valid} x"):
        assert public_ids.decode(bad) is None, bad
    assert public_ids.decode(f"  {valid} ") == 7


def test_opaque_ids_differ_between_deployments(app):
    ours = public_ids.encode(7)
    app.config["SECRET_KEY"] = "another deployment"

    assert public_ids.encode(7) != ours
    assert public_ids.decode(ours) != 7


# The prompt


def test_no_block_without_other_conversations(here, ada):
    context = _context(here, ada)

    assert OTHERS_HEADING not in context and "# Borrowed Context" not in context


@time_machine.travel(NOW, tick=False)
def test_the_block_lists_other_conversations_by_opaque_id_and_title(admin, here, ada):
    roses = factories.chat(admin.account, [ada], "Roses")
    untitled = factories.chat(admin.account, [ada], "")
    factories.summary(roses, ada, "Choosing a rose for the north wall.\nPending: soil test.")
    factories.summary(untitled, ada, "Dana's tomatoes have blight.")
    untitled.last_message_at = utcnow() - timedelta(hours=1)
    db.session.commit()
    factories.memory(ada, "I love roses.")

    context = _context(here, ada)

    block = context[context.index(OTHERS_HEADING) :]
    assert block.startswith(
        f"{OTHERS_HEADING}\n\nYou are also participating in these conversations (updated in last 6 hours):\n\n"
        f'- [{roses.public_id}] "Roses": Choosing a rose for the north wall. Pending: soil test.\n'
        f'- [{untitled.public_id}] "Untitled conversation": Dana\'s tomatoes have blight.\n\n'
        "If any of these are relevant to the current discussion, you can use the borrow_context tool"
    )
    assert f"Conversation {untitled.id}" not in block and f"[{untitled.id}]" not in block
    assert context.index("# Your memory") < context.index(OTHERS_HEADING) < context.index("# Now")


def test_the_block_offers_borrowing_only_to_an_agent_with_the_tool(admin, here, basil):
    roses = factories.chat(admin.account, [basil], "Roses")
    factories.summary(roses, basil, "Basil's view of roses.")

    context = _context(here, basil)

    assert "Basil's view of roses." in context and "borrow_context" not in context


def test_each_agent_sees_only_its_own_summaries(admin, here, ada, basil, stranger):
    shared = factories.chat(admin.account, [ada, basil], "Shared")
    factories.summary(shared, ada, "Ada's take.")
    factories.summary(shared, basil, "Basil's take.")
    alone = factories.chat(admin.account, [basil], "Basil alone")
    factories.summary(alone, basil, "Only Basil is here.")
    foreign = factories.chat(stranger.account, [ada, factories.agent(stranger.account, "Mallory")], "Globex")
    factories.summary(foreign, ada, "Globex plans.")

    ada_context, basil_context = _context(here, ada), _context(here, basil)

    assert "Ada's take." in ada_context and "Basil's take." not in ada_context
    assert "Only Basil is here." not in ada_context and "Basil alone" not in ada_context
    assert "Globex" not in ada_context
    assert "Basil's take." in basil_context and "Only Basil is here." in basil_context


def test_the_borrowed_block_is_read_without_being_consumed(admin, here, ada):
    source = factories.chat(admin.account, [ada], "Roses")  # a chat that may be heard here (both are shared)
    staged = {
        "source_conversation_id": source.public_id,
        "messages": [{"author": "dana", "content": "North wall."}, {"author": "Ada", "content": "Climbers."}],
        "staged_at": "2026-11-21T12:00:00.000001",
    }
    factories.summary(here, ada, "s", borrowed_context_json=staged)

    with time_machine.travel(utcnow(), tick=False):  # both prompts in one minute: they show the time
        first, second = build_prompt(here, ada), build_prompt(here, ada)

    context = first.messages[-1]["content"]
    assert (
        f"# Borrowed Context from Conversation {source.public_id}\n\n"
        "You requested context from another conversation. Here are the recent messages:\n\n"
        "[dana]: North wall.\n[Ada]: Climbers.\n\n"
        "This context is provided for reference only and will not appear in future activations."
    ) in context
    assert first.borrowed_context == second.borrowed_context == staged
    assert second.messages == first.messages
    assert db.session.scalar(
        sa.select(ChatAgent.borrowed_context_json).where(
            ChatAgent.agent_id == ada.id, ChatAgent.chat_id == here.id
        )
    )
    assert "# Borrowed Context" not in _context(here, factories.agent(admin.account, "Cleo"))


def test_prompt_queries_stay_constant_with_other_conversations_and_borrowed_context(admin, here, ada):
    def queries_with(n_other_chats: int) -> int:
        for i in range(n_other_chats):
            other = factories.chat(admin.account, [ada], f"Other {n_other_chats}-{i}")
            factories.message(other, "hello", author=admin)
            factories.summary(other, ada, f"Summary {i}.")
        factories.summary(
            here,
            ada,
            "s",
            borrowed_context_json={"source_conversation_id": "x", "messages": [], "staged_at": "t"},
        )
        db.session.expire_all()
        with count_queries() as counted:
            build_prompt(here, ada)
        return counted.count

    assert queries_with(1) == queries_with(12)


# The summary reaches the prompt of another chat


def test_a_message_leads_to_a_summary_that_another_chats_prompt_shows(
    app, client, auth, admin, fake_llm, ada
):
    auth.login(admin)
    roses = factories.chat(admin.account, [ada], "Roses")
    factories.message(roses, "The wall faces north.", author=admin)
    elsewhere = factories.chat(admin.account, [ada], "Elsewhere")
    fake_llm.reply("Albéric Barbier, then.")  # Ada's reply to the message below
    fake_llm.reply("Picking a climber for the north wall.\nDecided: Albéric Barbier.")  # her summary

    client.post(f"/chats/{roses.id}/messages", data={"content": "Which climber?"})
    _run_worker(app)

    assert [r["model"] for r in fake_llm.requests] == ["ada-model", "ada-model"]
    context = _context(elsewhere, ada)
    assert (
        f'- [{roses.public_id}] "Roses": Picking a climber for the north wall. Decided: Albéric Barbier.'
        in context
    )

    fake_llm.requests.clear()
    client.post(f"/chats/{roses.id}/messages", data={"content": "And for the south wall?"})
    _run_worker(app)

    assert len(fake_llm.requests) == 1  # the reply only: the summary is fresh, so no summary job ran


# The panel on the chat page


@pytest.fixture
def others(admin, here, ada, basil):
    """Ada's and Basil's other chats, as the panel of `here` should show them."""
    with time_machine.travel(utcnow() - timedelta(minutes=5), tick=False):
        roses = factories.chat(admin.account, [ada], "Roses")
    factories.summary(roses, ada, "Choosing a climber.\nPending: soil test.")
    tomatoes = factories.chat(admin.account, [basil], "Tomatoes")
    factories.summary(tomatoes, basil, "Blight <script>alert(1)</script>")
    factories.summary(here, ada, "Planning the club's beds.")
    return {"roses": roses, "tomatoes": tomatoes}


def _panel_of(html: str) -> str:
    start = html.index('<section id="cross-conversations"')
    return html[start : html.index("</section>", start)]


def test_the_chat_page_shows_each_agents_other_conversations(client, auth, admin, here, others):
    auth.login(admin)

    page = client.get(f"/chats/{here.id}")

    assert page.status_code == 200 and "<html" in page.text
    panel = _panel_of(page.text)
    ada_part, basil_part = panel.split('data-agent="Basil"')
    assert f'href="/chats/{others["roses"].id}">Roses</a>' in ada_part
    assert "Choosing a climber.\nPending: soil test." in ada_part and "updated 5 minutes ago" in ada_part
    assert "Planning the club&#39;s beds." in ada_part
    assert f'href="/chats/{others["tomatoes"].id}">Tomatoes</a>' in basil_part
    assert "Blight &lt;script&gt;alert(1)&lt;/script&gt;" in basil_part and "<script>alert" not in page.text
    assert 'hx-trigger="every 20s, context-borrowed from:body' in panel  # and at once after a borrow


def test_the_panel_refreshes_as_a_fragment(client, auth, admin, here, ada, others):
    auth.login(admin)
    headers = {"HX-Request": "true", "HX-Target": "cross-conversations"}

    before = client.get(f"/chats/{here.id}", headers=headers)
    factories.summary(others["roses"], ada, "Decided: Albéric Barbier.")
    after = client.get(f"/chats/{here.id}", headers=headers)

    assert before.status_code == 200 and "<html" not in before.text
    assert before.text.lstrip().startswith('<section id="cross-conversations"')
    assert 'id="messages"' not in before.text
    assert "Choosing a climber." in before.text and "Decided: Albéric Barbier." in after.text
    assert "HX-Request" in after.headers["Vary"]


def test_the_panel_marks_borrowed_context_waiting(client, auth, admin, here, ada, others):
    auth.login(admin)
    headers = {"HX-Request": "true", "HX-Target": "cross-conversations"}
    assert "borrowed context waiting" not in client.get(f"/chats/{here.id}", headers=headers).text
    staged = {
        "source_conversation_id": "x",
        "messages": [{"author": "dana", "content": "hi"}],
        "staged_at": "t",
    }
    factories.summary(here, ada, "s", borrowed_context_json=staged)

    panel = client.get(f"/chats/{here.id}", headers=headers).text

    ada_part = panel.split('data-agent="Basil"')[0]
    assert "borrowed context waiting" in ada_part and "1 message for Ada's next reply here" in ada_part


def test_the_panel_leaves_out_discarded_old_and_other_accounts_chats(
    client, auth, admin, here, ada, stranger
):
    auth.login(admin)
    discarded = factories.chat(admin.account, [ada], "Thrown away")
    factories.summary(discarded, ada, "Gone.")
    discarded.discarded_at = utcnow()
    old = factories.chat(admin.account, [ada], "Last week")
    factories.summary(old, ada, "Long ago.")
    old.last_message_at = utcnow() - timedelta(days=7)
    db.session.commit()
    foreign = factories.chat(stranger.account, [ada, factories.agent(stranger.account, "Mallory")], "Globex")
    factories.summary(foreign, ada, "Globex plans.")

    panel = _panel_of(client.get(f"/chats/{here.id}").text)

    for absent in ("Thrown away", "Last week", "Globex"):
        assert absent not in panel
    assert panel.count("No other active conversations in the last 6 hours.") == 2


def test_another_accounts_panel_is_not_found(client, auth, stranger, here, others):
    auth.login(stranger)

    response = client.get(f"/chats/{here.id}", headers={"HX-Target": "cross-conversations"})

    assert response.status_code == 404 and "Choosing a climber" not in response.text


def test_the_panel_costs_the_same_queries_for_more_agents_and_chats(client, auth, admin, here, ada, others):
    auth.login(admin)
    headers = {"HX-Request": "true", "HX-Target": "cross-conversations"}

    url = f"/chats/{here.id}"

    def queries() -> int:
        db.session.expire_all()  # every request starts cold, as in production
        with count_queries() as counted:
            assert client.get(url, headers=headers).status_code == 200
        return counted.count

    before = queries()
    for name in ("Cleo", "Dev"):
        agent = factories.agent(admin.account, name)
        db.session.add(ChatAgent(chat_id=here.id, agent_id=agent.id))
        db.session.commit()
        for i in range(3):
            factories.summary(factories.chat(admin.account, [agent], f"{name} {i}"), agent, "Busy.")

    assert queries() == before


def test_the_ago_filter_words_durations(app):
    from webapp.web.chats.page import ago

    now = utcnow()
    assert [ago(now - d) for d in (timedelta(seconds=30), timedelta(minutes=1), timedelta(minutes=59))] == [
        "just now",
        "1 minute ago",
        "59 minutes ago",
    ]
    assert ago(now - timedelta(hours=2, minutes=5)) == "2 hours ago"
    assert ago(now - timedelta(days=3)) == "3 days ago"
