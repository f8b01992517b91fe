"""A provider simulator that answers like the MiniMax API and referees its quotas.

Everything runs without keys or network: `in_process(sim)` in `providers` talks to it over HTTP in
the same process (on the virtual clock in tests), and `serve`/`run_server` put it on a socket.

The simulator is the referee. Per provider it counts accepted request arrivals in a sliding
window of `window` seconds (an arrival counts while `arrival > now - window`) and the work in
flight (image and speech: requests being processed; video: jobs submitted and not yet done).
A request that would exceed the provider's rpm in the window, or its concurrency, answers
status 1002 and is counted as `rejected`; it does not consume quota. Injected faults are counted
as `injected`, never as quota violations.

Faults (`inject`, like the INJECT variable): `ratelimit` answers 1002 to the first image call and
the first two speech calls; `auth` answers 1004 to the first call to each provider; `flaky`
answers a seeded ~15% of image and speech calls with an unknown code (1000, half of them as
HTTP 503); `videofail` ends the first video job in `Fail`; `slowsubmit` creates the first video
job at once but answers its submission only a window later (an answer a client gives up on).
"First" counts authorised, well-formed calls since the start or the last reset. A call without
`Authorization: Bearer <token>` gets 1004.

A video submission may carry an `Idempotency-Key` header: the same key again answers with the
same job (counted as a request, not as a new job: `replayed`).

Every call's arrival is recorded when its request reaches the simulator, before its body is read,
with whether it was accepted: `arrivals()` (and `GET /sim/arrivals`) return them, so a test can
judge every sliding window itself.

Time comes from the running event loop, so it is virtual under `headrace.sim.loop.run` and real
under uvicorn. Quotas are "requests per window": the window defaults to 6 s (a compressed minute,
with the real per-minute numbers); 60 s gives real behaviour, and latencies scale with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import socket
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from headrace.policy.errors import ConfigError

PROVIDERS = ("image", "speech", "video")
INJECTIONS = frozenset({"ratelimit", "auth", "flaky", "videofail", "slowsubmit"})
FLAKY_RATE = 0.15
REAL_MINUTE = 60.0
ARRIVALS_KEPT = 100_000  # per provider: the newest arrivals `arrivals()` can return
KEEP_ALIVE = 30  # seconds the HTTP server keeps an idle connection open

# MiniMax status codes the simulator answers with.
OK = 0
UNKNOWN_ERROR = 1000
RATE_LIMITED = 1002
AUTH_FAILED = 1004
INVALID_PARAMS = 2013

_RATELIMITED_CALLS = MappingProxyType({"image": 1, "speech": 2})
_FLAKY_PROVIDERS = frozenset({"image", "speech"})
_MAX_PROMPT = 2000
_MAX_TEXT = 10_000
_MAX_IMAGES = 9
_MS_PER_CHARACTER = 60


@dataclass(frozen=True)
class Quota:
    """A provider's quota: `rpm` requests per window and `concurrency` requests or jobs at once."""

    rpm: int
    concurrency: int

    def __post_init__(self) -> None:
        for name in ("rpm", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"quota.{name}: expected a positive integer, got {value!r}")


STUDIO_QUOTAS: Mapping[str, Quota] = MappingProxyType(
    {"image": Quota(10, 2), "speech": Quota(20, 3), "video": Quota(20, 2)}
)


@dataclass(frozen=True)
class Latency:
    """Simulated durations in seconds *for a 60 s window*; the simulator scales them by
    window/60, so at the default 6 s window an image takes 0.4 s. `video` is the processing
    time of a job after its submission (the submission itself answers at once)."""

    image: float = 4.0
    speech: float = 2.0
    video: float = 20.0

    def __post_init__(self) -> None:
        for name in PROVIDERS:
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"latency.{name}: expected seconds >= 0, got {value!r}")

    def scaled(self, provider: str, window: float) -> float:
        """The duration of one `provider` call when the rate window is `window` seconds."""
        durations = {"image": self.image, "speech": self.speech, "video": self.video}
        return float(durations[provider]) * window / REAL_MINUTE


