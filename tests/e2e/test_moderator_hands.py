"""The moderator page's one current item, in real headless Chromium: clicks and keys mixed on
every action (approve, reject, undo, select, play, release), each decision checked through the
API for the item it reached, the claim checked in the store; and the rule that sound and video
are played to the end before they are approved, whatever asks (a card's button, the key, the
selection)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from headrace.pipelines.moderation import samples

from . import root_network
from .page_driver import (
    CHROMIUM_ARGS,
    Moderator,
    chromium,
    claims,
    decisions,
    listed,
    send,
    sign_in,
)
from .server import Server, serving

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(300)]

UNDO_WINDOW = "300"  # long enough that no step of a slow run reaches its end


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path, "--undo-window", UNDO_WINDOW) as running:
        yield running


def photos(n: int) -> list[tuple[str, str, bytes]]:
    return [
        (f"p{k}.jpg", "image/jpeg", samples.jpeg(320, 240, gps=False, shade=k * 40))
        for k in range(n)
    ]


def test_a_click_and_a_key_act_on_the_item_they_name(server: Server) -> None:
    ids = send(server, photos(6))
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 600}).new_page()
            errors = watch(page)
            sign_in(page, server, "moderator")
            m = Moderator(page)
            # the list's order: as they became reviewable
            p1, p2, p3, p4, p5, p6 = listed(page)
            assert sorted(listed(page)) == sorted(ids)
            m.wait_current(p1)

            # A click anywhere on a card makes it the current item: `a` then approves what was
            # clicked; the claim followed it there, and on to the next item.
            m.card(p4).locator(".facts").click()
            m.press("a")
            assert decisions(server, [p1, p4]) == {
                p1: ("reviewable", None, None),
                p4: ("approved", "moderator", None),
            }
            m.wait_current(p5)
            assert claims(server) == {p1: "free", p5: "held:moderator"}  # p4's went with it
            # the confirmation and its undo hint outlive the next item's focus
            assert m.status().startswith("Approved: the photo from ")
            assert "u (or its Undo button) undoes it" in m.status()
            # the decided card drops its count, the others show it less one
            assert not m.card(p4).locator(".pending").is_visible()
            assert m.card(p5).locator(".pending").inner_text() == "5 pending"

            # A card's own button acts on that card, whatever was current.
            m.click(m.card(p2).locator("button.approve"))
            assert decisions(server, [p2, p5])[p2] == ("approved", "moderator", None)
            assert decisions(server, [p5])[p5][0] == "reviewable"
            m.wait_current(p3)

            # u undoes the last decision: that item is current again, and not counted as new.
            m.press("u")
            assert decisions(server, [p2])[p2] == ("reviewable", None, None)
            m.wait_current(p2)
            m.wait_checks(2)
            assert page.locator("#show-new").count() == 0
            assert page.locator("#no-new").is_visible()

            # Tab moves focus into the next card: it becomes current, its claim the page's; r
            # then opens the reasons for it, and a click on one files it.
            tab_into(page, p3)
            m.wait_current(p3)
            page.keyboard.press("r")
            page.locator("#reasons").get_by_role("button", name="offensive or hateful").click()
            m.wait_current(p5)
            assert decisions(server, [p3])[p3] == ("rejected", "moderator", "offensive")

            # The page scrolled until the current item is out of view: the open item in view
            # takes its place (and its claim), and a key acts on that one.
            assert m.current() == p5
            page.mouse.move(640, 400)
            page.mouse.wheel(0, -5000)
            m.wait_current(p1)
            assert claims(server)[p5] == "free"
            m.press("a")
            assert decisions(server, [p1, p5]) == {
                p1: ("approved", "moderator", None),
                p5: ("reviewable", None, None),
            }
            m.wait_current(p5)

            # Select by key (x: the current item) and by mouse (a card's checkbox, which makes
            # that card current); Esc clears the selection and its line; the bar's button
            # decides what is selected.
            m.press("x")
            m.card(p6).get_by_role("checkbox", name="Select").check()
            assert selected(page) == {p5, p6}
            assert "2 pending items of guest-" in page.inner_text("#selection")
            m.press("Escape")
            assert selected(page) == set()
            assert not page.locator("#selection").is_visible()
            m.card(p6).get_by_role("checkbox", name="Select").check()
            m.click(page.locator("#bulk-approve"))
            assert decisions(server, [p5, p6]) == {
                p5: ("reviewable", None, None),
                p6: ("approved", "moderator", None),
            }

            # A decided card's own Undo button undoes that decision (not the last one).
            m.click(m.card(p4).get_by_role("button", name="Undo"))
            assert decisions(server, [p1, p4]) == {
                p1: ("approved", "moderator", None),
                p4: ("reviewable", None, None),
            }
            m.wait_current(p4)

            # The current item leaves (an admin takes its claim and decides it): the next
            # item nobody holds becomes current, and a key acts on it.
            admin_decides(server, p4)
            m.wait_current(p5)
            assert "approved by admin" in m.card(p4).locator(".state").inner_text()
            m.press("a")
            assert decisions(server, [p5])[p5] == ("approved", "moderator", None)

            # An admin releases a claim another moderator holds, from that item's card.
            m.card(p2).locator(".facts").click()
            m.wait_current(p2)
            admin = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            errors += watch(admin)
            sign_in(admin, server, "admin")
            release = Moderator(admin).card(p2).get_by_role("button", name="Release claim")
            release.wait_for()
            admin.once("dialog", lambda asked: asked.accept("left for the day"))
            Moderator(admin).click(release)
            assert claims(server)[p2] == "free"
            assert "Released" in Moderator(admin).status()
            assert decisions(server, [p2])[p2] == ("reviewable", None, None)
        finally:
            browser.close()
    assert errors == []


def test_sound_and_video_are_approved_only_once_played_to_the_end(server: Server) -> None:
    sent = send(
        server,
        [
            ("n.wav", "audio/wav", samples.voice_note(1.0)),
            ("c.mp4", "video/mp4", samples.mp4(0.8, 160, 120)),
            ("p.jpg", "image/jpeg", samples.jpeg(320, 240, gps=False)),
            ("m.wav", "audio/wav", samples.voice_note(1.2)),
        ],
        in_order=True,
    )
    with root_network.browsing(), sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            errors = watch(page)
            sign_in(page, server, "moderator")
            m = Moderator(page)
            # in the order sent: each waited for before the next was sent
            assert listed(page) == sent
            note, clip, photo, other_note = sent
            m.wait_current(note)
            # Each recording and video shows its length before it is played.
            assert m.card(note).locator(".length").inner_text() == "length 0:01"
            assert m.card(clip).locator(".length").inner_text() == "length 0:01"
            assert m.card(other_note).locator(".length").inner_text() == "length 0:02"

            # The card's Approve before it played: nothing is filed, it plays instead.
            m.click(m.card(note).get_by_role("button", name="Approve"))
            assert decisions(server, [note])[note][0] == "reviewable"
            assert "to the end first. It plays now." in m.status()
            played(page, note)
            m.press("a")
            assert decisions(server, [note])[note] == ("approved", "moderator", None)

            # The key before it played: the same rule. Space pauses, the card's Play button
            # plays on; then the card's Approve files it.
            m.wait_current(clip)
            m.press("a")
            assert decisions(server, [clip])[clip][0] == "reviewable"
            m.press(" ")
            assert page.evaluate(f"() => document.querySelector('#item-{clip} video').paused")
            m.click(m.card(clip).get_by_role("button", name="Play"))
            played(page, clip)
            m.click(m.card(clip).get_by_role("button", name="Approve"))
            assert decisions(server, [clip])[clip] == ("approved", "moderator", None)

            # The selection: its approval takes what may be approved (the photo), and leaves
            # what has not played selected, marked, and said; once played, it is approved too.
            m.wait_current(photo)
            m.card(photo).get_by_role("checkbox", name="Select").check()
            m.card(other_note).get_by_role("checkbox", name="Select").check()
            m.click(page.locator("#bulk-approve"))
            assert m.status().startswith("1 approved. Not approved: 1 not played to the end yet")
            assert decisions(server, [photo, other_note]) == {
                photo: ("approved", "moderator", None),
                other_note: ("reviewable", None, None),
            }
            assert selected(page) == {other_note}
            assert m.card(other_note).locator(".unplayed-note").is_visible()
            m.press("a")
            assert m.status().startswith("Nothing approved: 1 not played to the end yet")
            assert decisions(server, [other_note])[other_note][0] == "reviewable"
            m.click(m.card(other_note).get_by_role("button", name="Play"))
            played(page, other_note)
            assert not m.card(other_note).locator(".unplayed-note").is_visible()
            m.press("a")
            assert decisions(server, [other_note])[other_note] == ("approved", "moderator", None)
        finally:
            browser.close()
    assert errors == []


def watch(page: Page) -> list[str]:
    """The page's script errors and console errors, as they come."""
    seen: list[str] = []
    page.on("pageerror", lambda error: seen.append(str(error)))
    page.on(
        "console",
        lambda line: (
            seen.append(f"{line.text} ({line.location.get('url')})")
            if line.type == "error"
            else None
        ),
    )
    return seen


def tab_into(page: Page, media_id: str) -> None:
    """Press Tab until the focus is inside the item's card."""
    for _ in range(20):
        page.keyboard.press("Tab")
        inside = page.evaluate(
            "id => { const li = document.activeElement.closest('li.item');"
            " return !!li && li.dataset.mediaId === id; }",
            media_id,
        )
        if inside:
            return
    raise AssertionError(f"Tab never reached {media_id}")


def selected(page: Page) -> set[str]:
    found: list[str] = page.evaluate(
        "() => Array.from(document.querySelectorAll('li.item.selected'), li => li.dataset.mediaId)"
    )
    return set(found)


def played(page: Page, media_id: str) -> None:
    page.wait_for_function(
        "id => { const m = document.querySelector(`#item-${id} audio, #item-${id} video`);"
        " return m && m.ended; }",
        arg=media_id,
        timeout=15_000,
    )


def admin_decides(server: Server, media_id: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30, headers=server.auth("admin")) as client:
        released = client.post(
            f"/v1/items/{media_id}/claim/release", json={"reason": "taking it over"}
        )
        assert released.json() == {"released": True}, released.text
        assert client.post(f"/v1/items/{media_id}/approve").status_code == 200
