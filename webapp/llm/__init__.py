"""The one way Cairn talks to a model: any OpenAI-compatible API through the openai SDK.

Every request is recorded in llm_calls (the cost ledger), whether it succeeded or not.
"""

import json
import socket
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import openai
import sqlalchemy as sa
from flask import Flask, current_app
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from webapp import config
from webapp.extensions import db
from webapp.models import LlmCall
from webapp.models.runs import current_job_run_id
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

RETRYABLE_STATUS = {408, 409, 429}
FINISHED = {"stop", "tool_calls", "function_call", "length"}  # the model said it was done
NOT_A_COMPLETION = "The model's server answered with something that is not a completion"


class LLMError(Exception):
    """A failed model request; `retryable` says whether trying again later may succeed."""

    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model wrote it

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; ValueError when the model wrote something else."""
        try:
            value = json.loads(
                self.arguments or "{}", strict=False
            )  # small models put raw newlines in strings
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments are not valid JSON: {e.msg}") from e
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value

    def as_message_part(self) -> dict[str, Any]:
        """The form an assistant message carries when the transcript goes back to the model."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class LLMResult:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


def init_app(app: Flask) -> None:
    app.extensions["llm_client"] = openai.OpenAI(
        base_url=app.config["LLM_BASE_URL"],
        api_key=app.config["LLM_API_KEY"],
        timeout=app.config["LLM_TIMEOUT_SECONDS"],
        max_retries=0,  # retries belong to the job queue, with backoff
    )
    if config.one_connection(app.config):
        app.before_request(_hold_ledger_rows)
        app.teardown_request(_write_held_ledger_rows)


# With one database connection in the process (SQLite under gevent: webapp.config.engine_options), a request holds
# it until it ends, so a ledger row cannot be written on a connection of its own meanwhile (the chat's memory page
# waited 30 s for one, to embed its query). The request's rows are held, and written once it let the connection go.
_held_rows: ContextVar[list[dict[str, Any]] | None] = ContextVar("held_ledger_rows", default=None)


def _hold_ledger_rows() -> None:
    _held_rows.set([])


def _write_held_ledger_rows(_error: BaseException | None) -> None:
    rows = _held_rows.get()
    _held_rows.set(None)
    if rows:
        db.session.remove()  # gives the connection back
        with db.engine.begin() as conn:
            conn.execute(sa.insert(LlmCall), rows)


def complete(
    model: str,
    messages: list[dict[str, Any]],
    *,
    purpose: str,
    tools: list[dict[str, Any]] | None = None,
    agent_id: int | None = None,
    chat_id: int | None = None,
    on_text: Callable[[str], None] | None = None,
    response_format: dict[str, Any] | None = None,
) -> LLMResult:
    """Ask `model` for the next message. With on_text, stream and call it with each text delta."""
    request: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        request["tools"] = tools
    if response_format:
        request["response_format"] = response_format
    if max_tokens := current_app.config.get("LLM_MAX_OUTPUT_TOKENS"):
        request["max_tokens"] = max_tokens  # a rambling model stops here, with a retryable "did not finish"
    started = time.monotonic()
    record = {"purpose": purpose, "agent_id": agent_id, "chat_id": chat_id, "model": model}
    try:
        result = _stream(request, on_text) if on_text else _request(request)
        _check_finished(result)
    except openai.OpenAIError as e:
        error = _classify(e, model, purpose)
        record_call(record, started, status="error", error=str(error))
        raise error from e
    except json.JSONDecodeError as e:  # a JSON content type over a body that is not JSON (an HTML page, say)
        error = LLMError(f"{NOT_A_COMPLETION} (its body is not JSON: {e}).", retryable=True)
        record_call(record, started, status="error", error=str(error))
        raise error from e
    except LLMError as error:
        record_call(record, started, status="error", error=str(error))
        raise
    except Exception as e:  # stopped from outside (the job's time limit, a Stop): the request was still made
        record_call(
            record,
            started,
            status="error",
            error=f"Abandoned before the answer was complete ({type(e).__name__}).",
        )
        raise
    if not result.prompt_tokens:  # some servers leave usage out of streams; estimate it
        result.prompt_tokens = count_tokens(json.dumps(messages))
        result.completion_tokens = count_tokens(result.text)
    record_call(
        record,
        started,
        status="ok",
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
    )
    return result


def _client() -> openai.OpenAI:
    return current_app.extensions["llm_client"]


def _check_finished(result: LLMResult) -> None:
    """A reply is done only when the model said so, with something in it; anything else is worth a retry."""
    if result.finish_reason == "content_filter":
        raise LLMError("The model's provider withheld this answer (content filter).", retryable=False)
    if result.finish_reason not in FINISHED:
        raise LLMError(
            "The model's answer was cut off: it ended without saying it was finished"
            f" ({len(result.text)} characters received).",
            retryable=True,
        )
    if not result.text.strip() and not result.tool_calls:
        raise LLMError("The model finished without writing anything.", retryable=True)


def _request(request: dict[str, Any]) -> LLMResult:
    response = _client().chat.completions.create(**request)
    if not isinstance(response, ChatCompletion):  # the SDK hands back the text of a body that is not JSON
        raise LLMError(f"{NOT_A_COMPLETION}: {_excerpt(response)}", retryable=True)
    if not getattr(response, "choices", None):
        raise LLMError(f"{NOT_A_COMPLETION} (it has no choices).", retryable=True)
    choice = response.choices[0]
    calls = [
        ToolCall(id=c.id or f"call_{i}", name=c.function.name, arguments=c.function.arguments or "")
        for i, c in enumerate(choice.message.tool_calls or [])
    ]
    usage = response.usage
    return LLMResult(
        text=choice.message.content or "",
        tool_calls=calls,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        finish_reason=choice.finish_reason,
    )


