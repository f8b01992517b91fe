"""An event-shaped burst through the moderation pipeline, and what it did.

The shape follows what a live event sends: a few large videos just before a speech ends, then
one contributor sending many photos at once, then the crowd (many sessions, the same few photos
each, at the same moment), then latecomers with one photo each, and a few voice notes. A refused
upload (its event or session has as much waiting as admitted) is sent again after
`retry_after`, as a browser told 429 would.

`run_burst` replays it on an app (real media, or `MediaWork` that only takes time, on the
virtual clock), samples each stage's waiting tasks as it goes, and `BurstReport` says:
time to the first reviewable photo against that photo's own processing time, p95 queue age by
class, duplicate derivatives, Jain's index across the crowd's equal sessions while the image
stages are saturated, each stage's peak waiting against its bound, and how long the heavy
contributor kept each latecomer's photo waiting against one photo's processing time.
Times come from the running loop (virtual under the simulator), so the same code reports both.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import headrace as hr
from headrace.pipelines.moderation.pipeline import Item, ItemState, Moderation, Staff
from headrace.pipelines.moderation.probe import MediaClass
from headrace.policy.errors import QueueFull
from headrace.runtime.memory import DEFAULT_MEMORY
from headrace.store.protocol.tasks import Store
from headrace.store.protocol.types import AttemptOutcome, StageStats, TaskRecord, TaskState

CROWD, HEAVY, LATECOMER, VIDEO, VOICE = "crowd", "heavy", "latecomer", "video", "voice"
PHOTO_ROLES = (CROWD, HEAVY, LATECOMER)


@dataclass(frozen=True)
class Burst:
    """The burst's shape; `scale` multiplies every population (not the pace)."""

    crowd_sessions: int = 10
    crowd_photos: int = 6
    heavy_photos: int = 40
    latecomers: int = 6
    videos: int = 3
    voice_notes: int = 3
    scale: int = 1
    retry_after: float = 1.0
    seed: int = 0

    def uploads(self) -> list[Upload]:
        """Every upload in the order they arrive."""
        rng = random.Random(self.seed)
        found: list[Upload] = []
        for n in range(self.videos * self.scale):  # just before the speech ends
            found.append(Upload(rng.uniform(0.0, 0.5), f"video-{n:04d}", VIDEO))
        for n in range(self.scale):  # one contributor (per scale) sends many at once
            for i in range(self.heavy_photos):
                found.append(Upload(0.8 + 0.02 * i, f"heavy-{n:04d}", HEAVY))
        for n in range(self.crowd_sessions * self.scale):  # the crowd, at the same moment
            for i in range(self.crowd_photos):
                found.append(Upload(1.0 + 0.1 * i + rng.uniform(0, 0.05), f"crowd-{n:04d}", CROWD))
        for n in range(self.latecomers * self.scale):  # one photo each, a little later
            found.append(Upload(rng.uniform(2.0, 5.0), f"late-{n:04d}", LATECOMER))
        for n in range(self.voice_notes * self.scale):
            found.append(Upload(rng.uniform(0.0, 5.0), f"voice-{n:04d}", VOICE))
        found.sort(key=lambda upload: upload.at)
        return found

    @property
    def size(self) -> int:
        return len(self.uploads())


@dataclass(frozen=True)
class Upload:
    at: float  # seconds after the burst starts
    session: str
    role: str  # crowd, heavy, latecomer, video, voice

    @property
    def media_class(self) -> MediaClass:
        return {VIDEO: MediaClass.VIDEO, VOICE: MediaClass.AUDIO}.get(self.role, MediaClass.IMAGE)


@dataclass
class Sent:
    """An upload as the client saw it: accepted when, refused how often."""

    upload: Upload
    item: Item
    accepted_at: float
    refusals: int = 0
    submitted: bool = False


@dataclass
class StageSample:
    at: float
    waiting: dict[str, int]


Progress = Callable[[Sequence[StageStats], float], Awaitable[None]]


