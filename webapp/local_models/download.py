"""Download a catalog model into instance/models/: resumable, checked, and installed only once checked.

A download writes `<file>.part` and continues it with an HTTP Range request when it is cut (within one pull, a few
times, and on the next pull). Once the host has sent every byte, the file's sha256 must be the catalog's; then it
is renamed to its final name and its manifest written (catalog.write_manifest), which is what the model server
serves. A file whose hash is wrong is removed, and the status says so. What a failed download keeps: the `.part`
of the bytes received (the status says how many, and that the next download continues from there); never a file
under its final name, never a manifest.

Progress lives in `<name>.status` beside the file (JSON, replaced whole), so a page in another process reads it;
a lock on `.<name>.lock` (flock, released by the kernel when its process dies) says whether a download is running.
"""

import fcntl
import hashlib
import http.client
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from webapp.local_models.catalog import (
    CATALOG,
    DEFAULT_BASE_URL,
    CatalogModel,
    InstalledModel,
    installed_models,
    models_dir,
    not_installed,
    write_json,
    write_manifest,
)

CHUNK_BYTES = 1 << 20
REPORT_SECONDS = 0.5  # progress is written (and reported) this often while bytes arrive, and at every 1%
TIMEOUT_SECONDS = 30  # a host that sends nothing for this long counts as cut
ATTEMPTS = 4  # a cut download is continued this many times within one pull
FREE_MARGIN_BYTES = 200_000_000  # left free on the disk after a download


class DownloadError(Exception):
    """A download that failed, in words a person reads (what happened, what is kept, what to do)."""


@dataclass
class Status:
    """Where a model's download stands: downloading, verifying, failed, or stopped (a `.part` waits)."""

    name: str
    state: str
    received: int = 0
    total: int | None = None
    message: str = ""
    updated: float = 0.0

    @property
    def percent(self) -> int | None:
        return min(100, int(100 * self.received / self.total)) if self.total else None

    @property
    def running(self) -> bool:
        return self.state in ("downloading", "verifying")


def status_path(instance: str | Path, name: str) -> Path:
    return models_dir(instance) / f"{name}.status"


def part_path(instance: str | Path, model: CatalogModel) -> Path:
    return models_dir(instance) / f"{model.filename}.part"


def read_status(instance: str | Path, name: str) -> Status | None:
    """The model's download as any process sees it; None when there is nothing to say (never tried, or done).

    A status that says "downloading" while nobody holds the download's lock is from a process that died: it
    reads as stopped, with what its `.part` holds."""
    model = CATALOG.get(name)
    try:
        status = Status(**json.loads(status_path(instance, name).read_text()))
    except (OSError, ValueError, TypeError):
        status = None
    if status is not None and status.running and not download_running(instance, name):
        status.state, status.message = "stopped", "The download stopped before it finished."
    part = part_path(instance, model) if model else None
    if status is None and part is not None and part.exists():
        status = Status(name, "stopped", total=model.size_bytes, message="A download was stopped.")
    if status is not None and status.state in ("stopped", "failed") and part is not None:
        status.received = part.stat().st_size if part.exists() else 0
    return status


def download_running(instance: str | Path, name: str) -> bool:
    """Whether some process on this machine is downloading the model now."""
    lock = _lock_path(instance, name)
    if not lock.exists():
        return False
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def pull(
    name: str,
    instance: str | Path,
    base_url: str = DEFAULT_BASE_URL,
    on_progress: Callable[[Status], None] | None = None,
    *,
    attempts: int = ATTEMPTS,
) -> InstalledModel:
    """Download, check and install the catalog model `name`; its InstalledModel. Raises DownloadError."""
    model = CATALOG.get(name)
    if model is None:
        raise DownloadError(f"No model named {name!r} in the catalog; it has {', '.join(CATALOG)}.")
    if missing := not_installed():
        raise DownloadError(f"{missing} Nothing was downloaded: no model could be served here until then.")
    directory = models_dir(instance)
    directory.mkdir(parents=True, exist_ok=True)
    with _download_lock(instance, name):
        progress = _Progress(instance, name, on_progress)
        try:
            return _pull(model, instance, base_url, progress, attempts)
        except DownloadError as error:
            progress.fail(str(error))
            raise


def _pull(
    model: CatalogModel, instance: str | Path, base_url: str, progress: "_Progress", attempts: int
) -> InstalledModel:
    final = models_dir(instance) / model.filename
    part = part_path(instance, model)
    if installed := next(
        (m for m in installed_models(instance, bundled=False) if m.name == model.name), None
    ):
        progress.done()
        return installed
    if final.exists() and not part.exists():  # renamed, but its manifest was never written: check it again
        os.replace(final, part)
    _refuse_without_room(model, part)
    url, host = model.url(base_url), urlsplit(base_url).netloc or base_url
    for attempt in range(attempts):
        received_before = part.stat().st_size if part.exists() else 0
        try:
            complete = _fetch(model, url, host, part, progress)
        except _Cut as cut:
            if attempt + 1 < attempts and cut.received > received_before:
                time.sleep(min(attempt, 3))
                continue  # it moved on: continue where it stopped
            raise DownloadError(_kept(f"The connection to {host} broke off ({cut.reason}).", part)) from None
        if complete:
            break
    else:
        raise DownloadError(_kept(f"{host} did not send the whole file.", part))
    _verify(model, part, progress)
    os.replace(part, final)
    installed = write_manifest(instance, model, final)
    progress.done()
    return installed


