"""What a person reads about a chat, in a real browser on a desktop and on a phone (issue 32.2 and 32.9): the new-chat
form says who will read the chat, and after an invalid try the focus is on what to fix; the lists and the chat's
header name who reads each chat in words (not "Private"/"Shared"); previews are plain text, not Markdown; a notice
("Milo added Sam to the conversation.") leaves Edit and Regenerate with the last turn; an invalid key name puts the
focus on the field. axe-core finds no violation of any impact on these pages."""

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.test_error_pages_browser import look, sign_in
from tests.test_first_hour_browser import size, tap  # noqa: F401  (size: the viewport fixture)
from webapp.extensions import db

pytestmark = pytest.mark.browser


def test_who_reads_a_chat_plain_previews_and_edit_after_a_notice(page: Page, size, live_app, live_server):  # noqa: F811
    acme = factories.account("Acme")
    milo = factories.user(acme, "milo@example.com", "member")
    milo.name = "Milo"
    sam = factories.user(acme, "sam@example.com", "member")
    sam.name = "Sam"
    ada = factories.agent(acme, "Ada")
    factories.agent(acme, "Basil")
    trip = factories.chat(acme, [ada], "Lisbon trip", people=[milo])
    factories.message(trip, "Plan a trip to Lisbon", author=milo)
    factories.message(trip, "**Day one**: the _Alfama_, then [tram 28](https://example.com).", author=ada)
    factories.chat(acme, [ada], "Garden club")  # from before chats had people: everyone reads it
    trip_id = trip.id
    db.session.commit()
    db.session.remove()

    # The list: who reads each chat, in words; the preview is what Ada said, without its Markdown.
    sign_in(page, live_server, "milo@example.com")
    row = page.locator("#chat-list li", has_text="Lisbon trip")
    expect(row.locator(".visibility-mark")).to_have_text("Only its people")
    expect(page.locator("#chat-list li", has_text="Garden club").locator(".visibility-mark")).to_have_text(
        "Everyone in Acme"
    )
    expect(row.locator(".preview")).to_have_text("Ada: Day one: the Alfama, then tram 28.")
    look(page, size, "words-01-list")

    # The new-chat form says who will read it; started without an agent, the focus is on the agents to choose.
    tap(page.get_by_role("link", name="New chat"))
    expect(page.get_by_text("Who reads it: only its people")).to_be_visible()
    expect(page.get_by_text("you can add people or open it to everyone in Acme")).to_be_visible()
    look(page, size, "words-02-new-chat")
    tap(page.get_by_role("button", name="Start chat"))
    expect(page.get_by_text("Choose at least one agent.")).to_be_visible()
    expect(page.get_by_role("checkbox", name="Ada")).to_be_focused()
    look(page, size, "words-03-new-chat-invalid")

    # The chat: its header says who reads it; Milo adds Sam, and the notice leaves her Edit and Ada's Regenerate.
    page.goto(f"{live_server}/chats/{trip_id}")
    switch = page.get_by_role("group", name="Who can read this chat")
    expect(switch.get_by_role("button", name="Only its people")).to_have_attribute("aria-pressed", "true")
    expect(switch.get_by_role("button", name="Everyone in Acme")).to_have_attribute("aria-pressed", "false")
    if size == "desktop":  # the list beside the chat (hidden on a phone) says it in words and plain text too
        beside = page.locator("#side-list li", has_text="Lisbon trip")
        expect(beside.locator(".visibility-mark")).to_have_text("Only its people")
        expect(beside.locator(".visibility-mark")).to_be_visible()
        expect(beside.locator(".preview")).to_have_text("Ada: Day one: the Alfama, then tram 28.")
    people = page.locator(".people-picker")
    tap(people.locator("summary"))
    people.get_by_label("Add a person").select_option(label="Sam")
    tap(people.get_by_role("button", name="Add", exact=True))
    expect(page.locator("#messages")).to_contain_text("Milo added Sam to the conversation.")
    mine = page.locator("#messages article.message.mine")
    reply = page.locator("#messages article.message.assistant")
    expect(mine.get_by_role("button", name="Edit")).to_be_visible()
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible()
    look(page, size, "words-04-notice-keeps-edit")
    tap(mine.get_by_role("button", name="Edit"))
    expect(page.get_by_role("button", name="Save and resend")).to_be_visible()


def test_an_invalid_key_name_puts_the_focus_on_it(page: Page, size, live_app, live_server):  # noqa: F811
    factories.user(factories.account("Acme"), "milo@example.com", "member")
    db.session.remove()

    sign_in(page, live_server, "milo@example.com")
    page.goto(f"{live_server}/account")
    tap(page.get_by_role("button", name="Make a key"))  # without a name
    field = page.get_by_label("Name of the new key")
    expect(field).to_be_focused()
    expect(field).to_have_accessible_description(page.locator("#key_name-errors").inner_text())
    look(page, size, "words-05-key-name-invalid")
