"""Passing things on, in a real browser on a desktop and on a phone (issue 32): a sign-in link (Copy, E-mail,
selected whole on focus), an agent file whose name is taken (a free name offered, the file kept), and the account
page's addresses and ready-made configs for other apps. axe-core on every page; screenshots kept."""

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from playwright.sync_api import Page, expect

from tests import factories
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from tests.test_phone_browser import SMALLEST, _sign_in, _small_targets
from webapp.extensions import db

pytestmark = pytest.mark.browser


def _look(page: Page, size: str, name: str) -> None:  # noqa: F811
    check_page(page, size, name, prefix="passing-on", full_page=True)
    if size == "phone":
        assert _small_targets(page) == [], f"smaller than {SMALLEST} px"


def _selected_whole(page: Page, selector: str) -> bool:
    return page.evaluate(
        """(selector) => { const box = document.querySelector(selector);
            return document.activeElement === box && box.selectionStart === 0
              && box.selectionEnd === box.value.length && box.value.length > 0; }""",
        selector,
    )


def test_a_sign_in_link_is_copied_or_e_mailed(page, size, live_server):  # noqa: F811
    factories.user(factories.account("Acme"), "dana@example.com", "admin")
    db.session.remove()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    _sign_in(page, live_server, "dana@example.com")

    page.goto(f"{live_server}/people/new")
    page.get_by_label("Name", exact=True).fill("Sam Lee")
    page.get_by_label("E-mail", exact=True).fill("sam@example.com")
    tap(page.get_by_role("button", name="Add person"))
    box = page.get_by_label("Sign-in link")
    link = box.input_value()
    assert "/welcome/" in link
    _look(page, size, "01-sign-in-link")

    tap(box)  # a tap selects all of it, ready to copy by hand
    assert _selected_whole(page, "#sign-in-link")
    page.get_by_role("button", name="Copy link").focus()
    page.keyboard.press("Shift+Tab")  # and so does the keyboard
    assert _selected_whole(page, "#sign-in-link")

    copy = page.locator("button[data-copy='#sign-in-link']")
    tap(copy)
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == link

    mail = page.get_by_role("link", name="E-mail it to Sam Lee")
    href = mail.get_attribute("href")
    address, _, query = href.removeprefix("mailto:").partition("?")
    assert address == "sam@example.com"
    assert parse_qs(query)["subject"] == ["Your sign-in link for Acme on Cairn"]
    assert link in parse_qs(query)["body"][0]


def test_an_import_with_a_taken_name_keeps_the_file_and_offers_a_free_name(page, size, live_server, tmp_path):  # noqa: F811
    admin = factories.user(factories.account("Acme"), "dana@example.com", "admin")
    factories.agent(admin.account, "Ada")
    db.session.remove()
    _sign_in(page, live_server, "dana@example.com")
    page.goto(f"{live_server}/agents/1/edit")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download", exact=True).click()
    named = tmp_path / "ada.cairn.json"
    named.write_bytes(Path(download.value.path()).read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("Shopping: bread, tea, roses.\n")

    page.goto(f"{live_server}/agents/")
    page.get_by_label("Agent file", exact=False).set_input_files(str(notes))
    tap(page.get_by_role("button", name="Import agent"))
    expect(page.locator("#import-agent")).to_contain_text("The file is not an agent file: it is not JSON.")
    expect(page.locator("#import-agent")).not_to_contain_text("cut short")

    page.get_by_label("Agent file", exact=False).set_input_files(str(named))
    tap(page.get_by_role("button", name="Import agent"))
    expect(page.locator("#import-agent")).to_contain_text(
        "An agent named 'Ada' is in account 'Acme' already."
    )
    expect(page.locator("#import-agent")).to_contain_text("“Ada 2” is free")
    expect(page.get_by_label("Name here", exact=False)).to_have_value("Ada 2")
    expect(page.locator("#kept-file")).to_contain_text(
        "The file ada.cairn.json is kept: no need to choose it again."
    )
    _look(page, size, "02-import-name-taken")

    tap(page.get_by_role("button", name="Import agent"))  # the name offered, the file not chosen again
    expect(page.get_by_role("heading", name="Ada 2 · memory ledger")).to_be_visible()
    expect(page.locator(".flash")).to_contain_text("Imported Ada 2")


def test_the_account_page_gives_the_addresses_and_configs_to_copy(page, size, live_server):  # noqa: F811
    member = factories.user(factories.account("Acme"), "milo@example.com", "member")
    factories.agent(member.account, "Ada")
    db.session.remove()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    _sign_in(page, live_server, "milo@example.com")

    page.goto(f"{live_server}/account")
    expect(page.get_by_label("Base URL for OpenAI clients")).to_have_value(f"{live_server}/v1")
    expect(page.get_by_label("MCP address of Ada", exact=False)).to_have_value(f"{live_server}/mcp/ada")
    _look(page, size, "03-account-connect")

    tap(page.get_by_role("button", name="Copy the base URL"))
    assert page.evaluate("navigator.clipboard.readText()") == f"{live_server}/v1"
    tap(page.locator("summary", has_text="MCP client (mcpServers JSON)"))
    tap(page.get_by_role("button", name="Copy the MCP client (mcpServers JSON) config"))
    copied = json.loads(page.evaluate("navigator.clipboard.readText()"))
    assert copied["mcpServers"]["cairn-ada"]["url"] == f"{live_server}/mcp/ada"
    tap(page.locator("summary", has_text="LibreChat"))
    expect(page.locator("#config-librechat")).to_contain_text(f'baseURL: "{live_server}/v1"')
    _look(page, size, "04-account-configs-open")
