"""What the moderator page's browser tests share: Debian's Chromium driven by Playwright, uploads
sent and waited for until reviewable, a moderator driving the page by mouse and keys (each step
waits until the page has finished what it started), what the API and the store say of an item,
and axe-core's rules run in the page.

axe-core is the copy the PyPI package `axe-playwright-python` ships (its script only: the test
injects it and calls `axe.run` itself, with the AAA contrast and target-size rules turned on).
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import shutil
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from PIL import Image
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import FloatRect, Locator, Page, ViewportSize

from headrace.pipelines.moderation.review import CLAIM
from headrace.store.protocol.tasks import Store
from tests.integration.processes import read
from tests.services import unavailable

from .server import Server

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
# axe-core's rules the page must pass, besides those on by default: AAA contrast (7:1) and the
# size of what a finger presses (24 px).
AXE_OPTIONS = {
    "rules": {"color-contrast-enhanced": {"enabled": True}, "target-size": {"enabled": True}},
    "resultTypes": ["violations"],
}
RED, BLUE = (220, 0, 0), (0, 0, 220)

Upload = tuple[str, str, bytes]  # file name, media type, bytes


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        unavailable("chromium is not installed (apt-get install -y chromium)", "the page tests")
    return found


def screenshots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("HEADRACE_SCREENSHOTS", tmp_path))
    where.mkdir(parents=True, exist_ok=True)
    return where


def banded_portrait(width: int = 600, height: int = 1000) -> bytes:
    """A portrait photo, grey with a red band along its top and a blue one along its bottom:
    both bands show only when the whole picture does."""
    image = Image.new("RGB", (width, height), (128, 128, 128))
    band = height // 12
    image.paste(RED, (0, 0, width, band))
    image.paste(BLUE, (0, height - band, width, height))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def bands_seen(png: bytes) -> tuple[int, int]:
    """Pixels near pure red and near pure blue in a screenshot."""
    pixels = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    red = blue = 0
    for r, g, b in zip(pixels[0::3], pixels[1::3], pixels[2::3], strict=True):
        red += r > 180 and g < 60 and b < 60
        blue += b > 180 and r < 60 and g < 60
    return red, blue


def send(
    server: Server, uploads: list[Upload], *, settled: tuple[str, ...] = (), in_order: bool = False
) -> list[str]:
    """The uploads sent at once, then waited for until reviewable (or one of `settled`); their
    media ids in the order sent. `in_order`: each waited for before the next is sent, so that
    the page lists them in that order (else in the order they became reviewable)."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        ids: list[str] = []
        for name, media_type, data in uploads:
            answer = client.post(
                "/v1/events/gala/uploads",
                headers=server.auth("uploader"),
                files={"file": (name, data, media_type)},
            )
            assert answer.status_code == 202, answer.text
            ids.append(str(answer.json()["media_id"]))
            if in_order:
                settle(server, client, ids[-1:], settled)
        settle(server, client, ids, settled)
    return ids


