"""Prompts: templates/ (filled by `render`), build.py (a reply's messages), provenance.py (what it drew on), window.py.

Templates are Jinja files with plain text out."""

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=False,  # prompts are plain text for a model, not HTML
    undefined=StrictUndefined,  # a missing variable is a bug, not an empty string
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=False,
)


def by_day(memories) -> list[tuple[str, list]]:
    """The memories under the day each was written, in the order given: a prompt writes each date once."""
    days: dict[str, list] = {}
    for memory in memories:
        days.setdefault(f"{memory.created_at:%Y-%m-%d}", []).append(memory)
    return list(days.items())


_env.filters["by_day"] = by_day


def render(name: str, **variables) -> str:
    """Fill in the prompt template `name` (a file in templates/) with the given variables."""
    return _env.get_template(name).render(**variables).strip()


def compile_all() -> None:
    """Parse every template now (a worker does it once, before forking a process per job)."""
    for name in _env.list_templates():
        _env.get_template(name)
