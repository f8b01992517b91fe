"""Bad input at declaration and submission: refused at once with the field named, never at a
worker's first claim."""

from __future__ import annotations

import asyncio

import pytest

import headrace as hr

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