def settle(server: Server, client: httpx.Client, ids: list[str], settled: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 60
    waiting = set(ids)
    while waiting:
        for media_id in list(waiting):
            state = item(server, media_id, client)["state"]
            if state == "reviewable" or state in settled:
                waiting.discard(media_id)
        assert time.monotonic() < deadline, f"never reviewable: {waiting}"
        time.sleep(0.1)


def item(server: Server, media_id: str, client: httpx.Client | None = None) -> dict[str, Any]:
    """The item as the API shows it to an admin."""
    if client is None:
        with httpx.Client(base_url=server.url, timeout=30) as own:
            return item(server, media_id, own)
    answer = client.get(f"/v1/items/{media_id}", headers=server.auth("admin"))
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def decisions(server: Server, ids: list[str]) -> dict[str, tuple[str, str | None, str | None]]:
    """Each item's (state, who decided it, the reason), as the API says."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        found = {media_id: item(server, media_id, client) for media_id in ids}
    return {
        media_id: (view["state"], view["decided_by"], view["decision_reason"])
        for media_id, view in found.items()
    }


def claims(server: Server) -> dict[str, str]:
    """Each claim record's state in the store (`held:<moderator>` or `free`), by media id."""

    async def query(store: Store) -> dict[str, str]:
        return {
            r.id: r.state for r in await store.records.list_records(CLAIM, scope="gala", limit=500)
        }

    # Playwright's sync API keeps an event loop in this thread: the store is read in another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(read, server.db, query).result()


def sign_in(page: Page, server: Server, who: str) -> None:
    """Sign in with the mouse and wait until the page has its first item."""
    page.goto(f"{server.url}/login")
    page.fill("#token", server.tokens[who])
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/moderate/gala*")
    page.wait_for_function("() => document.body.dataset.ready === 'yes'")


def width(page: Page) -> int:
    """The page's viewport width, in CSS pixels."""
    size = page.viewport_size
    assert size is not None
    return size["width"]


def within_width(page: Page, target: Locator) -> FloatRect:
    """`target`'s box, asserted to lie within the page's width (nothing cut off at a side)."""
    box = target.bounding_box()
    assert box is not None, target
    assert box["x"] >= 0 and box["x"] + box["width"] <= width(page), box
    return box


def listed(page: Page) -> list[str]:
    """The media ids the page lists, in its order."""
    return [str(li.get_attribute("data-media-id")) for li in page.locator("#items > li.item").all()]


def axe(page: Page) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now."""
    script = resources.files("axe_playwright_python").joinpath("axe.min.js").read_text()
    page.evaluate(script)
    found: list[dict[str, Any]] = page.evaluate(
        "options => axe.run(document, options)", AXE_OPTIONS
    )["violations"]
    return found


def described(violations: list[dict[str, Any]]) -> list[str]:
    return [f"{v['id']}: {[n['target'] for n in v['nodes']]}" for v in violations]


@dataclass
class Moderator:
    """A moderator's page, driven as a person does: the mouse on what shows, and keys."""

    page: Page

    def card(self, media_id: str) -> Locator:
        return self.page.locator(f"#item-{media_id}")

    def actions(self) -> int:
        return int(self.page.evaluate("() => Number(document.body.dataset.actions || 0)"))

    def press(self, *keys: str) -> None:
        """Press `keys`, then wait until the page has finished the action they started."""
        before = self.actions()
        for key in keys:
            self.page.keyboard.press(key)
        self.wait_actions(before)

    def click(self, target: Locator) -> None:
        """Click a button (the page acts), then wait until the page has finished."""
        before = self.actions()
        target.click()
        self.wait_actions(before)

    def wait_actions(self, before: int) -> None:
        self.page.wait_for_function(
            "n => Number(document.body.dataset.actions || 0) > n", arg=before, timeout=15_000
        )

    def current(self) -> str:
        return str(self.page.evaluate("() => document.body.dataset.current || ''"))

    def wait_current(self, media_id: str, *, held: bool = True) -> None:
        """Until `media_id` is the current item (and, with `held`, its claim is the page's)."""
        try:
            self.page.wait_for_function(
                "([id, held]) => document.body.dataset.current === id"
                " && (!held || document.body.dataset.held === id)",
                arg=[media_id, held],
                timeout=15_000,
            )
        except PlaywrightError as error:
            now = self.page.evaluate(
                "() => [document.body.dataset.current, document.body.dataset.held]"
            )
            raise AssertionError(
                f"{media_id} is not the current item: current, held = {now}; {self.status()!r}"
            ) from error

    def status(self) -> str:
        return self.page.inner_text("#status")

    def checks(self) -> int:
        return int(self.page.evaluate("() => Number(document.body.dataset.checks || 0)"))

    def wait_checks(self, n: int) -> None:
        """Until the page has asked the service what changed `n` more times."""
        before = self.checks()
        self.page.wait_for_function(
            "n => Number(document.body.dataset.checks || 0) >= n", arg=before + n, timeout=15_000
        )
