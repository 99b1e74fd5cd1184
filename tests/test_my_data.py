"""Issue 42.3: a person downloads their data from "What agents remember of you": every chat they are one of the
people of (not another person's private chat, not a shared chat they only read), each with its finished turns in
order, and every memory drawn from those chats that they may hear, as one JSON document and as Markdown, streamed
so that 10,000 messages are never held at once."""

import json
import re
import tracemalloc

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.models import Message
from webapp.models.memories import add_sources
from webapp.timeutil import utcnow


@pytest.fixture
def milo_and_ana(acme, admin, member):
    """Milo (a member) in three chats, one of them shared and discarded; Ana's private chat and a shared chat Milo only reads
    beside them; memories drawn from each."""
    ana = factories.user(acme, "ana@example.com", "member")
    ada, basil = factories.agent(acme, "Ada"), factories.agent(acme, "Basil")
    chats = {
        "roses": factories.chat(acme, [ada], "Roses\n# and a heading of its own", people=[member]),
        "club": factories.chat(acme, [ada, basil], "Club", people=[member, ana]),
        "open": factories.chat(acme, [basil], "Open door", people=[member]),
        "anas": factories.chat(acme, [ada], "Ana's diary", people=[ana]),
        "town": factories.chat(acme, [basil], "Town square"),  # shared, nobody's: Milo only reads it
    }
    chats["open"].visibility = "shared"
    chats["open"].discarded_at = utcnow()  # discarded, but still his: its people may restore it
    db.session.commit()
    said = {
        "roses": [
            factories.message(chats["roses"], 'My roses have "black spot"\nagain.', author=member),
            factories.message(chats["roses"], "Try a copper spray </script>.", author=ada),
            factories.message(chats["roses"], "It worked, thank you ☺", author=member),
        ],
        "club": [
            factories.message(chats["club"], "The club meets on Thursdays.", author=ana),
            factories.message(chats["club"], "Noted, Thursdays.", author=basil),
        ],
        "open": [factories.message(chats["open"], "Anyone may read this door.", author=member)],
        "anas": [factories.message(chats["anas"], "A surprise party for Milo.", author=ana)],
        "town": [factories.message(chats["town"], "Town hall news.", author=admin)],
    }
    factories.message(chats["roses"], "Half an answer", author=ada, status="streaming")
    factories.message(chats["roses"], "A failed answer", author=ada, status="failed")
    memories = {}
    for key, agent, text in [
        ("roses", ada, "Milo's roses have black spot."),
        ("club", basil, "The club meets on Thursdays."),
        ("anas", ada, "Ana plans a surprise party for Milo."),
        ("town", basil, "The town hall opens at nine."),
    ]:
        memory = factories.memory(agent, text, audience="chat", chat_id=chats[key].id)
        add_sources(memory, [said[key][0].id])
        memories[text] = memory
    everyone = factories.memory(ada, "Milo is allergic to bees.", memory_type="journal")
    add_sources(everyone, [said["roses"][0].id])
    memories[everyone.content] = everyone
    gone = factories.memory(ada, "Milo once liked tulips.", audience="chat", chat_id=chats["roses"].id)
    gone.soft_delete()
    factories.memory(ada, "The office closes at six.")  # an admin's entry: drawn from no chat
    db.session.commit()
    return {"ana": ana, "chats": chats, "said": said, "memories": memories}


def _download(client, kind: str):
    response = client.get(f"/account/data.{kind}")
    assert response.status_code == 200, response.status_code
    return response


def _json(client) -> dict:
    return json.loads(_download(client, "json").get_data(as_text=True))


def test_the_json_holds_exactly_the_persons_chats_their_finished_turns_in_order_and_their_memories(
    client, auth, member, milo_and_ana
):
    auth.login(member)

    data = _json(client)

    said = milo_and_ana["said"]
    assert data["format"] == "cairn-my-data"
    assert data["person"] == {"name": "milo", "email": "milo@example.com"} and data["account"] == "Acme"
    assert [chat["title"] for chat in data["chats"]] == [
        "Roses\n# and a heading of its own",
        "Club",
        "Open door",
    ]  # not Ana's diary, not the town square he only reads
    roses, club, door = data["chats"]
    assert roses["people"] == ["milo"] and roses["agents"] == ["Ada"]
    assert club["people"] == ["milo", "ana"] and club["agents"] == ["Ada", "Basil"]
    assert door["visibility"] == "shared" and door["discarded_at"] and roses["discarded_at"] is None
    assert roses["created_at"].endswith("+00:00")
    assert [(m["author"], m["role"], m["content"]) for m in roses["messages"]] == [
        ("milo", "user", 'My roses have "black spot"\nagain.'),
        ("Ada", "assistant", "Try a copper spray </script>."),
        ("milo", "user", "It worked, thank you ☺"),
    ]  # the streaming and the failed answer are not finished turns
    assert [m["id"] for m in roses["messages"]] == [m.id for m in said["roses"]]
    assert [m["content"] for m in club["messages"]] == ["The club meets on Thursdays.", "Noted, Thursdays."]

    memories = {m["content"]: m for m in data["memories"]}
    assert set(memories) == {
        "Milo's roses have black spot.",
        "Milo is allergic to bees.",
        "The club meets on Thursdays.",
    }  # not Ana's, not the town's, not a forgotten one, not an admin's entry
    assert [m["agent"] for m in data["memories"]] == ["Ada", "Ada", "Basil"]
    black_spot = memories["Milo's roses have black spot."]
    assert black_spot["audience"] == "only the people of “Roses\n# and a heading of its own”"
    assert black_spot["type"] == "core" and black_spot["source_message_ids"] == [said["roses"][0].id]
    bees = memories["Milo is allergic to bees."]
    assert bees["audience"] == "everyone in Acme" and bees["type"] == "journal"


