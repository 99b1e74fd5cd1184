"""The LLM layer against a fake OpenAI-compatible server: text, streams, tool calls, errors, the ledger."""

import pytest
import sqlalchemy as sa

from webapp import llm
from webapp.extensions import db
from webapp.llm.targets import for_environment
from webapp.models import LlmCall

MESSAGES = [{"role": "user", "content": "Hi"}]
SAVE_MEMORY = {
    "type": "function",
    "function": {
        "name": "save_memory",
        "parameters": {"type": "object", "properties": {"content": {"type": "string"}}},
    },
}


def _calls() -> list[LlmCall]:
    return list(db.session.scalars(sa.select(LlmCall).order_by(LlmCall.id)))


def test_plain_reply_returns_text_usage_and_records_the_call(app, fake_llm):
    fake_llm.reply("Hello there")

    result = llm.complete(
        for_environment("agent-model"), MESSAGES, purpose="reply", agent_id=None, chat_id=None
    )

    assert result.text == "Hello there"
    assert (result.prompt_tokens, result.completion_tokens) == (11, 2)
    assert fake_llm.requests[-1]["model"] == "agent-model"
    assert fake_llm.requests[-1]["messages"] == MESSAGES
    [call] = _calls()
    assert (call.purpose, call.model, call.status) == ("reply", "agent-model", "ok")
    assert (call.prompt_tokens, call.completion_tokens) == (11, 2)
    assert call.latency_ms >= 0


def test_streaming_delivers_each_text_delta_in_order(app, fake_llm):
    fake_llm.reply("one two three")
    deltas = []

    result = llm.complete(for_environment("m"), MESSAGES, purpose="reply", on_text=deltas.append)

    assert deltas == ["one", " two", " three"]
    assert result.text == "one two three"
    assert fake_llm.requests[-1]["stream"] is True
    assert result.completion_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_returned_whole(app, fake_llm, stream):
    fake_llm.reply(tool_calls=[("save_memory", {"content": "likes tea"}), ("save_memory", {"content": "x"})])

    result = llm.complete(
        for_environment("m"),
        MESSAGES,
        purpose="reply",
        tools=[SAVE_MEMORY],
        on_text=(lambda _: None) if stream else None,
    )

    assert [c.name for c in result.tool_calls] == ["save_memory", "save_memory"]
    assert result.tool_calls[0].parsed_arguments() == {"content": "likes tea"}
    assert result.tool_calls[0].id == "call_0"
    assert fake_llm.requests[-1]["tools"] == [SAVE_MEMORY]


def test_malformed_tool_arguments_raise_a_clear_value_error(app, fake_llm):
    fake_llm.reply(tool_calls=[("save_memory", '{"content": ')])

    [call] = llm.complete(for_environment("m"), MESSAGES, purpose="reply", tools=[SAVE_MEMORY]).tool_calls

    with pytest.raises(ValueError, match="not valid JSON"):
        call.parsed_arguments()


def test_tool_arguments_with_a_raw_newline_in_a_string_parse(app, fake_llm):
    fake_llm.reply(tool_calls=[("save_memory", '{"content": "two\nlines", "memory_type": "journal"}')])

    [call] = llm.complete(for_environment("m"), MESSAGES, purpose="reply", tools=[SAVE_MEMORY]).tool_calls

    assert call.parsed_arguments() == {"content": "two\nlines", "memory_type": "journal"}


@pytest.mark.parametrize(
    ("status", "retryable"), [(429, True), (500, True), (503, True), (400, False), (401, False), (404, False)]
)
def test_http_errors_are_classified_and_recorded(app, fake_llm, status, retryable):
    fake_llm.fail(status, "nope")

    with pytest.raises(llm.LLMError) as raised:
        llm.complete(for_environment("m"), MESSAGES, purpose="extract", agent_id=None)

    assert raised.value.retryable is retryable
    assert f"HTTP {status}" in str(raised.value)
    [call] = _calls()
    assert (call.status, call.purpose) == ("error", "extract")
    assert f"HTTP {status}" in call.error


def test_a_timeout_is_retryable(app, fake_llm):
    app.config["LLM_TIMEOUT_SECONDS"] = 0.2
    fake_llm.reply("late", delay=1)

    with pytest.raises(llm.LLMError, match="in time") as raised:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply")

    assert raised.value.retryable


def test_an_unreachable_server_is_retryable(app):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    app.config["LLM_BASE_URL"] = url

    with pytest.raises(llm.LLMError, match="Could not reach") as raised:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply")

    assert raised.value.retryable
    assert str(raised.value) == (
        f"Could not reach the model at {url}: connection refused. "
        "Is the model server running? Check LLM_BASE_URL."
    )
    assert _calls()[0].status == "error"


