"""Page or fragment: a page answers a plain load with the whole page, and an HTMX request that swaps one of its
elements (HX-Target) with only that element's template."""

from typing import Any

from flask import Response, render_template, request


def fragment_requested(target: str) -> bool:
    """True when HTMX asks to swap only the element with this id (so the page's other parts need no data)."""
    return request.headers.get("HX-Target") == target


def page_or_fragment(page: str, fragments: dict[str, str], /, **context: Any) -> Response:
    """The full `page`, or the template `fragments` names for the element HTMX asks to swap (any context key is
    free, `page` included: the two templates are positional only)."""
    chosen = next((fragment for target, fragment in fragments.items() if fragment_requested(target)), page)
    response = Response(render_template(chosen, **context))
    response.vary.add("HX-Request")
    return response
