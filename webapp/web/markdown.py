"""Markdown for messages: CommonMark with raw HTML disabled, then sanitized, so no user or model text can inject markup.

The one attribute added to the sanitizer's defaults is a fenced block's language (`<code class="language-python">`),
which the browser's highlighter reads; any other class, on any element, is dropped."""

import html
import re

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable("table")
_ATTRIBUTES = {**nh3.ALLOWED_ATTRIBUTES, "code": {"class"}}
_LANGUAGE = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")


def _only_a_language(element: str, attribute: str, value: str) -> str | None:
    if element == "code" and attribute == "class":
        return value if _LANGUAGE.fullmatch(value) else None
    return value


def sanitize(html: str) -> str:
    """HTML with only the sanitizer's safe tags and attributes, and a language class on <code>."""
    return nh3.clean(
        html,
        attributes=_ATTRIBUTES,
        attribute_filter=_only_a_language,
        link_rel="noopener noreferrer nofollow",
        url_schemes={"http", "https", "mailto"},
    )


def render_markdown(text: str) -> Markup:
    return Markup(sanitize(_md.render(text or "")))


def plain_text(text: str, limit: int) -> str:
    """What the Markdown says without its marks (`**bold**` is "bold", a link its words), on one line, cut to at
    most `limit` characters with an ellipsis. Only the start is read: a preview needs no more."""
    rendered = nh3.clean(_md.render((text or "")[: limit * 20]), tags=set())
    words = " ".join(html.unescape(rendered).split())
    return words if len(words) <= limit else words[: limit - 1].rstrip() + "…"
