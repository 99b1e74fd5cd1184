"""Capable local models: downloads from a stand-in for the model host (resumed, checked, installed only once
checked), `flask models`, the admin page and its job, and the local server serving what was installed."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import free_port, wait_for
from webapp.config import LOCAL_MODEL_ID
from webapp.extensions import db
from webapp.jobs.local_models import pull_model
from webapp.local_models.catalog import (
    CATALOG,
    CatalogModel,
    installed_models,
    installed_signature,
    models_dir,
)
from webapp.local_models.download import DownloadError, pull, read_status
from webapp.models import JobRun
from webapp.runtime.processes import llm_server_argv, local_model_path, service
from webapp.runtime.supervisor import Service, Supervisor

NAME = "smollm2-copy"
GGUF = Path(local_model_path())


@pytest.fixture(scope="session")
def gguf_sha256() -> str:
    with GGUF.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class FakeHost:
    """The model host on loopback: serves one file at /<repo>/resolve/<revision>/<filename>, with Range requests.

    `cut_once_at`: the first response stops after that many bytes of the file and drops the connection.
    `gate`: a response pauses half way until the event is set. `answer_status`: answer every request so."""

    def __init__(self, path: Path):
        self.path, self.requests = path, []
        self.cut_once_at: int | None = None
        self.gate: threading.Event | None = None
        self.answer_status: int | None = None
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                host.requests.append((self.path, self.headers.get("Range")))
                host.serve(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve(self, handler) -> None:
        if self.answer_status:
            handler.send_error(self.answer_status)
            return
        data_size = self.path.stat().st_size
        start = 0
        if ranged := handler.headers.get("Range"):
            start = int(ranged.removeprefix("bytes=").split("-")[0])
            if start >= data_size:
                handler.send_error(416)
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{data_size - 1}/{data_size}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(data_size - start))
        handler.end_headers()
        stop, self.cut_once_at = self.cut_once_at, None
        half = data_size // 2
        with self.path.open("rb") as source:
            source.seek(start)
            position = start
            while chunk := source.read(1 << 20):
                if stop is not None and position + len(chunk) > stop:
                    handler.wfile.write(chunk[: stop - position])
                    handler.wfile.flush()
                    handler.close_connection = True
                    return
                if self.gate is not None and position < half <= position + len(chunk):
                    handler.wfile.flush()
                    self.gate.wait(30)
                handler.wfile.write(chunk)
                position += len(chunk)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def host():
    server = FakeHost(GGUF)
    yield server
    server.close()


def _entry(sha256: str, size: int | None, **changes) -> CatalogModel:
    return CatalogModel(
        **{
            "name": NAME,
            "display_name": "SmolLM2 copy",
            "repo": "test/SmolLM2-GGUF",
            "revision": "0123456789abcdef0123456789abcdef01234567",
            "filename": "SmolLM2-copy.gguf",
            "sha256": sha256,
            "size_bytes": size,
            "approx_bytes": GGUF.stat().st_size,
            "context_tokens": 8192,
            "n_ctx": 2048,
            "ram_bytes": 300_000_000,
            "chat_format": "chatml-function-calling",
            "license": "Apache-2.0",
            "about": "The bundled model, downloaded again.",
            **changes,
        }
    )


@pytest.fixture
def model(monkeypatch, gguf_sha256):
    """A catalog entry for the bundled GGUF file, with its real sha256 and size."""
    entry = _entry(gguf_sha256, GGUF.stat().st_size)
    monkeypatch.setitem(CATALOG, NAME, entry)
    return entry


@pytest.fixture
def instance(app, tmp_path, host):
    """The app's instance folder in tmp_path, and the stand-in host as the download base URL."""
    app.instance_path = str(tmp_path / "instance")
    app.config["MODEL_DOWNLOAD_BASE_URL"] = host.url
    return Path(app.instance_path)


def _left_in(instance: Path) -> list[str]:
    """The model files in instance/models/ (the status record and the lock aside)."""
    directory = models_dir(instance)
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".status") and p.name[0] != ".")


