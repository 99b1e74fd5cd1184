"""The one access rule (webapp.models.access): who reads a chat, who hears what came from one."""

import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory, Chat
from webapp.models.access import (
    chats_heard_in,
    memories_heard_by,
    memories_heard_in,
    readable_chats,
    same_audience,
)


def _chats(condition) -> set[str]:
    return set(db.session.scalars(sa.select(Chat.title).where(condition)))


def _memories(condition) -> set[str]:
    return set(db.session.scalars(sa.select(AgentMemory.content).where(condition)))


def _world(acme, admin, member):
    sam = factories.user(acme, "sam@example.com", role="member")
    ada = factories.agent(acme)
    chats = {
        "dana": factories.chat(acme, [ada], "Dana alone", people=[member]),
        "sam": factories.chat(acme, [ada], "Sam alone", people=[sam]),
        "both": factories.chat(acme, [ada], "Dana and Sam", people=[member, sam]),
        "shared": factories.chat(acme, [ada], "Everyone"),
        "admin": factories.chat(acme, [ada], "Admin alone", people=[admin]),
    }
    for key, chat in chats.items():
        factories.memory(ada, f"from {key}", chat_id=chat.id)
    factories.memory(ada, "for everyone")
    return sam, ada, chats


def test_each_person_reads_their_private_chats_and_the_shared_ones(acme, admin, member, stranger):
    sam, _ada, _chats_ = _world(acme, admin, member)
    factories.chat(stranger.account, [], "Elsewhere")

    assert _chats(readable_chats(member)) == {"Dana alone", "Dana and Sam", "Everyone"}
    assert _chats(readable_chats(sam)) == {"Sam alone", "Dana and Sam", "Everyone"}
    assert _chats(readable_chats(admin)) == {"Admin alone", "Everyone"}  # admins do not read private chats
    assert _chats(readable_chats(stranger)) == {"Elsewhere"}


def test_a_chat_hears_only_what_everyone_present_may_read(acme, admin, member):
    _sam, _ada, chats = _world(acme, admin, member)

    assert _memories(memories_heard_in(chats["dana"])) == {
        "from dana", "from both", "from shared", "for everyone"
    }  # fmt: skip
    assert _memories(memories_heard_in(chats["sam"])) == {
        "from sam",
        "from both",
        "from shared",
        "for everyone",
    }
    assert _memories(memories_heard_in(chats["both"])) == {"from both", "from shared", "for everyone"}
    # In a shared chat anyone of the account may be listening.
    assert _memories(memories_heard_in(chats["shared"])) == {"from shared", "for everyone"}
    assert _chats(chats_heard_in(chats["both"])) == {"Dana and Sam", "Everyone"}


def test_sharing_a_chat_widens_its_memories_and_making_it_private_narrows_them(acme, admin, member):
    sam, _ada, chats = _world(acme, admin, member)

    chats["dana"].visibility = "shared"
    db.session.commit()
    assert "from dana" in _memories(memories_heard_in(chats["sam"]))
    assert "from dana" in _memories(memories_heard_by(sam))

    chats["dana"].visibility = "private"
    db.session.commit()
    assert "from dana" not in _memories(memories_heard_in(chats["sam"]))
    assert "from dana" not in _memories(memories_heard_by(sam))


def test_a_person_added_to_a_chat_hears_what_it_holds(acme, admin, member):
    sam, _ada, chats = _world(acme, admin, member)
    assert "from dana" not in _memories(memories_heard_in(chats["sam"]))

    factories.add_person(chats["dana"], sam)

    assert "from dana" in _memories(memories_heard_in(chats["sam"]))


def test_a_private_chat_with_no_people_hears_only_itself_and_everyones(acme, admin, member):
    _sam, ada, chats = _world(acme, admin, member)
    orphan = factories.chat(acme, [ada], "Nobody's")
    orphan.visibility = "private"
    db.session.commit()

    assert _chats(chats_heard_in(orphan)) == {"Nobody's"}
    assert _memories(memories_heard_in(orphan)) == {"for everyone"}


def test_memories_are_merged_only_within_one_audience(acme, admin, member):
    _sam, ada, chats = _world(acme, admin, member)
    dana_1 = factories.memory(ada, "dana one", chat_id=chats["dana"].id)
    dana_2 = factories.memory(ada, "dana two", chat_id=chats["dana"].id)
    everyone_1 = factories.memory(ada, "all one")
    everyone_2 = factories.memory(ada, "all two")
    sam_1 = factories.memory(ada, "sam one", chat_id=chats["sam"].id)

    assert dana_1.audience == "chat" and everyone_1.audience == "everyone"
    assert same_audience(dana_1, dana_2) and same_audience(everyone_1, everyone_2)
    assert not same_audience(dana_1, sam_1) and not same_audience(dana_1, everyone_1)
