"""End to end against the real local model (SmolLM2 served by llama-cpp-python): structure, not wording."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for
from tests.test_integration import _processes_of
from webapp import llm
from webapp.config import LOCAL_MODEL_ID
from webapp.llm.jsonparse import parse_json_object
from webapp.llm.targets import for_environment
from webapp.runtime.processes import llm_server_argv

pytestmark = pytest.mark.local_model

SAVE_MEMORY = {
    "type": "function",
    "function": {
        "name": "save_memory",
        "description": "Save a memory.",
        "parameters": {
            "type": "object",
            "properties": {
                "content": {"type": "string"},
                "memory_type": {"type": "string", "enum": ["journal", "core"]},
            },
            "required": ["content", "memory_type"],
        },
    },
}


@pytest.fixture(scope="module")
def local_model_url():
    port = free_port()
    server = subprocess.Popen(llm_server_argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
                assert LOCAL_MODEL_ID in [m["id"] for m in json.load(response)["data"]]
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the local model server did not start") from None
            time.sleep(0.5)
    yield url
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:  # still finishing a generation its client gave up on
        server.kill()
        server.wait()


@pytest.fixture
def local_app(app, local_model_url):
    app.config.update(LLM_BASE_URL=local_model_url, LLM_TIMEOUT_SECONDS=120)
    # The server generates one request at a time: a rambling answer would hold up the next test for minutes.
    app.config["LLM_MAX_OUTPUT_TOKENS"] = 300
    return app


def test_health_probes_during_a_reply_neither_cut_it_nor_wait_for_it(local_app, local_model_url):
    """Every page polls the service status, which lists the model server's models. llama-cpp-python's server
    cuts the answer it is streaming when any request comes in, and makes the listing wait for the answer: the
    local server answers the listing itself and lets the answer finish."""
    listing_seconds = []

    def probe_while_streaming(deltas: list[str]) -> None:
        wait_for(lambda: deltas, seconds=60, what="the first token")
        for _ in range(3):
            started = time.monotonic()
            with urllib.request.urlopen(f"{local_model_url}/models", timeout=10) as response:
                assert LOCAL_MODEL_ID in [m["id"] for m in json.load(response)["data"]]
            listing_seconds.append(time.monotonic() - started)

    deltas: list[str] = []
    prober = threading.Thread(target=probe_while_streaming, args=(deltas,))
    prober.start()
    result = llm.complete(
        for_environment(LOCAL_MODEL_ID),
        [
            {
                "role": "user",
                "content": "Write a long story about a cat who learns to sail, in many paragraphs.",
            }
        ],
        purpose="reply",
        on_text=deltas.append,
        tools=[SAVE_MEMORY],
    )
    prober.join()

    assert result.finish_reason in {"stop", "length", "tool_calls"}
    assert len(listing_seconds) == 3 and max(listing_seconds) < 5  # answered, not queued behind the reply


def test_a_streamed_reply_arrives_token_by_token(local_app):
    deltas = []

    result = llm.complete(
        for_environment(LOCAL_MODEL_ID),
        [{"role": "user", "content": "Say hello in five words."}],
        purpose="reply",
        on_text=deltas.append,
    )

    assert len(deltas) > 1
    assert result.text == "".join(deltas) and result.text.strip()
    assert result.prompt_tokens > 0 and result.completion_tokens > 0


def _within_retries(attempt, tries: int = 3):
    """The tiny model samples, so it now and then rambles past its limit or writes broken JSON; the jobs retry
    such a model error with backoff, and so does this test (a build that never works still fails)."""
    for remaining in reversed(range(tries)):
        try:
            return attempt()
        except (llm.LLMError, ValueError, AssertionError):
            if not remaining:
                raise


def test_a_forced_tool_call_parses(local_app, monkeypatch):
    # Cairn lets the model choose whether to call a tool; this test forces the call (the tiny model would
    # often answer in words instead), so what it checks is that the local server's tool calls parse.
    send = llm._request
    forced = {"type": "function", "function": {"name": "save_memory"}}
    monkeypatch.setattr(
        llm, "_request", lambda client, request: send(client, {**request, "tool_choice": forced})
    )

    def attempt():
        result = llm.complete(
            for_environment(LOCAL_MODEL_ID),
            [{"role": "user", "content": "Remember that my favourite colour is green."}],
            purpose="reply",
            tools=[SAVE_MEMORY],
        )
        [call] = result.tool_calls
        return call.name, call.parsed_arguments()

    name, arguments = _within_retries(attempt)

    assert name == "save_memory"
    assert isinstance(arguments, dict)


def test_json_output_parses(local_app):
    def attempt():
        result = llm.complete(
            for_environment(LOCAL_MODEL_ID),
            [{"role": "user", "content": 'Answer with JSON: {"journal": [...], "core": [...]}. I like tea.'}],
            purpose="extract",
            response_format={
                "type": "json_object",
                "schema": {
                    "type": "object",
                    "properties": {
                        "journal": {"type": "array", "items": {"type": "string"}},
                        "core": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["journal", "core"],
                },
            },
        )
        parsed = parse_json_object(
            result.text
        )  # as the jobs read it: raw control characters allowed in strings
        assert parsed is not None, result.text
        return parsed

    parsed = _within_retries(attempt)

    assert isinstance(parsed["journal"], list) and isinstance(parsed["core"], list)


def test_the_model_server_passes_its_self_test_and_comes_back_after_a_segfault(tmp_path):
    """`make run`'s llm process: ready only after one real chat; a SIGSEGV is restarted and self-tested."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("LLM_BASE_URL", "PORT")},
        "INSTANCE_PATH": str(tmp_path),
        "LOCAL_LLM_PORT": str(port),
    }
    marker = tmp_path / "llm.ready"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "webapp.runtime.processes", "run", "llm"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(marker.exists, seconds=120, what="the self-test to pass")
        [server] = _processes_of(tmp_path, "llm-server")

        os.kill(server, signal.SIGSEGV)

        wait_for(lambda: not marker.exists(), what="the crash to be noticed")
        wait_for(marker.exists, seconds=120, what="the restarted server to pass its self-test")
        assert _processes_of(tmp_path, "llm-server") - {server}
    finally:
        supervisor.terminate()
        output = supervisor.communicate(timeout=30)[0]
    assert supervisor.returncode == 0
    assert not _processes_of(tmp_path, ""), output
    assert "llm: was killed by SIGSEGV; restarting in 1 s" in output
    assert output.count("the local model passed its self-test") == 2
    assert "llama_model_loader" not in output  # llama.cpp's loading log stays quiet
