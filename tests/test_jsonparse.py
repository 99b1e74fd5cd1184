"""Model JSON arrives fenced or wrapped in prose; it is read when it is there and refused when it is not."""

import pytest

from webapp.llm.jsonparse import parse_json_object


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '```json\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
        'Sure! Here it is: {"a": 1} Hope that helps.',
        'Thinking {not json} then {"a": 1}',
    ],
)
def test_reads_the_first_object(text):
    assert parse_json_object(text) == {"a": 1}


@pytest.mark.parametrize("text", ["", "no json here", "[1, 2]", '{"a": ', None])
def test_returns_none_without_an_object(text):
    assert parse_json_object(text) is None


def test_a_raw_newline_inside_a_string_is_read():
    """The local model's JSON grammar lets raw control characters into strings; the meaning is still clear."""
    assert parse_json_object('{"core": ["I like\ntea."]}') == {"core": ["I like\ntea."]}
