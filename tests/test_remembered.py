"""Issue 42.1 and 42.6: "What agents remember of me" lists every memory drawn from a chat the person is one of
(by its sources or its audience's chat), grouped by agent, and nothing of other people's private chats; Forget,
Forget everything from a chat and Forget everything take memories out of prompts and search at once, audited as
the person and undone by an admin; the same verb through MCP and `flask memories forget`, refusing anyone else's
memory without saying whether it exists."""

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests import factories
from tests.test_first_hour_browser import ALL_IMPACTS, check_page, size, tap  # noqa: F401  (size: the viewport)
from tests.test_mcp import _call, _in_process
from tests.test_phone_browser import _sign_in, _small_targets
from webapp.actions import forgetting
from webapp.actions.memory import search_memory
from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog
from webapp.models.memories import add_sources
from webapp.prompting.build import build_prompt


@pytest.fixture
def team(acme, admin, member):
    """Milo (a member) in five chats with three agents; Ana's private chat with Ada beside them."""
    ana = factories.user(acme, "ana@example.com", "member")
    ada, basil, cleo = (factories.agent(acme, name) for name in ("Ada", "Basil", "Cleo"))
    chats = {
        "roses": factories.chat(acme, [ada], "Roses", people=[member]),
        "bikes": factories.chat(acme, [basil], "Bikes", people=[member]),
        "tea": factories.chat(acme, [cleo], "Tea", people=[member]),
        "club": factories.chat(acme, [ada, basil], "Club", people=[member, ana]),
        "trips": factories.chat(acme, [cleo], "Trips", people=[member]),
        "anas": factories.chat(acme, [ada], "Ana's diary", people=[ana]),
    }
    memories, said_in = {}, {}
    for key, agent, text in [
        ("roses", ada, "Milo's roses have black spot."),
        ("bikes", basil, "Milo rides a green bike."),
        ("tea", cleo, "Milo drinks oolong."),
        ("club", ada, "The club meets on Thursdays."),
        ("club", basil, "The club's treasurer is Ana."),
        ("trips", cleo, "Milo goes to Lisbon in May."),
        ("anas", ada, "Ana is planning a surprise for Milo."),
    ]:
        said = factories.message(chats[key], f"About it: {text}", author=member if key != "anas" else ana)
        said_in.setdefault(key, said)
        memory = factories.memory(agent, text, audience="chat", chat_id=chats[key].id)
        add_sources(memory, [said.id])
        memories[text] = memory
    # Heard by everyone, but drawn from Milo's chat by its source: his too.
    everyone = factories.memory(ada, "Milo is allergic to bees.")
    add_sources(everyone, [said_in["roses"].id])
    memories[everyone.content] = everyone
    factories.memory(ada, "The office closes at six.")  # an admin's entry: drawn from no chat
    db.session.commit()
    return {
        "ana": ana,
        "agents": (ada, basil, cleo),
        "chats": chats,
        "memories": memories,
        "said_in": said_in,
    }


def _listed(client, query: str = "") -> str:
    page = client.get(f"/account/memories{query}")
    assert page.status_code == 200
    return page.text


def test_a_member_sees_every_memory_drawn_from_their_chats_by_agent_and_nothing_of_others(
    client, auth, member, team
):
    auth.login(member)

    page = _listed(client)

    mine = [text for text in team["memories"] if "Ana is planning" not in text]
    assert all(text.replace("'", "&#39;") in page for text in mine)
    assert "Ana is planning a surprise" not in page  # Ana's private chat
    assert "The office closes at six." not in page  # drawn from no chat of his
    assert [page.index(f">{name}</h2>") for name in ("Ada", "Basil", "Cleo")] == sorted(
        page.index(f">{name}</h2>") for name in ("Ada", "Basil", "Cleo")
    )
    assert "only the people of" in page and "everyone in Acme" in page
    roses = team["chats"]["roses"]
    assert (
        f'href="/chats/{roses.id}#message-{team["said_in"]["roses"].id}"' in page
    )  # its source turn, linked
    assert f"({len(mine)})" in page or f"{len(mine)}" in page


