"""Agents: list, create, edit, download as a file and upload one (admins only)."""

import json
import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from flask_wtf.file import FileField
from redis.exceptions import RedisError
from wtforms import (
    BooleanField,
    HiddenField,
    IntegerField,
    RadioField,
    SelectField,
    SelectMultipleField,
    StringField,
    TextAreaField,
    widgets,
)
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, NumberRange, Optional, Regexp, ValidationError

from webapp.agent_files.errors import AgentFileError, NameRefused, NameTaken
from webapp.agent_files.export import export_agent, record_export
from webapp.agent_files.restore import import_agent
from webapp.agent_files.schema import UPLOAD_CAPS
from webapp.agent_files.validation import read
from webapp.extensions import db
from webapp.jobs.queue import redis_connection
from webapp.models import Agent
from webapp.models.agents import (
    DEFAULT_CORE_TOKEN_BUDGET,
    DEFAULT_TOOLS,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    NAME_RULE,
    SYSTEM_PROMPT_MAX_CHARS,
)
from webapp.models.connections import ENVIRONMENT
from webapp.models.tool_servers import account_tool_servers
from webapp.tools import REPLY_TOOLS
from webapp.web import guards, model_picker
from webapp.web.auth import admin_required, owned_or_404

bp = Blueprint("agents", __name__, url_prefix="/agents")

# What each tool does, in words for the person setting up an agent (the descriptions are written for the model).
TOOL_LABELS = {
    "save_memory": "Remember things: saves what matters (or what you ask it to remember) to its memory",
    "borrow_context": "Look into its other conversations: reads recent messages of another chat it is in, when that helps",
    "recall": "Search its memory: looks up older memories when a question needs them",
}


class AgentForm(FlaskForm):
    name = StringField(
        "Name",
        validators=[
            DataRequired(),
            Length(max=NAME_MAX_CHARS),
            Regexp(NAME_PATTERN, message=NAME_RULE),
        ],
    )
    system_prompt = TextAreaField("System prompt", validators=[Length(max=SYSTEM_PROMPT_MAX_CHARS)])
    model_choice = SelectField("Model", validate_choice=False)
    model_id = StringField("Or type a model id", validators=[Length(max=200)])
    enabled_tools = SelectMultipleField(
        "What it may do", widget=widgets.ListWidget(prefix_label=False), option_widget=widgets.CheckboxInput()
    )
    core_token_budget = IntegerField(
        "Core memory budget (tokens)", validators=[NumberRange(min=100, max=200_000)]
    )
    memory_token_budget = IntegerField(
        "Memory in each prompt (tokens; empty: the MEMORY_TOKEN_BUDGET setting)",
        validators=[Optional(), NumberRange(min=100, max=200_000)],
    )
    members_see_memory = RadioField(
        "What members may see of this agent's memory (admins see all of it)",
        choices=[
            SelectChoice("prompt", "Everything its prompt holds: its core memories and this week's journal"),
            SelectChoice("core", "Its core memories only"),
            SelectChoice("none", "Nothing"),
        ],
        default="prompt",
    )
    background_changes = RadioField(
        "When refinement merges, rewrites or deletes its memories",
        choices=[
            SelectChoice("staged", "Staged for review: nothing changes until an admin approves it"),
            SelectChoice("automatic", "Automatically: at once (each change can be undone afterwards)"),
        ],
        default="staged",
    )
    consolidates_direct_chats = BooleanField("Turn its one-to-one chats into memories")
    paused = BooleanField("Paused (answers nothing, runs no memory jobs)")

    def __init__(self, *args, agent: Agent | None = None, **kwargs):
        super().__init__(*args, obj=agent, **kwargs)
        self.agent = agent
        self.picked: model_picker.Picked | None = None
        self.enabled_tools.choices = [
            (name, TOOL_LABELS.get(name, f"{name}: {tool.description.split('. ')[0]}."))
            for name, tool in REPLY_TOOLS.items()
        ] + _server_tool_choices(current_user.account_id)
        self.model_groups = model_picker.groups(current_user.account_id)
        self.model_choice.choices = model_picker.choices(self.model_groups)
        if not self.is_submitted():
            self._show_current_model()

    def _show_current_model(self) -> None:
        """The picker on the agent's model when its connection lists it, else on "another model" with the id
        in the text field."""
        key = str(self.agent.connection_id) if self.agent and self.agent.connection_id else ENVIRONMENT
        group = next((g for g in self.model_groups if g.connection.key == key), self.model_groups[0])
        model = self.model_id.data or ""
        if model in group.models:
            self.model_choice.data, self.model_id.data = model_picker.value(group.connection, model), ""
        else:
            self.model_choice.data = model_picker.value(group.connection, "")

    def validate_model_id(self, field) -> None:
        try:
            self.picked = model_picker.pick(current_user.account_id, self.model_choice.data, field.data)
        except model_picker.NotListed as refusal:
            raise ValidationError(str(refusal)) from None

    def validate_name(self, field) -> None:
        taken = db.session.scalar(
            sa.select(Agent.id).where(
                Agent.account_id == current_user.account_id,
                sa.func.lower(Agent.name) == field.data.strip().lower(),
                Agent.id != (self.agent.id if self.agent else -1),
            )
        )
        if taken:
            raise ValidationError("Another agent already has this name.")


