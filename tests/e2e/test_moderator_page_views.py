"""What the moderator page shows, in real headless Chromium: every photo whole in the list and
large on demand (a dialog: Enter or a click opens it, Esc or its button closes it, the focus
comes back to the card); the reasons of a rejection (each a button, by click or by its key; a
plain Reject files nothing until one is picked, with or without the page's script); the page
at a phone's width (390 px) and at a desktop's; axe-core's rules, the AAA contrast and target
size among them, on each view. Screenshots at both widths go to HEADRACE_SCREENSHOTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from headrace.pipelines.moderation import samples

from . import root_network
from .page_driver import (
    CHROMIUM_ARGS,
    DESKTOP,
    PHONE,
    Moderator,
    axe,
    banded_portrait,
    bands_seen,
    chromium,
    decisions,
    described,
    listed,
    screenshots,
    send,
    sign_in,
    width,
    within_width,
)
from .server import Server, serving

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path) as running:
        yield running


def test_photos_whole_reasons_by_click_or_key_at_a_phone_and_a_desktop_width(
    server: Server, tmp_path: Path
) -> None:
    ids = send(
        server,
        [
            ("portrait.jpg", "image/jpeg", banded_portrait()),
            ("landscape.jpg", "image/jpeg", samples.jpeg(800, 600, gps=False)),
            ("phone.jpg", "image/jpeg", banded_portrait(480, 800)),
            ("note.wav", "audio/wav", samples.voice_note(1.0)),
            ("clip.mp4", "video/mp4", samples.mp4(0.8, 160, 120)),
        ],
        in_order=True,
    )
    portrait, landscape, phone_photo, note, clip = ids
    send(server, [("cut.jpg", "image/jpeg", samples.truncated_jpeg())], settled=FLAGGED)
    shots = screenshots(tmp_path)
    found: dict[str, list[str]] = {}  # axe-core's violations, by view
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport=DESKTOP).new_page()
            page.goto(f"{server.url}/login")
            found["sign-in, desktop"] = described(axe(page))
            sign_in(page, server, "moderator")
            assert listed(page) == ids
            assert page.locator("li.flagged-item").count() == 1
            found["queue, desktop"] = described(axe(page))
            page.keyboard.press("?")
            found["keys, desktop"] = described(axe(page))
            page.locator("#keys").get_by_role("button", name="Close (Esc)").click()
            page.screenshot(path=str(shots / "moderator-queue-desktop.png"), full_page=True)
            found.update(photo_whole_and_large(Moderator(page), portrait, "desktop", shots))
            found.update(reasons_by_click_and_key(Moderator(page), server, portrait, landscape))

            phone = browser.new_context(viewport=PHONE, has_touch=True).new_page()
            phone.goto(f"{server.url}/login")
            found["sign-in, 390 px"] = described(axe(phone))
            sign_in(phone, server, "moderator")
            phone.screenshot(path=str(shots / "moderator-queue-390px.png"), full_page=True)
            found["queue, 390 px"] = described(axe(phone))
            fits_a_phone(phone)
            moderator = Moderator(phone)
            found.update(photo_whole_and_large(moderator, phone_photo, "390 px", shots))
            found.update(decided_at_a_phone_width(moderator, server, phone_photo, note, shots))

            without_script(browser, server, clip)
        finally:
            browser.close()
    assert found == {view: [] for view in found}, found
    assert len(found) == 9


FLAGGED = ("refused", "quarantined")


def photo_whole_and_large(
    m: Moderator, media_id: str, width: str, shots: Path
) -> dict[str, list[str]]:
    """A banded portrait (3:5): whole in its card; a click on it opens it large (whole again), Esc
    closes; Enter on the card opens it, the Close button closes; the card has the focus back."""
    page, card = m.page, m.card(media_id)
    thumbnail = card.locator("img")
    thumbnail.scroll_into_view_if_needed()
    page.wait_for_function(
        "image => image.complete && image.naturalWidth > 0", arg=thumbnail.element_handle()
    )
    natural = thumbnail.evaluate("image => image.naturalWidth / image.naturalHeight")
    assert abs(natural - 0.6) < 0.02  # the thumbnail itself is whole: 3:5, as sent
    red, blue = bands_seen(thumbnail.screenshot())
    assert red > 50 and blue > 50, (red, blue)  # both ends show in the list

    thumbnail.click()
    large = page.locator("#preview-image")
    page.wait_for_function(
        "image => image.complete && image.naturalWidth > 0", arg=large.element_handle()
    )
    assert page.locator("#preview").evaluate("d => d.open && d.contains(document.activeElement)")
    assert large.evaluate("image => image.naturalWidth / image.naturalHeight") == 0.6
    red, blue = bands_seen(large.screenshot())
    assert red > 500 and blue > 500, (red, blue)
    within_width(page, page.locator("#preview"))
    page.screenshot(path=str(shots / f"moderator-photo-large-{width.replace(' ', '')}.png"))
    violations = {f"photo large, {width}": described(axe(page))}
    page.keyboard.press("Escape")
    assert not page.locator("#preview").evaluate("d => d.open")
    assert card.evaluate("li => document.activeElement === li")

    page.keyboard.press("Enter")
    assert page.locator("#preview").evaluate("d => d.open")
    page.locator("#preview").get_by_role("button", name="Close (Esc)").click()
    assert not page.locator("#preview").evaluate("d => d.open")
    assert card.evaluate("li => document.activeElement === li")
    return violations


def reasons_by_click_and_key(
    m: Moderator, server: Server, portrait: str, landscape: str
) -> dict[str, list[str]]:
    """A plain Reject opens the reasons and files nothing; its Close button and Esc close it;
    a click on a reason files that one; r then a number files that one."""
    page, dialog = m.page, m.page.locator("#reasons")
    m.card(portrait).get_by_role("button", name="Reject").click()
    assert dialog.evaluate("d => d.open")
    violations = {"reasons, desktop": described(axe(page))}
    assert decisions(server, [portrait])[portrait] == ("reviewable", None, None)
    m.click(dialog.get_by_role("button", name="Close (Esc): reject nothing"))
    assert not dialog.evaluate("d => d.open")
    before = m.actions()  # the r action waits for a reason: it ends when the dialog closes
    page.keyboard.press("r")
    assert dialog.evaluate("d => d.open")
    page.keyboard.press("Escape")
    m.wait_actions(before)
    assert not dialog.evaluate("d => d.open")
    assert decisions(server, [portrait])[portrait] == ("reviewable", None, None)
    assert [row for row in audit(server, portrait) if row["action"].startswith("review.")] == []

    page.keyboard.press("r")
    m.click(dialog.get_by_role("button", name="blurred, dark or silent"))
    assert decisions(server, [portrait])[portrait] == ("rejected", "moderator", "low_quality")
    m.wait_current(landscape)
    m.press("r", "4")
    assert decisions(server, [landscape])[landscape] == ("rejected", "moderator", "explicit")
    return violations


def fits_a_phone(page: Page) -> None:
    """Nothing wider than the screen; every card's Approve and Reject whole on it, at least
    24 px each way, and what a finger pressing their middle reaches."""
    assert page.evaluate("() => document.scrollingElement.scrollWidth") <= width(page)
    buttons = page.locator("li.item:not(.decided) :is(button.approve, button.reject)")
    assert buttons.count() >= 6
    for button in buttons.all():
        button.scroll_into_view_if_needed()
        box = within_width(page, button)
        assert box["width"] >= 24 and box["height"] >= 24, box
        assert button.evaluate(
            "b => { const r = b.getBoundingClientRect();"
            " return document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === b; }"
        )


def decided_at_a_phone_width(
    m: Moderator, server: Server, photo: str, note: str, shots: Path
) -> dict[str, list[str]]:
    """A tap on a card's Approve; a tap on Reject, then on a reason in the dialog."""
    m.card(photo).get_by_role("button", name="Approve").tap()
    m.page.wait_for_function(
        f"() => document.querySelector('#item-{photo}').dataset.state !== 'reviewable'"
    )
    assert decisions(server, [photo])[photo] == ("approved", "moderator", None)
    m.card(note).get_by_role("button", name="Reject").tap()
    dialog = m.page.locator("#reasons")
    within_width(m.page, dialog)
    m.page.screenshot(path=str(shots / "moderator-reasons-390px.png"))
    violations = {"reasons, 390 px": described(axe(m.page))}
    dialog.get_by_role("button", name="another reason").tap()
    m.page.wait_for_function(
        f"() => document.querySelector('#item-{note}').dataset.state !== 'reviewable'"
    )
    assert decisions(server, [note])[note] == ("rejected", "moderator", "other")
    return violations


def without_script(browser: Browser, server: Server, media_id: str) -> None:
    """Without the page's script the card's forms decide: Reject sends nothing until a reason
    is chosen (none is chosen to begin with), then sends that one."""
    page = browser.new_context(viewport=DESKTOP, java_script_enabled=False).new_page()
    page.goto(f"{server.url}/login")
    page.fill("#token", server.tokens["moderator"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/moderate/gala*")
    form = page.locator(f"#item-{media_id} form.reject")
    assert form.locator("select").input_value() == ""
    form.get_by_role("button", name="Reject").click()
    assert form.locator("select").evaluate("s => !s.validity.valid")
    assert decisions(server, [media_id])[media_id] == ("reviewable", None, None)
    form.locator("select").select_option("personal_data")
    form.get_by_role("button", name="Reject").click()
    page.wait_for_selector(".notice")
    assert page.inner_text(".notice") == "Rejected."
    assert decisions(server, [media_id])[media_id] == ("rejected", "moderator", "personal_data")


def audit(server: Server, media_id: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        answer = client.get(f"/v1/items/{media_id}/audit", headers=server.auth("admin"))
        assert answer.status_code == 200, answer.text
        rows: list[dict[str, Any]] = answer.json()
    return rows
