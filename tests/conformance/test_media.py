"""One suite, every media store: a directory and an S3-compatible bucket (the test server, a
bucket of its own per test) keep the same guarantees, written once in `MediaStore`.

Real sockets: these run on a real event loop, not the virtual-time one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.media import (
    Derived,
    DirectoryBackend,
    LocalFile,
    MediaStore,
    MediaUnavailable,
    MissingMedia,
    S3Backend,
    S3Location,
    SignedUrl,
    StaleBlobs,
    Streamed,
    TooLarge,
    s3,
)
from headrace.pipelines.moderation.media.store import blob_key
from headrace.pipelines.moderation.model import ModelWork
from headrace.pipelines.moderation.pipeline import Moderation
from headrace.pipelines.moderation.upkeep import ORPHANS, ORPHANS_SWEPT
from headrace.policy import ConfigError
from headrace.policy.retention import HOUR, MINUTE
from headrace.runtime.pruner import Pruner
from tests.objectstore import CREDENTIALS, ENDPOINT, REGION, fresh_bucket, media_url

pytestmark = pytest.mark.anyio

PREVIEW = b"RIFF\x00\x00\x00\x00WEBPVP8 preview"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"debug": True})


@dataclass
class Kept:
    """A media store under test, and where its local files on their way go."""

    media: MediaStore
    scratch: Path
    url: str  # what `--media` would say

    async def keys(self, prefix: str) -> list[str]:
        return await self.media.backend.keys(prefix)

    def scratch_left(self) -> list[str]:
        return sorted(p.name for p in self.scratch.iterdir()) if self.scratch.is_dir() else []


@pytest.fixture(params=["directory", "s3"])
def kept(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kept]:
    if request.param == "directory":
        backend = DirectoryBackend(tmp_path / "media")
        yield Kept(MediaStore(backend), backend.scratch, str(backend.root))
        return
    yield from in_a_bucket(tmp_path, monkeypatch)


@pytest.fixture
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kept]:
    """A media store in a bucket of the test server only (what a directory does not do)."""
    yield from in_a_bucket(tmp_path, monkeypatch)


def in_a_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kept]:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with fresh_bucket() as bucket:
        location = S3Location(bucket, "media", endpoint=ENDPOINT, region=REGION)
        scratch = tmp_path / "scratch"
        yield Kept(MediaStore(S3Backend(location, scratch=scratch)), scratch, media_url(bucket))


def new_id(kept: Kept) -> str:
    return kept.media.new_media_id()


def writing(files: dict[str, bytes], others: asyncio.Barrier | None = None) -> Any:
    """A `make` for `derive_once` that writes `files`, then waits for `others` if given."""

    async def make(into: Path) -> None:
        for name, data in files.items():
            (into / name).write_bytes(data)
        if others is not None:
            await others.wait()

    return make


async def test_the_store_answers_and_honours_conditional_writes(kept: Kept) -> None:
    await kept.media.check()
    assert await kept.keys(".probe") == []


async def test_a_store_that_ignores_if_none_match_is_refused(
    kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def always_written(key: str, data: bytes) -> bool:
        return True

    monkeypatch.setattr(kept.media.backend, "create", always_written)
    with pytest.raises(ConfigError, match="If-None-Match"):
        await kept.media.check()


async def test_an_original_is_kept_once_under_its_digest(kept: Kept) -> None:
    first = await kept.media.put_bytes(b"the same bytes", limit=100)
    again = await kept.media.put_bytes(b"the same bytes", limit=100)
    assert first == again and first.size == 14
    assert await kept.keys("blobs") == [blob_key(first.digest)]
    async with kept.media.original(first.digest) as original:
        assert original.read_bytes() == b"the same bytes"
    assert kept.scratch_left() == []  # no spool file, no downloaded copy left behind


async def test_an_upload_past_its_limit_keeps_nothing(kept: Kept) -> None:
    with pytest.raises(TooLarge):
        await kept.media.put_bytes(b"x" * 5000, limit=4096)
    assert await kept.keys("blobs") == []
    assert kept.scratch_left() == []


async def test_a_missing_original_is_named(kept: Kept) -> None:
    await kept.media.put_bytes(b"another original", limit=100)  # a store in use
    with pytest.raises(MissingMedia, match="blobs/00/0000"):
        async with kept.media.original("0" * 64):
            pass


async def test_a_store_that_cannot_be_reached_is_unavailable_not_missing(
    kept: Kept, tmp_path: Path
) -> None:
    """A directory that went away (a volume unmounted, moved) or a server that does not
    answer: an outage, never an object said to be missing."""
    blob = await kept.media.put_bytes(b"an original", limit=100)
    backend = kept.media.backend
    if isinstance(backend, DirectoryBackend):
        backend.root.rename(tmp_path / "unmounted")
        gone = kept.media
    else:
        location = S3Location("headrace-test-none", "media", endpoint="http://127.0.0.1:9")
        gone = MediaStore(S3Backend(location, scratch=kept.scratch))
    with pytest.raises(MediaUnavailable):
        async with gone.original(blob.digest):
            pass


async def test_derivatives_are_made_once_and_reused_after(kept: Kept) -> None:
    media_id = new_id(kept)
    assert await kept.media.derived(media_id, "derive", 1) is None
    first = await kept.media.derive_once(media_id, "derive", 1, writing({"preview.webp": b"one"}))
    assert first.created and first.files == ("preview.webp",)

    async def never(into: Path) -> None:
        raise AssertionError("made again")

    second = await kept.media.derive_once(media_id, "derive", 1, never)  # a retry: reuses them
    assert not second.created and second.prefix == first.prefix
    assert await kept.media.read_derived(second, "preview.webp") == b"one"
    newer = await kept.media.derive_once(media_id, "derive", 2, writing({"preview.webp": b"2"}))
    assert newer.created and newer.prefix.startswith(f"derived/{media_id}/derive.v2/attempt-")
    assert kept.scratch_left() == []


async def test_two_attempts_at_once_leave_one_set_and_both_see_it(kept: Kept) -> None:
    media_id = new_id(kept)
    both = asyncio.Barrier(2)  # each looked for a set, found none, and made its own
    one = writing({"preview.webp": b"one", "metadata.json": b"{}"}, both)
    two = writing({"preview.webp": b"two", "metadata.json": b"{}"}, both)
    first, second = await asyncio.gather(
        kept.media.derive_once(media_id, "derive", 1, one),
        kept.media.derive_once(media_id, "derive", 1, two),
    )
    assert first.prefix == second.prefix and [first.created, second.created].count(True) == 1
    won = await kept.media.read_derived(first, "preview.webp")
    assert won in (b"one", b"two")
    where = f"derived/{media_id}/derive.v1"
    assert await kept.keys(where) == sorted(
        [f"{where}/manifest.json", first.key("metadata.json"), first.key("preview.webp")]
    )
    assert await kept.media.derivative_sets(media_id) == 1


async def test_a_make_that_fails_leaves_nothing(kept: Kept) -> None:
    media_id = new_id(kept)

    async def fail_halfway(into: Path) -> None:
        (into / "preview.webp").write_bytes(b"half")
        raise RuntimeError("the worker's decoder failed")

    with pytest.raises(RuntimeError):
        await kept.media.derive_once(media_id, "derive", 1, fail_halfway)
    assert await kept.media.derived(media_id, "derive", 1) is None
    assert await kept.keys(f"derived/{media_id}") == []
    assert kept.scratch_left() == []


class Killed(BaseException):
    """The process ending where it stands (kill -9): no handler runs after it."""


async def test_what_a_killed_attempt_left_half_written_goes_when_a_set_stands(
    kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    media_id, other = new_id(kept), new_id(kept)
    await kept.media.derive_once(other, "derive", 1, writing({"preview.webp": b"other"}))

    async def killed_before_the_manifest(key: str, data: bytes) -> bool:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(kept.media.backend, "create", killed_before_the_manifest)
        with pytest.raises(Killed):
            await kept.media.derive_once(media_id, "derive", 1, writing({"preview.webp": b"x"}))
    half = await kept.keys(f"derived/{media_id}")
    assert len(half) == 1 and half[0].endswith("/preview.webp")  # uploaded, never named
    assert await kept.media.derived(media_id, "derive", 1) is None
    again = await kept.media.derive_once(media_id, "derive", 1, writing({"preview.webp": b"ok"}))
    where = f"derived/{media_id}/derive.v1"
    assert await kept.keys(where) == sorted([f"{where}/manifest.json", again.key("preview.webp")])
    assert len(await kept.keys(f"derived/{other}")) == 2  # another item's set is untouched


async def test_a_set_reused_by_a_retry_goes_without_what_a_loser_left(
    kept: Kept, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    media_id = new_id(kept)
    first = await kept.media.derive_once(media_id, "derive", 1, writing({"preview.webp": b"1"}))
    made = tmp_path / "late"  # an attempt that began before the set stood, and ends after
    made.mkdir()
    (made / "preview.webp").write_bytes(b"2")

    async def killed_before_sweeping(where: str, standing: object) -> None:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(kept.media, "_sweep", killed_before_sweeping)
        with pytest.raises(Killed):  # it lost, and died before removing its objects
            await kept.media.keep_derived(media_id, "derive", 1, made)
    where = f"derived/{media_id}/derive.v1"
    assert len(await kept.keys(where)) == 3
    retry = await kept.media.derive_once(media_id, "derive", 1, writing({"preview.webp": b"3"}))
    assert retry.prefix == first.prefix and not retry.created
    assert await kept.keys(where) == sorted([f"{where}/manifest.json", first.key("preview.webp")])


async def test_removal_deletes_originals_and_every_derivative_set(kept: Kept) -> None:
    blob = await kept.media.put_bytes(b"an original", limit=100)
    media_id, other = new_id(kept), new_id(kept)
    files = {"preview.webp": b"p", "thumbnail.webp": b"t", "metadata.json": b"{}"}
    await kept.media.derive_once(media_id, "derive", 1, writing(files))
    await kept.media.derive_once(media_id, "derive", 2, writing({"preview.webp": b"v2"}))
    await kept.media.derive_once(other, "derive", 1, writing(files))
    assert await kept.media.remove_blob(blob.digest)
    assert not await kept.media.has_blob(blob.digest)
    assert not await kept.media.remove_blob(blob.digest)  # not there any more
    assert await kept.media.remove_derived(media_id) == 3 + 1 + 1 + 1  # files and manifests
    assert await kept.keys(f"derived/{media_id}") == []
    assert await kept.media.derived(media_id, "derive", 1) is None
    assert await kept.media.remove_derived(media_id) == 0
    assert len(await kept.keys(f"derived/{other}")) == 4


async def test_a_blob_taken_for_deletion_is_put_back_or_yields_to_a_new_copy(kept: Kept) -> None:
    media = kept.media
    blob = await media.put_bytes(b"shared bytes", limit=100)
    taken = await media.take_blob(blob.digest)
    assert taken is not None and not await media.has_blob(blob.digest)
    await media.settle_blob(blob.digest, taken, keep=True)  # a record named it meanwhile
    async with media.original(blob.digest) as original:
        assert original.read_bytes() == b"shared bytes"
    taken = await media.take_blob(blob.digest)
    assert taken is not None
    await media.put_bytes(b"shared bytes", limit=100)  # an upload of the same bytes, just then
    await media.settle_blob(blob.digest, taken, keep=False)
    assert await media.has_blob(blob.digest)  # the upload's own copy stands
    assert await kept.keys("blobs") == [blob_key(blob.digest)]  # nothing taken is left
    assert await media.take_blob("0" * 64) is None


async def test_stale_blobs_are_what_was_written_in_a_window(kept: Kept) -> None:
    media = kept.media
    blob = await media.put_bytes(b"left behind", limit=100)
    taken = await media.take_blob((await media.put_bytes(b"half released", limit=100)).digest)
    assert taken is not None
    now = media.wall()
    assert await media.stale_blobs(before=now - MINUTE) == StaleBlobs()  # all too young
    stale = await media.stale_blobs(before=now + MINUTE)
    assert stale.originals == (blob.digest,)
    assert [key for _, key in stale.taken] == [taken] and stale.leftovers == ()
    assert await media.stale_blobs(before=now + MINUTE, since=now + 30) == StaleBlobs()


async def test_the_pruner_releases_originals_no_item_names_once_old_enough(kept: Kept) -> None:
    """Bytes an upload kept and never recorded (as a decoder's error made every try of an
    unimplemented DDS leave): found on every media store, once past `retention.orphans` by the
    store's own clock, and never those an item names."""
    media = kept.media
    app = hr.App("memory://")
    moderation = Moderation(app, media, None, work=ModelWork())
    async with app:
        named = await moderation.accept_bytes(samples.jpeg(), event="gala", session="s1")
        leaked = await media.put_bytes(samples.png(), limit=1 << 20)  # kept, no record made
        half = await media.put_bytes(samples.webp(), limit=1 << 20)
        taken = await media.take_blob(half.digest)  # a release killed before it settled
        assert taken is not None
        report = await Pruner(app, holder="test").run()
        assert report.removed[ORPHANS] == 0  # an hour younger than `orphans`: in flight, maybe
        assert await media.has_blob(leaked.digest)

        real = media.wall
        media.wall = lambda: real() + 2 * HOUR
        would = await Pruner(app, holder="test").run(dry_run=True)
        assert would.removed[ORPHANS] == 2 and await media.has_blob(leaked.digest)
        report = await Pruner(app, holder="test").run()
        assert report.removed[ORPHANS] == 2
        assert await kept.keys("blobs") == [blob_key(named.digest)]

        mark = await app.store.records.get_record(
            *ORPHANS_SWEPT
        )  # the next run looks from there on
        assert mark is not None and mark.body["until"] <= media.wall() - HOUR
        assert (await Pruner(app, holder="test").run()).removed[ORPHANS] == 0
        assert await media.has_blob(named.digest)


