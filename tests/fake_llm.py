"""A scripted OpenAI-compatible server on loopback that records every request.

    fake_llm.reply("Hello")                               # next answer: plain text
    fake_llm.reply(tool_calls=[("save_memory", {...})])   # next answer: tool calls
    fake_llm.fail(500, "upstream down")                   # next answer: an HTTP error
    fake_llm.cut("alpha bravo")                           # next answer: its words, then the connection closes
    fake_llm.html()                                       # next answer: HTTP 200 with an HTML page
    fake_llm.hang("alpha", seconds=30)                    # next answer: its words, then silence
    fake_llm.requests[-1]["model"]                        # what the app sent
    fake_llm.headers[-1]["authorization"]                 # ... and with which headers (lower-case names)
    fake_llm.models = [{"id": "m", "context_length": 32000}]  # what GET /models lists
    fake_llm.ollama_models = {"llama3.2:3b": 131072}      # answer as an Ollama: /api/tags, /api/show
    fake_llm.fail(500, model="fake-embedder")             # next /v1/embeddings answer for that model
    fake_llm.responder = lambda body: Scripted(...)       # when nothing is scripted: an answer to the request

Answers are consumed in order; when none is scripted, the server answers with `responder(request body)` if
set (a model that answers what it reads), else `default_text`.
Streaming requests get the same answers as server-sent chunks.
/v1/embeddings answers a vector per text (EMBEDDING_DIMENSIONS, from the text's hash, the same for the same
text) unless a failure is scripted for its model (`fail(..., model=...)`; `reply(model=...)` scripts vectors);
it takes no answer scripted without a model, and its requests go to `embedding_requests`, not `requests`.
"""

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EMBEDDING_DIMENSIONS = 384  # as the local model's: a PostgreSQL index is made per dimension count


@dataclass
class Scripted:
    text: str = ""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    status: int = 200
    error: str = ""
    delay: float = 0.0
    fault: str = ""  # "cut", "html" or "hang"
    content_type: str = "text/html"  # of an "html" answer
    hang_seconds: float = 0.0


class FakeLLM:
    def __init__(self, host: str = "127.0.0.1") -> None:
        """host: where it listens (0.0.0.0 for containers to reach it through host.docker.internal)."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # of each request in `requests`, names in lower case
        self.models: list[dict[str, Any]] = [{"id": "fake-model", "object": "model"}]
        self.ollama_models: dict[str, int] | None = None  # name -> context length; None: not an Ollama
        self.embedding_requests: list[dict[str, Any]] = []
        self.default_text = "ok"
        self.responder: Callable[[dict[str, Any]], Scripted] | None = None
        self.delay = 0.0  # seconds added to every answer
        self.chunk_delay = 0.0  # seconds between streamed chunks, to watch a reply arrive
        self.embedding_delay = 0.0  # seconds added to every /v1/embeddings answer
        self.in_flight = 0  # requests of this test waiting out their delay (reset forgets older ones)
        self.max_in_flight = 0  # the most requests answered at the same time
        self._generation = 0  # bumped by reset: a request from an earlier test still sleeping is not counted
        self._script: deque[Scripted] = deque()
        self._by_model: dict[str, deque[Scripted]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def reply(
        self,
        text: str = "",
        *,
        tool_calls: list[tuple[str, Any]] | None = None,
        delay: float = 0,
        model: str | None = None,
    ) -> None:
        """Script the next answer (with model=, the next answer to that model). Tool call arguments may be a
        dict or a raw (possibly broken) string."""
        self._queue(model).append(Scripted(text=text, tool_calls=tool_calls or [], delay=delay))

    def fail(
        self, status: int = 500, error: str = "server error", *, delay: float = 0, model: str | None = None
    ) -> None:
        self._queue(model).append(Scripted(status=status, error=error, delay=delay))

    def cut(self, text: str, *, model: str | None = None) -> None:
        """The answer's words, then the connection closes: no finish_reason, no [DONE] (no JSON end, unstreamed)."""
        self._queue(model).append(Scripted(text=text, fault="cut"))

    def html(self, content_type: str = "text/html", *, model: str | None = None) -> None:
        """HTTP 200 with an HTML page (a proxy's login or error page), under the given content type."""
        self._queue(model).append(Scripted(fault="html", content_type=content_type))

    def hang(self, text: str = "", *, seconds: float, model: str | None = None) -> None:
        """The answer's words (streamed), then nothing for `seconds`, then the connection closes."""
        self._queue(model).append(Scripted(text=text, fault="hang", hang_seconds=seconds))

    def _queue(self, model: str | None) -> deque:
        return self._script if model is None else self._by_model.setdefault(model, deque())

    def reset(self) -> None:
        self._script.clear()
        self._by_model.clear()
        self.requests.clear()
        self.headers.clear()
        self.models = [{"id": "fake-model", "object": "model"}]
        self.ollama_models = None
        self.embedding_requests.clear()
        self.default_text = "ok"
        self.responder = None
        self.delay = 0.0
        self.chunk_delay = 0.0
        self.embedding_delay = 0.0
        with self._lock:
            self.in_flight = self.max_in_flight = 0
            self._generation += 1

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, body: dict[str, Any]) -> Scripted:
        with self._lock:
            for queue in (self._by_model.get(body.get("model", "")), self._script):
                if queue:
                    return queue.popleft()
        return self.responder(body) if self.responder else Scripted(text=self.default_text)

    def _next_embedding(self, model: str) -> Scripted | None:
        with self._lock:
            queue = self._by_model.get(model)
            return queue.popleft() if queue else None

    def _started(self) -> int:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return self._generation

    def _finished(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self.in_flight -= 1

    @property
    def root(self) -> str:
        """The server's address without /v1 (where an Ollama is addressed)."""
        return self.base_url.removesuffix("/v1")

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)


