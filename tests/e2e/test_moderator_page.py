"""The moderator page in real headless Chromium (Debian's package, driven by Playwright): sign
in, a stable list while uploads arrive, the new-items boundary, approve and reject, and two
moderators approving one item at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from headrace.pipelines.moderation import samples
from headrace.store.protocol.records import AuditRow, OutboxRow
from headrace.store.protocol.tasks import Store
from tests.integration.processes import read

from . import root_network
from .page_driver import CHROMIUM_ARGS, chromium, item, listed, screenshots, sign_in
from .server import Server, serving

# A browser test may first wait for the multi-host test to give the network back.
pytestmark = [pytest.mark.realtime, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path) as running:
        yield running


def upload(server: Server, n: int) -> list[str]:
    """`n` photos, each waited for until reviewable; their media ids in that order."""
    ids: list[str] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(n):
            answer = client.post(
                "/v1/events/gala/uploads",
                headers=server.auth("uploader"),
                files={"file": ("p.jpg", samples.jpeg(800, 600, shade=len(ids) * 30))},
            )
            assert answer.status_code == 202, answer.text
            media_id = answer.json()["media_id"]
            deadline = time.monotonic() + 60
            while (
                client.get(f"/v1/items/{media_id}", headers=server.auth("moderator")).json()[
                    "state"
                ]
                != "reviewable"
            ):
                assert time.monotonic() < deadline, f"{media_id} never became reviewable"
                time.sleep(0.1)
            ids.append(media_id)
    return ids


def test_a_moderator_reviews_in_a_stable_order_and_crosses_the_new_items_boundary(
    server: Server, tmp_path: Path
) -> None:
    first = upload(server, 3)
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            wrong = page.goto(f"{server.url}/login")
            assert wrong is not None and wrong.ok
            page.fill("#token", "hr_not-a-token")
            page.click("button[type=submit]")
            assert "does not sign a moderator in" in page.inner_text(".error")
            sign_in(page, server, "moderator")
            assert listed(page) == first
            assert page.locator("#no-new").is_visible()
            later = upload(server, 2)  # they arrive while the moderator looks
            # the line counts each as it becomes reviewable: wait for both
            page.wait_for_selector("#show-new:has-text('Show 2 new items')", timeout=15_000)
            assert listed(page) == first  # nothing moved under the cursor
            page.screenshot(path=str(screenshots(tmp_path) / "moderator-page.png"), full_page=True)
            page.click("#show-new")
            page.wait_for_load_state()
            assert listed(page) == first + later
            page.click(f"#item-{first[0]} button.approve")
            page.wait_for_selector("#status:has-text('Approved: the photo from')")
            page.click(f"#item-{first[1]} button.reject")
            page.click("#reasons button.reason >> nth=0")
            page.wait_for_selector("#status:has-text('Rejected: the photo from')")
            # decided where they are: nothing moved
            assert listed(page) == first + later
            assert page.locator("li.item.decided").count() == 2
            preview = page.locator(f"#item-{first[2]} img")
            assert preview.evaluate("image => image.naturalWidth") > 0  # the thumbnail loads
        finally:
            browser.close()
    states = item_states(server, first[:2])
    assert states == {first[0]: "approved", first[1]: "rejected"}
    assert item(server, first[1])["decision_reason"] == "off_topic"  # the reason clicked


def test_two_moderators_approving_one_item_at_once_converge(server: Server) -> None:
    [media_id] = upload(server, 1)
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            pages = []
            for who in ("moderator", "moderator-2"):
                # the forms, as a browser without the page's script sends them
                page = browser.new_context(java_script_enabled=False).new_page()
                page.goto(f"{server.url}/login")
                page.fill("#token", server.tokens[who])
                page.click("button[type=submit]")
                page.wait_for_url(f"{server.url}/moderate/gala*")
                pages.append(page)
            forms = [p.locator(f"#item-{media_id} form.approve") for p in pages]
            # Both submit before either answer comes back.
            for form in forms:
                form.evaluate("form => form.requestSubmit()")
            for page in pages:
                page.wait_for_selector(".notice")
            notices = [page.inner_text(".notice") for page in pages]
            # the second finds it decided, or (still) claimed by the first
            assert notices.count("Approved.") == 1
            [other] = [notice for notice in notices if notice != "Approved."]
            assert other in (
                "Someone decided that item already.",
                "Another moderator is reviewing that item.",
            )
        finally:
            browser.close()
    audit, outbox = read(server.db, lambda store: trail(store, media_id))
    reviews = [row for row in audit if row.action == "review.approved"]
    assert sorted(row.actor for row in reviews) == ["moderator", "moderator-2"]
    outcomes = sorted(row.outcome for row in reviews)
    assert outcomes[0] == "applied" and outcomes[1].startswith("unchanged: ")
    assert [(n.topic, n.record_id) for n in outbox] == [("item.approved", media_id)]
    assert item_states(server, [media_id]) == {media_id: "approved"}


async def trail(store: Store, media_id: str) -> tuple[list[AuditRow], list[OutboxRow]]:
    return await store.records.audit_log(record_id=media_id), await store.records.outbox(
        pending=False
    )


def item_states(server: Server, ids: list[str]) -> dict[str, str]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        return {
            media_id: client.get(f"/v1/items/{media_id}", headers=server.auth("admin")).json()[
                "state"
            ]
            for media_id in ids
        }
