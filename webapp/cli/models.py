"""`flask models`: the catalog of capable local models, and downloading one for the local model server."""

import sys

import click
from flask import current_app
from flask.cli import AppGroup

from webapp.local_models.catalog import CATALOG, installed_models, not_installed
from webapp.local_models.download import DownloadError, Status, pull, read_status

models_cli = AppGroup("models", help="Local models: the catalog, and downloading one for the local server.")


@models_cli.command("list")
def list_models() -> None:
    """The catalog (size, memory, window) with what is installed, downloading or stopped."""
    instance = current_app.instance_path
    installed = {model.name: model for model in installed_models(instance)}
    for model in installed.values():
        if model.bundled:
            click.echo(
                f"{model.name:24} installed  bundled    {model.display_name}, {model.context_tokens:,} tokens"
            )
    for model in CATALOG.values():
        size = f"{model.approx_bytes / 1e9:.1f} GB"
        click.echo(
            f"{model.name:24} {_state(model.name, model.name in installed):10} {size:10} {model.display_name}, "
            f"about {model.ram_bytes / 1e9:.1f} GB of memory, {model.n_ctx:,} of {model.context_tokens:,} tokens"
        )
    if missing := not_installed():
        click.echo(f"\n{missing}")
        return
    click.echo(
        f"\nDownload one with `flask models pull NAME` (from {current_app.config['MODEL_DOWNLOAD_BASE_URL']})."
    )


def _state(name: str, installed: bool) -> str:
    if installed:
        return "installed"
    status = read_status(current_app.instance_path, name)
    if status is None:
        return "-"
    return f"{status.state} {status.percent}%" if status.percent is not None else status.state


@models_cli.command("pull")
@click.argument("name")
def pull_model(name: str) -> None:
    """Download NAME from the catalog, check its sha256 and install it (an interrupted download continues)."""
    printer = _Printer()
    try:
        installed = pull(
            name, current_app.instance_path, current_app.config["MODEL_DOWNLOAD_BASE_URL"], printer
        )
    except DownloadError as error:
        printer.end()
        sys.exit(str(error))
    printer.end()
    click.echo(
        f"Installed {installed.name} ({installed.path}); the local model server serves it under that name."
    )


class _Printer:
    """Progress on one line on a terminal; a line every 10% otherwise (logs, pipes)."""

    def __init__(self) -> None:
        self.tty, self.shown, self.open_line = sys.stdout.isatty(), -1, False

    def __call__(self, status: Status) -> None:
        if status.state in ("done", "failed"):  # the command's last line says how it ended
            return
        line = _line(status)
        if self.tty:
            click.echo(f"\r{line}\033[K", nl=False)
            self.open_line = True
        elif status.state != "downloading" or (status.percent or 0) // 10 > self.shown:
            self.shown = (status.percent or 0) // 10
            click.echo(line)

    def end(self) -> None:
        if self.open_line:
            click.echo()
            self.open_line = False


def _line(status: Status) -> str:
    received = f"{status.received / 1e6:,.0f} MB"
    if status.state == "verifying":
        return f"{status.name}: checking its sha256…"
    if status.total:
        return f"{status.name}: {status.percent}% ({received} of {status.total / 1e6:,.0f} MB)"
    return f"{status.name}: {received}"


COMMANDS = [models_cli]
