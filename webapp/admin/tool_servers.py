"""Tools (admins): the MCP servers whose tools the account's agents may call, each with its health, the tools it
lists and the agents that enable each; add, test, change and remove them (webapp.actions.tool_servers).

An environment value or a header is write-only: a page shows its name, never its value, and a form that failed
comes back with those fields empty.
"""

from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import IntegerField, SelectField, StringField, TextAreaField
from wtforms.validators import InputRequired, Length, NumberRange

from webapp.actions import tool_servers as actions
from webapp.admin.common import bp
from webapp.models.tool_servers import DEFAULT_TIMEOUT_SECONDS, KIND_NAMES, ToolServer, account_tool_servers
from webapp.web.auth import admin_required, owned_or_404

SECRET_FIELDS = ("environment", "headers")


class ToolServerForm(FlaskForm):
    name = StringField("Name", validators=[Length(max=100)])
    kind = SelectField("Kind", choices=[(kind, label) for kind, label in KIND_NAMES.items()])
    command = StringField("Command", validators=[Length(max=actions.MAX_TEXT_CHARS)])
    arguments = TextAreaField("Arguments, one per line", validators=[Length(max=20_000)])
    environment = TextAreaField(
        "Environment, one per line as NAME=value (secret)", validators=[Length(max=20_000)]
    )
    url = StringField("Address", validators=[Length(max=actions.MAX_TEXT_CHARS)])
    headers = TextAreaField(
        "Extra headers, one per line as Name: value (secret)", validators=[Length(max=4_000)]
    )
    timeout_seconds = IntegerField(
        "Timeout of a call, in seconds",
        default=DEFAULT_TIMEOUT_SECONDS,
        validators=[InputRequired(), NumberRange(1, actions.MAX_TIMEOUT_SECONDS)],
    )


@bp.get("/tools")
@admin_required
def tool_servers() -> ResponseReturnValue:
    """The account's tool servers: what each runs or reaches, its health, its tools and who enables them."""
    return _page(ToolServerForm(kind="stdio"))


def _page(form: ToolServerForm, status: int = 200, failure: str | None = None) -> ResponseReturnValue:
    html = render_template(
        "tool_servers/index.html",
        servers=account_tool_servers(current_user.account_id),
        enabled_by=actions.enabled_by(current_user.account_id),
        kind_names=KIND_NAMES,
        form=form,
        failure=failure,
        max_timeout=actions.MAX_TIMEOUT_SECONDS,
    )
    return html, status


@bp.post("/tools")
@admin_required
def add_tool_server() -> ResponseReturnValue:
    """Add a server, kept only once it lists its tools; otherwise nothing is saved and the form says why."""
    form = ToolServerForm()
    if not form.validate_on_submit():
        return _refused(form)
    try:
        server = actions.add(
            current_user.account_id,
            name=form.name.data,
            kind=form.kind.data,
            command=form.command.data,
            arguments=actions.parse_arguments(form.arguments.data),
            url=form.url.data,
            secrets=actions.parse_secrets(form.kind.data, _secret_text(form)),
            timeout_seconds=form.timeout_seconds.data,
        )
    except actions.Refused as refusal:
        return _refused(form, refusal)
    return _back(f"{server.name} is added. {_listing(server)}", server)


def _secret_text(form: ToolServerForm) -> str:
    return form.environment.data if form.kind.data == "stdio" else form.headers.data


def _refused(form: ToolServerForm, refusal: actions.Refused | None = None) -> ResponseReturnValue:
    """The page again with the form's errors (422), its secret fields emptied."""
    failure = None
    if refusal is not None and refusal.field and hasattr(form, refusal.field):
        field = getattr(form, refusal.field)
        field.errors = [*field.errors, str(refusal)]
    elif refusal is not None:
        failure = str(refusal)
    for name in SECRET_FIELDS:
        getattr(form, name).data = ""
    return _page(form, 422, failure)


def _listing(server: ToolServer) -> str:
    count = len(server.tools or [])
    unusable = count - len(server.usable_tools)
    said = f"It lists {count} tool{'' if count == 1 else 's'}"
    return f"{said}, {unusable} of them not offered (see why below)." if unusable else f"{said}."


def _back(said: str, server: ToolServer | None = None) -> ResponseReturnValue:
    """Say what happened, back on the page at the server's card."""
    flash(said)
    anchor = f"tool-server-{server.id}" if server else None
    return redirect(url_for("admin.tool_servers", _anchor=anchor), code=303)


@bp.post("/tools/<int:server_id>/test")
@admin_required
def test_tool_server(server_id: int) -> ResponseReturnValue:
    """Start the server afresh and list its tools again; the page says how many, or what failed."""
    server = owned_or_404(ToolServer, server_id)
    if why := actions.check(server):
        return _back(f"{server.name} is down: {why} Its tools as last listed are kept.", server)
    return _back(f"{server.name} is up. {_listing(server)}", server)


@bp.post("/tools/<int:server_id>/edit")
@admin_required
def edit_tool_server(server_id: int) -> ResponseReturnValue:
    """Change a server's timeout, or replace its secrets (empty: keep them); then list its tools again."""
    server = owned_or_404(ToolServer, server_id)
    typed = request.form.get("secrets", "")
    try:
        secrets = actions.parse_secrets(server.kind, typed) if typed.strip() else None
        why = actions.change(server, timeout_seconds=request.form.get("timeout_seconds"), secrets=secrets)
    except actions.Refused as refusal:
        return _back(f"{server.name} was not changed: {refusal}", server)
    if why:
        return _back(f"{server.name} is saved, but it is down: {why}", server)
    return _back(f"{server.name} is saved. {_listing(server)}", server)


@bp.post("/tools/<int:server_id>/remove")
@admin_required
def remove_tool_server(server_id: int) -> ResponseReturnValue:
    """Remove a server with its secrets, taking its tools off every agent that enabled them."""
    server = owned_or_404(ToolServer, server_id)
    name = server.name
    agents = actions.remove(server)
    taken_off = f" Its tools were taken off {', '.join(agents)}." if agents else ""
    return _back(f"{name} is removed, with its secrets.{taken_off}")