def test_forget_takes_a_memory_out_of_prompts_and_search_at_once_and_an_admin_undoes_it(
    client, auth, member, admin, team
):
    ada = team["agents"][0]
    roses = team["chats"]["roses"]
    memory = team["memories"]["Milo's roses have black spot."]
    auth.login(member)
    before = search_memory(member, ada, "roses black spot")["results"]

    forgotten = client.post(f"/account/memories/{memory.id}/forget")

    db.session.expire_all()
    assert forgotten.status_code == 303
    assert db.session.get(AgentMemory, memory.id).is_deleted
    [memory_section] = [
        m["content"] for m in build_prompt(roses, ada).messages if "# Your memory" in m["content"]
    ]
    assert "black spot" not in memory_section and "allergic to bees" in memory_section
    found = search_memory(member, ada, "roses black spot")["results"]
    assert memory.id in [hit.get("memory_id") for hit in before]
    assert memory.id not in [hit.get("memory_id") for hit in found]
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.auditable_id == memory.id))
    assert row.user_id == member.id and row.action == "memory_delete"

    auth.login(admin)
    assert client.post(f"/admin/audit/{row.id}/undo").status_code in (302, 303)
    db.session.expire_all()
    assert db.session.get(AgentMemory, memory.id).is_active


def test_forget_everything_from_one_chat_asks_first_saying_how_many(client, auth, member, team):
    club = team["chats"]["club"]
    auth.login(member)

    asked = client.get(f"/account/memories/forget-all?chat={club.id}")
    done = client.post("/account/memories/forget-all", data={"chat": club.id})

    db.session.expire_all()
    gone = {m.content for m in db.session.scalars(sa.select(AgentMemory).where(AgentMemory.is_deleted))}
    assert "This forgets 2 memories" in asked.text
    assert done.status_code == 303
    assert gone == {"The club meets on Thursdays.", "The club's treasurer is Ana."}


def test_forget_everything_leaves_other_peoples_memories_and_entries_from_no_chat(client, auth, member, team):
    auth.login(member)

    asked = client.get("/account/memories/forget-all")
    client.post("/account/memories/forget-all")

    db.session.expire_all()
    left = {m.content for m in db.session.scalars(sa.select(AgentMemory).where(AgentMemory.is_active))}
    assert "This forgets 7 memories" in asked.text
    assert left == {"Ana is planning a surprise for Milo.", "The office closes at six."}
    assert "No agent remembers anything" in _listed(client)


def test_forgetting_someone_elses_memory_is_refused_as_if_it_did_not_exist_at_every_door(
    app, client, auth, runner, member, team
):
    ada = team["agents"][0]
    anas = team["memories"]["Ana is planning a surprise for Milo."]
    missing = anas.id + 1000
    auth.login(member)

    pages = [
        client.post(f"/account/memories/{memory_id}/forget").status_code for memory_id in (anas.id, missing)
    ]
    [mcp_theirs, mcp_missing] = _call(
        lambda: _in_process(app, ada, member),
        ("forget_memory", {"memory_id": anas.id}),
        ("forget_memory", {"memory_id": missing}),
    )
    cli = [
        runner.invoke(args=["memories", "forget", str(memory_id), "--by", "milo@example.com"])
        for memory_id in (anas.id, missing)
    ]

    db.session.expire_all()
    assert pages == [404, 404]
    assert mcp_theirs.is_error and mcp_theirs.content[0].text == mcp_missing.content[0].text
    assert mcp_theirs.content[0].text.endswith(forgetting.NOT_YOURS)
    assert [r.exit_code for r in cli] == [1, 1] and cli[0].output == cli[1].output
    assert db.session.get(AgentMemory, anas.id).is_active


def test_a_person_forgets_their_own_memory_through_mcp_and_the_cli(app, runner, member, team):
    ada = team["agents"][0]
    roses = team["memories"]["Milo's roses have black spot."]
    bees = team["memories"]["Milo is allergic to bees."]

    [forgotten] = _call(lambda: _in_process(app, ada, member), ("forget_memory", {"memory_id": roses.id}))
    cli = runner.invoke(args=["memories", "forget", str(bees.id), "--by", "milo@example.com"])

    db.session.expire_all()
    assert not forgotten.is_error and forgotten.structured_content["forgotten"] == roses.id
    assert cli.exit_code == 0 and "Forgotten by milo@example.com" in cli.output
    assert (
        db.session.get(AgentMemory, roses.id).is_deleted and db.session.get(AgentMemory, bees.id).is_deleted
    )


def test_a_constitutional_memory_is_listed_but_kept(client, auth, member, team):
    memory = team["memories"]["Milo drinks oolong."]
    memory.constitutional = True
    db.session.commit()
    auth.login(member)

    page = _listed(client)
    refused = client.post(f"/account/memories/{memory.id}/forget")
    client.post("/account/memories/forget-all")

    db.session.expire_all()
    assert "a constitutional memory cannot be forgotten" in page
    assert refused.status_code == 404
    assert db.session.get(AgentMemory, memory.id).is_active


def test_a_chat_filter_of_someone_elses_chat_is_not_found(client, auth, member, team):
    auth.login(member)

    assert client.get(f"/account/memories?chat={team['chats']['anas'].id}").status_code == 404
    assert client.get(f"/account/memories/forget-all?chat={team['chats']['anas'].id}").status_code == 404


