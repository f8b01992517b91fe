"""Bad input at declaration and submission: refused at once with the field named, never at a
worker's first claim."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import headrace as hr
from headrace.policy.durations import Duration
from headrace.service.cli import main

pytestmark = pytest.mark.anyio


# -- gates


def test_a_gate_takes_a_rate_or_its_string_form() -> None:
    app = hr.App("memory://")
    assert app.gate("provider:video", rate=hr.Rate(30, per="6s")).rate == hr.Rate(30, per=6)
    assert app.gate("provider:image", rate="30/6s").rate == hr.Rate(30, per=6)
    assert app.gate("provider:audio", rate="5/500ms").rate == hr.Rate(5, per=0.5)
    assert app.gate("provider:text", rate="10/s").rate == hr.Rate(10, per=1)


@pytest.mark.parametrize("rate", [10, "10", "10/6", "10 a second", 0.5, "0/s"])
def test_a_gate_refuses_another_rate_at_declaration(rate: object) -> None:
    app = hr.App("memory://")
    with pytest.raises(hr.ConfigError, match=r"rate: .*Rate\(30, per=\"6s\"\).*\"30/6s\""):
        app.gate("provider:video", rate=rate)  # type: ignore[arg-type]
    assert app.gates == {}


async def test_a_rate_given_as_a_string_holds_every_window() -> None:
    app = hr.App("memory://")
    app.gate("provider:image", rate="3/6s")
    starts: list[float] = []

    @app.task(gates=["provider:image"])
    async def image(ctx: hr.Context, ref: str) -> None:
        starts.append(asyncio.get_running_loop().time())

    async with app:
        for i in range(7):
            await image.submit(f"img{i}")
        await hr.Worker(app, slots=4).drain()
    assert len(starts) == 7
    assert all(later - first >= 6.0 for first, later in zip(starts, starts[3:], strict=False))


# -- worker settings


@pytest.mark.parametrize("lease", [0, 0.0, "0s", "0ms", -1, "-5s"])
def test_a_worker_refuses_a_lease_that_is_not_longer_than_zero(lease: object) -> None:
    with pytest.raises(hr.ConfigError, match=r"^worker\.lease: "):
        hr.Worker(hr.App("memory://"), lease=lease)  # type: ignore[arg-type]


@pytest.mark.parametrize(("lease", "renew"), [("30s", "30s"), ("30s", "1m"), (3, 3.5), ("1s", 1)])
def test_a_worker_refuses_a_renewal_interval_as_long_as_its_lease(
    lease: Duration, renew: Duration
) -> None:
    with pytest.raises(hr.ConfigError, match=r"^worker\.renew: must be shorter than worker\.lease"):
        hr.Worker(hr.App("memory://"), lease=lease, renew=renew)


@pytest.mark.parametrize(
    ("setting", "value"), [("renew", 0), ("renew", "0s"), ("renew", -1), ("idle", 0), ("idle", -1)]
)
def test_a_worker_refuses_a_renewal_or_idle_that_is_not_longer_than_zero(
    setting: str, value: object
) -> None:
    with pytest.raises(hr.ConfigError, match=rf"^worker\.{setting}: "):
        hr.Worker(hr.App("memory://"), **{setting: value})  # type: ignore[arg-type]


def test_a_lease_is_renewed_every_third_of_it_unless_told() -> None:
    app = hr.App("memory://")
    assert hr.Worker(app, lease="30s").renew_every == 10.0
    assert hr.Worker(app, lease="30s", renew="25s").renew_every == 25.0


def test_a_worker_runs_with_settings_made_once_and_never_changed() -> None:
    app = hr.App("memory://")
    settings = hr.WorkerSettings.of(app, slots=3, lease="9s", name="w1")
    assert (settings.slots, settings.lease_for, settings.renew_every) == (3, 9.0, 3.0)
    worker = hr.Worker(app, settings=settings)
    assert worker.settings is settings
    assert (worker.name, worker.slots) == ("w1", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.slots = 4  # type: ignore[misc]
    with pytest.raises(hr.ConfigError, match=r"^worker: give its settings or its options"):
        hr.Worker(app, settings=settings, slots=2)


async def test_a_lease_renewed_at_the_interval_given_outlives_a_long_task() -> None:
    app = hr.App("memory://")

    @app.task()
    async def long(ctx: hr.Context, ref: str) -> None:
        await asyncio.sleep(100.0)

    async with app:
        task_id = await long.submit("x")
        await hr.Worker(app, lease="3s", renew="2.5s").drain()
        record = await app.store.get(task_id)
    assert record.state is hr.TaskState.SUCCEEDED
    assert record.attempt == 1


@pytest.mark.timeout(30)
def test_the_worker_command_refuses_a_lease_of_zero_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lease_zero_app.py").write_text(
        'import headrace\napp = headrace.App("memory://")\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    done = CliRunner().invoke(main, ["worker", "lease_zero_app:app", "--lease", "0"])
    assert done.exit_code == 2, done.output
    assert "worker.lease: expected a duration longer than zero" in done.output


# -- tasks


def stage() -> hr.TaskDefinition:
    app = hr.App("memory://")
    app.gate("session:*", concurrency=1)

    @app.task(gates=["session:{group}"])
    async def render(ctx: hr.Context, ref: str) -> None: ...

    return render


@pytest.mark.parametrize("group", ["", 0, 6, ["ep6"], b"ep6"])
def test_a_spec_refuses_an_empty_or_non_string_group_by_name(group: object) -> None:
    with pytest.raises(hr.ConfigError, match=r"^task\.group: expected a non-empty string or None"):
        stage().spec("ep6-s01", group=group)  # type: ignore[arg-type]


def test_a_spec_refuses_an_empty_flow_rather_than_replacing_it() -> None:
    with pytest.raises(hr.ConfigError, match=r"^task\.flow: "):
        stage().spec("ep6-s01", group="ep6", flow="")


@pytest.mark.parametrize("delay", [1e300, "9000h", 10**20])
def test_a_spec_refuses_a_delay_past_the_bound_by_name(delay: Duration) -> None:
    with pytest.raises(hr.ConfigError, match=r"^task\.delay: "):
        stage().spec("ep6-s01", group="ep6", delay=delay)


def test_a_gate_list_given_as_one_string_is_refused() -> None:
    with pytest.raises(hr.ConfigError, match=r"^task\.gates: expected a list"):
        stage().spec("ep6-s01", group="ep6", gates="session:x")
    app = hr.App("memory://")
    with pytest.raises(hr.ConfigError, match=r"^task\.gates: expected a list"):
        app.task(gates="session:x")


async def test_submit_refuses_a_bad_group_and_creates_nothing() -> None:
    render = stage()
    async with render.app:
        with pytest.raises(hr.ConfigError, match=r"task\.group"):
            await render.submit("ep6-s01", group="")
        assert await render.app.store.tasks() == []
