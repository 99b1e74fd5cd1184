"""Connections (admins): the model providers the account's agents may use, each tested and with its models; an
Ollama found on this machine offered in one click; the model memory jobs use; models that run here.

A key is write-only: after saving, a page shows only that there is one (and its last characters when long).
"""

import sqlalchemy as sa
from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import PasswordField, SelectField, StringField, TextAreaField
from wtforms.validators import Length

from webapp.admin import embeddings
from webapp.admin.common import VARY_HTMX, bp
from webapp.extensions import db
from webapp.llm import providers, targets
from webapp.models import Agent
from webapp.models import connections as connection_rows
from webapp.models.connections import KIND_NAMES, Connection, Refused
from webapp.runtime.health import without_password
from webapp.web import model_picker
from webapp.web.auth import admin_required, owned_or_404

ADDRESS_EXAMPLES = {"openai": "https://openrouter.ai/api/v1", "ollama": "http://127.0.0.1:11434"}


class ConnectionForm(FlaskForm):
    name = StringField("Name", validators=[Length(max=connection_rows.MAX_NAME_CHARS)])
    kind = SelectField("Kind", choices=[("openai", KIND_NAMES["openai"]), ("ollama", KIND_NAMES["ollama"])])
    base_url = StringField("Address", validators=[Length(max=500)])
    api_key = PasswordField("API key", validators=[Length(max=1000)])
    headers = TextAreaField("Extra headers (one per line, Name: value)", validators=[Length(max=4000)])


class BackgroundForm(FlaskForm):
    model_choice = SelectField("Model for memory jobs", validate_choice=False)
    model_id = StringField("Or type a model id", validators=[Length(max=200)])


@bp.get("/connections")
@admin_required
def connections() -> ResponseReturnValue:
    """The account's connections, the environment's first, with their models and last check."""
    if request.headers.get("HX-Target") == embeddings.FRAGMENT:
        return embeddings.fragment()
    return _page(ConnectionForm(kind="openai"))


def _page(form: ConnectionForm, status: int = 200, test_results: dict | None = None) -> ResponseReturnValue:
    account = current_user.account
    rows = connection_rows.account_connections(account.id)
    groups = model_picker.groups(account.id)
    html = render_template(
        "connections/index.html",
        environment=groups[0].connection,
        environment_address=without_password(groups[0].connection.base_url),
        kind_names=KIND_NAMES,
        environment_models=groups[0].models,
        connections=rows,
        form=form,
        background=_background_form(account, groups),
        detected=model_picker.detected_ollama(account.id),
        users=_users_by_connection(account.id),
        test_results=test_results or {},
        examples=ADDRESS_EXAMPLES,
        **embeddings.context(account, groups),
    )
    return html, status, VARY_HTMX


def _background_form(account, groups: list[model_picker.Group]) -> BackgroundForm:
    form = BackgroundForm()
    form.model_choice.choices = {"": [("", "Each agent's own model")], **model_picker.choices(groups)}
    if account.background_model_id and not form.is_submitted():
        connection = targets.connection_in(account.id, account.background_connection_id)
        form.model_choice.data = model_picker.value(connection, account.background_model_id)
    return form


def _users_by_connection(account_id: int) -> dict[str, list[str]]:
    """The names of the agents on each connection, by the connection's ref."""
    found: dict[str, list[str]] = {}
    agents = db.session.execute(
        sa.select(Agent.name, Agent.connection_id).where(Agent.account_id == account_id).order_by(Agent.name)
    )
    for name, connection_id in agents:
        key = str(connection_id) if connection_id else connection_rows.ENVIRONMENT
        found.setdefault(key, []).append(name)
    return found


@bp.post("/connections")
@admin_required
def add_connection() -> ResponseReturnValue:
    """Add a connection, then list its models (a connection that cannot list them is kept, with why)."""
    form = ConnectionForm()
    if not form.validate_on_submit():
        return _page(form, 422)
    try:
        connection = connection_rows.add(
            current_user.account_id,
            name=form.name.data,
            kind=form.kind.data,
            base_url=form.base_url.data,
            api_key=form.api_key.data,
            headers=connection_rows.parse_headers(form.headers.data),
        )
    except Refused as refusal:
        _field_error(form, refusal)
        return _page(form, 422)
    return _added(connection)


def _added(connection: Connection) -> ResponseReturnValue:
    """A new connection committed with the models it lists (kept even when it cannot list them, saying why)."""
    db.session.flush()
    outcome = _refreshed(connection)
    db.session.commit()
    return _back(f"{connection.name} is added. {outcome}", connection)


def _back(said: str, connection: Connection | None = None, anchor: str | None = None) -> ResponseReturnValue:
    """Say what happened, back on the page at the connection's card (or `anchor`)."""
    flash(said)
    anchor = anchor or (f"connection-{connection.id}" if connection else None)
    return redirect(url_for("admin.connections", _anchor=anchor), code=303)


def _refreshed(connection) -> str:
    try:
        models = providers.refresh(connection)
    except providers.ProviderError as error:
        return f"Its models could not be listed: {error}"
    return f"It lists {len(models)} model{'' if len(models) == 1 else 's'}."


def _field_error(form: FlaskForm, refusal: Refused) -> None:
    field = getattr(form, refusal.field or "name")
    field.errors = [*field.errors, str(refusal)]


