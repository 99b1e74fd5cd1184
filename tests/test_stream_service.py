"""The stream service as README's Production section runs it, and the web process of `make run`, which serves
pages and streams the same way: gunicorn's gevent worker holds open streams as greenlets, so one process with a
single worker keeps answering pages while many streams wait."""

import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai SDK brings
import pytest

from tests import factories
from tests.conftest import free_port, wait_for, worker_env
from webapp import events
from webapp.runtime.processes import web_argv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
STREAMS = 150  # far more than a gthread worker's threads (8) and a Redis pool's connections (100)


def _production_argv(port: int) -> list[str]:
    gunicorn = Path(sys.executable).parent / "gunicorn"
    return [
        str(gunicorn),
        "--worker-class",
        "gevent",
        "--workers",
        "1",
        "--bind",
        f"127.0.0.1:{port}",
        "app:app",
    ]


@pytest.fixture(params=[_production_argv, web_argv], ids=["production stream service", "make run web"])
def stream_service(request, live_app):
    port = free_port()
    env = {**worker_env(live_app), "STREAM_MAX_PER_USER": str(STREAMS), "STREAM_KEEPALIVE_SECONDS": "1"}
    server = subprocess.Popen(request.param(port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _status(url + "/login") == 200, what="gunicorn (gevent)")
    yield url
    server.terminate()  # open streams (a failed test leaves them) hold it up to gunicorn's graceful timeout
    try:
        server.wait(40)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def _signed_in_cookie(url: str, user) -> str:
    client = httpx.Client(base_url=url)
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', client.get("/login").text).group(1)
    answer = client.post(
        "/login", data={"email": user.email, "password": factories.PASSWORD, "csrf_token": token}
    )
    assert answer.status_code == 303
    return "; ".join(f"{name}={value}" for name, value in client.cookies.items())


def _open_stream(url: str, path: str, cookie: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nCookie: {cookie}\r\n\r\n".encode())
    received = b""
    while b": connected" not in received:
        received += conn.recv(4096)
    assert received.startswith(b"HTTP/1.1 200")
    return conn


def _posted_at_once(pages: httpx.Client, chat_id: int, count: int) -> list[int]:
    token = re.search(r'"X-CSRFToken": "([^"]+)"', pages.get("/chats/").text).group(1)
    headers = {"X-CSRFToken": token, "HX-Request": "true"}

    def post(n: int) -> int:
        return pages.post(
            f"/chats/{chat_id}/messages", data={"content": f"hello {n}"}, headers=headers
        ).status_code

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(post, range(count)))


def test_many_open_streams_do_not_starve_pages_and_close_when_browsers_leave(live_app, stream_service):
    admin = factories.user(factories.account("Acme"), "dana@example.com", "admin")
    chat = factories.chat(admin.account, [factories.agent(admin.account, "Ada")])
    cookie = _signed_in_cookie(stream_service, admin)
    streams = [_open_stream(stream_service, f"/chats/{chat.id}/stream", cookie) for _ in range(STREAMS)]

    assert httpx.get(stream_service + "/login", timeout=5).status_code == 200
    pages = httpx.Client(base_url=stream_service, headers={"Cookie": cookie}, timeout=30)  # a loaded machine
    assert pages.get(f"/chats/{chat.id}").status_code == 200  # a signed-in page, with its queries
    other = factories.chat(admin.account, [factories.agent(admin.account, "Basil")])
    assert _posted_at_once(pages, other.id, 8) == [200] * 8  # concurrent writes, each with Redis calls
    assert events.open_stream_count(admin.id) == STREAMS
    events.publish(chat.id, "delta", 7, "hello")
    for conn in streams:
        received = b""
        while b"event: delta-7\ndata: <p>hello</p>" not in received:  # rendered markdown
            received += conn.recv(4096)

    for conn in streams:  # every browser leaves
        conn.close()
    wait_for(lambda: events.open_stream_count(admin.id) == 0, seconds=20, what="streams closed")
