"""Local models: the catalog of capable models the local server can serve, a Download button for each (a queued
job), its progress from the download's status file while it runs, and what is installed. Where the local model
server is not installed (the `local-llm` extra), the page says so and how to add it, and offers no download: a
downloaded model could not be served.

The panel (`local_models/_panel.html`, at /admin/local-models/panel) stands alone, so another page can embed it
with hx-get; it polls itself every 2 s while a download is queued or running."""

from dataclasses import dataclass

import sqlalchemy as sa
from flask import abort, current_app, render_template, url_for
from flask.typing import ResponseReturnValue

from webapp.admin.common import answer, bp
from webapp.admin.run_words import failure
from webapp.extensions import db
from webapp.jobs.local_models import model_target, pull_model
from webapp.jobs.queue import enqueue
from webapp.local_models.catalog import CATALOG, CatalogModel, InstalledModel, installed_models, not_installed
from webapp.local_models.download import Status, read_status
from webapp.models import JobRun
from webapp.web.auth import admin_required
from webapp.web.fragments import page_or_fragment

PANEL_ID = "local-models"


@dataclass
class Row:
    """One catalog model as the panel shows it."""

    model: CatalogModel
    installed: InstalledModel | None
    status: Status | None  # the download's own record (progress, or what went wrong, in words)
    run: JobRun | None  # the latest Download click's run

    @property
    def state(self) -> str:
        """installed, queued, downloading, verifying, failed, stopped or available."""
        if self.installed:
            return "installed"
        if self.status and self.status.running:
            return self.status.state
        if self.run and self.run.status in ("queued", "running"):
            return "queued"
        if (
            self.run
            and self.run.status in ("failed", "interrupted")
            or self.status
            and self.status.state == "failed"
        ):
            return "failed"
        return self.status.state if self.status else "available"

    @property
    def problem(self) -> str | None:
        """What went wrong, in words: the download's own message, else the run's error."""
        if self.state not in ("failed", "stopped"):
            return None
        if self.status and self.status.message:
            return self.status.message
        return failure(self.run.error).text if self.run and self.run.error else None


def _rows() -> list[Row]:
    instance = current_app.instance_path
    installed = {model.name: model for model in installed_models(instance, bundled=False)}
    runs = db.session.scalars(
        sa.select(JobRun)
        .where(JobRun.job_type == "pull_model")
        .where(JobRun.target.in_([model_target(name) for name in CATALOG]))
        .order_by(JobRun.id)
    )
    latest = {run.target: run for run in runs}
    return [
        Row(model, installed.get(name), read_status(instance, name), latest.get(model_target(name)))
        for name, model in CATALOG.items()
    ]


def _context(message: str | None = None) -> dict:
    rows = _rows()
    return {
        "rows": rows,
        "served": installed_models(current_app.instance_path),
        "polling": any(row.state in ("queued", "downloading", "verifying") for row in rows),
        "local_server": current_app.config["LOCAL_LLM"],
        "host": current_app.config["MODEL_DOWNLOAD_BASE_URL"],
        "message": message,
    }


@bp.get("/local-models")
@admin_required
def local_models() -> ResponseReturnValue:
    """The local models page (or its panel, for HTMX)."""
    return page_or_fragment("local_models/index.html", {PANEL_ID: "local_models/_panel.html"}, **_context())


@bp.get("/local-models/panel")
@admin_required
def local_models_panel() -> ResponseReturnValue:
    """The panel alone: for embedding in another page, and for its own polling."""
    return render_template("local_models/_panel.html", **_context())


@bp.post("/local-models/<name>/download")
@admin_required
def download_local_model(name: str) -> ResponseReturnValue:
    """Queue the download of a catalog model (a worker downloads, checks and installs it)."""
    model = CATALOG.get(name) or abort(404)
    if missing := not_installed():
        text = missing
    elif any(m.name == name for m in installed_models(current_app.instance_path, bundled=False)):
        text = f"{model.display_name} is installed already."
    else:
        enqueue(pull_model, name)  # none when one is queued or running already: the panel follows that one
        db.session.commit()
        text = f"Downloading {model.display_name}: a worker fetches and checks it."
    url = url_for("admin.local_models")
    return answer("local_models/_panel.html", 200, url, text, **_context(text))
