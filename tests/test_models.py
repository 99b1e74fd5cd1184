"""Rules that belong to the data: memory content and type, one agent per chat once, hashes and token counts."""

import pytest
import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Account, Agent, AgentMemory, Chat, ChatAgent
from webapp.models.memories import content_hash_of, core_token_usage, needs_refinement
from webapp.tokens import count_tokens


@pytest.fixture
def agent(app):
    account = Account(name="Acme")
    agent = Agent(account=account, name="Ada", model_id="m")
    db.session.add(agent)
    db.session.commit()
    return agent


def test_memory_gets_content_hash_and_token_estimate_on_save(agent):
    memory = AgentMemory(agent=agent, content="  The user prefers tea.  ", memory_type="core")
    db.session.add(memory)
    db.session.commit()

    assert memory.content == "The user prefers tea."
    assert memory.content_hash == content_hash_of("the user prefers tea.")
    assert memory.token_estimate == count_tokens("The user prefers tea.")


def test_editing_content_recomputes_hash_and_tokens(agent):
    memory = AgentMemory(agent=agent, content="short", memory_type="journal")
    db.session.add(memory)
    db.session.commit()

    memory.content = "a considerably longer memory than before"
    db.session.commit()

    assert memory.content_hash == content_hash_of("a considerably longer memory than before")
    assert memory.token_estimate == count_tokens("a considerably longer memory than before")


def test_same_text_in_other_case_has_the_same_hash():
    assert content_hash_of("Likes Tea") == content_hash_of(" likes tea ")


@pytest.mark.parametrize("content", ["", "   ", "x" * 10_001])
def test_memory_content_must_be_1_to_10000_characters(agent, content):
    with pytest.raises(ValueError, match="1 to 10,000 characters"):
        AgentMemory(agent=agent, content=content, memory_type="core")


def test_memory_of_exactly_10000_characters_is_kept(agent):
    db.session.add(AgentMemory(agent=agent, content="x" * 10_000, memory_type="core"))
    db.session.commit()


def test_memory_type_is_journal_or_core(agent):
    with pytest.raises(ValueError, match="journal, core"):
        AgentMemory(agent=agent, content="x", memory_type="dream")


def test_the_database_itself_rejects_bad_memories(agent):
    """The rules hold for writes that bypass the model, too."""
    insert = sa.insert(AgentMemory).values(agent_id=agent.id, memory_type="core", constitutional=False)
    with pytest.raises(sa.exc.IntegrityError):
        with db.session.begin_nested():
            db.session.execute(insert.values(content=""))
    with pytest.raises(sa.exc.IntegrityError):
        with db.session.begin_nested():
            db.session.execute(insert.values(content="x", memory_type="dream"))


def test_an_agent_joins_a_chat_once(agent):
    chat = Chat(account_id=agent.account_id, title="Tea")
    db.session.add_all([chat, ChatAgent(chat=chat, agent=agent)])
    db.session.commit()

    db.session.add(ChatAgent(chat=chat, agent=agent))
    with pytest.raises(sa.exc.IntegrityError):
        db.session.commit()


def test_agent_identity_falls_back_to_its_name(agent):
    assert agent.identity() == "You are Ada."
    agent.system_prompt = "You are a pirate."
    assert agent.identity() == "You are a pirate."


def test_core_token_usage_counts_only_active_core_memories(agent):
    from webapp.timeutil import utcnow

    kept = AgentMemory(agent=agent, content="one two three", memory_type="core")
    db.session.add_all(
        [
            kept,
            AgentMemory(agent=agent, content="a journal entry", memory_type="journal"),
            AgentMemory(agent=agent, content="deleted core", memory_type="core", deleted_at=utcnow()),
        ]
    )
    db.session.commit()

    assert core_token_usage(agent.id) == kept.token_estimate
    agent.core_token_budget = kept.token_estimate
    assert not needs_refinement(agent)
    agent.core_token_budget = kept.token_estimate - 1
    assert needs_refinement(agent)


def test_each_new_agent_gets_a_slug_unique_in_its_account_kept_across_renames(app):
    from tests import factories
    from webapp.extensions import db

    acme, globex = factories.account(), factories.account("Globex")
    ada = factories.agent(acme, "Ada")
    ada_too = factories.agent(acme, "ADA!")
    zoe = factories.agent(acme, "Zoë Brontë")
    robot = factories.agent(acme, "🤖")
    elsewhere = factories.agent(globex, "Ada")

    assert [a.slug for a in (ada, ada_too, zoe, robot, elsewhere)] == [
        "ada",
        "ada-2",
        "zoe-bronte",
        "agent",
        "ada",
    ]
    ada.name = "Ada Lovelace"
    db.session.commit()
    assert ada.slug == "ada"
