"""Uploads a contributor's bad file cannot hurt: whatever a decoder raises on it, the answer is
202 and the item is `refused` with a safe code (never a 500, never a dead letter), no bytes stay
without an item, the same bytes uploaded while an identical item is refused are taken, and the
contributor's session reads what became of its own uploads (and of nobody else's)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import httpx
import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.pipeline import Item, ItemState
from headrace.service.api.auth import Role, create_token
from headrace.service.api.uploads import SESSION_COOKIE
from headrace.store.protocol.types import TaskState

from .api import Harness, error_code, harness

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})  # real time: the SQLite store's thread


def tiff() -> bytes:
    out = io.BytesIO()
    samples.photo(64, 48).save(out, "TIFF")
    return out.getvalue()


async def read(h: Harness, answer: httpx.Response, session: str | None) -> httpx.Response:
    """The upload `answer` named (its `Location`), read by its uploader in `session`."""
    if session is not None:
        h.client.cookies.set(SESSION_COOKIE, session)
    try:
        return await h.client.get(answer.headers["location"], headers=h.auth("uploader"))
    finally:
        h.client.cookies.clear()


async def items(h: Harness) -> list[Item]:
    return await h.moderation.records.all()


def blobs(tmp_path: Path) -> set[str]:
    """The digests of the originals the media directory holds."""
    return {p.name for p in (tmp_path / "media" / "blobs").rglob("*") if p.is_file()}


async def unnamed_blobs(h: Harness, tmp_path: Path) -> set[str]:
    """Originals no item that still needs one names: none should ever be left."""
    needed = {item.digest for item in await items(h) if item.state is not ItemState.REFUSED}
    return blobs(tmp_path) - needed


async def test_a_file_no_decoder_implements_is_refused_not_a_server_error(tmp_path: Path) -> None:
    """Pillow raises NotImplementedError opening a DDS texture of a pixel format it lacks: every
    try of such a file answered 500 and left its bytes with no item."""
    async with harness(tmp_path) as h:
        answers = [await h.upload(data=samples.unimplemented_dds()) for _ in range(3)]
        assert [a.status_code for a in answers] == [202, 202, 202]
        await h.drain()
        for answer in answers:
            item = await h.moderation.records.get(answer.json()["media_id"])
            assert (item.state, item.reason) == (ItemState.REFUSED, "media.unsupported")
        assert blobs(tmp_path) == set()
        assert await h.moderation.app.store.tasks(state=TaskState.DEAD) == []


async def test_bytes_whose_item_is_another_uploads_are_not_kept(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        first = await h.upload(key="k1", data=samples.jpeg(shade=1))
        other = await h.upload(key="k1", data=samples.jpeg(shade=2))  # same key, other bytes
        assert (first.status_code, other.status_code) == (202, 422)
        assert error_code(other) == "idempotency_conflict"
        [item] = await items(h)
        assert blobs(tmp_path) == {item.digest}  # the second upload's bytes went


async def test_a_contributors_bad_file_is_its_items_outcome_not_a_dead_letter(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        answer = await h.upload(data=tiff())
        assert answer.status_code == 202
        await h.drain()
        media_id = answer.json()["media_id"]
        item = await h.moderation.records.get(media_id)
        assert (item.state, item.reason) == (ItemState.REFUSED, "media.unsupported")
        task = await h.moderation.app.store.find(f"validate:{media_id}")
        assert task is not None and task.state is TaskState.SUCCEEDED
        letters = await h.client.get("/v1/dead-letters", headers=h.auth("admin"))
        assert letters.json() == []
        metrics = (await h.client.get("/metrics", headers=h.auth("admin"))).text
        dead = [line for line in metrics.splitlines() if 'outcome="dead"' in line]
        assert all(line.endswith(" 0") or line.endswith(" 0.0") for line in dead), dead


async def test_the_same_bytes_as_an_item_being_refused_are_taken(tmp_path: Path) -> None:
    """Uploads of one bad file at once, while a worker refuses the first of them: every one is
    202 (none `500 internal`), each item is refused in its turn, and no bytes stay."""
    async with harness(tmp_path) as h:
        app = h.moderation.app
        data = samples.unimplemented_dds()
        worker = hr.Worker(app, idle="0.02s")
        running = asyncio.create_task(worker.run())
        try:
            answers: list[httpx.Response] = []
            for wave in range(6):
                sent = [h.upload(key=f"w{wave}-{n}", data=data) for n in range(4)]
                answers += await asyncio.gather(*sent)
            assert {a.status_code for a in answers} == {202}
            for _ in range(400):
                if all(item.state.settled for item in await items(h)):
                    break
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await running
        states = {(item.state, item.reason) for item in await items(h)}
        assert states == {(ItemState.REFUSED, "media.unsupported")}
        assert len(await items(h)) == len(answers) == 24
        assert await unnamed_blobs(h, tmp_path) == set()


async def test_bytes_deleted_as_their_record_is_written_are_kept_again(tmp_path: Path) -> None:
    """The race itself, in order: an upload keeps bytes an item already has; that item is
    refused and its original deleted (the upload had no record yet); then the upload's record
    is written. It finds its bytes gone, and keeps them again from its spool file."""
    async with harness(tmp_path) as h:
        moderation, data = h.moderation, samples.png()
        first = await moderation.accept_bytes(data, event="gala", session="s1")
        async with moderation.media.writer(limit=1 << 20) as writer:
            writer.write(data)
            blob = await writer.keep()  # there already: nothing written
            assert blob.digest == first.digest
            # What refusing the first item does: release its original, which no record but
            # its own names yet.
            await moderation.release_originals({blob.digest}, leaving={first.media_id})
            assert not await moderation.media.has_blob(blob.digest)
            item = await moderation.receive(blob, event="gala", session="s2", local=writer.path)
        assert item.state is ItemState.ACCEPTED
        assert await moderation.media.has_blob(blob.digest)
        await h.drain()
        assert (await moderation.records.get(item.media_id)).state is ItemState.REVIEWABLE


async def test_a_contributor_reads_its_own_uploads_and_nobody_elses(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        mine = await h.upload(data=tiff())
        session = mine.cookies[SESSION_COOKIE]
        theirs = await h.upload(data=samples.jpeg())  # another guest: a session of its own
        await h.drain()
        media_id = mine.json()["media_id"]
        assert mine.headers["location"] == f"/v1/events/gala/uploads/{media_id}"
        answer = await read(h, mine, session)
        assert answer.status_code == 200
        assert answer.json() == {
            "media_id": media_id,
            "event": "gala",
            "state": "refused",
            "phase": "done",
            "reason": "media.unsupported",
        }
        missing = await h.client.get(
            f"/v1/events/gala/uploads/{'0' * 32}", headers=h.auth("uploader")
        )
        for denied in (await read(h, theirs, session), await read(h, mine, None), missing):
            assert denied.status_code == 404, denied.text  # not 403: existence is not said
            assert denied.json() == missing.json()
        moderator = await h.client.get(mine.headers["location"], headers=h.auth("moderator"))
        assert moderator.json()["state"] == "refused"
        stranger = await create_token(
            h.moderation.app.store, name="fair-guest", role=Role.CONTRIBUTOR, events=["fair"]
        )
        h.client.cookies.set(SESSION_COOKIE, session)
        elsewhere = await h.client.get(
            mine.headers["location"], headers={"Authorization": f"Bearer {stranger}"}
        )
        h.client.cookies.clear()
        assert elsewhere.status_code == 404
        audit = await h.moderation.records.audit(media_id)
        assert [row.outcome for row in audit if row.action == "read"] == ["denied"]