async def test_a_preview_is_a_file_a_signed_url_or_a_stream(kept: Kept) -> None:
    made = await kept.media.derive_once(
        new_id(kept), "derive", 1, writing({"preview.webp": PREVIEW})
    )
    signed = await kept.media.preview(made.prefix, "preview.webp", signed=True)
    streamed = await kept.media.preview(made.prefix, "preview.webp", signed=False)
    origin = await kept.media.signing_origin()
    if isinstance(kept.media.backend, DirectoryBackend):
        assert isinstance(signed, LocalFile) and signed.path.read_bytes() == PREVIEW
        assert streamed == signed and origin is None
        return
    assert isinstance(signed, SignedUrl) and signed.url.startswith(f"{ENDPOINT}/")
    assert "X-Amz-Expires=300" in signed.url and signed.url not in repr(signed)
    async with httpx.AsyncClient() as client:
        assert (await client.get(signed.url)).content == PREVIEW
    assert isinstance(streamed, Streamed) and streamed.size == len(PREVIEW)
    assert b"".join([chunk async for chunk in streamed.chunks]) == PREVIEW
    assert origin == ENDPOINT
    assert await kept.media.preview(made.prefix, "poster.webp", signed=False) is None


def altered(url: str) -> str:
    """`url` with one character of its signature changed."""
    start = url.index("X-Amz-Signature=") + len("X-Amz-Signature=")
    swapped = "1" if url[start] == "0" else "0"
    return f"{url[:start]}{swapped}{url[start + 1 :]}"