def _stream(request: dict[str, Any], on_text: Callable[[str], None]) -> LLMResult:
    stream = _client().chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    result = LLMResult(text="")
    chunks = 0
    for chunk in stream:
        if not isinstance(chunk, ChatCompletionChunk) or getattr(chunk, "choices", None) is None:
            raise LLMError(f"{NOT_A_COMPLETION}: {_excerpt(chunk)}", retryable=True)
        chunks += 1
        if chunk.usage:
            result.prompt_tokens = chunk.usage.prompt_tokens
            result.completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
                on_text(delta.content)
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = part.id or call["id"]
                if part.function:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
            result.finish_reason = choice.finish_reason or result.finish_reason
    if not chunks:
        raise LLMError(f"{NOT_A_COMPLETION} (no completion chunks in its stream).", retryable=True)
    result.text = "".join(text)
    result.tool_calls = [
        ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
        for i, c in sorted(calls.items())
    ]
    return result


def _excerpt(value: Any) -> str:
    """The first characters of an unexpected body, one line, for an error message."""
    return " ".join(str(value).split())[:200] or "(empty)"


def _classify(error: openai.OpenAIError, model: str, purpose: str) -> LLMError:
    """Rate limits, server errors, timeouts and lost connections are worth retrying; the rest are not. The
    message says what to check when a setting is the likely cause."""
    if isinstance(error, openai.APITimeoutError):
        return LLMError("The model did not answer in time.", retryable=True)
    if isinstance(error, openai.APIConnectionError):
        return _connection_problem(error)
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        said = f"(HTTP {status}: {_error_detail(error)})"
        if status == 404:
            check = _model_setting(model, purpose)
            return LLMError(
                f"The model '{model}' was not found at the provider: check {check}. {said}", retryable=False
            )
        if status == 401:
            return LLMError(f"The provider refused the API key: check LLM_API_KEY. {said}", retryable=False)
        if status == 403:
            return LLMError(
                f"The provider refused access to the model '{model}': check LLM_API_KEY and what it may use."
                f" {said}",
                retryable=False,
            )
        retryable = status in RETRYABLE_STATUS or status >= 500
        return LLMError(f"The model returned HTTP {status}: {_error_detail(error)}", retryable=retryable)
    return LLMError(f"The model request failed: {error}", retryable=False)


# Jobs that use a model named by a setting rather than the agent's own, when that setting is set.
MODEL_SETTINGS = {"summarize": "SUMMARY_MODEL_ID", "compact": "COMPACTION_MODEL_ID"}


def _model_setting(model: str, purpose: str) -> str:
    """Where the model id came from: a setting, or the agent's form."""
    setting = MODEL_SETTINGS.get(purpose)
    if setting and current_app.config.get(setting) == model:
        return setting
    return "the agent's model id"


def _connection_problem(error: openai.APIConnectionError) -> LLMError:
    """What went wrong on the connection, from the network error under the SDK's "Connection error."."""
    causes = _causes(error)
    # h11, httpcore and httpx each raise their own RemoteProtocolError for a body shorter than announced
    cut = next((c for c in causes if type(c).__name__ == "RemoteProtocolError"), None)
    if cut is not None:
        return LLMError(
            f"The model's answer was cut off: the connection closed before the whole answer arrived ({cut}).",
            retryable=True,
        )
    where = f"Could not reach the model at {str(_client().base_url).rstrip('/')}"
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return LLMError(
            f"{where}: connection refused. Is the model server running? Check LLM_BASE_URL.", retryable=True
        )
    if any(isinstance(c, socket.gaierror) for c in causes):
        return LLMError(f"{where}: its host name does not resolve. Check LLM_BASE_URL.", retryable=True)
    detail = f"{causes[0]}" if causes else str(error)
    return LLMError(f"{where} ({detail}): check LLM_BASE_URL and the network.", retryable=True)


def _causes(error: BaseException) -> list[BaseException]:
    """The exceptions behind this one, nearest first."""
    found: list[BaseException] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and cause not in found:
        found.append(cause)
        cause = cause.__cause__ or cause.__context__
    return found


def _error_detail(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:500]
    return str(error.message)[:500]


def record_call(fields: dict[str, Any], started: float, **outcome: Any) -> None:
    """Write the ledger row on its own connection, so it survives whatever the caller's session does (where a
    request holds the process's one connection, once the request ends)."""
    row = {
        **fields,
        **outcome,
        "job_run_id": current_job_run_id.get(),
        "latency_ms": int((time.monotonic() - started) * 1000),
        "created_at": utcnow(),
    }
    if (held := _held_rows.get()) is not None:
        held.append(row)
        return
    with db.engine.begin() as conn:
        conn.execute(sa.insert(LlmCall), [row])


MODELS_TIMEOUT_SECONDS = 3


def available_models() -> list[str]:
    """The model ids the provider lists at /v1/models, sorted; empty when it lists none or cannot be reached
    (the agent form then takes any id typed in)."""
    try:
        listed = _client().with_options(timeout=MODELS_TIMEOUT_SECONDS).models.list()
        return sorted({m.id for m in listed})
    except openai.OpenAIError:
        return []
