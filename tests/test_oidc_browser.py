"""Sign-in through the identity provider in a real browser, on a desktop (1280x800) and a phone (390x844): a
newcomer of an allowed domain presses "Sign in with Acme ID", approves at the provider (oidc-provider-mock) and
lands in their chats; signing out offers the provider's sign-out; someone of another domain is told why not; the
admin's People page says how each person signs in. axe-core and screenshots on each of Cairn's pages."""

import pytest
from playwright.sync_api import Page, expect

from tests import factories, oidc_provider
from tests.conftest import _database_for_test, _in_context, _settings
from tests.oidc_provider import oidc_settings
from tests.test_first_hour_browser import check_page, size, tap  # noqa: F401  (size: the viewport fixture)
from tests.test_phone_browser import open_menu
from webapp.extensions import db
from webapp.factory import create_app

pytestmark = pytest.mark.browser

provider = oidc_provider.provider  # the fixture


@pytest.fixture
def live_app(migrated_database, tmp_path, redis_server, fake_llm, provider):
    """conftest's live app, signing people in through `provider` too."""
    settings = _settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url)
    yield from _in_context(create_app({**settings, "REDIS_URL": redis_server, **oidc_settings(provider)}))


def _through_the_provider(page: Page, sub: str) -> None:
    tap(page.get_by_role("button", name="Sign in with Acme ID"))
    expect(page.get_by_role("heading", name="Authorize Client")).to_be_visible()  # the provider's own page
    page.locator("input[name=sub]").fill(sub)
    page.get_by_role("button", name="Authorize").click()


def test_signing_in_through_the_identity_provider(page, size, live_server, provider):  # noqa: F811
    factories.user(factories.account("Acme"), "dana@example.com", "admin")
    db.session.commit()
    db.session.remove()
    provider.person("sam-1", email="sam@example.com", email_verified=True, name="Sam Lee")
    provider.person("eve-1", email="eve@elsewhere.example", email_verified=True)

    page.goto(f"{live_server}/login")
    check_page(page, size, "01-sign-in", prefix="oidc")
    _through_the_provider(page, "sam-1")
    expect(page.get_by_role("heading", name="Chats", level=1)).to_be_visible()
    expect(page.locator("header")).to_contain_text("sam@example.com")
    check_page(page, size, "02-chats", prefix="oidc")

    open_menu(page)
    page.get_by_role("button", name="Sign out").click()  # the bar's small button, as in the other tests
    expect(page.get_by_role("link", name="Sign out of Acme ID too")).to_be_visible()
    check_page(page, size, "03-signed-out", prefix="oidc")

    _through_the_provider(page, "eve-1")
    # By its words: before the page's style sheet applies, the page's empty notice (an alert too) counts as shown.
    refused = page.get_by_role("alert").filter(has_text="new people from elsewhere.example are not let in")
    expect(refused).to_be_visible()
    check_page(page, size, "04-refused", prefix="oidc")

    page.get_by_label("Email").fill("dana@example.com")
    page.get_by_label("Password").fill(factories.PASSWORD)
    tap(page.get_by_role("button", name="Sign in", exact=True))
    open_menu(page)
    tap(page.get_by_role("link", name="People"))
    row = page.locator("#people-list tbody tr", has_text="Sam Lee")
    expect(row).to_contain_text("Acme ID")
    expect(row).to_contain_text("subject sam-1")
    check_page(page, size, "05-people", prefix="oidc")
