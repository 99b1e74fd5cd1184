"""Admins list, create and edit agents; validation errors show on the form."""

import re

import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.models import Agent

VALID = {"name": "Ada", "system_prompt": "You are Ada.", "model_id": "gpt-x", "core_token_budget": "5000"}


def test_create_an_agent(client, auth, admin):
    auth.login(admin)
    form = client.get("/agents/new").text
    assert (
        'selected value="environment|smollm2"' in form
    )  # the configured default model, at the environment's
    checked = re.findall(r'<input checked[^>]*name="enabled_tools"[^>]*value="(\w+)"', form)
    assert set(checked) == {"save_memory", "borrow_context", "recall"}  # memory is on for a new agent
    assert "Remember things" in form

    response = client.post("/agents/new", data={**VALID, "enabled_tools": ["save_memory"], "paused": "y"})

    agent = db.session.scalar(sa.select(Agent))
    # First run: the next step is a chat with the new agent.
    assert (response.status_code, response.headers["Location"]) == (303, f"/chats/new?agent={agent.id}")
    assert (agent.name, agent.model_id, agent.enabled_tools, agent.paused) == (
        "Ada",
        "gpt-x",
        ["save_memory"],
        True,
    )
    assert agent.account_id == admin.account_id
    assert "Ada" in client.get("/agents/").text


def test_validation_errors_are_shown_on_the_form(client, auth, admin):
    auth.login(admin)
    factories.agent(admin.account, "Ada")

    response = client.post(
        "/agents/new", data={**VALID, "name": "ada", "model_id": "", "core_token_budget": "5"}
    )

    assert response.status_code == 422
    assert "Another agent already has this name." in response.text
    assert "Pick a model of Runs here (bundled), or type its id." in response.text
    assert "Number must be between 100 and 200000." in response.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Agent)) == 1


def test_an_unknown_tool_is_refused(client, auth, admin):
    auth.login(admin)

    response = client.post("/agents/new", data={**VALID, "enabled_tools": ["rm_rf"]})

    assert response.status_code == 422
    assert "&#39;rm_rf&#39; is not a valid choice" in response.text


def test_the_refinement_tool_is_not_a_reply_tool_to_enable(client, auth, admin):
    auth.login(admin)

    form = client.get("/agents/new")
    response = client.post("/agents/new", data={**VALID, "enabled_tools": ["refine_memory"]})

    assert 'value="save_memory"' in form.text and "refine_memory" not in form.text
    assert response.status_code == 422
    assert "&#39;refine_memory&#39; is not a valid choice" in response.text


def test_edit_an_agent(client, auth, admin):
    auth.login(admin)
    agent = factories.agent(admin.account, "Ada")

    assert "Edit Ada" in client.get(f"/agents/{agent.id}/edit").text
    response = client.post(f"/agents/{agent.id}/edit", data={**VALID, "name": "Ada", "system_prompt": "New."})

    assert response.status_code == 303
    db.session.refresh(agent)
    assert (agent.system_prompt, agent.enabled_tools) == ("New.", [])


def test_an_admin_chooses_what_members_may_see_of_an_agents_memory(client, auth, admin):
    auth.login(admin)
    assert re.search(r'<input checked[^>]*value="prompt"', client.get("/agents/new").text)  # as until now
    agent = factories.agent(admin.account, "Ada")

    response = client.post(f"/agents/{agent.id}/edit", data={**VALID, "members_see_memory": "core"})
    refused = client.post(f"/agents/{agent.id}/edit", data={**VALID, "members_see_memory": "secrets"})

    assert response.status_code == 303 and refused.status_code == 422
    db.session.refresh(agent)
    assert agent.members_see_memory == "core"
    assert re.search(r'<input checked[^>]*value="core"', client.get(f"/agents/{agent.id}/edit").text)
    assert "What members may see of this agent" in client.get(f"/agents/{agent.id}/edit").text


def test_an_agent_turns_its_one_to_one_chats_into_memories_unless_told_not_to(client, auth, admin):
    auth.login(admin)
    form = client.get("/agents/new").text
    assert re.search(r'<input [^>]*checked[^>]*name="consolidates_direct_chats"', form)
    assert "Turn its one-to-one chats into memories" in form
    client.post("/agents/new", data={**VALID, "consolidates_direct_chats": "y"})
    agent = db.session.scalar(sa.select(Agent))
    assert agent.consolidates_direct_chats is True

    response = client.post(f"/agents/{agent.id}/edit", data=VALID)  # the box unticked

    assert response.status_code == 303
    db.session.refresh(agent)
    assert agent.consolidates_direct_chats is False
    edit = client.get(f"/agents/{agent.id}/edit").text
    assert not re.search(r'<input [^>]*checked[^>]*name="consolidates_direct_chats"', edit)
