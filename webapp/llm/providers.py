"""What a connection's provider says about itself: the models it lists (with their windows where it says), and
whether a one-token completion works. Errors come back in words, never with the connection's key in them.

An OpenAI-compatible API lists its models at /models; OpenRouter gives each one's `context_length`, vLLM
`max_model_len`, some others `context_window`. Ollama lists them at /api/tags and gives each one's window in
/api/show's model_info (`<family>.context_length`).
"""

from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from webapp import llm
from webapp.llm import LLMError, targets
from webapp.local_models.catalog import not_installed
from webapp.models.connections import AnyConnection
from webapp.timeutil import utcnow

LIST_TIMEOUT_SECONDS = 5
CONTEXT_FIELDS = ("context_length", "context_window", "max_model_len", "max_context_length")
TEST_ANSWER_TOKENS = 5  # a test's completion: enough for a word, whatever the tokenizer
MAX_MODELS = 2000  # a provider listing more is cut here (OpenRouter lists about 400)


class ProviderError(Exception):
    """A provider that could not be asked, in words a person can act on."""


@dataclass
class TestResult:
    ok: bool
    models: list[dict[str, Any]] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)  # what was tried, and what happened, in order


def list_models(connection: AnyConnection, *, timeout: float = LIST_TIMEOUT_SECONDS) -> list[dict[str, Any]]:
    """The models the provider lists now: [{"id", "context_tokens"}], sorted by id; ProviderError when it cannot
    be asked."""
    if connection.kind == "local" and (missing := not_installed()):
        raise ProviderError(missing)
    if connection.kind == "ollama":
        models = _ollama_models(connection, timeout)
    else:
        models = _openai_models(connection, timeout)
    return sorted(models, key=lambda m: m["id"])[:MAX_MODELS]


def refresh(connection: AnyConnection) -> list[dict[str, Any]]:
    """Ask the provider for its models and keep them on the connection (not committed); ProviderError, also
    kept as the connection's last error, when it cannot be asked."""
    try:
        models = list_models(connection)
    except ProviderError as error:
        _checked(connection, str(error))
        raise
    connection.models, connection.models_fetched_at = models, utcnow()
    _checked(connection, None)
    return models


def test(connection: AnyConnection, model: str | None = None) -> TestResult:
    """List the models (kept on the connection), then ask one (the given one, else the first listed) for a word;
    the outcome is kept as the connection's last check (not committed)."""
    result = _test(connection, model)
    if result.models:
        connection.models, connection.models_fetched_at = result.models, utcnow()
    _checked(connection, None if result.ok else result.steps[-1])
    return result


def _checked(connection: AnyConnection, error: str | None) -> None:
    connection.checked_at, connection.last_error = utcnow(), error


def _test(connection: AnyConnection, model: str | None) -> TestResult:
    result = TestResult(ok=False)
    try:
        result.models = list_models(connection)
    except ProviderError as error:
        result.steps.append(f"Listing the models failed: {error}")
        return result
    result.steps.append(f"It lists {len(result.models)} model{'' if len(result.models) == 1 else 's'}.")
    model = model or (result.models[0]["id"] if result.models else None)
    if not model:
        result.steps.append("There is no model to try: type a model id on an agent's form.")
        result.ok = True
        return result
    try:
        _one_token(connection, model)
    except LLMError as error:
        result.steps.append(f"Asking {model} for one word failed: {error}")
        return result
    result.steps.append(f"{model} answered.")
    result.ok = True
    return result


def _one_token(connection: AnyConnection, model: str) -> None:
    """A completion of a word or so, recorded in the cost ledger like any other request."""
    target = targets.target(connection, model)
    messages = [{"role": "user", "content": "Say OK."}]
    llm.complete(target, messages, purpose="check", max_tokens=TEST_ANSWER_TOKENS)


def _openai_models(connection: AnyConnection, timeout: float) -> list[dict[str, Any]]:
    target = targets.target(connection, "")
    client = llm.client_for(target).with_options(timeout=timeout)
    try:
        listed = list(client.models.list())
    except openai.APIStatusError as error:
        raise ProviderError(_status_words(error.status_code, connection)) from None
    except openai.APIConnectionError as error:
        raise ProviderError(f"could not reach {target.base_url} ({_cause(error)}).") from None
    except openai.OpenAIError as error:
        raise ProviderError(f"its answer is not a model list ({type(error).__name__}).") from None
    return [{"id": m.id, "context_tokens": _context_of(m.model_extra or {})} for m in listed]


def _context_of(fields: dict[str, Any]) -> int | None:
    for name in CONTEXT_FIELDS:
        value = fields.get(name) or (fields.get("top_provider") or {}).get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _ollama_models(connection: AnyConnection, timeout: float) -> list[dict[str, Any]]:
    root = connection.base_url.rstrip("/").removesuffix("/v1")
    try:
        with httpx.Client(timeout=timeout, headers=connection.headers) as client:
            tags = _ollama_json(client.get(f"{root}/api/tags"), connection)
            names = [m["name"] for m in tags.get("models", []) if isinstance(m, dict) and m.get("name")]
            return [{"id": name, "context_tokens": _ollama_context(client, root, name)} for name in names]
    except httpx.HTTPError as error:
        raise ProviderError(f"could not reach Ollama at {root} ({type(error).__name__}: {error}).") from None


def _ollama_json(response: httpx.Response, connection: AnyConnection) -> dict[str, Any]:
    if response.status_code != 200:
        raise ProviderError(_status_words(response.status_code, connection))
    try:
        body = response.json()
    except ValueError:
        raise ProviderError("its answer is not JSON: is this an Ollama server?") from None
    if not isinstance(body, dict):
        raise ProviderError("its answer is not a model list: is this an Ollama server?")
    return body


def _ollama_context(client: httpx.Client, root: str, name: str) -> int | None:
    """The model's own window, from /api/show (None when it does not say)."""
    try:
        response = client.post(f"{root}/api/show", json={"model": name})
        info = response.json().get("model_info", {}) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    lengths = [v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)]
    return lengths[0] if lengths else None


def detect_ollama(base_url: str) -> list[str] | None:
    """The models of an Ollama answering at base_url, or None when none answers there (quickly)."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/api/tags", timeout=1)
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if response.status_code != 200 or not isinstance(body, dict):
        return None
    return sorted(m["name"] for m in body.get("models", []) if isinstance(m, dict) and m.get("name"))


def _status_words(status: int, connection: AnyConnection) -> str:
    if status in (401, 403):
        return f"the provider refused the key (HTTP {status}): enter the key again."
    if status == 404:
        return f"nothing answers at {connection.base_url} (HTTP 404): check the address (most end in /v1)."
    return f"the provider answered HTTP {status}."


def _cause(error: BaseException) -> str:
    cause = error.__cause__ or error.__context__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused: is it running?"
    return f"{type(cause).__name__}: {cause}" if cause else str(error)
