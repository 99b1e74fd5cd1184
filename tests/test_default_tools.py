"""A new agent may call every reply tool, whichever way it was created (issue 20, item 8)."""

import re

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Account, Agent
from webapp.models.agents import DEFAULT_TOOLS
from webapp.tools import REPLY_TOOLS


def test_every_way_of_creating_an_agent_gives_it_the_same_tools(client, runner):
    seeded = runner.invoke(args=["demo", "seed"])
    assert seeded.exit_code == 0, seeded.output
    signed_in = client.post("/login", data={"email": "admin@cairn.local", "password": "cairn-demo"})
    assert signed_in.status_code == 303
    form = client.get("/agents/new").text
    ticked = re.findall(r'<input checked[^>]*name="enabled_tools"[^>]*value="(\w+)"', form)
    created = client.post(
        "/agents/new",
        data={"name": "Cleo", "model_id": "m", "core_token_budget": "5000", "enabled_tools": ticked},
    )
    assert created.status_code == 303
    db.session.add(Agent(account=db.session.scalar(sa.select(Account)), name="Dora", model_id="m"))
    db.session.commit()

    tools = {agent.name: agent.enabled_tools for agent in db.session.scalars(sa.select(Agent))}

    assert tools == {name: list(REPLY_TOOLS) for name in ("Ada", "Basil", "Cleo", "Dora")}


def test_the_default_tools_are_every_reply_tool():
    assert DEFAULT_TOOLS == tuple(REPLY_TOOLS)  # a new reply tool is on for new agents, or this says why not