def _tool_call_json(index: int, name: str, arguments: Any) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "index": index,
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": raw},
    }


def _handler_for(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [{"object": "model", **m} for m in fake.models]})
            elif self.path == "/api/tags" and fake.ollama_models is not None:
                self._json(200, {"models": [{"name": name} for name in fake.ollama_models]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/").endswith("/embeddings"):
                self._embeddings(body)
                return
            if self.path == "/api/show" and fake.ollama_models is not None:
                context = fake.ollama_models.get(body.get("model"))
                info = {"general.architecture": "llama", "llama.context_length": context}
                self._json(
                    200 if context else 404, {"model_info": info} if context else {"error": "model not found"}
                )
                return
            fake._record(body, {k.lower(): v for k, v in self.headers.items()})
            answer = fake._next(body)
            generation = fake._started()
            try:
                time.sleep(fake.delay + answer.delay)
            finally:
                fake._finished(generation)
            if answer.status != 200:
                self._json(answer.status, {"error": {"message": answer.error, "type": "fake_error"}})
            elif answer.fault == "html":
                self._html(answer.content_type)
            elif answer.fault in ("cut", "hang") and not body.get("stream"):
                self._cut_json(body, answer)
            elif body.get("stream"):
                self._stream(body, answer)
            else:
                self._json(200, _completion(body, answer))

        def _embeddings(self, body: dict[str, Any]) -> None:
            with fake._lock:
                fake.embedding_requests.append(body)
            answer = fake._next_embedding(body.get("model", ""))
            time.sleep(fake.embedding_delay)
            if answer is not None and answer.status != 200:
                self._json(answer.status, {"error": {"message": answer.error, "type": "fake_error"}})
                return
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(texts)]
            tokens = sum(len(t.split()) for t in texts)
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            self._json(200, {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage})

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _html(self, content_type: str) -> None:
            data = b"<!doctype html><html><body><h1>Sign in to the proxy</h1></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _cut_json(self, body: dict[str, Any], answer: Scripted) -> None:
            data = json.dumps(_completion(body, answer)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            time.sleep(answer.hang_seconds)
            self.close_connection = True

        def _stream(self, body: dict[str, Any], answer: Scripted) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunks = list(_chunks(body, answer))
            if answer.fault:  # only the words: no finish_reason, no usage, no [DONE]
                chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(fake.chunk_delay)
            if answer.fault == "hang":
                time.sleep(answer.hang_seconds)
            if not answer.fault:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _vector(text: str) -> list[float]:
    digest = b"".join(
        hashlib.sha256(f"{i}:{text}".encode()).digest() for i in range(EMBEDDING_DIMENSIONS // 32)
    )
    return [byte / 255 - 0.5 for byte in digest]


def _usage(answer: Scripted) -> dict[str, int]:
    completion = max(1, len(answer.text.split()))
    return {"prompt_tokens": 11, "completion_tokens": completion, "total_tokens": 11 + completion}


def _completion(body: dict[str, Any], answer: Scripted) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {k: v for k, v in _tool_call_json(i, n, a).items() if k != "index"}
            for i, (n, a) in enumerate(answer.tool_calls)
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if answer.tool_calls else "stop"}
        ],
        "usage": _usage(answer),
    }


def _chunks(body: dict[str, Any], answer: Scripted):
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = body.get("model", "")
    words = answer.text.split(" ") if answer.text else []
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        yield {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
    for i, (name, arguments) in enumerate(answer.tool_calls):
        call = _tool_call_json(i, name, arguments)
        raw = call["function"]["arguments"]
        half = len(raw) // 2  # split the arguments across two deltas, as real servers do
        first = {**call, "function": {"name": name, "arguments": raw[:half]}}
        yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]}
        rest = {"index": i, "function": {"arguments": raw[half:]}}
        yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [rest]}, "finish_reason": None}]}
    finish = "tool_calls" if answer.tool_calls else "stop"
    yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": _usage(answer)}
