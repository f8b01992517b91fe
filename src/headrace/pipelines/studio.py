"""`studio`: generative episodes, executed per shot and reported per episode.

    script(ep) ─┬─ image(ep/s01) ── video(ep/s01) ─┐
                ├─ speech(ep/s01) ─────────────────┤
                ├─ ... one of each per shot ...    ├─ assemble(ep)
                └─ image/speech/video(ep/sNN) ─────┘

The script stage decides the shots and spawns the rest in its completion's transaction. Each
provider sits behind its own gate (`provider:image`, `provider:speech`, `provider:video`):
a concurrency cap and the vendor's rate. A video is a remote job: submitting it takes a slot,
waiting for it keeps only its ticket, and a poller resolves it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from headrace.pipelines.providers import MiniMaxClient
from headrace.pipelines.providersim import STUDIO_QUOTAS, Latency, Quota
from headrace.policy.errors import RemoteFailed
from headrace.policy.rate import Rate
from headrace.runtime.app import App, TaskDefinition
from headrace.runtime.context import Context
from headrace.runtime.results import Pending, RemoteWait, Result

PROVIDER_GATES = {"image": "provider:image", "speech": "provider:speech", "video": "provider:video"}
CLIP_SECONDS = 6.0


@dataclass(frozen=True)
class StudioConfig:
    """How the studio runs. Durations scale with `window` (6 s: the vendor's minute, compressed)."""

    window: float = 6.0
    shots: int = 6
    quotas: Mapping[str, Quota] = field(default_factory=lambda: dict(STUDIO_QUOTAS))
    hold_video_slot: bool = False  # the anti-pattern, kept to measure what it costs
    max_attempts: int = 5

    @property
    def poll_every(self) -> float:
        return self.window / 24

    @property
    def script_time(self) -> float:
        return self.window / 20

    @property
    def assembly_time(self) -> float:
        return self.window / 30


@dataclass(frozen=True)
class Studio:
    app: App
    script: TaskDefinition
    image: TaskDefinition
    speech: TaskDefinition
    video: TaskDefinition
    assemble: TaskDefinition
    poster: TaskDefinition
    config: StudioConfig


def shot_refs(episode: str, shots: int) -> list[str]:
    return [f"{episode}/s{n:02d}" for n in range(1, shots + 1)]


def prompt_for(ref: str) -> str:
    episode, _, shot = ref.partition("/")
    return f"Episode {episode}, shot {shot or 'poster'}: a harbour at dawn, slow push-in."


def line_for(ref: str) -> str:
    return f"Narration for {ref}: the tide turns, and the town wakes to the sound of gulls."


def build(app: App, client: MiniMaxClient, config: StudioConfig | None = None) -> Studio:
    """Declare the studio's gates and stages on `app`, calling providers through `client`."""
    config = config or StudioConfig()
    for provider, gate in PROVIDER_GATES.items():
        quota = config.quotas[provider]
        app.gate(
            gate,
            concurrency=quota.concurrency,
            rate=Rate(quota.rpm, per=config.window),
        )
    app.gate("local:assembly", concurrency=2)
    stages = _Stages(client, config)
    attempts = config.max_attempts
    image = app.task(name="image", gates=[PROVIDER_GATES["image"]], max_attempts=attempts)(
        stages.image
    )
    speech = app.task(name="speech", gates=[PROVIDER_GATES["speech"]], max_attempts=attempts)(
        stages.speech
    )
    video = app.task(
        name="video", gates=[PROVIDER_GATES["video"]], max_attempts=attempts, poll=stages.poll
    )(stages.video)
    assemble = app.task(name="assemble", gates=["local:assembly"])(stages.assemble)
    poster = app.task(name="poster", gates=[PROVIDER_GATES["image"]], max_attempts=attempts)(
        stages.image
    )
    stages.next = (image, speech, video, assemble)
    script = app.task(name="script", max_attempts=attempts)(stages.script)
    return Studio(app, script, image, speech, video, assemble, poster, config)


class _Stages:
    """The handlers, closed over the provider client."""

    def __init__(self, client: MiniMaxClient, config: StudioConfig) -> None:
        self.client = client
        self.config = config
        self.next: tuple[TaskDefinition, ...] = ()

    async def script(self, ctx: Context, episode: str) -> Result:
        await asyncio.sleep(self.config.script_time)  # writing the script: local work
        image, speech, video, assemble = self.next
        parts = []
        for ref in shot_refs(episode, self.config.shots):
            frame = ctx.spawn(image, ref)
            parts.append(ctx.spawn(speech, ref))
            parts.append(ctx.spawn(video, ref, after=[frame]))
        ctx.spawn(assemble, episode, after=parts)
        return Result(cost=float(self.config.shots))

    async def image(self, ctx: Context, ref: str) -> Result:
        await self.client.generate_image(prompt_for(ref), stamps=ctx)
        return Result(cost=1.0)

    async def speech(self, ctx: Context, ref: str) -> Result:
        speech = await self.client.synthesize_speech(line_for(ref), stamps=ctx)
        return Result(cost=float(speech.characters))

    async def video(self, ctx: Context, ref: str) -> RemoteWait | Result:
        job = await self.client.submit_video(
            prompt_for(ref), stamps=ctx, idempotency_key=ctx.idempotency_key
        )
        if not self.config.hold_video_slot:
            return ctx.await_remote(
                job, every=self.config.poll_every, timeout=self.config.window * 20
            )
        while True:  # holding the slot while the vendor works: what not to do
            answer = await self.poll(ctx, job)
            if isinstance(answer, Result):
                return answer
            await asyncio.sleep(self.config.poll_every)

    async def poll(self, ctx: Context, job: str) -> Result | Pending:
        status = await self.client.query_video(job)
        if status.state == "pending":
            return Pending()
        if status.state == "failed":
            raise RemoteFailed("the vendor reported the video job failed", code="video_failed")
        return Result(cost=CLIP_SECONDS)

    async def assemble(self, ctx: Context, episode: str) -> Result:
        await asyncio.sleep(self.config.assembly_time)  # muxing the cut: local work
        return Result(cost=float(self.config.shots) * CLIP_SECONDS)


def lower_bound(
    config: StudioConfig,
    latency: Latency,
    calls: Mapping[str, int],
    *,
    rush_at: float = 0.0,
) -> float:
    """No schedule can finish sooner: for each provider, its rate windows and its concurrency
    each force a minimum time for its calls, after the first script; and the rush episode,
    arriving at `rush_at`, needs its own critical path (script, image, video, assembly)."""
    window = config.window
    image, video = latency.scaled("image", window), latency.scaled("video", window)
    bounds = [rush_at + config.script_time + image + video + config.assembly_time]
    for provider, count in calls.items():
        if not count:
            continue
        quota = config.quotas[provider]
        duration = latency.scaled(provider, window)
        by_rate = (math.ceil(count / quota.rpm) - 1) * window + duration
        by_concurrency = math.ceil(count / quota.concurrency) * duration
        lead = config.script_time + (image if provider == "video" else 0.0)
        bounds.append(lead + max(by_rate, by_concurrency))
    return max(bounds)