@dataclass(frozen=True)
class Spread:
    """A call's duration drawn uniformly from [low, high] seconds (not scaled by the window)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ConfigError(f"latency: expected 0 <= low <= high, got {self.low}..{self.high}")


@dataclass
class ProviderStats:
    """The referee's figures for one provider. `received` counts every call (video polls are
    counted apart in `polls`); `rejected` counts quota refusals only; `replayed` the accepted
    submissions that named an earlier job's idempotency key (no new job); `max_in_window` is
    the most accepted arrivals ever seen in one sliding window, `max_concurrent` the most work
    in flight at once."""

    quota: Quota
    received: int = 0
    accepted: int = 0
    rejected: int = 0
    injected: int = 0
    unauthorized: int = 0
    invalid: int = 0
    polls: int = 0
    replayed: int = 0
    max_in_window: int = 0
    max_concurrent: int = 0

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SimReply:
    """One answer: a MiniMax-shaped JSON body and the HTTP status (200 even for vendor errors)."""

    body: dict[str, object]
    http_status: int = 200


def parse_inject(value: str | Iterable[str]) -> frozenset[str]:
    """Fault names from `"ratelimit,flaky"` or an iterable; an unknown name is a ConfigError
    (a ValueError) that names it. Known: ratelimit, auth, flaky, videofail, slowsubmit."""
    names = value.split(",") if isinstance(value, str) else value
    chosen = frozenset(name.strip() for name in names if name.strip())
    for name in sorted(chosen):
        if name not in INJECTIONS:
            known = ", ".join(sorted(INJECTIONS))
            raise ConfigError(f"inject: unknown fault {name!r} (known: {known})")
    return chosen


def _reply(code: int, message: str, http_status: int = 200, **fields: object) -> SimReply:
    body: dict[str, object] = dict(fields)
    body["base_resp"] = {"status_code": code, "status_msg": message}
    return SimReply(body, http_status)


@dataclass
class _Referee:
    """One provider's quota state: recent accepted arrivals and the work in flight."""

    quota: Quota
    window: float
    stats: ProviderStats
    arrivals: deque[float] = field(default_factory=deque)
    log: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))
    in_flight: int = 0
    job_ends: list[float] = field(default_factory=list)
    calls: int = 0  # authorised, well-formed calls: what the injections count

    def busy(self, now: float) -> int:
        self.job_ends = [end for end in self.job_ends if end > now]
        return self.in_flight + len(self.job_ends)

    def in_window(self, now: float) -> int:
        while self.arrivals and self.arrivals[0] <= now - self.window:
            self.arrivals.popleft()
        return len(self.arrivals)

    def refusal(self, now: float) -> str | None:
        if self.in_window(now) >= self.quota.rpm:
            return f"rate limit exceeded: {self.quota.rpm} requests per {self.window:g}s window"
        if self.busy(now) >= self.quota.concurrency:
            return f"rate limit exceeded: {self.quota.concurrency} in flight"
        return None

    def admit(self, now: float, job_end: float | None) -> str | None:
        """None when the call is accepted (and counted); otherwise why it is refused."""
        refusal = self.refusal(now)
        self.log.append((now, refusal is None))
        if refusal is not None:
            self.stats.rejected += 1
            return refusal
        self.arrivals.append(now)
        if job_end is None:
            self.in_flight += 1
        else:
            self.job_ends.append(job_end)
        self.stats.accepted += 1
        self.stats.max_in_window = max(self.stats.max_in_window, len(self.arrivals))
        self.stats.max_concurrent = max(self.stats.max_concurrent, self.busy(now))
        return None


@dataclass(frozen=True)
class _Job:
    done_at: float
    file_id: str
    fails: bool


def most_in_a_window(times: Iterable[float], window: float) -> int:
    """The most of `times` in any window `[t, t + window)`, as a vendor counting arrivals
    would see them (what a test judges the referee's arrival log with)."""
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + window) for s in ordered), default=0)


def _check_quotas(quotas: Mapping[str, Quota]) -> Mapping[str, Quota]:
    if set(quotas) != set(PROVIDERS):
        raise ConfigError(f"quotas: expected exactly {', '.join(PROVIDERS)}, got {sorted(quotas)}")
    return MappingProxyType(dict(quotas))


def _authorized(authorization: str | None) -> bool:
    if authorization is None:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip())


def _missing(body: Mapping[str, object] | None, required: tuple[str, ...]) -> str | None:
    if body is None:
        return "body: expected a JSON object"
    for name in required:
        value = body.get(name)
        if not isinstance(value, str) or not value.strip():
            return f"{name}: required, a non-empty string"
    return None