async def run_burst(
    moderation: Moderation,
    burst: Burst,
    payloads: Mapping[str, bytes],
    *,
    workers: int = 1,
    slots: int | None = None,
    classes: Mapping[str, int] | None = None,
    tick: float = 0.25,
    on_tick: Progress | None = None,
    staff: Staff | None = None,
    memory: int | None = DEFAULT_MEMORY,
) -> BurstReport:
    """Replay `burst` (each role's bytes from `payloads`) through `moderation` with `workers`
    in-process workers until every item is settled; report what happened. `staff`: the grant
    the first video's uploader gets (its weight and audit row), if any. `memory`: each
    worker's memory budget (runtime/memory.py)."""
    app = moderation.app
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent: list[Sent] = []
    samples: list[StageSample] = []
    done = asyncio.Event()
    crew = [
        # No pruner: its upload sweep would submit what the sessions' clients hold back.
        hr.Worker(
            app,
            slots=slots,
            classes=classes,
            name=f"burst-{n}",
            lease="60s",
            memory=memory,
            prune=False,
        )
        for n in range(workers)
    ]
    running = [asyncio.create_task(worker.run()) for worker in crew]
    sampler = asyncio.create_task(_sample(moderation, samples, done, start, tick, on_tick))
    lines: dict[str, asyncio.Queue[Sent | None]] = {}  # each session's uploads, submitted in order
    try:
        async with asyncio.TaskGroup() as group:
            for upload in burst.uploads():
                delay = start + upload.at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                grant = staff if staff is not None and upload.session == "video-0000" else None
                item = await moderation.accept_bytes(
                    payloads[upload.role],
                    event="gala",
                    session=upload.session,
                    staff=grant,
                )
                entry = Sent(upload, item, loop.time() - start)
                sent.append(entry)
                if upload.session not in lines:
                    lines[upload.session] = asyncio.Queue()
                    group.create_task(
                        _submit_in_order(moderation, lines[upload.session], burst.retry_after)
                    )
                lines[upload.session].put_nowait(entry)
            for line in lines.values():
                line.put_nowait(None)  # the session has sent all it sends
        # The store tells of new work, not of work ended: settling is polled.
        while not await _settled(moderation, sent):  # noqa: ASYNC110
            await asyncio.sleep(tick)
    finally:
        done.set()
        await sampler
        for worker in crew:
            worker.stop()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return await _report(moderation, burst, sent, samples, start, loop.time() - start)


async def _submit_in_order(
    moderation: Moderation, line: asyncio.Queue[Sent | None], retry_after: float
) -> None:
    """A session's client: its uploads submitted one after another; a refused one is sent
    again after `retry_after` (as told by a 429's Retry-After), the later ones behind it."""
    while (entry := await line.get()) is not None:
        while True:
            try:
                await moderation.submit(entry.item)
            except QueueFull:
                entry.refusals += 1
                await asyncio.sleep(retry_after)
            else:
                entry.submitted = True
                break


async def _settled(moderation: Moderation, sent: Sequence[Sent]) -> bool:
    counts = await moderation.app.store.counts()
    active = sum(n for state, n in counts.items() if not state.terminal)
    # Accepted but refused by admission, and not submitted again yet: not settled.
    return active == 0 and all(entry.submitted for entry in sent)


async def _sample(
    moderation: Moderation,
    samples: list[StageSample],
    done: asyncio.Event,
    start: float,
    tick: float,
    on_tick: Progress | None,
) -> None:
    loop = asyncio.get_running_loop()
    while not done.is_set():
        stages = await moderation.app.store.stages()
        waiting = {stage.kind: stage.pending + stage.ready for stage in stages}
        samples.append(StageSample(loop.time() - start, waiting))
        if on_tick is not None:
            await on_tick(stages, loop.time() - start)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), tick)


# -- the report


