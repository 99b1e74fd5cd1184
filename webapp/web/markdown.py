"""Markdown for messages: CommonMark with raw HTML disabled, then sanitized, so no user or model text can inject markup."""

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable("table")


def render_markdown(text: str) -> Markup:
    html = _md.render(text or "")
    return Markup(
        nh3.clean(html, link_rel="noopener noreferrer nofollow", url_schemes={"http", "https", "mailto"})
    )