# Error messages say what to do about them


def test_a_model_the_provider_does_not_know_names_the_model_id_to_check(app, fake_llm):
    fake_llm.fail(404, "The model `gpt-5-nano` does not exist")

    with pytest.raises(llm.LLMError) as raised:
        llm.complete(for_environment("gpt-5-nano"), MESSAGES, purpose="reply")

    assert str(raised.value) == (
        "The model 'gpt-5-nano' was not found at the provider: check the agent's model id. "
        "(HTTP 404: The model `gpt-5-nano` does not exist)"
    )
    assert not raised.value.retryable and _calls()[0].error == str(raised.value)


def test_a_model_named_by_a_setting_names_that_setting(app, fake_llm):
    app.config["SUMMARY_MODEL_ID"] = "tiny-summarizer"
    fake_llm.fail(404, "not found")

    with pytest.raises(llm.LLMError, match="check SUMMARY_MODEL_ID"):
        llm.complete(for_environment("tiny-summarizer"), MESSAGES, purpose="summarize")


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (401, "The provider refused the API key: check LLM_API_KEY. (HTTP 401: invalid key)"),
        (
            403,
            "The provider refused access to the model 'm': check LLM_API_KEY and what it may use. "
            "(HTTP 403: invalid key)",
        ),
    ],
)
def test_a_refused_key_says_to_check_llm_api_key(app, fake_llm, status, said):
    fake_llm.fail(status, "invalid key")

    with pytest.raises(llm.LLMError) as raised:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply")

    assert str(raised.value) == said and not raised.value.retryable


def test_a_host_that_does_not_resolve_says_to_check_llm_base_url(app):
    app.config["LLM_BASE_URL"] = "http://no-such-host.invalid/v1"

    with pytest.raises(llm.LLMError) as raised:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply")

    assert str(raised.value) == (
        "Could not reach the model at http://no-such-host.invalid/v1: its host name does not resolve. "
        "Check LLM_BASE_URL."
    )


def test_the_ledger_row_survives_the_callers_rollback(app, fake_llm):
    llm.complete(for_environment("m"), MESSAGES, purpose="summarize")
    db.session.rollback()

    assert [c.purpose for c in _calls()] == ["summarize"]


# A reply is done only when the model said so (issue 11, item 3)


@pytest.mark.parametrize("stream", [True, False])
def test_a_cut_answer_is_a_retryable_error_recorded_as_such(app, fake_llm, stream):
    fake_llm.cut("alpha bravo charlie")
    seen: list[str] = []

    with pytest.raises(llm.LLMError) as caught:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply", on_text=seen.append if stream else None)

    assert caught.value.retryable
    [call] = _calls()
    assert call.status == "error" and call.error == str(caught.value)
    assert str(caught.value).startswith("The model's answer was cut off")  # not "could not reach the model"
    if stream:  # the words arrived, but the model never said it was finished
        assert "".join(seen) == "alpha bravo charlie"
    else:  # half of the body arrived, then the connection closed (what consolidation's requests may see)
        assert "the connection closed before the whole answer arrived" in str(caught.value)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
def test_an_html_body_with_http_200_is_a_retryable_error_not_an_empty_answer(
    app, fake_llm, stream, content_type
):
    fake_llm.html(content_type)

    with pytest.raises(llm.LLMError) as caught:
        llm.complete(
            for_environment("m"), MESSAGES, purpose="extract", on_text=(lambda _: None) if stream else None
        )

    assert caught.value.retryable
    assert str(caught.value).startswith("The model's server answered with something that is not a completion")
    assert [(c.status, c.error) for c in _calls()] == [("error", str(caught.value))]


@pytest.mark.parametrize("stream", [True, False])
def test_an_empty_answer_is_a_retryable_error(app, fake_llm, stream):
    fake_llm.reply("")

    with pytest.raises(llm.LLMError, match="finished without writing anything") as caught:
        llm.complete(
            for_environment("m"), MESSAGES, purpose="summarize", on_text=(lambda _: None) if stream else None
        )

    assert caught.value.retryable and _calls()[0].status == "error"


def test_a_stream_that_hangs_is_a_retryable_timeout(app, fake_llm):

    app.config["LLM_TIMEOUT_SECONDS"] = 1
    fake_llm.hang("alpha", seconds=3)

    with pytest.raises(llm.LLMError, match="did not answer in time") as caught:
        llm.complete(for_environment("m"), MESSAGES, purpose="reply", on_text=lambda _: None)

    assert caught.value.retryable and _calls()[0].status == "error"