def test_the_markdown_holds_the_same_texts_and_a_title_cannot_break_its_heading(
    client, auth, member, milo_and_ana
):
    auth.login(member)

    text = _download(client, "md").get_data(as_text=True)

    assert text.startswith("# Your Cairn data\n")
    headings = re.findall(r"^#+ .*$", text, flags=re.MULTILINE)
    assert headings == [
        "# Your Cairn data",
        "## Roses # and a heading of its own",
        "## Club",
        "## Open door",
        "## What agents remember of you",
        "### Ada",
        "### Basil",
    ]
    assert "**milo** (" in text and 'My roses have "black spot"\nagain.' in text
    assert "; discarded " in text and "people: milo, ana; agents: Ada, Basil." in text
    assert "**Ada** (" in text and "Try a copper spray </script>." in text
    assert "The club meets on Thursdays." in text and "Noted, Thursdays." in text
    assert "Milo is allergic to bees.\n\n*journal, saved " in text and "heard by everyone in Acme" in text
    for absent in ("Half an answer", "A failed answer", "surprise party", "Town", "tulips", "office closes"):
        assert absent not in text
    assert text.index("Milo's roses have black spot.") < text.index("### Basil")


def test_each_person_gets_only_their_own_data(client, auth, stranger, milo_and_ana):
    auth.login(milo_and_ana["ana"])
    anas = _json(client)
    auth.login(stranger)
    eves = _json(client)

    assert [chat["title"] for chat in anas["chats"]] == ["Club", "Ana's diary"]
    assert {m["content"] for m in anas["memories"]} == {
        "The club meets on Thursdays.",
        "Ana plans a surprise party for Milo.",
    }
    assert eves["person"]["email"] == "eve@globex.example"
    assert eves["chats"] == [] and eves["memories"] == []
    markdown = _download(client, "md").get_data(as_text=True)
    assert "You are one of the people of no chat." in markdown
    assert "No agent remembers anything drawn from your chats." in markdown


def test_a_download_is_a_dated_attachment_never_cached_and_needs_a_sign_in(
    client, auth, member, milo_and_ana
):
    for kind in ("json", "md"):
        assert client.get(f"/account/data.{kind}").headers["Location"].startswith("/login")
    auth.login(member)
    today = utcnow().date().isoformat()

    for kind, mimetype in (("json", "application/json"), ("md", "text/markdown")):
        response = _download(client, kind)
        assert response.mimetype == mimetype and response.is_streamed and response.get_data()
        assert response.headers["Content-Disposition"] == f'attachment; filename="cairn-data-{today}.{kind}"'
        assert response.headers["Cache-Control"] == "no-store"


def test_the_page_offers_both_downloads(client, auth, member, milo_and_ana):
    auth.login(member)

    page = client.get("/account/memories").text

    assert "Your data" in page
    assert 'href="/account/data.json"' in page and 'href="/account/data.md"' in page


def test_downloads_are_limited_per_person(client, auth, member):
    auth.login(member)

    answers = []
    for n in range(11):
        with client.get(f"/account/data.{'json' if n % 2 else 'md'}") as response:
            answers.append(response.status_code)

    assert answers == [200] * 10 + [429]


def _fill(chat, person, agent, count: int) -> None:
    """`count` finished turns more, inserted in bulk."""
    now = utcnow()
    for start in range(0, count, 5000):
        db.session.execute(
            sa.insert(Message),
            [
                {"chat_id": chat.id, "role": "assistant" if n % 2 else "user",
                 "agent_id": agent.id if n % 2 else None, "user_id": None if n % 2 else person.id,
                 "content": f"Message {n}: " + "some words about roses and shade " * 6, "status": "done",
                 "created_at": now, "updated_at": now}
                for n in range(start, min(count, start + 5000))
            ],
        )  # fmt: skip
    db.session.commit()


def _peak(client, kind: str) -> tuple[int, int, int]:
    """The peak memory traced while the download is asked for and read to its end, its bytes and its turns."""
    tracemalloc.start()
    try:
        response = _download(client, kind)
        assert response.is_streamed
        size = turns = 0
        for chunk in response.response:
            size += len(chunk)
            turns += chunk.count(b"Message ") if isinstance(chunk, bytes) else chunk.count("Message ")
        response.close()
        return tracemalloc.get_traced_memory()[1], size, turns
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["json", "md"])
def test_a_download_of_ten_thousand_messages_streams_without_holding_them(acme, member, client, auth, kind):
    ada = factories.agent(acme, "Ada")
    chat = factories.chat(acme, [ada], "Long", people=[member])
    auth.login(member)
    _fill(chat, member, ada, 1_000)
    _peak(client, kind)  # the first download compiles its queries and warms the caches
    small, small_size, small_turns = _peak(client, kind)

    _fill(chat, member, ada, 9_000)
    large, large_size, large_turns = _peak(client, kind)

    assert (small_turns, large_turns) == (1_000, 10_000)
    # A document held whole would grow with it, tenfold; read PAGE turns at a time, the peak stays where it was.
    # Measured on SQLite and PostgreSQL: about 1.1 MB (JSON) and 0.95 MB (Markdown) at either size, for 3.3 and 2.5 MB downloaded.
    assert large < 1.5 * small + 500_000, (small, large)
    assert large - small < (large_size - small_size) / 10, (small, large, small_size, large_size)