# A file refused for its name is kept (in the app's Redis, shared by every web process) this long, under a token
# the re-rendered form carries: the admin gives another name without choosing the file again.
KEEP_UPLOAD_SECONDS = 3600


class ImportForm(FlaskForm):
    file = FileField("Agent file (.cairn.json, or a Letta .af)")
    kept = HiddenField(validators=[Length(max=64)])
    name = StringField(
        "Name here (empty: the file's)",
        validators=[Optional(), Length(max=NAME_MAX_CHARS), Regexp(NAME_PATTERN, message=NAME_RULE)],
        filters=[lambda text: text.strip() if text else text],
    )


@bp.get("/")
@admin_required
def index() -> ResponseReturnValue:
    """Every agent of the account, and the form to import one from a file."""
    return _index_page(ImportForm())


def _index_page(form: ImportForm) -> str:
    agents = db.session.scalars(
        sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
    ).all()
    return render_template("agents/index.html", agents=agents, import_form=form)


@bp.post("/import")
@guards.accepts_upload("AGENT_FILE_MAX_BYTES")
@admin_required
def import_file() -> ResponseReturnValue:
    """Restore an agent from an uploaded file as a new agent of the account, or say why the file is refused; a
    file refused for its name is kept, and a free name offered."""
    form = ImportForm()
    valid = form.validate_on_submit()
    upload = _chosen_file(form)
    if upload is None:
        form.file.errors = [*form.file.errors, "Choose a file."]
    elif valid:
        try:
            document = read(upload.raw, UPLOAD_CAPS)
            imported = import_agent(
                document, current_user.account, name=form.name.data or None, by=current_user, via="web"
            )
        except NameTaken as refusal:
            form.name.data = Agent.free_name(
                current_user.account_id, form.name.data or document["agent"]["name"]
            )
            form.name.errors = [
                f"{refusal} “{form.name.data}” is free: import it under that name, or give it another."
            ]
        except NameRefused as refusal:
            form.name.errors = [*form.name.errors, f"{refusal} Give it another name here."]
        except AgentFileError as refusal:
            form.file.errors = [*form.file.errors, f"{refusal} Nothing was imported."]
            upload = None
        else:
            _forget(upload)
            flash(imported.summary())
            return redirect(url_for("admin.ledger", agent_id=imported.agent.id), code=303)
    if upload is not None:
        form.kept.data, form.kept_filename = _keep(upload), upload.filename
    return _index_page(form), 422


@dataclass
class _Upload:
    filename: str
    raw: bytes
    token: str = ""


def _chosen_file(form: ImportForm) -> _Upload | None:
    """The file chosen now, else the one kept from the upload before (None: neither, or it is no longer kept)."""
    if form.file.data and form.file.data.filename:
        return _Upload(form.file.data.filename, form.file.data.read())
    if not form.kept.data:
        return None
    try:
        kept = redis_connection().hgetall(_kept_key(form.kept.data))
    except RedisError:
        return None
    return _Upload(kept[b"filename"].decode(), kept[b"raw"], form.kept.data) if kept else None