def _too_long(body: Mapping[str, object], name: str, limit: int) -> str | None:
    value = body.get(name)
    if isinstance(value, str) and len(value) > limit:
        return f"{name}: at most {limit} characters"
    return None


def _image_problem(body: Mapping[str, object] | None) -> str | None:
    problem = _missing(body, ("model", "prompt"))
    if problem is not None or body is None:
        return problem
    count = body.get("n", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_IMAGES:
        return f"n: expected an integer from 1 to {_MAX_IMAGES}"
    return _too_long(body, "prompt", _MAX_PROMPT)


def _speech_problem(body: Mapping[str, object] | None) -> str | None:
    problem = _missing(body, ("model", "text"))
    if problem is not None or body is None:
        return problem
    return _too_long(body, "text", _MAX_TEXT)


def _video_problem(body: Mapping[str, object] | None) -> str | None:
    problem = _missing(body, ("model", "prompt"))
    if problem is not None or body is None:
        return problem
    frame = body.get("first_frame_image")
    if frame is not None and not (isinstance(frame, str) and frame.strip()):
        return "first_frame_image: expected a non-empty string (a URL or a data URL)"
    return _too_long(body, "prompt", _MAX_PROMPT)


class ProviderSimulator:
    """A MiniMax-like provider for image, speech and video that enforces `quotas` per sliding
    `window` and injects the faults named in `inject` (see `parse_inject`); `seed` makes the
    `flaky` faults reproducible. Must be called from a running event loop."""

    def __init__(
        self,
        window: float = 6.0,
        quotas: Mapping[str, Quota] = STUDIO_QUOTAS,
        latency: Latency = Latency(),
        inject: str | Iterable[str] = frozenset(),
        seed: int = 0,
        spreads: Mapping[str, Spread] | None = None,
    ) -> None:
        """`spreads`: per provider, call durations drawn from a range instead of `latency`."""
        if isinstance(window, bool) or not isinstance(window, int | float) or not window > 0:
            raise ConfigError(f"window: expected seconds > 0, got {window!r}")
        self.window = float(window)
        self.quotas = _check_quotas(quotas)
        self.latency = latency
        self.inject = parse_inject(inject)
        self.seed = seed
        self.spreads = dict(spreads or {})
        self._durations = random.Random(seed + 1)  # apart from the faults' sequence
        self._referees = {name: self._fresh(name) for name in PROVIDERS}
        self._rng = random.Random(seed)
        self._jobs: dict[str, _Job] = {}
        self._keyed: dict[str, str] = {}  # idempotency key -> the video job it started
        self._serial = itertools.count(1)

    def _fresh(self, provider: str) -> _Referee:
        quota = self.quotas[provider]
        return _Referee(quota, self.window, ProviderStats(quota))

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def stats(self) -> dict[str, ProviderStats]:
        """A copy of the referee's figures, by provider."""
        return {name: dataclasses.replace(ref.stats) for name, ref in self._referees.items()}

    def arrivals(self) -> dict[str, list[tuple[float, bool]]]:
        """Every recorded call arrival per provider: (time, accepted), oldest first."""
        return {name: list(referee.log) for name, referee in self._referees.items()}

    def stats_json(self) -> dict[str, object]:
        providers = {name: stats.as_dict() for name, stats in self.stats().items()}
        return {"window": self.window, "inject": sorted(self.inject), "providers": providers}

    def reset(self) -> None:
        """Clear the figures and restart the injections (and the flaky sequence). Quota state
        carries on, as a real provider's would: recent arrivals and work in flight still count,
        and submitted video jobs can still be queried."""
        for name, referee in self._referees.items():
            referee.stats = ProviderStats(self.quotas[name])
            referee.calls = 0
        self._rng = random.Random(self.seed)

    async def generate_image(
        self,
        body: Mapping[str, object] | None,
        authorization: str | None,
        arrived: float | None = None,
    ) -> SimReply:
        """POST /v1/image_generation: answers after the image latency."""
        refused = self._enter("image", authorization, _image_problem(body), arrived=arrived)
        if refused is not None:
            return refused
        assert body is not None
        await self._process("image")
        image_id = f"img-{next(self._serial)}"
        count = body.get("n", 1)
        assert isinstance(count, int)
        urls = [f"https://provider-sim.invalid/images/{image_id}-{i}.jpeg" for i in range(count)]
        return _reply(
            OK,
            "success",
            id=image_id,
            data={"image_urls": urls},
            metadata={"success_count": count, "failed_count": 0},
        )

    async def synthesize_speech(
        self,
        body: Mapping[str, object] | None,
        authorization: str | None,
        arrived: float | None = None,
    ) -> SimReply:
        """POST /v1/t2a_v2: answers after the speech latency with hex audio."""
        refused = self._enter("speech", authorization, _speech_problem(body), arrived=arrived)
        if refused is not None:
            return refused
        assert body is not None
        await self._process("speech")
        text = str(body["text"])
        audio = b"SIMAUDIO" + text.encode()[:64]
        extra = {
            "audio_length": len(text) * _MS_PER_CHARACTER,
            "audio_size": len(audio),
            "audio_format": "mp3",
            "usage_characters": len(text),
        }
        return _reply(OK, "success", data={"audio": audio.hex(), "status": 2}, extra_info=extra)

    async def submit_video(
        self,
        body: Mapping[str, object] | None,
        authorization: str | None,
        arrived: float | None = None,
        idempotency_key: str | None = None,
    ) -> SimReply:
        """POST /v1/video_generation: answers at once with a task id; the job then runs. An
        idempotency key seen before answers with its job, and starts none."""
        known = self._keyed.get(idempotency_key or "")
        # A replay is a request like any (it counts against the rpm) but holds no job slot.
        done_at = self.now() + (0.0 if known else self._duration("video"))
        problem = _video_problem(body)
        refused = self._enter("video", authorization, problem, job_end=done_at, arrived=arrived)
        if refused is not None:
            return refused
        if known is not None:
            self._referees["video"].stats.replayed += 1
            return _reply(OK, "success", task_id=known)
        task_id = self._start_job(done_at)
        if idempotency_key:
            self._keyed[idempotency_key] = task_id
        if "slowsubmit" in self.inject and len(self._jobs) == 1:
            await asyncio.sleep(self.window)  # the job runs; its answer comes too late
        return _reply(OK, "success", task_id=task_id)

    def _start_job(self, done_at: float) -> str:
        serial = next(self._serial)
        fails = "videofail" in self.inject and self._referees["video"].stats.accepted == 1
        task_id = f"vid-{serial}"
        self._jobs[task_id] = _Job(done_at, f"file-{serial}", fails)
        return task_id

    @property
    def jobs(self) -> int:
        """How many video jobs were started."""
        return len(self._jobs)

    def query_video(self, task_id: str | None, authorization: str | None) -> SimReply:
        """GET /v1/query/video_generation: a job is Processing until its latency has passed.
        Polls do not count against the video rpm."""
        self._referees["video"].stats.polls += 1
        if not _authorized(authorization):
            return _reply(AUTH_FAILED, "authorization: missing or malformed Bearer token")
        job = self._jobs.get(task_id or "")
        if job is None:
            return _reply(INVALID_PARAMS, "invalid params, task_id: no such task", task_id=task_id)
        if self.now() < job.done_at:
            return _reply(OK, "success", task_id=task_id, status="Processing")
        if job.fails:
            return _reply(OK, "success", task_id=task_id, status="Fail")
        return _reply(OK, "success", task_id=task_id, status="Success", file_id=job.file_id)

    def _enter(
        self,
        provider: str,
        authorization: str | None,
        problem: str | None,
        job_end: float | None = None,
        arrived: float | None = None,
    ) -> SimReply | None:
        """Check a call in the order a provider would; None means accepted and counted. The
        quota counts it at `arrived` (now, when not given)."""
        referee = self._referees[provider]
        referee.stats.received += 1
        if not _authorized(authorization):
            referee.stats.unauthorized += 1
            return _reply(AUTH_FAILED, "authorization: missing or malformed Bearer token")
        if problem is not None:
            referee.stats.invalid += 1
            return _reply(INVALID_PARAMS, f"invalid params, {problem}")
        fault = self._fault(provider, referee)
        if fault is not None:
            referee.stats.injected += 1
            return fault
        refusal = referee.admit(self.now() if arrived is None else arrived, job_end)
        if refusal is not None:
            return _reply(RATE_LIMITED, refusal)
        return None

    def _fault(self, provider: str, referee: _Referee) -> SimReply | None:
        index = referee.calls
        referee.calls += 1
        if "auth" in self.inject and index == 0:
            return _reply(AUTH_FAILED, "invalid api key (injected)")
        if "ratelimit" in self.inject and index < _RATELIMITED_CALLS.get(provider, 0):
            return _reply(RATE_LIMITED, "rate limit exceeded (injected)")
        if "flaky" in self.inject and provider in _FLAKY_PROVIDERS:
            return self._flaky()
        return None

    def _flaky(self) -> SimReply | None:
        if self._rng.random() >= FLAKY_RATE:
            return None
        if self._rng.random() < 0.5:
            return _reply(UNKNOWN_ERROR, "unknown error (injected)")
        return _reply(UNKNOWN_ERROR, "service unavailable (injected)", http_status=503)

    def _duration(self, provider: str) -> float:
        spread = self.spreads.get(provider)
        if spread is None:
            return self.latency.scaled(provider, self.window)
        return self._durations.uniform(spread.low, spread.high)

    async def _process(self, provider: str) -> None:
        try:
            await asyncio.sleep(self._duration(provider))
        finally:
            self._referees[provider].in_flight -= 1


async def _json_body(request: Request) -> Mapping[str, object] | None:
    try:
        value = json.loads(await request.body())
    except ValueError:  # bad JSON and bad UTF-8 alike
        return None
    return value if isinstance(value, dict) else None


def _respond(reply: SimReply) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.http_status)


