"""Markdown for messages: a fenced block keeps its language for the highlighter, and nothing else gets through."""

import re

import pytest
from playwright.sync_api import expect

from tests import factories
from tests.conftest import ARTIFACTS
from webapp.web.markdown import render_markdown


def test_a_fenced_block_keeps_its_language_for_the_highlighter():
    html = str(render_markdown("```python\nprint('hi')\n```"))

    assert html == "<pre><code class=\"language-python\">print('hi')\n</code></pre>\n"


@pytest.mark.parametrize("language", ["c++", "objective-c", "c#", "shell_session", "vue.js"])
def test_language_names_with_signs_are_kept(language):
    assert f'class="language-{language}"' in str(render_markdown(f"```{language}\nx\n```"))


@pytest.mark.parametrize(
    "markdown",
    [
        '```"onclick="alert(1)\nx\n```',
        "```python{onclick=alert(1)}\nx\n```",
        "```" + "a" * 60 + "\nx\n```",
    ],
)
def test_a_language_that_is_not_a_plain_name_is_dropped(markdown):
    html = str(render_markdown(markdown))

    assert "<code>x\n</code>" in html and "class=" not in html and "onclick" not in html


def test_class_and_event_attributes_stay_stripped_everywhere_else():
    html = str(
        render_markdown(
            '<p class="x" onclick="alert(1)">raw</p>\n\n'
            "[link](javascript:alert(1)) `inline code`\n\n"
            "| a |\n|---|\n| b |"
        )
    )

    tags = re.findall(r"<[^>]*>", html)
    assert [tag for tag in tags if re.search(r"class=|onclick|javascript:", tag)] == []
    assert "&lt;p class=" in html  # raw HTML is text, as before
    assert "<code>inline code</code>" in html and "<table>" in html


def test_the_sanitizer_itself_keeps_only_a_language_class_on_code():
    from webapp.web.markdown import sanitize

    html = sanitize(
        '<pre class="x"><code class="language-js" onclick="x()">a</code></pre>'
        '<code class="hljs">b</code><span class="language-js">c</span>'
    )

    assert html == '<pre><code class="language-js">a</code></pre><code>b</code><span>c</span>'


@pytest.mark.browser
def test_finished_code_is_highlighted_and_copyable_and_streaming_code_is_not(page, live_server, live_app):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada], "Code")
    factories.message(chat, "A loop, please", author=admin)
    reply = factories.message(chat, "Here:\n\n```python\nfor i in range(3):\n    print(i)\n```", author=ada)
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    page.goto(f"{live_server}/chats/{chat.id}")

    code = page.locator(f"#message-{reply.id} pre code")
    expect(code).to_have_class(re.compile(r"\bhljs\b"))
    expect(code.locator(".hljs-keyword").first).to_have_text("for")
    expect(page.locator(f"#message-{reply.id} .copy-code")).to_have_text("Copy code")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(f"#message-{reply.id}").screenshot(path=str(ARTIFACTS / "code-highlighted.png"))
    streaming_body = (
        '<div class="body streaming"><pre><code class="language-python">for x in y: pass</code></pre></div>'
    )
    page.evaluate(
        "([target, html]) => htmx.swap(target, html, {swapStyle: 'beforeend'})",
        [f"#message-{reply.id}", streaming_body],
    )
    streaming = page.locator(f"#message-{reply.id} .body.streaming code")
    expect(streaming).to_have_text("for x in y: pass")
    assert streaming.get_attribute("data-highlighted") is None and streaming.locator("span").count() == 0