def _keep(upload: _Upload) -> str:
    """Keep the upload for KEEP_UPLOAD_SECONDS; its token ("" when Redis cannot keep it: choose it again)."""
    token = upload.token or secrets.token_urlsafe(16)
    try:
        with redis_connection().pipeline() as pipe:
            pipe.hset(_kept_key(token), mapping={"filename": upload.filename, "raw": upload.raw})
            pipe.expire(_kept_key(token), KEEP_UPLOAD_SECONDS)
            pipe.execute()
    except RedisError:
        return ""
    return token


def _forget(upload: _Upload) -> None:
    if upload.token:
        try:
            redis_connection().delete(_kept_key(upload.token))
        except RedisError:
            pass  # it expires by itself


def _kept_key(token: str) -> str:
    """Under the person's id: a token reaches only its own uploader's file."""
    return f"cairn:agent-upload:{current_user.id}:{token}"


@bp.post("/<int:agent_id>/export")
@admin_required
def export(agent_id: int) -> ResponseReturnValue:
    """Download the agent as a cairn-agent file; with chats, those the admin may read (the export is audited)."""
    agent = owned_or_404(Agent, agent_id)
    document = export_agent(agent, with_chats=request.form.get("with_chats") == "1", reader=current_user)
    record_export(agent, document, user=current_user, via="web")
    db.session.commit()
    name = f"{agent.slug or 'agent'}.cairn.json"
    return Response(
        json.dumps(document, ensure_ascii=False, indent=2),
        mimetype="application/json",
        headers={"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"},
    )


def _server_tool_choices(account_id: int) -> list[tuple[str, str]]:
    """Each tool of the account's tool servers (Tools page) that can be offered, by its offered name; off until
    an admin turns it on for an agent."""
    return [
        (tool["offered_name"], f"{server.name}: {tool['name']} (a tool server's): {_first_sentence(tool)}")
        for server in account_tool_servers(account_id)
        for tool in server.usable_tools
    ]


def _first_sentence(tool: dict) -> str:
    return (tool["description"] or "no description").split(". ")[0].rstrip(".")[:160] + "."


@bp.route("/new", methods=["GET", "POST"])
@admin_required
def new() -> ResponseReturnValue:
    """Create an agent."""
    defaults = {
        "model_id": current_app.config["DEFAULT_MODEL_ID"],
        "core_token_budget": DEFAULT_CORE_TOKEN_BUDGET,
        "enabled_tools": list(DEFAULT_TOOLS),
        "consolidates_direct_chats": True,
        "background_changes": "staged",
    }
    form = AgentForm(data=defaults)
    if form.validate_on_submit():
        agent = Agent(account_id=current_user.account_id)
        _save(form, agent)
        flash(f"{agent.name} is ready. Start a chat with {agent.name} below.")
        return redirect(url_for("chats.new", agent=agent.id), code=303)
    return _form_page(form, None)


def _form_page(form: AgentForm, agent: Agent | None):
    html = render_template("agents/form.html", form=form, agent=agent)
    return html, 422 if form.errors else 200


@bp.route("/<int:agent_id>/edit", methods=["GET", "POST"])
@admin_required
def edit(agent_id: int) -> ResponseReturnValue:
    """Edit an agent."""
    agent = owned_or_404(Agent, agent_id)
    form = AgentForm(agent=agent)
    if form.validate_on_submit():
        _save(form, agent)
        return redirect(url_for("agents.index"), code=303)
    return _form_page(form, agent)


def _save(form: AgentForm, agent: Agent) -> None:
    agent.name = form.name.data.strip()
    agent.system_prompt = (form.system_prompt.data or "").strip()
    agent.connection_id, agent.model_id = form.picked.connection_id, form.picked.model
    offered = {name for name, _label in form.enabled_tools.choices}
    agent.enabled_tools = [name for name in form.enabled_tools.data if name in offered]
    agent.core_token_budget = form.core_token_budget.data
    agent.memory_token_budget = form.memory_token_budget.data
    agent.members_see_memory = form.members_see_memory.data
    agent.consolidates_direct_chats = form.consolidates_direct_chats.data
    agent.background_changes = form.background_changes.data
    agent.paused = form.paused.data
    db.session.add(agent)
    db.session.commit()
