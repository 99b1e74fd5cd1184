"""Embeddings (admins, on the Connections page): which embedder writes the account's vectors, a test of one
embedding, and the progress of the re-embedding a change starts.

The choice is the account's: its agents' memories and messages are embedded, and searched, with it alone
(webapp.search.embedder); another account's choice is its own. Keys stay with their connection, never shown.
"""

import sqlalchemy as sa
from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import SelectField, StringField
from wtforms.validators import Length

from webapp.admin.common import VARY_HTMX, bp
from webapp.extensions import db
from webapp.jobs import embeddings as embedding_jobs
from webapp.jobs.queue import enqueue, job_target
from webapp.llm import providers, targets
from webapp.models import Account, JobRun
from webapp.search import embedder, indexing
from webapp.web import model_picker
from webapp.web.auth import admin_required

FRAGMENT = "embedding-progress"  # the HX-Target of the progress that polls while a change is written


class EmbeddingForm(FlaskForm):
    embedding_choice = SelectField("Embedding model", validate_choice=False)
    embedding_model_id = StringField("Or type a model id", validators=[Length(max=200)])


class NotChosen(ValueError):
    """A choice that names no connection of the account, or no model (the message says which)."""


def form(account: Account, groups: list[model_picker.Group]) -> EmbeddingForm:
    """The choice: the environment's settings (the default), the bundled model, or a model at a connection."""
    choices = EmbeddingForm()
    default = embedder.environment().described
    options = [(f"{embedder.DEFAULT}|", f"{default} (the default: EMBEDDING_* settings)")]
    if embedder.environment().base_url:
        options.append((f"{embedder.BUNDLED}|", "Bundled all-MiniLM-L6-v2 (runs here)"))
    choices.embedding_choice.choices = {
        "": options,
        **{
            g.connection.name: [
                *((model_picker.value(g.connection, m), m) for m in g.models),
                (model_picker.value(g.connection, ""), f"Another model at {g.connection.name} (type its id)"),
            ]
            for g in groups
            if g.connection.kind != "local"  # the llama.cpp server Cairn runs serves no embeddings
        },
    }
    if not choices.is_submitted():
        choices.embedding_choice.data = account.embedding_choice or f"{embedder.DEFAULT}|"
    return choices


def context(account: Account, groups: list[model_picker.Group]) -> dict:
    """What the page's Embeddings section shows."""
    return {"embedding_form": form(account, groups), **_progress(account)}


def _progress(account: Account) -> dict:
    done, total = indexing.progress(account)
    last_run = db.session.scalar(
        sa.select(JobRun)
        .where(JobRun.job_type == "embed_for_new_model", JobRun.target == job_target(account=account.id))
        .order_by(JobRun.id.desc())
        .limit(1)
    )
    return {
        "embedding_chosen": embedder.chosen(account),
        "embedding_searched": embedder.searched(account),
        "embedding_changing": account.embedding_searched is not None,
        "embedding_done": done,
        "embedding_total": total,
        "embedding_run": last_run,
    }


def fragment() -> ResponseReturnValue:
    """The progress alone, as the page's section polls it."""
    html = render_template("connections/_embedding_progress.html", **_progress(current_user.account))
    return html, 200, VARY_HTMX


def _picked(account: Account) -> str | None:
    """The stored form of the posted choice (None: the environment's settings); NotChosen if it is no choice."""
    ref, _, model = (request.form.get("embedding_choice") or "").partition("|")
    if ref in ("", embedder.DEFAULT):
        return None
    if ref == embedder.BUNDLED:
        return f"{embedder.BUNDLED}|"
    connection = targets.connection_in(account.id, ref)
    if connection is None or connection.kind == "local":
        raise NotChosen("Pick a connection of this account.")
    model = (request.form.get("embedding_model_id") or "").strip() or model.strip()
    if not model or len(model) > 200:
        raise NotChosen(f"Pick an embedding model of {connection.name}, or type its id.")
    return f"{connection.key}|{model}"


@bp.post("/connections/embeddings")
@admin_required
def choose_embedder() -> ResponseReturnValue:
    """Make the picked model the account's embedder; its vectors are written in the background."""
    account = current_user.account
    try:
        choice = _picked(account)
    except NotChosen as refusal:
        flash(f"The embedding model was not changed: {refusal}")
        return redirect(url_for("admin.connections", _anchor="embeddings"), code=303)
    rewriting = embedding_jobs.choose(account, choice)
    db.session.commit()
    chosen = embedder.chosen(account).described
    if rewriting:
        flash(f"Memories and messages are being embedded with {chosen}; search switches to it once all are.")
    else:
        flash(f"Search by meaning uses {chosen}.")
    return redirect(url_for("admin.connections", _anchor="embeddings"), code=303)


@bp.post("/connections/embeddings/resume")
@admin_required
def resume_embedding() -> ResponseReturnValue:
    """Queue the re-embedding again (after a failed run): it goes on where it stopped."""
    if current_user.account.embedding_searched is not None:
        enqueue(embedding_jobs.embed_for_new_model, current_user.account_id)
        db.session.commit()
    return redirect(url_for("admin.connections", _anchor="embeddings"), code=303)


def tested(account: Account) -> providers.TestResult:
    """Embed one sentence with the model picked on the form (not saved): what worked, or what failed."""
    result = providers.TestResult(ok=False)
    try:
        candidate = embedder.resolve(account.id, _picked(account))
        vectors = embedder.embed(["Cairn checks that this sentence can be embedded."], using=candidate)
    except NotChosen as refusal:
        result.steps.append(str(refusal))
    except embedder.EmbeddingError as error:
        result.steps.append(f"Embedding one sentence with {candidate.described} failed: {error}")
    else:
        result.ok = True
        result.steps.append(f"{candidate.described} answered a vector of {vectors.shape[1]:,} dimensions.")
    return result
