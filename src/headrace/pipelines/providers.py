"""The MiniMax adapter: the one seam between pipelines and the vendor's HTTP API.

Every call either returns a small value or raises a `TaskFailure` the runtime knows how to treat:
`RateLimited` (1002/1039, HTTP 429 with its Retry-After), `Fatal` (auth, balance, parameters,
moderation, client errors: never retried) or `Transient` (5xx, unknown codes, timeouts, transport
errors, malformed answers). Failure messages say which call failed and never carry the api key.

A vendor counts a request when it arrives. Each call that a gate's rate counts takes `stamps`,
the handler's context (`stamps=ctx`): just before the request's headers are written, once its
connection is open (httpx's `trace` extension), `stamps.leaving()` checks the lease (a worker
that lost it does not send the call); once the request has left, `stamps.started()` stamps its
start. Until then the start stays reserved, counting in every window, so the gate counts the
call no later than the vendor does, however long this process took to send it on a loaded
machine, and not from the grant of its ticket nor from a slow connection set-up. A stamp the
store cannot take leaves the start reserved until the attempt's outcome stamps it.

The same code talks to the real API (`httpx.AsyncClient(base_url="https://api.minimax.io")`) or
to the provider simulator, in process via `in_process(sim)` or over a socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from headrace.pipelines.providersim import ProviderSimulator, create_app
from headrace.policy.clock import Clock, WallClock
from headrace.policy.errors import RateLimited, StoreError, TaskFailure, Transient
from headrace.policy.redact import redact
from headrace.policy.vendor import http_failure, minimax_failure

MINIMAX_BASE_URL = "https://api.minimax.io"
SIM_BASE_URL = "http://provider-sim.local"

_PENDING = frozenset({"Preparing", "Queueing", "Processing"})

Trace = Callable[[str, dict[str, Any]], Awaitable[None]]
SENDING = ".send_request_headers.started"  # httpcore's trace event: the request leaves now
LEFT = ".send_request_body.complete"  # and has left


class Stamps(Protocol):
    """What a call tells its gates (a handler's `Context` is one)."""

    def leaving(self) -> Awaitable[object]: ...

    def started(self) -> Awaitable[object]: ...


def stamping(stamps: Stamps) -> Trace:
    """An httpx `trace` extension: `leaving()` as the request's headers go out (LeaseLost stops
    the call), `started()` once its body is out (best effort: the call has left whatever the
    store says, and an unstamped start counts from the outcome)."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith(SENDING):
            await stamps.leaving()
        elif event.endswith(LEFT):
            with contextlib.suppress(StoreError):
                await stamps.started()

    return trace


@dataclass(frozen=True)
class Image:
    """A generated image. The URLs may be signed: keep them out of logs and task refs."""

    id: str
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Speech:
    """Synthesised speech: the audio bytes, its length and the characters billed."""

    audio: bytes
    duration_ms: int
    characters: int


@dataclass(frozen=True)
class VideoStatus:
    """Where a remote video job stands: `pending`, `succeeded` (with `file_id`) or `failed`.
    `vendor_status` is the provider's own word (Queueing, Processing, Success, Fail)."""

    state: Literal["pending", "succeeded", "failed"]
    file_id: str | None = None
    vendor_status: str = ""

    @property
    def done(self) -> bool:
        return self.state != "pending"


@dataclass(frozen=True)
class Models:
    """The model and voice names sent with each call."""

    image: str = "image-01"
    speech: str = "speech-02-hd"
    video: str = "MiniMax-Hailuo-02"
    voice: str = "male-qn-qingse"


def _malformed(op: str, what: str) -> Transient:
    return Transient(f"{op}: malformed response ({what})", code="malformed_response")


def _dig(op: str, payload: Mapping[str, object], path: str) -> object:
    value: object = payload
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise _malformed(op, f"no {path}")
        value = value[key]
    return value


def _text(op: str, payload: Mapping[str, object], path: str) -> str:
    value = _dig(op, payload, path)
    if not isinstance(value, str) or not value:
        raise _malformed(op, f"{path} is not a non-empty string")
    return value


def _count(op: str, payload: Mapping[str, object], path: str) -> int:
    value = _dig(op, payload, path)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(op, f"{path} is not an integer")
    return value


def _status_msg(payload: Mapping[str, object]) -> str:
    base = payload.get("base_resp")
    message = base.get("status_msg") if isinstance(base, dict) else None
    return message if isinstance(message, str) else ""


def _json_object(op: str, response: httpx.Response) -> Mapping[str, object]:
    try:
        value = response.json()
    except ValueError as exc:  # bad JSON and bad UTF-8 alike
        raise _malformed(op, "not JSON") from exc
    if not isinstance(value, dict):
        raise _malformed(op, "not a JSON object")
    return value


class MiniMaxClient:
    """MiniMax image, speech and video calls over `http`, whose `base_url` points at the API
    (or the simulator). An empty `api_key` sends no Authorization header; the provider's
    refusal then surfaces as `Fatal`. `clock` dates an HTTP-date Retry-After."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        api_key: str,
        *,
        models: Models = Models(),
        clock: Clock | None = None,
    ) -> None:
        self._http = http
        self._api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._models = models
        self._clock: Clock = clock if clock is not None else WallClock()

    def __repr__(self) -> str:
        return f"MiniMaxClient(base_url={str(self._http.base_url)!r})"

    async def generate_image(self, prompt: str, *, stamps: Stamps | None = None) -> Image:
        """One image for `prompt`."""
        op = "image generation"
        body = {"model": self._models.image, "prompt": prompt, "n": 1, "response_format": "url"}
        payload = await self._call(op, "POST", "/v1/image_generation", body=body, stamps=stamps)
        urls = _dig(op, payload, "data.image_urls")
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise _malformed(op, "data.image_urls is not a list of URLs")
        image_id = payload.get("id")
        return Image(id=str(image_id) if image_id is not None else "", urls=tuple(urls))

    async def synthesize_speech(self, text: str, *, stamps: Stamps | None = None) -> Speech:
        """Speech for `text` in the configured voice, as mp3 bytes."""
        op = "speech synthesis"
        body = {
            "model": self._models.speech,
            "text": text,
            "stream": False,
            "voice_setting": {"voice_id": self._models.voice, "speed": 1, "vol": 1, "pitch": 0},
            "audio_setting": {"format": "mp3", "sample_rate": 32000},
        }
        payload = await self._call(op, "POST", "/v1/t2a_v2", body=body, stamps=stamps)
        try:
            audio = bytes.fromhex(_text(op, payload, "data.audio"))
        except ValueError as exc:
            raise _malformed(op, "data.audio is not hex") from exc
        duration = _count(op, payload, "extra_info.audio_length")
        billed = payload.get("extra_info")
        characters = billed.get("usage_characters") if isinstance(billed, dict) else None
        if not isinstance(characters, int):
            characters = len(text)
        return Speech(audio=audio, duration_ms=duration, characters=characters)

    async def submit_video(
        self,
        prompt: str,
        first_frame: str | None = None,
        *,
        stamps: Stamps | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Submit a video job (optionally from a first frame image URL); returns its task id.
        With `idempotency_key` (a handler passes `ctx.idempotency_key`), a submission sent again
        after its answer was lost names the same job instead of starting a second one."""
        op = "video submission"
        body = {"model": self._models.video, "prompt": prompt}
        if first_frame is not None:
            body["first_frame_image"] = first_frame
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        payload = await self._call(
            op, "POST", "/v1/video_generation", body=body, stamps=stamps, headers=headers
        )
        return _text(op, payload, "task_id")

    async def query_video(self, task_id: str) -> VideoStatus:
        """Where the video job `task_id` stands. An unknown task id is `Fatal`."""
        op = "video query"
        params = {"task_id": task_id}
        payload = await self._call(op, "GET", "/v1/query/video_generation", params=params)
        status = _text(op, payload, "status")
        if status in _PENDING:
            return VideoStatus("pending", vendor_status=status)
        if status == "Success":
            return VideoStatus("succeeded", _text(op, payload, "file_id"), status)
        if status == "Fail":
            return VideoStatus("failed", vendor_status=status)
        raise _malformed(op, f"unknown video status {status[:40]!r}")

    async def _call(
        self,
        op: str,
        method: str,
        path: str,
        *,
        body: Mapping[str, object] | None = None,
        params: Mapping[str, str] | None = None,
        stamps: Stamps | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Mapping[str, object]:
        extensions = {} if stamps is None else {"trace": stamping(stamps)}
        try:
            response = await self._http.request(
                method,
                path,
                json=body,
                params=params,
                headers={**self._headers, **(headers or {})},
                extensions=extensions,
            )
        except httpx.TimeoutException as exc:
            raise Transient(f"{op}: timed out ({type(exc).__name__})", code="timeout") from exc
        except httpx.RequestError as exc:
            raise Transient(
                f"{op}: transport error ({type(exc).__name__})", code="transport"
            ) from exc
        retry_after = response.headers.get("retry-after")
        failure = http_failure(response.status_code, retry_after, self._clock.now())
        if failure is not None:
            raise self._rephrase(op, failure)
        payload = _json_object(op, response)
        code = _count(op, payload, "base_resp.status_code")
        failure = minimax_failure(code)
        if failure is not None:
            raise self._rephrase(op, failure, _status_msg(payload))
        return payload

    def _rephrase(self, op: str, failure: TaskFailure, detail: str = "") -> TaskFailure:
        """`failure` with the call named and the vendor's message added, minus any secret."""
        message = f"{op}: {failure.message}" + (f" ({detail})" if detail else "")
        if self._api_key:
            message = message.replace(self._api_key, "[redacted]")
        message = redact(message)
        if isinstance(failure, RateLimited):
            return RateLimited(
                message, code=failure.code, retry_after=failure.retry_after, gate=failure.gate
            )
        return type(failure)(message, code=failure.code)


class _TracedASGITransport(httpx.ASGITransport):
    """An ASGI transport that, like a network one, calls the `trace` extension as the request
    goes out and once it has left (in process, it has arrived as it left)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        trace = request.extensions.get("trace")
        if trace is not None:
            await trace("asgi" + SENDING, {"request": request})
            await trace("asgi" + LEFT, {"request": request})
        return await super().handle_async_request(request)


def in_process(sim: ProviderSimulator) -> httpx.AsyncClient:
    """An HTTP client wired straight to `sim`'s app (no socket): the adapter's real code path,
    on whatever loop runs it (the virtual clock in tests). Close it (`async with`) when done."""
    return httpx.AsyncClient(
        transport=_TracedASGITransport(app=create_app(sim)), base_url=SIM_BASE_URL
    )
