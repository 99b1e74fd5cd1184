"""Issue 32.7: the review page shows each change's own token difference (not a figure that reads like the core
total), says what an unticked change means ("will be kept"), and names the chat each memory came from as the
reviewer may see it: another person's private chat by its people, never by its title."""

import re
import uuid
from datetime import timedelta

import pytest

from tests import factories
from webapp.extensions import db
from webapp.models import MemoryProposal, ProposedChange
from webapp.tokens import count_tokens

ROSES = "Ana grows old roses along the shady north wall of her garden, mostly climbers."


@pytest.fixture
def ana(acme):
    person = factories.user(acme, "ana@example.com", "member")
    person.name = "Ana"
    db.session.commit()
    return person


@pytest.fixture
def staged(acme, admin, ana):
    """A proposal of Ada's: rewrite a memory from Ana's private chat, delete one from a shared chat, merge two
    everyone hears."""
    ada = factories.agent(acme, "Ada", core_token_budget=50, background_changes="staged")
    private = factories.chat(acme, [ada], "Ana's secret garden", people=[ana])
    shared = factories.chat(acme, [ada], "Garden club")
    roses = factories.memory(ada, ROSES, chat_id=private.id)
    cat = factories.memory(ada, "The club's cat is called Pip.", chat_id=shared.id)
    tea = factories.memory(ada, "Dana likes tea.")
    biscuits = factories.memory(ada, "Dana likes biscuits.")
    changes = [
        ProposedChange.build("rewrite", [roses], "Ana grows climbing roses."),
        ProposedChange.build("delete", [cat]),
        ProposedChange.build("merge", [tea, biscuits], "Dana likes tea and biscuits."),
    ]
    proposal = MemoryProposal.stage(
        ada,
        str(uuid.uuid4()),
        changes,
        staged_because="setting",
        reason=None,
        summary=None,
        expiry=timedelta(days=14),
    )
    db.session.commit()
    return proposal, private, shared


def test_each_change_shows_its_own_token_difference(client, signed_in, staged):
    proposal, _private, _shared = staged
    rewrite, delete, merge = proposal.changes

    page = " ".join(client.get(f"/admin/proposals/{proposal.id}").text.split())

    tokens = re.findall(r'<p class="muted tokens">([^<]+)</p>', page)
    roses, shorter = count_tokens(ROSES), count_tokens("Ana grows climbing roses.")
    assert tokens == [
        f"This change: −{roses - shorter} tokens (the memory holds {roses}, rewritten {shorter})",
        f"This change: −{delete.tokens_before} tokens (the memory it deletes holds {delete.tokens_before})",
        f"This change: −{merge.saves} tokens (its 2 memories hold {merge.tokens_before}, the merged one "
        f"{merge.tokens_after})",
    ]
    assert "Core tokens " + str(rewrite.tokens_before) not in page


def test_an_unticked_change_says_it_will_be_kept(client, signed_in, staged):
    proposal, _private, _shared = staged
    rewrite, delete, merge = proposal.changes

    page = " ".join(client.get(f"/admin/proposals/{proposal.id}").text.split())

    assert (
        f'<p class="kept" id="kept-{delete.id}">Will be kept: unticked, this change is not applied and the memory '
        "stays as it is.</p>" in page
    )
    assert (
        f'id="kept-{merge.id}">Will be kept: unticked, this change is not applied and its memories stay as '
        "they are." in page
    )


def test_each_memory_names_its_chat_as_the_reviewer_may_see_it(client, signed_in, staged):
    proposal, private, shared = staged

    page = " ".join(client.get(f"/admin/proposals/{proposal.id}").text.split())

    assert "from private: Ana's chat" in page.replace("&#39;", "'")
    assert "secret garden" not in page  # the admin may not read Ana's chat: never its title
    assert f'from <a href="/chats/{shared.id}">Garden club</a>' in page
    assert page.count("from no chat (heard by everyone)") == 2
