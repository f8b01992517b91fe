"""The provider simulator as quota referee and fault injector, seen through the MiniMax adapter.

Every test but the last runs on the virtual clock: latencies and windows take no real time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from headrace.pipelines.providers import (
    Image,
    MiniMaxClient,
    Speech,
    VideoStatus,
    in_process,
)
from headrace.pipelines.providersim import (
    STUDIO_QUOTAS,
    Latency,
    ProviderSimulator,
    Quota,
    SimServer,
    Spread,
    parse_inject,
    parse_spreads,
    serve,
)
from headrace.policy.errors import ConfigError, Fatal, RateLimited, TaskFailure, Transient
from headrace.sim.loop import elapsed, run

KEY = "sk-test-0123456789abcdefSECRET"
T = TypeVar("T")
Scenario = Callable[[ProviderSimulator, MiniMaxClient, httpx.AsyncClient], Awaitable[None]]


def play(sim: ProviderSimulator, scenario: Scenario, api_key: str = KEY) -> None:
    """Run `scenario` against `sim` through the adapter, in process, on the virtual clock."""

    async def main() -> None:
        async with in_process(sim) as http:
            await scenario(sim, MiniMaxClient(http, api_key), http)

    run(main())


async def outcome(call: Awaitable[T]) -> T | TaskFailure:
    try:
        return await call
    except TaskFailure as failure:
        return failure


async def sleep_until(when: float) -> None:
    await asyncio.sleep(when - asyncio.get_running_loop().time())


def test_studio_quotas_are_the_seed_numbers() -> None:
    assert dict(STUDIO_QUOTAS) == {
        "image": Quota(10, 2),
        "speech": Quota(20, 3),
        "video": Quota(20, 2),
    }


def test_latency_scales_with_the_window() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        _, image_time = await elapsed(mm.generate_image("a lighthouse"))
        _, speech_time = await elapsed(mm.synthesize_speech("hello"))
        assert image_time == pytest.approx(0.4)
        assert speech_time == pytest.approx(0.2)

    play(ProviderSimulator(), scenario)

    async def real_minute(
        sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient
    ) -> None:
        _, image_time = await elapsed(mm.generate_image("a lighthouse"))
        assert image_time == pytest.approx(4.0)

    play(ProviderSimulator(window=60), real_minute)
    assert Latency(image=1.0).scaled("image", 6.0) == pytest.approx(0.1)


def test_rpm_burst_is_accepted_then_refused_until_the_window_slides() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        for i in range(10):  # concurrency 2 keeps one image at a time here: 0.4 s each
            assert isinstance(await mm.generate_image(f"shot {i}"), Image)
        with pytest.raises(RateLimited) as refused:
            await mm.generate_image("one too many")
        assert refused.value.code == "minimax_1002"
        await sleep_until(5.9)  # the first arrival (t=0) is still inside the window
        with pytest.raises(RateLimited):
            await mm.generate_image("still too many")
        await sleep_until(6.05)
        assert isinstance(await mm.generate_image("room again"), Image)

    sim = ProviderSimulator()
    play(sim, scenario)
    image = sim.stats()["image"]
    assert (image.received, image.accepted, image.rejected) == (13, 11, 2)
    assert image.max_in_window == 10
    assert image.injected == 0


def test_a_whole_burst_starts_at_once_when_concurrency_allows() -> None:
    quotas = {**STUDIO_QUOTAS, "image": Quota(10, 20)}

    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        results = await asyncio.gather(*(outcome(mm.generate_image(f"s{i}")) for i in range(11)))
        assert sum(isinstance(r, Image) for r in results) == 10
        assert [type(r) for r in results if not isinstance(r, Image)] == [RateLimited]

    sim = ProviderSimulator(quotas=quotas)
    play(sim, scenario)
    assert sim.stats()["image"].max_in_window == 10
    assert sim.stats()["image"].max_concurrent == 10


def test_concurrency_over_the_cap_is_refused() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        images = await asyncio.gather(*(outcome(mm.generate_image(f"s{i}")) for i in range(3)))
        speech = await asyncio.gather(*(outcome(mm.synthesize_speech(f"l{i}")) for i in range(4)))
        assert [type(r) for r in images] == [Image, Image, RateLimited]
        assert [type(r) for r in speech] == [Speech, Speech, Speech, RateLimited]
        # Once the first two finish, the cap has room again.
        assert isinstance(await mm.generate_image("after"), Image)

    sim = ProviderSimulator()
    play(sim, scenario)
    stats = sim.stats()
    assert (stats["image"].max_concurrent, stats["image"].rejected) == (2, 1)
    assert (stats["speech"].max_concurrent, stats["speech"].rejected) == (3, 1)


def test_video_jobs_hold_concurrency_until_they_finish_processing() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        first = await mm.submit_video("clip 1")
        await mm.submit_video("clip 2", first_frame="https://example.invalid/frame.png")
        with pytest.raises(RateLimited):
            await mm.submit_video("clip 3")  # two jobs are processing
        await sleep_until(2.0)  # 20 s at a 60 s window is 2 s at 6 s
        assert (await mm.query_video(first)).state == "succeeded"
        await mm.submit_video("clip 3")

    sim = ProviderSimulator()
    play(sim, scenario)
    video = sim.stats()["video"]
    assert (video.accepted, video.rejected, video.max_concurrent) == (3, 1, 2)


def test_video_is_processing_then_succeeds_after_its_latency() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        task_id = await mm.submit_video("a wave breaks")
        early = await mm.query_video(task_id)
        assert early == VideoStatus("pending", vendor_status="Processing")
        assert not early.done
        await sleep_until(1.99)
        assert (await mm.query_video(task_id)).state == "pending"
        await sleep_until(2.0)
        done = await mm.query_video(task_id)
        assert (done.state, done.vendor_status, done.done) == ("succeeded", "Success", True)
        assert done.file_id

    sim = ProviderSimulator()
    play(sim, scenario)
    video = sim.stats()["video"]
    assert (video.received, video.accepted, video.polls) == (1, 1, 3)


def test_polls_do_not_count_against_the_video_rpm() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        task_id = await mm.submit_video("a wave breaks")
        for _ in range(50):
            await mm.query_video(task_id)
        assert isinstance(await mm.submit_video("another"), str)

    play(ProviderSimulator(), scenario)


def test_an_unknown_task_id_is_fatal() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        with pytest.raises(Fatal) as refused:
            await mm.query_video("no-such-task")
        assert refused.value.code == "minimax_2013"
        assert "task_id" in refused.value.message

    play(ProviderSimulator(), scenario)


def test_ratelimit_injection_refuses_the_first_image_and_the_first_two_speech_calls() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        images = [await outcome(mm.generate_image("s")) for _ in range(3)]
        speech = [await outcome(mm.synthesize_speech("l")) for _ in range(4)]
        video = await outcome(mm.submit_video("v"))
        assert [type(r) for r in images] == [RateLimited, Image, Image]
        assert [type(r) for r in speech] == [RateLimited, RateLimited, Speech, Speech]
        assert isinstance(video, str)

    sim = ProviderSimulator(inject="ratelimit")
    play(sim, scenario)
    stats = sim.stats()
    assert [stats[p].injected for p in ("image", "speech", "video")] == [1, 2, 0]
    assert [stats[p].rejected for p in ("image", "speech", "video")] == [0, 0, 0]


def test_auth_injection_fails_the_first_call_to_each_provider() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        for call in (
            lambda: mm.generate_image("s"),
            lambda: mm.synthesize_speech("l"),
            lambda: mm.submit_video("v"),
        ):
            with pytest.raises(Fatal) as refused:
                await call()
            assert refused.value.code == "minimax_1004"
            assert KEY not in str(refused.value)
            await call()

    sim = ProviderSimulator(inject=["auth"])
    play(sim, scenario)
    assert all(stats.injected == 1 for stats in sim.stats().values())


def test_flaky_injection_answers_unknown_codes_the_adapter_treats_as_transient() -> None:
    roomy = {name: Quota(1000, 10) for name in ("image", "speech", "video")}
    failures: list[TaskFailure] = []

    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        for i in range(60):
            for call in (mm.generate_image(f"s{i}"), mm.synthesize_speech(f"l{i}")):
                result = await outcome(call)
                if isinstance(result, TaskFailure):
                    failures.append(result)
        for _ in range(10):
            await mm.submit_video("video is never flaky")

    sim = ProviderSimulator(quotas=roomy, inject="flaky", seed=7)
    play(sim, scenario)
    stats = sim.stats()
    assert all(isinstance(failure, Transient) for failure in failures)
    assert {failure.code for failure in failures} == {"minimax_1000", "http_503"}
    assert len(failures) == stats["image"].injected + stats["speech"].injected
    assert 6 <= len(failures) <= 36  # about 15% of 120 calls
    assert stats["video"].injected == 0


def test_videofail_injection_fails_the_first_job() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        first = await mm.submit_video("v1")
        second = await mm.submit_video("v2")
        await sleep_until(2.0)
        assert (await mm.query_video(first)).state == "failed"
        assert (await mm.query_video(second)).state == "succeeded"

    play(ProviderSimulator(inject="videofail"), scenario)


def test_a_missing_authorization_header_is_fatal() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        raw = await http.post("/v1/image_generation", json={"model": "image-01", "prompt": "p"})
        assert raw.status_code == 200
        assert raw.json()["base_resp"]["status_code"] == 1004
        with pytest.raises(Fatal) as refused:
            await mm.synthesize_speech("hello")
        assert refused.value.code == "minimax_1004"

    sim = ProviderSimulator()
    play(sim, scenario, api_key="")
    assert sim.stats()["image"].unauthorized == 1
    assert sim.stats()["speech"].unauthorized == 1


def test_bodies_are_validated_and_the_message_names_the_field() -> None:
    headers = {"Authorization": f"Bearer {KEY}"}

    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        cases = [
            ("/v1/image_generation", {"model": "image-01"}, "prompt"),
            ("/v1/t2a_v2", {"model": "speech-02-hd", "text": ""}, "text"),
            ("/v1/video_generation", {"prompt": "p"}, "model"),
            ("/v1/image_generation", {"model": "image-01", "prompt": "p", "n": 0}, "n"),
        ]
        for path, body, field in cases:
            answer = (await http.post(path, json=body, headers=headers)).json()
            assert answer["base_resp"]["status_code"] == 2013
            assert field in answer["base_resp"]["status_msg"]
        broken = await http.post("/v1/t2a_v2", content=b"{not json", headers=headers)
        assert broken.json()["base_resp"]["status_code"] == 2013

    sim = ProviderSimulator()
    play(sim, scenario)
    assert sim.stats()["image"].invalid == 2
    assert sim.stats()["image"].accepted == 0


def test_refused_and_invalid_requests_consume_no_quota() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        await asyncio.gather(*(outcome(mm.generate_image("s")) for _ in range(30)))
        await sleep_until(1.0)
        for _ in range(8):
            await mm.generate_image("s")

    sim = ProviderSimulator()
    play(sim, scenario)
    image = sim.stats()["image"]
    assert (image.accepted, image.rejected, image.max_in_window) == (10, 28, 10)


def test_stats_and_reset_over_http() -> None:
    async def scenario(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        await mm.generate_image("s")
        figures = (await http.get("/sim/stats")).json()
        assert figures["window"] == 6.0
        assert figures["providers"]["image"]["accepted"] == 1
        assert figures["providers"]["image"]["quota"] == {"rpm": 10, "concurrency": 2}
        cleared = (await http.post("/sim/reset")).json()
        assert cleared["providers"]["image"]["accepted"] == 0

    sim = ProviderSimulator()
    play(sim, scenario)

    async def rearmed(sim: ProviderSimulator, mm: MiniMaxClient, http: httpx.AsyncClient) -> None:
        assert isinstance(await outcome(mm.generate_image("s")), RateLimited)
        await mm.generate_image("s")
        await http.post("/sim/reset")
        assert isinstance(await outcome(mm.generate_image("s")), RateLimited)

    play(ProviderSimulator(inject="ratelimit"), rearmed)


def test_the_api_key_never_reaches_an_error_message() -> None:
    def echo_key(request: httpx.Request) -> httpx.Response:
        message = f"invalid api key {KEY} (Authorization: {request.headers['authorization']})"
        return httpx.Response(200, json={"base_resp": {"status_code": 1004, "status_msg": message}})

    async def main() -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(echo_key), base_url="http://x"
        ) as http:
            with pytest.raises(Fatal) as refused:
                await MiniMaxClient(http, KEY).generate_image("p")
        assert KEY not in str(refused.value)
        assert KEY not in repr(refused.value)
        assert "invalid api key" in refused.value.message

    run(main())


def test_http_errors_and_broken_answers_are_classified() -> None:
    answers = {
        "/v1/image_generation": httpx.Response(429, headers={"Retry-After": "7"}),
        "/v1/t2a_v2": httpx.Response(200, content=b"<html>gateway</html>"),
        "/v1/video_generation": httpx.Response(401),
        "/v1/query/video_generation": httpx.Response(502),
    }

    async def main() -> None:
        transport = httpx.MockTransport(lambda request: answers[request.url.path])
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            mm = MiniMaxClient(http, KEY)
            limited = await outcome(mm.generate_image("p"))
            assert isinstance(limited, RateLimited)
            assert limited.retry_after == 7.0
            malformed = await outcome(mm.synthesize_speech("t"))
            assert isinstance(malformed, Transient)
            assert malformed.code == "malformed_response"
            assert isinstance(await outcome(mm.submit_video("p")), Fatal)
            assert isinstance(await outcome(mm.query_video("t")), Transient)

    run(main())


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (httpx.ConnectError("refused"), "transport"),
        (httpx.ReadTimeout("slow"), "timeout"),
    ],
)
def test_transport_errors_are_transient(error: httpx.RequestError, code: str) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise error

    async def main() -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(fail), base_url="http://x"
        ) as http:
            with pytest.raises(Transient) as raised:
                await MiniMaxClient(http, KEY).submit_video("p")
        assert raised.value.code == code
        assert raised.value.__cause__ is error
        assert KEY not in str(raised.value)

    run(main())


def test_injection_names_are_validated() -> None:
    with pytest.raises(ValueError, match="bogus"):
        ProviderSimulator(inject={"ratelimit", "bogus"})
    with pytest.raises(ConfigError, match="typo"):
        parse_inject("ratelimit, typo")
    assert parse_inject("ratelimit, flaky ,") == {"ratelimit", "flaky"}
    with pytest.raises(ConfigError, match="window"):
        ProviderSimulator(window=0)
    with pytest.raises(ConfigError, match="rpm"):
        Quota(0, 1)


class Stamps:
    """What a call tells its gates, as `Context` does, recorded: each hook takes `delay`
    seconds (the store's write: the request waits for it)."""

    def __init__(self, delay: float = 0.0, seen: Callable[[], int] = lambda: 0) -> None:
        self.delay = delay
        self.seen = seen  # how many calls the vendor has seen, read as each hook runs
        self.events: list[tuple[str, float, int]] = []

    async def leaving(self) -> None:
        await self._note("leaving")

    async def started(self) -> None:
        await self._note("started")

    async def _note(self, what: str) -> None:
        self.events.append((what, asyncio.get_running_loop().time(), self.seen()))
        await asyncio.sleep(self.delay)


def test_a_call_is_checked_as_it_leaves_stamped_once_it_left_and_counted_as_it_arrives() -> None:
    """The adapter checks the lease just before the request goes out and stamps the start once
    it has left (in process: before the vendor reads it); the referee records each arrival,
    accepted or refused."""
    sim = ProviderSimulator(quotas={**STUDIO_QUOTAS, "image": Quota(1, 5)})
    stamps = Stamps(delay=0.25)

    async def scenario(sim: ProviderSimulator, client: MiniMaxClient, _: httpx.AsyncClient) -> None:
        await client.generate_image("first", stamps=stamps)
        assert isinstance(
            await outcome(client.generate_image("second", stamps=stamps)), RateLimited
        )

    play(sim, scenario)
    assert [(what, at) for what, at, _ in stamps.events] == [
        ("leaving", 0.0),
        ("started", 0.25),
        ("leaving", pytest.approx(0.9)),  # 0.5 s of hooks, 0.4 s of image at 6 s
        ("started", pytest.approx(1.15)),
    ]
    assert sim.arrivals()["image"] == [(0.5, True), (pytest.approx(1.4), False)]


def test_call_durations_can_be_drawn_from_a_range() -> None:
    assert parse_spreads(["image=0.2..0.5"]) == {"image": Spread(0.2, 0.5)}
    for bad in ("image=0.5..0.2", "photo=0.1..0.2", "image=fast", "image=0.1"):
        with pytest.raises(ConfigError, match="latency"):
            parse_spreads([bad])
    sim = ProviderSimulator(spreads={"image": Spread(0.2, 0.5)}, seed=3)
    durations: list[float] = []

    async def scenario(sim: ProviderSimulator, client: MiniMaxClient, _: httpx.AsyncClient) -> None:
        for n in range(6):
            began = asyncio.get_running_loop().time()
            await client.generate_image(f"frame {n}")
            durations.append(asyncio.get_running_loop().time() - began)

    play(sim, scenario)
    assert all(0.2 <= d <= 0.5 for d in durations) and len(set(durations)) == 6


@pytest.mark.realtime
def test_serve_answers_stats_on_loopback() -> None:
    async def main() -> None:
        ready = asyncio.Event()
        servers: list[SimServer] = []
        task = asyncio.create_task(
            serve(port=0, window=6.0, inject="ratelimit", ready=ready, started=servers.append)
        )
        await asyncio.wait_for(ready.wait(), timeout=5)
        (server,) = servers
        assert server.host == "127.0.0.1" and server.port > 0
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            figures = (await http.get("/sim/stats")).json()
        assert figures["inject"] == ["ratelimit"]
        assert set(figures["providers"]) == {"image", "speech", "video"}
        server.stop()
        await asyncio.wait_for(task, timeout=5)

        async with (
            SimServer(ProviderSimulator()) as scoped,
            httpx.AsyncClient(base_url=scoped.url, timeout=5) as real,
        ):
            stamps = Stamps(seen=lambda: len(scoped.sim.arrivals()["speech"]))
            speech = await MiniMaxClient(real, KEY).synthesize_speech(
                "over a socket", stamps=stamps
            )
            assert isinstance(speech, Speech)
            arrivals = (await real.get("/sim/arrivals")).json()
        # Checked over the open connection before the arrival; stamped once the body was out.
        (leaving, _, seen), (started, _, _) = stamps.events
        assert (leaving, seen, started) == ("leaving", 0, "started")
        assert scoped.sim.stats()["speech"].accepted == 1
        assert [accepted for _, accepted in arrivals["speech"]] == [True]

    asyncio.run(asyncio.wait_for(main(), timeout=10))


@pytest.mark.realtime
def test_a_port_in_use_is_an_os_error_that_names_the_address() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match="Address already in use") as info:
                await serve(port=port)
        assert info.value.filename == f"127.0.0.1:{port}"

    asyncio.run(asyncio.wait_for(main(), timeout=10))
