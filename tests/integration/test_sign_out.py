"""Signing out gives back, on the server, every claim the moderator holds: another moderator
takes those items at once instead of waiting for the claims to lapse. A client of the API
gives its moderator's claims back with `POST /v1/claims/release`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headrace.pipelines.moderation.review import CLAIM
from headrace.service.api.auth import Role, create_token

from .api import Harness, error_code, form_token_of, harness, sign_in, waiting_items

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread, real sockets


async def second_moderator(h: Harness) -> None:
    h.tokens["moderator-2"] = await create_token(
        h.moderation.app.store, name="moderator-2", role=Role.MODERATOR, events=["gala"]
    )


async def test_signing_out_frees_the_items_the_moderator_held_for_others_at_once(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        await second_moderator(h)
        first, second = await waiting_items(h, 2)
        await sign_in(h, "moderator")
        page = await h.client.get("/moderate/gala")
        token = form_token_of(page)
        headers = {"X-Form-Token": token}
        handed = await h.client.post(
            "/moderate/gala/next", json={"after": 0, "upto": 2**40}, headers=headers
        )
        assert handed.json()["media_id"] == first  # the item in focus is hers
        taken = await h.client.post(f"/v1/items/{second}/claim", headers=h.auth("moderator"))
        assert taken.json()["holder"] == "moderator"  # and one more, by her API client
        refused = await h.client.post(f"/v1/items/{first}/claim", headers=h.auth("moderator-2"))
        assert refused.status_code == 409 and error_code(refused) == "claimed"

        out = await h.client.post("/logout", data={"form_token": token})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        # What the page used to send after signing out is refused: the server did it already.
        late = await h.client.post(f"/moderate/gala/release/{first}", json={}, headers=headers)
        assert late.status_code == 401

        for media_id in (first, second):
            answer = await h.client.post(
                f"/v1/items/{media_id}/approve", headers=h.auth("moderator-2")
            )
            assert answer.status_code == 200 and answer.json()["applied"] is True
        rows = await h.moderation.app.store.records.audit_log(kind=CLAIM, record_id=first)
        assert [(r.action, r.actor, r.outcome, dict(r.detail)) for r in rows][-2:] == [
            ("claim.released", "moderator", "applied", {"reason": "signed out"}),
            ("claim.taken", "moderator-2", "applied", {}),
        ]


async def test_an_api_client_gives_back_every_claim_its_moderator_holds(
    tmp_path: Path, store_url: str
) -> None:
    async with harness(tmp_path, url=store_url) as h:
        await second_moderator(h)
        ids = await waiting_items(h, 3)
        for media_id in ids[:2]:
            await h.client.post(f"/v1/items/{media_id}/claim", headers=h.auth("moderator"))
        await h.client.post(f"/v1/items/{ids[2]}/claim", headers=h.auth("moderator-2"))
        released = await h.client.post("/v1/claims/release", headers=h.auth("moderator"))
        assert released.status_code == 200 and released.json() == {"released": 2}
        again = await h.client.post("/v1/claims/release", headers=h.auth("moderator"))
        assert again.json() == {"released": 0}
        live = await h.moderation.reviews.claims("gala")
        assert {m: claim.holder for m, claim in live.items()} == {ids[2]: "moderator-2"}
        uploader = await h.client.post("/v1/claims/release", headers=h.auth("uploader"))
        assert uploader.status_code == 403 and error_code(uploader) == "forbidden"
        nobody = await h.client.post("/v1/claims/release")
        assert nobody.status_code == 401
