"""500 open live streams held by one client while pages are measured, on the Production setup (PostgreSQL,
gunicorn gthread 2x8 for pages, gunicorn gevent for streams, redis-server, 2 RQ workers).

    .venv/bin/python -m bench.load_streams [--streams 500] [--loads 400]

Prints the page p50/p95 with no stream open, then with all of them open, and how many of the open streams
received an event published to their chats (so they were alive, not just connected).
"""

import argparse
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx2 as httpx  # the HTTP client the openai SDK brings

from bench.load_stack import percentile, running_stack, seed_users, signed_in_client
from webapp import events

STREAMS_PER_USER = 5
PAGE_THREADS = 4


def open_streams(base_url: str, targets: list[tuple[str, int]], count: int) -> list[socket.socket]:
    """`count` raw connections to /chats/<id>/stream, spread over the users, each past its ": connected"."""
    address = urlsplit(base_url)
    conns = []
    for n in range(count):
        cookie, chat_id = targets[n % len(targets)]
        conn = socket.create_connection((address.hostname, address.port), timeout=30)
        request = f"GET /chats/{chat_id}/stream HTTP/1.1\r\nHost: bench\r\nCookie: {cookie}\r\n\r\n"
        conn.sendall(request.encode())
        conns.append(conn)
    for conn in conns:
        _read_until(conn, b": connected")
    return conns


def _read_until(conn: socket.socket, marker: bytes) -> None:
    received = b""
    while marker not in received:
        chunk = conn.recv(65536)
        if not chunk:
            raise SystemExit(f"a stream closed before {marker!r}: {received[:200]!r}")
        received += chunk


def extra_stream_status(base_url: str, cookie: str, chat_id: int) -> str:
    address = urlsplit(base_url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as conn:
        conn.sendall(
            f"GET /chats/{chat_id}/stream HTTP/1.1\r\nHost: bench\r\nCookie: {cookie}\r\n\r\n".encode()
        )
        return conn.recv(200).split(b"\r\n")[0].decode()


def count_receiving(conns: list[socket.socket], marker: bytes, seconds: float = 30) -> int:
    """How many connections see `marker` within `seconds` (all of them are read from this one thread)."""
    selector = selectors.DefaultSelector()
    buffers = {}
    for conn in conns:
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
        buffers[conn] = b""
    seen: set[socket.socket] = set()
    deadline = time.monotonic() + seconds
    while len(seen) < len(conns) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1):
            buffers[key.fileobj] += key.fileobj.recv(65536)
            if marker in buffers[key.fileobj]:
                seen.add(key.fileobj)
    selector.close()
    return len(seen)


def measure_pages(clients: list, chats: list[int], loads: int) -> list[float]:
    """Chat pages and chat lists loaded by PAGE_THREADS threads at once: each load's seconds."""
    timings: list[float] = []
    lock = threading.Lock()

    def load(n: int) -> None:
        client, chat_id = clients[n % len(clients)], chats[n % len(chats)]
        started = time.perf_counter()
        try:
            status = client.get(f"/chats/{chat_id}" if n % 2 else "/chats/").status_code
        except (
            httpx.TransportError
        ):  # counted as an error, e.g. a kept-alive connection the server had closed
            status = None
        elapsed = time.perf_counter() - started
        with lock:
            timings.append(elapsed if status == 200 else float("inf"))

    with ThreadPoolExecutor(PAGE_THREADS) as pool:
        list(pool.map(load, range(loads)))
    return timings


def _report(label: str, timings: list[float]) -> None:
    errors = sum(1 for t in timings if t == float("inf"))
    ok = [t for t in timings if t != float("inf")]
    p50, p95 = percentile(ok, 50) * 1000, percentile(ok, 95) * 1000
    print(f"  {label:<28} p50 {p50:6.0f} ms  p95 {p95:6.0f} ms  ({len(timings)} loads, {errors} errors)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--loads", type=int, default=400)
    args = parser.parse_args()
    users = -(-args.streams // STREAMS_PER_USER)
    with running_stack(extra_env={"STREAM_MAX_PER_USER": str(STREAMS_PER_USER)}) as stack:
        seeded = seed_users(users, "streams")
        clients = [signed_in_client(stack.pages, email) for email, _ in seeded]
        chats = [chat_id for _, chat_id in seeded]
        cookies = ["; ".join(f"{k}={v}" for k, v in c.cookies.items()) for c in clients]
        print(
            f"{args.streams} streams from one client ({users} users x {STREAMS_PER_USER}), pages from {PAGE_THREADS} threads"
        )
        measure_pages(
            clients, chats, len(clients)
        )  # warm up: each worker's first requests connect and import
        _report("pages, no stream open", measure_pages(clients, chats, args.loads))
        started = time.perf_counter()
        conns = open_streams(stack.streams, list(zip(cookies, chats, strict=True)), args.streams)
        print(f"  opened {len(conns)} streams in {time.perf_counter() - started:.1f} s")
        _report(f"pages, {len(conns)} streams open", measure_pages(clients, chats, args.loads))
        for chat_id in chats:
            events.publish(chat_id, "delta", 1, "ping")
        alive = count_receiving(
            conns, b"event: delta-1\ndata: <p>ping</p>"
        )  # deltas arrive as rendered markdown
        print(f"  streams that received an event published to their chat: {alive} of {len(conns)}")
        print(
            f"  one more stream for a user holding {STREAMS_PER_USER}: {extra_stream_status(stack.streams, cookies[0], chats[0])}"
        )
        for conn in conns:
            conn.close()


if __name__ == "__main__":
    main()