def test_a_pull_installs_the_checked_file_and_its_progress_is_readable_meanwhile(instance, host, model):
    seen = []

    def on_progress(status):
        if status.state == "downloading" and 0 < status.received < model.size_bytes:
            seen.append(read_status(instance, NAME))  # as another process reads it

    installed = pull(NAME, instance, host.url, on_progress)

    assert seen and seen[0].state == "downloading" and seen[0].total == model.size_bytes
    assert 0 < seen[0].received < model.size_bytes and 0 <= seen[0].percent < 100
    assert installed.name == NAME and installed.context_tokens == 2048
    assert _left_in(instance) == ["SmolLM2-copy.gguf", f"{NAME}.json"]
    assert read_status(instance, NAME) is None  # installed: nothing left to say
    assert [m.name for m in installed_models(instance)] == [LOCAL_MODEL_ID, NAME]
    assert host.requests == [(f"/test/SmolLM2-GGUF/resolve/{model.revision}/SmolLM2-copy.gguf", None)]


def test_a_cut_connection_is_continued_with_a_range_request(instance, host, model):
    host.cut_once_at = model.size_bytes // 2

    pull(NAME, instance, host.url)

    assert [ranged for _, ranged in host.requests] == [None, f"bytes={model.size_bytes // 2}-"]
    assert _left_in(instance) == ["SmolLM2-copy.gguf", f"{NAME}.json"]


def test_a_stopped_download_is_kept_said_so_and_continued_by_the_next_pull(instance, host, model):
    host.cut_once_at = model.size_bytes // 3

    with pytest.raises(DownloadError) as stopped:
        pull(NAME, instance, host.url, attempts=1)

    assert "broke off" in str(stopped.value) and "Nothing was installed" in str(stopped.value)
    assert "the next download of it continues from there" in str(stopped.value)
    assert _left_in(instance) == ["SmolLM2-copy.gguf.part"]
    status = read_status(instance, NAME)
    assert status.state == "failed" and status.received == model.size_bytes // 3

    pull(NAME, instance, host.url)

    assert host.requests[-1][1] == f"bytes={model.size_bytes // 3}-"
    assert _left_in(instance) == ["SmolLM2-copy.gguf", f"{NAME}.json"]


def test_a_file_whose_sha256_differs_is_refused_and_removed(instance, host, monkeypatch, gguf_sha256):
    monkeypatch.setitem(CATALOG, NAME, _entry("0" * 64, GGUF.stat().st_size))

    with pytest.raises(DownloadError) as refused:
        pull(NAME, instance, host.url)

    assert f"its sha256 is {gguf_sha256}, not {'0' * 64}" in str(refused.value)
    assert "was removed" in str(refused.value)
    assert _left_in(instance) == []
    assert read_status(instance, NAME).state == "failed"
    assert [m.name for m in installed_models(instance)] == [LOCAL_MODEL_ID]


def test_without_a_pinned_size_the_hosts_length_gives_the_progress(instance, host, monkeypatch, gguf_sha256):
    monkeypatch.setitem(CATALOG, NAME, _entry(gguf_sha256, None))
    totals = []

    pull(NAME, instance, host.url, lambda status: totals.append(status.total))

    assert set(totals) == {GGUF.stat().st_size}


def test_an_unreachable_host_is_named_and_nothing_is_left_behind(instance, model):
    port = free_port()

    with pytest.raises(DownloadError) as unreachable:
        pull(NAME, instance, f"http://127.0.0.1:{port}")

    assert str(unreachable.value).startswith(f"Could not reach the model host 127.0.0.1:{port}")
    assert "Nothing was installed." in str(unreachable.value)
    assert _left_in(instance) == []


def test_a_file_missing_on_the_host_says_so(instance, host, model):
    host.answer_status = 404

    with pytest.raises(DownloadError, match=r"has no SmolLM2-copy.gguf at the pinned commit \(HTTP 404\)"):
        pull(NAME, instance, host.url)

    assert _left_in(instance) == []


def test_a_second_pull_of_an_installed_model_downloads_nothing(instance, host, model):
    pull(NAME, instance, host.url)

    pull(NAME, instance, host.url)

    assert len(host.requests) == 1


