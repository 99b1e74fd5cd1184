"""A supervised process that crashes comes back by itself; stopping the supervisor leaves nothing behind."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for
from webapp.runtime.processes import llm_self_test, procfile_names, service

ROOT = Path(__file__).resolve().parent.parent

# A child that records its pid, then runs until it is signalled.
CHILD = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(600)"
SUPERVISE = """
import sys
from webapp.runtime.supervisor import Service, Supervisor
service = Service("sleeper", [sys.executable, "-c", sys.argv[1], sys.argv[2]])
sys.exit(Supervisor(service, backoff=[0.1, 0.2]).run())
"""


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


@pytest.fixture
def supervised(tmp_path):
    pids = tmp_path / "pids"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISE, CHILD, str(pids)], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: _pids(pids), what="the child to start")
    yield supervisor, pids
    if supervisor.poll() is None:
        supervisor.kill()
        supervisor.wait()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_a_child_that_dies_is_started_again(supervised, how):
    supervisor, pids = supervised
    [first] = _pids(pids)

    os.kill(first, how)

    [_, second] = wait_for(lambda: _pids(pids)[1:] and _pids(pids), what="a second child")
    assert second != first and _alive(second) and supervisor.poll() is None
    supervisor.terminate()
    assert supervisor.wait(10) == 0
    assert f"sleeper: was killed by {how.name}; restarting in 0.1 s" in supervisor.stderr.read()


def test_it_keeps_restarting_a_child_that_keeps_crashing(supervised):
    supervisor, pids = supervised

    for crash in range(4):
        os.kill(_pids(pids)[-1], signal.SIGKILL)
        wait_for(lambda n=crash: len(_pids(pids)) == n + 2, what=f"restart {crash + 1}")

    assert supervisor.poll() is None and _alive(_pids(pids)[-1])
    supervisor.terminate()
    supervisor.wait(10)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_supervisor_stops_the_child_and_nothing_restarts(supervised, how):
    supervisor, pids = supervised
    [child] = _pids(pids)

    supervisor.send_signal(how)

    assert supervisor.wait(10) == 0
    assert not _alive(child) and _pids(pids) == [child]


def test_a_supervisor_killed_outright_takes_its_child_with_it(supervised):
    supervisor, pids = supervised
    [child] = _pids(pids)

    supervisor.kill()
    supervisor.wait()

    wait_for(lambda: not _alive(child), what="the orphaned child to die")


def test_the_model_self_test_passes_on_a_model_that_answers(fake_llm):
    fake_llm.reply("One, two, three, four, five.")
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert llm_self_test(fake_llm.base_url, child, lambda: False) is None
    finally:
        child.kill()
        child.wait()
    assert fake_llm.requests[-1]["messages"][0]["content"] == "Count from one to five."


def test_the_model_self_test_says_what_crashed_and_what_to_do(fake_llm):
    crashing = subprocess.Popen(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    )
    crashing.wait()
    unreachable = f"http://127.0.0.1:{free_port()}/v1"

    problem = llm_self_test(unreachable, crashing, lambda: False)

    assert problem.startswith("the local model server was killed by SIGSEGV while loading the model.")
    assert "rebuild it portably with `rm .venv/.installed && make install`" in problem
    assert "LLM_BASE_URL" in problem


def test_the_model_self_test_fails_a_model_that_answers_nothing(fake_llm):
    fake_llm.reply("")
    child = subprocess.Popen(["sleep", "60"])
    try:
        problem = llm_self_test(fake_llm.base_url, child, lambda: False)
    finally:
        child.kill()
        child.wait()
    assert problem.startswith("the local model answered its self-test with 0 token(s)")


def _procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def test_make_run_supervises_every_process_it_names_among_them_a_replies_only_worker(tmp_path):
    settings = {
        "EMBEDDED_REDIS": True,
        "LOCAL_LLM": True,
        "REDIS_URL": f"unix://{tmp_path / 'redis.sock'}",
        "LLM_BASE_URL": "http://127.0.0.1:8088/v1",
        "LOCAL_LLM_PORT": 8088,
    }
    procfile = _procfile()

    for name in procfile_names(settings)[:-1]:  # all but `ready`, which only prints the URL
        assert procfile[name] == f"python -m webapp.runtime.processes run {name}"
        assert service(name, settings, tmp_path).name == name
    worker, replies = (service(name, settings, tmp_path).argv for name in ("worker", "replies"))
    assert worker[1:] == [str(ROOT / "worker.py")]  # replies first, then background work
    assert replies[1:] == [str(ROOT / "worker.py"), "--replies-only"]  # never background work
