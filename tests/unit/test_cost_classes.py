"""Cost classes: a worker's slots split by class, so a burst of videos takes only the video
slots while photos keep flowing through theirs."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import headrace as hr
from headrace.policy import ConfigError
from headrace.runtime.classes import DEFAULT_CLASSES, ClassBudget

pytestmark = pytest.mark.anyio


def media_app() -> tuple[hr.App, dict[str, list[tuple[str, float, float]]]]:
    app = hr.App("memory://")
    spans: dict[str, list[tuple[str, float, float]]] = {"video": [], "image": []}

    @app.task(cost_class="video")
    async def video(ctx: hr.Context, ref: str) -> None:
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(10.0)
        spans["video"].append((ref, began, asyncio.get_running_loop().time()))

    @app.task(cost_class="image")
    async def image(ctx: hr.Context, ref: str) -> None:
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(1.0)
        spans["image"].append((ref, began, asyncio.get_running_loop().time()))

    return app, spans


def most_at_once(spans: list[tuple[str, float, float]]) -> int:
    edges = sorted([(b, 1) for _, b, _ in spans] + [(e, -1) for _, _, e in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


async def test_videos_take_their_slots_and_photos_keep_flowing() -> None:
    app, spans = media_app()
    async with app:
        # Videos first: in arrival order they would take every slot.
        await app.submit([app.definition("video").spec(f"v{i}") for i in range(6)])
        await app.submit([app.definition("image").spec(f"p{i}") for i in range(18)])
        worker = hr.Worker(app)  # the default budget: image 6, audio 2, video 2
        assert worker.slots == sum(DEFAULT_CLASSES.values())
        stats = await worker.drain()
    assert stats.succeeded == 24
    assert most_at_once(spans["video"]) == 2
    # Photos run in their six slots and in the two of the idle audio class: 18 within 3 s,
    # while the first videos still run.
    assert most_at_once(spans["image"]) == 8
    assert max(end for _, _, end in spans["image"]) == pytest.approx(3.0, abs=0.1)
    # A video starts as soon as a video slot frees: three rounds of two, 10 s each.
    starts = Counter(round(began) for _, began, _ in spans["video"])
    assert starts == {0: 2, 10: 2, 20: 2}


async def test_a_worker_budget_is_configurable() -> None:
    app, spans = media_app()
    async with app:
        await app.submit([app.definition("video").spec(f"v{i}") for i in range(4)])
        await app.submit([app.definition("image").spec(f"p{i}") for i in range(4)])
        await hr.Worker(app, classes={"image": 1, "video": 3}, borrow=False).drain()
    assert most_at_once(spans["video"]) == 3
    assert most_at_once(spans["image"]) == 1


async def test_unclassed_stages_share_the_rest_of_the_slots() -> None:
    app, _ = media_app()

    @app.task()
    async def plain(ctx: hr.Context, ref: str) -> None:
        return None

    worker = hr.Worker(app)
    assert worker.slots == sum(DEFAULT_CLASSES.values()) + 4
    assert hr.Worker(app, slots=3).slots == 3  # given: a cap over every class
    async with app:
        await plain.submit("x")
        assert (await worker.drain()).succeeded == 1


def test_a_class_without_slots_is_refused_naming_its_stage() -> None:
    app, _ = media_app()
    with pytest.raises(ConfigError, match="task video: cost class 'video' has no slots"):
        hr.Worker(app, classes={"image": 4})
    with pytest.raises(ConfigError, match=r"worker\.classes\['image'\]"):
        hr.Worker(app, classes={"image": 0, "video": 2})
    with pytest.raises(ConfigError, match=r"task\.cost_class"):
        app.task(cost_class="Video Files")


def test_a_budget_knows_each_class_room() -> None:
    budget = ClassBudget({"image": 2, "video": 1}, {"thumb": "image", "render": "video"})
    room = budget.room(["thumb", "render", "other"])
    assert room == {"image": 1, "video": 0}
    assert budget.open_kinds(["thumb", "render", "other"], room) == ["thumb", "other"]
    assert budget.filled(["thumb"], room)
    assert not budget.filled([], room)


async def test_photos_run_in_idle_video_slots_and_give_them_back_within_one_photo() -> None:
    app, spans = media_app()
    async with app:
        await app.submit([app.definition("image").spec(f"p{i}") for i in range(30)])
        worker = hr.Worker(app)  # image 6, audio 2, video 2
        running = asyncio.create_task(worker.drain())
        await asyncio.sleep(1.5)  # photos in every slot, the idle classes' too
        await app.submit([app.definition("video").spec("v0")])
        stats = await running
    assert most_at_once(spans["image"]) == 10 == worker.slots
    assert stats.borrowed > 0
    [(_, began, _)] = spans["video"]
    assert began - 1.5 <= 1.0 + 0.01  # a borrowed slot came back when its photo ended


async def test_a_heavy_class_never_takes_a_light_class_slots() -> None:
    app, spans = media_app()
    async with app:
        await app.submit([app.definition("video").spec(f"v{i}") for i in range(6)])
        stats = await hr.Worker(app).drain()
    assert most_at_once(spans["video"]) == 2  # the image and audio slots stay idle
    assert stats.borrowed == 0


async def test_borrowing_can_be_turned_off() -> None:
    app, spans = media_app()
    async with app:
        await app.submit([app.definition("image").spec(f"p{i}") for i in range(12)])
        stats = await hr.Worker(app, borrow=False).drain()
    assert most_at_once(spans["image"]) == 6
    assert stats.borrowed == 0


def test_idle_slots_go_to_full_classes_with_more_slots() -> None:
    budget = ClassBudget(
        {"image": 6, "audio": 2, "video": 2},
        {"thumb": "image", "speech": "audio", "render": "video"},
    )
    room = budget.room(["thumb"] * 6)  # the photos' own slots are all taken
    assert room == {"image": 0, "audio": 2, "video": 2}
    [lent] = budget.lendable([], room)  # nothing of audio or video to claim
    assert lent.kinds == frozenset({"thumb"}) and lent.limit == 4
    [lent] = budget.lendable(["render"], room)  # a video took one of its two
    assert lent.limit == 3
    # Photos have room of their own: nothing is lent; a video class never borrows photo slots.
    assert budget.lendable([], budget.room([])) == []
    assert budget.lendable(["render", "render"], budget.room([])) == []