def test_installing_a_model_changes_what_the_server_is_restarted_for(instance, host, model):
    before = installed_signature(instance)

    pull(NAME, instance, host.url)

    assert installed_signature(instance) != before


def test_the_model_servers_supervisor_restarts_it_once_a_model_is_installed(app, instance, host, model):
    llm = service("llm", app.config, instance)
    llm.before_start()
    assert llm.restart_when() is None

    pull(NAME, instance, host.url)

    assert llm.restart_when() == "the installed models changed"
    llm.before_start()  # the restarted server serves it
    assert llm.restart_when() is None
    assert [m.name for m in installed_models()] == [LOCAL_MODEL_ID, NAME]  # the app's instance by default


def test_the_supervisor_restarts_its_child_when_asked_without_backoff(tmp_path, monkeypatch):
    starts = tmp_path / "starts"
    asked = []

    def restart_when():
        asked.append(1)
        return "the installed models changed" if len(asked) == 1 else None

    child = "import sys, time; open(sys.argv[1], 'a').write('x'); time.sleep(600)"
    service = Service("llm", [sys.executable, "-c", child, str(starts)], restart_when=restart_when)
    supervisor = Supervisor(service, backoff=[30])  # a restart taken for a crash would wait 30 s
    monkeypatch.setattr("webapp.runtime.supervisor.signal.signal", lambda *args: None)  # a thread may not
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: starts.exists() and starts.read_text() == "xx", 15, "a restarted child")
    finally:
        supervisor.stop_requested = True
        thread.join(10)
    assert not thread.is_alive()


# --- the CLI ---


def test_flask_models_pull_prints_progress_and_installs(runner, instance, model):
    result = runner.invoke(args=["models", "pull", NAME])

    assert result.exit_code == 0, result.output
    assert f"{NAME}: 0% (" in result.output and f"{NAME}: 100% (" in result.output
    assert f"Installed {NAME}" in result.output
    listing = runner.invoke(args=["models", "list"])
    assert f"{LOCAL_MODEL_ID}" in listing.output and "bundled" in listing.output
    assert any(line.startswith(NAME) and "installed" in line for line in listing.output.splitlines())
    assert "qwen2.5-3b-instruct" in listing.output


def test_flask_models_pull_fails_with_the_message(runner, app, instance, model):
    app.config["MODEL_DOWNLOAD_BASE_URL"] = f"http://127.0.0.1:{free_port()}"

    result = runner.invoke(args=["models", "pull", NAME])

    assert result.exit_code != 0
    assert "Could not reach the model host 127.0.0.1" in result.output


def test_flask_models_pull_of_an_unknown_name_lists_the_catalog(runner, instance):
    result = runner.invoke(args=["models", "pull", "gpt-5"])

    assert result.exit_code != 0 and "qwen2.5-1.5b-instruct" in result.output


# --- the admin page and its job ---


def test_the_page_is_for_admins(client, auth, member, instance):
    assert client.get("/admin/local-models").status_code == 302  # to sign in
    auth.login(member)
    assert client.get("/admin/local-models").status_code == 403
    assert client.get("/admin/local-models/panel").status_code == 403
    assert client.post(f"/admin/local-models/{NAME}/download").status_code == 403


def test_the_page_lists_the_catalog_and_what_is_served(client, signed_in, instance):
    page = client.get("/admin/local-models")

    assert page.status_code == 200 and "<html" in page.text
    for model in CATALOG.values():
        assert model.display_name in page.text
    assert "Download</button>" in page.text and LOCAL_MODEL_ID in page.text
    fragment = client.get("/admin/local-models", headers={"HX-Request": "true", "HX-Target": "local-models"})
    assert "<html" not in fragment.text and 'id="local-models"' in fragment.text
    assert "<html" not in client.get("/admin/local-models/panel").text