@dataclass(frozen=True)
class ItemTrace:
    media_id: str
    session: str
    role: str
    media_class: str
    state: str
    accepted_at: float
    finished_at: float | None  # when its last stage ended (store time, from the burst start)
    processing: float  # seconds its stages ran (the attempts that counted)
    stage_runs: int  # attempts of its stages (more than its stages: work run again)
    derive_sets: int  # derivative sets on disk for it

    @property
    def latency(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.accepted_at

    @property
    def queued(self) -> float | None:
        """Seconds it waited, accepted and not running."""
        latency = self.latency
        return None if latency is None else max(0.0, latency - self.processing)


@dataclass(frozen=True)
class BurstReport:
    order: str
    uploads: int
    makespan: float
    states: dict[str, int]
    refusals: dict[str, int]  # admission refusals by role
    first_photo: dict[str, float]  # the first reviewable photo: when, its latency, processing
    first_photo_ratio: float  # the first-accepted photo's latency / its processing time
    queue_p95: dict[str, float]  # by class
    duplicate_derivatives: int  # items with more than one derivative set
    repeated_runs: int  # stage attempts beyond one per stage
    jain: float  # across the crowd's sessions, while image work waited
    jain_window: tuple[float, float]
    peak_waiting: dict[str, int]  # by stage, sampled
    bounds: dict[str, int | None]
    latecomer_wait: float  # the longest a latecomer's photo waited
    photo_processing: float  # the median photo's processing time
    latecomers: dict[str, float]  # each latecomer's photo: accepted to reviewable, seconds
    depth_series: list[tuple[float, dict[str, int]]] = field(repr=False)
    items: list[ItemTrace] = field(repr=False)

    @property
    def latecomer_ratio(self) -> float:
        return self.latecomer_wait / self.photo_processing if self.photo_processing else math.inf

    def heavy_delay(self, without_heavy: BurstReport) -> float:
        """How much longer the latecomers' photos took with the heavy contributor than in the
        same burst without it (the most, over latecomers): its delay on a light session."""
        return max(
            (
                latency - without_heavy.latecomers[session]
                for session, latency in self.latecomers.items()
                if session in without_heavy.latecomers
            ),
            default=0.0,
        )

    def as_json(self) -> dict[str, object]:
        return {
            "order": self.order,
            "uploads": self.uploads,
            "makespan_s": round(self.makespan, 3),
            "states": self.states,
            "admission_refusals": self.refusals,
            "first_reviewable_photo": {k: round(v, 3) for k, v in self.first_photo.items()},
            "first_photo_latency_over_processing": round(self.first_photo_ratio, 3),
            "queue_age_p95_s": {k: round(v, 3) for k, v in self.queue_p95.items()},
            "duplicate_derivatives": self.duplicate_derivatives,
            "repeated_stage_runs": self.repeated_runs,
            "jain_index_crowd": round(self.jain, 4),
            "jain_window_s": [round(t, 3) for t in self.jain_window],
            "peak_waiting": self.peak_waiting,
            "bounds": self.bounds,
            "latecomer_wait_s": round(self.latecomer_wait, 3),
            "photo_processing_s": round(self.photo_processing, 3),
            "latecomer_wait_over_photo_processing": round(self.latecomer_ratio, 3),
            "latecomer_latency_s": {k: round(v, 3) for k, v in self.latecomers.items()},
            "depths": [[round(t, 3), depths] for t, depths in self.depth_series],
        }


async def _report(
    moderation: Moderation,
    burst: Burst,
    sent: Sequence[Sent],
    samples: Sequence[StageSample],
    start: float,
    makespan: float,
) -> BurstReport:
    store = moderation.app.store
    offset = await _store_offset(store, start)
    traces: list[ItemTrace] = []
    validate_starts: dict[str, list[float]] = defaultdict(list)
    for entry in sent:
        item = await moderation.records.get(entry.item.media_id)
        processing, runs, finished = 0.0, 0, None
        for stage in ("validate", "scan", "derive"):
            task = await store.find(f"{stage}:{item.media_id}")
            if task is None:
                continue
            for attempt in await store.attempts(task.id):
                runs += attempt.outcome is not AttemptOutcome.DEFERRED
                if attempt.ended_at is not None and attempt.outcome in _COUNTED:
                    processing += attempt.ended_at - attempt.started_at
                if stage == "validate" and attempt.outcome is AttemptOutcome.SUCCEEDED:
                    validate_starts[entry.upload.session].append(attempt.started_at - offset)
            if _ended(task):
                finished = (task.finished_at or 0.0) - offset
        sets = await moderation.media.derivative_sets(item.media_id)
        traces.append(
            ItemTrace(
                item.media_id,
                entry.upload.session,
                entry.upload.role,
                entry.upload.media_class.value,
                item.state.value,
                entry.accepted_at,
                finished,
                processing,
                runs,
                sets,
            )
        )
    return _summarise(moderation, burst, sent, samples, traces, validate_starts, makespan)


_COUNTED = (AttemptOutcome.SUCCEEDED, AttemptOutcome.DEAD)


def _ended(task: TaskRecord) -> bool:
    return task.state in (TaskState.SUCCEEDED, TaskState.DEAD) and task.finished_at is not None


async def _store_offset(store: Store, start: float) -> float:
    """The store's time when the burst began (the store's clock may not be the loop's)."""
    loop = asyncio.get_running_loop()
    now: float = await store.now()
    return now - (loop.time() - start)


def _summarise(
    moderation: Moderation,
    burst: Burst,
    sent: Sequence[Sent],
    samples: Sequence[StageSample],
    traces: Sequence[ItemTrace],
    validate_starts: Mapping[str, list[float]],
    makespan: float,
) -> BurstReport:
    photos = [t for t in traces if t.role in PHOTO_ROLES and t.state == ItemState.REVIEWABLE.value]
    first = min(photos, key=lambda t: t.finished_at or math.inf)
    earliest = min(photos, key=lambda t: t.accepted_at)
    processing = sorted(t.processing for t in photos)
    median_photo = processing[len(processing) // 2]
    late_waits = [t.queued or 0.0 for t in photos if t.role == LATECOMER]
    refusals: Counter[str] = Counter()
    for entry in sent:
        refusals[entry.upload.role] += entry.refusals
    jain, window = _crowd_fairness(traces, validate_starts, samples)
    peak: dict[str, int] = {}
    for sample in samples:
        for kind, waiting in sample.waiting.items():
            peak[kind] = max(peak.get(kind, 0), waiting)
    limits = {stage.kind: stage.bound for stage in moderation.app.stage_limits()}
    return BurstReport(
        order=moderation.order,
        uploads=len(sent),
        makespan=makespan,
        states=dict(Counter(t.state for t in traces)),
        refusals=dict(refusals),
        first_photo={
            "at": first.finished_at or 0.0,
            "latency": first.latency or 0.0,
            "processing": first.processing,
        },
        first_photo_ratio=(earliest.latency or 0.0) / earliest.processing,
        queue_p95={
            media_class.value: _p95(
                [t.queued for t in traces if t.media_class == media_class.value and t.queued]
            )
            for media_class in MediaClass
        },
        duplicate_derivatives=sum(1 for t in traces if t.derive_sets > 1),
        repeated_runs=sum(max(0, t.stage_runs - _stages_of(t)) for t in traces),
        jain=jain,
        jain_window=window,
        peak_waiting=dict(sorted(peak.items())),
        bounds={kind: limits.get(kind) for kind in sorted(peak)},
        latecomer_wait=max(late_waits, default=0.0),
        photo_processing=median_photo,
        latecomers={t.session: t.latency or 0.0 for t in photos if t.role == LATECOMER},
        depth_series=[(s.at, s.waiting) for s in samples],
        items=list(traces),
    )


def _stages_of(trace: ItemTrace) -> int:
    return {"reviewable": 3, "quarantined": 2, "refused": 1}.get(trace.state, 3)


def _crowd_fairness(
    traces: Sequence[ItemTrace],
    validate_starts: Mapping[str, list[float]],
    samples: Sequence[StageSample],
) -> tuple[float, tuple[float, float]]:
    """Jain's index of the crowd sessions' validations started while every one of them still
    had photos waiting: from the first crowd photo's arrival to the moment the first crowd
    session had its last photo started."""
    crowd = sorted({t.session for t in traces if t.role == CROWD})
    if not crowd:
        return 1.0, (0.0, 0.0)
    begin = min(t.accepted_at for t in traces if t.role == CROWD)
    end = min(max(validate_starts.get(session, [math.inf])) for session in crowd)
    counts = [
        sum(1 for at in validate_starts.get(session, []) if begin <= at < end) for session in crowd
    ]
    return jain_index(counts), (begin, end)


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one has everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def _p95(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