def test_the_page_is_paginated_and_its_first_page_reads_a_bounded_number_of_statements(
    client, auth, member, team
):
    from tests.querycount import count_queries

    ada = team["agents"][0]
    roses = team["chats"]["roses"]
    said = team["said_in"]["roses"]
    for n in range(120):
        memory = factories.memory(ada, f"Milo's note number {n}.", audience="chat", chat_id=roses.id)
        add_sources(memory, [said.id])
    db.session.commit()
    auth.login(member)

    with count_queries() as first:
        page = _listed(client)
    second = _listed(client, "?page=2")

    assert "Older ›" in page and "‹ Newer" in second
    assert page.count('class="memory"') == 50
    assert first.count <= 15


@pytest.mark.browser
def test_the_page_is_tidy_and_forgets_in_the_browser_on_a_desktop_and_a_phone(
    page,
    size,  # noqa: F811 (the fixture)
    live_app,
    live_server,
):
    """axe finds nothing, nothing scrolls sideways, every tap target is 44 px on a phone; the account page leads
    to it, Forget and Forget everything (asked first, saying how many) work."""
    acme = factories.account("Acme")
    milo = factories.user(acme, "milo@example.com", "member")
    ada = factories.agent(acme, "Ada")
    chat = factories.chat(acme, [ada], "Roses", people=[milo])
    said = factories.message(chat, "My roses climb the south wall.", author=milo)
    for text in ("Milo's roses climb the south wall.", "Milo waters the roses on Sundays."):
        add_sources(factories.memory(ada, text, audience="chat", chat_id=chat.id), [said.id])
    db.session.commit()
    db.session.remove()
    _sign_in(page, live_server, "milo@example.com")

    page.goto(f"{live_server}/account")
    tap(page.get_by_role("link", name="See what agents remember of you"))
    expect(page.get_by_role("heading", name="What agents remember of you", level=1)).to_be_visible()
    check_page(page, size, "remembered", prefix="remembered", full_page=True, impacts=ALL_IMPACTS)
    if size == "phone":
        assert _small_targets(page) == []

    tap(page.get_by_role("button", name="Forget “Milo waters the roses on Sundays.”"))
    expect(page.get_by_role("status").first).to_contain_text("Forgotten: Ada no longer brings")
    expect(page.locator(".memory .content", has_text="Milo waters the roses on Sundays.")).to_have_count(0)

    tap(page.get_by_role("link", name="Forget everything agents learned from your chats"))
    expect(page.get_by_text("This forgets 1 memory")).to_be_visible()
    check_page(page, size, "remembered-confirm", prefix="remembered", full_page=True, impacts=ALL_IMPACTS)
    tap(page.get_by_role("button", name="Forget 1 memory"))
    expect(page.get_by_text("No agent remembers anything drawn from your chats.")).to_be_visible()


def test_removing_a_person_with_forget_forgets_only_what_came_from_their_own_private_chats(
    client, auth, admin, member, team
):
    both = factories.memory(team["agents"][0], "Milo and Ana both like figs.")
    add_sources(both, [team["said_in"]["roses"].id, team["said_in"]["club"].id])
    db.session.commit()
    auth.login(admin)

    asked = client.get(f"/people/{member.id}/remove")
    removed = client.post(f"/people/{member.id}/remove", data={"memories": "forget"})

    db.session.expire_all()
    gone = {m.content for m in db.session.scalars(sa.select(AgentMemory).where(AgentMemory.is_deleted))}
    own = {"Milo's roses have black spot.", "Milo rides a green bike.", "Milo drinks oolong."}
    own |= {"Milo goes to Lisbon in May.", "Milo is allergic to bees."}
    assert "Keep it (the default)" in asked.text and "(5 memories)" in asked.text
    assert removed.status_code == 303 and gone == own  # the club's, Ana's and the shared-source one are kept
    rows = db.session.scalars(sa.select(AuditLog).where(AuditLog.action == "memory_delete")).all()
    assert {row.user_id for row in rows} == {admin.id} and {row.data["via"] for row in rows} == {"removal"}
    assert client.post(f"/admin/audit/{rows[0].id}/undo").status_code in (302, 303)
    db.session.expire_all()
    assert db.session.get(AgentMemory, rows[0].auditable_id).is_active


def test_removing_a_person_and_keeping_changes_no_memory(client, auth, admin, member, team):
    auth.login(admin)

    client.post(f"/people/{member.id}/remove", data={"memories": "keep"})

    db.session.expire_all()
    assert db.session.scalar(sa.select(sa.func.count()).where(AgentMemory.deleted_at.is_not(None))) == 0
