"""How much of the model's window a request takes, counted in the model's own tokens; and bringing a request within
its input budget before a model call (fit_to_budget: the oldest transcript first, then the oldest tool results).

The embedded local model (SmolLM2 under llama-cpp-python) has a small window and its own tokenizer, which
counts digits and most non-English text at up to twice what cl100k does. Its chatml-function-calling format
also HTML-escapes every text, lists the tools' parameters again in every system message, and starts each
earlier answer with "message:". So with the local model a request is counted as that server renders it; any
other provider is counted with cl100k, the tools once. Which model a request goes to, and so its window, is
the request's ModelTarget (webapp.llm.targets). Where the local model server is not installed (no llama_cpp, or
no SmolLM2 file), the local count falls back to cl100k's: the request is still built, and its model call says
what is missing.
"""

import functools
import json
from typing import Any

from markupsafe import escape

from webapp.llm import LLMError
from webapp.llm.targets import ModelTarget
from webapp.local_models.catalog import NotInstalled
from webapp.runtime.processes import local_model_path
from webapp.tokens import count_tokens

TRUNCATION_NOTE = "(Earlier messages of this conversation are not shown; only the most recent ones fit.)"
REMOVED_TOOL_RESULT = json.dumps({"error": "This result was removed: the prompt was over its token budget."})
MESSAGE_OVERHEAD_TOKENS = 4  # what a chat message costs beyond its content (role and separators)
# The local server's format: each message is <|im_start|>role\n ... <|im_end|>\n, the answer starts after
# <|im_start|>assistant\n (and, with tools, after "functions.<name>:\n" when a call is wanted); after the
# tool list come about 139 tokens of instructions.
LOCAL_MESSAGE_OVERHEAD_TOKENS = 5
LOCAL_ANSWER_START = "<|im_start|>assistant\n"
LOCAL_EARLIER_ANSWER = "message:\n"
LOCAL_TOOL_INSTRUCTIONS_TOKENS = 150


def text_tokens(target: ModelTarget, text: str) -> int:
    """The tokens of text in the model's own tokenizer (cl100k for any model but the local SmolLM2, and for it
    too where it is not installed)."""
    if target.counts_as_local:
        return _local_tokens(text or "")
    return _cl100k_tokens(text or "")


def prompt_tokens(
    target: ModelTarget, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """The input tokens of a request: every message (contents and tool-call arguments) and the tool schemas."""
    if target.counts_as_local:
        return _local_request_tokens(messages, tools)
    total = _cl100k_tokens(json.dumps(tools)) if tools else 0
    return total + sum(MESSAGE_OVERHEAD_TOKENS + _message_tokens(m, _cl100k_tokens) for m in messages)


def _message_tokens(message: dict[str, Any], count: Any) -> int:
    total = count(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        total += count(f"functions.{call['function']['name']}:\n") + count(call["function"]["arguments"])
    return total


def _local_request_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The request as the local server renders it."""
    listing = _local_tool_listing(tools)
    total = _local_tokens(LOCAL_ANSWER_START)
    if tools:
        total += max(_local_tokens(f"functions.{t['function']['name']}:\n") for t in tools)
    for message in messages:
        # Tool results are counted as sent, unescaped: this format leaves them out, another would not.
        count = _local_tokens if message["role"] == "tool" else _local_escaped_tokens
        total += LOCAL_MESSAGE_OVERHEAD_TOKENS + _message_tokens(message, count)
        if message["role"] == "system":
            total += listing
        elif message["role"] == "assistant" and tools and message.get("content"):
            total += _local_tokens(LOCAL_EARLIER_ANSWER)
    return total


def _local_tool_listing(tools: list[dict[str, Any]] | None) -> int:
    """What the local server adds to each system message when tools are offered: their parameters and how
    to call them."""
    if not tools:
        return 0
    listing = "".join(
        f"\nfunctions.{t['function']['name']}:\n{json.dumps(t['function'].get('parameters', {}), sort_keys=True)}\n"
        for t in tools
    )
    return _local_tokens(listing) + LOCAL_TOOL_INSTRUCTIONS_TOKENS


# A prompt is counted again after each trim: the same texts are counted once.
@functools.lru_cache(maxsize=512)
def _cl100k_tokens(text: str) -> int:
    return count_tokens(text)


def _local_escaped_tokens(text: str) -> int:
    return _local_tokens(str(escape(text)))


@functools.lru_cache(maxsize=512)
def _local_tokens(text: str) -> int:
    data = text.encode()
    if not data:
        return 0
    tokenizer = _local_tokenizer()
    if tokenizer is None:
        return _cl100k_tokens(text)
    llama_cpp, vocabulary = tokenizer
    # With no room for tokens, llama.cpp answers minus how many the text needs, without writing any.
    return -llama_cpp.llama_tokenize(vocabulary, data, len(data), None, 0, False, True)


@functools.cache
def _local_tokenizer() -> tuple[Any, Any] | None:
    """llama.cpp and the local model's vocabulary (no weights), loaded once per process that counts, in 0.3 s;
    None where the local model server is not installed (the `local-llm` extra)."""
    try:
        import llama_cpp  # only processes that count for the local model load the library

        path = local_model_path()
    except (ImportError, NotInstalled):
        return None
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise RuntimeError(f"could not load the local model's vocabulary from {path}")
    _loaded.append(model)  # the vocabulary lives as long as its model
    return llama_cpp, llama_cpp.llama_model_get_vocab(model)


_loaded: list[Any] = []


class PromptTooLarge(LLMError):
    """Even with the transcript and tool results cut, the prompt is over its total input budget."""

    def __init__(self, tokens: int, budget: int):
        super().__init__(
            f"The prompt needs {tokens:,} tokens with its tools, over the {budget:,} allowed (PROMPT_TOKEN_BUDGET, "
            "and no more than the model's window less the answer's room).",
            retryable=False,
        )


def fit_to_budget(
    target: ModelTarget,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    budget: int | None = None,
) -> int:
    """Bring the messages within the input budget, in place, before a model call; returns the tokens of the
    request (the messages and the tool schemas sent with them).

    The oldest transcript messages go first (the newest always stays), then the tool results, oldest first
    (the model has read them; a refinement's earlier pages, say), are replaced by a short note. What is left
    over budget after that raises PromptTooLarge, so no memory, summary, borrowed context, tool list or tool
    result can push a request past the model's window.
    """
    budget = budget or target.input_budget()
    while (used := prompt_tokens(target, messages, tools)) > budget:
        if not _drop_oldest_transcript(messages) and not _drop_oldest_tool_result(messages):
            raise PromptTooLarge(used, budget)
    return used


def _drop_oldest_transcript(messages: list[dict[str, Any]]) -> bool:
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if not systems:
        return False  # not a reply's prompt (a refinement session's, say): no transcript to shorten
    context_at = max(systems)
    transcript = [i for i in range(context_at) if messages[i]["role"] in ("user", "assistant")]
    if len(transcript) < 2:
        return False
    del messages[transcript[0]]
    context = messages[context_at - 1]
    if not context["content"].startswith(TRUNCATION_NOTE):
        context["content"] = f"{TRUNCATION_NOTE}\n\n{context['content']}"
    return True


def _drop_oldest_tool_result(messages: list[dict[str, Any]]) -> bool:
    """Replace the oldest tool result that the note would shorten; False when there is none."""
    for message in messages:
        if message["role"] == "tool" and len(message["content"]) > len(REMOVED_TOOL_RESULT):
            message["content"] = REMOVED_TOOL_RESULT
            return True
    return False
