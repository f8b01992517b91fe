"""Signing out of the moderator page, in real headless Chromium (Debian's package, driven by
Playwright): the item in the moderator's focus is free for another moderator at once, who sees
it open and decides it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from . import root_network
from .page_driver import CHROMIUM_ARGS, chromium, sign_in
from .server import Server, serving
from .test_moderator_page import upload

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(300)]

POLL = 10_000  # ms: the page asks who holds what every two seconds


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path) as running:
        yield running


def test_signing_out_with_the_mouse_frees_the_item_in_focus_for_another_moderator(
    server: Server,
) -> None:
    first, _ = upload(server, 2)
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            ana = browser.new_context().new_page()
            sign_in(ana, server, "moderator")
            ana.wait_for_selector("body[data-ready=yes]")
            assert ana.get_attribute(f"#item-{first}", "aria-current") == "true"  # claimed
            ben = browser.new_context().new_page()
            sign_in(ben, server, "moderator-2")
            ben.wait_for_selector("body[data-ready=yes]")
            ben.wait_for_selector(f"#item-{first}[data-holder=moderator]")  # hers, skipped

            ana.get_by_role("button", name="Sign out").click()
            ana.wait_for_url(f"{server.url}/login")

            ben.wait_for_selector(f"#item-{first}:not([data-holder])", timeout=POLL)
            ben.click(f"#item-{first} button.approve")
            ben.wait_for_selector("#status:has-text('Approved: the photo from')")
        finally:
            browser.close()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        item = client.get(f"/v1/items/{first}", headers=server.auth("admin")).json()
    assert (item["state"], item["decided_by"]) == ("approved", "moderator-2")
    # The page sent no release after signing out (it would be refused: the sign-in is over).
    refused = [line for line in server.log if "/release/" in line and " 401 " in line]
    assert refused == []
