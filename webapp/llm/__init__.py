"""The one way Cairn talks to a model: any OpenAI-compatible API through the openai SDK.

A request goes to a ModelTarget (webapp.llm.targets): a model at one of the connections an admin added, or at the
environment's. Every request is recorded in llm_calls (the cost ledger), whether it succeeded or not, with its
connection; no error message or ledger row carries the connection's key.
"""

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from flask import Flask, current_app
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from webapp import config
from webapp.llm import ledger
from webapp.llm.ledger import record_call
from webapp.llm.targets import ModelTarget
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
            # strict=False: small models put raw newlines in strings
            value = json.loads(self.arguments or "{}", strict=False)
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments are not valid JSON: {e.msg}") from e
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value

    def as_message_part(self) -> dict[str, Any]:
        """The form an assistant message carries when the transcript goes back to the model."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class LLMResult:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


def init_app(app: Flask) -> None:
    app.extensions["llm_clients"] = {}
    app.extensions["llm_slots"] = {}
    if config.one_connection(app.config):
        app.before_request(ledger.hold_rows)
        app.teardown_request(ledger.write_held_rows)


def complete(
    target: ModelTarget,
    messages: list[dict[str, Any]],
    *,
    purpose: str,
    tools: list[dict[str, Any]] | None = None,
    agent_id: int | None = None,
    chat_id: int | None = None,
    on_text: Callable[[str], None] | None = None,
    response_format: dict[str, Any] | None = None,
    max_tokens: int | None = None,
) -> LLMResult:
    """Ask the target's model for the next message. With on_text, stream and call it with each text delta;
    max_tokens caps the answer below the target's own cap."""
    model = target.model
    request: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        request["tools"] = tools
    if response_format:
        request["response_format"] = response_format
    if max_tokens := max_tokens or target.max_output_tokens():
        request["max_tokens"] = max_tokens  # a rambling model stops here, with a retryable "did not finish"
    record = {
        "purpose": purpose,
        "agent_id": agent_id,
        "chat_id": chat_id,
        "model": model,
        "connection_id": target.connection_id,
    }
    with _slot(target):
        started = time.monotonic()
        return _complete(target, request, record, started, on_text)


def _complete(
    target: ModelTarget,
    request: dict[str, Any],
    record: dict[str, Any],
    started: float,
    on_text: Callable[[str], None] | None,
) -> LLMResult:
    try:
        client = client_for(target)
        result = _stream(client, request, on_text) if on_text else _request(client, request)
        _check_finished(result)
    except openai.OpenAIError as e:
        error = _without_key(_classify(e, target, record["purpose"]), target)
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
        result.prompt_tokens = count_tokens(json.dumps(request["messages"]))
        result.completion_tokens = count_tokens(result.text)
    record_call(
        record,
        started,
        status="ok",
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
    )
    return result


def client_for(target: ModelTarget) -> openai.OpenAI:
    """The SDK client of the target's connection, made once per address, key and headers in each process."""
    if reason := target.unavailable():  # a model that runs here, where its server is not installed
        raise LLMError(reason, retryable=False)
    timeout = current_app.config["LLM_TIMEOUT_SECONDS"]
    identity = (target.base_url, target.api_key, target.headers, timeout)
    clients: dict = current_app.extensions["llm_clients"]
    if identity not in clients:
        clients[identity] = openai.OpenAI(
            base_url=target.base_url,
            api_key=target.api_key,
            default_headers=dict(target.headers),
            timeout=timeout,
            max_retries=0,  # retries belong to the job queue, with backoff
        )
    return clients[identity]


def _slot(target: ModelTarget) -> threading.BoundedSemaphore:
    """A place among the requests this process sends to the target's connection at once (its concurrency)."""
    slots: dict = current_app.extensions["llm_slots"]
    key = (target.base_url, target.concurrency())
    if key not in slots:
        slots.setdefault(key, threading.BoundedSemaphore(target.concurrency()))
    return slots[key]


