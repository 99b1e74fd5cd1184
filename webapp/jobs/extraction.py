"""Consolidation's reading of a chat: its transcript in chunks with numbered turns, and the memories (with the
turns they came from) read from the model's answer to each chunk."""

from dataclasses import dataclass
from typing import Any

from webapp.llm.jsonparse import parse_json_object
from webapp.models.memories import MAX_CONTENT_CHARS, MEMORY_TYPES
from webapp.tokens import count_tokens


def chunk_messages(lines: list[tuple[int, str]], target_tokens: int) -> list[list[tuple[int, str]]]:
    """Split lines into chunks of about target_tokens (tiktoken), keeping each message whole."""
    chunks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    used = 0
    for line in lines:
        tokens = count_tokens(line[1])
        if current and used + tokens > target_tokens:
            chunks.append(current)
            current, used = [], 0
        current.append(line)
        used += tokens
    if current:
        chunks.append(current)
    return chunks


def numbered_turns(chunk: list[tuple[int, str]]) -> str:
    """The chunk's turns as the extraction prompt shows them, a line each with its number ("3 Ana: ..."): the
    shortest reference a model names back (a number and a name are a token each in o200k and cl100k; brackets
    and a blank line between turns cost about 3 tokens a turn more, 600 in a chat of 200: bench.memory_cost)."""
    return "\n".join(f"{number} {text}" for number, (_, text) in enumerate(chunk, start=1))


@dataclass
class Extracted:
    """A memory the model returned and the ids of the messages it came from."""

    content: str
    sources: list[int]
    named: bool  # the model named its turns (else its sources are the whole chunk)


def parse_extraction(text: str, chunk_ids: list[int]) -> dict[str, list[Extracted]] | None:
    """{"journal": [...], "core": [...]} of the usable memories in the model's answer, or None when the answer is
    malformed. A memory's sources are the turns it names that are in the chunk (by their numbers), or the whole
    chunk when it names none of them."""
    parsed = parse_json_object(text)
    if parsed is None:
        return None
    return {kind: _usable(parsed.get(kind), chunk_ids) for kind in MEMORY_TYPES}


def _usable(values: Any, chunk_ids: list[int]) -> list[Extracted]:
    if not isinstance(values, list):
        return []
    usable = []
    for value in values:
        content, turns = (
            (value.get("memory"), value.get("turns")) if isinstance(value, dict) else (value, None)
        )
        if not isinstance(content, str | int | float) or isinstance(content, bool):
            continue
        content = str(content).strip()
        if 1 <= len(content) <= MAX_CONTENT_CHARS:
            named = _named(turns, chunk_ids)
            usable.append(Extracted(content, named or chunk_ids, bool(named)))
    return usable


def _named(turns: Any, chunk_ids: list[int]) -> list[int]:
    """The ids of the chunk's turns among the numbers given (others are dropped), in order."""
    numbers = turns if isinstance(turns, list) else [turns]
    valid = {n for n in map(_turn_number, numbers) if n is not None and 1 <= n <= len(chunk_ids)}
    return [chunk_ids[n - 1] for n in sorted(valid)]


def _turn_number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().strip("[]").isdigit():
        return int(value.strip().strip("[]"))
    return None
