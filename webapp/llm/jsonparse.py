"""Reading JSON that a model wrote: often fenced in ```json, sometimes with prose around it (DESIGN.md 5.6)."""

import json
import logging
import re
from typing import Any

log = logging.getLogger(__name__)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in the model's text, or None (logged) when there is none."""
    text = (text or "").strip()
    for candidate in [text, *_FENCE.findall(text)]:
        found = _first_object(candidate.strip())
        if found is not None:
            return found
    log.warning("model output held no JSON object: %.200r", text)
    return None


def _first_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder(strict=False)  # a raw newline inside a string is still the model's meaning
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