def _without_key(error: "LLMError", target: ModelTarget) -> "LLMError":
    """The error with the connection's key blotted out, should a provider have echoed it back."""
    secrets = [target.api_key, *(value for _, value in target.headers)]
    text = str(error)
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "•••")
    return error if text == str(error) else LLMError(text, retryable=error.retryable)


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


def _request(client: openai.OpenAI, request: dict[str, Any]) -> LLMResult:
    response = client.chat.completions.create(**request)
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


def _stream(client: openai.OpenAI, request: dict[str, Any], on_text: Callable[[str], None]) -> LLMResult:
    stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
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


def _classify(error: openai.OpenAIError, target: ModelTarget, purpose: str) -> LLMError:
    """Rate limits, server errors, timeouts and lost connections are worth retrying; the rest are not. The
    message says what to check when a setting is the likely cause."""
    model = target.model
    if isinstance(error, openai.APITimeoutError):
        return LLMError("The model did not answer in time.", retryable=True)
    if isinstance(error, openai.APIConnectionError):
        return _connection_problem(error, target)
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        said = f"(HTTP {status}: {_error_detail(error)})"
        if status == 404:
            check = _model_setting(target, purpose)
            return LLMError(
                f"The model '{model}' was not found at the provider: check {check}. {said}", retryable=False
            )
        if status == 401:
            return LLMError(
                f"The provider refused the API key: check {_key_setting(target)}. {said}", retryable=False
            )
        if status == 403:
            return LLMError(
                f"The provider refused access to the model '{model}': check {_key_setting(target)} and what it "
                f"may use. {said}",
                retryable=False,
            )
        retryable = status in RETRYABLE_STATUS or status >= 500
        return LLMError(f"The model returned HTTP {status}: {_error_detail(error)}", retryable=retryable)
    return LLMError(f"The model request failed: {error}", retryable=False)


# Jobs that use a model named by a setting rather than the agent's own, when that setting is set.
MODEL_SETTINGS = {"summarize": "SUMMARY_MODEL_ID", "compact": "COMPACTION_MODEL_ID"}


def _model_setting(target: ModelTarget, purpose: str) -> str:
    """Where the model id came from: a setting, or the agent's form."""
    setting = MODEL_SETTINGS.get(purpose)
    if setting and target.connection_id is None and current_app.config.get(setting) == target.model:
        return setting
    return "the agent's model id"


def _key_setting(target: ModelTarget) -> str:
    if target.connection_id is None:
        return "LLM_API_KEY"
    return f"the key of the connection '{target.connection_name}' (Admin, Connections)"


def _address_setting(target: ModelTarget) -> str:
    if target.connection_id is None:
        return "LLM_BASE_URL"
    return f"the address of the connection '{target.connection_name}' (Admin, Connections)"


def _connection_problem(error: openai.APIConnectionError, target: ModelTarget) -> LLMError:
    """What went wrong on the connection, from the network error under the SDK's "Connection error."."""
    causes = _causes(error)
    # h11, httpcore and httpx each raise their own RemoteProtocolError for a body shorter than announced
    cut = next((c for c in causes if type(c).__name__ == "RemoteProtocolError"), None)
    if cut is not None:
        return LLMError(
            f"The model's answer was cut off: the connection closed before the whole answer arrived ({cut}).",
            retryable=True,
        )
    where, check = f"Could not reach the model at {target.base_url.rstrip('/')}", _address_setting(target)
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return LLMError(
            f"{where}: connection refused. Is the model server running? Check {check}.", retryable=True
        )
    if any(isinstance(c, socket.gaierror) for c in causes):
        return LLMError(f"{where}: its host name does not resolve. Check {check}.", retryable=True)
    detail = f"{causes[0]}" if causes else str(error)
    return LLMError(f"{where} ({detail}): check {check} and the network.", retryable=True)


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