def create_app(sim: ProviderSimulator) -> Starlette:
    """The simulator's HTTP face: MiniMax's image, speech and video endpoints, plus
    `GET /sim/stats` (the referee's figures) and `POST /sim/reset`."""

    # Each call is counted when its request arrived, before its body is read.
    async def image(request: Request) -> JSONResponse:
        arrived, auth = sim.now(), request.headers.get("authorization")
        return _respond(await sim.generate_image(await _json_body(request), auth, arrived))

    async def speech(request: Request) -> JSONResponse:
        arrived, auth = sim.now(), request.headers.get("authorization")
        return _respond(await sim.synthesize_speech(await _json_body(request), auth, arrived))

    async def video(request: Request) -> JSONResponse:
        arrived, auth = sim.now(), request.headers.get("authorization")
        key = request.headers.get("idempotency-key")
        return _respond(await sim.submit_video(await _json_body(request), auth, arrived, key))

    async def query(request: Request) -> JSONResponse:
        auth = request.headers.get("authorization")
        return _respond(sim.query_video(request.query_params.get("task_id"), auth))

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(sim.stats_json())

    async def arrivals(request: Request) -> JSONResponse:
        return JSONResponse(sim.arrivals())

    async def reset(request: Request) -> JSONResponse:
        sim.reset()
        return JSONResponse(sim.stats_json())

    return Starlette(
        routes=[
            Route("/v1/image_generation", image, methods=["POST"]),
            Route("/v1/t2a_v2", speech, methods=["POST"]),
            Route("/v1/video_generation", video, methods=["POST"]),
            Route("/v1/query/video_generation", query, methods=["GET"]),
            Route("/sim/stats", stats, methods=["GET"]),
            Route("/sim/arrivals", arrivals, methods=["GET"]),
            Route("/sim/reset", reset, methods=["POST"]),
        ]
    )


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port`; a failure (port in use, unknown host) is an OSError
    that names the address."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        code = exc.errno or 0  # a resolver's codes are negative: keep its own words
        reason = os.strerror(code) if code > 0 else exc.strerror or str(exc)
        raise OSError(exc.errno, reason, f"{host}:{port}") from exc


class SimServer:
    """A simulator served over HTTP by uvicorn (real time; not for the virtual-time loop).

    `port` is the bound port once `run` has bound it (port 0 picks a free one). Use it as
    `async with SimServer(sim) as server: ...server.url...`, or run `run()` as a task and
    call `stop()`.
    """

    def __init__(
        self,
        sim: ProviderSimulator,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
    ) -> None:
        self.sim = sim
        self.host = host
        self.port = port
        config = uvicorn.Config(
            create_app(sim),
            log_config=None,
            log_level=log_level,
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
            # Idle connections outlive an httpx client's (5 s), as a vendor's do: the client
            # drops one first. Equal timeouts race: under load a request goes out on a
            # connection the server is closing, and fails with a transport error.
            timeout_keep_alive=KEEP_ALIVE,
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def run(
        self,
        ready: asyncio.Event | None = None,
        started: Callable[[SimServer], object] | None = None,
    ) -> None:
        """Serve until `stop()` or cancellation (both shut down gracefully). Once listening,
        calls `started(self)` and sets `ready`."""
        sock = _bind(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        task = asyncio.create_task(self._server.serve(sockets=[sock]))
        try:
            await self._until_started(task)
            if started is not None:
                started(self)
            if ready is not None:
                ready.set()
            await asyncio.shield(task)
        except asyncio.CancelledError:
            self.stop()
            await task
            raise
        finally:
            sock.close()

    async def _until_started(self, task: asyncio.Task[None]) -> None:
        while not self._server.started:
            if task.done():
                await task
                raise RuntimeError("provider simulator: server stopped before it started")
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        """Ask the server to finish its requests and exit."""
        self._server.should_exit = True

    async def __aenter__(self) -> SimServer:
        ready = asyncio.Event()
        self._task = asyncio.create_task(self.run(ready))
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({self._task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._task.done():  # it failed to start: raise its error here
            await self._task
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        if self._task is not None:
            await self._task


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    window: float = 6.0,
    inject: str | Iterable[str] = frozenset(),
    seed: int = 0,
    ready: asyncio.Event | None = None,
    started: Callable[[SimServer], object] | None = None,
    sim: ProviderSimulator | None = None,
    log_level: str = "warning",
) -> None:
    """Serve a provider simulator over HTTP until cancelled or signalled. Once listening it
    calls `started(server)` (the `SimServer`, whose `port`/`url` give the bound address) and
    sets `ready`. Pass `sim` to serve an existing simulator instead of building one."""
    simulator = sim if sim is not None else ProviderSimulator(window, inject=inject, seed=seed)
    await SimServer(simulator, host, port, log_level=log_level).run(ready, started)


def parse_quotas(values: Iterable[str]) -> dict[str, Quota]:
    """The studio quotas with overrides like `image=30/3` (rpm per window / at once)."""
    quotas = dict(STUDIO_QUOTAS)
    for value in values:
        provider, _, numbers = value.partition("=")
        rpm, _, concurrency = numbers.partition("/")
        if provider not in PROVIDERS or not rpm.isdigit() or not concurrency.isdigit():
            raise ConfigError(
                f"quota: expected PROVIDER=RPM/CONCURRENCY with PROVIDER one of "
                f"{', '.join(PROVIDERS)}, got {value!r}"
            )
        quotas[provider] = Quota(int(rpm), int(concurrency))
    return quotas


def parse_spreads(values: Iterable[str]) -> dict[str, Spread]:
    """Call durations like `image=0.2..0.5` (seconds, drawn uniformly per call)."""
    spreads: dict[str, Spread] = {}
    for value in values:
        provider, _, span = value.partition("=")
        low, _, high = span.partition("..")
        try:
            bounds = float(low), float(high)
        except ValueError:
            bounds = None
        if provider not in PROVIDERS or bounds is None:
            raise ConfigError(
                f"latency: expected PROVIDER=LOW..HIGH (seconds) with PROVIDER one of "
                f"{', '.join(PROVIDERS)}, got {value!r}"
            )
        spreads[provider] = Spread(*bounds)
    return spreads


def run_server(
    host: str = "127.0.0.1",
    port: int = 8090,
    window: float = 6.0,
    inject: str | Iterable[str] = frozenset(),
    seed: int = 0,
    quotas: Mapping[str, Quota] = STUDIO_QUOTAS,
    spreads: Mapping[str, Spread] | None = None,
) -> None:
    """Serve the simulator until Ctrl-C or SIGTERM: the `headrace provider-sim` command.
    `inject` may be a comma-separated string like the INJECT variable ("ratelimit,flaky").
    Prints the URL once listening; a bad fault name raises ConfigError before anything starts."""
    faults = parse_inject(inject)
    sim = ProviderSimulator(window, quotas=quotas, inject=faults, seed=seed, spreads=spreads)

    def announce(server: SimServer) -> None:
        named = ",".join(sorted(faults)) or "none"
        print(
            f"provider simulator on {server.url} (window {window:g}s, inject {named})", flush=True
        )

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, port, sim=sim, started=announce))
