"""The moderation stages on real files: every sample ends in the state a moderator should see,
with the safe code or the scan's finding as its reason."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import headrace as hr
from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.media import DirectoryBackend, MediaStore, open_media
from headrace.pipelines.moderation.model import ModelWork
from headrace.pipelines.moderation.pipeline import (
    DERIVE_VERSION,
    Admission,
    Item,
    ItemState,
    Moderation,
    Phase,
    Staff,
    derive_stage,
    validate_stage,
)
from headrace.pipelines.moderation.probe import CORRUPT, DECODER_BASE, MediaClass, Refused
from headrace.pipelines.moderation.scan import EICAR_NAME, BuiltinScanner
from headrace.policy import ConfigError
from headrace.policy.errors import QueueFull
from headrace.store.protocol.types import TaskState

pytestmark = pytest.mark.anyio

EXPECTED = {  # sample -> (item state, class, reason)
    "photo.jpg": (ItemState.REVIEWABLE, "image", None),
    "graphic.png": (ItemState.REVIEWABLE, "image", None),
    "sticker.webp": (ItemState.REVIEWABLE, "image", None),
    "voice.wav": (ItemState.REVIEWABLE, "audio", None),
    "song.mp3": (ItemState.REVIEWABLE, "audio", None),
    "clip.mp4": (ItemState.REVIEWABLE, "video", None),
    "lying-extension.jpg": (ItemState.REVIEWABLE, "audio", None),
    "truncated.jpg": (ItemState.REFUSED, None, "media.corrupt"),
    "bomb.png": (ItemState.REFUSED, None, "media.too_large"),
    "eicar.txt": (ItemState.REFUSED, None, "media.unsupported"),
}


async def test_every_sample_ends_where_a_moderator_expects_it(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    files = DirectoryBackend(tmp_path / "media")
    media = MediaStore(files)
    moderation = Moderation(app, media, BuiltinScanner())
    infected = samples.jpeg() + samples.eicar()  # a photo that carries the test virus
    async with app:
        items: dict[str, Item] = {}
        for name in EXPECTED:
            with media_samples[name].open("rb") as upload:
                items[name] = await moderation.accept(
                    upload, event="gala", session=f"s-{len(items)}"
                )
        items["infected.jpg"] = await moderation.accept(
            io.BytesIO(infected), event="gala", session="s-x"
        )
        for item in items.values():
            await moderation.submit(item)
        await hr.Worker(app).drain(fail_fast=False)
        assert await app.store.tasks(state=TaskState.DEAD) == []  # a bad file is no dead letter
        validated = {t.ref: t for t in await app.store.tasks() if ".validate." in t.kind}
        for name, (state, media_class, reason) in EXPECTED.items():
            record = await moderation.records.get(items[name].media_id)
            assert (record.state, record.media_class, record.reason) == (state, media_class, reason)
            # refused or not, the item's validation succeeded: the refusal is its outcome
            assert validated[record.media_id].state is TaskState.SUCCEEDED
            if state is ItemState.REVIEWABLE:
                where = f"derived/{record.media_id}/derive.v{DERIVE_VERSION}/attempt-"
                assert record.derived is not None and record.derived.startswith(where)
                assert (files.root / record.derived / "metadata.json").is_file()
        quarantined = await moderation.records.get(items["infected.jpg"].media_id)
        assert (quarantined.state, quarantined.reason) == (ItemState.QUARANTINED, EICAR_NAME)
        assert await media.derived(quarantined.media_id, "derive", DERIVE_VERSION) is None


async def test_a_derive_run_again_reuses_what_the_first_made(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    files = DirectoryBackend(tmp_path / "media")
    media = MediaStore(files)
    moderation = Moderation(app, media, BuiltinScanner())
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = await moderation.accept(upload, event="gala", session="s1")
        await moderation.submit(item)
        await hr.Worker(app).drain()
        made = await media.derived(item.media_id, "derive", DERIVE_VERSION)
        assert made is not None
        before = {p.name: p.stat().st_mtime_ns for p in (files.root / made.prefix).iterdir()}
        # The same stage again, as after a worker died before its outcome was written.
        await app.definition(await derive_stage_of(moderation, item.media_id)).submit(item.media_id)
        await hr.Worker(app).drain()
        assert (await moderation.records.get(item.media_id)).derived == made.prefix
    after = {p.name: p.stat().st_mtime_ns for p in (files.root / made.prefix).iterdir()}
    assert after == before
    version = f"derive.v{DERIVE_VERSION}"
    assert [p.name for p in (files.root / "derived" / item.media_id).iterdir()] == [version]
    kept = sorted(p.name for p in (files.root / "derived" / item.media_id / version).iterdir())
    assert kept == sorted([made.prefix.rsplit("/", 1)[1], "manifest.json"])


async def test_a_stage_that_runs_again_late_never_sets_its_item_back(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    """As a worker cut off mid-validate and back after another finished the item does: its
    validate (and a scan) end late, and the item stays where the later stages took it."""
    app = hr.App("memory://")
    moderation = Moderation(app, MediaStore(DirectoryBackend(tmp_path)), BuiltinScanner())
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = await moderation.accept(upload, event="gala", session="s1")
        await moderation.submit(item)
        await hr.Worker(app).drain()
        done = await moderation.records.get(item.media_id)
        assert done.state is ItemState.REVIEWABLE
        for stage in (validate_stage(MediaClass.IMAGE), "moderation.scan.image"):
            await app.definition(stage).submit(item.media_id)
        await hr.Worker(app).drain()
        again = await moderation.records.get(item.media_id)
    assert (again.state, again.derived, again.seq) == (ItemState.REVIEWABLE, done.derived, done.seq)


async def derive_stage_of(moderation: Moderation, media_id: str) -> str:
    record = await moderation.records.get(media_id)
    assert record.media_class is not None
    return derive_stage(MediaClass(record.media_class))


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "x" * 65])
async def test_events_and_sessions_are_labels_not_paths(bad: str, tmp_path: Path) -> None:
    moderation = Moderation(hr.App("memory://"), open_media(tmp_path), BuiltinScanner())
    with pytest.raises(ConfigError, match="event"):
        await moderation.accept(io.BytesIO(b"x"), event=bad, session="s1")
    with pytest.raises(ConfigError, match="session"):
        await moderation.accept(io.BytesIO(b"x"), event="gala", session=bad)


async def test_an_upload_waits_in_the_class_its_first_bytes_announce(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path), BuiltinScanner())
    queued = {}
    async with app:
        for name in ("photo.jpg", "clip.mp4", "song.mp3", "lying-extension.jpg", "eicar.txt"):
            with media_samples[name].open("rb") as upload:
                item = await moderation.accept(upload, event="gala", session="s1")
            queued[name] = item.queued_as
    assert queued == {
        "photo.jpg": "image",
        "clip.mp4": "video",
        "song.mp3": "audio",
        "lying-extension.jpg": "audio",  # a WAV, whatever its name says
        "eicar.txt": "image",  # no known signature: validated at the cheapest class's cost
    }


async def test_admission_caps_waiting_uploads_per_session_and_per_event(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    admission = Admission(per_event=3, per_session=2)
    moderation = Moderation(app, open_media(tmp_path), BuiltinScanner(), admission=admission)
    photo = media_samples["photo.jpg"].read_bytes()

    async def upload(session: str) -> Item:
        return await moderation.accept(io.BytesIO(photo), event="gala", session=session)

    async with app:
        await moderation.submit(await upload("heavy"))
        await moderation.submit(await upload("heavy"))
        refused = await upload("heavy")
        with pytest.raises(QueueFull) as full:
            await moderation.submit(refused)
        assert (full.value.scope, full.value.label) == ("flow", "heavy")
        light = await upload("light")
        await moderation.submit(light)  # another session still gets in
        with pytest.raises(QueueFull) as full:
            await moderation.submit(await upload("third"))
        assert (full.value.scope, full.value.label) == ("group", "gala")
        # Accepted and kept: the refused upload waits as accepted, queued, for a later submit.
        assert await moderation.phase(refused) is Phase.QUEUED
        assert await moderation.phase(light) is Phase.QUEUED
        await hr.Worker(app).drain()
        await moderation.submit(refused)
        await hr.Worker(app).drain()
        assert await moderation.phase(refused) is Phase.DONE
        assert (await moderation.records.get(refused.media_id)).state is ItemState.REVIEWABLE


async def test_an_item_is_processing_while_a_stage_runs_on_it(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path), BuiltinScanner())
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = await moderation.accept(upload, event="gala", session="s1")
        await moderation.submit(item)
        assert await moderation.phase(item) is Phase.QUEUED
        [lease] = (await app.store.claim("w1", 1, lease_for=30.0)).leases
        assert await moderation.phase(item) is Phase.PROCESSING
        assert lease.task.kind == validate_stage(MediaClass.IMAGE)


async def test_a_staff_upload_carries_its_weight_and_an_audit_row(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path), BuiltinScanner())
    staff = Staff(weight=4, by="organiser", reason="official photographer")
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = await moderation.accept(upload, event="gala", session="crew", staff=staff)
        await moderation.submit(item)
        await hr.Worker(app).drain()
        tasks = await app.store.tasks()
        audit = await moderation.records.audit(item.media_id)
    assert item.weight == 4.0
    [row] = audit
    assert (row.action, row.actor, row.scope, row.detail) == (
        "upload.weighted",
        "organiser",
        "gala",
        {"weight": 4.0, "reason": "official photographer"},
    )
    assert {t.kind.split(".")[1] for t in tasks} == {"validate", "scan", "derive"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"weight": 0}, "staff.weight"),
        ({"weight": 1000}, "staff.weight"),
        ({"by": "a b"}, "staff.by"),
        ({"reason": ""}, "staff.reason"),
    ],
)
def test_staff_grants_are_checked_by_field(fields: dict[str, object], field: str) -> None:
    given: dict[str, object] = {"weight": 2, "by": "org", "reason": "host", **fields}
    with pytest.raises(ConfigError, match=field):
        Staff(**given)  # type: ignore[arg-type]


async def test_two_decisions_on_one_item_converge_and_both_are_audited(
    media_samples: dict[str, Path], tmp_path: Path
) -> None:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path), BuiltinScanner())
    async with app:
        with media_samples["photo.jpg"].open("rb") as upload:
            item = await moderation.accept(upload, event="gala", session="s1")
        with pytest.raises(ConfigError, match="cannot be approved, it is accepted"):
            await moderation.review(item.media_id, approve=True, by="mod1")
        await moderation.submit(item)
        await hr.Worker(app).drain()
        await moderation.review(item.media_id, approve=True, by="mod1")
        again = await moderation.review(item.media_id, approve=True, by="mod2")
        assert again.item.state is ItemState.APPROVED and not again.applied
        with pytest.raises(ConfigError, match="cannot be rejected, it is approved"):
            await moderation.review(item.media_id, approve=False, by="mod2")
        audit = await moderation.records.audit(item.media_id)
        notices = await app.store.records.outbox()
    assert [(row.actor, row.outcome) for row in audit] == [
        ("mod1", "unchanged: accepted"),
        ("mod1", "applied"),
        ("mod2", "unchanged: approved"),
        ("mod2", "unchanged: approved"),
    ]
    assert [(n.topic, n.record_id) for n in notices] == [("item.approved", item.media_id)]


async def test_an_image_with_a_payload_appended_is_kept_whole_and_flagged(tmp_path: Path) -> None:
    app = hr.App("memory://")
    media = open_media(tmp_path / "media")
    moderation = Moderation(app, media, BuiltinScanner())
    uploads = {
        "jpeg-html": samples.polyglot(samples.jpeg(gps=False)),
        "jpeg-zip": samples.polyglot(samples.jpeg(gps=False), b"PK\x03\x04" + b"\x00" * 40),
        "png-html": samples.polyglot(samples.png()),
        "webp-html": samples.polyglot(samples.webp()),
        "plain": samples.jpeg(gps=False),
    }
    async with app:
        items = {}
        for name, data in uploads.items():
            items[name] = await moderation.accept_bytes(data, event="gala", session=name)
            await moderation.submit(items[name])
        await hr.Worker(app).drain()
        for name, data in uploads.items():
            item = await moderation.records.get(items[name].media_id)
            assert item.state is ItemState.REVIEWABLE, name
            assert item.flags == (() if name == "plain" else ("media.trailing_data",)), name
            async with media.original(item.digest) as original:
                assert original.read_bytes() == data  # kept as received


async def test_the_decode_memory_is_estimated_from_headers_at_accept(tmp_path: Path) -> None:
    app = hr.App("memory://")
    moderation = Moderation(app, open_media(tmp_path / "media"), BuiltinScanner())
    async with app:
        small = await moderation.accept_bytes(samples.jpeg(640, 480), event="gala", session="s")
        tall = await moderation.accept_bytes(
            samples.rgba_png(1000, 8000), event="gala", session="s"
        )
        noise = await moderation.accept_bytes(b"not media\n" * 9, event="gala", session="s")
    assert small.memory is not None and tall.memory is not None
    assert DECODER_BASE < small.memory < tall.memory
    assert tall.memory - DECODER_BASE < 1000 * 8000 * 4 // 2  # its rows stream: not held whole
    assert noise.memory is None  # its headers do not read: validation says why


async def test_a_refused_original_is_deleted_and_one_another_item_needs_is_kept(
    tmp_path: Path,
) -> None:
    app = hr.App("memory://")
    files = DirectoryBackend(tmp_path / "media")
    media = MediaStore(files)
    moderation = Moderation(app, media, BuiltinScanner())
    refused = samples.truncated_jpeg()
    shared = samples.png_bomb(13_000)  # too large: refused by both of its uploads...
    async with app:
        alone = await moderation.accept_bytes(refused, event="gala", session="a")
        first = await moderation.accept_bytes(shared, event="gala", session="b")
        second = await moderation.accept_bytes(shared, event="gala", session="c")
        await moderation.submit(alone)
        await moderation.submit(first)
        await hr.Worker(app).drain(fail_fast=False)
        assert (await moderation.records.get(alone.media_id)).state is ItemState.REFUSED
        assert not await media.has_blob(alone.digest)
        assert await media.has_blob(second.digest)  # ...the second still waits for validation
        await moderation.submit(second)
        await hr.Worker(app).drain(fail_fast=False)
        assert (await moderation.records.get(second.media_id)).reason == "media.too_large"
        assert not await media.has_blob(second.digest)  # no item needs it now
    assert not [p for p in (files.root / "blobs").rglob("*") if p.is_file()]


class DecodersRefuseOnDerive(ModelWork):
    """Validation takes the file; the derivatives' decode finds it is not media taken."""

    async def derive(self, original: Path, into: Path) -> None:
        raise Refused(CORRUPT, "the image does not decode to its end")


async def test_a_refusal_found_while_deriving_is_the_items_outcome(tmp_path: Path) -> None:
    app = hr.App("memory://")
    media = MediaStore(DirectoryBackend(tmp_path / "media"))
    moderation = Moderation(app, media, None, work=DecodersRefuseOnDerive())
    async with app:
        item = await moderation.accept_bytes(samples.jpeg(), event="gala", session="s1")
        await moderation.submit(item)
        await hr.Worker(app).drain(fail_fast=False)
        refused = await moderation.records.get(item.media_id)
        assert (refused.state, refused.reason) == (ItemState.REFUSED, CORRUPT)
        assert {t.state for t in await app.store.tasks()} == {TaskState.SUCCEEDED}
        assert not await media.has_blob(item.digest)
        assert await media.derived(item.media_id, "derive", DERIVE_VERSION) is None