async def signed_preview(media: MediaStore, made: Derived) -> str:
    served = await media.preview(made.prefix, "preview.webp", signed=True)
    assert isinstance(served, SignedUrl)
    return served.url


@pytest.mark.realtime  # a URL's expiry is the server's clock's to judge
async def test_a_signed_url_works_and_one_altered_expired_or_signed_by_another_key_is_refused(
    bucket: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test server checks presigned URLs as S3 does (.ci/s3-server): so a wrong
    signature, lifetime or key in what the store signs would fail here."""
    made = await bucket.media.derive_once(
        new_id(bucket), "derive", 1, writing({"preview.webp": PREVIEW})
    )
    url = await signed_preview(bucket.media, made)
    monkeypatch.setattr(s3, "SIGNED_URL_LIFETIME", timedelta(seconds=1))
    short = await signed_preview(bucket.media, made)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key-the-server-knows")
    assert isinstance(bucket.media.backend, S3Backend)
    location = bucket.media.backend.location
    other = await signed_preview(MediaStore(S3Backend(location, scratch=bucket.scratch)), made)
    async with httpx.AsyncClient() as client:
        works = await client.get(url)
        tampered = await client.get(altered(url))
        foreign = await client.get(other)
        await asyncio.sleep(2.5)  # past the short URL's lifetime (X-Amz-Expires=1)
        expired = await client.get(short)
    assert (works.status_code, works.content) == (200, PREVIEW)
    assert tampered.status_code == 403 and b"SignatureDoesNotMatch" in tampered.content
    assert foreign.status_code == 403 and b"SignatureDoesNotMatch" in foreign.content
    assert expired.status_code == 403 and b"expired" in expired.content
    assert "X-Amz-Expires=1&" in short


@pytest.mark.parametrize("prefix", ["../etc", "blobs/00", "derived/x/derive.v1"])
async def test_only_a_set_the_store_made_is_served(kept: Kept, prefix: str) -> None:
    with pytest.raises(ConfigError, match="derivative set"):
        await kept.media.preview(prefix, "preview.webp", signed=False)


UPLOAD = """
import asyncio, json, os, resource, sys
from headrace.pipelines.moderation.media import open_media

def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

async def main(where: str, size: int) -> None:
    media = open_media(where)
    await media.put_bytes(b"warm up the client", limit=100)
    chunk = os.urandom(1 << 20)
    before = peak()
    async with media.writer(limit=size) as writer:
        for _ in range(size >> 20):
            writer.write(chunk)
        blob = await writer.keep()
    print(json.dumps({"growth": peak() - before, "size": blob.size}))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@pytest.mark.realtime
def test_a_large_upload_is_streamed_never_held_in_memory(kept: Kept, tmp_path: Path) -> None:
    size = 256 << 20
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin", **CREDENTIALS}
    env["PYTHONPATH"] = ":".join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", UPLOAD, kept.url, str(size)],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["size"] == size
    assert measured["growth"] < size // 4, measured  # a few parts in flight at most
