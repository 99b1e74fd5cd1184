"""The chat page kept live, in a real browser (issue 15): the chat list's preview and time follow the messages,
"thinking" shows only on the agent whose turn it is, other people's messages arrive without a reload, the
borrowed-context panel follows a borrow at once; and the small things: Copy, the Discard confirmation, the live
region, the skip link, the Agents list on a phone."""

from datetime import timedelta

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.test_first_hour_browser import check_page, tap
from webapp.extensions import db
from webapp.timeutil import utcnow

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("summaries_on_their_own_model")]


def sign_in(page: Page, live_server: str, email: str) -> None:
    page.goto(f"{live_server}/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(factories.PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Chats")).to_be_visible()


def test_the_chat_list_shows_the_latest_message_and_time_as_they_happen(
    page, live_server, worker_process, fake_llm
):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada, basil = factories.agent(admin.account, "Ada"), factories.agent(admin.account, "Basil")
    club = factories.chat(admin.account, [ada, basil], "Dinner club")
    club.last_message_at = utcnow() - timedelta(hours=3)
    db.session.commit()
    factories.chat(admin.account, [ada], "Roses")  # more recent: listed first until the club has news
    email, club_id = admin.email, club.id
    db.session.remove()  # the browser's requests and the worker need the database, not this test's session
    sign_in(page, live_server, email)
    page.goto(f"{live_server}/chats/{club_id}")
    rows = page.locator("#side-list > li")
    mine = page.locator("#side-list a[aria-current=page]")
    expect(rows.first).to_contain_text("Roses")
    expect(mine.locator(".preview")).to_have_text("No messages yet")
    expect(mine.locator("time")).to_have_text("3 hr. ago")

    # A message asking nobody: the row says it at once, moves to the top, and its time is now.
    composer = page.get_by_label("Message", exact=True)
    composer.fill("Who cooks on Friday?")
    composer.press("Enter")
    expect(page.locator("article.message.user")).to_contain_text("Who cooks on Friday?")
    expect(mine.locator(".preview")).to_have_text("Who cooks on Friday?")
    expect(mine.locator("time")).to_have_text("just now")
    expect(rows.first).to_contain_text("Dinner club")

    # A reply finishing: the row shows it, with who wrote it.
    fake_llm.reply("Basil does, risotto again.", model="basil-model")
    tap(page.get_by_role("button", name="Ask Basil"))
    expect(page.locator("article.message.assistant.done")).to_contain_text("risotto again")
    expect(mine.locator(".preview")).to_have_text("Basil: Basil does, risotto again.")
    # The live region read the finished reply out.
    expect(page.locator("#announcer")).to_have_text("Basil replied. Basil does, risotto again.")


def _group_chat(title: str = "Dinner club") -> dict:
    """Dana's group chat with Ada and Basil; what the test needs of it, its session closed."""
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada, basil = factories.agent(admin.account, "Ada"), factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil], title)
    names = {"email": admin.email, "chat": chat.id}
    db.session.remove()
    return names


def test_ask_all_shows_only_the_agent_whose_turn_it_is_as_thinking(
    page, live_server, worker_process, fake_llm
):
    club = _group_chat()
    sign_in(page, live_server, club["email"])
    page.goto(f"{live_server}/chats/{club['chat']}")
    # Each answer starts after a pause, so each agent's turn can be watched before its text arrives.
    fake_llm.reply("Soup for everyone.", delay=3, model="ada-model")
    fake_llm.reply("Bread and cheese.", delay=3, model="basil-model")

    tap(page.get_by_role("button", name="Ask all"))
    thinking = page.locator("article.message .thinking:visible")
    ada, basil = (
        page.locator("article.message.assistant").nth(0),
        page.locator("article.message.assistant").nth(1),
    )
    expect(thinking).to_have_text(["Ada is thinking"])
    expect(basil.get_by_text("Basil will answer in turn")).to_be_visible()

    expect(ada).to_contain_text("Soup for everyone.")
    expect(thinking).to_have_text(["Basil is thinking"])
    expect(basil).to_contain_text("Bread and cheese.")
    expect(page.locator("article.message.assistant.done")).to_have_count(2)
    expect(thinking).to_have_count(0)


def test_a_reply_waiting_to_be_tried_again_says_why_even_when_it_is_next(page, live_server):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada], "Roses")
    factories.message(chat, "Which roses like shade?", author=admin)
    factories.message(
        chat, "", author=ada, status="pending", error="The model is busy. Trying again shortly."
    )
    email, chat_id = admin.email, chat.id
    db.session.remove()

    sign_in(page, live_server, email)
    page.goto(f"{live_server}/chats/{chat_id}")

    expect(page.get_by_text("The model is busy. Trying again shortly.")).to_be_visible()


def _watch_live_stream(page: Page) -> None:
    """Note on the page when its live stream opens, so a test acts only once the page is listening."""
    page.add_init_script(
        "document.addEventListener('htmx:sseOpen', () => { window.liveStreamOpen = true; });"
    )