class _Cut(Exception):
    def __init__(self, received: int, reason: str):
        super().__init__(reason)
        self.received, self.reason = received, reason


def _fetch(model: CatalogModel, url: str, host: str, part: Path, progress: "_Progress") -> bool:
    """Continue `part` from its end; True once it holds the whole file. Raises _Cut or DownloadError."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "cairn-model-download", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS
        )
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # the range starts at the end: the .part is whole (or too long)
            return True
        raise DownloadError(_kept(_http_problem(error, host, model), part)) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(
            _kept(
                f"Could not reach the model host {host} ({reason}). Check this machine's network connection "
                "(or MODEL_DOWNLOAD_BASE_URL) and try again.",
                part,
            )
        ) from None
    with response:
        if have and response.status != 206:  # the host ignored the range: start again
            have = 0
        total = _total(response, have) or model.size_bytes
        if model.size_bytes and total and total != model.size_bytes:
            raise DownloadError(
                f"{host} offers {total:,} bytes for {model.filename}, not the {model.size_bytes:,} the catalog "
                "pins: refusing a different file."
            )
        progress.update(have, total)
        with part.open("ab" if have else "wb") as out:
            try:
                while chunk := response.read(CHUNK_BYTES):
                    out.write(chunk)
                    have += len(chunk)
                    progress.update(have, total)
            except (OSError, http.client.HTTPException) as error:
                raise _Cut(have, str(error) or type(error).__name__) from None
    if total and have < total:
        raise _Cut(have, f"{have:,} of {total:,} bytes arrived")
    return True


def _total(response: http.client.HTTPResponse, have: int) -> int | None:
    """The whole file's size from Content-Range (a continued download) or Content-Length."""
    content_range = response.headers.get("Content-Range", "")
    if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


def _verify(model: CatalogModel, part: Path, progress: "_Progress") -> None:
    """The whole file's sha256 must be the catalog's; a file that is not is removed."""
    size = part.stat().st_size
    progress.update(size, size, state="verifying")
    if model.size_bytes and size != model.size_bytes:
        part.unlink()
        raise DownloadError(
            f"The downloaded {model.filename} has {size:,} bytes, not the {model.size_bytes:,} the catalog pins. "
            "It was removed; download it again."
        )
    with part.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    if digest != model.sha256:
        part.unlink()
        raise DownloadError(
            f"The downloaded {model.filename} is not the file the catalog pins: its sha256 is {digest}, not "
            f"{model.sha256}. It was corrupted on the way or changed on the host, and was removed; download it "
            "again."
        )


def _http_problem(error: urllib.error.HTTPError, host: str, model: CatalogModel) -> str:
    if error.code == 404:
        return f"{host} has no {model.filename} at the pinned commit (HTTP 404)."
    if error.code in (401, 403):
        return f"{host} refused the download of {model.filename} (HTTP {error.code}: {error.reason})."
    return f"{host} answered HTTP {error.code} ({error.reason}) for {model.filename}; try again later."


def _kept(problem: str, part: Path) -> str:
    """The problem, and what was kept of the download for the next attempt."""
    kept = part.stat().st_size if part.exists() else 0
    if not kept:
        return f"{problem} Nothing was installed."
    return (
        f"{problem} Nothing was installed; the {_megabytes(kept)} received so far are kept in {part.name}, and "
        "the next download of it continues from there."
    )


def _refuse_without_room(model: CatalogModel, part: Path) -> None:
    have = part.stat().st_size if part.exists() else 0
    needed = (model.size_bytes or model.approx_bytes) - have + FREE_MARGIN_BYTES
    free = shutil.disk_usage(part.parent).free
    if free < needed:
        raise DownloadError(
            f"Not enough disk space for {model.display_name}: it needs {_megabytes(needed)} more in "
            f"{part.parent}, which has {_megabytes(free)} free."
        )


def _megabytes(count: int) -> str:
    return f"{count / 1_000_000:,.0f} MB"


def _lock_path(instance: str | Path, name: str) -> Path:
    return models_dir(instance) / f".{name}.lock"


@contextmanager
def _download_lock(instance: str | Path, name: str) -> Iterator[None]:
    """One download of a model at a time on this machine (the CLI and a worker alike)."""
    with _lock_path(instance, name).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"{name} is being downloaded already (by another process).") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Progress:
    """Writes the status file (at most every REPORT_SECONDS while bytes arrive) and tells on_progress."""

    def __init__(self, instance: str | Path, name: str, on_progress: Callable[[Status], None] | None):
        self.path, self.on_progress = status_path(instance, name), on_progress
        self.status = Status(name, "downloading")
        self.last, self.written = 0.0, 0

    def update(self, received: int, total: int | None, state: str = "downloading") -> None:
        changed_state = state != self.status.state
        self.status.received, self.status.total, self.status.state = received, total, state
        now, step = time.monotonic(), (total or 0) // 100  # every 1% too, so a stalled link shows where it is
        moved = received - self.written >= step > 0 or (total and received >= total)
        if changed_state or now - self.last >= REPORT_SECONDS or moved:
            self.last, self.written = now, received
            self._write()

    def fail(self, message: str) -> None:
        self.status.state, self.status.message = "failed", message
        self._write()

    def done(self) -> None:
        self.status.state = "done"
        if self.on_progress:
            self.on_progress(self.status)
        self.path.unlink(missing_ok=True)  # installed: the manifest says so from now on

    def _write(self) -> None:
        self.status.updated = time.time()
        write_json(self.path, asdict(self.status))
        if self.on_progress:
            self.on_progress(self.status)
