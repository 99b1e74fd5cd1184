"""Download a catalog model for the local model server, for the admin page (a worker has the time and the disk)."""

from typing import Any

from flask import current_app

from webapp.jobs.queue import recorded_job
from webapp.local_models.download import pull

PULL_SECONDS = 6 * 3600  # 2 GB at 1 Mbit/s takes 4.5 hours; a run stopped by the limit is continued next time


def model_target(name: str) -> str:
    return f"model:{name}"


@recorded_job(
    "pull_model", "Download a local model", model_target, unique="active", timeout=lambda name: PULL_SECONDS
)
def pull_model(name: str) -> dict[str, Any]:
    """Download, check and install one catalog model into instance/models/ (the model server then serves it)."""
    installed = pull(name, current_app.instance_path, current_app.config["MODEL_DOWNLOAD_BASE_URL"])
    return {"installed": installed.name}
