"""Cairn as teams deploy it (issue 40): the image of the Dockerfile, brought up by compose.yaml with docker-compose
on this machine's Docker engine, PostgreSQL and Redis included, driven from outside as a team would use it.

No image registry is reachable here, so the three base images are the stand-ins of scripts/local-images.sh
(Debian's packages), unless PYTHON_IMAGE, POSTGRES_IMAGE and REDIS_IMAGE name others. Run by `make test-compose`
(which starts Docker), with CAIRN_COMPOSE_TEST=1; skipped in the two suite runs, as it is the same for both
databases. The containers' logs are kept in test-artifacts/compose.log.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.conftest import ARTIFACTS, free_port, wait_for
from tests.fake_llm import FakeLLM

pytestmark = [
    pytest.mark.compose,
    pytest.mark.skipif(
        not os.environ.get("CAIRN_COMPOSE_TEST"), reason="needs Docker: run by `make test-compose`"
    ),
]

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "cairncompose"  # plain, so docker-compose 1.29 and `docker compose` name it alike
IMAGE = "cairn-compose-test:latest"
ADMIN = ("dana@example.com", "tulips in October, 4 of them")
CAIRN_SERVICES = ["web", "mcp", "worker", "replies", "scheduler"]
MODEL = "compose-model"
IMAGE_SIZE_AIM = 600_000_000


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    fake: FakeLLM

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return _compose(self.env, *args, timeout=timeout, check=check)

    def env_value(self, name: str) -> str:
        """A setting of the stack's env file."""
        lines = Path(self.env["CAIRN_ENV_FILE"]).read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)[name]

    def sql(self, statement: str) -> list[list[str]]:
        """Rows of a statement run by psql in the db container."""
        out = self.compose("exec", "-T", "db", "psql", "-U", "cairn", "-d", "cairn", "-Atc", statement).stdout
        return [line.split("|") for line in out.splitlines() if line]

    def containers(self, service: str) -> list[str]:
        out = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
             "--filter", f"label=com.docker.compose.service={service}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return out.split()

    def logs(self, container: str) -> str:
        result = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
        return result.stdout + result.stderr

    def healthz(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None


def _compose(
    env: dict[str, str],
    *args: str,
    timeout: float = 900,
    check: bool = True,
    project: str = PROJECT,
    stdin=None,
):
    files = ["-f", str(ROOT / "compose.yaml"), "--env-file", env["CAIRN_ENV_FILE"]]
    result = subprocess.run(
        ["docker-compose", "-p", project, *files, *args],
        env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if check and result.returncode:
        raise AssertionError(f"docker-compose {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def _base_images() -> dict[str, str]:
    """The images to build on: PYTHON_IMAGE, POSTGRES_IMAGE, REDIS_IMAGE as set, else the local stand-ins."""
    names = ("PYTHON_IMAGE", "POSTGRES_IMAGE", "REDIS_IMAGE")
    if all(os.environ.get(name) for name in names):
        return {name: os.environ[name] for name in names}
    out = subprocess.run(
        [str(ROOT / "scripts" / "local-images.sh")], capture_output=True, text=True, check=True, timeout=1800
    ).stdout
    return dict(line.split("=", 1) for line in out.split())


def _settings(tmp_path: Path, fake: FakeLLM, port: int) -> dict[str, str]:
    env_file = tmp_path / "compose.env"
    settings = {
        "SECRET_KEY": "compose-test-" + "0" * 40,
        "CAIRN_ADMIN_EMAIL": ADMIN[0],
        "CAIRN_ADMIN_PASSWORD": ADMIN[1],
        # The fake model on this host, as a team's model server or Ollama on theirs.
        "LLM_BASE_URL": f"http://host.docker.internal:{fake.base_url.rsplit(':', 1)[1]}",
        "OLLAMA_BASE_URL": f"http://host.docker.internal:{fake.root.rsplit(':', 1)[1]}",
        # 16 API clients at once, each waiting for its reply (16 replies for 12 worker threads, so every
        # thread takes one): within one person's limits.
        "RATE_LIMIT_REPLIES": "200 per minute",
        "STREAM_MAX_PER_USER": "32",
        "JOB_RETRY_SECONDS": "1,1,1",
    }
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return {
        **os.environ,
        **_base_images(),
        "CAIRN_ENV_FILE": str(env_file),
        "CAIRN_PORT": str(port),
        "CAIRN_IMAGE": IMAGE,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    fake = FakeLLM(host="0.0.0.0")  # containers reach it through host.docker.internal
    fake.ollama_models = {"llama3.2:3b": 131072}  # an Ollama on the host, too
    port = free_port()
    env = _settings(tmp_path_factory.mktemp("compose"), fake, port)
    stack = Stack(f"http://127.0.0.1:{port}", env, fake)
    stack.compose("down", "--volumes", "--remove-orphans")  # what an interrupted run left
    try:
        stack.compose("build")
        stack.compose("up", "-d", "--scale", "worker=2")
        wait_for(lambda: stack.healthz() == 200, seconds=180, what="GET /healthz to answer 200 (3 minutes)")
        yield stack
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "compose.log").write_text(stack.compose("logs", "--no-color", check=False).stdout)
        stack.compose("down", "--volumes", "--remove-orphans", check=False)
        fake.close()


def test_without_a_secret_key_compose_stops_and_says_how_to_make_one(tmp_path):
    """.env.example as it is copied: its SECRET_KEY is empty until someone makes one."""
    env_file = tmp_path / ".env"
    env_file.write_text((ROOT / ".env.example").read_text())
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env["CAIRN_ENV_FILE"] = str(env_file)

    refused = _compose(env, "config", check=False)
    env_file.write_text(env_file.read_text() + "SECRET_KEY=made-with-token-hex\n")
    accepted = _compose(env, "config", check=False)

    assert refused.returncode != 0
    assert "SECRET_KEY is not set" in refused.stderr
    assert "python3 -c 'import secrets; print(secrets.token_hex(32))'" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr


def test_the_first_admin_signs_in_makes_an_agent_and_gets_a_reply(stack, page: Page):
    page.set_viewport_size({"width": 1280, "height": 800})
    _sign_in(stack, page)

    page.get_by_role("link", name="Create your first agent").click()
    page.get_by_label("Name").fill("Ada")
    page.get_by_label("System prompt").fill("You are Ada, a gardener.")
    page.get_by_label("Or type a model id").fill(MODEL)
    page.get_by_role("button", name="Save agent").click()
    page.get_by_label("Title").fill("Garden")
    page.get_by_role("button", name="Start chat").click()
    expect(page.get_by_role("heading", name="Garden", level=1)).to_be_visible()

    stack.fake.reply(
        tool_calls=[("save_memory", {"content": "Dana plants tulips in October.", "memory_type": "core"})],
        model=MODEL,
    )
    stack.fake.reply("Tulips go in in October, six inches deep.", model=MODEL)
    composer = page.get_by_label("Message", exact=True)
    composer.fill("Remember that I plant tulips in October. When do they go in?")
    page.wait_for_load_state()  # its script, which streams the reply in
    page.get_by_role("button", name="Send", exact=True).click()

    reply = page.locator("article.message.assistant").last
    expect(reply).to_contain_text("Tulips go in in October, six inches deep.", timeout=60_000)
    expect(
        reply.get_by_role("link", name="Saved to core memory: “Dana plants tulips in October.”")
    ).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compose-desktop-reply.png"))
    assert stack.fake.requests[-1]["model"] == MODEL
    assert stack.sql("SELECT content FROM agent_memories") == [["Dana plants tulips in October."]]


def _api_key(stack: Stack) -> str:
    out = stack.compose(
        "exec", "-T", "web", "flask", "api-keys", "create", "--user", ADMIN[0], "--name", "compose"
    )
    return out.stdout.strip().splitlines()[-1]


def _ask(stack: Stack, key: str, text: str, conversation: str) -> dict:
    body = json.dumps({"model": "ada", "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(
        f"{stack.url}/v1/chat/completions",
        body,
        {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-Cairn-Conversation": conversation,
        },
    )
    with urllib.request.urlopen(request, timeout=180) as response:
        return json.load(response)


def _reply_job_ids(stack: Stack) -> set[str]:
    return {row[0] for row in stack.sql("SELECT rq_job_id FROM job_runs WHERE job_type = 'reply'")}


def _workers_that_ran(stack: Stack, job_ids: set[str], service: str) -> set[str]:
    """The containers of the service whose worker logged one of these jobs."""
    return {c for c in stack.containers(service) if any(job_id in stack.logs(c) for job_id in job_ids)}


def test_with_two_workers_both_take_replies(stack):
    key = _api_key(stack)
    stack.fake.delay = 2  # every answer takes a while, so the replies overlap
    try:
        answers: list[dict] = []
        threads = [
            threading.Thread(target=lambda i=i: answers.append(_ask(stack, key, f"Question {i}?", f"q{i}")))
            for i in range(16)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(200)
    finally:
        stack.fake.delay = 0

    assert len(answers) == 16 and all(a["choices"][0]["message"]["content"] for a in answers)
    workers = stack.containers("worker")
    assert len(workers) == 2
    assert _workers_that_ran(stack, _reply_job_ids(stack), "worker") == set(workers)


def test_a_killed_worker_container_comes_back_and_the_reply_it_held_completes(stack):
    key = _api_key(stack)
    stack.fake.reply("A first try that never finishes.", delay=120, model=MODEL)
    stack.fake.reply("Answered after the worker came back.", model=MODEL)
    before = _reply_job_ids(stack)
    asking = threading.Thread(target=lambda: _ask(stack, key, "Are you there?", "kill"), daemon=True)
    asking.start()

    [job_id] = wait_for(lambda: _reply_job_ids(stack) - before, seconds=60, what="the reply to be queued")
    holder = wait_for(
        lambda: [c for s in ("worker", "replies") for c in _workers_that_ran(stack, {job_id}, s)],
        seconds=60,
        what="a worker to take the reply",
    )[0]
    wait_for(lambda: len(stack.fake.requests) and "Are you there?" in json.dumps(stack.fake.requests[-1]))
    restarts = _inspect(holder, "{{.RestartCount}}")
    os.kill(int(_inspect(holder, "{{.State.Pid}}")), signal.SIGKILL)  # as the kernel's OOM killer would

    wait_for(
        lambda: (
            _inspect(holder, "{{.RestartCount}}") != restarts
            and _inspect(holder, "{{.State.Running}}") == "true"
        ),
        seconds=60,
        what="Docker to restart the killed worker's container",
    )
    chat_replies = (
        "SELECT m.content, m.status FROM messages m JOIN chats c ON c.id = m.chat_id "
        "WHERE c.client_conversation_id = 'kill' AND m.role = 'assistant'"
    )
    wait_for(
        lambda: stack.sql(chat_replies) == [["Answered after the worker came back.", "done"]],
        seconds=150,
        what="the reply the killed worker held to complete, once",
    )


def _inspect(container: str, template: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", template, container], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_every_process_of_the_image_runs_as_a_user_other_than_root(stack):
    for service in CAIRN_SERVICES:
        for container in stack.containers(service):
            processes = subprocess.run(
                ["docker", "top", container, "-o", "pid,uid,args"], capture_output=True, text=True, check=True
            ).stdout.splitlines()[1:]
            assert processes, service
            assert all(line.split()[1] != "0" for line in processes), f"{service} runs as root: {processes}"


def test_the_image_without_the_local_model_is_under_600_mb(stack):
    size = int(_inspect_image(IMAGE, "{{.Size}}"))
    print(f"\nimage {IMAGE} on {stack.env['PYTHON_IMAGE']}: {size / 1e6:.0f} MB")
    assert size < IMAGE_SIZE_AIM


def _inspect_image(image: str, template: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "-f", template, image], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_flask_commands_run_in_the_web_container(stack):
    result = stack.compose(
        "exec", "-T", "web", "flask", "users", "create", "ben@example.com", "--password", "ben's own 4 tulips"
    )

    assert "Created member ben@example.com" in result.stdout
    assert ["ben@example.com", "member"] in stack.sql("SELECT email, role FROM users")


def test_an_ollama_on_the_host_is_found_from_the_containers(stack, page: Page):
    _sign_in(stack, page)
    page.goto(f"{stack.url}/admin/connections")
    ollama = page.get_by_role("heading", name="An Ollama is running at http://host.docker.internal:")
    expect(ollama).to_be_visible()


def _sign_in(stack: Stack, page: Page) -> None:
    page.goto(f"{stack.url}/login")
    page.get_by_label("Email").fill(ADMIN[0])
    page.get_by_label("Password").fill(ADMIN[1])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()


def test_down_then_up_keeps_every_chat_and_memory(stack, page: Page):
    counted = "SELECT (SELECT count(*) FROM chats), (SELECT count(*) FROM messages), (SELECT count(*) FROM agent_memories)"
    before = stack.sql(counted)
    assert int(before[0][0]) > 1 and int(before[0][2]) == 1

    stack.compose("down")
    assert stack.containers("db") == []
    started = time.monotonic()
    stack.compose("up", "-d", "--scale", "worker=2")
    wait_for(lambda: stack.healthz() == 200, seconds=180, what="GET /healthz to answer 200 again")
    print(f"\nup again, /healthz 200 after {time.monotonic() - started:.0f} s")

    assert stack.sql(counted) == before
    _sign_in(stack, page)
    expect(page.get_by_role("link", name="Garden").first).to_be_visible()


SQLITE_INSTALL = """
from tests import factories
from webapp.factory import create_app

with create_app().app_context():
    account = factories.account("Acme")
    ana = factories.user(account, "ana@example.com", "admin")
    ada = factories.agent(account, "Ada")
    chat = factories.chat(account, [ada], "Garden plans", people=[ana])
    factories.message(chat, "I plant tulips in October.", author=ana)
    factories.message(chat, "Noted: tulips in October.", author=ada)
    factories.memory(ada, "Ana plants tulips in October.")
"""


def test_a_make_run_sqlite_install_moves_into_the_compose_postgresql(stack, tmp_path, page: Page):
    """README, Moving to PostgreSQL: export on the old install, import into the new stack before its first start."""
    instance = tmp_path / "instance"  # make run's SQLite file and secret key
    host = {**os.environ, "INSTANCE_PATH": str(instance)}
    for key in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY"):
        host.pop(key, None)
    flask = [sys.executable, "-m", "flask", "--app", "app"]
    subprocess.run([*flask, "db", "upgrade"], cwd=ROOT, env=host, check=True, capture_output=True)
    subprocess.run(
        [sys.executable, "-c", SQLITE_INSTALL], cwd=ROOT, env=host, check=True, capture_output=True
    )
    backup = tmp_path / "cairn.backup"
    subprocess.run(
        [*flask, "backup", "export", str(backup)], cwd=ROOT, env=host, check=True, capture_output=True
    )

    env_file = tmp_path / ".env"
    env_file.write_text(
        f"SECRET_KEY={(instance / 'secret_key').read_text().strip()}\n"
        f"CAIRN_ADMIN_EMAIL={ADMIN[0]}\nCAIRN_ADMIN_PASSWORD={ADMIN[1]}\n"  # the import brings its own admins
        f"LLM_BASE_URL={stack.env_value('LLM_BASE_URL')}\n"
    )
    port = free_port()
    env = {**stack.env, "CAIRN_ENV_FILE": str(env_file), "CAIRN_PORT": str(port)}
    moved = Stack(f"http://127.0.0.1:{port}", env, stack.fake)

    def compose(*args, **kwargs):
        return _compose(env, *args, project="cairnmove", **kwargs)

    compose("down", "--volumes", "--remove-orphans")
    try:
        compose("up", "-d", "db")
        with backup.open("rb") as file:
            imported = compose(
                "run", "--rm", "--no-deps", "-T", "web", "import", stdin=file,
            )  # fmt: skip
        compose("up", "-d")
        wait_for(lambda: moved.healthz() == 200, seconds=180, what="GET /healthz of the moved install")
        emails = compose(
            "exec", "-T", "db", "psql", "-U", "cairn", "-d", "cairn", "-Atc", "SELECT email FROM users ORDER BY id"
        ).stdout.split()  # fmt: skip

        assert "messages: 2" in imported.stdout, imported.stdout
        assert emails == ["ana@example.com"]  # no first admin was made: the install brought its own
        page.goto(f"{moved.url}/login")
        page.get_by_label("Email").fill("ana@example.com")
        page.get_by_label("Password").fill(factories.PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("link", name="Garden plans").first.click()
        expect(page.locator("article.message.assistant")).to_contain_text("Noted: tulips in October.")
    finally:
        compose("down", "--volumes", "--remove-orphans", check=False)
