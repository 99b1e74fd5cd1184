"""save_memory: an identical active memory is not saved twice (a retried reply runs its tools again)."""

import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory
from webapp.tools.base import ToolContext
from webapp.tools.save_memory import save_memory


def test_saving_the_same_memory_twice_keeps_one(admin):
    agent = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [agent])
    context = ToolContext(agent=agent, chat=chat, message=factories.message(chat, "hi", author=admin))

    first = save_memory(context, "Dana likes tea.", "journal")
    again = save_memory(context, " dana likes TEA. ", "journal")

    assert first["saved"] is True and again == {
        "saved": False,
        "memory_id": first["memory_id"],
        "note": "You already remember exactly this.",
    }
    assert db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory)) == 1
