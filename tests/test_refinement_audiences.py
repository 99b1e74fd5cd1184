"""Issue 31.3: refinement works within one audience at a time (reflection: tests/test_reflection_audiences.py). A private chat's memory and one heard
by everyone go through one refinement run: the model never reads the private words while it can write the
"everyone" one, and nothing of the private memory is written where everyone hears it. The model here is greedy:
it writes whatever it read into every memory it may change and into its summary."""

import re

import pytest
import sqlalchemy as sa

from tests import factories
from tests.fake_llm import Scripted
from webapp.extensions import db
from webapp.jobs.refinement import refine_agent
from webapp.models import AgentMemory, AuditLog, MemoryProposal
from webapp.models.access import EVERYONE, Audience

SECRET = "PLUM-7731"
PRIVATE = f"Ana's locker code is {SECRET}, she keeps her passport there."
SHARED = "Tea is served at four in the meeting room on the second floor."
LISTED = re.compile(r"^- #(\d+) \([^)]*\)(?: \[[^\]]*\])*: (.*)$", re.MULTILINE)


@pytest.fixture
def ana(acme):
    return factories.user(acme, "ana@example.com", "member")


@pytest.fixture
def ada(app, acme):
    app.config["REFINEMENT_TOKEN_FLOOR"] = 0  # the greedy model's rewrites may be shorter or longer
    return factories.agent(acme, "Ada", core_token_budget=20)


@pytest.fixture
def anas_chat(acme, ana, ada):
    return factories.chat(acme, [ada], "Ana's lockers", people=[ana])


@pytest.fixture
def memories(ada, anas_chat):
    """Ada's private memory of Ana's chat, and one heard by everyone."""
    return factories.memory(ada, PRIVATE, chat_id=anas_chat.id), factories.memory(ada, SHARED)


def _greedy(body: dict) -> Scripted:
    """On the first turn of a refinement pass: rewrite each memory listed to hold every memory listed, and
    complete with a summary that repeats them all; on any later turn, stop."""
    if body["messages"][-1]["role"] != "user" or not body.get("tools"):
        return Scripted(text="Done.")
    listed = LISTED.findall(body["messages"][0]["content"])
    everything = " ".join(text for _id, text in listed)
    calls = [
        ("refine_memory", {"action": "update", "id": memory_id, "content": f"{everything} (tightened)"})
        for memory_id, _text in listed
    ]
    return Scripted(tool_calls=[*calls, ("refine_memory", {"action": "complete", "summary": everything})])


def _prompts(fake_llm) -> list[str]:
    return [request["messages"][0]["content"] for request in fake_llm.requests]


def _heard_by_everyone() -> list[str]:
    db.session.expire_all()
    rows = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.is_active, EVERYONE.holds()))
    return [memory.content for memory in rows]


def test_one_refinement_of_a_private_and_an_everyone_memory_leaks_nothing(ada, anas_chat, memories, fake_llm):
    private, shared = memories
    fake_llm.responder = _greedy

    counts = refine_agent(ada.id, force=True)

    prompts = _prompts(fake_llm)
    for prompt in prompts:  # a prompt that lists the "everyone" memory holds nothing of Ana's chat
        private_words = [word for word in (SECRET, "locker", anas_chat.public_id) if word in prompt]
        assert "Tea is served" not in prompt or private_words == []
    heard = _heard_by_everyone()
    assert heard and not any(SECRET in text or "locker" in text for text in heard)
    assert len(prompts) == 2 and counts["status"] == "complete" and counts["updated"] == 2
    # Each pass's rewrite and note stayed in its audience; both are rows of the one session.
    db.session.refresh(private)
    assert SECRET in private.content and Audience.of(private) == Audience(anas_chat.id)
    notes = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.memory_type == "journal")).all()
    assert {(Audience.of(note), SECRET in note.content) for note in notes} == {
        (Audience(anas_chat.id), True),
        (EVERYONE, False),
    }
    written = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.content.contains(SECRET))).all()
    assert {Audience.of(memory) for memory in written} == {Audience(anas_chat.id)}
    sessions = db.session.scalars(sa.select(AuditLog.session_id).where(AuditLog.agent_id == ada.id)).all()
    assert set(sessions) == {counts["session_id"]}


def test_each_audience_gets_its_share_of_the_budget(ada, memories, fake_llm):
    private, shared = memories
    fake_llm.responder = _greedy

    refine_agent(ada.id, force=True)

    total = private.token_estimate + shared.token_estimate
    budgets = {
        "private" if SECRET in prompt else "shared": int(re.search(r"Token budget: (\d+) tokens", prompt)[1])
        for prompt in _prompts(fake_llm)
    }
    assert budgets == {
        "private": 20 * private.token_estimate // total,
        "shared": 20 * shared.token_estimate // total,
    }
    assert sum(budgets.values()) <= 20


def test_a_staged_run_proposes_within_each_audience_in_one_proposal(ada, anas_chat, memories, fake_llm):
    ada.background_changes = "staged"
    db.session.commit()
    fake_llm.responder = _greedy

    counts = refine_agent(ada.id, force=True)

    [proposal] = db.session.scalars(sa.select(MemoryProposal)).all()
    assert counts["proposed"] == 2 and proposal.session_id == counts["session_id"]
    by_memory = {change.memory_ids[0]: change.content for change in proposal.changes}
    private, shared = memories
    assert SECRET in by_memory[private.id] and SECRET not in by_memory[shared.id]
    assert SECRET not in " ".join(_heard_by_everyone())


def test_a_refused_change_is_quoted_only_in_its_own_audiences_pass(
    client, signed_in, ada, anas_chat, memories, fake_llm
):
    ada.background_changes = "staged"
    db.session.commit()
    fake_llm.responder = _greedy
    refine_agent(ada.id, force=True)
    proposal = db.session.scalar(sa.select(MemoryProposal))
    client.post(f"/admin/proposals/{proposal.id}", data={"decision": "reject"})
    fake_llm.reset()
    fake_llm.responder = _greedy

    refine_agent(ada.id, force=True)

    [everyones_pass] = [prompt for prompt in _prompts(fake_llm) if "Tea is served" in prompt]
    [private_pass] = [prompt for prompt in _prompts(fake_llm) if prompt not in (everyones_pass,)]
    assert "## Changes refused before" in everyones_pass and SECRET not in everyones_pass
    assert "## Changes refused before" in private_pass and SECRET in private_pass


def test_the_passes_share_the_sessions_turns(app, ada, memories, fake_llm):
    app.config["REFINEMENT_MAX_TURNS"] = 3
    fake_llm.responder = lambda body: Scripted(tool_calls=[("refine_memory", {"action": "page", "page": 1})])

    counts = refine_agent(ada.id, force=True)

    assert len(fake_llm.requests) == 3 and counts["status"] == "incomplete"
    closing = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_refinement_incomplete"))
    assert closing.data["reason"] == "2 of its 2 passes (one per audience) ended without calling complete"