def test_a_message_from_someone_else_in_the_chat_arrives_without_a_reload(
    page, browser, live_server, worker_process, fake_llm
):
    account = factories.account()
    dana = factories.user(account, "dana@example.com", "admin")
    milo = factories.user(account, "milo@example.com", "member")  # the same account: the same chats
    chat = factories.chat(account, [factories.agent(account, "Ada")], "Roses")
    emails, chat_url = (dana.email, milo.email), f"{live_server}/chats/{chat.id}"
    db.session.remove()
    sign_in(page, live_server, emails[0])
    _watch_live_stream(page)
    page.goto(chat_url)
    page.wait_for_function("window.liveStreamOpen === true")

    milo_context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        milos_page = milo_context.new_page()
        milos_page.set_default_timeout(15_000)
        sign_in(milos_page, live_server, emails[1])
        milos_page.goto(chat_url)
        fake_llm.reply("Rambling Rector forgives a shady wall.", model="ada-model")
        composer = milos_page.get_by_label("Message", exact=True)
        composer.fill("Which roses like shade?")
        composer.press("Enter")
        expect(milos_page.locator("article.message.assistant.done")).to_contain_text("Rambling Rector")
    finally:
        milo_context.close()

    # Dana's page, never reloaded, has Milo's message under his name, and Ada's reply to it, each once.
    theirs = page.locator("article.message.user")
    expect(theirs).to_contain_text("Which roses like shade?")
    expect(theirs.locator(".author")).to_have_text("milo")
    expect(page.locator("article.message.assistant.done")).to_contain_text(
        "Rambling Rector forgives a shady wall."
    )
    expect(page.locator("article.message")).to_have_count(2)
    expect(page.locator("#side-list a[aria-current=page] .preview")).to_have_text(
        "Ada: Rambling Rector forgives a shady wall."
    )


def test_the_panel_shows_borrowed_context_as_soon_as_a_reply_borrowed_it(
    page, live_app, live_server, worker_process, fake_llm
):
    live_app.config["CROSS_CONVERSATION_REFRESH_SECONDS"] = 3600  # its poll never comes within the test
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context"])
    roses = factories.chat(admin.account, [ada], "Roses")
    factories.message(roses, "The wall faces north.", author=admin)
    factories.message(roses, "Then a climber that forgives shade.", author=ada)
    club = factories.chat(admin.account, [ada], "Garden club")
    email, roses_public, club_id = admin.email, roses.public_id, club.id
    db.session.remove()
    sign_in(page, live_server, email)
    page.goto(f"{live_server}/chats/{club_id}")
    panel = page.locator("#cross-conversations")
    expect(panel.get_by_role("heading", name="Other conversations")).to_be_visible()
    expect(panel).not_to_contain_text("borrowed context waiting")

    fake_llm.reply(tool_calls=[("borrow_context", {"conversation_id": roses_public})], model="ada-model")
    fake_llm.reply("We chose a climber for the north wall.", model="ada-model")
    composer = page.get_by_label("Message", exact=True)
    composer.fill("What did we decide about roses?")
    composer.press("Enter")

    reply = page.locator("article.message.assistant.done")
    expect(reply).to_contain_text("We chose a climber for the north wall.")
    expect(reply.get_by_role("link", name="Borrowed 2 messages from “Roses”")).to_be_visible()
    expect(panel).to_contain_text("borrowed context waiting")
    expect(panel).to_contain_text("2 messages for Ada's next reply here")


def test_copy_puts_a_message_on_the_clipboard_and_discard_asks_first(browser, live_server):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada], "Roses")
    factories.message(chat, "Plant **Rambling Rector** by the north wall.", author=ada)
    email, chat_id = admin.email, chat.id
    db.session.remove()
    # A page of its own: clipboard access granted, and each confirmation answered as the test says.
    context = browser.new_context(
        viewport={"width": 1280, "height": 800}, permissions=["clipboard-read", "clipboard-write"]
    )
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        questions, answers = [], [False, True]
        page.on(
            "dialog", lambda d: (questions.append(d.message), d.accept() if answers.pop(0) else d.dismiss())
        )
        sign_in(page, live_server, email)
        page.goto(f"{live_server}/chats/{chat_id}")

        copy = page.locator("article.message.assistant button.copy")  # its name becomes "Copied"
        expect(copy).to_have_text("Copy")
        tap(copy)
        expect(copy).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == "Plant Rambling Rector by the north wall."

        # Discard asks first; "Cancel" keeps the chat as it was.
        discard = page.get_by_role("button", name="Discard this chat")
        tap(discard)
        assert questions == ["Discard “Roses”? You can restore it from Chats → Discarded."]
        page.reload()
        expect(page.get_by_role("heading", name="Roses", level=1)).to_be_visible()
        expect(page.get_by_text("This chat is discarded.")).to_have_count(0)
        # "OK" discards it: back to the chats, where it is no longer listed.
        tap(discard)
        expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()
        expect(page.locator("#chat-list")).not_to_contain_text("Roses")
        assert len(questions) == 2
    finally:
        context.close()


def test_the_skip_link_and_the_agents_list_on_a_phone(page, live_server):
    admin = factories.user(factories.account(), "dana@example.com", "admin")
    factories.agent(admin.account, "Ada", model_id="a-rather-long-provider/model-name-for-ada")
    factories.agent(admin.account, "Basil")
    email = admin.email
    db.session.remove()
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, live_server, email)
    page.goto(f"{live_server}/agents/")

    # The first Tab reaches the skip link; following it puts the focus on the page's content.
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main#main")).to_be_focused()

    check_page(page, "phone", "agents-list")  # no sideways scroll, no serious axe violation
    ada = page.locator("#agent-list tbody tr", has_text="Ada")
    tap(ada.get_by_role("link", name="Memory", exact=True))
    expect(page.get_by_role("heading", name="Ada · memory ledger")).to_be_visible()
    page.go_back()
    tap(ada.get_by_role("link", name="Edit", exact=True))
    expect(page.get_by_role("heading", name="Edit Ada")).to_be_visible()