def test_the_page_shows_a_running_download_and_polls_until_it_is_installed(
    client, signed_in, instance, host, model
):
    host.gate = threading.Event()
    downloading = threading.Thread(target=pull, args=(NAME, instance, host.url))
    downloading.start()
    try:
        wait_for(lambda: (s := read_status(instance, NAME)) and s.received > 0, 30, "the download to start")
        panel = client.get("/admin/local-models/panel").text
        assert 'data-state="downloading"' in panel and "<progress" in panel
        assert 'hx-trigger="every 2s"' in panel
    finally:
        host.gate.set()
        downloading.join(30)

    panel = client.get("/admin/local-models/panel").text
    assert f'id="local-model-{NAME}" data-state="installed"' in panel
    assert 'hx-trigger="every 2s"' not in panel and f"<code>{NAME}</code>" in panel


def test_download_queues_a_job_that_installs_the_model(client, signed_in, instance, model):
    response = client.post(f"/admin/local-models/{NAME}/download", headers={"HX-Request": "true"})

    assert response.status_code == 200 and 'data-state="queued"' in response.text
    assert 'hx-trigger="every 2s"' in response.text
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "pull_model"))
    assert run.status == "queued" and run.target == f"model:{NAME}"

    assert pull_model(NAME) == {"installed": NAME}  # what the worker runs

    db.session.expire_all()
    assert db.session.get(JobRun, run.id).status == "done"
    assert 'data-state="installed"' in client.get("/admin/local-models/panel").text


def test_a_failed_download_shows_why_in_words(client, app, signed_in, instance, model):
    app.config["MODEL_DOWNLOAD_BASE_URL"] = f"http://127.0.0.1:{free_port()}"
    client.post(f"/admin/local-models/{NAME}/download")

    with pytest.raises(DownloadError):
        pull_model(NAME)

    panel = client.get("/admin/local-models/panel").text
    assert 'data-state="failed"' in panel and "Could not reach the model host 127.0.0.1" in panel
    assert "Download</button>" in panel and 'hx-trigger="every 2s"' not in panel


def test_download_of_an_unknown_model_is_404(client, signed_in, instance):
    assert client.post("/admin/local-models/gpt-5/download").status_code == 404


# --- the local server serves what was installed ---


@pytest.mark.local_model
def test_the_downloaded_copy_is_served_under_its_name_and_answers(instance, host, model, tmp_path):
    pull(NAME, instance, host.url)
    port = free_port()
    server = subprocess.Popen(
        llm_server_argv(port),
        env={**os.environ, "INSTANCE_PATH": str(instance)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        listed = wait_for(lambda: _models(url), 120, "the local model server")
        assert listed == [LOCAL_MODEL_ID, NAME]
        body = {
            "model": NAME,
            "messages": [{"role": "user", "content": "Count from one to five."}],
            "max_tokens": 12,
            "temperature": 0,
        }
        request = urllib.request.Request(
            f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.load(response)
        assert answer["usage"]["completion_tokens"] > 0
        assert (answer["choices"][0]["message"]["content"] or "").strip()
        # The copy runs with its own settings (n_ctx 2048, not SmolLM2's 8192): the name chose the model.
        body["messages"][0]["content"] = "one two three " * 1000
        request = urllib.request.Request(
            f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=120)
        assert "maximum context length is 2048 tokens" in refused.value.read().decode()
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _models(url: str) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return [m["id"] for m in json.load(response)["data"]]
    except OSError:
        time.sleep(0.3)
        return None


@pytest.mark.local_model
def test_the_supervised_server_serves_a_model_installed_while_it_runs(instance, host, model):
    port = free_port()
    environment = {
        k: v for k, v in os.environ.items() if k not in ("LLM_BASE_URL", "DATABASE_URL", "REDIS_URL")
    }
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "webapp.runtime.processes", "run", "llm"],
        env={
            **environment,
            "INSTANCE_PATH": str(instance),
            "LOCAL_LLM_PORT": str(port),
            "SECRET_KEY": "test",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        assert wait_for(lambda: _models(url), 120, "the local model server") == [LOCAL_MODEL_ID]

        pull(NAME, instance, host.url)

        wait_for(lambda: _models(url) == [LOCAL_MODEL_ID, NAME], 120, "the server to serve the new model")
    finally:
        supervisor.terminate()
        _, errors = supervisor.communicate(timeout=30)
    assert "the installed models changed; restarting it" in errors