@bp.post("/connections/ollama")
@admin_required
def add_detected_ollama() -> ResponseReturnValue:
    """One click: the Ollama found at OLLAMA_BASE_URL becomes a connection named Ollama."""
    address = current_app.config["OLLAMA_BASE_URL"]
    name = "Ollama"
    taken = {row.name.lower() for row in connection_rows.account_connections(current_user.account_id)}
    n = 1
    while name.lower() in taken:
        n += 1
        name = f"Ollama {n}"
    connection = connection_rows.add(current_user.account_id, name=name, kind="ollama", base_url=address)
    return _added(connection)


@bp.post("/connections/<key>/test")
@admin_required
def test_connection(key: str) -> ResponseReturnValue:
    """List the connection's models and ask one for a word; the page says what worked and what failed."""
    connection = _connection_or_404(key)
    result = providers.test(connection, request.form.get("model") or None)
    db.session.commit()
    return _page(ConnectionForm(kind="openai"), test_results={connection.key: result})


@bp.post("/connections/<int:connection_id>/refresh")
@admin_required
def refresh_connection(connection_id: int) -> ResponseReturnValue:
    """Ask the provider for its models again."""
    connection = owned_or_404(Connection, connection_id)
    outcome = _refreshed(connection)
    db.session.commit()
    return _back(f"{connection.name}: {outcome}", connection)


@bp.post("/connections/<int:connection_id>/edit")
@admin_required
def edit_connection(connection_id: int) -> ResponseReturnValue:
    """Rename or move a connection, replace its key or its extra headers (empty: keep them)."""
    connection = owned_or_404(Connection, connection_id)
    form = request.form
    try:
        typed = form.get("headers", "").strip()
        headers = connection_rows.parse_headers(typed) if typed else None  # empty: keep them
        connection_rows.change(
            connection,
            name=form.get("name", connection.name),
            base_url=form.get("base_url", connection.base_url),
            api_key=form.get("api_key", ""),
            headers=headers,
        )
    except Refused as refusal:
        db.session.rollback()
        return _back(f"{connection.name} was not changed: {refusal}", connection)
    db.session.commit()
    return _back(f"{connection.name} is saved.", connection)


@bp.post("/connections/<int:connection_id>/models")
@admin_required
def set_model_settings(connection_id: int) -> ResponseReturnValue:
    """A model's window and price at this connection, as an admin knows them (empty: the provider's)."""
    connection = owned_or_404(Connection, connection_id)
    model = (request.form.get("model") or "").strip()
    try:
        values = {
            "context_tokens": _number(request.form.get("context_tokens"), int, "The window", 256, 10_000_000),
            "input": _number(request.form.get("input"), float, "The input price", 0, 10_000),
            "output": _number(request.form.get("output"), float, "The output price", 0, 10_000),
        }
    except Refused as refusal:
        return _back(f"{model} was not changed: {refusal}", connection)
    if not model or len(model) > 200:
        return _back("Name the model.", connection)
    settings = dict(connection.model_settings or {})
    settings[model] = {k: v for k, v in values.items() if v is not None}
    connection.model_settings = {k: v for k, v in settings.items() if v}
    db.session.commit()
    return _back(f"{model} at {connection.name} is saved.", connection)


def _number(text: str | None, kind: type, what: str, low: float, high: float):
    if not (text or "").strip():
        return None
    try:
        value = kind(text.strip())
    except ValueError:
        raise Refused(f"{what} must be a number.") from None
    if not low <= value <= high:
        raise Refused(f"{what} must be between {low:g} and {high:g}.")
    return value


@bp.post("/connections/<int:connection_id>/remove")
@admin_required
def remove_connection(connection_id: int) -> ResponseReturnValue:
    """Remove a connection no agent uses (and its key with it)."""
    connection = owned_or_404(Connection, connection_id)
    try:
        connection_rows.remove(connection)
    except Refused as refusal:
        return _back(f"{connection.name} is kept: {refusal}", connection)
    db.session.commit()
    return _back(f"{connection.name} is removed, with its key.")


@bp.post("/connections/background")
@admin_required
def set_background_model() -> ResponseReturnValue:
    """The model memory jobs use for every agent of the account (empty: each agent's own)."""
    account = current_user.account
    form = BackgroundForm()
    if not form.model_choice.data and not (form.model_id.data or "").strip():
        account.background_connection_id, account.background_model_id = None, None
        db.session.commit()
        return _back("Memory jobs use each agent's own model.", anchor="background")
    try:
        picked = model_picker.pick(account.id, form.model_choice.data, form.model_id.data)
    except model_picker.NotListed as refusal:
        return _back(f"The background model was not changed: {refusal}", anchor="background")
    account.background_connection_id, account.background_model_id = picked.connection_id, picked.model
    db.session.commit()
    return _back(f"Memory jobs now use {picked.model} at {picked.connection.name}.", anchor="background")


def _connection_or_404(key: str):
    connection = targets.connection_in(current_user.account_id, key)
    if connection is None:
        abort(404)
    return connection


@bp.post("/connections/embeddings/test")
@admin_required
def test_embedder() -> ResponseReturnValue:
    """Embed one sentence with the picked model (not saved); the page says what worked or what failed."""
    result = embeddings.tested(current_user.account)
    return _page(ConnectionForm(kind="openai"), test_results={"embeddings": result})
